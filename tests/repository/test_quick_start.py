"""README's quick start as `make` answers it: outside a virtual environment on a system Python that pip does not
install into (PEP 668, Debian and Ubuntu), one line naming the venv command; and one line saying what it built
and what it skipped, and why. Run on a copy of the Makefile and the engine's source in a temporary directory
(the checkout's own install is never touched)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def copy_build(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "Makefile", root)
    shutil.copytree(REPO / "microgpt", root / "microgpt")
    return root


def make(root: Path, *args: str) -> subprocess.CompletedProcess:
    # as a user's shell runs it, not as a make inside `make test` (MAKELEVEL would make its lines `make[1]: ...`)
    outer = ("VIRTUAL_ENV", "PIP_BREAK_SYSTEM_PACKAGES", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    return subprocess.run(["make", "-s", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def externally_managed(python: Path) -> bool:
    if not python.is_file():
        return False
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, sysconfig; print(sys.prefix == sys.base_prefix, sysconfig.get_path('stdlib'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.split()
    return out[0] == "True" and (Path(out[1]) / "EXTERNALLY-MANAGED").is_file()


def test_make_outside_a_venv_on_a_system_python_is_one_line(tmp_path):
    if not externally_managed(SYSTEM_PYTHON):
        pytest.skip(f"{SYSTEM_PYTHON} is not an externally managed system Python here")
    root = copy_build(tmp_path)
    result = make(root, "install", f"PYTHON={SYSTEM_PYTHON}")
    assert result.returncode == 2, result
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("make: *** [")]
    assert lines == [
        f"make: {SYSTEM_PYTHON} is the system's Python, which pip does not install into (externally managed): make "
        "a virtual environment first, python3 -m venv .venv && . .venv/bin/activate (README.md)"
    ], result.stderr
    assert not (root / "microgpt.egg-info").exists()


def test_make_engines_says_what_it_built_and_skipped(tmp_path):
    """Without nvcc and mpicc: the CPU engine built, the MPI and CUDA ones skipped with their reasons, in one
    line (no banner); an explicit `make cuda` fails with that reason."""
    root = copy_build(tmp_path)
    result = make(root, "engines", "NVCC=", "MPICC=")
    assert result.returncode == 0, result
    assert result.stdout.splitlines()[-1] == (
        "make: built build/microgpt_cpu; skipped the MPI CPU engine (no mpicc on PATH: apt install openmpi-bin "
        "libopenmpi-dev; proxy run --ranks needs it); skipped the CUDA engine (no nvcc on PATH; the CPU engine is "
        "used)"
    )
    assert "***" not in result.stdout + result.stderr
    assert (root / "build" / "microgpt_cpu").is_file()
    refused = make(root, "cuda", "NVCC=")
    assert refused.returncode == 2 and "make cuda: no nvcc on PATH; the CPU engine is used" in refused.stderr
