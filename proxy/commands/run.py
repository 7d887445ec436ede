"""`proxy run`'s command-line side: options to a RunRequest, and the dashboard as a child process."""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ..atomic import open_append
from ..dashboard_address import exposure_warning
from ..errors import EXIT_USAGE, ProxyError
from ..rundir.layout import EXPERIMENT, RunDir
from ..supervision.context import SupervisorOptions
from ..supervision.setup import RunRequest, start_run
from ..supervision.signals import default_stops
from ..tracking.tracker_process import start_tracker, stop_tracker


def main(args: argparse.Namespace) -> int:
    if args.max_failures < 1:
        raise ProxyError("--max-failures must be at least 1", EXIT_USAGE)
    options = SupervisorOptions(
        hang_timeout=args.hang_timeout, max_failures=args.max_failures, backoff_s=args.restart_backoff
    )
    experiment = args.experiment
    from_frozen = experiment is None
    if from_frozen:  # `proxy run --run-dir DIR`: the experiment frozen there (a fork, a pivot)
        if not args.run_dir:
            raise ProxyError(
                "proxy run: give EXPERIMENT.json, or --run-dir DIR of an existing run (see proxy run --help)",
                EXIT_USAGE,
            )
        frozen = Path(args.run_dir) / EXPERIMENT
        if not frozen.is_file():
            raise ProxyError(
                f"{args.run_dir}: not a run directory (no experiment.json); give EXPERIMENT.json to start a new run",
                EXIT_USAGE,
            )
        experiment = str(frozen)
    request = RunRequest(
        experiment_path=Path(experiment),
        run_dir=Path(args.run_dir) if args.run_dir else None,
        engine=args.engine,
        allow_experiment_change=args.allow_experiment_change,
        allow_data_change=args.allow_data_change,
        from_frozen=from_frozen,
        init_from=Path(args.init_from) if args.init_from else None,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
        options=options,
        engine_paths=args.engine_paths,
        overrides=args.overrides,
        ranks=args.ranks,
        launcher=args.launcher,
    )
    dashboard: list[subprocess.Popen] = []
    tracker: list[subprocess.Popen] = []

    def on_started(run: RunDir) -> dict | None:
        started_tracker = start_tracker(run)
        if started_tracker is not None:
            tracker.append(started_tracker)
        if args.no_dashboard:
            return None
        started = start_dashboard(run.root, args.host, args.port, run.dashboard_log)
        if started is None:
            return None
        proc, info = started
        dashboard.append(proc)
        return info

    try:
        return start_run(request, on_started=on_started)
    finally:
        default_stops()  # training is over: a stop signal now is no interrupted setup
        for proc in tracker:
            stop_tracker(proc)
        for proc in dashboard:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _die_with_parent() -> None:
    """In the dashboard child: SIGTERM when the proxy dies, however it dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _free_port(host: str, start: int, tries: int = 20) -> int | None:
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    return None


def start_dashboard(run_root: Path, host: str, port: int, log_path: Path) -> tuple[subprocess.Popen, dict] | None:
    """The dashboard as a child process (a crash there never touches training); prints its URL, and on the
    terminal, not only in its log, a warning when other machines can reach it. Returns the process and
    {"url", "host"} (for `.state.json`: `proxy status` repeats the warning)."""
    free = _free_port(host, port)
    if free is None:
        print(f"proxy: no free port from {port} on {host}; training without the dashboard", file=sys.stderr, flush=True)
        return None
    log = open_append(log_path)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dashboard", "--run-dir", str(run_root), "--host", host, "--port", str(free)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=_die_with_parent,
        )
    finally:
        os.close(log)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{free}/"
    print(f"dashboard: {url} (log {log_path})", flush=True)
    warning = exposure_warning(host)
    if warning:
        print(f"proxy: warning: {warning}", file=sys.stderr, flush=True)
    return proc, {"url": url, "host": host}
