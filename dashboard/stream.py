"""Server-sent events: push new log entries and changed sidecars to the page.

One stream carries every run the page shows (a browser allows few connections
per host). Each event with new entries has an `id` holding every run's
position, "generation.offset" per run, so a reconnecting EventSource sends it
back as Last-Event-ID and resumes exactly where it stopped. A client reads
from its own offset up to the committed offset (the end of the last complete
line the server has seen), so nothing is buffered per client and a torn line
is never sent. A client further behind than MAX_GAP bytes (or whose log was
replaced) gets a `reset` and refetches a downsampled view instead.
"""
from __future__ import annotations

import asyncio
import re
from typing import AsyncIterator, Awaitable, Callable

from . import payload
from .entries import eval_fields, step_fields
from .log_follower import parse_lines
from .run_index import SIDECAR_KINDS, RunIndex

MAX_GAP = 2 << 20  # bytes of log one push may carry
PING_S = 15.0
_POS = re.compile(r"^(\d{1,12})\.(\d{1,15})$")


class Hub:
    """Wakes every stream when any run changed (set from the watcher thread)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        assert self._event is not None
        return self._event

    def _notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    def notify_threadsafe(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._notify)
            except RuntimeError:  # loop closing
                pass


def parse_positions(text: str | None, n: int) -> list[tuple[int, int] | None]:
    """"g.o,g.o" -> [(g, o), ...] (None where missing or malformed)."""
    out: list[tuple[int, int] | None] = [None] * n
    if not text:
        return out
    for j, part in enumerate(text.split(",")[:n]):
        m = _POS.match(part.strip())
        if m:
            out[j] = (int(m.group(1)), int(m.group(2)))
    return out


def encode_positions(pos: list[tuple[int, int]]) -> str:
    return ",".join(f"{g}.{o}" for g, o in pos)


def sse(event: str, data: dict, id: str | None = None) -> bytes:
    head = f"event: {event}\n" + (f"id: {id}\n" if id is not None else "")
    return head.encode() + b"data: " + payload.dumps(data) + b"\n\n"


def _entries(run: RunIndex, data: bytes, base: int, prev, window: payload.WallWindow | None):
    """The step and eval entries of `data` as payloads; (steps, evals, bytes used, prev, window)."""
    lines, used = parse_lines(data, base)
    steps, evals = [], []
    for _s, _e, obj in lines:
        f = step_fields(obj)
        if f is not None:
            steps.append(f)
            continue
        e = eval_fields(obj)
        if e is not None:
            evals.append(e)
    if window is None and steps:  # a new stream (or one reset): the history before its first step
        window = run.wall_window(steps[0].step)
    steps_payload, prev = payload.rows_payload(steps, prev, window)
    return steps_payload, payload.evals_payload(evals), used, prev, window


async def event_stream(runs: list[RunIndex], start: list[tuple[int, int] | None], hub: Hub,
                       is_disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[bytes]:
    pos: list[tuple[int, int]] = []
    for run, p in zip(runs, start):
        pos.append(p if p is not None else run.position())
    seen = [{k: -1 for k in SIDECAR_KINDS} for _ in runs]
    prev: list = [None] * len(runs)
    windows: list = [None] * len(runs)  # payload.WallWindow per run, for the wall-clock rate
    yield b"retry: 1000\n\n"
    yield sse("hello", {"runs": [r.index for r in runs], "positions": encode_positions(pos)},
              id=encode_positions(pos))
    while True:
        wake = hub.current()
        sent = False
        for j, run in enumerate(runs):
            gen, committed = run.position()
            g, off = pos[j]
            if g != gen or off > committed or committed - off > MAX_GAP:
                reason = "behind" if g == gen and off <= committed else "replaced"
                pos[j] = (gen, committed)
                prev[j] = windows[j] = None
                yield sse("reset", {"run": run.index, "generation": gen, "offset": committed, "reason": reason},
                          id=encode_positions(pos))
                sent = True
            elif off < committed:
                data = await asyncio.to_thread(run.read_log, off, committed)
                steps, evals, used, prev[j], windows[j] = await asyncio.to_thread(_entries, run, data, off, prev[j],
                                                                                  windows[j])
                if used == 0:  # the file changed under us; the watcher will notice and reset
                    pos[j] = (gen, committed)
                    continue
                pos[j] = (gen, off + used)
                yield sse("entries", {"run": run.index, "generation": gen, "offset": off + used,
                                      "steps": steps, "evals": evals}, id=encode_positions(pos))
                sent = True
            for kind in SIDECAR_KINDS:
                value, version = run.sidecar(kind)
                if version != seen[j][kind]:
                    seen[j][kind] = version
                    yield sse("sidecar", {"run": run.index, "kind": kind, "value": value})
                    sent = True
        if sent:
            continue
        try:
            await asyncio.wait_for(wake.wait(), timeout=PING_S)
        except asyncio.TimeoutError:
            if await is_disconnected():
                return
            yield b": ping\n\n"
