"""Which files a data source reads, in document order, its fingerprint and its size (docs/EXPERIMENTS.md,
"Sources").

The kinds are defined once, in proxy/config/sources.py; `_FILES` has one entry per kind. Relative paths are
resolved against the experiment file's directory. The fingerprint is a content hash of everything that
determines a source's documents (part of the data cache's key); source_readers.py reads the documents.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config.sources import (
    BuiltinSource,
    DirSource,
    FileSource,
    GlobSource,
    HFDatasetSource,
    JsonlSource,
    ParquetSource,
    Source,
    TokensSource,
)
from ..safe_fs import NO_SUCH_FILE, UnsafeFileError, file_sha256, regular_file_problem
from . import tabular
from .builtin_sources import builtin_files, stdlib_root
from .work_units import Doc, FilePart, SourceError, Unit, UnitNotes  # noqa: F401  (re-exported: data/__init__.py)

# Bump when what a builtin source extracts changes (part of the cache key).
EXTRACTOR_VERSION = 1


def _matches(kind: str, pattern_text: str, base: Path) -> list[Path]:
    pattern = pattern_text if os.path.isabs(pattern_text) else str(base / pattern_text)
    matches = sorted({os.path.normpath(m) for m in _glob.glob(pattern, recursive=True)})
    files = [Path(m) for m in matches if Path(m).is_file()]
    if not files:
        other = f": only {matches[0]}, {regular_file_problem(matches[0])}" if matches else ""
        raise SourceError(f"{kind} source: pattern {pattern_text!r} matches no file (looked for {pattern}){other}")
    return files


def _one_file(kind: str, target: str, base: Path) -> list[Path]:
    p = base / target
    problem = regular_file_problem(p)
    if problem == NO_SUCH_FILE:
        raise SourceError(f"{kind} source: no such file {target!r} (looked at {p})")
    if problem is not None:
        raise SourceError(f"{kind} source {target!r}: {problem} (at {p}); not read")
    return [p]


def _dir_files(src: DirSource, base: Path) -> list[Path]:
    root = base / src.dir
    if not root.is_dir():
        raise SourceError(f"dir source: no such directory {src.dir!r} (looked at {root})")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fn in filenames:
            if fn.startswith(".") or (src.suffix is not None and not fn.endswith(src.suffix)):
                continue
            p = Path(dirpath) / fn
            if p.is_file():  # a FIFO or a device would block or never end
                found.append((p.relative_to(root).as_posix(), p))
    found.sort()
    if not found:
        what = f"files ending with {src.suffix!r}" if src.suffix else "files"
        raise SourceError(f"dir source: no {what} under {src.dir!r} (looked at {root})")
    return [p for _, p in found]


def _token_files(src: TokensSource, base: Path) -> list[Path]:
    return _matches("tokens", src.tokens, base) + (_matches("tokens val", src.val, base) if src.val else [])


# Each entry takes its own key's kind (source_files looks it up by type(src)), which a dict's type cannot say:
# hence Any for the source.
_FILES: dict[type[Source], Callable[[Any, Path], list[Path]]] = {
    FileSource: lambda s, b: _one_file("file", s.file, b),
    GlobSource: lambda s, b: _matches("glob", s.glob, b),
    DirSource: _dir_files,
    JsonlSource: lambda s, b: _one_file("jsonl", s.jsonl, b),
    ParquetSource: lambda s, b: _matches("parquet", s.parquet, b),
    HFDatasetSource: lambda s, b: tabular.dataset_files(s, b),
    TokensSource: _token_files,
    BuiltinSource: builtin_files,
}


def source_files(src: Source, base_dir: Path | str) -> list[Path]:
    """The files `src` reads, in document order; SourceError when there are none."""
    try:
        return _FILES[type(src)](src, Path(base_dir))
    except tabular.TabularError as exc:
        raise SourceError(str(exc)) from None


def _fingerprint_root(src: Source, base: Path) -> Path | None:
    """Where file names are part of the fingerprint (they give order, or module names), relative to this."""
    if isinstance(src, DirSource):
        return base / src.dir
    if isinstance(src, HFDatasetSource):
        return base / src.hf_dataset
    if isinstance(src, BuiltinSource):
        return stdlib_root()
    return None


def source_fingerprint(src: Source, base_dir: Path | str, file_hash: Callable[[Path], str] | None = None) -> str:
    """A content hash of everything that determines this source's documents:
    its options and the bytes of each file it reads (not where they live)."""
    file_hash = file_hash or hash_file
    base = Path(base_dir)
    h = hashlib.sha256()
    options = src.options()
    if isinstance(src, BuiltinSource):
        options["python"] = list(sys.version_info[:3])
        options["extractor"] = EXTRACTOR_VERSION
    h.update(json.dumps(options, sort_keys=True).encode())
    root = _fingerprint_root(src, base)
    files = source_files(src, base)
    val_files = set(_matches("tokens val", src.val, base)) if isinstance(src, TokensSource) and src.val else set()
    for p in files:
        if root is not None:  # names matter: order, and module names in docstrings
            try:
                name = p.relative_to(root).as_posix()
            except ValueError:
                name = p.name
            h.update(b"\0name\0" + os.fsencode(name))
        h.update((b"\0val\0" if p in val_files else b"\0file\0") + file_hash(p).encode())
    val = src.val_part()
    if val is not None:  # the validation documents the user named (a source without them hashes as before)
        h.update(b"\0named val\0" + source_fingerprint(val, base, file_hash).encode())
    return h.hexdigest()


def hash_file(path: Path) -> str:
    try:
        return file_sha256(path)[1]
    except UnsafeFileError as exc:
        raise SourceError(str(exc)) from None
    except OSError as exc:  # a read that fails (EIO, EINVAL on a /proc file) has no file name of its own
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def source_bytes(src: Source, base_dir: Path | str) -> int:
    """Total size of the files `src` reads, its named validation files included (progress bars; the validation
    split's bound on a document)."""
    val = src.val_part()
    own = sum(p.stat().st_size for p in source_files(src, base_dir))
    return own + (source_bytes(val, base_dir) if val is not None else 0)
