"""Bit-exact resume on the GPU (bf16, the default precision): a checkpoint
plus the same frames reproduce the uninterrupted run's losses exactly, after
a clean SIGTERM and after a SIGKILL; SIGUSR1 checkpoints and continues."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from proxy.formats.checkpoint import read_checkpoint

from .conftest import Engine, Shape, proxy_args, train, train_frames

SHAPE = Shape(batch=4, steps=20)
N = 20


@pytest.fixture(scope="module")
def reference(cuda_bin, tmp_path_factory):
    """The uninterrupted 20-step run (fresh init from --seed), checkpoints every 5."""
    d = tmp_path_factory.mktemp("reference")
    steps = train_frames(SHAPE, 1, N)
    eng = Engine(cuda_bin, proxy_args(SHAPE, d / "ckpt", "--ckpt-every", "5"), d)
    for s in range(1, N + 1):
        eng.send(steps[s])
    assert eng.finish() == 0, eng.stderr()
    losses = eng.losses()
    assert sorted(losses) == list(range(1, N + 1))
    return losses, d / "ckpt", steps


def resume_and_finish(cuda_bin, d: Path, ckpt_dir: Path, steps, expect_step: int, *extra) -> dict[int, float]:
    eng = Engine(cuda_bin, proxy_args(SHAPE, ckpt_dir, "--resume", "latest", *extra), d)
    ready = eng.wait_for("ready")
    assert ready["step"] == expect_step, ready.fields
    for s in range(expect_step + 1, N + 1):
        eng.send(steps[s])
    assert eng.finish() == 0, eng.stderr()
    return eng.losses()


def test_rerun_is_bit_identical(cuda_bin, reference, tmp_path):
    losses, _, steps = reference
    again = train(cuda_bin, SHAPE, tmp_path, tmp_path / "ckpt", steps)
    assert again.losses() == losses


def test_resume_from_periodic_checkpoint_is_bit_exact(cuda_bin, reference, tmp_path):
    losses, ref_ckpt, steps = reference
    eng = Engine(cuda_bin, proxy_args(SHAPE, tmp_path / "ckpt", "--resume", str(ref_ckpt / "step_000010.bin")), tmp_path)
    for s in range(11, N + 1):
        eng.send(steps[s])
    assert eng.finish() == 0
    got = eng.losses()
    assert got == {s: losses[s] for s in range(11, N + 1)}


def test_sigterm_checkpoints_and_resume_is_bit_exact(cuda_bin, reference, tmp_path):
    losses, _, steps = reference
    ckpt = tmp_path / "ckpt"
    eng = Engine(cuda_bin, proxy_args(SHAPE, ckpt), tmp_path)
    for s in range(1, 8):
        eng.send(steps[s])
    eng.wait_for("step", step=7)
    eng.signal(signal.SIGTERM)
    ev = eng.wait_for("ckpt")
    assert ev["step"] == 7 and ev["reason"] == "signal"
    assert eng.finish() == 0
    assert eng.of("exit")[-1]["reason"] == "signal"
    assert read_checkpoint(ckpt / "step_000007.bin").step == 7
    got = resume_and_finish(cuda_bin, tmp_path, ckpt, steps, 7)
    assert got == {s: losses[s] for s in range(8, N + 1)}
    assert eng.losses() == {s: losses[s] for s in range(1, 8)}


def test_sigkill_resumes_from_last_periodic_checkpoint_bit_exact(cuda_bin, reference, tmp_path):
    losses, _, steps = reference
    ckpt = tmp_path / "ckpt"
    eng = Engine(cuda_bin, proxy_args(SHAPE, ckpt, "--ckpt-every", "5"), tmp_path)
    for s in range(1, 14):
        eng.send(steps[s])
    # Checkpoints are written in the background: step 10's is complete once announced, and its
    # event may come before or after step 13's.
    eng.wait_for("ckpt", step=10)
    if not any(e.kind == "step" and e["step"] == 13 for e in eng.events):
        eng.wait_for("step", step=13)
    eng.signal(signal.SIGKILL)
    eng.close_stdin()
    assert eng.proc.wait(60) == -signal.SIGKILL
    got = resume_and_finish(cuda_bin, tmp_path, ckpt, steps, 10, "--ckpt-every", "5")
    assert got == {s: losses[s] for s in range(11, N + 1)}


def test_sigusr1_checkpoints_and_continues(cuda_bin, reference, tmp_path):
    losses, _, steps = reference
    ckpt = tmp_path / "ckpt"
    eng = Engine(cuda_bin, proxy_args(SHAPE, ckpt), tmp_path)
    for s in range(1, 7):
        eng.send(steps[s])
    eng.wait_for("step", step=6)
    eng.signal(signal.SIGUSR1)
    ev = eng.wait_for("ckpt")
    assert ev["step"] == 6 and ev["reason"] == "sigusr1"
    for s in range(7, N + 1):
        eng.send(steps[s])
    assert eng.finish() == 0
    assert eng.losses() == losses
    assert read_checkpoint(ckpt / "step_000006.bin").step == 6
