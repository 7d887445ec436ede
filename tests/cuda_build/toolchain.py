"""What the cuda_build tests need to know about the build: make's findings, and hiding libraries.

`make_info` reads `make cuda-info`. `hiding` gives the command prefix that runs a program
with cuDNN's and NVRTC's libraries absent from some directories, as on a machine without
them: a private mount namespace (`unshare --mount --map-root-user`) in which each of those
directories is replaced by a tmpfs holding every other file of it, bind-mounted back (so a
directory shared with libcublasLt keeps it). Nothing outside the namespace changes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The files the CUDA engine must not need to start: cuDNN's (libcudnn*.so*) and NVRTC's.
HIDDEN = re.compile(r"^lib(cudnn|nvrtc)")

# Run in the new namespace as: sh -c HIDE_SCRIPT sh SCRATCH DIR... -- PROGRAM ARGS...
# (SCRATCH: a directory the caller removes; each DIR's real files stay reachable under it.)
HIDE_SCRIPT = r"""
set -eu
scratch=$1; shift
while [ "$1" != "--" ]; do
    dir=$1; shift
    keep=$(mktemp -d -p "$scratch")
    mount --bind "$dir" "$keep"
    mount -t tmpfs hidden "$dir"
    for f in "$keep"/* "$keep"/.[!.]*; do
        [ -e "$f" ] || [ -L "$f" ] || continue
        name=${f##*/}
        case "$name" in libcudnn*|libnvrtc*) continue ;; esac
        if [ -L "$f" ]; then cp -P "$f" "$dir/$name"
        elif [ -d "$f" ]; then mkdir "$dir/$name"; mount --bind "$f" "$dir/$name"
        else : > "$dir/$name"; mount --bind "$f" "$dir/$name"
        fi
    done
done
shift
exec "$@"
"""


def make_info(*args: str) -> dict[str, str]:
    """`make cuda-info`'s NAME=value pairs."""
    out = subprocess.run(["make", "-s", "cuda-info", *args], cwd=REPO, capture_output=True, text=True, check=True)
    info = {}
    for word in out.stdout.split():
        name, eq, value = word.partition("=")
        if eq:
            info[name] = value
    return info


def system_library_dirs() -> set[Path]:
    """The directories of the dynamic loader's cache that hold a cuDNN or NVRTC library."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"  # not on a user's PATH everywhere
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True)
    dirs = set()
    for line in out.stdout.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow and HIDDEN.match(name):
            dirs.add(Path(path).parent)
    return dirs


def hiding(dirs: set[Path], scratch: Path) -> list[str]:
    """The prefix that runs a command with cuDNN and NVRTC gone from `dirs` (skips where it cannot).

    `scratch` is a directory of the caller's (a pytest tmp_path) under which each run makes its
    mount points, so nothing is left anywhere else.
    """
    if not dirs:
        return []
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here: cannot hide cuDNN and NVRTC from the engine")
    prefix = [
        "unshare",
        "--mount",
        "--map-root-user",
        "sh",
        "-c",
        HIDE_SCRIPT,
        "sh",
        str(scratch),
        *map(str, sorted(dirs)),
        "--",
    ]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"a private mount namespace is not permitted here ({probe.stderr.strip()[:200]})")
    return prefix


def visible_libraries(prefix: list[str], dirs: set[Path]) -> list[str]:
    """cuDNN or NVRTC files still visible in `dirs` under `prefix` (to prove the hiding worked)."""
    listing = subprocess.run(
        [*prefix, "ls", "-1A", *map(str, sorted(dirs))], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [name for name in listing.split() if HIDDEN.match(name)]
