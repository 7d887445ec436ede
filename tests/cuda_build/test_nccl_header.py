"""microgpt/cuda/nccl.cuh's host side, without a GPU: compiled by nvcc into a small driver (nccl_check.cu)
linked against the NCCL wheel as the engine is. Which local rank it reads (OMPI_COMM_WORLD_LOCAL_RANK, then
SLURM_LOCALID, then LOCAL_RANK; 0 when none), which GPU it picks (the local rank; the one visible GPU a launcher
gave the rank), the pinned NCCL settings and the one warning line when the user's differed, and the one-line
failures: a local rank that is not a number, more local ranks than GPUs, and the communicator's creation with no
GPU (NCCL's own error, exit 5). Skipped without nvcc or the NCCL wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .toolchain import REPO, make_info

HERE = Path(__file__).resolve().parent
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")
PINS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE")

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: no CUDA toolkit to build with")


@pytest.fixture(scope="module")
def checker(tmp_path_factory) -> Path:
    info = make_info(f"PYTHON={os.environ.get('PYTHON', 'python3')}")
    if not info.get("NCCL_SO"):
        pytest.skip("no NCCL wheel: pip install nvidia-nccl-cu13 (scripts/install_test_deps.sh does)")
    binary = tmp_path_factory.mktemp("nccl") / "nccl_check"
    lib = str(Path(info["NCCL_SO"]).parent)
    command = ["nvcc", "-O1", "-std=c++17", f"-I{info['NCCL_INC']}", "-o", str(binary), str(HERE / "nccl_check.cu")]
    command += ["-Xlinker", info["NCCL_SO"], "-Xlinker", "-rpath", "-Xlinker", lib]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    return binary


def run(binary: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in LOCAL_RANK_VARS + PINS}
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120, env={**clean, **env})


def one_error(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("microgpt: error: "), done.stderr
    return lines[0].removeprefix("microgpt: error: ")


@pytest.mark.parametrize(
    "env, rank",
    [
        ({}, 0),
        ({"LOCAL_RANK": "2"}, 2),
        ({"SLURM_LOCALID": "1", "LOCAL_RANK": "2"}, 1),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "SLURM_LOCALID": "1", "LOCAL_RANK": "2"}, 3),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "", "LOCAL_RANK": "2"}, 2),  # set but empty: not set
    ],
)
def test_the_local_rank_comes_from_the_launcher(checker, env, rank):
    done = run(checker, "local-rank", **env)
    assert done.returncode == 0 and done.stdout == f"{rank}\n", done.stderr


def test_a_local_rank_that_is_no_number_is_one_line(checker):
    assert one_error(run(checker, "local-rank", SLURM_LOCALID="1x"), 2) == "SLURM_LOCALID=1x is not a local rank"


def test_the_gpu_is_the_local_rank_or_the_only_one(checker):
    assert run(checker, "device", "8", LOCAL_RANK="5").stdout == "5\n"
    assert run(checker, "device", "1", LOCAL_RANK="5").stdout == "0\n"  # srun --gpus-per-task=1
    line = one_error(run(checker, "device", "4", LOCAL_RANK="5"), 2)
    assert line == "local rank 5 but only 4 GPUs are visible on this node: launch at most 4 ranks per node"


def test_the_nccl_settings_are_pinned_and_an_override_is_said(checker):
    quiet = run(checker, "pin", NCCL_PROTO="Simple")
    assert quiet.returncode == 0 and quiet.stdout == "Ring Simple 0\n" and quiet.stderr == ""
    loud = run(checker, "pin", NCCL_ALGO="Tree", NCCL_NVLS_ENABLE="1")
    assert loud.returncode == 0 and loud.stdout == "Ring Simple 0\n"
    assert loud.stderr == (
        "microgpt: warning: NCCL settings overridden for a repeatable reduction (docs/ENGINE.md): "
        "NCCL_ALGO=Tree -> Ring, NCCL_NVLS_ENABLE=1 -> 0\n"
    )


def test_no_gpu_fails_the_communicator_in_one_line(checker):
    if Path("/dev/nvidia0").exists():
        pytest.skip("a GPU is visible: the communicator would be created (tests/gpu/test_nccl.py)")
    line = one_error(run(checker, "init"), 5)
    assert line.startswith("NCCL communicator creation failed on rank 0 of 1: "), line
