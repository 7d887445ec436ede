"""Parquet files and Hugging Face save_to_disk directories (read with pyarrow, without the datasets package)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is the [parquet] extra (pip install '.[test]' brings it)")
import pyarrow.parquet as pq  # noqa: E402

from proxy.config.sources import parse_source  # noqa: E402
from proxy.data import SourceError, load_documents, prepare_data  # noqa: E402
from proxy.data.source_files import source_fingerprint  # noqa: E402

ROWS = [f"row {i}: " + "some text of the row " * (i % 5 + 1) for i in range(300)]


def write_parquet(path: Path, rows: list, group: int = 50, **columns) -> Path:
    table = pa.table({"text": rows, "id": list(range(len(rows))), **columns})
    pq.write_table(table, path, row_group_size=group)
    return path


def save_to_disk(directory: Path, rows: list, files: int = 2) -> Path:
    """The layout `datasets.Dataset.save_to_disk` writes: Arrow IPC stream files, state.json, dataset_info.json."""
    directory.mkdir(parents=True)
    names = []
    per = -(-len(rows) // files)
    for k in range(files):
        name = f"data-{k:05d}-of-{files:05d}.arrow"
        table = pa.table({"text": rows[k * per : (k + 1) * per], "n": list(range(len(rows[k * per : (k + 1) * per])))})
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=40):
                writer.write_batch(batch)
        names.append(name)
    (directory / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": n} for n in names], "_fingerprint": "x", "_split": None})
    )
    (directory / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    return directory


def src(**fields):
    return parse_source(fields)


def test_parquet_rows_in_order(tmp_path):
    write_parquet(tmp_path / "b.parquet", ROWS[150:])
    write_parquet(tmp_path / "a.parquet", ROWS[:150] + [None, ""])
    assert load_documents(src(parquet="a.parquet"), tmp_path) == ROWS[:150]  # null and empty rows are no documents
    assert load_documents(src(parquet="*.parquet"), tmp_path) == ROWS  # a pattern: files in sorted order
    kept = load_documents(src(parquet="*.parquet", max_chars=100), tmp_path)
    assert "".join(kept) == "".join(ROWS)[:100] and kept[:-1] == ROWS[: len(kept) - 1]  # the last one cut


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    save_to_disk(tmp_path / "ds", ROWS)
    assert load_documents(src(hf_dataset="ds"), tmp_path) == ROWS
    root = tmp_path / "dd"
    save_to_disk(root / "train", ROWS[:200])
    save_to_disk(root / "test", ROWS[200:], files=1)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert load_documents(src(hf_dataset="dd"), tmp_path) == ROWS[:200]  # "train" by default
    assert load_documents(src(hf_dataset="dd", split="test"), tmp_path) == ROWS[200:]
    with pytest.raises(SourceError, match="no split 'valid' \\(it has train, test\\)"):
        load_documents(src(hf_dataset="dd", split="valid"), tmp_path)
    with pytest.raises(SourceError, match="a single dataset \\(no dataset_dict.json\\), so no split 'test'"):
        load_documents(src(hf_dataset="ds", split="test"), tmp_path)
    # the fingerprint holds the data files' bytes: a changed row changes it
    before = source_fingerprint(src(hf_dataset="ds"), tmp_path)
    (tmp_path / "ds" / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00002.arrow"}]})
    )
    assert source_fingerprint(src(hf_dataset="ds"), tmp_path) != before


def test_column_errors_are_one_line(tmp_path):
    write_parquet(tmp_path / "a.parquet", ROWS[:20])
    with pytest.raises(SourceError) as exc:
        load_documents(src(parquet="a.parquet", column="body"), tmp_path)
    assert str(exc.value).endswith("a.parquet: no column 'body' (columns: text, id)")
    with pytest.raises(SourceError, match="a.parquet: column 'id' holds int64, not text"):
        load_documents(src(parquet="a.parquet", column="id"), tmp_path)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all" * 10)
    with pytest.raises(SourceError, match="junk.parquet: not a Parquet file"):
        load_documents(src(parquet="junk.parquet"), tmp_path)
    save_to_disk(tmp_path / "ds", ROWS[:20], files=1)
    with pytest.raises(SourceError, match="no column 'body' \\(columns: text, n\\)"):
        load_documents(src(hf_dataset="ds", column="body"), tmp_path)
    (tmp_path / "ds" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../escape.arrow"}]}))
    with pytest.raises(SourceError, match="a data file entry that is not a file name"):
        load_documents(src(hf_dataset="ds"), tmp_path)


def test_prepare_parquet_and_dataset_arms_with_workers(tmp_path, monkeypatch):
    """Many units (row groups, batch runs; planned here, read by the workers) read by two worker processes
    give the bytes one worker gives."""
    monkeypatch.setattr("proxy.data.source_readers.UNIT_BYTES", 2000)
    rows = ROWS * 20
    write_parquet(tmp_path / "p.parquet", rows, group=100)
    save_to_disk(tmp_path / "ds", rows, files=3)
    from proxy.config.experiment import parse_experiment

    exp = parse_experiment(
        {
            "name": "tab",
            "model": {"vocab": 300, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
            "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
            "arms": [
                {"name": "p", "sources": [{"parquet": "p.parquet"}]},
                {"name": "d", "sources": [{"hf_dataset": "ds"}]},
            ],
        }
    )
    one = prepare_data(exp, tmp_path, tmp_path / "c1", progress=False, workers=1)
    two = prepare_data(exp, tmp_path, tmp_path / "c2", progress=False, workers=2)
    for arm in ("p", "d"):
        assert Path(one.train[arm][0].path).read_bytes() == Path(two.train[arm][0].path).read_bytes()
        assert Path(one.val_shards[arm]).read_bytes() == Path(two.val_shards[arm]).read_bytes()
        assert one.stats[arm]["docs"] == len(rows)


def test_dictionary_encoded_strings_are_text(tmp_path):
    """A string column stored dictionary-encoded (a pandas category, or pyarrow's dictionary_encode)."""
    pq.write_table(pa.table({"text": pa.array(ROWS[:40]).dictionary_encode()}), tmp_path / "d.parquet")
    assert pa.types.is_dictionary(pq.ParquetFile(tmp_path / "d.parquet").schema_arrow.field("text").type)
    assert load_documents(src(parquet="d.parquet"), tmp_path) == ROWS[:40]
    ints = pa.array([1, 2, 3]).dictionary_encode()
    pq.write_table(pa.table({"text": ints}), tmp_path / "i.parquet")
    with pytest.raises(SourceError, match="i.parquet: column 'text' holds int64, not text"):
        load_documents(src(parquet="i.parquet"), tmp_path)


def _prepare_one(tmp_path, source: dict):
    from proxy.config.experiment import parse_experiment

    exp = parse_experiment(
        {
            "name": "tab",
            "model": {"vocab": 300, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
            "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
            "arms": [{"name": "rows", "sources": [source]}],
        }
    )
    return prepare_data(exp, tmp_path, tmp_path / "cache", progress=False, workers=1)


def test_a_truncated_arrow_file_is_one_line_naming_arm_and_file(tmp_path):
    from proxy.data import DataError

    save_to_disk(tmp_path / "ds", ROWS * 30, files=1)
    arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
    raw = arrow.read_bytes()
    for cut in (len(raw) // 2, 9, 0):
        arrow.write_bytes(raw[:cut])
        with pytest.raises(DataError) as exc:
            _prepare_one(tmp_path, {"hf_dataset": "ds"})
        line = str(exc.value)
        assert line.startswith("arm 'rows': ") and str(arrow) in line and "\n" not in line, (cut, line)


def test_a_dataset_file_that_is_not_a_regular_file_is_named_so(tmp_path):
    import os

    save_to_disk(tmp_path / "ds", ROWS, files=1)
    arrow = tmp_path / "ds" / "data-00000-of-00001.arrow"
    for what, make in (
        ("a character device", lambda: os.symlink("/dev/zero", arrow)),
        ("a FIFO", lambda: os.mkfifo(arrow)),
        ("a directory", lambda: arrow.mkdir()),
    ):
        arrow.unlink() if not arrow.is_dir() else arrow.rmdir()
        make()
        with pytest.raises(SourceError) as exc:
            load_documents(src(hf_dataset="ds"), tmp_path)
        assert f"data-00000-of-00001.arrow listed in state.json is {what}, not a regular file" in str(exc.value)
        assert "missing" not in str(exc.value)
    arrow.rmdir()
    with pytest.raises(SourceError, match="listed in state.json is missing"):
        load_documents(src(hf_dataset="ds"), tmp_path)


def test_rows_are_decoded_a_few_at_a_time(tmp_path):
    """One row group of 64 rows of 1 MiB each (a zstd file of a few hundred bytes): while its rows are read,
    Arrow and Python hold about BATCH_ROWS of them at a time, never the whole 64 MiB group."""
    import tracemalloc

    from proxy.data import tabular

    rows = ["b" * (1 << 20)] * 64
    pq.write_table(pa.table({"text": rows}), tmp_path / "z.parquet", compression="zstd")
    assert (tmp_path / "z.parquet").stat().st_size < 4096
    arrow_peak = count = 0
    tracemalloc.start()
    try:
        for text in tabular.read("parquet", ((str(tmp_path / "z.parquet"), 0, 1),), "text"):
            count += len(text) == 1 << 20
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes())
            del text
        python_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = (tabular.BATCH_ROWS + 8) << 20
    assert count == 64 and arrow_peak < bound and python_peak < bound, (arrow_peak, python_peak)


def test_a_source_that_is_a_fifo_or_a_device_is_named_so(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.txt")
    os.symlink("/dev/zero", tmp_path / "zero.parquet")
    with pytest.raises(SourceError, match=r"file source 'pipe.txt': a FIFO, not a regular file \(at .*\); not read"):
        load_documents(src(file="pipe.txt"), tmp_path)
    with pytest.raises(
        SourceError,
        match=r"matches no file \(looked for .*\): only .*zero.parquet, a character "
        r"device, not a regular file",
    ):
        load_documents(src(parquet="zero.parquet"), tmp_path)
    with pytest.raises(SourceError, match="file source: no such file 'gone.txt'"):
        load_documents(src(file="gone.txt"), tmp_path)
