"""The FastAPI app: a static page and small read-only JSON endpoints over the runs.

Every route is GET. Runs are named by index or name (dashboard.runs), never
by path; the static files are an allowlist loaded into memory at start; no
request parameter reaches the file system. docs/DASHBOARD.md lists the
endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import payload
from .columns import columns_payload
from .run_index import RunIndex
from .runs import Registry
from .stream import EventStreamResponse, Hub, StreamSlots, event_stream, parse_positions
from .system import SystemSampler, mfu_info
from .watch import Watcher

STATIC_DIR = Path(__file__).with_name("static")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
RUN_KEY = r"^[A-Za-z0-9._-]{1,100}$"

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        b"object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'",
    ),
]


class CheckpointInfo(BaseModel):
    name: str
    step: int | None
    bytes: int
    mtime: float


class RunInfo(BaseModel):
    index: int
    name: str
    experiment: str | None
    max_steps: int | None
    generation: int
    offset: int
    size: int
    indexed: bool
    index_seconds: float | None
    steps: int
    first_step: int | None
    last_step: int | None
    t0: float | None
    evals: int
    arms: list[str]
    memory_bytes: int


class Guard:
    """ASGI middleware: only GET/HEAD, Host header check (DNS rebinding), security headers."""

    def __init__(self, app: ASGIApp, allowed_hosts: set[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] not in ("GET", "HEAD"):
            return await _plain(send, 405, b"read-only: only GET is served\n")
        if self.allowed_hosts is not None:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if hostname.lower() not in self.allowed_hosts:
                return await _plain(send, 403, b"forbidden host\n")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        return await self.app(scope, receive, send_with_headers)


async def _plain(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
            + SECURITY_HEADERS,
        }
    )
    await send({"type": "http.response.body", "body": body})


def _load_static() -> dict[str, tuple[bytes, str]]:
    """Every file under static/, by its relative posix path, read once."""
    files = {}
    for p in sorted(STATIC_DIR.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(STATIC_DIR).as_posix()
            media = mimetypes.guess_type(p.name)[0] or "application/octet-stream"
            if media.startswith("text/") or media in ("application/javascript", "text/javascript"):
                media += "; charset=utf-8"
            files[rel] = (p.read_bytes(), media)
    return files


def _json(obj: object, status: int = 200) -> Response:
    return Response(
        payload.dumps(obj), status_code=status, media_type="application/json", headers={"cache-control": "no-store"}
    )


def create_app(run_dirs: list[Path], *, allowed_hosts: set[str] | None = None, poll_s: float = 1.0) -> FastAPI:
    """The dashboard app over `run_dirs` (each a run directory).

    allowed_hosts: Host header names accepted (None: any). The server passes
    the loopback names when it binds a loopback address.
    """
    registry = Registry([Path(d) for d in run_dirs])
    hub = Hub()
    slots = StreamSlots()
    watcher = Watcher(registry.runs, lambda idx, kinds: hub.notify_threadsafe(), poll_s=poll_s)
    static = _load_static()
    sampler = SystemSampler()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        hub.attach(asyncio.get_running_loop())
        watcher.start()
        sampler.start()
        try:
            yield
        finally:
            sampler.stop()
            watcher.stop()

    app = FastAPI(title="microgpt dashboard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.registry = registry
    app.state.watcher = watcher
    app.state.streams = slots

    def get_run(key: str) -> RunIndex:
        run = registry.lookup(key)
        if run is None:
            raise HTTPException(404, "no such run")
        return run

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        body, media = static["index.html"]
        return Response(body, media_type=media, headers={"cache-control": "no-cache"})

    @app.get("/static/{path:path}", include_in_schema=False)
    def static_file(path: str) -> Response:
        hit = static.get(path)
        if hit is None:
            raise HTTPException(404, "not found")
        return Response(hit[0], media_type=hit[1], headers={"cache-control": "no-cache"})

    @app.get("/healthz")
    def healthz() -> dict:
        return {
            "ok": True,
            "runs": len(registry.runs),
            "time": time.time(),
            "streams": slots.active,
            "streams_dropped": slots.dropped,
        }

    @app.get("/api/columns")
    def columns() -> list[dict[str, object]]:
        """The per-step value columns the series carry, and how the page charts them (dashboard/columns.py)."""
        return columns_payload()

    @app.get("/api/system")
    def system(since: float | None = Query(None, ge=0, le=1e11)) -> Response:
        """This machine's CPU, memory and GPU samples newer than `since` (dashboard/system.py)."""
        return _json(sampler.payload(since))

    @app.get("/api/runs", response_model=list[RunInfo])
    def list_runs() -> list[dict]:
        return [r.info() for r in registry.runs]

    @app.get("/api/runs/{run}", response_model=RunInfo)
    def run_info(run: str = PathParam(pattern=RUN_KEY)) -> dict:
        return get_run(run).info()

    @app.get("/api/runs/{run}/series")
    def series(
        run: str = PathParam(pattern=RUN_KEY),
        first: int | None = Query(None, alias="from", ge=0, le=1 << 53),
        last: int | None = Query(None, alias="to", ge=0, le=1 << 53),
        width: int = Query(1000, ge=16, le=4000),
    ) -> Response:
        """Training steps [from, to] in at most `width` min/max buckets (full resolution when they fit)."""
        return _json(get_run(run).series(first, last, width))

    @app.get("/api/runs/{run}/evals")
    def evals(run: str = PathParam(pattern=RUN_KEY)) -> Response:
        return _json(get_run(run).evals_payload())

    def sidecar(run: str, kind: str) -> dict[str, object]:
        value, version = get_run(run).sidecar(kind)
        return {"run": get_run(run).index, "version": version, "value": value, "time": time.time()}

    @app.get("/api/runs/{run}/state")
    def state(run: str = PathParam(pattern=RUN_KEY)) -> Response:
        """The run's .state.json (null until it exists)."""
        return _json(sidecar(run, "state"))

    @app.get("/api/runs/{run}/phases")
    def phases(run: str = PathParam(pattern=RUN_KEY)) -> Response:
        return _json(sidecar(run, "phases"))

    @app.get("/api/runs/{run}/samples")
    def samples(run: str = PathParam(pattern=RUN_KEY), limit: int = Query(20, ge=1, le=20)) -> Response:
        out = sidecar(run, "samples")
        if isinstance(out["value"], list):
            out["value"] = out["value"][-limit:]
        return _json(out)

    @app.get("/api/runs/{run}/experiment")
    def experiment(run: str = PathParam(pattern=RUN_KEY)) -> Response:
        return _json(sidecar(run, "experiment"))

    @app.get("/api/runs/{run}/overrides")
    def overrides(run: str = PathParam(pattern=RUN_KEY)) -> Response:
        """The `--set` overrides of the run's last launch (null when it had none or the record is not one)."""
        return _json(sidecar(run, "overrides"))

    @app.get("/api/runs/{run}/mfu")
    def mfu(run: str = PathParam(pattern=RUN_KEY)) -> Response:
        """What the page needs for the run's MFU, or why it has none (dashboard/system.py, mfu_info)."""
        r = get_run(run)
        return _json(mfu_info(r.sidecar("state")[0], r.sidecar("experiment")[0]))

    @app.get("/api/runs/{run}/checkpoints", response_model=list[CheckpointInfo])
    def checkpoints(run: str = PathParam(pattern=RUN_KEY)) -> list[dict]:
        value, _ = get_run(run).sidecar("checkpoints")
        return value or []

    @app.get("/api/stream")
    async def stream(
        request: Request,
        runs: str = Query("0", pattern=r"^[A-Za-z0-9._,-]{1,2000}$"),
        at: str | None = Query(None, pattern=r"^[0-9.,]{0,4000}$"),
        last_event_id: str | None = Header(None, max_length=4000),
    ) -> Response:
        """Server-sent events for the runs listed (indices or names, comma separated); 503 when
        stream.MAX_STREAMS are open already."""
        keys = [k for k in runs.split(",") if k][:64]
        chosen = [get_run(k) for k in keys]
        start = parse_positions(last_event_id or at, len(chosen))
        if not slots.take():
            return Response(
                b"too many event streams; retry later\n",
                status_code=503,
                media_type="text/plain",
                headers={"retry-after": "5", "cache-control": "no-store", "connection": "close"},
            )
        gen = event_stream(chosen, start, hub, request.is_disconnected)
        return EventStreamResponse(
            gen, slots, media_type="text/event-stream", headers={"cache-control": "no-store", "x-accel-buffering": "no"}
        )

    app.add_middleware(Guard, allowed_hosts=allowed_hosts)
    return app
