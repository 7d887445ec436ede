"""A checkpoint written by either engine resumes in the other: the CPU
engine's file on the GPU (fp32) and the GPU's file on the CPU, each
continuing within 1e-4 of the engine that wrote it."""

from __future__ import annotations

import json

import numpy as np

from harness.data import markov_frames
from harness.engine import initial_checkpoint
from proxy.formats.checkpoint import read_checkpoint

from .conftest import BASE, train

SHAPE = BASE.but(steps=20)


def test_cpu_checkpoint_resumes_on_gpu(cpu_bin, cuda_bin, tmp_path):
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    first, rest = markov_frames(SHAPE, 1, 5), markov_frames(SHAPE, 6, 8)
    train(cpu_bin, SHAPE, tmp_path / "cpu", tmp_path / "cpu" / "ckpt", first, "--resume", str(init))
    mid = tmp_path / "cpu" / "ckpt" / "step_000005.bin"
    assert read_checkpoint(mid).step == 5
    cpu = train(cpu_bin, SHAPE, tmp_path / "cpu2", tmp_path / "cpu2" / "ckpt", rest, "--resume", str(mid))
    gpu = train(
        cuda_bin, SHAPE, tmp_path / "gpu", tmp_path / "gpu" / "ckpt", rest, "--resume", str(mid), "--precision", "fp32"
    )
    assert gpu.of("ready")[0]["step"] == 5
    lc, lg = cpu.losses(), gpu.losses()
    assert sorted(lg) == [6, 7, 8]
    assert all(abs(lg[s] - lc[s]) <= 1e-4 for s in lc), (lc, lg)


def test_gpu_checkpoint_resumes_on_cpu(cpu_bin, cuda_bin, tmp_path):
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    first, rest = markov_frames(SHAPE, 1, 5), markov_frames(SHAPE, 6, 8)
    train(
        cuda_bin,
        SHAPE,
        tmp_path / "gpu",
        tmp_path / "gpu" / "ckpt",
        first,
        "--resume",
        str(init),
        "--precision",
        "fp32",
    )
    mid = tmp_path / "gpu" / "ckpt" / "step_000005.bin"
    ck = read_checkpoint(mid)  # verifies size, CRC and trailer
    assert ck.step == 5 and json.loads(ck.trailer.meta)["engine"] == "cuda"
    assert np.isfinite(ck.weights).all() and np.isfinite(ck.m).all() and (ck.v >= 0).all()
    gpu = train(
        cuda_bin,
        SHAPE,
        tmp_path / "gpu2",
        tmp_path / "gpu2" / "ckpt",
        rest,
        "--resume",
        str(mid),
        "--precision",
        "fp32",
    )
    cpu = train(cpu_bin, SHAPE, tmp_path / "cpu", tmp_path / "cpu" / "ckpt", rest, "--resume", str(mid))
    lc, lg = cpu.losses(), gpu.losses()
    assert sorted(lc) == [6, 7, 8]
    assert all(abs(lg[s] - lc[s]) <= 1e-4 for s in lc), (lc, lg)


def test_bf16_checkpoint_is_fp32_and_loads_on_cpu(cpu_bin, cuda_bin, tmp_path):
    """bf16 training still writes fp32 master weights and moments."""
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    train(
        cuda_bin,
        SHAPE,
        tmp_path / "gpu",
        tmp_path / "gpu" / "ckpt",
        markov_frames(SHAPE, 1, 3),
        "--resume",
        str(init),
        "--precision",
        "bf16",
    )
    mid = tmp_path / "gpu" / "ckpt" / "step_000003.bin"
    ck = read_checkpoint(mid)
    # fp32 masters: the weights are not all representable in bf16.
    as_bf16 = (ck.weights.view(np.uint32) & 0xFFFF) == 0
    assert not as_bf16.all()
    cpu = train(
        cpu_bin, SHAPE, tmp_path / "cpu", tmp_path / "cpu" / "ckpt", markov_frames(SHAPE, 4, 4), "--resume", str(mid)
    )
    assert np.isfinite(cpu.losses()[4])
