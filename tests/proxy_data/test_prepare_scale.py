"""Preparation at scale: long documents in pieces, work units, workers, the bounded tokenizer sample, binary files.

UNIT_BYTES (planning, in this process) and the sample bound are made small here
so that a test-sized corpus takes the paths a gigabyte takes: files split
over many units, JSON Lines split between lines, a sample of the text.
"""

from __future__ import annotations

import io
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from proxy.config.experiment import parse_experiment
from proxy.config.sources import parse_source
from proxy.data import DataError, SourceError, load_documents, prepare_data, train_tokenizer
from proxy.data.builtin_sources import stdlib_files
from proxy.data.progress_bars import ProgressBars
from proxy.data.text import WORD_CHARS, binary_reason, pieces, safe_cut
from proxy.formats.shard import read_shard


@pytest.fixture(scope="module")
def code_text() -> str:
    """About 2 MB of real text: standard library modules, one after another."""
    parts, size = [], 0
    for p in stdlib_files():
        text = p.read_text(encoding="utf-8", errors="ignore")
        parts.append(text)
        size += len(text)
        if size > 2_000_000:
            break
    return "".join(parts)


@pytest.fixture(scope="module")
def tokenizer(code_text):
    return train_tokenizer([code_text[:400_000]], 1024)


def test_safe_cuts_encode_as_the_whole(code_text, tokenizer):
    """Pieces cut before a newline that follows a printable character encode to exactly the whole's tokens."""
    text = code_text[:600_000]
    parts = pieces(text, size=5_000)
    assert len(parts) > 100 and "".join(parts) == text
    assert all(p.startswith("\n") for p in parts[1:]) and all(p[-1] not in " \t\n" for p in parts[:-1])
    whole = tokenizer.encode(text)
    assert [i for p in parts for i in tokenizer.encode(p)] == whole
    # bytes cut the same way (a file read in parts)
    data = text.encode()
    assert safe_cut(data, 5_000) == len(text[: safe_cut(text, 5_000)].encode())
    # Windows line ends: cut before the \r\n, and the pieces still encode as the whole
    crlf = text.replace("\n", "\r\n")
    parts = pieces(crlf, size=5_000)
    assert len(parts) > 100 and all(p.startswith("\r\n") for p in parts[1:])
    assert [i for p in parts for i in tokenizer.encode(p)] == tokenizer.encode(crlf)
    assert safe_cut(b"ab\r\ncd", 2) == 2 and safe_cut(b"ab\r\ncd", 3) == 3  # never before `nominal`
    # no newline nearby: the nominal place (on a character boundary for bytes)
    long_line = ("é" * 100_000).encode()
    assert safe_cut(long_line, 5_001) == 5_002


def experiment(arms: dict, vocab=1024, tokenizer=None):
    obj = {
        "name": "scale",
        "model": {"vocab": vocab, "ctx": 32, "dim": 16, "layers": 1, "heads": 2},
        "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
        "arms": [{"name": name, "sources": sources} for name, sources in arms.items()],
    }
    if tokenizer:
        obj["tokenizer"] = tokenizer
    return parse_experiment(obj)


def shard_bytes(data, arm) -> tuple[bytes, bytes]:
    return Path(data.train[arm][0].path).read_bytes(), Path(data.val_shards[arm]).read_bytes()


def test_one_and_two_workers_give_the_same_bytes(tmp_path, code_text, tokenizer, monkeypatch):
    """A file over many units (one document cut in pieces), JSON Lines split between units, a directory of
    small files: the same shards from one worker (this process) and from two worker processes; the big
    file's tokens are its whole encoding."""
    monkeypatch.setattr("proxy.data.source_readers.UNIT_BYTES", 64 * 1024)
    (tmp_path / "big.txt").write_text(code_text)
    with open(tmp_path / "lines.jsonl", "w") as f:
        for i in range(3000):
            f.write(json.dumps({"text": f"line {i}: " + code_text[i * 97 : i * 97 + 300]}) + "\n")
    (tmp_path / "dir").mkdir()
    for i in range(40):
        (tmp_path / "dir" / f"m{i:02d}.py").write_text(code_text[i * 10_000 : (i + 1) * 10_000])
    (tmp_path / "tokenizer.json").write_text(tokenizer.to_str())
    exp = experiment(
        {"big": [{"file": "big.txt"}], "lines": [{"jsonl": "lines.jsonl"}], "dir": [{"dir": "dir", "suffix": ".py"}]},
        tokenizer="tokenizer.json",
    )
    one = prepare_data(exp, tmp_path, tmp_path / "one", progress=False, workers=1)
    two = prepare_data(exp, tmp_path, tmp_path / "two", progress=False, workers=2)
    assert one.key == two.key
    for arm in exp.arm_names:
        assert shard_bytes(one, arm) == shard_bytes(two, arm), arm
    train, val = (read_shard(p)[0] for p in (one.train["big"][0].path, one.val_shards["big"]))
    assert np.array_equal(np.concatenate([train, val]), tokenizer.encode(code_text) + [tokenizer.eot_id])
    assert one.stats["lines"]["docs"] == 3000 and one.stats["dir"]["docs"] == 40
    docs = load_documents(parse_source({"jsonl": "lines.jsonl"}), tmp_path)
    assert len(docs) == 3000 and docs[1234].startswith("line 1234: ")


def test_the_tokenizer_trains_on_a_bounded_sample(tmp_path, code_text, monkeypatch):
    (tmp_path / "big.txt").write_text(code_text)
    exp = experiment({"a": [{"file": "big.txt"}]})
    monkeypatch.setattr("proxy.data.source_readers.UNIT_BYTES", 64 * 1024)
    monkeypatch.setattr("proxy.data.split.SAMPLE_BYTES", 300_000)
    monkeypatch.setattr("proxy.data.text_arms.SAMPLE_CAP", 600_000)
    err = io.StringIO()
    data = prepare_data(exp, tmp_path, tmp_path / "cache", progress=ProgressBars(True, err), workers=1)
    log = err.getvalue()
    sampled = float(log.split("training tokenizer (vocab 1024)")[1].split("learned from ")[1].split("M")[0])
    assert 0.15 < sampled <= 0.6, log  # about 300 KB of 2 MB, never past the cap
    again = prepare_data(exp, tmp_path, tmp_path / "again", progress=False, workers=1)
    assert again.tokenizer_json == data.tokenizer_json  # the sample is deterministic


def test_binary_data_is_not_text(tmp_path):
    ids = np.random.default_rng(0).integers(1, 128, 5000).astype("<u2")  # every other byte NUL, valid UTF-8
    (tmp_path / "ids.bin").write_bytes(ids.tobytes())
    assert binary_reason(ids.tobytes()) == "binary data (NUL bytes), not text"
    with pytest.raises(
        SourceError,
        match=r"ids.bin: binary data \(NUL bytes\), not text; for token ids use a "
        r'\{"tokens": \.\.\.\} source',
    ):
        load_documents(parse_source({"file": "ids.bin"}), tmp_path)
    control = bytes(np.random.default_rng(1).integers(1, 9, 4000, dtype=np.uint8)) + b"text\n" * 100
    (tmp_path / "control.txt").write_bytes(control)
    with pytest.raises(SourceError, match=r"control.txt: binary data \(\d+% control bytes\), not text"):
        load_documents(parse_source({"file": "control.txt"}), tmp_path)
    with open(tmp_path / "rows.jsonl", "wb") as f:
        f.write(b'{"text": "fine"}\n{"text": "nul \x00 inside"}\n')
    with pytest.raises(SourceError, match=r"rows.jsonl:2: binary data \(NUL bytes\)"):
        load_documents(parse_source({"jsonl": "rows.jsonl"}), tmp_path)
    # a glob or a directory skips such files, as it skips files that are not UTF-8
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "ids.txt").write_bytes(ids.tobytes())
    (tmp_path / "d" / "ok.txt").write_text("plain text\n")
    assert load_documents(parse_source({"dir": "d"}), tmp_path) == ["plain text\n"]
    exp = experiment({"a": [{"file": "ids.bin"}]}, vocab=300)
    with pytest.raises(DataError, match=r"arm 'a': .*ids.bin: binary data \(NUL bytes\)"):
        prepare_data(exp, tmp_path, tmp_path / "cache", progress=False)


def test_no_piece_holds_a_run_longer_than_a_word(code_text, tokenizer):
    """Runs of non-whitespace or of whitespace longer than WORD_CHARS are cut every WORD_CHARS characters;
    ordinary text is not (its pieces still encode as the whole, test_safe_cuts_encode_as_the_whole)."""
    text = (
        code_text[:50_000]
        + "x" * (3 * WORD_CHARS + 5)
        + "!" * WORD_CHARS
        + " " * (2 * WORD_CHARS + 1)
        + "é" * (WORD_CHARS + 1)
        + code_text[50_000:60_000]
    )
    parts = pieces(text, size=20_000)
    assert "".join(parts) == text
    longest = max(len(run) for part in parts for run in re.findall(r"\S+|\s+", part))
    assert longest == WORD_CHARS
    assert pieces(text, size=20_000) == parts  # a function of the text alone
    assert len(pieces("a" * (16 << 20))) == (16 << 20) // WORD_CHARS
    huge = "z" * (2 * WORD_CHARS + 3)
    assert list(tokenizer.encode_document(huge)) == [i for p in pieces(huge) for i in tokenizer.encode(p)]
    assert list(tokenizer.encode_document(code_text[:300_000])) == tokenizer.encode(code_text[:300_000])


PREPARE_ONE = """
import json, resource, sys, time
from pathlib import Path
from proxy.config.experiment import parse_experiment
from proxy.data import prepare_data

def main():
    d = Path(sys.argv[1])
    exp = parse_experiment({"name": "word", "model": {"vocab": 4608, "ctx": 32, "dim": 16, "layers": 1, "heads": 2},
        "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
        "arms": [{"name": "a", "sources": [json.loads(sys.argv[2])]}]})
    data = prepare_data(exp, d, d / "cache", progress=False)
    rss = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(json.dumps({"kib": rss, "stats": data.stats["a"]}))

if __name__ == "__main__":
    main()
"""
WORD_LIMIT_S = 120  # it takes seconds; before documents were cut, training the tokenizer did not end
WORD_RSS_KIB = 1 << 20  # 1 GiB; before, a 4 MiB word took 520 MB and a 4 MiB x 100 Parquet 21.6 GB


def _prepare_in_a_child(tmp_path, source: dict) -> tuple[dict, float]:
    """Data preparation of one source in its own process (its workers its children), under RLIMIT_AS 8 GiB:
    (its report: the largest RSS of it or a worker, in KiB, and the arm's stats), and its seconds."""
    (tmp_path / "prepare_one.py").write_text(PREPARE_ONE)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(tmp_path / "prepare_one.py"), str(tmp_path), json.dumps(source)],
        capture_output=True,
        text=True,
        timeout=WORD_LIMIT_S,
        preexec_fn=limit,
        env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    seconds = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), seconds


def test_a_16_mib_word_prepares_in_bounded_memory_and_time(tmp_path):
    """A document of one 16 MiB word, the run training its own tokenizer on it: seconds, not hours, and a
    bounded peak RSS in the preparing process and each worker."""
    (tmp_path / "word.txt").write_text("a" * (16 << 20))
    report, seconds = _prepare_in_a_child(tmp_path, {"file": "word.txt"})
    assert report["stats"]["chars"] == 16 << 20 and report["stats"]["docs"] == 1
    assert report["kib"] < WORD_RSS_KIB and seconds < WORD_LIMIT_S, (report, seconds)


def test_a_tiny_parquet_file_of_huge_rows_prepares_in_bounded_memory(tmp_path):
    """A zstd Parquet file of a few hundred bytes holding 24 rows of 4 MiB of one letter (96 MiB of text):
    its rows are decoded a few at a time and each cut into words of WORD_CHARS."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["q" * (4 << 20)] * 24}), tmp_path / "rows.parquet", compression="zstd")
    assert (tmp_path / "rows.parquet").stat().st_size < 4096
    report, seconds = _prepare_in_a_child(tmp_path, {"parquet": "rows.parquet"})
    assert report["stats"]["docs"] == 24 and report["stats"]["chars"] == 24 << 22
    assert report["kib"] < WORD_RSS_KIB and seconds < WORD_LIMIT_S, (report, seconds)
