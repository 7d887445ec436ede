"""Token files made elsewhere (nanoGPT .bin, llm.c shards, .npy): read in place, checked, split, sampled."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from proxy.config.experiment import parse_experiment
from proxy.data import DataError, prepare_data
from proxy.data.batches import BatchSampler, segment_arrays
from proxy.data.split import val_target
from proxy.formats.shard import read_shard
from proxy.formats.token_files import LLMC_MAGIC, TokenFileError, detect_format, first_out_of_range, open_token_file

VOCAB = 512


def llmc_bytes(ids: np.ndarray, version: int = 1, magic: int = LLMC_MAGIC, count: int | None = None) -> bytes:
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, ids.size if count is None else count
    return header.tobytes() + ids.astype("<u2" if version == 1 else "<u4").tobytes()


def ids_of(n: int, seed: int = 0, high: int = VOCAB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, n).astype(np.uint16)


@pytest.fixture
def tokenizer_file(tmp_path) -> Path:
    """A byte-level BPE with <|endoftext|>, made here (nothing is downloaded)."""
    from proxy.data.tokenizer import train_tokenizer

    tok = train_tokenizer(["def f(x):\n    return x\n" * 50, "The quick brown fox.\n" * 50], VOCAB)
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str())
    return path


def experiment(sources, vocab=VOCAB, ctx=16, tokenizer="tokenizer.json"):
    return parse_experiment(
        {
            "name": "tok",
            "model": {"vocab": vocab, "ctx": ctx, "dim": 16, "layers": 1, "heads": 2},
            "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
            "tokenizer": tokenizer,
            "arms": [{"name": "t", "sources": sources}],
        }
    )


def test_formats_read_in_place(tmp_path):
    ids = ids_of(5000)
    (tmp_path / "train.bin").write_bytes(ids.tobytes())  # nanoGPT: raw uint16
    (tmp_path / "shard.bin").write_bytes(llmc_bytes(ids))
    (tmp_path / "shard2.bin").write_bytes(llmc_bytes(ids, version=2))
    np.save(tmp_path / "a.npy", ids)
    np.save(tmp_path / "b.npy", ids.astype(np.uint32))
    expected = {
        "train.bin": ("uint16", "<u2", 0),
        "shard.bin": ("llmc", "<u2", 1024),
        "shard2.bin": ("llmc", "<u4", 1024),
        "a.npy": ("npy", "<u2", 128),
        "b.npy": ("npy", "<u4", 128),
    }
    for name, (fmt, dtype, offset) in expected.items():
        tf = open_token_file(tmp_path / name)
        assert (tf.format, tf.dtype, tf.offset, tf.count) == (fmt, dtype, offset, ids.size), name
        assert np.array_equal(tf.segment().array(), ids)
        assert isinstance(tf.segment().array(), np.memmap)  # never loaded whole
    assert detect_format(b"\x93NUMPY\x01\x00") == "npy" and detect_format(b"ab") == "uint16"


def _npy_with_header_of(length: int, ids: np.ndarray) -> bytes:
    """A version 2.0 .npy file of `ids` whose header is padded with spaces to about `length` bytes (numpy reads
    at most 10,000 unless told the file is trusted)."""
    header = f"{{'descr': '<u2', 'fortran_order': False, 'shape': ({ids.size},), }}" + " " * length
    header += " " * (-(len(header) + 1 + 12) % 64) + "\n"
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header.encode() + ids.astype("<u2").tobytes()


def test_format_errors_are_one_line(tmp_path):
    ids = ids_of(100)
    cases = {
        "odd.bin": (ids.tobytes() + b"x", None, "truncated: 201 bytes is not a whole number of uint16 tokens"),
        "magic.bin": (
            ids.tobytes(),
            "llmc",
            f"not an llm.c shard (magic {struct.unpack('<i', ids[:2].tobytes())[0]}, expected {LLMC_MAGIC})",
        ),
        "short.bin": (
            llmc_bytes(ids, count=200),
            None,
            "truncated: its header says 200 tokens (1424 bytes), the file has 1224 bytes",
        ),
        "head.bin": (
            llmc_bytes(ids)[:600],
            "llmc",
            "truncated llm.c shard (600 bytes, shorter than its 1024-byte header)",
        ),
        "version.bin": (llmc_bytes(ids, version=7), None, "llm.c shard version 7 is not one this reads"),
        "float.npy": (None, None, "NumPy array of float32, not uint16 or uint32 token ids"),
        "cut.npy": (None, None, "truncated: its header says 100 tokens"),
        "plain.npy": (ids.tobytes(), "npy", "not a NumPy array file"),
        "wide.npy": (_npy_with_header_of(12_000, ids), None, "not a NumPy array file (Header info length (12"),
    }
    np.save(tmp_path / "float.npy", ids.astype(np.float32))
    np.save(tmp_path / "cut.npy", ids)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:-10])
    for name, (data, fmt, message) in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(TokenFileError) as exc:
            open_token_file(tmp_path / name, fmt)
        assert message in str(exc.value) and "\n" not in str(exc.value), name
        assert str(exc.value).startswith(str(tmp_path / name))


def test_ids_checked_against_the_vocabulary(tmp_path):
    ids = ids_of(3000)
    ids[2500] = VOCAB
    tf = open_token_file(_write(tmp_path / "x.bin", ids))
    assert first_out_of_range(tf.segment(), VOCAB) == (2500, VOCAB)
    assert first_out_of_range(tf.segment(), VOCAB + 1) is None


def _write(path: Path, ids: np.ndarray) -> Path:
    path.write_bytes(ids.astype("<u2").tobytes())
    return path


def test_prepare_reads_token_files_in_place(tmp_path, tokenizer_file):
    train, val = ids_of(40_000, 1), ids_of(3000, 2)
    _write(tmp_path / "train.bin", train)
    _write(tmp_path / "val.bin", val)
    data = prepare_data(
        experiment([{"tokens": "train.bin", "val": "val.bin"}]), tmp_path, tmp_path / "cache", progress=False
    )
    (segment,) = data.train["t"]
    assert segment.path == str((tmp_path / "train.bin").resolve()) and segment.tokens == train.size
    assert not list((data.path).glob("t.train.tok"))  # the training tokens are not copied
    assert np.array_equal(read_shard(data.val_shards["t"])[0], val)
    assert data.tokenizer_json == tokenizer_file.read_bytes()  # the given tokenizer, byte for byte
    assert data.stats["t"]["train_tokens"] == train.size and data.stats["t"]["val_tokens"] == val.size
    again = prepare_data(
        experiment([{"tokens": "train.bin", "val": "val.bin"}]), tmp_path, tmp_path / "cache", progress=False
    )
    assert again.cached and again.key == data.key


def test_validation_split_off_the_end_across_files(tmp_path, tokenizer_file):
    """Without `val`, the last val_target(n) tokens of the stream (files in sorted order) go to validation."""
    parts = [ids_of(30_000, 3), ids_of(800, 4)]
    np.save(tmp_path / "s0.npy", parts[0].astype(np.uint32))
    (tmp_path / "s1.bin").write_bytes(llmc_bytes(parts[1]))
    for name, pattern in (("npy", "s0.npy"), ("both", "s[01].*")):
        exp = experiment([{"tokens": pattern}])
        data = prepare_data(exp, tmp_path, tmp_path / f"cache-{name}", progress=False)
        stream = parts[0] if name == "npy" else np.concatenate(parts)
        need = val_target(stream.size)
        assert np.array_equal(read_shard(data.val_shards["t"])[0], stream[-need:])
        train = np.concatenate([s.array().astype(np.uint16) for s in data.train["t"]])
        assert np.array_equal(train, stream[:-need])
    # the batch sampler draws rows from every file, never across two of them
    sampler = BatchSampler(
        {"t": segment_arrays(data.train["t"])}, {"t": read_shard(data.val_shards["t"])[0]}, ["t"], 1, 17
    )
    rows = np.concatenate([sampler.train_batch(step, [1.0], 64)[0] for step in range(1, 40)])
    assert rows.dtype == np.uint16 and rows.shape[1] == 17
    windows = {tuple(stream[i : i + 17]) for i in range(stream.size - 16)}
    assert all(tuple(r) in windows for r in rows)


def test_prepare_errors_name_the_arm_and_the_file(tmp_path, tokenizer_file):
    ids = ids_of(5000)
    ids[4000] = 600
    _write(tmp_path / "big.bin", ids)
    with pytest.raises(
        DataError,
        match=r"arm 't': .*big.bin: token id 600 at position 4000 is at or above "
        r"model.vocab 512",
    ):
        prepare_data(experiment([{"tokens": "big.bin"}]), tmp_path, tmp_path / "cache", progress=False)
    _write(tmp_path / "ok.bin", ids_of(5000))
    with pytest.raises(DataError, match=r"arm 't': .*ok.bin: not an llm.c shard \(magic"):
        prepare_data(experiment([{"tokens": "ok.bin", "format": "llmc"}]), tmp_path, tmp_path / "cache", progress=False)
    size = len(json.loads(tokenizer_file.read_text())["model"]["vocab"])
    with pytest.raises(DataError, match=rf"tokenizer.json: {size} tokens, more than model.vocab {size - 1}"):
        prepare_data(experiment([{"tokens": "ok.bin"}], vocab=size - 1), tmp_path, tmp_path / "cache", progress=False)
    raw = json.loads(tokenizer_file.read_text())
    raw["added_tokens"] = []
    raw["model"]["vocab"].pop("<|endoftext|>")
    (tmp_path / "noeot.json").write_text(json.dumps(raw))
    with pytest.raises(DataError, match=r"noeot.json: has none of the end-of-text tokens <\|endoftext\|>, </s>, "):
        prepare_data(
            experiment([{"tokens": "ok.bin"}], tokenizer="noeot.json"), tmp_path, tmp_path / "cache", progress=False
        )
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "cache").iterdir())


def test_a_token_arm_needs_a_tokenizer_and_is_alone():
    with pytest.raises(Exception, match="reads token files: the experiment must name their tokenizer"):
        experiment([{"tokens": "a.bin"}], tokenizer=None)
    with pytest.raises(Exception, match="a tokens a.bin source must be its arm's only source"):
        experiment([{"tokens": "a.bin"}, {"file": "b.txt"}])
