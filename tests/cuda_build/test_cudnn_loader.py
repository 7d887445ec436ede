"""The run-time loader of cuDNN and NVRTC (microgpt/cuda/cudnn_loader.cpp), on the CPU.

The engine's own loader source is compiled with the host compiler into a small driver
(cudnn_loader_check.cpp) linked with no rpath, so where it looks is LD_LIBRARY_PATH and the
system's directories alone. Pointed at the wheels' directories it loads the real libraries and
calls them through the forwarders (cuDNN's version and error strings, an NVRTC compile: none
needs a GPU); a second build with an rpath to cuDNN's directory, as the engine has, loads it
with LD_LIBRARY_PATH empty. With them out of reach (LD_LIBRARY_PATH empty, and any system
directory holding them hidden in a private mount namespace) a missing cuDNN is one line naming
the library and dlerror's reason, the same at a second call; a missing NVRTC is one warning and
an NVRTC error code, not a crash; a cuDNN call before loading stops the program with one line.
Needs the cuDNN headers the CUDA build uses: skipped without nvcc, like the rest of
tests/cuda_build.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .toolchain import REPO, hiding, make_info, system_library_dirs

HERE = Path(__file__).resolve().parent
LOADER = REPO / "microgpt" / "cuda" / "cudnn_loader.cpp"
NVRTC_ERROR_INTERNAL_ERROR = 11  # nvrtc.h: what the NVRTC forwarders return when it cannot be loaded

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: no CUDA toolkit to build with")


@pytest.fixture(scope="module")
def info() -> dict[str, str]:
    found = make_info(f"PYTHON={os.environ.get('PYTHON', 'python3')}")
    assert found.get("USE_CUDNN") == "1", f"make cuda-info found no cuDNN: {found}"
    return found


def build_checker(info: dict[str, str], binary: Path, *link: str) -> Path:
    includes = [info["CUDNN_INC"], info["NVRTC_INC"], f"{info['CUDA_HOME']}/include", str(LOADER.parent)]
    command = [
        os.environ.get("CXX", "g++"),
        "-std=c++17",
        "-O1",
        "-Wall",
        "-Werror",
        *(f"-I{d}" for d in includes),
        "-o",
        str(binary),
        str(HERE / "cudnn_loader_check.cpp"),
        str(LOADER),
        "-ldl",
        *link,
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return binary


@pytest.fixture(scope="module")
def checker(info, tmp_path_factory) -> Path:
    return build_checker(info, tmp_path_factory.mktemp("loader") / "cudnn_loader_check")


def run(prefix: list[str], checker: Path, what: str, library_path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=library_path)
    return subprocess.run([*prefix, str(checker), what], capture_output=True, text=True, timeout=120, env=env)


def library_dirs(info: dict[str, str]) -> str:
    return f"{Path(info['CUDNN_SO']).parent}:{Path(info['NVRTC_SO']).parent}"


def test_loads_cudnn_and_forwards_calls(info, checker):
    out = run([], checker, "cudnn", library_dirs(info))
    assert out.returncode == 0, out.stdout + out.stderr
    words = out.stdout.split()
    # "loaded cuDNN <run-time version>, compiled against <header version>: <error string>"
    assert words[:2] == ["loaded", "cuDNN"] and words[-1] == "CUDNN_STATUS_BAD_PARAM", out.stdout
    assert int(words[2].rstrip(",")) // 10000 == int(words[5].rstrip(":")) // 10000, out.stdout
    assert out.stderr == ""


def test_loads_cudnn_through_the_rpath(info, tmp_path):
    # As the engine does: dlopen by soname from an executable whose rpath (DT_RUNPATH, the
    # linker's default here) names the directory; glibc searches the calling object's.
    binary = build_checker(info, tmp_path / "cudnn_loader_check", f"-Wl,-rpath,{Path(info['CUDNN_SO']).parent}")
    out = run([], binary, "cudnn", "")
    assert out.returncode == 0 and out.stdout.startswith("loaded cuDNN "), out.stdout + out.stderr


def test_nvrtc_forwards_calls(info, checker):
    out = run([], checker, "nvrtc", library_dirs(info))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("nvrtc cubin of ") and int(out.stdout.split()[3]) > 0, out.stdout


def test_missing_cudnn_is_one_line(checker, tmp_path):
    out = run(hiding(system_library_dirs(), tmp_path), checker, "cudnn", "")
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout == "cuDNN not loaded: libcudnn.so.9: cannot open shared object file: No such file or directory\n"
    assert out.stderr == ""


def test_missing_nvrtc_is_an_error_code_and_one_warning(checker, tmp_path):
    out = run(hiding(system_library_dirs(), tmp_path), checker, "nvrtc", "")
    assert out.returncode == 4 and out.stdout == f"nvrtc result {NVRTC_ERROR_INTERNAL_ERROR}\n", out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "microgpt: warning: cudnn-frontend called NVRTC: NVRTC not loaded: libnvrtc.so."
    ), out.stderr
    assert "cannot open shared object file" in lines[0]


def test_cudnn_call_before_loading_stops(info, checker):
    out = run([], checker, "early", library_dirs(info))
    assert out.returncode == -signal.SIGABRT, out.stdout + out.stderr
    assert out.stderr == "microgpt: internal error: cudnnGetVersion called before cuDNN was loaded\n"
