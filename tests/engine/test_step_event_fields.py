"""The engine's step event carries exactly the keys the step-field table (proxy/formats/step_fields.py) reads
from it: a metric added to the engine's printf (microgpt/train.h) but not to the table, or the other way
round, fails here, on the real engine's output."""

from __future__ import annotations

from harness.data import make_shard
from harness.engine import parse_events, run_once
from harness.shape import standalone_args
from proxy.formats.step_fields import ENGINE_KEYS, STEP_FIELDS, StepValueSource

from .conftest import TINY


def test_step_event_keys_are_the_tables(engine_bin, tmp_path):
    shard = make_shard(tmp_path / "data.tok", TINY.vocab, n_tokens=20_000)
    res = run_once(engine_bin, standalone_args(TINY, shard, tmp_path / "ck", 0), cwd=tmp_path)
    assert res.returncode == 0, res.stderr.decode()
    steps = [e for e in parse_events(res.stdout) if e.kind == "step"]
    assert steps, "the engine reported no step"
    for ev in steps:
        assert set(ev.fields) - {"event"} == ENGINE_KEYS, (sorted(ev.fields), sorted(ENGINE_KEYS))
    copied = [f for f in STEP_FIELDS if f.source is StepValueSource.COPIED]
    assert all(isinstance(steps[0][f.engine_key], (int, float)) for f in copied), steps[0].fields
