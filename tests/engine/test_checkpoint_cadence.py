"""The wall-clock checkpoint cadence (ENGINE.md "Checkpoints"): `--ckpt-every-seconds S` checkpoints
after the first step that ends S seconds or more after the last checkpoint started (or, for the
first, after the engine started, resumed or not), beside `--ckpt-every N`, whichever comes first.
Which steps get a checkpoint then depends on timing; the losses and the final file must not."""

from __future__ import annotations

import os
import time

import pytest

from harness.data import train_frames
from harness.shape import proxy_args
from proxy.formats import frames
from proxy.formats.checkpoint import list_checkpoints, verify_checkpoint

from .conftest import TINY

S = 0.4  # seconds between timed checkpoints
PACE = 0.05  # seconds the test waits between frames
N_STEPS = 30  # so a run lasts >= N_STEPS * PACE = 1.5 s
TOLERANCE = 0.15  # event arrival times (in this process) versus the engine's own clock


def paced_run(run_engine, ckpt_dir, *extra):
    """Proxy mode: N_STEPS TRAIN frames, one every PACE seconds, then STOP. Returns (engine, arrival time
    of each step event, time of the ready event)."""
    eng = run_engine(proxy_args(TINY, ckpt_dir, "--threads", 1, *extra))
    eng.wait_for("ready")
    ready_at = time.monotonic()
    arrival = {}
    for s, tok, grp in train_frames(TINY, 1, N_STEPS, seed=3):
        eng.train(s, tok, grp)
        eng.wait_for("step", step=s)
        arrival[s] = time.monotonic()
        time.sleep(PACE)
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    return eng, arrival, ready_at


def test_ckpt_every_seconds_checkpoints_on_the_clock_and_changes_no_result(run_engine, tmp_path):
    eng, arrival, ready_at = paced_run(run_engine, tmp_path / "timed", "--ckpt-every-seconds", S)
    assert eng.events[0]["config"]["ckpt_every_seconds"] == pytest.approx(S)
    ckpts = [(c["step"], c["reason"]) for c in eng.of("ckpt")]
    timed = [s for s, reason in ckpts if reason == "timed"]
    elapsed = arrival[N_STEPS] - ready_at
    assert 2 <= len(timed) <= elapsed / S + 1, f"{len(timed)} timed checkpoints in {elapsed:.2f} s: {ckpts}"
    assert arrival[timed[0]] - ready_at >= S - TOLERANCE, "the first is due S seconds after start-up"
    for a, b in zip(timed, timed[1:], strict=False):
        assert arrival[b] - arrival[a] >= S - TOLERANCE, f"timed checkpoints at steps {a} and {b} are closer than {S} s"
        assert arrival[b - 1] - arrival[a] < S + TOLERANCE, f"step {b - 1} was already due: it ended {S} s after {a}"
    assert {reason for _, reason in ckpts} <= {"timed", "stop"}
    for s, _ in ckpts:
        assert verify_checkpoint(tmp_path / "timed" / f"step_{s:06d}.bin") is None

    plain, _, _ = paced_run(run_engine, tmp_path / "plain")
    assert [(c["step"], c["reason"]) for c in plain.of("ckpt")] == [(N_STEPS, "stop")]
    assert eng.losses() == plain.losses(), "timed checkpoints changed the losses"
    name = f"step_{N_STEPS:06d}.bin"
    assert (tmp_path / "timed" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_the_step_cadence_and_the_clock_whichever_comes_first(run_engine, tmp_path):
    clock = 0.25  # shorter than 7 steps of PACE: between two periodic checkpoints the clock runs out
    eng, arrival, _ = paced_run(run_engine, tmp_path / "ck", "--ckpt-every", 7, "--ckpt-every-seconds", clock)
    ckpts = [(c["step"], c["reason"]) for c in eng.of("ckpt")]
    assert [s for s, reason in ckpts if reason == "periodic"] == [7, 14, 21, 28], ckpts
    timed = [s for s, reason in ckpts if reason == "timed"]
    assert timed, (
        f"7 steps take >= {7 * PACE:.2f} s, more than {clock} s: some timed checkpoint must come first; {ckpts}"
    )
    steps = [s for s, _ in ckpts]
    for prev, cur in zip(steps, steps[1:], strict=False):  # the clock restarts at every checkpoint, whatever started it
        if cur in timed:
            assert arrival[cur] - arrival[prev] >= clock - TOLERANCE, f"timed at {cur}, only just after {prev}: {ckpts}"


def test_a_resumed_run_measures_from_start_up(run_engine, tmp_path):
    """Not from the age of the file it resumed from: an old checkpoint does not make one due at once."""
    ck = tmp_path / "ck"
    stdin = b"".join(frames.train_frame(s, t, g) for s, t, g in train_frames(TINY, 1, 3)) + frames.stop_frame()
    eng = run_engine(proxy_args(TINY, ck))
    eng.wait_for("ready")
    eng.send(stdin)
    assert eng.finish() == 0, eng.stderr
    old = ck / "step_000003.bin"
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))

    eng = run_engine(proxy_args(TINY, ck, "--resume", "latest", "--threads", 1, "--ckpt-every-seconds", 30))
    assert eng.wait_for("ready")["step"] == 3
    for s, tok, grp in train_frames(TINY, 4, 2):
        eng.train(s, tok, grp)
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    assert [(c["step"], c["reason"]) for c in eng.of("ckpt")] == [(5, "stop")]
    assert [p.name for p in list_checkpoints(ck)] == ["step_000005.bin", "step_000003.bin"]
