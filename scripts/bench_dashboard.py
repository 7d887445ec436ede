#!/usr/bin/env python3
"""Dashboard benchmark: page-ready time on a long history, server memory while the log grows.

1. Writes a synthetic run with a 200,000-entry `.loss.json` (plus evals, two
   pivots, checkpoints, samples, state) and starts the real server
   (`python -m dashboard`) on it as a subprocess; reports how long the server
   took to index the log.
2. Opens the page in headless Chromium (/usr/bin/chromium, via Playwright) a
   few times and reports navigation -> "ready" (the page's marker, set once
   the first charts drew; measured in the page as performance.now() at that
   moment, i.e. from navigation start).
3. With the page connected, appends another 200,000 entries in batches while
   sampling the server's RSS (psutil) and reports RSS before, peak and after,
   next to how much the log grew, and how long the page took to show the last
   step once writing stopped.

Prints a table, writes test-artifacts/bench_dashboard.json, and exits 1 if
page-ready exceeds 2 s or the server's RSS grew by more than --max-rss-growth MiB.

    python scripts/bench_dashboard.py [--entries 200000] [--append 200000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import psutil  # noqa: E402

from dashboard.synthetic import build  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mib(b: float) -> float:
    return b / (1 << 20)


def start_server(run_dir: Path, port: int, log: Path) -> subprocess.Popen:
    out = open(log, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dashboard", "--run-dir", str(run_dir), "--port", str(port)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    out.close()
    return proc


def wait_indexed(url: str, proc: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            info = httpx.get(url + "api/runs/0", timeout=5).json()
            if info["indexed"] and info["offset"] == info["size"]:
                return info
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit("server did not index the log in time")


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.p = psutil.Process(pid)
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.is_set():
            try:
                self.samples.append((time.monotonic() - t0, self.p.memory_info().rss))
            except psutil.Error:
                return
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=200_000, help="steps in the initial log")
    ap.add_argument("--append", type=int, default=200_000, help="steps appended while the page is connected")
    ap.add_argument("--batch", type=int, default=2000, help="steps per append")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between appends")
    ap.add_argument("--loads", type=int, default=3, help="page loads to time")
    ap.add_argument("--width", type=int, default=1400, help="browser viewport width")
    ap.add_argument("--max-ready", type=float, default=2.0)
    ap.add_argument("--max-rss-growth", type=float, default=64.0, help="MiB")
    ap.add_argument("--keep", type=Path, help="write the run here and keep it")
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="bench_dashboard_"))
    run_dir = args.keep or work / "bench-run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    results: dict = {
        "entries": args.entries,
        "append": args.append,
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    print(f"writing a synthetic run with {args.entries:,} steps to {run_dir} ...", flush=True)
    t = time.monotonic()
    run = build(run_dir, args.entries, eval_every=500, pivots=(args.entries * 2 // 5, args.entries * 3 // 4))
    results["write_s"] = time.monotonic() - t
    log_size0 = (run_dir / ".loss.json").stat().st_size
    results["log_bytes_initial"] = log_size0

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    t = time.monotonic()
    proc = start_server(run_dir, port, work / "server.log")
    try:
        info = wait_indexed(url, proc)
        results["server_start_to_indexed_s"] = time.monotonic() - t
        results["server_index_s"] = info["index_seconds"]
        results["store_bytes_initial"] = info["memory_bytes"]
        rss_indexed = psutil.Process(proc.pid).memory_info().rss
        results["rss_after_index_mib"] = mib(rss_indexed)
        print(
            f"server indexed {info['steps']:,} steps ({mib(log_size0):.1f} MiB of log) in "
            f"{info['index_seconds']:.2f} s; RSS {mib(rss_indexed):.1f} MiB; "
            f"step summaries {info['memory_bytes'] / 1024:.0f} KiB",
            flush=True,
        )

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            ready = []
            for i in range(args.loads):
                ctx = browser.new_context(viewport={"width": args.width, "height": 1200})
                page = ctx.new_page()
                t = time.monotonic()
                page.goto(url)
                page.wait_for_function("() => window.__dashboard && window.__dashboard.ready", timeout=30000)
                wall = time.monotonic() - t
                d = page.evaluate("() => ({...window.__dashboard})")
                ready.append(
                    {
                        "ready_ms": d["readyAt"],
                        "wall_ms": wall * 1000,
                        "points": d["points"],
                        "last_step": d["lastStep"],
                    }
                )
                print(
                    f"  load {i + 1}: ready {d['readyAt']:.0f} ms after navigation "
                    f"(goto->ready seen from Python {wall * 1000:.0f} ms), {d['points']} points drawn, "
                    f"last step {d['lastStep']}",
                    flush=True,
                )
                if i < args.loads - 1:
                    ctx.close()
            results["page_loads"] = ready
            results["ready_ms_median"] = statistics.median(r["ready_ms"] for r in ready)
            results["ready_ms_max"] = max(r["ready_ms"] for r in ready)

            # the last page stays connected while the log grows
            page.wait_for_function("() => window.__dashboard.connected", timeout=10000)
            sampler = RssSampler(proc.pid)
            sampler.start()
            time.sleep(1.0)
            rss_before = sampler.samples[-1][1]
            print(f"appending {args.append:,} steps in batches of {args.batch} ...", flush=True)
            t = time.monotonic()
            written = 0
            timeline = [(0, rss_before)]
            server = psutil.Process(proc.pid)
            while written < args.append:
                n = min(args.batch, args.append - written)
                run.append_steps(n, eval_every=500)
                written += n
                timeline.append((written, server.memory_info().rss))
                if written % 20000 < args.batch:
                    run.write_state(max_steps=args.entries * 2)
                time.sleep(args.pause)
            write_s = time.monotonic() - t
            last = run.step
            t = time.monotonic()
            page.wait_for_function(f"() => window.__dashboard.lastStep >= {last}", timeout=120000)
            catch_up = time.monotonic() - t
            time.sleep(2.0)
            sampler.stop()
            info = httpx.get(url + "api/runs/0", timeout=10).json()
            rss = [s[1] for s in sampler.samples]
            log_size1 = (run_dir / ".loss.json").stat().st_size
            d = page.evaluate(
                "() => ({...window.__dashboard, heap: performance.memory ? performance.memory.usedJSHeapSize : null})"
            )
            results.update(
                {
                    "append_write_s": write_s,
                    "append_rate_steps_per_s": args.append / write_s,
                    "page_caught_up_s": catch_up,
                    "page_last_step": d["lastStep"],
                    "page_points": d["points"],
                    "page_js_heap_mib": mib(d["heap"]) if d["heap"] else None,
                    "page_events": d["events"],
                    "page_errors": d["errors"],
                    "log_bytes_final": log_size1,
                    "log_growth_mib": mib(log_size1 - log_size0),
                    "rss_before_append_mib": mib(rss_before),
                    "rss_peak_mib": mib(max(rss)),
                    "rss_final_mib": mib(rss[-1]),
                    "rss_growth_mib": mib(rss[-1] - rss_before),
                    "rss_peak_growth_mib": mib(max(rss) - rss_before),
                    "rss_samples": len(rss),
                    "rss_timeline_mib": [(w, round(mib(v), 1)) for w, v in timeline[:: max(1, len(timeline) // 10)]]
                    + [(timeline[-1][0], round(mib(timeline[-1][1]), 1))],
                    "store_bytes_final": info["memory_bytes"],
                    "steps_final": info["steps"],
                }
            )
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    results["loadavg_after"] = os.getloadavg()

    r = results
    print()
    print("dashboard benchmark")
    print(
        f"  log: {args.entries:,} steps, {mib(r['log_bytes_initial']):.1f} MiB; machine: "
        f"{r['cpus']} CPUs, load average {r['loadavg_before'][0]:.2f} at start"
    )
    print(f"  server index time              {r['server_index_s']:.2f} s")
    print(
        f"  page ready after navigation    median {r['ready_ms_median']:.0f} ms, "
        f"max {r['ready_ms_max']:.0f} ms over {len(r['page_loads'])} loads"
    )
    print(
        f"  appended                       {args.append:,} steps ({r['log_growth_mib']:.1f} MiB) "
        f"in {r['append_write_s']:.1f} s ({r['append_rate_steps_per_s']:.0f} steps/s)"
    )
    print(
        f"  page showed the last step      {r['page_caught_up_s']:.2f} s after the last write "
        f"({r['page_events']} pushes, {r['page_points']} points drawn, "
        f"JS heap {r['page_js_heap_mib'] or 0:.1f} MiB)"
    )
    print(
        f"  server RSS                     after index {r['rss_after_index_mib']:.1f} MiB, before append "
        f"{r['rss_before_append_mib']:.1f} MiB, peak {r['rss_peak_mib']:.1f} MiB, "
        f"final {r['rss_final_mib']:.1f} MiB (growth {r['rss_growth_mib']:+.1f} MiB for "
        f"{r['log_growth_mib']:.1f} MiB of log)"
    )
    print(
        "  server RSS while appending     "
        + ", ".join(f"{w // 1000}k: {v:.0f}" for w, v in r["rss_timeline_mib"])
        + " (steps appended: MiB)"
    )
    print(
        f"  step summaries in memory       {r['store_bytes_initial'] / 1024:.0f} KiB -> "
        f"{r['store_bytes_final'] / 1024:.0f} KiB for {r['steps_final']:,} steps"
    )
    ok_ready = r["ready_ms_max"] <= args.max_ready * 1000
    ok_rss = r["rss_peak_growth_mib"] <= args.max_rss_growth
    ok_live = r["page_last_step"] >= args.entries + args.append and not r["page_errors"]
    print(
        f"  ready <= {args.max_ready:.1f} s: {'PASS' if ok_ready else 'FAIL'}; "
        f"RSS growth <= {args.max_rss_growth:.0f} MiB: {'PASS' if ok_rss else 'FAIL'}; "
        f"page caught up, no errors: {'PASS' if ok_live else 'FAIL'}"
    )
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "bench_dashboard.json").write_text(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok_ready and ok_rss and ok_live else 1


if __name__ == "__main__":
    raise SystemExit(main())
