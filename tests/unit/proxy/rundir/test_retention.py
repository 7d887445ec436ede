"""Checkpoint retention (rundir/retention.py)."""

from __future__ import annotations

import struct

from proxy.formats.checkpoint import body_bytes
from proxy.rundir.layout import RunDir
from proxy.rundir.retention import RetentionPolicy, apply_retention, plan_retention


def test_retention_plan():
    policy = RetentionPolicy(keep_last=3, milestone_every=1000)
    steps = [100 * i for i in range(1, 26)]
    delete = plan_retention(steps, policy, protected={700})
    kept = sorted(set(steps) - set(delete))
    assert kept == [700, 1000, 2000, 2300, 2400, 2500]
    # keep_last 0 means keep every checkpoint (docs/EXPERIMENTS.md), never "keep none"
    assert plan_retention(steps, RetentionPolicy(keep_last=0, milestone_every=0), protected={2500}) == []


def test_retention_leaves_files_past_the_newest_announced(tmp_path):
    """A step_*.bin newer than the newest ckpt event may still be being written (the event comes once the
    file is durable): retention neither counts it among the last K nor deletes it."""
    run = RunDir(tmp_path / "run")
    run.create()
    for s in (10, 20, 30, 40, 50):  # bare bodies of a 1-parameter model: shaped like checkpoints
        (run.checkpoints / f"step_{s:06d}.bin").write_bytes(struct.pack("<ii", s, 1).ljust(body_bytes(1), b"\0"))
    deleted = apply_retention(run, RetentionPolicy(keep_last=2, milestone_every=0), {40}, durable_through=40)
    assert sorted(p.name for p in deleted) == ["step_000010.bin", "step_000020.bin"]
    assert sorted(p.name for p in run.checkpoints.iterdir()) == [
        "step_000030.bin",
        "step_000040.bin",
        "step_000050.bin",
    ]
