"""The dashboard flooded: a thousand event-stream clients that send their request and never read.

Against a real uvicorn server (`python -m dashboard`) over a synthetic run directory with a large
`.samples.json` (every stream's first push carries it) that keeps growing as a training run's does: at
most MAX_STREAMS streams are served and the rest answered 503; `/healthz` keeps answering within a
second or two; a client that does not read is dropped within its write timeout (the app's, once the
server holds a piece for it; the kernel's TCP_USER_TIMEOUT while the data sits in socket buffers), its
connection closed; a reading client gets its stream afterwards;
the server's memory stays bounded during the flood and comes back near its baseline once the clients
are gone. (The adversarial test saw /healthz time out for ~20 s and RSS go from 71 MB to 1.08 GB.)
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import psutil

from dashboard.server import UNACKED_TIMEOUT_S
from dashboard.stream import MAX_STREAMS, WRITE_TIMEOUT_S
from dashboard.synthetic import build
from harness.engine import TIMEOUT, Child, Hang
from harness.gate import Gate
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints

from .proxy_checks import proxy_cmd, run_cmd
from .proxy_harness import LogTail, ProxyEnv
from .proxy_scenarios import copy_run
from .scenarios import ENGINE, REPO, Outcome, free_port, start_dashboard, stop_process, tail_lines

FLOOD_CLASS = "dashboard flooded by event-stream clients that never read"
CLIENTS = 1000
SAMPLES_BYTES = 8 << 20  # the first push of every stream carries .samples.json
HEALTH_LIMIT_S = 2.0  # /healthz must answer within this all through the flood
PEAK_LIMIT = 256 << 20  # RSS above the baseline the server may reach while flooded
AFTER_LIMIT = 64 << 20  # ... and may keep once the clients are gone


def _big_samples(run: Path, size: int) -> None:
    """A valid .samples.json of about `size` bytes."""
    text = "alpha beta gamma delta " * 170  # ~4 KB a completion
    audits, total, step = [], 0, 0
    while total < size:
        step += 100
        samples = [{"prompt": "alpha ", "completion": text, "tokens": list(range(64))} for _ in range(16)]
        audits.append({"step": step, "time": 0.0, "samples": samples})
        total += 16 * (len(text) + 300)
    (run / ".samples.json").write_text(json.dumps(audits))


def _health(base: str) -> tuple[float, int | None, dict]:
    t0 = time.monotonic()
    try:
        r = httpx.get(base + "healthz", timeout=30)
        return time.monotonic() - t0, r.status_code, r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return time.monotonic() - t0, None, {}


def _non_reader(port: int) -> socket.socket:
    """A client that asks for the event stream and never reads a byte (a small receive buffer, so the
    server's writes back up quickly, as across a slow link)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /api/stream?runs=0 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return s


def _status_line(s: socket.socket) -> bytes:
    try:
        return s.recv(16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return b""


def _reading_stream(base: str, timeout: float = 20.0) -> list[str]:
    """The event names a reading client gets in its first seconds (hello and the sidecars)."""
    names, deadline = [], time.monotonic() + timeout
    with httpx.stream("GET", base + "api/stream?runs=0", timeout=timeout) as r:
        if r.status_code != 200:
            return [f"status {r.status_code}"]
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            if "sidecar" in names and names.count("sidecar") >= 3 or time.monotonic() > deadline:
                break
    return names


class _Growing:
    """Appends steps to the synthetic run in a thread, as a training proxy would (so every stream has
    something to push)."""

    def __init__(self, run, every_s: float = 0.2, steps: int = 50):
        self.run, self.every_s, self.steps = run, every_s, steps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.run.append_steps(self.steps, eval_every=500)
            self.run.write_state()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def event_stream_flood(workdir: Path, clients: int = CLIENTS) -> Outcome:
    out = Outcome(FLOOD_CLASS, "event-stream-flood")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = clients + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    run = workdir / "run"
    synthetic = build(run, 20_000, eval_every=500)
    _big_samples(run, SAMPLES_BYTES)
    proc, port = start_dashboard(run, workdir)
    base = f"http://127.0.0.1:{port}/"
    socks: list[socket.socket] = []
    growing = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            _, code, body = _health(base)
            runs = httpx.get(base + "api/runs", timeout=30).json() if code == 200 else []
            if runs and runs[0].get("indexed"):
                break
            time.sleep(0.2)
        server = psutil.Process(proc.pid)
        first = _reading_stream(base)  # the samples event encoded once, every import done: the baseline
        time.sleep(1.0)
        baseline = server.memory_info().rss
        out.note("a reading client before the flood gets", first[:4])

        out.begin_fault()
        growing = _Growing(synthetic).__enter__()
        worst, peak, failed_health = 0.0, baseline, 0
        for i in range(clients):
            try:
                socks.append(_non_reader(port))
            except OSError as exc:
                out.bump("connections the server did not accept")
                out.note("a refused connection", str(exc))
            if i % 50 == 49:
                seconds, code, _ = _health(base)
                worst = max(worst, seconds)
                failed_health += code != 200
                peak = max(peak, server.memory_info().rss)
        t_end = time.monotonic()
        seconds, code, body = _health(base)
        out.note("streams served at the end of the flood", body.get("streams"))
        served = refused = 0
        for s in socks:
            head = _status_line(s)
            served += head.startswith(b"HTTP/1.1 200")
            refused += head.startswith(b"HTTP/1.1 503")
        # every client still connected and none reading: the streams must be dropped within their timeout
        dropped_at = None
        while time.monotonic() < t_end + max(WRITE_TIMEOUT_S, UNACKED_TIMEOUT_S) + 15:
            seconds, code, body = _health(base)
            worst = max(worst, seconds)
            failed_health += code != 200
            peak = max(peak, server.memory_info().rss)
            if code == 200 and body.get("streams") == 0:
                dropped_at = time.monotonic() - t_end
                break
            time.sleep(0.5)
        growing.__exit__()
        growing = None
        after_names = _reading_stream(base)
        for s in socks:
            s.close()
        socks.clear()
        time.sleep(3.0)
        after = server.memory_info().rss
        _, code, body = _health(base)
        out.note("clients", clients)
        out.note("answered 200 (streams), 503 (refused)", [served, refused])
        out.note("streams dropped for not reading", body.get("streams_dropped"))
        out.note(
            "seconds until every stream of a non-reader was dropped",
            round(dropped_at, 1) if dropped_at is not None else None,
        )
        out.note("slowest /healthz during the flood (s)", round(worst, 2))
        out.note("RSS MiB: baseline, peak, after", [round(baseline / 2**20), round(peak / 2**20), round(after / 2**20)])
        if served > MAX_STREAMS or served + refused < clients - 10:
            out.fail(
                f"{served} streams served and {refused} refused of {clients}: more than {MAX_STREAMS} "
                "streams, or clients left without an answer"
            )
        if worst > HEALTH_LIMIT_S or failed_health:
            out.fail(f"/healthz took up to {worst:.1f}s ({failed_health} answers not 200) during the flood")
        if dropped_at is None:
            out.fail(
                f"the non-reading clients' streams were not dropped within "
                f"{max(WRITE_TIMEOUT_S, UNACKED_TIMEOUT_S) + 15:.0f}s"
            )
        if "hello" not in after_names:
            out.fail(f"a reading client after the flood got {after_names}")
        if peak - baseline > PEAK_LIMIT:
            out.fail(f"RSS reached {peak / 2**20:.0f} MiB from a baseline of {baseline / 2**20:.0f} MiB")
        if after - baseline > AFTER_LIMIT:
            out.fail(
                f"RSS stayed at {after / 2**20:.0f} MiB after the clients left (baseline {baseline / 2**20:.0f} MiB)"
            )
        if proc.poll() is not None:
            out.fail(f"the dashboard exited ({proc.returncode})")
    finally:
        if growing is not None:
            growing.__exit__()
        for s in socks:
            s.close()
        stop_process(proc)
    return out.close()


EXPOSED_CLASS = "a dashboard reachable from other machines"


def exposed_dashboard(env: ProxyEnv, template: Path, workdir: Path) -> Outcome:
    """`proxy run --host 0.0.0.0`: the warning that other machines can reach the dashboard, which has no
    authentication, is on the terminal (stderr), not only in RUN/dashboard.log, and `proxy status`
    repeats it while the run is alive; on 127.0.0.1 neither says it."""
    out = Outcome(EXPOSED_CLASS, "exposed-dashboard")
    for host, exposed in (("0.0.0.0", True), ("127.0.0.1", False)):
        out.begin_fault()
        run = copy_run(template, workdir / f"run-{host}")
        gate = Gate(workdir / f"gate-{host}", ENGINE.path)
        newest = max(checkpoint_step(p) for p in list_checkpoints(run / "checkpoints"))
        gate.hold_after(newest + 3)
        argv = [a for a in env.argv(run, engine=gate.engine_flag) if a != "--no-dashboard"]
        penv = dict(os.environ, PYTHONUNBUFFERED="1")
        penv["PYTHONPATH"] = str(REPO) + os.pathsep + penv.get("PYTHONPATH", "")
        proxy = Child(
            [*argv, "--host", host, "--port", str(free_port())],
            cwd=REPO,
            new_session=True,
            parse_events=False,
            env=penv,
        )
        try:
            if not LogTail(run / ".loss.json").wait_step(newest + 3, proxy):
                out.fail(f"[{host}]: the proxy exited early: {tail_lines(proxy.stderr)}")
            warned = [ln for ln in proxy.stderr_lines() if "reachable from other machines" in ln]
            if bool(warned) != exposed:
                out.fail(f"[{host}]: terminal warning {'missing' if exposed else 'given'}: {proxy.stderr_lines()}")
            elif warned:
                out.note("proxy run --host 0.0.0.0: on the terminal", warned[0])
            shown, lines, deadline = [], [], time.monotonic() + 30
            while time.monotonic() < deadline:  # .state.json names the dashboard from its first write on
                _rc, status = run_cmd(proxy_cmd("status", "--run-dir", run))
                lines = status.lines
                shown = [ln for ln in lines if "reachable from other machines" in ln]
                if shown or not exposed:
                    break
                time.sleep(0.5)
            if bool(shown) != exposed:
                out.fail(f"[{host}]: proxy status {'does not warn' if exposed else 'warns'}: {lines}")
            elif shown:
                out.note("proxy status while it runs", shown[0])
        finally:
            gate.open()
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.finish(TIMEOUT)
            except Hang as exc:
                out.fail(f"[{host}]: {exc}")
    return out.close()
