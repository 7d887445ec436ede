"""Slow or failing checkpoint writes: fsync_shim.c, beside this file, preloaded into an engine.

Every fsync of a process that preloads the library first sleeps MG_TEST_FSYNC_DELAY_MS
milliseconds, then fails with EIO if MG_TEST_FSYNC_FAIL=1 (the C file says why that is enough).
The library is built with the C compiler that builds the engine ($CC, else cc).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fsync_shim.c")


def build_fsync_shim(directory: Path) -> Path:
    """SOURCE compiled as directory/fsync_shim.so; a compile error fails the test with its output."""
    out = Path(directory) / "fsync_shim.so"
    res = subprocess.run(
        [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise AssertionError(f"cannot build {SOURCE}: {res.stderr}")
    return out


def shim_env(shim: Path, delay_ms: int, fail: bool = False) -> dict:
    """Our environment, in which every fsync of the child sleeps delay_ms (then fails with EIO if `fail`)."""
    env = {**os.environ, "LD_PRELOAD": str(shim), "MG_TEST_FSYNC_DELAY_MS": str(int(delay_ms))}
    if fail:
        env["MG_TEST_FSYNC_FAIL"] = "1"
    return env
