#!/usr/bin/env python3
"""The GPU image's Python packages, as `scripts/gpu_session.sh --dry-run` imitates them on a machine
without a GPU (docs/CUDA.md, "What a GPU lease runs").

The lent GPU machine's image has torch, numpy, pytest, psutil, tqdm, tokenizers, safetensors, pyarrow
and the nvidia-* wheels (with what they depend on), and no pydantic, fastapi, uvicorn or watchdog: those
travel as wheels in .whl/ and are installed into a target directory at the start of a lease. The dry
run puts scripts/gpu_image_site/ (a sitecustomize that refuses other imports) first on PYTHONPATH, so
a package the carried wheels lack fails to import here exactly as it would there.

    python scripts/gpu_image.py allow          # the importable top-level modules, comma-separated
    python scripts/gpu_image.py pythons        # the Python versions prepare downloads wheels for
    python scripts/gpu_image.py installable DIR   # the wheels in DIR to install here, one per project
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

# The Pythons the carried wheels are downloaded for: the image's (3.12) and its neighbours, so that a
# dry run here and an image that moves on install the same versions.
IMAGE_PYTHONS = ("3.11", "3.12", "3.13")  # the proxy's fastapi needs 3.11 or later

# The distributions the GPU image holds that matter here (the device tool's image); their
# dependencies come with them. Every installed nvidia-* distribution counts too.
IMAGE_DISTS = ("pip", "torch", "numpy", "pytest", "psutil", "tqdm", "tokenizers", "safetensors", "pyarrow")


class InstallError(Exception):
    """The carried wheels do not fit this interpreter; the message is one line."""


def installed() -> dict[str, metadata.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions() if d.metadata["Name"]}


def image_closure(dists: dict[str, metadata.Distribution]) -> set[str]:
    """IMAGE_DISTS, the nvidia-* distributions, and everything they require (extras left out),
    as far as this machine has them installed."""
    todo = [canonicalize_name(n) for n in IMAGE_DISTS] + [n for n in dists if n.startswith("nvidia-")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def top_level_modules(dist: metadata.Distribution) -> set[str]:
    """The top-level import names a distribution installs: top_level.txt, else its file list."""
    text = dist.read_text("top_level.txt")
    if text:
        return {line.strip() for line in text.splitlines() if line.strip()}
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        if len(f.parts) > 1:
            if not first.endswith((".dist-info", ".data")) and first not in ("..", "bin", "__pycache__"):
                names.add(first)
        elif first.endswith((".py", ".so")):
            names.add(re.sub(r"(\.cpython-[^.]*|\.abi3)?\.(py|so)$", "", first))
    return names


def allowed_modules() -> list[str]:
    dists = installed()
    return sorted({m for name in image_closure(dists) for m in top_level_modules(dists[name])})


def installable_wheels(directory: Path) -> list[Path]:
    """One wheel per project in directory: the one this interpreter prefers among those it can install
    (prepare downloads pydantic-core for several Pythons). InstallError when a project has none."""
    rank = {tag: i for i, tag in enumerate(sys_tags())}  # this interpreter's tags, most preferred first
    fitting: dict[str, list[tuple[int, Path]]] = {}
    for whl in sorted(directory.glob("*.whl")):
        name, _, _, tags = parse_wheel_filename(whl.name)
        ranks = [rank[t] for t in tags if t in rank]
        fitting.setdefault(name, []).extend([(min(ranks), whl)] if ranks else [])
    missing = sorted(name for name, wheels in fitting.items() if not wheels)
    if missing:
        here = next(iter(sys_tags()))
        raise InstallError(
            f"no wheel in {directory} for this Python ({here.interpreter}, {here.platform}): "
            f"{', '.join(missing)} (scripts/gpu_session.sh prepare downloads them for "
            f"Python {', '.join(IMAGE_PYTHONS)})"
        )
    return [min(wheels)[1] for wheels in fitting.values()]


def main(argv: list[str]) -> int:
    if argv == ["allow"]:
        print(",".join(allowed_modules()))
        return 0
    if argv == ["pythons"]:
        print(" ".join(IMAGE_PYTHONS))
        return 0
    if len(argv) == 2 and argv[0] == "installable":
        try:
            print("\n".join(str(w) for w in installable_wheels(Path(argv[1]))))
        except InstallError as exc:
            print(f"gpu_image: {exc}", file=sys.stderr)
            return 1
        return 0
    print("gpu_image: usage: gpu_image.py allow | pythons | installable DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
