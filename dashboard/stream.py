"""Server-sent events: push new log entries and changed sidecars to the page.

One stream carries every run the page shows (a browser allows few connections
per host). Each event with new entries has an `id` holding every run's
position, "generation.offset" per run, so a reconnecting EventSource sends it
back as Last-Event-ID and resumes exactly where it stopped. A client reads
from its own offset up to the committed offset (the end of the last complete
line the server has seen), so nothing is buffered per client and a torn line
is never sent. A client further behind than MAX_GAP bytes (or whose log was
replaced) gets a `reset` and refetches a downsampled view instead.

Streams are bounded (docs/DASHBOARD.md, "Safety"): at most MAX_STREAMS at
once (the app answers 503 beyond), each written to in pieces of at most
WRITE_PIECE bytes, and a client that takes no piece within WRITE_TIMEOUT_S
(one that never reads) is dropped and its connection aborted, so its buffers
are freed at once. A sidecar event is encoded once per version and shared by
every stream, so a client costs a piece of buffer, not a copy of
`.samples.json`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from fastapi.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.formats.loss_log import eval_fields, step_fields

from . import payload
from .log_follower import parse_lines
from .run_index import SIDECAR_KINDS, RunIndex

MAX_GAP = 2 << 20  # bytes of log one push may carry
PING_S = 15.0
MAX_STREAMS = 32  # event streams at once; one more is answered 503 (a page holds one)
WRITE_TIMEOUT_S = 10.0  # a stream's client must take each piece within this, or it is dropped
WRITE_PIECE = 64 << 10  # bytes handed to the server at a time: what a client that stopped reading costs
TRANSPORT_ABORT = "microgpt.abort"  # scope key: aborts the connection (set by ExposeAbort from the server)
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
    """ "g.o,g.o" -> [(g, o), ...] (None where missing or malformed)."""
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


_SIDECAR_EVENTS: dict[tuple[int, str], tuple[int, bytes]] = {}  # (id of the run, kind) -> (version, event)


def sidecar_event(run: RunIndex, kind: str, value: object, version: int) -> bytes:
    """The `sidecar` event of one version of a run's sidecar, encoded once and shared by every stream."""
    key = (id(run), kind)
    cached = _SIDECAR_EVENTS.get(key)
    if cached is None or cached[0] != version:
        cached = _SIDECAR_EVENTS[key] = (version, sse("sidecar", {"run": run.index, "kind": kind, "value": value}))
    return cached[1]


class StreamSlots:
    """At most `limit` event streams at once (one event loop: no lock needed)."""

    def __init__(self, limit: int = MAX_STREAMS):
        self.limit = limit
        self.active = 0
        self.dropped = 0  # streams ended because their client did not read

    def take(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def give_back(self) -> None:
        self.active -= 1


class ExposeAbort:
    """The outermost ASGI layer (server.serve): puts the server connection's abort into the scope, so that
    an event stream drops a client that stopped reading at once, with what the server holds for it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        transport = getattr(getattr(send, "__self__", None), "transport", None)  # uvicorn's connection
        if scope["type"] == "http" and transport is not None and hasattr(transport, "abort"):
            scope[TRANSPORT_ABORT] = transport.abort
        await self.app(scope, receive, send)


class SlowClient(Exception):
    """A stream's client did not take a piece within its write timeout."""


class EventStreamResponse(StreamingResponse):
    """The event stream's response: it holds a slot of `slots` (taken by the caller) until it ends, hands
    the server at most WRITE_PIECE bytes at a time, and drops a client that takes none within
    `write_timeout`: the connection is aborted (through the server's transport, which the dashboard's
    middleware put in the scope), so nothing the client left unread stays in memory."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        slots: StreamSlots,
        write_timeout: float = WRITE_TIMEOUT_S,
        *,
        media_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.slots = slots
        self.write_timeout = write_timeout

    async def _send_bounded(self, send: Send, message: Message) -> None:
        body = message.get("body") if message.get("type") == "http.response.body" else None
        if not body or len(body) <= WRITE_PIECE:
            await self._send_timed(send, message)
            return
        view, more = memoryview(body), message.get("more_body", False)
        for i in range(0, len(body), WRITE_PIECE):  # one piece copied at a time
            await self._send_timed(
                send,
                dict(message, body=bytes(view[i : i + WRITE_PIECE]), more_body=more or i + WRITE_PIECE < len(body)),
            )

    async def _send_timed(self, send: Send, message: Message) -> None:
        try:
            await asyncio.wait_for(send(message), self.write_timeout)
        except asyncio.TimeoutError:
            raise SlowClient() from None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, lambda message: self._send_bounded(send, message))
        except SlowClient:
            self.slots.dropped += 1
            abort = scope.get(TRANSPORT_ABORT)
            if abort is not None:
                abort()
                await asyncio.sleep(0)  # let the server see the connection lost before the app returns
        finally:
            self.slots.give_back()


def _entries(
    run: RunIndex, data: bytes, base: int, prev: tuple[int, float, float] | None, window: payload.WallWindow | None
) -> tuple[dict, dict, int, tuple[int, float, float] | None, payload.WallWindow | None]:
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


async def event_stream(
    runs: list[RunIndex], start: list[tuple[int, int] | None], hub: Hub, is_disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[bytes]:
    pos: list[tuple[int, int]] = []
    for run, p in zip(runs, start, strict=False):
        pos.append(p if p is not None else run.position())
    seen = [{k: -1 for k in SIDECAR_KINDS} for _ in runs]
    prev: list = [None] * len(runs)
    windows: list = [None] * len(runs)  # payload.WallWindow per run, for the wall-clock rate
    yield b"retry: 1000\n\n"
    yield sse("hello", {"runs": [r.index for r in runs], "positions": encode_positions(pos)}, id=encode_positions(pos))
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
                yield sse(
                    "reset",
                    {"run": run.index, "generation": gen, "offset": committed, "reason": reason},
                    id=encode_positions(pos),
                )
                sent = True
            elif off < committed:
                data = await asyncio.to_thread(run.read_log, off, committed)
                steps, evals, used, prev[j], windows[j] = await asyncio.to_thread(
                    _entries, run, data, off, prev[j], windows[j]
                )
                if used == 0:  # the file changed under us; the watcher will notice and reset
                    pos[j] = (gen, committed)
                    continue
                pos[j] = (gen, off + used)
                yield sse(
                    "entries",
                    {"run": run.index, "generation": gen, "offset": off + used, "steps": steps, "evals": evals},
                    id=encode_positions(pos),
                )
                sent = True
            for kind in SIDECAR_KINDS:
                value, version = run.sidecar(kind)
                if version != seen[j][kind]:
                    seen[j][kind] = version
                    yield sidecar_event(run, kind, value, version)
                    sent = True
        if sent:
            continue
        try:
            await asyncio.wait_for(wake.wait(), timeout=PING_S)
        except asyncio.TimeoutError:
            if await is_disconnected():
                return
            yield b": ping\n\n"
