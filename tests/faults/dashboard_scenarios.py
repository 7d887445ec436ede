"""The dashboard while it indexes a large `.loss.json`: a real uvicorn server (`python -m dashboard`)
over a synthetic run directory written the way the proxy writes one (dashboard/synthetic.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from dashboard.log_follower import CHUNK
from dashboard.synthetic import build

from .scenarios import REPO, Outcome

LOG_STEPS = 120_000  # about 40 MB of log: several chunks, seconds of indexing on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[float, dict | list | None]:
    """(seconds the answer took, its JSON) for one GET."""
    t0 = time.monotonic()
    try:
        r = httpx.get(url, timeout=600)
        body = r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        body = None
    return time.monotonic() - t0, body


def dashboard_indexing(workdir: Path, name: str = "dashboard-indexing",
                       fault_class: str = "queries while the dashboard indexes a large log") -> Outcome:
    """A run directory with a ~40 MB `.loss.json`, served by a fresh dashboard: while it indexes, queries
    (`/api/runs`, `/api/runs/0/series`) are polled back to back. Each must answer within about one chunk
    of indexing (docs/DASHBOARD.md): at most twice the mean time a chunk takes, plus half a second for
    the request, so that queries answer between chunks (a quarter of the chunks at least), with what is
    indexed so far (`indexed` false, the step count growing), and the series non-empty before the index
    is complete."""
    out = Outcome(fault_class, name)
    run = workdir / "run"
    build(run, LOG_STEPS, eval_every=500)
    size = (run / ".loss.json").stat().st_size
    port = _free_port()
    log = open(workdir / "dashboard.log", "wb")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "dashboard", "--run-dir", str(run), "--port", str(port),
                             "--poll", "0.5"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(base + "healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        out.begin_fault()
        latencies, partial, series_partial = [], [], 0
        index_seconds = None
        while time.monotonic() < deadline + 600:
            seconds, runs = _get(base + "api/runs")
            latencies.append(seconds)
            if not runs:
                out.fail(f"/api/runs did not answer (after {seconds:.1f}s)")
                break
            info = runs[0]
            if info["indexed"]:
                index_seconds = info["index_seconds"]
                break
            partial.append(info["steps"])
            seconds, series = _get(base + "api/runs/0/series?width=200")
            latencies.append(seconds)
            if series and series.get("total_steps", 0) > 0:
                series_partial += 1
        if index_seconds is None:
            out.fail("the index never completed")
            return out.close()
        chunks = -(-size // CHUNK)
        worst = max(latencies)
        out.note("log bytes", size)
        out.note("chunks of indexing", chunks)
        out.note("seconds to index", round(index_seconds, 1))
        out.note("seconds per chunk (mean)", round(index_seconds / chunks, 2))
        out.note("queries answered while indexing", len(partial))
        out.note("slowest answer while indexing (s)", round(worst, 2))
        per_chunk = index_seconds / chunks
        if worst > 2 * per_chunk + 0.5:
            out.fail(f"a query waited {worst:.1f}s; a chunk of indexing takes {per_chunk:.1f}s on average "
                     f"({chunks} chunks in {index_seconds:.1f}s)")
        if len(partial) < max(3, chunks // 4) or partial != sorted(partial) or partial[-1] == 0:
            out.fail(f"{len(partial)} answers while {chunks} chunks were indexed, steps {partial[:10]}: "
                     "queries did not get in between chunks, or the index did not grow")
        if series_partial == 0:
            out.fail("no series was served before the index completed")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out.close()
