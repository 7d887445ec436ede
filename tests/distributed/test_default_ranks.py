"""`proxy run` given no --ranks trains the engine alone (proxy/supervision/ranks.py:say_unused_gpus): the CUDA
engine on a machine with several visible GPUs says in one line which --ranks would train on them, or why none
can, but does not choose its NCCL build for the user (that build has not run on a GPU). GPUs are counted by
visible_gpu_count from `nvidia-smi -L` and CUDA_VISIBLE_DEVICES: here a stand-in nvidia-smi on PATH lists them.
And the rank count a resume compares with comes from `.state.json`, which is never trusted. Nothing is
launched."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from proxy.supervision.engine_process import EngineChoice, visible_gpu_count
from proxy.supervision.ranks import NCCL_BUILD_HINT, recorded_ranks, say_rank_change, say_unused_gpus


def _engine(tmp_path: Path, kind: str = "cuda", nccl_build: bool = True) -> EngineChoice:
    (tmp_path / f"microgpt_{kind}").write_bytes(b"")
    if nccl_build:
        (tmp_path / f"microgpt_{kind}_mpi").write_bytes(b"")
    return EngineChoice(tmp_path / f"microgpt_{kind}", kind)


def _said(engine: EngineChoice, grad_accum: int, gpus: int) -> list[str]:
    said: list[str] = []
    say_unused_gpus(engine, grad_accum, said.append, gpus=gpus)
    return said


@pytest.fixture
def with_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")


def test_the_cpu_engine_and_one_gpu_say_nothing(tmp_path):
    assert _said(_engine(tmp_path, "cpu"), 8, 8) == []
    assert _said(_engine(tmp_path), 8, 1) == []
    assert _said(_engine(tmp_path), 8, 0) == []


def test_several_gpus_name_the_ranks_that_would_use_them(tmp_path, with_mpirun):
    assert _said(_engine(tmp_path), 8, 8) == ["8 GPUs visible, training on one: --ranks 8 trains on 8, one GPU each"]


def test_the_most_gpus_that_divide_the_micro_batches(tmp_path, with_mpirun):
    assert _said(_engine(tmp_path), 6, 4) == ["4 GPUs visible, training on one: --ranks 3 trains on 3, one GPU each"]


def test_no_divisor_says_why(tmp_path, with_mpirun):
    assert _said(_engine(tmp_path), 5, 4) == [
        "4 GPUs visible, training on one: data-parallel needs more (train.grad_accum 5 has no divisor from 2 to 4)"
    ]


def test_no_nccl_build_says_how_to_build_it(tmp_path):
    assert _said(_engine(tmp_path, nccl_build=False), 8, 2) == [
        f"2 GPUs visible, training on one: data-parallel needs more ({tmp_path / 'microgpt_cuda_mpi'} is not "
        f"built ({NCCL_BUILD_HINT}))"
    ]


def test_no_mpirun_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    said = _said(_engine(tmp_path), 8, 2)
    assert len(said) == 1 and "`mpirun` is not on PATH" in said[0]


@pytest.mark.parametrize(
    ("state", "ranks"),
    [
        (None, 1),
        ({}, 1),
        ({"engine": {}}, 1),
        ({"engine": {"ranks": 4}}, 4),
        ({"engine": {"ranks": "4"}}, None),
        ({"engine": {"ranks": "abc"}}, None),
        ({"engine": {"ranks": [1]}}, None),
        ({"engine": {"ranks": True}}, None),
        ({"engine": {"ranks": 0}}, None),
        ({"engine": {"ranks": 2.0}}, None),
        ({"engine": "x"}, None),
    ],
)
def test_the_recorded_rank_count_is_never_trusted(state, ranks):
    assert recorded_ranks(state) == ranks
    said: list[str] = []
    say_rank_change(state, 2, 10, said.append)  # never raises, whatever the file says
    assert said == ([] if ranks in (None, 2) else [said[0]])
    if said:
        assert said[0].startswith(f"rank count changed: the run trained on {ranks} rank(s) and resumes on 2")


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
