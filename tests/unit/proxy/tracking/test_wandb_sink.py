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


def test_a_pivot_is_marked_and_its_steps_logged_on_the_step_axis(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from harness.tracking_readers import wandb_history_steps, wandb_records
    from proxy.config.tracking import WandbConfig
    from proxy.rundir.layout import RunDir
    from proxy.tracking.records import Note, StepPoint
    from proxy.tracking.wandb_sink import WandbSink

    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    sink = WandbSink(RunDir(tmp_path), WandbConfig(project="unit"), {"name": "unit"})
    steps = [StepPoint(s, 0, 1000.0 + s, {"train/loss": 1.0}) for s in (1, 2, 3)]
    pivot = Note(2, 1002.0, "events", "pivot: phase 1 from step 2", 1)
    sink.write(
        steps + [pivot, StepPoint(2, 1, 1002.5, {"train/loss": 0.5}), StepPoint(2, 1, 1002.5, {"train/loss": 0.5})]
    )
    sink.close()
    records = wandb_records(next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")))
    assert wandb_history_steps(records) == [1, 2, 3, 2]  # the new phase from its step, each point once
    summaries = [
        i.value_json
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
        if i.key == "last_event" or list(i.nested_key) == ["last_event"]
    ]
    assert summaries and "pivot: phase 1 from step 2" in summaries[-1]
