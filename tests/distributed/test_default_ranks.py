"""The rank count when `proxy run` is given no --ranks (proxy/supervision/ranks.py:default_ranks): the engine
alone, except the CUDA engine on a machine with several visible GPUs, which trains on one rank per GPU when its
NCCL build and mpirun are there, and says so in one line (or why only one GPU trains). GPUs are counted by
visible_gpu_count from `nvidia-smi -L` and CUDA_VISIBLE_DEVICES: here a stand-in nvidia-smi on PATH lists
them. Nothing is launched."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from proxy.supervision.engine_process import EngineChoice, visible_gpu_count
from proxy.supervision.ranks import NCCL_BUILD_HINT, default_ranks


def _engine(tmp_path: Path, kind: str = "cuda", nccl_build: bool = True) -> EngineChoice:
    (tmp_path / f"microgpt_{kind}").write_bytes(b"")
    if nccl_build:
        (tmp_path / f"microgpt_{kind}_mpi").write_bytes(b"")
    return EngineChoice(tmp_path / f"microgpt_{kind}", kind)


def _choose(engine: EngineChoice, grad_accum: int, gpus: int) -> tuple[int, list[str]]:
    said: list[str] = []
    return default_ranks(engine, grad_accum, said.append, gpus=gpus), said


@pytest.fixture
def with_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")


def test_the_cpu_engine_and_one_gpu_train_alone_and_say_nothing(tmp_path):
    assert _choose(_engine(tmp_path, "cpu"), 8, 8) == (1, [])
    assert _choose(_engine(tmp_path), 8, 1) == (1, [])
    assert _choose(_engine(tmp_path), 8, 0) == (1, [])


def test_several_gpus_train_one_rank_each(tmp_path, with_mpirun):
    assert _choose(_engine(tmp_path), 8, 8) == (8, ["training on 8 ranks, one GPU each (8 visible); --ranks N chooses"])


def test_the_most_gpus_that_divide_the_micro_batches(tmp_path, with_mpirun):
    assert _choose(_engine(tmp_path), 6, 4) == (
        3,
        ["training on 3 ranks, one GPU each (4 visible; 3 divides train.grad_accum 6); --ranks N chooses"],
    )


def test_no_divisor_trains_on_one_and_says_why(tmp_path, with_mpirun):
    assert _choose(_engine(tmp_path), 5, 4) == (
        1,
        ["4 GPUs visible, training on one: train.grad_accum 5 has no divisor from 2 to 4; --ranks N chooses"],
    )


def test_no_nccl_build_trains_on_one_and_says_how_to_build_it(tmp_path):
    engine = _engine(tmp_path, nccl_build=False)
    ranks, said = _choose(engine, 8, 2)
    assert ranks == 1
    assert said == [
        f"2 GPUs visible, training on one: {tmp_path / 'microgpt_cuda_mpi'} is not built ({NCCL_BUILD_HINT}); "
        "--ranks N chooses"
    ]


def test_no_mpirun_trains_on_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    ranks, said = _choose(_engine(tmp_path), 8, 2)
    assert ranks == 1 and len(said) == 1 and "`mpirun` is not on PATH" in said[0]


def _fake_smi(tmp_path: Path, gpus: int, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    lines = "\n".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i:04d})'" for i in range(gpus))
    smi.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 9\n{lines}\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("visible", "count"), [(None, 4), ("0,1", 2), ("3", 1), ("", 0), ("-1", 0), ("0,-1,2", 1), ("0,1,2,3,4,5", 4)]
)
def test_visible_gpus_are_those_listed_and_named(tmp_path, monkeypatch, visible, count):
    _fake_smi(tmp_path, 4, monkeypatch)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_count() == count


def test_no_nvidia_smi_is_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert visible_gpu_count() == 0
