"""The verdict of qualifying the CUDA engine's fast paths on one GPU (docs/CUDA.md, "Qualification").

The same file in two places: `RUN/.qualification.json` (rundir/layout.py), the
choice a run was launched with, which every relaunch of the run reuses; and
the cache, `<cache>/qualification/<key>.json`, one per (GPU, engine build,
shape), so the check runs once per machine, build and shape. Written
atomically (atomic.py), read through safe_fs.py within its size cap; a file
that does not parse or validate is refused with one line
(QualificationFileError), and the caller treats it as absent.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..atomic import atomic_write_json, make_dirs
from ..rundir.layout import QUALIFICATION, READ_LIMITS
from ..safe_fs import UnsafeFileError, read_regular
from . import bounded_json

READ_LIMIT = READ_LIMITS[QUALIFICATION]  # a few KB in practice; the cache's files too
VERSION = 1
STATUSES = ("passed", "failed", "crashed", "unavailable")


class QualificationFileError(Exception):
    """A verdict file that cannot be used; the message is one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathVerdict(_Strict):
    """One fast path's check against the verified path."""
    path: str  # "attention cudnn", "attention flash", "fused kernels", "CUDA graph", "all chosen paths"
    flags: list[str]  # the engine flags that select it
    status: Literal["passed", "failed", "crashed", "unavailable"]
    detail: str  # one line: by how much it passed or failed, or why it could not run
    loss_diff: Optional[float] = None  # |loss - verified loss|
    min_cosine: Optional[float] = None  # the lowest per-tensor gradient cosine against the verified path
    worst_tensor: Optional[str] = None
    bitwise: Optional[bool] = None  # two runs gave the same loss and gradients, bit for bit


class Qualification(_Strict):
    """Which paths an engine build runs on a GPU at a shape, and why."""
    version: Literal[1] = VERSION
    device: str  # the engine's ready event `device`, less the attention it named
    build: str  # SHA-256 of the engine binary
    shape: dict[str, Union[int, str]]  # vocab, ctx, dim, layers, heads, batch, grad_accum, precision
    flags: list[str]  # what the engine is launched with: the chosen paths, the verified ones for the rest
    verdicts: list[PathVerdict] = Field(default_factory=list)
    loss_tolerance: float
    cosine_min: float
    created: float  # time.time() of the check


def read_qualification(path: Path, within: Path | None = None) -> Qualification:
    """The verdict file at `path`: FileNotFoundError when absent, QualificationFileError when unusable."""
    try:
        raw = read_regular(path, READ_LIMIT, within=within)
    except FileNotFoundError:
        raise
    except (UnsafeFileError, OSError) as exc:
        raise QualificationFileError(f"{path}: {exc}") from None
    try:
        return Qualification.model_validate(bounded_json.loads(raw))
    except (ValueError, ValidationError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise QualificationFileError(f"{path}: not a qualification record ({first})") from None


def write_qualification(path: Path, q: Qualification) -> None:
    """Durably (temp file, fsync, rename, fsync the directory)."""
    make_dirs(path.parent)
    atomic_write_json(path, q.model_dump(mode="json"))
