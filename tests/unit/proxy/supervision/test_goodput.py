"""Goodput (supervision/goodput.py)."""

from __future__ import annotations

import json

import pytest

from proxy.formats.state import AuditTime, Goodput, RunState
from proxy.supervision.goodput import GoodputMeter, checkpoint_stall_ms, overhead_summary


def test_goodput_meter_splits_the_wall_time():
    m = GoodputMeter()
    m.seen(5.0)
    assert m.status() is None  # no engine ready yet
    m.ready(10.0)
    g = m.status()
    assert g.wall_s == 0.0 and g.overhead is None and g.tokens_per_s is None  # nothing to compare with yet
    assert overhead_summary(g) == "overhead ? (no step yet)"
    m.seen(19.0)  # an eval before any step (the catch-up of a resume): still no figure
    m.audit("eval", 2000.0)
    assert m.status().overhead is None and overhead_summary(m.status()) == "overhead ? (no step yet)"
    m.ready(20.0)  # a restarted engine: the clock keeps running from the first
    for _ in range(4):
        m.seen(17.0)  # read out of order: the account runs to the newest event
        m.step(1500.0, 2048)
    m.audit("sample", 1000.0)
    m.audit("checkpoint", checkpoint_stall_ms({"ms": 300.0, "snapshot_ms": 10.0, "wait_ms": 5.0}))
    m.audit("checkpoint", checkpoint_stall_ms({"ms": 120.0}))  # a synchronous write: all of it stalled
    g = m.status()  # up to the last event (20.0), not to now: a step in flight is no overhead yet
    assert (g.wall_s, g.step_s, g.steps, g.tokens) == (10.0, 6.0, 4, 8192)
    assert g.audits["eval"] == AuditTime(1, 2.0) and g.audits["sample"] == AuditTime(1, 1.0)
    assert g.audits["checkpoint"].count == 2 and g.audits["checkpoint"].s == pytest.approx(0.135)
    assert g.other_s == pytest.approx(10.0 - 6.0 - 3.135) and g.overhead == pytest.approx(0.4)
    assert overhead_summary(g) == "overhead 40.0% (sample 10.0%, eval 20.0%, checkpoint 1.4%, other 8.7%)"
    back = Goodput.from_dict(json.loads(json.dumps(RunState(goodput=g).to_dict()))["goodput"])
    assert back == g
    assert RunState.from_dict(RunState(goodput=g).to_dict()).goodput == g
    for bad in (
        {},
        {"audits": []},
        dict(RunState(goodput=g).to_dict()["goodput"], wall_s="long"),
        dict(RunState(goodput=g).to_dict()["goodput"], steps=None),
    ):
        assert Goodput.from_dict(bad) is None  # a hand-edited snapshot is never trusted
