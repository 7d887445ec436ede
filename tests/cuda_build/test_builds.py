"""The CUDA engine builds with and without cuDNN (microgpt/cuda.mk), with no GPU needed.

Where nvcc exists, `make test` has installed the cuDNN wheels
(scripts/install_test_deps.sh), so the default build (build/microgpt_cuda,
made by `make engines` before the tests) must have found cuDNN: its --help
lists `cudnn` among the attention paths, yet it needs neither libcudnn nor
libnvrtc to start (they are loaded at run time, microgpt/cuda/cudnn_loader.h):
neither is a NEEDED entry, and with both hidden from every directory the
binary could find them in, it still prints --help and --version (and, with no
GPU, gets as far as looking for one). A second build with CUDNN=0 into a
scratch directory (one architecture, to keep CI short) must link no cuDNN and
say so in --help. Without nvcc there is nothing to build: skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .toolchain import HIDDEN, REPO, hiding, make_info, system_library_dirs, visible_libraries

ENGINE = REPO / "build" / "microgpt_cuda"
ONE_ARCH = "CUDA_ARCH=-gencode=arch=compute_90,code=sm_90"
# What the dynamic loader prints when a NEEDED library is missing (the engine then never starts).
LOADER_FAILURE = "error while loading shared libraries"

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: the CUDA engine is not built")


def linked_libraries(binary: Path) -> str:
    return subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout


def dynamic_section(binary: Path, tag: str) -> list[str]:
    """The values of `readelf -d`'s entries of one tag (NEEDED, RUNPATH, RPATH)."""
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if f"({tag})" in line]


def help_text(binary: Path, prefix: tuple[str, ...] = ()) -> str:
    out = subprocess.run([*prefix, str(binary), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def attention_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("--attention"))


def default_build() -> dict[str, str]:
    info = make_info(f"PYTHON={os.environ.get('PYTHON', 'python3')}")
    assert info.get("USE_CUDNN") == "1", f"make cuda-info found no cuDNN: {info}"
    assert ENGINE.is_file(), f"{ENGINE} is missing: `make engines` comes before the tests"
    return info


def test_default_build_has_cudnn_loaded_at_run_time():
    info = default_build()
    needed = dynamic_section(ENGINE, "NEEDED")
    assert not [lib for lib in needed if HIDDEN.match(lib)], needed
    libs = linked_libraries(ENGINE)
    assert "not found" not in libs, libs
    # dlopen finds the library through the rpath to where make found it (and LD_LIBRARY_PATH).
    search = ":".join(dynamic_section(ENGINE, "RUNPATH") + dynamic_section(ENGINE, "RPATH")).split(":")
    assert str(Path(info["CUDNN_SO"]).parent) in search, search
    # The forwarders must not be exported: cuDNN's own libraries would bind their calls to them.
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(ENGINE)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [name for name in exported if name.startswith(("cudnn", "nvrtc"))]
    assert "cudnn" in attention_line(help_text(ENGINE))


def test_default_build_starts_without_cudnn_or_nvrtc(tmp_path):
    info = default_build()
    dirs = {Path(info["CUDNN_SO"]).parent, Path(info["NVRTC_SO"]).parent} | system_library_dirs()
    scratch = tmp_path / "mounts"
    scratch.mkdir()
    prefix = (*hiding(dirs, scratch), "env", "LD_LIBRARY_PATH=")
    assert visible_libraries(list(prefix), dirs) == []
    assert "cudnn" in attention_line(help_text(ENGINE, prefix))
    version = subprocess.run([*prefix, str(ENGINE), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "(cuda;" in version.stdout, version.stderr
    if Path("/dev/nvidia0").exists():
        return  # a run would start on the GPU: --help and --version prove the binary loads
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(bytes(4096))
    run = subprocess.run(
        [
            *prefix,
            str(ENGINE),
            "--data",
            str(tokens),
            "--ckpt-dir",
            str(tmp_path / "ckpt"),
            "--attention",
            "cudnn",
            "--precision",
            "bf16",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert LOADER_FAILURE not in run.stderr and "no CUDA device" in run.stderr, run.stderr


def test_build_without_cudnn(tmp_path):
    build = tmp_path / "build"
    out = subprocess.run(
        ["make", "cuda", "CUDNN=0", f"BUILD={build}", ONE_ARCH], cwd=REPO, capture_output=True, text=True, timeout=1200
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "without cuDNN (CUDNN=0" in out.stdout, out.stdout
    engine = build / "microgpt_cuda"
    assert "libcudnn" not in linked_libraries(engine)
    line = attention_line(help_text(engine))
    assert "this build has no cuDNN" in line and "cudnn or" not in line, line
