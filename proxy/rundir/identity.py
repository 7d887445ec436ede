"""The run's identity: RUN/.run.json, a run id minted when the run is created and the directory it names.

A run directory can be copied (`cp -a`, a backup restored) while its proxy and
engine live on. The copy then holds the original's records, and a record that
names a live process of the original must never be acted on from the copy. So
the run's first launch mints a random run id and writes it with the identity
of the directory it was minted in (device and inode, proxy/processes.py
FileIdentity); every launch compares that with the directory it actually has.
A copy (or a move to another file system) does not match: it is told so in
one line and given a run id of its own (`copied_from` keeps the old one), so
every process record written by the original names another run.

The file is read by safe_fs's rules and parsed strictly; one that does not
parse is replaced by a fresh identity, with one line.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..atomic import atomic_write_json
from ..processes import FileIdentity
from ..safe_fs import UnsafeFileError
from .layout import RunDir, RunDirError

Record = TypeVar("Record", bound=BaseModel)

RUN_ID_PATTERN = r"^[0-9a-f]{32}$"


class RunIdentity(BaseModel):
    """RUN/.run.json (docs/FORMATS.md, "Run identity")."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    version: int = Field(1, ge=1, le=1)
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    created: float = Field(ge=0, allow_inf_nan=False)
    dev: int = Field(ge=0)
    ino: int = Field(ge=0)
    copied_from: str | None = Field(None, pattern=RUN_ID_PATTERN)

    @property
    def directory(self) -> FileIdentity:
        return FileIdentity(self.dev, self.ino)


def directory_identity(run: RunDir) -> FileIdentity:
    try:
        return FileIdentity.of(run.root)
    except OSError as exc:
        raise RunDirError(f"{run.root}: {exc.strerror}") from None


def read_record(run: RunDir, path: Path, model: type[Record], what: str) -> tuple[Record | None, str | None]:
    """A small JSON record of the run directory, trusted only once `model` validates it: (the record, None);
    (None, why it is not one, naming `path` and the first problem); (None, None) when there is none."""
    try:
        raw = run.read_small(path)
    except FileNotFoundError:
        return None, None
    except UnsafeFileError as exc:  # its message names the file
        return None, str(exc)
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    try:
        return model.model_validate_json(raw), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(file)"
        return None, f"{path}: not {what} ({where}: {first.get('msg')})"


def read_identity(run: RunDir) -> tuple[RunIdentity | None, str | None]:
    """(the identity, None), or (None, why it is unusable); (None, None) when there is none."""
    return read_record(run, run.identity, RunIdentity, "a run identity")


def _mint(here: FileIdentity, copied_from: str | None) -> RunIdentity:
    return RunIdentity(
        run_id=secrets.token_hex(16), created=time.time(), dev=here.dev, ino=here.ino, copied_from=copied_from
    )


def load_identity(run: RunDir, warn: Callable[[str], None]) -> tuple[RunIdentity, bool]:
    """(this run's identity, whether it is new and still to be written with save_identity). A new one is
    minted on the run's first launch, or (with one line) for a copy. The caller holds the run's lock, and
    writes it only once nothing can refuse the launch any more (a refused launch changes nothing)."""
    here = directory_identity(run)
    identity, unusable = read_identity(run)
    if identity is None:
        if unusable:
            warn(f"{unusable}; a new run id is minted")
        return _mint(here, None), True
    if identity.directory != here:
        warn(
            f"{run.root} is a copy of run {identity.run_id} (or was moved to another file system): it was "
            f"created as directory {identity.directory}, this is {here}; it gets a run id of its own, and no "
            "process the original's records name is ever signalled from here"
        )
        return _mint(here, identity.run_id), True
    return identity, False


def save_identity(run: RunDir, identity: RunIdentity) -> None:
    atomic_write_json(run.identity, identity.model_dump(mode="json"))


def ensure_identity(run: RunDir, warn: Callable[[str], None]) -> RunIdentity:
    """load_identity, written at once when new."""
    identity, unsaved = load_identity(run, warn)
    if unsaved:
        save_identity(run, identity)
    return identity
