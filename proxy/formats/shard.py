"""Token shards: docs/FORMATS.md, "Token shard". Header then uint16 tokens."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from ..atomic import atomic_writer

SHARD_MAGIC = b"MGPTTOKS"
SHARD_VERSION = 1
HEADER = struct.Struct("<8sIIQ8s")
assert HEADER.size == 32


class ShardError(ValueError):
    """A file that is not a valid token shard; the message says why."""


def write_shard(path: str | os.PathLike, tokens: np.ndarray, vocab: int) -> None:
    """Write a shard atomically and durably (temp file, fsync, rename, fsync dir)."""
    path = Path(path)
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    if tokens.size and int(tokens.max()) >= vocab:
        raise ShardError(f"{path}: token id {int(tokens.max())} >= vocab {vocab}")
    with atomic_writer(path) as f:
        f.write(HEADER.pack(SHARD_MAGIC, SHARD_VERSION, vocab, tokens.size, b"\0" * 8))
        f.write(tokens.data)


def read_shard(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """Memory-map a shard; return (tokens, vocab)."""
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
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER.size, shape=(n_tokens,)) if n_tokens else np.zeros(0, "<u2")
    return tokens, vocab
