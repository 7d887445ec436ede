"""Checkpoint files: their names, reading and verifying them, and writing one (docs/FORMATS.md, "Checkpoint file").

The Python twin of the engine's loader: the proxy uses it to pick the newest
valid checkpoint after a crash, tests use it to read weights and moments,
the dashboard to list checkpoints. `encode_checkpoint` is the twin of the
engine's writer, byte for byte the same layout: the proxy writes one only to
make step 0 of a run from pretrained weights (`proxy run --init-from`).
Only numpy and zlib.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import EXIT_USAGE, ProxyError
from ..run_names import checkpoint_name
from ..safe_fs import UnsafeFileError, open_regular
from .engine_cli import MAX_STEP
from .lr_schedule import DEFAULT_DECAY_FRACTION, DEFAULT_SCHEDULE, SCHEDULES
from .parameters import ModelShape

TRAILER_MAGIC = b"MGPTTRLR"
END_MAGIC = b"MGPTEND1"
TRAILER_FIXED_BYTES = 128
FOOTER_BYTES = 24
MAX_META_BYTES = 8192  # the engine's metadata buffer (microgpt/checkpoint.h): no trailer holds more
NAME_PATTERN = re.compile(r"^step_(\d{6,})\.bin$")  # temp files (.step_NNNNNN.bin.tmp) never match

TRAILER_VERSION = 2  # written; version 1 (before schedules: zeros where 2 keeps the schedule) is read as cosine
_FIXED = struct.Struct("<8sII9i7fQQif24s")
assert _FIXED.size == TRAILER_FIXED_BYTES
_FOOTER = struct.Struct("<QII8s")
assert _FOOTER.size == FOOTER_BYTES


class CheckpointError(ProxyError, ValueError):
    """A file that is not a loadable checkpoint; the message says why. Given where a checkpoint is asked
    for (a command's --step or --checkpoint), bad input: exit 2."""

    code = EXIT_USAGE


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / checkpoint_name(step)


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step in a checkpoint's file name, or None if the name is not step_NNNNNN.bin of a step the engine
    can hold (at most MAX_STEP, as the engine's own listing): a `step_3000000000.bin` is no checkpoint."""
    match = NAME_PATTERN.match(Path(path).name)
    if not match or len(match.group(1)) > len(str(MAX_STEP)):
        return None
    step = int(match.group(1))
    return step if step <= MAX_STEP else None


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """step_*.bin files in a directory, newest step first (temp files never match)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in directory.iterdir()]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)[::-1]]


def body_bytes(n_params: int) -> int:
    """Bytes of the ANDREA regions: step, n_params, weights, adam_m, adam_v."""
    return 8 + 12 * n_params


def max_file_bytes(n_params: int) -> int:
    """The largest checkpoint of `n_params` parameters: the body and the largest trailer."""
    return body_bytes(n_params) + TRAILER_FIXED_BYTES + MAX_META_BYTES + FOOTER_BYTES


def _open(path: Path) -> BinaryIO:
    """A checkpoint opened by safe_fs's rules: a regular file, no symlink out of its directory."""
    try:
        return open_regular(path, None, within=path.parent)
    except UnsafeFileError as exc:
        raise CheckpointError(str(exc)) from None


def _read_file(path: Path) -> bytes:
    """A whole checkpoint file; one larger than any checkpoint of the n_params in its header is refused
    before it is read (a huge or endless file never fills memory)."""
    with _open(path) as f:
        head = f.read(8)
        size = os.fstat(f.fileno()).st_size
        if len(head) == 8:
            n = struct.unpack("<ii", head)[1]
            if n > 0 and size > max_file_bytes(n):
                raise CheckpointError(f"{path}: {size} bytes, more than a checkpoint of n_params {n} can have")
        return head + f.read(max(0, size - len(head)))


@dataclass(frozen=True)
class Trailer:
    shape: ModelShape
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
    lr_schedule: str = DEFAULT_SCHEDULE
    decay_fraction: float = DEFAULT_DECAY_FRACTION


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


def _decode_trailer(buf: bytes | memoryview, trailer_bytes: int, path: Path) -> Trailer:
    """The trailer whose fixed part starts `buf` (its metadata follows); CheckpointError if malformed."""
    fields = _FIXED.unpack_from(buf, 0)
    magic, version, meta_bytes = fields[0], fields[1], fields[2]
    if magic != TRAILER_MAGIC:
        raise CheckpointError(f"{path}: bad trailer magic")
    if version not in (1, TRAILER_VERSION):
        raise CheckpointError(f"{path}: unsupported trailer version {version}")
    if TRAILER_FIXED_BYTES + meta_bytes + FOOTER_BYTES != trailer_bytes:
        raise CheckpointError(f"{path}: trailer sizes disagree")
    ints, floats = fields[3:12], fields[12:19]
    seed, tokens_seen = fields[19], fields[20]
    code, decay_fraction = (fields[21], fields[22]) if version >= 2 else (0, DEFAULT_DECAY_FRACTION)
    if not 0 <= code < len(SCHEDULES):
        raise CheckpointError(f"{path}: unknown learning-rate schedule {code} in its trailer")
    meta = bytes(buf[TRAILER_FIXED_BYTES : TRAILER_FIXED_BYTES + meta_bytes]).decode("utf-8", errors="replace")
    batch, grad_accum, warmup, max_steps = ints[5:]
    lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip = floats
    return Trailer(
        ModelShape(*ints[:5]),
        batch=batch,
        grad_accum=grad_accum,
        warmup=warmup,
        max_steps=max_steps,
        lr=lr,
        min_lr=min_lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        seed=seed,
        tokens_seen=tokens_seen,
        meta=meta,
        lr_schedule=SCHEDULES[code],
        decay_fraction=decay_fraction,
    )


def _parse(raw: bytes, path: Path, verify_crc: bool) -> tuple[int, int, Trailer | None]:
    size = len(raw)
    if size < 8:
        raise CheckpointError(f"{path}: truncated ({size} bytes)")
    step, n = struct.unpack_from("<ii", raw, 0)
    if n <= 0 or step < 0:
        raise CheckpointError(f"{path}: not a microgpt checkpoint (step {step}, n_params {n})")
    body = body_bytes(n)
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
    trailer = _decode_trailer(memoryview(raw)[body:], trailer_bytes, path)
    if trailer.shape.n_params != n:
        raise CheckpointError(
            f"{path}: n_params {n} does not match the shape in its trailer ({trailer.shape.n_params})"
        )
    return step, n, trailer


def read_checkpoint(path: str | os.PathLike, verify_crc: bool = True) -> Checkpoint:
    """Read and verify a checkpoint; raise CheckpointError saying why it is rejected."""
    path = Path(path)
    try:
        raw = _read_file(path)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from None
    step, n, trailer = _parse(raw, path, verify_crc)
    floats = np.frombuffer(raw, dtype="<f4", count=3 * n, offset=8)
    warnings = [] if trailer else [f"{path}: no trailer: checksum and shape not verified"]
    return Checkpoint(
        path, step, n, floats[:n].copy(), floats[n : 2 * n].copy(), floats[2 * n :].copy(), trailer, warnings
    )


NON_FINITE_CHUNK = 1 << 22  # floats looked at at once: the check's memory stays small for any model


def count_non_finite(raw: bytes | memoryview, n_params: int) -> int:
    """How many of a checkpoint's weights and Adam moments (3 n_params floats after the 8-byte header) are
    an infinity or a NaN."""
    floats = np.frombuffer(raw, dtype="<f4", count=3 * n_params, offset=8)
    return sum(
        int(np.count_nonzero(~np.isfinite(floats[i : i + NON_FINITE_CHUNK])))
        for i in range(0, floats.size, NON_FINITE_CHUNK)
    )


def encode_checkpoint(step: int, weights: np.ndarray, m: np.ndarray, v: np.ndarray, trailer: Trailer) -> bytes:
    """A whole checkpoint file as the engine writes it: the ANDREA regions, the trailer (the metadata is
    `trailer.meta`, the JSON the engine writes: `{"engine": ..., "meta": ...}`), the CRC-32 and end magic."""
    n = weights.size
    if not (m.size == v.size == n == trailer.shape.n_params):
        raise ValueError(f"{n} weights, {m.size} and {v.size} moments for a model of {trailer.shape.n_params}")
    meta = trailer.meta.encode("utf-8")
    if len(meta) > MAX_META_BYTES:
        raise ValueError(f"checkpoint metadata of {len(meta)} bytes, more than {MAX_META_BYTES}")
    s, t = trailer.shape, trailer
    fixed = _FIXED.pack(
        TRAILER_MAGIC,
        TRAILER_VERSION,
        len(meta),
        s.vocab,
        s.ctx,
        s.dim,
        s.layers,
        s.heads,
        t.batch,
        t.grad_accum,
        t.warmup,
        t.max_steps,
        t.lr,
        t.min_lr,
        t.beta1,
        t.beta2,
        t.eps,
        t.weight_decay,
        t.grad_clip,
        t.seed,
        t.tokens_seen,
        SCHEDULES.index(t.lr_schedule),
        t.decay_fraction,
        b"\0" * 24,
    )
    body = b"".join(
        [
            struct.pack("<ii", step, n),
            np.ascontiguousarray(weights, "<f4").tobytes(),
            np.ascontiguousarray(m, "<f4").tobytes(),
            np.ascontiguousarray(v, "<f4").tobytes(),
            fixed,
            meta,
            struct.pack("<Q", TRAILER_FIXED_BYTES + len(meta) + FOOTER_BYTES),
        ]
    )
    return body + struct.pack("<II8s", zlib.crc32(body), 0, END_MAGIC)


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """None if the file is a valid checkpoint with a verified trailer and finite values, else the reason.
    A state with a non-finite weight or moment is a diverged run's (the engine refuses to write one and
    to load one): never a resume point."""
    path = Path(path)
    try:
        raw = _read_file(path)
        _step, n, trailer = _parse(raw, path, verify_crc=True)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror}"
    except CheckpointError as exc:
        return str(exc)
    if trailer is None:
        return f"{path}: bare ANDREA file without a checksum"
    bad = count_non_finite(raw, n)
    if bad:
        return f"{path}: {bad} of its {3 * n} weights and Adam moments are not finite (a diverged state)"
    return None


def misnamed(path: str | os.PathLike) -> str | None:
    """Why a step_NNNNNN.bin is not the checkpoint of step NNNNNN (its header holds another step: a file
    copied or renamed by hand), or None."""
    named, held = checkpoint_step(path), header_step(path)
    if named is not None and held is not None and named != held:
        return f"its header holds step {held}, its name step {named}"
    return None


def shaped_like_checkpoint(path: str | os.PathLike) -> bool:
    """Cheaply (16 bytes read, no checksum): a regular file whose size fits the n_params in its header
    and that is either a bare ANDREA body or ends in the end magic. A 0-byte file, a directory or a
    stray file under a checkpoint's name is not; status and retention ignore those."""
    path = Path(path)
    try:
        with _open(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                return False
            step, n = struct.unpack("<ii", head)
            if step < 0 or n <= 0 or not body_bytes(n) <= size <= max_file_bytes(n):
                return False
            if size == body_bytes(n):
                return True
            f.seek(size - len(END_MAGIC))
            return f.read(len(END_MAGIC)) == END_MAGIC
    except (OSError, CheckpointError):
        return False


def checkpoint_files(directory: str | os.PathLike) -> list[Path]:
    """list_checkpoints, without the files that are not even shaped like one (shaped_like_checkpoint)."""
    return [p for p in list_checkpoints(directory) if shaped_like_checkpoint(p)]


def header_step(path: str | os.PathLike) -> int | None:
    """The step in a checkpoint's first 4 bytes (best.bin has no step in its name)."""
    try:
        with _open(Path(path)) as f:
            head = f.read(4)
    except (OSError, CheckpointError):
        return None
    return struct.unpack("<i", head)[0] if len(head) == 4 else None


def read_trailer(path: str | os.PathLike) -> Trailer | None:
    """The trailer of a checkpoint already verified, reading only the file's tail; None without one."""
    path = Path(path)
    try:
        with _open(path) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(size - FOOTER_BYTES)
            trailer_bytes, _crc, _reserved, end = _FOOTER.unpack(f.read(FOOTER_BYTES))
            largest = TRAILER_FIXED_BYTES + MAX_META_BYTES + FOOTER_BYTES
            if end != END_MAGIC or not TRAILER_FIXED_BYTES + FOOTER_BYTES <= trailer_bytes <= min(size, largest):
                return None
            f.seek(size - trailer_bytes)
            return _decode_trailer(f.read(trailer_bytes - FOOTER_BYTES), trailer_bytes, path)
    except (OSError, struct.error, CheckpointError):
        return None
