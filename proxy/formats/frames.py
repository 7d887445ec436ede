"""Engine frames (stdin) and events (stdout): docs/FORMATS.md, "Engine frames".

Encoding is pure: bytes in, bytes out. The proxy, the tests and the benchmarks
all speak to the engine through these functions, so there is one definition
of the wire format on the Python side.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import bounded_json

FRAME_MAGIC = b"MGF1"
HEADER = struct.Struct("<4sHHQIIII")
assert HEADER.size == 32

TRAIN, EVAL, SAMPLE, CHECKPOINT, STOP = 1, 2, 3, 4, 5
SAMPLE_PARAMS = struct.Struct("<IIIf")  # n_prompts, max_new, top_k, temperature
SAMPLE_PROMPT = struct.Struct("<IIQ")  # n_tokens, count, seed (one per prompt)
SAMPLE_MAX_COMPLETIONS = 4096  # in one SAMPLE frame, all prompts together (the engine's limit)
MAX_FRAME_ROWS = 1 << 20  # rows in one TRAIN or EVAL frame (the engine's limit, train.h)


def _header(kind: int, frame_id: int, rows: int, row_len: int, payload_bytes: int) -> bytes:
    return HEADER.pack(FRAME_MAGIC, kind, 0, frame_id, rows, row_len, payload_bytes, 0)


def _token_frame(kind: int, frame_id: int, tokens: np.ndarray, groups: np.ndarray) -> bytes:
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    groups = np.ascontiguousarray(groups, dtype="<u2")
    if tokens.ndim != 2 or groups.shape != (tokens.shape[0],):
        raise ValueError(f"tokens must be [rows, T+1] and groups [rows]; got {tokens.shape} and {groups.shape}")
    rows, row_len = tokens.shape
    payload_bytes = tokens.nbytes + groups.nbytes
    return b"".join((_header(kind, frame_id, rows, row_len, payload_bytes), tokens.data, groups.data))


def train_frame(step: int, tokens: np.ndarray, groups: np.ndarray) -> bytes:
    """TRAIN: one optimizer update producing `step` (the engine's step + 1)."""
    return _token_frame(TRAIN, step, tokens, groups)


def eval_frame(request_id: int, tokens: np.ndarray, groups: np.ndarray) -> bytes:
    """EVAL: forward only; the `eval` event carries per-group mean losses."""
    return _token_frame(EVAL, request_id, tokens, groups)


@dataclass(frozen=True)
class SamplePrompt:
    """One prompt of a SAMPLE frame: `count` completions, drawn with `seed`."""

    tokens: list[int] | np.ndarray
    count: int = 1
    seed: int = 0


def sample_batch_frame(
    request_id: int, prompts: list[SamplePrompt], max_new: int, temperature: float = 1.0, top_k: int = 0
) -> bytes:
    """SAMPLE: every prompt's completions of `max_new` tokens in one frame (one batch in the engine).
    The `sample` event lists them prompt by prompt; each is deterministic per (seed, its index)."""
    tokens = [np.ascontiguousarray(p.tokens, dtype="<u2") for p in prompts]
    head = SAMPLE_PARAMS.pack(len(prompts), max_new, top_k, temperature)
    heads = b"".join(SAMPLE_PROMPT.pack(len(t), p.count, p.seed) for p, t in zip(prompts, tokens, strict=False))
    payload = b"".join((head, heads, *(t.tobytes() for t in tokens)))
    return _header(SAMPLE, request_id, 0, 0, len(payload)) + payload


def sample_frame(
    request_id: int,
    prompt: list[int] | np.ndarray,
    count: int,
    max_new: int,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
) -> bytes:
    """SAMPLE with one prompt: `count` completions of `max_new` tokens each; deterministic per seed."""
    return sample_batch_frame(request_id, [SamplePrompt(prompt, count, seed)], max_new, temperature, top_k)


def checkpoint_frame() -> bytes:
    return _header(CHECKPOINT, 0, 0, 0, 0)


def stop_frame() -> bytes:
    return _header(STOP, 0, 0, 0, 0)


@dataclass(frozen=True)
class Event:
    """One line the engine printed on stdout, parsed; `received` is when the proxy read it
    (time.monotonic()), which is when the engine finished that work, whatever the proxy was busy with."""

    kind: str
    fields: dict
    received: float | None = None

    # A field's value is whatever the engine's JSON line holds there: each reader converts it (float(), int()).
    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: object = None) -> Any:
        return self.fields.get(key, default)


def group_result(event: Event, group: int) -> tuple[float, float]:
    """(mean loss, tokens) of one group id in an `eval` event; the event's own loss (and 1) when the event
    does not name that group."""
    loss = float(dict(event.get("group_loss") or {}).get(str(group), event["loss"]))
    tokens = float(dict(event.get("group_tokens") or {}).get(str(group), 1) or 1)
    return loss, tokens


def parse_event(line: str | bytes, received: float | None = None) -> Event:
    """Parse one event line; raise ValueError on anything that is not an event object."""
    obj = bounded_json.loads(line)
    if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
        raise ValueError(f"not an engine event: {line!r:.200}")
    return Event(obj["event"], obj, received)
