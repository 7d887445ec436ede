"""The data-parallel CUDA engine, build/microgpt_cuda_mpi (microgpt/cuda.mk), compiles and links, with no GPU.

Where nvcc, Open MPI's mpicc and the NCCL wheel (nvidia-nccl-cu13, installed by scripts/install_test_deps.sh)
are all found, `make engines` (run before the tests) must have built it: libnccl.so.2 is a NEEDED entry found
through an rpath to the wheel's lib/ (the wheel has no plain libnccl.so), the binary calls the NCCL functions
cuda/nccl.cuh relies on (the non-blocking communicator, the all-reduce, the abort), links MPI, and starts: its
--version runs with no loader error, and a run under `mpirun -np 1` without a GPU ends with the engine's own
one line. The single-process build links no NCCL. Without nvcc, mpicc or the wheel: skipped, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.supervision.ranks import default_launcher, mpi_binary

from .test_builds import ENGINE, LOADER_FAILURE, dynamic_section, linked_libraries
from .toolchain import make_info

NCCL_ENGINE = mpi_binary(ENGINE)
# What cuda/nccl.cuh calls: a missing one would be a link error, but an unused path compiled out would not.
NCCL_CALLS = ("ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError", "ncclAllReduce", "ncclCommAbort")


def nccl_build() -> dict[str, str]:
    """make's findings, skipping where the data-parallel CUDA engine is not meant to be built."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found: the CUDA engines are not built")
    if shutil.which("mpicc") is None or shutil.which("mpirun") is None:
        pytest.skip("Open MPI not found (apt install openmpi-bin libopenmpi-dev)")
    info = make_info()
    if not info.get("NCCL_SO"):
        pytest.skip("no NCCL wheel: pip install nvidia-nccl-cu13 (scripts/install_test_deps.sh does)")
    assert NCCL_ENGINE.is_file(), f"{NCCL_ENGINE} is missing: `make engines` builds it when nvcc, mpicc and NCCL exist"
    return info


def undefined_symbols(binary: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(binary)], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


def test_links_nccl_through_an_rpath_to_the_wheel():
    info = nccl_build()
    needed = dynamic_section(NCCL_ENGINE, "NEEDED")
    assert "libnccl.so.2" in needed, needed
    assert any(lib.startswith("libmpi") for lib in needed), needed
    search = ":".join(dynamic_section(NCCL_ENGINE, "RUNPATH") + dynamic_section(NCCL_ENGINE, "RPATH")).split(":")
    assert str(Path(info["NCCL_SO"]).parent) in search, search
    libs = linked_libraries(NCCL_ENGINE)
    assert "not found" not in libs, libs
    assert f"libnccl.so.2 => {info['NCCL_SO']}" in libs or f"libnccl.so.2 => {Path(info['NCCL_SO']).resolve()}" in libs


def test_calls_the_nonblocking_nccl_api_and_mpi():
    nccl_build()
    calls = undefined_symbols(NCCL_ENGINE)
    assert not [name for name in NCCL_CALLS if name not in calls], sorted(n for n in calls if n.startswith("nccl"))
    assert "MPI_Init" in calls


def test_single_process_build_has_no_nccl():
    nccl_build()
    assert "libnccl.so.2" not in dynamic_section(ENGINE, "NEEDED")
    assert not [name for name in undefined_symbols(ENGINE) if name.startswith(("nccl", "MPI_"))]


def test_starts_under_mpirun(tmp_path):
    """--version as an MPI singleton (under mpirun, an exit before MPI_Finalize reads as a failed job, whatever
    its status), then a run under `mpirun -np 1`: with no GPU it ends with the engine's own line."""
    nccl_build()
    version = subprocess.run([str(NCCL_ENGINE), "--version"], capture_output=True, text=True, timeout=120)
    assert LOADER_FAILURE not in version.stderr, version.stderr
    assert version.returncode == 0 and "(cuda;" in version.stdout, version.stdout + version.stderr
    if Path("/dev/nvidia0").exists():
        return  # a run would start on the GPU (tests/gpu/test_nccl.py runs one)
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(bytes(4096))
    run = subprocess.run(
        [*default_launcher(1), str(NCCL_ENGINE), "--data", str(tokens), "--ckpt-dir", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert LOADER_FAILURE not in run.stderr and "no CUDA device" in run.stderr, run.stderr


def test_make_names_why_it_skips_the_nccl_build():
    """No NCCL where make looks (NCCL_INC/NCCL_LIB pointing nowhere): `make engines` goes on and its summary says
    what to install. The engines are up to date after `make engines`, so nothing is compiled here."""
    if shutil.which("nvcc") is None or shutil.which("mpicc") is None:
        pytest.skip("nvcc and mpicc are needed for make to consider the data-parallel CUDA engine")
    assert ENGINE.is_file(), f"{ENGINE} is missing: `make engines` comes before the tests"
    out = subprocess.run(
        ["make", "-s", "engines", "NCCL_INC=/nonexistent", "NCCL_LIB=/nonexistent"],
        cwd=ENGINE.parents[1],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.splitlines()[-1]
    assert last.startswith("make: built ") and "microgpt_cuda_mpi" not in last, last
    assert "skipped the data-parallel CUDA engine (no NCCL: " in last and "pip install nvidia-nccl-cu" in last, last
