"""`proxy --version`: the package's version (its installed metadata) and each engine binary's own
`--version` (its version, kind, the source it was built from and the compiler), or why there is none."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from typing import TextIO

from ..errors import EXIT_OK
from ..supervision.engine_process import BUILD_DIR, engine_binary

PACKAGE = "microgpt"
ENGINE_KINDS = ("cpu", "cuda")


def package_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown (the package is not installed: run `make install`)"


def engine_version(kind: str) -> str:
    """What `build/microgpt_<kind> --version` prints, or why it printed nothing."""
    path = engine_binary(kind, BUILD_DIR)
    if not path.is_file():
        return f"{path}: not built (`make {kind}`)"
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{path}: cannot run it ({exc})"
    line = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    if out.returncode != 0 or not line:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return f"{path}: no version ({why[:200]}; rebuild it with `make {kind}`)"
    return f"{path}: {line}"


def main(out: TextIO | None = None) -> int:
    out = out or sys.stdout
    print(f"{PACKAGE} {package_version()} (proxy and dashboard, Python {sys.version.split()[0]})", file=out)
    for kind in ENGINE_KINDS:
        print(f"  engine {kind:<4} {engine_version(kind)}", file=out)
    return EXIT_OK
