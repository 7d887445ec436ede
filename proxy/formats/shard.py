"""Token shards: docs/FORMATS.md, "Token shard". Header then uint16 tokens."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..atomic import atomic_writer, storage_guard
from .token_files import TokenSegment

SHARD_MAGIC = b"MGPTTOKS"
SHARD_VERSION = 1
HEADER = struct.Struct("<8sIIQ8s")
assert HEADER.size == 32


class ShardError(ValueError):
    """A file that is not a valid token shard; the message says why."""


def _header(vocab: int, n_tokens: int) -> bytes:
    return HEADER.pack(SHARD_MAGIC, SHARD_VERSION, vocab, n_tokens, b"\0" * 8)


def write_shard(path: str | os.PathLike, tokens: np.ndarray, vocab: int) -> None:
    """Write a shard atomically and durably (temp file, fsync, rename, fsync dir)."""
    path = Path(path)
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    if tokens.size and int(tokens.max()) >= vocab:
        raise ShardError(f"{path}: token id {int(tokens.max())} >= vocab {vocab}")
    with atomic_writer(path) as f:
        f.write(_header(vocab, tokens.size))
        f.write(tokens.data)


class ShardWriter:
    """A shard written as its tokens come, for a file inside a temp directory renamed into place whole
    (data preparation): the header is written last, with the count; `take_tail(n)` moves the last n tokens
    out again (the validation split's top-up). Memory stays that of one append, whatever the shard's size."""

    def __init__(self, path: str | os.PathLike, vocab: int):
        self.path = Path(path)
        self.vocab = vocab
        self.count = 0
        with storage_guard(self.path):
            self.f: BinaryIO = open(self.path, "w+b")
            self.f.write(_header(vocab, 0))

    def append(self, tokens: np.ndarray) -> None:
        tokens = np.ascontiguousarray(tokens, dtype="<u2")
        if tokens.size and int(tokens.max()) >= self.vocab:
            raise ShardError(f"{self.path}: token id {int(tokens.max())} >= vocab {self.vocab}")
        with storage_guard(self.path):
            self.f.write(tokens.data)
        self.count += tokens.size

    def take_tail(self, n: int) -> np.ndarray:
        """Remove the last `n` tokens and return them."""
        n = min(n, self.count)
        self.f.flush()
        self.f.seek(HEADER.size + 2 * (self.count - n))
        tail = np.frombuffer(self.f.read(2 * n), dtype="<u2").copy()
        self.count -= n
        with storage_guard(self.path):
            self.f.seek(HEADER.size + 2 * self.count)
            self.f.truncate()
        return tail

    def finish(self) -> int:
        """Write the header with the count, fsync, close; the count."""
        with storage_guard(self.path):
            self.f.seek(0)
            self.f.write(_header(self.vocab, self.count))
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
        return self.count

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()


def read_shard(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """Memory-map a shard; return (tokens, vocab)."""
    segment, vocab = shard_segment(path)
    return segment.array(), vocab


def shard_segment(path: str | os.PathLike) -> tuple[TokenSegment, int]:
    """A shard's header and size checked; (its tokens as a segment, its vocab)."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER.size:
        raise ShardError(f"{path}: truncated token shard ({size} bytes)")
    with open(path, "rb") as f:
        magic, version, vocab, n_tokens, _ = HEADER.unpack(f.read(HEADER.size))
    if magic != SHARD_MAGIC:
        raise ShardError(f"{path}: not a token shard (bad magic)")
    if version != SHARD_VERSION:
        raise ShardError(f"{path}: unsupported shard version {version}")
    if size != HEADER.size + 2 * n_tokens:
        raise ShardError(f"{path}: size {size} does not match {n_tokens} tokens")
    return TokenSegment(str(path), "<u2", HEADER.size, 0, n_tokens), vocab
