"""Run the dashboard: `proxy dashboard [--run-dir DIR ...] [--host 127.0.0.1] [--port 8000]`.

`main(argv)` is what `proxy dashboard` (and `python -m dashboard`) calls;
`serve()` runs uvicorn on a socket this module binds itself, so the URL it
prints is the one that works (`--port 0` picks a free port) and a port in use
is one clear line, not a traceback. `spawn()` starts the dashboard as a
child process and waits until it listens (the tests' way in); `proxy run`
starts its own child without waiting (proxy/commands/run.py, `start_dashboard`).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from proxy.dashboard_address import exposure_warning, is_loopback
from proxy.rundir.layout import RUNS_ROOT, RunDirError, most_recent_run

from .runs import RUN_MARKERS, expand

# Bounds on what clients may hold (docs/DASHBOARD.md, "Safety"); the event streams' own are in stream.py.
MAX_CONNECTIONS = 128  # open connections (uvicorn's limit_concurrency): a request beyond is answered 503
UNACKED_TIMEOUT_S = 30  # TCP_USER_TIMEOUT: a connection whose data stays unread (a zero window) this long is
#                         closed by the kernel, whatever the app is doing with it
SEND_BUFFER = 256 << 10  # SO_SNDBUF of every connection: what the kernel holds for a client that stopped
#                          reading (autotuned, it grows to 4 MiB; a page needs far less)


class DashboardError(Exception):
    """A problem the user can fix; the message is one line."""


def url_for(host: str, port: int) -> str:
    shown = host
    if host in ("0.0.0.0", "::", ""):
        shown = "127.0.0.1"
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise DashboardError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)  # inherited by every accepted connection
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # the same (Linux)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKED_TIMEOUT_S * 1000)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def resolve_run_dirs(given: list[str] | None) -> list[Path]:
    if not given:
        try:
            return [most_recent_run(RUNS_ROOT, RUN_MARKERS).resolve()]
        except RunDirError as exc:
            raise DashboardError(str(exc)) from None
    for d in given:
        if not Path(d).is_dir():
            raise DashboardError(f"run directory not found: {d}")
    dirs = expand([Path(d) for d in given])
    if not dirs:
        raise DashboardError("no run directories to show")
    return dirs


def limit_malloc_arenas(n: int = 2) -> bool:
    """Cap glibc's malloc arenas (M_ARENA_MAX) before any thread starts.

    Each thread that parses log chunks (the watcher, request threads) would
    otherwise get an arena of its own, and their fragments add up: the
    benchmark's RSS growth over 200,000 appended steps halves with this cap
    (docs/PERFORMANCE.md). No effect (False) off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        ok = bool(libc.mallopt(-8, n))  # M_ARENA_MAX
        # a fixed M_MMAP_THRESHOLD: big read buffers are always mmapped and given back,
        # instead of glibc raising the threshold and leaving them to fragment the heap
        return bool(libc.mallopt(-3, 256 << 10)) and ok
    except (OSError, AttributeError):
        return False


def serve(
    run_dirs: list[Path],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    poll_s: float = 1.0,
    announce: Callable[[str], object] | None = None,
    log_level: str = "warning",
) -> None:
    """Serve the dashboard over `run_dirs` until interrupted. Prints the URL first."""
    import uvicorn

    limit_malloc_arenas()

    from .app import LOOPBACK_HOSTS, create_app
    from .stream import ExposeAbort

    sock = bind(host, port)
    actual_port = sock.getsockname()[1]
    allowed = set(LOOPBACK_HOSTS) if is_loopback(host) else None
    app = create_app(run_dirs, allowed_hosts=allowed, poll_s=poll_s)
    config = uvicorn.Config(
        ExposeAbort(app),
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
        ws="none",
        limit_concurrency=MAX_CONNECTIONS,
    )
    server = uvicorn.Server(config)
    line = f"dashboard: {url_for(host, actual_port)}"
    (announce or (lambda s: print(s, flush=True)))(line)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="proxy dashboard", description="Serve the live dashboard (read-only) over run directories."
    )
    p.add_argument(
        "--run-dir",
        action="append",
        metavar="DIR",
        help="a run directory, or a directory of runs; repeat to overlay runs "
        "(default: the most recently active run under runs/)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if not 0 <= args.port <= 65535:
        print(f"dashboard: bad --port {args.port}", file=sys.stderr)
        return 2
    try:
        dirs = resolve_run_dirs(args.run_dir)
        warning = exposure_warning(args.host)
        if warning:
            print(f"dashboard: warning: {warning}", file=sys.stderr)
        serve(dirs, host=args.host, port=args.port, poll_s=max(0.1, args.poll))
    except DashboardError as exc:
        print(f"dashboard: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def spawn(
    run_dirs: list[Path],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_path: Path | None = None,
    timeout: float = 20.0,
) -> tuple[subprocess.Popen, str]:
    """Start `python -m dashboard` as a child process; (process, URL) once it listens.

    Its output goes to `log_path` (or is discarded). Raises DashboardError with
    the child's last words if it exits or stays silent for `timeout` seconds.
    """
    cmd = [sys.executable, "-m", "dashboard", "--host", host, "--port", str(port)]
    for d in run_dirs:
        cmd += ["--run-dir", str(d)]
    out: BinaryIO | int = open(log_path, "ab") if log_path else subprocess.DEVNULL
    # the child imports this very package, wherever the parent found it
    pkg_parent = str(Path(__file__).resolve().parents[1])
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p),
    )
    # the URL line comes through a pipe; everything after it goes to the log
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=out, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    line = b""
    try:
        import selectors

        if proc.stdout is None:  # stdout=PIPE: never
            raise DashboardError("dashboard did not start (no pipe from it)")
        fd = proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                b = os.read(fd, 4096)  # what the pipe holds now (a buffered read could keep some from select)
                if not b:
                    break
                line += b
        sel.close()
    finally:
        if not isinstance(out, int):
            out.close()
    text = line.decode(errors="replace").strip()
    if not text.startswith("dashboard: http"):
        if proc.poll() is None:
            proc.terminate()
        raise DashboardError(f"dashboard did not start ({text or 'no output'}); see {log_path or 'its stderr'}")
    return proc, text.split(" ", 1)[1]
