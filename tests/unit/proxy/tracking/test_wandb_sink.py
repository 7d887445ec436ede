"""proxy/tracking/wandb_sink.py: the W&B run id a run directory keeps across launches."""
from __future__ import annotations

import json

import pytest

from proxy.tracking.marks import TrackerError
from proxy.tracking.wandb_sink import ID_CHARS, run_id


def test_minted_once_then_reused(tmp_path):
    first = run_id(tmp_path)
    assert len(first) == 8 and set(first) <= set(ID_CHARS)
    assert run_id(tmp_path) == first
    assert json.loads((tmp_path / ".run_id.json").read_text()) == {"id": first}


@pytest.mark.parametrize("text", ["not json", '{"id": "../x"}', '{"id": 7}', "[1]"])
def test_a_damaged_record_is_one_line_not_a_new_run(tmp_path, text):
    (tmp_path / ".run_id.json").write_text(text)
    with pytest.raises(TrackerError, match="delete it to start a new W&B run"):
        run_id(tmp_path)
