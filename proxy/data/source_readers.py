"""Data sources' documents: how each kind is cut into work units and read (docs/EXPERIMENTS.md, "Sources").

The kinds are defined once, in proxy/config/sources.py; this module has one
entry per kind in its dispatch table `_PLANS` (how its documents are cut into
work units); source_files.py has the files a source reads, in document order,
and its fingerprint. Relative paths are resolved against the experiment file's directory.

A **work unit** is a few MiB of a source's documents that a worker of the
preparation reads by itself (`read_unit`): whole small files, a byte range
of a large file or of a JSON Lines file, a Parquet row group, a run of Arrow
record batches, or texts made in memory (the built-ins, a source cut by
`max_chars`). Units are planned in the main process in document order and
read anywhere; what a unit yields depends only on the source's bytes, so the
documents are the same however many workers read them.

- {"file": path}: the whole file is one document (UTF-8 text; binary data refused).
- {"glob": pattern}, {"dir": path, "suffix": s}: one document per file, in sorted order; files that are
  binary or not UTF-8 are skipped.
- {"jsonl": path, "field": "text"}: one document per non-blank line.
- {"parquet": pattern, "column": "text"}, {"hf_dataset": dir, "split": s, "column": "text"}: one document
  per row (proxy/data/tabular.py; pyarrow).
- {"tokens": pattern, "val": pattern}: token ids, not documents (prepare.py reads them in place).
- {"builtin": ...}: the standard library's code, its docstrings, the language reference topics, and the
  curation tests' repeated_names and random_tokens. Their material and the documents made in memory:
  builtin_sources.py.

Every text kind also takes `max_chars`: documents are kept in order until
that many characters (the last one cut to fit). Empty documents are dropped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

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
    is_token_source,
)
from ..formats import bounded_json
from ..safe_fs import UnsafeFileError, open_regular
from . import tabular
from .builtin_sources import module_docstrings, module_name, pydoc_topics, repeated_names, stdlib_root
from .source_files import source_files
from .text import SEARCH_CHARS, TOKENS_HINT, binary_reason, decode_strict, file_is_text, safe_cut
from .work_units import Doc, FilePart, SourceError, Unit, UnitNotes  # noqa: F401  (re-exported: data/__init__.py)

# The train/val decision of a document spread over several units: decide(path, size) -> TRAIN or VAL.
Decide = Callable[[Path, int], str]

UNIT_BYTES = 4 << 20  # about this much of a source per work unit


def describe(src: Source) -> str:
    return src.describe()


# ---------------------------------------------------------------------------
# Built-in documents made in memory.


# ---------------------------------------------------------------------------
# Work units: planned in document order in the main process, read anywhere.


def _file_units(
    files: list[Path],
    src: Source,
    strict: bool,
    decide: Callable[[Path, int], str],
    modules: dict[Path, str] | None = None,
) -> Iterator[Unit]:
    """Small files grouped into units of about UNIT_BYTES; a large file in parts of UNIT_BYTES (its
    train/val decision made here, by `decide(path, size)`; a glob's or dir's large file is checked for
    text first, and skipped if it is not)."""
    reader = "docstrings" if modules is not None else "files"
    batch: list[FilePart] = []
    size_sum = 0
    for p in files:
        size = p.stat().st_size
        if size <= UNIT_BYTES or modules is not None:
            batch.append(FilePart(str(p), 0, size, size, module=modules.get(p) if modules else None))
            size_sum += size
            if size_sum >= UNIT_BYTES:
                yield Unit(reader, tuple(batch), size_sum, src.describe(), strict)
                batch, size_sum = [], 0
            continue
        if batch:
            yield Unit(reader, tuple(batch), size_sum, src.describe(), strict)
            batch, size_sum = [], 0
        if not strict:
            with open_regular(p, None) as f:
                if file_is_text(f, size) is not None:
                    continue
        split = decide(p, size)
        for start in range(0, size, UNIT_BYTES):
            stop = min(size, start + UNIT_BYTES)
            yield Unit(reader, (FilePart(str(p), start, stop, size, split),), stop - start, src.describe(), strict)
    if batch:
        yield Unit(reader, tuple(batch), size_sum, src.describe(), strict)


def _jsonl_units(src: JsonlSource, path: Path) -> Iterator[Unit]:
    size = path.stat().st_size
    for start in range(0, max(size, 1), UNIT_BYTES):
        stop = min(size, start + UNIT_BYTES)
        yield Unit("jsonl", ((str(path), start, stop),), stop - start, src.describe(), True, src.field or "text")


def _literal_units(texts: list[str], src: Source) -> Iterator[Unit]:
    batch, size = [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= UNIT_BYTES:
            yield Unit("literal", tuple(batch), size, src.describe())
            batch, size = [], 0
    if batch:
        yield Unit("literal", tuple(batch), size, src.describe())


def _plan_tabular(src: ParquetSource | HFDatasetSource, files: list[Path], _decide: Decide) -> Iterator[Unit]:
    try:
        for reader, items, nbytes in tabular.plan(src, files, UNIT_BYTES):
            yield Unit(reader, items, nbytes, src.describe(), True, src.column)
    except tabular.TabularError as exc:
        raise SourceError(str(exc)) from None


def _plan_builtin(src: BuiltinSource, files: list[Path], decide: Decide) -> Iterator[Unit]:
    if src.builtin == "stdlib_code":
        yield from _file_units(files, src, False, decide)
    elif src.builtin == "stdlib_docstrings":
        root = stdlib_root()
        yield from _file_units(
            files, src, False, decide, {p: module_name(p.relative_to(root).as_posix()) for p in files}
        )
    elif src.builtin == "pydoc_topics":
        yield from _literal_units(pydoc_topics(), src)
    else:  # repeated_names (random_tokens is no text: plan_units)
        yield from _literal_units(repeated_names(), src)


def _plan_tokens(src: TokensSource, _files: list[Path], _decide: Decide) -> Iterator[Unit]:
    raise SourceError(f"{src.describe()}: its documents are token ids (prepare.py reads them in place), not text")


# Each entry takes its own key's kind (plan_units looks it up by type(src)), which a dict's type cannot say:
# hence Any for the source.
_PLANS: dict[type[Source], Callable[[Any, list[Path], Decide], Iterator[Unit]]] = {
    FileSource: lambda s, files, decide: _file_units(files, s, True, decide),
    GlobSource: lambda s, files, decide: _file_units(files, s, False, decide),
    DirSource: lambda s, files, decide: _file_units(files, s, False, decide),
    JsonlSource: lambda s, files, _decide: _jsonl_units(s, files[0]),
    ParquetSource: _plan_tabular,
    HFDatasetSource: _plan_tabular,
    TokensSource: _plan_tokens,
    BuiltinSource: _plan_builtin,
}


def plan_units(src: Source, base_dir: Path | str, decide: Callable[[Path, int], str]) -> Iterator[Unit]:
    """The work units of a text source, in document order (its max_chars not applied: limited_units).
    `decide(path, size)` is the train/val decision of a document spread over several units."""
    if isinstance(src, BuiltinSource) and not src.is_text:
        raise SourceError(f"{src.describe()}: its documents are token ids (random_token_documents), not text")
    return _PLANS[type(src)](src, source_files(src, base_dir), decide)


# ---------------------------------------------------------------------------
# Reading a unit (in a worker, or here).


def _cut_in_file(f: BinaryIO, nominal: int, size: int) -> int:
    """Where a part starting or ending at `nominal` really cuts its file (text.safe_cut on the bytes there)."""
    if nominal <= 0 or nominal >= size:
        return max(0, min(nominal, size))
    f.seek(nominal - 1)
    window = f.read(1 + SEARCH_CHARS + 8)  # the byte before, and as far as safe_cut looks
    return nominal - 1 + safe_cut(window, 1)


def _read_part(part: FilePart, unit: Unit, notes: UnitNotes) -> tuple[bytes, int, int] | None:
    """A part's bytes and where they start and end in the file; None when a lenient unit skips the file."""
    try:
        with open_regular(part.path, None) as f:
            begin = _cut_in_file(f, part.start, part.size)
            end = part.size if part.stop >= part.size else _cut_in_file(f, part.stop, part.size)
            f.seek(begin)
            data = f.read(end - begin)
    except UnsafeFileError as exc:
        if unit.strict:
            raise SourceError(str(exc)) from None
        notes.skipped.append(str(exc))
        return None
    except OSError as exc:
        raise SourceError(f"{part.path}: cannot read: {exc.strerror}") from None
    reason = binary_reason(data, head=begin == 0)
    if reason is not None:
        if unit.strict:
            raise SourceError(f"{part.path}: {reason}; {TOKENS_HINT}")
        notes.skipped.append(f"{part.path}: {reason}")
        return None
    return data, begin, end


def _read_files(unit: Unit, notes: UnitNotes) -> Iterator[Doc]:
    for part in unit.items:
        got = _read_part(part, unit, notes)
        if got is None:
            continue
        data, begin, end = got
        try:
            text = decode_strict(data, part.path, begin)
        except ValueError as exc:
            if unit.strict:
                raise SourceError(str(exc)) from None
            notes.skipped.append(f"{part.path}: not UTF-8")
            continue
        if part.module is not None:
            text = module_docstrings(text, part.module)
            yield Doc(text)
            continue
        whole = begin == 0 and end == part.size
        yield Doc(text, last=end == part.size, split=part.split, raw=data if whole else None)


def _line_number(path: str, offset: int) -> int:
    """The 1-based number of the line that starts at byte `offset` (for a message)."""
    count = 0
    with open(path, "rb") as f:
        done = 0
        while done < offset:
            chunk = f.read(min(1 << 20, offset - done))
            if not chunk:
                break
            count += chunk.count(b"\n")
            done += len(chunk)
    return count + 1


def _read_jsonl(unit: Unit, notes: UnitNotes) -> Iterator[Doc]:
    """The lines that start in [start, stop): a line belongs to the unit holding its first byte."""
    ((path, start, stop),) = unit.items
    field_name = unit.column
    with open_regular(path, None) as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line in progress belongs to the unit before
        offset = f.tell()
        while offset < stop or (start == stop == 0 and offset == 0):
            line = f.readline()
            if not line:
                break
            at, offset = offset, offset + len(line)
            reason = binary_reason(line, head=False)
            if reason is not None:
                raise SourceError(f"{path}:{_line_number(path, at)}: {reason}; {TOKENS_HINT}")
            try:
                text = decode_strict(line, path, at)
            except ValueError as exc:
                raise SourceError(str(exc)) from None
            if not text.strip():
                continue
            try:
                obj = bounded_json.loads(text)
            except json.JSONDecodeError as e:
                raise SourceError(f"{path}:{_line_number(path, at)}: not JSON ({e.msg})") from None
            except RecursionError:
                raise SourceError(
                    f"{path}:{_line_number(path, at)}: not JSON this reader takes (nested too deeply)"
                ) from None
            if not isinstance(obj, dict) or field_name not in obj:
                raise SourceError(f"{path}:{_line_number(path, at)}: no {field_name!r} field")
            value = obj[field_name]
            if not isinstance(value, str):
                raise SourceError(
                    f"{path}:{_line_number(path, at)}: field {field_name!r} is {type(value).__name__}, not a string"
                )
            yield Doc(value)


def _read_literal(unit: Unit, _notes: UnitNotes) -> Iterator[Doc]:
    for text in unit.items:
        yield Doc(text)


def _read_tabular(unit: Unit, _notes: UnitNotes) -> Iterator[Doc]:
    try:
        for text in tabular.read(unit.reader, unit.items, unit.column):
            yield Doc(text)
    except tabular.TabularError as exc:
        raise SourceError(str(exc)) from None


READERS: dict[str, Callable[[Unit, UnitNotes], Iterator[Doc]]] = {
    "files": _read_files,
    "docstrings": _read_files,
    "jsonl": _read_jsonl,
    "literal": _read_literal,
    "parquet": _read_tabular,
    "arrow": _read_tabular,
}


def read_unit(unit: Unit, notes: UnitNotes | None = None) -> Iterator[Doc]:
    """The documents (and pieces of documents) of one unit, in order; empty documents included."""
    return READERS[unit.reader](unit, notes if notes is not None else UnitNotes())


# ---------------------------------------------------------------------------
# Whole documents (here, in order): max_chars, and small uses.


def whole_documents(
    src: Source,
    base_dir: Path | str,
    decide: Callable[[Path, int], str] | None = None,
    on_unit: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """The documents of one text source in order, pieces joined, empty ones dropped, max_chars applied."""
    decide = decide or (lambda _p, _n: "train")
    left = getattr(src, "max_chars", None)
    parts: list[str] = []
    for unit in plan_units(src, base_dir, decide):
        for doc in read_unit(unit):
            parts.append(doc.text)
            if not doc.last:
                continue
            text, parts = "".join(parts), []
            if not text:
                continue
            if left is not None:
                text = text[:left]
                left -= len(text)
            yield text
            if left is not None and left <= 0:
                return
        if on_unit:
            on_unit(unit.nbytes)


def limited_units(src: Source, base_dir: Path | str, decide: Callable[[Path, int], str]) -> Iterator[Unit]:
    """The work units of a text source: planned, or, with max_chars (which counts characters in document
    order), its documents read here up to the limit and handed out as texts."""
    if getattr(src, "max_chars", None) is None:
        yield from plan_units(src, base_dir, decide)
        return
    yield from _literal_units(list(whole_documents(src, base_dir, decide)), src)


def load_documents(src: Source, base_dir: Path | str, on_file: Callable[[int], None] | None = None) -> list[str]:
    """The documents of one source, in deterministic order (empty ones dropped); SourceError when none."""
    if is_token_source(src):
        raise SourceError(f"{describe(src)}: its documents are token ids, not text")
    docs = list(whole_documents(src, base_dir, on_unit=on_file))
    if not docs:
        raise SourceError(f"{describe(src)}: no text documents")
    return docs


def doc_hash64(raw: bytes) -> int:
    """The first 8 bytes of a document's SHA-256, as the number the validation split compares."""
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def doc_bytes(doc: Doc) -> bytes:
    return doc.raw if doc.raw is not None else doc.text.encode("utf-8", "surrogatepass")
