"""bf16 (the default on sm_80+) against fp32 on the GPU: the first loss
within 2e-2, 200-step loss curves within 2% of each other; the fused
cuBLASLt epilogues against the unfused kernels; bf16 run-to-run determinism.
The bf16 side runs with each attention path (--attention naive and flash);
fp32 always runs the naive kernels, the reference."""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness.data import markov_frames
from harness.engine import initial_checkpoint
from proxy.qualification import COSINE_MIN, LOSS_TOLERANCE

from .conftest import BASE, dump_grads, smooth, train

SHAPE = BASE.but(batch=8, steps=200, lr=2e-3, min_lr=2e-4, warmup=20)


ATTENTION = ["naive", "flash"]


@pytest.mark.parametrize("attention", ATTENTION)
def test_bf16_first_loss_close_to_fp32(attention, cpu_bin, cuda_bin, tmp_path):
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    frame = markov_frames(SHAPE, 1, 1)[1]
    l32, g32 = dump_grads(cuda_bin, SHAPE, tmp_path / "fp32", init, frame, "--precision", "fp32")
    l16, g16 = dump_grads(
        cuda_bin, SHAPE, tmp_path / "bf16", init, frame, "--precision", "bf16", "--attention", attention
    )
    assert abs(l16 - l32) <= LOSS_TOLERANCE, (l16, l32)
    cos = float(np.dot(g16, g32) / (np.linalg.norm(g16) * np.linalg.norm(g32)))
    assert cos > COSINE_MIN, f"bf16 gradient direction cosine {cos}"


@pytest.mark.parametrize("attention", ATTENTION)
def test_bf16_curve_tracks_fp32_for_200_steps(attention, cpu_bin, cuda_bin, tmp_path):
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    steps = markov_frames(SHAPE, 1, 200)
    runs = {}
    for prec in ("fp32", "bf16"):
        eng = train(
            cuda_bin,
            SHAPE,
            tmp_path / prec,
            tmp_path / prec / "ckpt",
            steps,
            "--resume",
            str(init),
            "--precision",
            prec,
            *(["--attention", attention] if prec == "bf16" else []),
        )
        ready = eng.of("ready")[0]
        assert ready["precision"] == prec
        if prec == "bf16":
            assert ready["device"].endswith(f"attention {attention}"), ready["device"]
        runs[prec] = eng.losses()
    a, b = smooth(runs["fp32"]), smooth(runs["bf16"])
    rel = np.abs(b - a) / a
    assert rel.max() <= 0.02, f"bf16 curve departs from fp32 by {rel.max():.3%} (at window {rel.argmax()})"
    # The test means something only if the model learned.
    assert a[-1] < 0.8 * a[0], f"fp32 loss went from {a[0]:.3f} to {a[-1]:.3f}"


def test_fused_epilogues_match_unfused(cpu_bin, cuda_bin, tmp_path):
    """MICROGPT_CUDA_FUSE=0 runs bias/GELU/residual as separate kernels."""
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    steps = markov_frames(SHAPE, 1, 20)
    fused = train(cuda_bin, SHAPE, tmp_path / "fused", tmp_path / "fused" / "ckpt", steps, "--resume", str(init))
    plain = train(
        cuda_bin,
        SHAPE,
        tmp_path / "plain",
        tmp_path / "plain" / "ckpt",
        steps,
        "--resume",
        str(init),
        env={**os.environ, "MICROGPT_CUDA_FUSE": "0"},
    )
    lf, lp = fused.losses(), plain.losses()
    assert abs(lf[1] - lp[1]) <= 1e-2, (lf[1], lp[1])
    assert all(abs(lf[s] - lp[s]) <= 0.01 * lp[s] for s in lp), (lf, lp)


@pytest.mark.parametrize("attention", ATTENTION)
def test_bf16_is_deterministic(attention, cpu_bin, cuda_bin, tmp_path):
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    steps = markov_frames(SHAPE, 1, 10)
    a = train(
        cuda_bin, SHAPE, tmp_path / "a", tmp_path / "a" / "ckpt", steps, "--resume", str(init), "--attention", attention
    )
    b = train(
        cuda_bin, SHAPE, tmp_path / "b", tmp_path / "b" / "ckpt", steps, "--resume", str(init), "--attention", attention
    )
    assert a.losses() == b.losses()
    assert [e["grad_norm"] for e in a.of("step")] == [e["grad_norm"] for e in b.of("step")]
    # ...and the checkpoints they wrote at EOF are byte-identical.
    pa = (tmp_path / "a" / "ckpt" / "step_000010.bin").read_bytes()
    pb = (tmp_path / "b" / "ckpt" / "step_000010.bin").read_bytes()
    assert pa == pb
