#!/usr/bin/env python3
"""The cuDNN attention object compiled here and carried to a GPU machine, and its stamp.

build/attention_cudnn.o (microgpt/cuda.mk) is host code that takes over a minute of CPU to compile;
`scripts/gpu_session.sh prepare` compiles it here and carries it in .gpu-carry/ with a stamp saying
what it was compiled from: the nvidia-cudnn-cu13 and nvidia-cudnn-frontend versions, the sources.
On the GPU machine the build uses the object only when the stamp matches that machine (its
nvidia-cudnn-cu13, the carried frontend headers, the checkout's sources); otherwise it says why in one
line and compiles the object there.

    python scripts/cudnn_carry.py write OBJECT STAMP      # here, after compiling OBJECT
    python scripts/cudnn_carry.py check OBJECT STAMP FRONTEND_INCLUDE_DIR
Exit status: 0 written / matching; 1 with one line on stdout naming the mismatch; 2 on bad usage.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CUDNN_DIST = "nvidia-cudnn-cu13"
FRONTEND_DIST = "nvidia-cudnn-frontend"
SOURCE = REPO / "microgpt" / "cuda" / "attention_cudnn.cpp"
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


class CarryError(Exception):
    """The carried object cannot be used; the message is one line."""


@dataclass(frozen=True)
class Stamp:
    cudnn: str  # nvidia-cudnn-cu13's version it was compiled against
    frontend: str  # nvidia-cudnn-frontend's version (the carried headers)
    sources_sha256: str  # the object's sources and its make rule (sources_digest)
    object_sha256: str

    @staticmethod
    def load(path: Path) -> Stamp:
        try:
            doc = json.loads(path.read_text())
            return Stamp(**{f.name: str(doc[f.name]) for f in fields(Stamp)})
        except OSError as exc:
            raise CarryError(f"no stamp for the carried cuDNN object ({path}: {exc.strerror})") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CarryError(f"{path}: not a cuDNN object stamp ({exc})") from None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sources_digest() -> str:
    """attention_cudnn.cpp, the checkout's headers it includes (transitively) and microgpt/cuda.mk
    (the rule's flags): a change to any of them makes the carried object stale."""
    seen: list[Path] = []
    todo = [SOURCE, REPO / "microgpt" / "cuda.mk"]
    while todo:
        path = todo.pop(0)
        if path in seen or not path.is_file():
            continue
        seen.append(path)
        if path.suffix in (".cpp", ".h", ".cuh"):
            todo += [path.parent / inc for inc in LOCAL_INCLUDE.findall(path.read_text())]
    digest = hashlib.sha256()
    for path in seen:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def installed_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise CarryError(f"{dist} is not installed for {sys.executable}") from None


def frontend_header_version(include: Path) -> str:
    """MAJOR.MINOR.PATCH from cudnn_frontend_version.h in include."""
    try:
        text = (include / "cudnn_frontend_version.h").read_text()
    except OSError as exc:
        raise CarryError(f"no cudnn-frontend headers at {include} ({exc.strerror})") from None
    parts = [re.search(rf"#define CUDNN_FRONTEND_{p}_VERSION (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise CarryError(f"{include}/cudnn_frontend_version.h names no version")
    return ".".join(m.group(1) for m in parts)


def write(obj: Path, stamp: Path) -> None:
    sys.path.insert(0, str(REPO))
    from proxy.atomic import atomic_write_json  # here only: `check` runs before anything is installed

    atomic_write_json(
        stamp,
        asdict(
            Stamp(
                cudnn=installed_version(CUDNN_DIST),
                frontend=installed_version(FRONTEND_DIST),
                sources_sha256=sources_digest(),
                object_sha256=sha256(obj),
            )
        ),
    )


def check(obj: Path, stamp_path: Path, frontend_include: Path) -> None:
    stamp = Stamp.load(stamp_path)
    here = installed_version(CUDNN_DIST)
    if here != stamp.cudnn:
        raise CarryError(
            f"the carried cuDNN object was compiled against {CUDNN_DIST} {stamp.cudnn}, this machine has {here}"
        )
    headers = frontend_header_version(frontend_include)
    if stamp.frontend != headers and not stamp.frontend.startswith(headers + "."):
        raise CarryError(
            f"the carried cuDNN object was compiled against cudnn-frontend {stamp.frontend}, "
            f"the headers at {frontend_include} are {headers}"
        )
    if sources_digest() != stamp.sources_sha256:
        raise CarryError(
            "the carried cuDNN object is older than microgpt/cuda/attention_cudnn.* or "
            "microgpt/cuda.mk (run `scripts/gpu_session.sh prepare` again)"
        )
    if not obj.is_file() or sha256(obj) != stamp.object_sha256:
        raise CarryError(f"{obj} is not the object its stamp describes")


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 3 and argv[0] == "write":
            write(Path(argv[1]), Path(argv[2]))
        elif len(argv) == 4 and argv[0] == "check":
            check(Path(argv[1]), Path(argv[2]), Path(argv[3]))
        else:
            print(
                "cudnn_carry: usage: cudnn_carry.py write OBJECT STAMP | check OBJECT STAMP FRONTEND_INCLUDE",
                file=sys.stderr,
            )
            return 2
    except CarryError as exc:
        print(f"cudnn_carry: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
