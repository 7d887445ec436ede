"""Reading and verifying engine checkpoints (docs/FORMATS.md, "Checkpoint file").

The Python twin of the engine's loader: the proxy uses it to pick the newest
valid checkpoint after a crash, tests use it to read weights and moments.
Only numpy and zlib; never writes.
"""
from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TRAILER_MAGIC = b"MGPTTRLR"
END_MAGIC = b"MGPTEND1"
TRAILER_FIXED_BYTES = 128
FOOTER_BYTES = 24
CHECKPOINT_NAME = re.compile(r"^step_(\d{6,})\.bin$")

_FIXED = struct.Struct("<8sII9i7fQQ32s")
assert _FIXED.size == TRAILER_FIXED_BYTES
_FOOTER = struct.Struct("<QII8s")
assert _FOOTER.size == FOOTER_BYTES


class CheckpointError(ValueError):
    """A file that is not a loadable checkpoint; the message says why."""


@dataclass(frozen=True)
class Trailer:
    vocab: int
    ctx: int
    dim: int
    layers: int
    heads: int
    batch: int
    grad_accum: int
    warmup: int
    max_steps: int
    lr: float
    min_lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip: float
    seed: int
    tokens_seen: int
    meta: str


@dataclass
class Checkpoint:
    path: Path
    step: int
    n_params: int
    weights: np.ndarray
    m: np.ndarray
    v: np.ndarray
    trailer: Trailer | None  # None for a bare ANDREA file
    warnings: list[str] = field(default_factory=list)


def n_params_for(vocab: int, ctx: int, dim: int, layers: int) -> int:
    """Parameter count of the model in DESIGN.md."""
    return vocab * dim + ctx * dim + layers * (12 * dim * dim + 13 * dim) + 2 * dim


def _parse(raw: bytes, path: Path, verify_crc: bool) -> tuple[int, int, Trailer | None]:
    size = len(raw)
    if size < 8:
        raise CheckpointError(f"{path}: truncated ({size} bytes)")
    step, n = struct.unpack_from("<ii", raw, 0)
    if n <= 0 or step < 0:
        raise CheckpointError(f"{path}: not a microgpt checkpoint (step {step}, n_params {n})")
    body = 8 + 12 * n
    if size == body:
        return step, n, None
    if size < body + TRAILER_FIXED_BYTES + FOOTER_BYTES:
        if size < body:
            raise CheckpointError(f"{path}: truncated ({size} bytes, {body} needed for n_params {n})")
        raise CheckpointError(f"{path}: trailer truncated or missing")
    trailer_bytes, crc, _reserved, end = _FOOTER.unpack_from(raw, size - FOOTER_BYTES)
    if end != END_MAGIC:
        raise CheckpointError(f"{path}: no end magic (truncated or not a microgpt checkpoint)")
    if body + trailer_bytes != size:
        raise CheckpointError(f"{path}: size {size} does not match n_params {n} and trailer of {trailer_bytes} bytes")
    if verify_crc and zlib.crc32(memoryview(raw)[: size - 16]) != crc:
        raise CheckpointError(f"{path}: checksum mismatch")
    fields = _FIXED.unpack_from(raw, body)
    magic, version, meta_bytes = fields[0], fields[1], fields[2]
    if magic != TRAILER_MAGIC:
        raise CheckpointError(f"{path}: bad trailer magic")
    if version != 1:
        raise CheckpointError(f"{path}: unsupported trailer version {version}")
    if TRAILER_FIXED_BYTES + meta_bytes + FOOTER_BYTES != trailer_bytes:
        raise CheckpointError(f"{path}: trailer sizes disagree")
    ints, floats = fields[3:12], fields[12:19]
    seed, tokens_seen = fields[19], fields[20]
    meta_start = body + TRAILER_FIXED_BYTES
    meta = raw[meta_start : meta_start + meta_bytes].decode("utf-8", errors="replace")
    trailer = Trailer(*ints, *floats, seed, tokens_seen, meta)
    expect = n_params_for(trailer.vocab, trailer.ctx, trailer.dim, trailer.layers)
    if expect != n:
        raise CheckpointError(f"{path}: n_params {n} does not match the shape in its trailer ({expect})")
    return step, n, trailer


def read_checkpoint(path: str | os.PathLike, verify_crc: bool = True) -> Checkpoint:
    """Read and verify a checkpoint; raise CheckpointError saying why it is rejected."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from None
    step, n, trailer = _parse(raw, path, verify_crc)
    floats = np.frombuffer(raw, dtype="<f4", count=3 * n, offset=8)
    warnings = [] if trailer else [f"{path}: no trailer: checksum and shape not verified"]
    return Checkpoint(path, step, n, floats[:n].copy(), floats[n : 2 * n].copy(), floats[2 * n :].copy(), trailer, warnings)


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """None if the file is a valid checkpoint with a verified trailer, else the reason."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        _step, _n, trailer = _parse(raw, path, verify_crc=True)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror}"
    except CheckpointError as exc:
        return str(exc)
    if trailer is None:
        return f"{path}: bare ANDREA file without a checksum"
    return None


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step in a checkpoint's file name, or None if the name is not step_NNNNNN.bin."""
    match = CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """step_*.bin files in a directory, newest step first (temp files never match)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in directory.iterdir()]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)[::-1]]


def newest_valid_checkpoint(directory: str | os.PathLike) -> tuple[Path | None, list[str]]:
    """The newest verified checkpoint and the reasons older-than-newest files were skipped."""
    rejected = []
    for path in list_checkpoints(directory):
        reason = verify_checkpoint(path)
        if reason is None:
            return path, rejected
        rejected.append(reason)
    return None, rejected
