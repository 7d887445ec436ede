"""Atomic, durable file replacement: the helpers every writer in the proxy uses.

A reader of `path` sees either the old complete file or the new complete
file, never a mix, and after return the new file survives a power cut:
temp file in the same directory, write, fsync, rename over `path`, fsync the
directory.
"""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory so that a rename or a new name in it is durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file that replaces `path` atomically and durably when the block ends without an error."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(obj, indent: int | None = 1) -> bytes:
    """How the proxy writes a JSON file: indented, newline-terminated, no NaN."""
    return (json.dumps(obj, indent=indent, allow_nan=False) + "\n").encode("utf-8")


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = 1) -> None:
    """Replace `path` with `obj` as JSON (newline-terminated) atomically and durably."""
    atomic_write_bytes(path, json_bytes(obj, indent))


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy `src` over `dst` atomically and durably (dst appears whole or not at all)."""
    with open(src, "rb") as fin, atomic_writer(dst) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    """Write a new file and fsync it: for files inside a temp directory that is renamed into place whole."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def copy_synced(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy `src` to a new file `dst` and fsync it (see write_synced)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
