"""The CUDA engine builds with and without cuDNN (microgpt/cuda.mk), with no GPU needed.

Where nvcc exists, `make test` has installed the cuDNN wheels
(scripts/install_test_deps.sh), so the default build (build/microgpt_cuda,
made by `make engines` before the tests) must have found cuDNN: it links
libcudnn and its --help lists `cudnn` among the attention paths. A second
build with CUDNN=0 into a scratch directory (one architecture, to keep CI
short) must link no cuDNN and say so in --help. Without nvcc there is
nothing to build: skipped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "build" / "microgpt_cuda"
ONE_ARCH = "CUDA_ARCH=-gencode=arch=compute_90,code=sm_90"

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: the CUDA engine is not built")


def make_info(*args: str) -> dict[str, str]:
    """`make cuda-info`'s NAME=value pairs."""
    out = subprocess.run(["make", "-s", "cuda-info", *args], cwd=REPO, capture_output=True, text=True, check=True)
    info = {}
    for word in out.stdout.split():
        name, eq, value = word.partition("=")
        if eq:
            info[name] = value
    return info


def linked_libraries(binary: Path) -> str:
    return subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout


def help_text(binary: Path) -> str:
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def attention_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("--attention"))


def test_default_build_has_cudnn():
    info = make_info(f"PYTHON={os.environ.get('PYTHON', 'python3')}")
    assert info.get("USE_CUDNN") == "1", f"make cuda-info found no cuDNN: {info}"
    assert ENGINE.is_file(), f"{ENGINE} is missing: `make engines` comes before the tests"
    libs = linked_libraries(ENGINE)
    assert "libcudnn.so.9" in libs and "not found" not in libs, libs
    assert "cudnn" in attention_line(help_text(ENGINE))


def test_build_without_cudnn(tmp_path):
    build = tmp_path / "build"
    out = subprocess.run(["make", "cuda", "CUDNN=0", f"BUILD={build}", ONE_ARCH], cwd=REPO, capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "without cuDNN (CUDNN=0" in out.stdout, out.stdout
    engine = build / "microgpt_cuda"
    assert "libcudnn" not in linked_libraries(engine)
    line = attention_line(help_text(engine))
    assert "this build has no cuDNN" in line and "cudnn or" not in line, line
