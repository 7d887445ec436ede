"""The verdict of qualifying the CUDA engine's fast paths on one GPU (docs/CUDA.md, "Qualification").

The same file in two places: `RUN/.qualification.json` (rundir/layout.py), the
verdict a run was launched with, which every relaunch of the run reuses while
the GPU, driver, engine build, cuDNN and shape are the same; and the cache,
`<cache>/qualification/<key>.json`, one per such environment, so the checks
run once per machine, build and shape. Written atomically (atomic.py), read
through safe_fs.py within its size cap.

The file holds a verdict per named fast path (FastPath, an enum) and the
figures measured, never engine flags: the flags come only from the table in
formats/engine_cli.py (`path_flags`), for the paths whose verdict is
`passed`. A file that does not parse or validate (an unknown path, a field
more, a `flags` list) is refused with one line (QualificationFileError), and
the caller treats it as absent.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..atomic import atomic_write_json, make_dirs
from ..run_names import QUALIFICATION, READ_LIMITS
from ..safe_fs import UnsafeFileError, read_regular
from . import bounded_json
from .engine_cli import FastPath, path_flags

READ_LIMIT = READ_LIMITS[QUALIFICATION]  # a few KB in practice; the cache's files too
VERSION: Literal[2] = 2  # version 1 held free-form engine flags: refused, so such a file is checked again


class Verdict(str, Enum):
    PASSED = "passed"
    FAILED = "failed"  # ran, and differed from the verified path beyond the tolerances
    CRASHED = "crashed"  # ended without a result, or was killed past the check's time limit
    UNAVAILABLE = "unavailable"  # not in this build or not at this shape: the engine ran another path


class QualificationFileError(Exception):
    """A verdict file that cannot be used; the message is one line."""


class FrozenRecord(BaseModel):
    """Unknown keys refused, and immutable once read. Not strict (config/strict.py:StrictModel): the record is
    the proxy's own JSON, whose enum values arrive as strings."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Figures(FrozenRecord):
    """What a check measured against the verified path (None: not measured, e.g. after a crash)."""

    loss_diff: float | None = None  # the largest |loss - verified loss| over the check's steps
    update_rel: float | None = None  # the worst tensor's |Δw - Δw_verified| / |Δw_verified| (Δw: the steps' update)
    m_rel: float | None = None  # the same for Adam's first moment
    v_rel: float | None = None  # and its second moment
    element_excess: float | None = None  # the worst element's difference over its tolerance (> 1 fails)
    worst: str | None = None  # the tensor and quantity of the worst figure, e.g. "m of h1.qkv.w"
    bitwise: bool | None = None  # two runs gave the same losses and checkpoint, bit for bit
    tokens_equal: bool | None = None  # sampled tokens equal the verified path's (the KV cache)
    bytes_equal: bool | None = None  # checkpoint files equal the verified path's (the snapshot)


class Check(FrozenRecord):
    """One check against the verified path: a named path alone, or the chosen paths together."""

    verdict: Verdict
    detail: str = Field(max_length=1000)  # one line: by how much it passed or failed, or why it could not run
    figures: Figures = Field(default_factory=Figures)


class Environment(FrozenRecord):
    """What a verdict holds for: it is used only where all of it matches."""

    gpu: str = Field(max_length=256)  # NVML's name of the device the engine uses
    driver: str = Field(max_length=64)
    build: str = Field(pattern=r"^[0-9a-f]{64}$")  # SHA-256 of the engine binary
    cudnn: str = Field(max_length=64)  # the cuDNN version the engine loads, or "none"
    shape: dict[Literal["vocab", "ctx", "dim", "layers", "heads", "batch", "grad_accum"], int]


class Qualification(FrozenRecord):
    """Which fast paths an engine build runs on a GPU at a shape, and why."""

    version: Literal[2] = VERSION
    environment: Environment
    paths: dict[FastPath, Check]  # the paths checked (a path not here was not checked: not used)
    together: Check | None = None  # every passed path at once, where more than one passed
    created: float  # time.time() of the check

    def chosen(self) -> list[FastPath]:
        """The paths a run uses: those that passed, if they also passed together."""
        passed = [p for p in FastPath if p in self.paths and self.paths[p].verdict == Verdict.PASSED]
        if len(passed) > 1 and (self.together is None or self.together.verdict != Verdict.PASSED):
            return []
        return passed

    def engine_flags(self) -> list[str]:
        """The engine's path flags: the table's (engine_cli.PATH_SWITCHES) for the chosen paths, the
        verified ones for the rest. A set the table cannot run together (two attention paths, the graph
        without the fused kernels) is no verdict this module wrote: the verified path."""
        try:
            return path_flags(self.chosen())
        except ValueError:
            return path_flags(())


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
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the record"
        where = where.encode("unicode_escape").decode("ascii")[:80]  # a planted key is one short line too
        raise QualificationFileError(f"{path}: not a qualification record ({where}: {error['msg']})") from None
    except (ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise QualificationFileError(f"{path}: not a qualification record ({first})") from None


def write_qualification(path: Path, q: Qualification) -> None:
    """Durably (temp file, fsync, rename, fsync the directory)."""
    make_dirs(path.parent)
    atomic_write_json(path, q.model_dump(mode="json"))
