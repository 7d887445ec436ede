"""Parquet files and Hugging Face save_to_disk directories (read with pyarrow, without the datasets package)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is the [parquet] extra (pip install '.[test]' brings it)")
import pyarrow.parquet as pq  # noqa: E402

from proxy.config.sources import parse_source  # noqa: E402
from proxy.data import SourceError, load_documents, prepare_data  # noqa: E402
from proxy.data.source_readers import source_fingerprint  # noqa: E402

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
        table = pa.table({"text": rows[k * per:(k + 1) * per], "n": list(range(len(rows[k * per:(k + 1) * per])))})
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=40):
                writer.write_batch(batch)
        names.append(name)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                      "_fingerprint": "x", "_split": None}))
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
    assert "".join(kept) == "".join(ROWS)[:100] and kept[:-1] == ROWS[:len(kept) - 1]  # the last one cut


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
    (tmp_path / "ds" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00002.arrow"}]}))
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
    exp = parse_experiment({
        "name": "tab", "model": {"vocab": 300, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
        "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
        "arms": [{"name": "p", "sources": [{"parquet": "p.parquet"}]}, {"name": "d", "sources": [{"hf_dataset": "ds"}]}]})
    one = prepare_data(exp, tmp_path, tmp_path / "c1", progress=False, workers=1)
    two = prepare_data(exp, tmp_path, tmp_path / "c2", progress=False, workers=2)
    for arm in ("p", "d"):
        assert Path(one.train[arm][0].path).read_bytes() == Path(two.train[arm][0].path).read_bytes()
        assert Path(one.val_shards[arm]).read_bytes() == Path(two.val_shards[arm]).read_bytes()
        assert one.stats[arm]["docs"] == len(rows)
