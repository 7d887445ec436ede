"""proxy/rundir/overrides_record.py: RUN/.overrides.json, written whole, read only for showing."""

from __future__ import annotations

import os

from proxy.rundir.layout import RunDir
from proxy.rundir.overrides_record import OverridesRecord, read_overrides, write_overrides


def test_round_trip(tmp_path):
    run = RunDir(tmp_path)
    write_overrides(run, OverridesRecord.of(["train.lr=0.002", "log.tensorboard=true"]))
    assert read_overrides(run).overrides == ["train.lr=0.002", "log.tensorboard=true"]
    assert not [p for p in os.listdir(tmp_path) if p != ".overrides.json"]  # no temp file left


def test_absent_damaged_or_hostile_is_none(tmp_path):
    run = RunDir(tmp_path)
    assert read_overrides(run) is None
    for text in ("not json", '{"overrides": [1]}', '{"overrides": [], "extra": 1}', "[]"):
        (tmp_path / ".overrides.json").write_text(text)
        assert read_overrides(run) is None, text
    (tmp_path / ".overrides.json").unlink()
    os.mkfifo(tmp_path / ".overrides.json")  # never opened for reading: it would block
    assert read_overrides(run) is None
