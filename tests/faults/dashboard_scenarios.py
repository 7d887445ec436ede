"""The dashboard while it indexes a large `.loss.json`: a real uvicorn server (`python -m dashboard`)
over a synthetic run directory written the way the proxy writes one (dashboard/synthetic.py)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from dashboard.log_follower import CHUNK
from dashboard.synthetic import build

from .scenarios import Outcome, start_dashboard, stop_process

LOG_STEPS = 120_000  # about 40 MB of log: several chunks, seconds of indexing on a busy 2-core machine
GARBAGE = 64 << 20  # a region without a newline in the middle of the log (a broken writer's 64 MB line)


def _get(url: str) -> tuple[float, dict | list | None]:
    """(seconds the answer took, its JSON) for one GET."""
    t0 = time.monotonic()
    try:
        r = httpx.get(url, timeout=600)
        body = r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        body = None
    return time.monotonic() - t0, body


def _add_garbage(log: Path, size: int) -> None:
    """Put a line of `size` bytes that is not JSON (and has no newline until its end) in the middle."""
    data = log.read_bytes()
    middle = data.index(b"\n", len(data) // 2) + 1
    log.write_bytes(data[:middle] + b"x" * (size - 1) + b"\n" + data[middle:])


def dashboard_indexing(
    workdir: Path,
    name: str = "dashboard-indexing",
    fault_class: str = "queries while the dashboard indexes a large log",
) -> Outcome:
    """A run directory with a ~40 MB `.loss.json` that has a 64 MB line of garbage in its middle, served
    by a fresh dashboard: while it indexes, queries (`/api/runs`, `/api/runs/0/series`) are polled back
    to back. Each must wait at most about one chunk of indexing (docs/DASHBOARD.md): at most three
    times the mean time a chunk of valid lines takes, plus a second for the request (the garbage is
    scanned a chunk at a time too), so that queries answer between chunks (a quarter of the chunks at
    least), with what is indexed so far (`indexed` false, the step count growing), and the series
    non-empty before the index is complete. (The unfair lock this replaced starved queries only when
    the CPUs were busy: on a quiet machine the old code passes this too; the fairness is by
    construction, RunIndex._query.)"""
    out = Outcome(fault_class, name)
    run = workdir / "run"
    build(run, LOG_STEPS, eval_every=500)
    valid = (run / ".loss.json").stat().st_size
    _add_garbage(run / ".loss.json", GARBAGE)
    proc, port = start_dashboard(run, workdir)
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
        chunks = -(-valid // CHUNK)  # chunks of valid lines; a chunk of garbage costs a read, no parsing
        per_chunk = index_seconds / chunks
        worst = max(latencies)
        out.note("log bytes (valid lines, garbage line)", [valid, GARBAGE])
        out.note("chunks of valid lines", chunks)
        out.note("seconds to index", round(index_seconds, 1))
        out.note("seconds per chunk of valid lines (mean)", round(per_chunk, 2))
        out.note("queries answered while indexing", len(partial))
        out.note("slowest answer while indexing (s)", round(worst, 2))
        if worst > 3 * per_chunk + 1.0:
            out.fail(
                f"a query waited {worst:.1f}s; a chunk of indexing takes {per_chunk:.1f}s on average "
                f"({chunks} chunks of valid lines in {index_seconds:.1f}s)"
            )
        if len(partial) < max(3, chunks // 4) or partial != sorted(partial) or partial[-1] == 0:
            out.fail(
                f"{len(partial)} answers while {chunks} chunks were indexed, steps {partial[:10]}: "
                "queries did not get in between chunks, or the index did not grow"
            )
        if series_partial == 0:
            out.fail("no series was served before the index completed")
    finally:
        stop_process(proc)
    return out.close()


class _CountingFile:
    """A file whose reads are counted (bytes read per poll of the log)."""

    def __init__(self, f, counter: list):
        self.f, self.counter = f, counter

    def read(self, n=-1):
        data = self.f.read(n)
        self.counter[0] += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def overlong_line_reads(
    workdir: Path,
    monkeypatch,
    name: str = "dashboard-overlong-line",
    fault_class: str = "a 64 MB line without a newline while the dashboard indexes",
) -> Outcome:
    """The dashboard's own index (in-process) over a log with a 64 MB garbage line in its middle: every
    poll of the log, each done under the index's lock, reads at most one chunk, so no query ever waits
    for the whole line to be skipped; the valid lines on both sides are all indexed, the garbage skipped."""
    from dashboard import log_follower
    from dashboard.run_index import RunIndex

    out = Outcome(fault_class, name)
    run = workdir / "run"
    build(run, 20_000, eval_every=500)
    _add_garbage(run / ".loss.json", GARBAGE)
    reads: list[int] = []
    counter = [0]
    real_open = log_follower.open_in_root

    def counting_open(root, name):
        f = real_open(root, name)
        return None if f is None else _CountingFile(f, counter)

    real_poll = log_follower.LogFollower.poll

    def counted_poll(self, max_bytes=CHUNK):
        counter[0] = 0
        chunk = real_poll(self, max_bytes)
        reads.append(counter[0])
        return chunk

    monkeypatch.setattr(log_follower, "open_in_root", counting_open)
    monkeypatch.setattr(log_follower.LogFollower, "poll", counted_poll)
    out.begin_fault()
    index = RunIndex(0, "overlong", run)
    index.refresh_log()
    info = index.info()
    out.note("polls", len(reads))
    out.note("most bytes one poll read", max(reads))
    if max(reads) > CHUNK:
        out.fail(f"a poll read {max(reads)} bytes under the index's lock, more than one chunk ({CHUNK})")
    if info["steps"] != 20_000 or not info["indexed"]:
        out.fail(f"indexed {info['steps']} steps (indexed {info['indexed']}), expected all 20000 around the garbage")
    return out.close()
