"""Token files made elsewhere, read in place: nanoGPT's `.bin`, llm.c's shards, NumPy `.npy` (docs/FORMATS.md).

| format   | layout |
|----------|--------|
| `uint16` | nanoGPT's `train.bin` / `val.bin`: raw little-endian uint16 ids, nothing else (an even size) |
| `llmc`   | llm.c's shards: 256 int32 header (magic 20240520, version 1 = uint16 ids or 2 = uint32, count), the ids |
| `npy`    | a NumPy array file of uint16 or uint32 ids, one dimension, C order |

Without a declared format a file's first bytes tell: the llm.c magic, the
NumPy magic, else raw uint16. A file is memory-mapped, never read whole; its
header and size are checked here (a wrong magic or version, a truncated file,
a count that does not match), each with one line naming the file. The ids
are checked against the model's vocabulary by `first_out_of_range`, block
by block.

`TokenSegment` is how the batch sampler and the prepared-data cache name a
run of ids in any file, our own token shards (formats/shard.py) included.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from ..safe_fs import UnsafeFileError, open_regular

LLMC_MAGIC = 20240520
LLMC_HEADER_INTS = 256
LLMC_VERSIONS = {1: "<u2", 2: "<u4"}  # llm.c: 1 = GPT-2 ids (uint16), 2 = LLaMA 3 ids (uint32)
NPY_MAGIC = b"\x93NUMPY"
NPY_DTYPES = {np.dtype("<u2"): "<u2", np.dtype("<u4"): "<u4"}
SCAN_TOKENS = 1 << 24  # ids checked per block (32 or 64 MiB)


class TokenFileError(ValueError):
    """A token file that cannot be used; the message is one line naming it and why."""


@dataclass(frozen=True)
class TokenSegment:
    """Ids [start, stop) of the array of `dtype` that begins `offset` bytes into `path`."""

    path: str
    dtype: str  # "<u2" or "<u4"
    offset: int
    start: int
    stop: int

    @property
    def tokens(self) -> int:
        return self.stop - self.start

    def array(self) -> np.ndarray:
        """The ids, memory-mapped (read-only, never loaded whole)."""
        if self.stop <= self.start:
            return np.zeros(0, dtype=self.dtype)
        item = np.dtype(self.dtype).itemsize
        return np.memmap(
            self.path,
            dtype=self.dtype,
            mode="r",
            offset=self.offset + item * self.start,
            shape=(self.stop - self.start,),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> TokenSegment:
        seg = cls(
            path=str(obj["path"]),
            dtype=str(obj["dtype"]),
            offset=int(obj["offset"]),
            start=int(obj["start"]),
            stop=int(obj["stop"]),
        )
        if seg.dtype not in ("<u2", "<u4") or not 0 <= seg.start <= seg.stop or seg.offset < 0:
            raise ValueError(f"not a token segment: {obj}")
        return seg


@dataclass(frozen=True)
class TokenFile:
    path: str
    format: str  # "uint16", "llmc", "npy"
    dtype: str
    offset: int  # bytes before the first id
    count: int  # ids

    def segment(self, start: int = 0, stop: int | None = None) -> TokenSegment:
        return TokenSegment(self.path, self.dtype, self.offset, start, self.count if stop is None else stop)


def detect_format(head: bytes) -> str:
    """The format a file's first bytes say: llm.c's magic, NumPy's, else raw uint16."""
    if head.startswith(NPY_MAGIC):
        return "npy"
    if len(head) >= 4 and struct.unpack("<i", head[:4])[0] == LLMC_MAGIC:
        return "llmc"
    return "uint16"


def _llmc(path: str, f: BinaryIO, size: int) -> TokenFile:
    head = f.read(4 * LLMC_HEADER_INTS)
    magic = struct.unpack_from("<i", head)[0] if len(head) >= 4 else None
    if magic != LLMC_MAGIC:
        raise TokenFileError(f"{path}: not an llm.c shard (magic {magic}, expected {LLMC_MAGIC})")
    if len(head) < 4 * LLMC_HEADER_INTS:
        raise TokenFileError(
            f"{path}: truncated llm.c shard ({size} bytes, shorter than its {4 * LLMC_HEADER_INTS}-byte header)"
        )
    _magic, version, count = struct.unpack_from("<iii", head)
    if version not in LLMC_VERSIONS:
        raise TokenFileError(
            f"{path}: llm.c shard version {version} is not one this reads ({', '.join(map(str, LLMC_VERSIONS))})"
        )
    dtype = LLMC_VERSIONS[version]
    expected = 4 * LLMC_HEADER_INTS + np.dtype(dtype).itemsize * count
    if count < 0 or size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise TokenFileError(
            f"{path}: {what}: its header says {count} tokens ({expected} bytes), the file has {size} bytes"
        )
    return TokenFile(path, "llmc", dtype, 4 * LLMC_HEADER_INTS, count)


def _npy(path: str, f: BinaryIO, size: int) -> TokenFile:
    try:
        version = npy_format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(f)
        else:
            raise ValueError(f"version {version}")
    except (ValueError, OSError, SyntaxError) as exc:  # numpy's first line says it (the rest is advice on
        # loading untrusted files, e.g. a header over its 10,000-byte max_header_size)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise TokenFileError(f"{path}: not a NumPy array file ({first})") from None
    if dtype not in NPY_DTYPES:
        raise TokenFileError(f"{path}: NumPy array of {dtype}, not uint16 or uint32 token ids")
    if len(shape) != 1 and not (len(shape) == 2 and 1 in shape):
        raise TokenFileError(f"{path}: NumPy array of shape {shape}, not one row of token ids")
    count = int(np.prod(shape))
    offset = f.tell()
    expected = offset + dtype.itemsize * count
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise TokenFileError(
            f"{path}: {what}: its header says {count} tokens ({expected} bytes), the file has {size} bytes"
        )
    return TokenFile(path, "npy", NPY_DTYPES[dtype], offset, count)


def open_token_file(path: str | os.PathLike, fmt: str | None = None) -> TokenFile:
    """The header and size of a token file checked (`fmt`: declared, or None to tell from its first bytes);
    TokenFileError (one line) for anything that does not hold."""
    path = str(path)
    try:
        with open_regular(path, None) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            f.seek(0)
            fmt = fmt or detect_format(head)
            if fmt == "llmc":
                return _llmc(path, f, size)
            if fmt == "npy":
                if not head.startswith(NPY_MAGIC):
                    raise TokenFileError(f"{path}: not a NumPy array file (no \\x93NUMPY magic)")
                return _npy(path, f, size)
    except UnsafeFileError as exc:
        raise TokenFileError(str(exc)) from None
    except OSError as exc:
        raise TokenFileError(f"{path}: cannot read: {exc.strerror}") from None
    if fmt != "uint16":
        raise TokenFileError(f"{path}: unknown token format {fmt!r}")
    if size % 2:
        raise TokenFileError(f"{path}: truncated: {size} bytes is not a whole number of uint16 tokens")
    return TokenFile(path, "uint16", "<u2", 0, size // 2)


def first_out_of_range(
    segment: TokenSegment, vocab: int, progress: Callable[[int], object] | None = None
) -> tuple[int, int] | None:
    """(position, id) of the first id >= `vocab` in the segment, or None; reads SCAN_TOKENS ids at a time.
    `progress(n_bytes)` after each block."""
    ids = segment.array()
    item = np.dtype(segment.dtype).itemsize
    for start in range(0, ids.size, SCAN_TOKENS):
        block = np.asarray(ids[start : start + SCAN_TOKENS])
        if block.size and int(block.max()) >= vocab:
            at = int(np.flatnonzero(block >= vocab)[0])
            return segment.start + start + at, int(block[at])
        if progress is not None:
            progress(block.size * item)
    return None


def copy_ids(segments: list[TokenSegment], write: Callable[[np.ndarray], object], block: int = SCAN_TOKENS) -> int:
    """Every id of `segments`, in order, as uint16 arrays passed to `write` a block at a time; the count."""
    total = 0
    for seg in segments:
        ids = seg.array()
        for start in range(0, ids.size, block):
            write(np.asarray(ids[start : start + block]).astype("<u2", copy=False))
        total += ids.size
    return total


def shard_file_segment(path: str | os.PathLike, header_bytes: int, n_tokens: int) -> TokenSegment:
    """One of our own token shards (formats/shard.py) as a segment."""
    return TokenSegment(str(Path(path)), "<u2", header_bytes, 0, n_tokens)
