"""Rows of text in Parquet files and Hugging Face `save_to_disk` directories, read with pyarrow.

pyarrow is an optional dependency (`pip install 'microgpt[parquet]'`): it is
imported only when such a source is read, and its absence is one line with
that hint. The `datasets` package is not needed: a `save_to_disk` directory
is Arrow IPC files listed in its `state.json` (a DatasetDict: one such
directory per split, named in `dataset_dict.json`), read here directly.

Work is planned in pieces a worker reads by itself: a Parquet row group, or
a run of consecutive record batches of an Arrow file (memory-mapped, so
planning reads only their headers). A row's document is the string in the
source's column; a null or empty string is no document.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# pyarrow ships no type information: its module and objects are Any here.
from ..config.sources import HFDatasetSource, ParquetSource
from ..formats import bounded_json
from ..safe_fs import NO_SUCH_FILE, UnsafeFileError, read_regular, regular_file_problem

INSTALL_HINT = "pip install 'microgpt[parquet]' (or pip install pyarrow)"
DATASET_JSON_LIMIT = 16 << 20  # the largest state.json / dataset_dict.json read
STATE = "state.json"
DATASET_DICT = "dataset_dict.json"
DEFAULT_SPLIT = "train"
# Rows decoded at a time (a Parquet batch; Python strings made of an Arrow batch): what a unit holds of
# its source at once is BATCH_ROWS rows, however large its row group (a dictionary-encoded file of a few
# hundred bytes can stand for gigabytes of rows).
BATCH_ROWS = 16


class TabularError(ValueError):
    """A Parquet or Arrow source that cannot be read; the message is one line."""


def pyarrow(where: str) -> Any:
    """The pyarrow module, or TabularError with the install hint."""
    try:
        import pyarrow as pa  # noqa: PLC0415 - optional dependency
        import pyarrow.ipc  # noqa: F401, PLC0415
        import pyarrow.parquet  # noqa: F401, PLC0415
    except ImportError:
        raise TabularError(f"{where} needs pyarrow, which is not installed: {INSTALL_HINT}") from None
    return pa


def _read_json(path: Path) -> Any:
    try:
        return bounded_json.loads(read_regular(path, DATASET_JSON_LIMIT))
    except FileNotFoundError:
        raise TabularError(f"{path}: no such file") from None
    except UnsafeFileError as exc:
        raise TabularError(str(exc)) from None
    except (OSError, ValueError, RecursionError) as exc:
        raise TabularError(f"{path}: unreadable ({exc})") from None


def dataset_files(src: HFDatasetSource, base: Path) -> list[Path]:
    """The Arrow files of a `save_to_disk` directory (the split's, for a DatasetDict), in their order."""
    root = base / src.hf_dataset
    where = f"hf_dataset source {src.hf_dataset!r}"
    if not root.is_dir():
        raise TabularError(f"{where}: no such directory (looked at {root})")
    if (root / DATASET_DICT).is_file():
        obj = _read_json(root / DATASET_DICT)
        splits = obj.get("splits") if isinstance(obj, dict) else None
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise TabularError(f"{root / DATASET_DICT}: no list of splits")
        split = src.split or DEFAULT_SPLIT
        if split not in splits:
            raise TabularError(f"{where}: no split {split!r} (it has {', '.join(splits) or 'none'})")
        root = root / split
    elif src.split is not None:
        raise TabularError(f"{where}: a single dataset (no {DATASET_DICT}), so no split {src.split!r}")
    state = _read_json(root / STATE)
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise TabularError(f"{root / STATE}: lists no data files (_data_files); not a save_to_disk directory?")
    files = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise TabularError(f"{root / STATE}: a data file entry that is not a file name: {str(entry)[:60]}")
        path = root / name
        problem = regular_file_problem(path)
        if problem == NO_SUCH_FILE:
            raise TabularError(f"{where}: data file {name} listed in {STATE} is missing (looked at {path})")
        if problem is not None:  # a FIFO would block, a device never end
            raise TabularError(f"{where}: data file {name} listed in {STATE} is {problem} (at {path}); not read")
        files.append(path)
    return files


def _string_column(schema: Any, column: str, path: Path | str) -> None:
    """TabularError unless `column` is in `schema` and holds strings."""
    pa = pyarrow(f"{path}")
    if column not in schema.names:
        names = ", ".join(schema.names[:20]) + (", ..." if len(schema.names) > 20 else "")
        raise TabularError(f"{path}: no column {column!r} (columns: {names})")
    kind = schema.field(column).type
    if pa.types.is_dictionary(kind):  # dictionary-encoded strings (a pandas category) are text too
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise TabularError(f"{path}: column {column!r} holds {kind}, not text")


def _open_arrow(pa: Any, path: Path) -> Any:
    """An Arrow IPC stream (what save_to_disk writes) or file, memory-mapped."""
    try:
        source = pa.memory_map(str(path))
    except (pa.ArrowException, OSError) as exc:
        raise TabularError(f"{path}: cannot read ({str(exc).splitlines()[0][:120]})") from None
    try:
        return pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError):
        try:
            reader = pa.ipc.open_file(source)
        except (pa.ArrowInvalid, OSError) as exc:
            raise TabularError(f"{path}: not an Arrow file ({str(exc).splitlines()[0][:120]})") from None

        class Batches:  # the file format's batches, read like a stream
            schema = reader.schema

            def __iter__(self) -> Iterator[Any]:
                return (reader.get_batch(i) for i in range(reader.num_record_batches))

        return Batches()


def plan(src: ParquetSource | HFDatasetSource, files: list[Path], unit_bytes: int) -> Iterator[tuple[str, tuple, int]]:
    """(reader, items, nbytes) of each work unit, in order: Parquet row groups, runs of Arrow batches.
    nbytes adds up to each file's size (progress)."""
    pa = pyarrow(src.describe())
    for path in files:
        size = path.stat().st_size
        if src.kind == "parquet":
            try:
                meta = pa.parquet.ParquetFile(str(path))
            except (pa.ArrowException, OSError) as exc:
                raise TabularError(f"{path}: not a Parquet file ({str(exc).splitlines()[0][:120]})") from None
            _string_column(meta.schema_arrow, src.column, path)
            groups = meta.metadata.num_row_groups
            sizes = [meta.metadata.row_group(i).total_byte_size for i in range(groups)]
            yield from _shares("parquet", [(str(path), i, i + 1) for i in range(groups)], sizes, size)
        else:
            reader = _open_arrow(pa, path)
            _string_column(reader.schema, src.column, path)
            runs, sizes = [], []
            first = count = run_bytes = 0
            try:
                for batch in reader:
                    count += 1
                    run_bytes += batch.nbytes
                    if run_bytes >= unit_bytes:
                        runs.append((str(path), first, count))
                        sizes.append(run_bytes)
                        first, run_bytes = count, 0
            except (pa.ArrowException, OSError) as exc:  # a truncated or damaged file
                raise TabularError(f"{path}: record batch {count}: {str(exc).splitlines()[0][:120]}") from None
            if first < count or not runs:
                runs.append((str(path), first, count))
                sizes.append(run_bytes)
            yield from _shares("arrow", runs, sizes, size)


def _shares(reader: str, items: list[tuple], sizes: list[int], file_size: int) -> Iterator[tuple[str, tuple, int]]:
    """Each item with its share of the file's size (the last takes the rounding)."""
    total = sum(sizes) or 1
    done = 0
    for k, (item, s) in enumerate(zip(items, sizes, strict=False)):
        share = file_size - done if k == len(items) - 1 else file_size * s // total
        done += share
        yield reader, (item,), share


def _parquet_chunks(pa: Any, path: str, first: int, stop: int, column: str) -> Iterator:
    """The column's values in the row groups [first, stop), BATCH_ROWS rows decoded at a time."""
    try:
        for batch in pa.parquet.ParquetFile(path).iter_batches(
            batch_size=BATCH_ROWS, row_groups=list(range(first, stop)), columns=[column], use_threads=False
        ):
            yield batch.column(0)
    except (pa.ArrowException, OSError) as exc:
        raise TabularError(f"{path}: row group {first}: {str(exc).splitlines()[0][:120]}") from None


def _arrow_chunks(pa: Any, path: str, first: int, stop: int, column: str) -> Iterator:
    """The column of the Arrow file's record batches [first, stop) (memory-mapped: nothing is copied)."""
    at = 0
    try:
        for batch in _open_arrow(pa, Path(path)):
            if at >= stop:
                break
            if at >= first:
                yield batch.column(batch.schema.get_field_index(column))
            at += 1
    except (pa.ArrowException, OSError) as exc:
        raise TabularError(f"{path}: record batch {at}: {str(exc).splitlines()[0][:120]}") from None


def read(reader: str, items: tuple, column: str) -> Iterator[str]:
    """The non-empty strings of `column` in the unit's rows, in order; at most BATCH_ROWS of them made
    Python strings at a time."""
    for path, first, stop in items:
        pa = pyarrow(path)
        chunks = (_parquet_chunks if reader == "parquet" else _arrow_chunks)(pa, path, first, stop, column)
        for chunk in chunks:
            for at in range(0, len(chunk), BATCH_ROWS):
                for value in chunk.slice(at, BATCH_ROWS).to_pylist():
                    if value:
                        yield value
