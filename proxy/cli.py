"""`proxy` / `python -m proxy`: run, status, checkpoint, stop, pivot, fork, dashboard (docs/CLI.md).

Every bad input ends with one line on stderr and a non-zero exit, never a
traceback. Exit codes: 0 done (finished, stopped, already finished);
1 runtime failure (run directory in use, no proxy to signal, engine cannot
run); 2 bad input (arguments, experiment, changed experiment); 3 crash loop.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (and exit 2), not usage plus a line."""

    def error(self, message: str):
        raise _UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="proxy", description="microgpt's training proxy: supervises the engine, "
                     "owns the data mixture and the run directory.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="train an experiment (relaunch the same command to resume)")
    run.add_argument("experiment", metavar="EXPERIMENT.json", nargs="?",
                     help="the experiment file (default: the one frozen in --run-dir, e.g. a fork's)")
    run.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/<experiment name>)")
    run.add_argument("--engine", metavar="cpu|cuda|PATH",
                     help="engine binary (default: cuda when a GPU is visible and built, else cpu)")
    run.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    run.add_argument("--host", default="127.0.0.1", help="dashboard address (default 127.0.0.1)")
    run.add_argument("--port", type=_port, default=8000, help="dashboard port; the next free one is used "
                     "if taken (default 8000)")
    run.add_argument("--allow-experiment-change", action="store_true",
                     help="continue a run whose experiment file differs from its frozen copy")
    run.add_argument("--hang-timeout", type=_positive_float, metavar="S",
                     help="seconds without an engine event before it counts as hung "
                     "(default max(30, 20 x median step time), more around checkpoints)")
    run.add_argument("--restart-backoff", type=_positive_float, default=1.0, metavar="S",
                     help="first delay before restarting a failed engine; doubles per failure (default 1)")
    run.add_argument("--max-failures", type=int, default=5, metavar="N",
                     help="consecutive engine failures without progress before giving up (default 5)")
    run.add_argument("--cache-dir", metavar="DIR", help="prepared-data cache (default $MICROGPT_CACHE or "
                     "~/.cache/microgpt)")

    status = sub.add_parser("status", help="step, loss, speed, ETA, mixture, last checkpoint, alive or not")
    status.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    status.add_argument("--json", action="store_true", help="print the report as JSON")

    ckpt = sub.add_parser("checkpoint", help="ask the running proxy for a checkpoint now (training continues)")
    ckpt.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")

    stop = sub.add_parser("stop", help="checkpoint and stop the running proxy")
    stop.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    stop.add_argument("--no-wait", action="store_true", help="return once the signal is sent")
    stop.add_argument("--timeout", type=_positive_float, default=600.0, metavar="S",
                      help="how long to wait for the proxy to exit (default 600)")

    pivot = sub.add_parser("pivot", help="start a new phase with new caps and floors (a live or a stopped run)")
    pivot.add_argument("--caps", metavar="NEW.json", required=True,
                       help="caps file: {\"caps\": {arm: x}, \"floors\": {arm: y}, "
                       "\"policy\": \"ucb1\"|\"exp3\"|\"uniform\"|\"progress\"} "
                       "(docs/EXPERIMENTS.md, \"Caps files\")")
    pivot.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    pivot.add_argument("--at", type=int, metavar="STEP",
                       help="stopped run only: pivot at the newest valid checkpoint at or before STEP "
                       "(default: the newest valid checkpoint the log covers)")
    pivot.add_argument("--timeout", type=_positive_float, default=600.0, metavar="S",
                       help="live run: how long to wait for the proxy's answer (default 600)")

    fork = sub.add_parser("fork", help="a new run directory continuing DIR's run from its checkpoint at STEP")
    fork.add_argument("--run-dir", metavar="DIR", required=True, help="the run to fork (never modified)")
    fork.add_argument("--at", type=int, metavar="STEP", required=True,
                      help="fork at this step's checkpoint (or the nearest older valid one)")
    fork.add_argument("--to", metavar="NEW_DIR", required=True, help="the new run directory (must not exist, "
                      "or be empty)")
    fork.add_argument("--caps", metavar="NEW.json", help="start the fork with a new phase from this caps file")

    sub.add_parser("dashboard", help="serve the read-only dashboard (proxy dashboard --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "dashboard":
        return _dashboard(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        handler = {"run": cmd_run, "status": cmd_status, "checkpoint": cmd_checkpoint, "stop": cmd_stop,
                   "pivot": cmd_pivot, "fork": cmd_fork}
        return handler[args.command](args)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except _CommandError as exc:
        print(f"proxy: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `proxy status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


class _CommandError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- run

def cmd_run(args) -> int:
    from .supervisor import RunRequest, SupervisorError, SupervisorOptions, start_run

    if args.max_failures < 1:
        raise _CommandError("--max-failures must be at least 1", EXIT_USAGE)
    options = SupervisorOptions(hang_timeout=args.hang_timeout, max_failures=args.max_failures,
                                backoff_s=args.restart_backoff)
    if args.experiment is None:  # `proxy run --run-dir DIR`: the experiment frozen there (a fork, a pivot)
        if not args.run_dir:
            raise _CommandError("proxy run: give EXPERIMENT.json, or --run-dir DIR of an existing run "
                                "(see proxy run --help)", EXIT_USAGE)
        frozen = Path(args.run_dir) / "experiment.json"
        if not frozen.is_file():
            raise _CommandError(f"{args.run_dir}: not a run directory (no experiment.json); give "
                                "EXPERIMENT.json to start a new run", EXIT_USAGE)
        args.experiment = str(frozen)
    request = RunRequest(experiment_path=Path(args.experiment), run_dir=Path(args.run_dir) if args.run_dir else None,
                         engine=args.engine, allow_experiment_change=args.allow_experiment_change,
                         cache_dir=Path(args.cache_dir) if args.cache_dir else None, options=options)
    dashboard: list[subprocess.Popen] = []

    def on_started(run) -> None:
        if not args.no_dashboard:
            proc = start_dashboard(run.root, args.host, args.port, run.dashboard_log)
            if proc is not None:
                dashboard.append(proc)

    try:
        return start_run(request, on_started=on_started)
    except SupervisorError as exc:
        print(f"proxy: {exc}", file=sys.stderr, flush=True)
        return exc.code
    finally:
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


def start_dashboard(run_root: Path, host: str, port: int, log_path: Path) -> subprocess.Popen | None:
    """The dashboard as a child process (a crash there never touches training); prints its URL."""
    if importlib.util.find_spec("dashboard") is None or importlib.util.find_spec("dashboard.server") is None:
        print("proxy: dashboard not available (dashboard.server is not installed); training without it",
              file=sys.stderr, flush=True)
        return None
    free = _free_port(host, port)
    if free is None:
        print(f"proxy: no free port from {port} on {host}; training without the dashboard", file=sys.stderr,
              flush=True)
        return None
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "dashboard", "--run-dir", str(run_root),
                                 "--host", host, "--port", str(free)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent)
    shown = f"[{host}]" if ":" in host else host
    print(f"dashboard: http://{shown}:{free}/ (log {log_path})", flush=True)
    return proc


def _dashboard(argv: list[str]) -> int:
    try:
        from dashboard.server import main as dashboard_main
    except ImportError as exc:
        print(f"proxy dashboard: not available ({exc})", file=sys.stderr)
        return EXIT_FAILURE
    return int(dashboard_main(argv) or 0)


# ---------------------------------------------------------------- run directory for the others

def _resolve_run(run_dir: str | None):
    from .run_dir import RunDir, RunDirError, most_recent_run

    if run_dir:
        run = RunDir(Path(run_dir))
        if not run.root.is_dir():
            raise _CommandError(f"{run.root}: no such run directory", EXIT_USAGE)
        if not run.exists():
            raise _CommandError(f"{run.root}: not a run directory (no experiment.json)", EXIT_USAGE)
        return run
    try:
        return RunDir(most_recent_run())
    except RunDirError as exc:
        raise _CommandError(str(exc), EXIT_USAGE) from None


def _running_proxy(run) -> int:
    from .run_dir import lock_owner

    pid = lock_owner(run)
    if pid is None:
        raise _CommandError(f"no proxy is running for {run.root}")
    if pid <= 0:
        raise _CommandError(f"{run.lock_file} is locked but holds no pid")
    return pid


def _signal_proxy(run, signum: int) -> int:
    """Send signum to the proxy holding run's lock; return its pid."""
    pid = _running_proxy(run)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise _CommandError(f"proxy pid {pid} for {run.root} is gone") from None
    return pid


def cmd_checkpoint(args) -> int:
    run = _resolve_run(args.run_dir)
    pid = _signal_proxy(run, signal.SIGUSR1)
    print(f"asked proxy pid {pid} for a checkpoint of {run.root}; training continues")
    return EXIT_OK


def cmd_stop(args) -> int:
    from .run_dir import lock_owner

    run = _resolve_run(args.run_dir)
    pid = _signal_proxy(run, signal.SIGTERM)
    if args.no_wait:
        print(f"asked proxy pid {pid} to stop {run.root}; it checkpoints and exits")
        return EXIT_OK
    print(f"stopping {run.root} (proxy pid {pid}): waiting for the checkpoint...", flush=True)
    end = time.monotonic() + args.timeout
    while time.monotonic() < end:
        if lock_owner(run) is None:
            from .checkpoint_file import list_checkpoints
            newest = list_checkpoints(run.checkpoints)
            print(f"stopped; newest checkpoint {newest[0] if newest else 'none'}")
            return EXIT_OK
        time.sleep(0.2)
    raise _CommandError(f"proxy pid {pid} did not exit within {args.timeout:.0f}s (it may still be checkpointing)")


# ---------------------------------------------------------------- pivot, fork

def cmd_pivot(args) -> int:
    from .pivot import PivotError, pivot

    run = _resolve_run(args.run_dir)
    try:
        return pivot(run, Path(args.caps), at=args.at, timeout=args.timeout)
    except PivotError as exc:
        raise _CommandError(str(exc), exc.code) from None
    except OSError as exc:
        raise _CommandError(f"pivot of {run.root}: {exc}") from None


def cmd_fork(args) -> int:
    from .fork import ForkError, fork

    run = _resolve_run(args.run_dir)
    try:
        return fork(run, args.at, Path(args.to), Path(args.caps) if args.caps else None)
    except ForkError as exc:
        raise _CommandError(str(exc), exc.code) from None
    except OSError as exc:
        raise _CommandError(f"fork of {run.root}: {exc}") from None


# ---------------------------------------------------------------- status

def status_report(run) -> dict:
    """Everything `proxy status` shows, as a dict (also `--json`)."""
    from .checkpoint_file import list_checkpoints
    from .loss_log import EvalEntry, StepEntry, read_tail
    from .run_dir import RunDirError, lock_owner, read_phases
    from .sidecars import read_state

    state = read_state(run.state) or {}
    try:
        experiment = json.loads(run.experiment.read_text())
    except (OSError, ValueError):
        experiment = {}
    max_steps = int((experiment.get("train") or {}).get("max_steps") or state.get("max_steps") or 0)
    tail = read_tail(run.loss_log)
    steps = {}
    for e in tail:
        if isinstance(e, StepEntry):
            steps[e.step] = e  # last entry per step wins
    ordered = [steps[s] for s in sorted(steps)]
    evals = [e for e in tail if isinstance(e, EvalEntry)]
    smoothed = None
    for e in ordered[-200:]:
        smoothed = e.loss if smoothed is None else 0.9 * smoothed + 0.1 * e.loss
    last = ordered[-1] if ordered else None
    rate = eta = None
    window = ordered[-50:]
    if len(window) >= 2 and window[-1].time > window[0].time:
        dt = window[-1].time - window[0].time
        rate = (window[-1].tokens - window[0].tokens) / dt
        per_step = dt / max(1, window[-1].step - window[0].step)
        eta = max(0, max_steps - window[-1].step) * per_step
    try:
        phases = read_phases(run)
    except RunDirError:
        phases = []
    current = phases[-1] if phases else None
    owner = lock_owner(run)
    ckpts = list_checkpoints(run.checkpoints)
    newest = ckpts[0] if ckpts else None
    status = state.get("status") or ("running" if owner else "not started")
    if owner is None and status == "running":
        status = "not running (the proxy ended without finishing; relaunch the run command to resume)"
    engine = state.get("engine") or {}
    return {
        "run_dir": str(run.root), "experiment": experiment.get("name"), "alive": owner is not None,
        "proxy_pid": owner if owner and owner > 0 else None, "status": status,
        "step": last.step if last else int(state.get("step") or 0), "max_steps": max_steps,
        "loss": last.loss if last else None, "loss_smoothed": smoothed,
        "val_loss": evals[-1].loss if evals else None, "val_step": evals[-1].step if evals else None,
        "tokens": last.tokens if last else int(state.get("tokens") or 0),
        "tokens_per_s": rate, "eta_s": eta if owner else None,
        "mixture": last.mixture if last else {},
        "last_checkpoint": str(newest) if newest else None,
        "last_checkpoint_age_s": time.time() - newest.stat().st_mtime if newest else None,
        "best": state.get("best"), "phase": current.phase if current else state.get("phase", 0),
        "phase_start_step": current.start_step if current else 0,
        "policy": current.policy if current else state.get("policy"),
        "caps": current.caps if current else None, "floors": current.floors if current else None,
        "phases": [{"phase": p.phase, "start_step": p.start_step, "policy": p.policy} for p in phases],
        "segment": state.get("segment"),
        "restarts": state.get("restarts", 0),
        "engine": {k: engine.get(k) for k in ("kind", "device", "pid", "alive", "rss_bytes", "cpu_percent")}
        if owner else None,
        "replay_mismatches": int(state.get("replay_mismatch_count") or 0),
        "message": state.get("message"),
    }


def _fmt_status(r: dict) -> str:
    from .supervisor import _fmt_duration, _fmt_rate

    lines = [f"run:         {r['run_dir']} (experiment {r['experiment']})"]
    alive = f"proxy pid {r['proxy_pid']}" if r["alive"] else "no proxy running"
    eng = r.get("engine") or {}
    if eng.get("pid"):
        alive += f", engine pid {eng['pid']} {'alive' if eng.get('alive') else 'not running'}"
        if eng.get("cpu_percent") is not None:
            alive += f", cpu {eng['cpu_percent']:.0f}%"
        if eng.get("rss_bytes"):
            alive += f", rss {eng['rss_bytes'] / 2**20:.0f} MiB"
    lines.append(f"status:      {r['status']} ({alive})")
    pct = f" ({100 * r['step'] / r['max_steps']:.1f}%)" if r["max_steps"] else ""
    lines.append(f"step:        {r['step']} / {r['max_steps']}{pct}")
    if r["loss"] is not None:
        val = f"; val {r['val_loss']:.4f} at step {r['val_step']}" if r["val_loss"] is not None else ""
        lines.append(f"loss:        {r['loss']:.4f} (smoothed {r['loss_smoothed']:.4f}){val}")
    lines.append(f"tokens:      {r['tokens']:,} at {_fmt_rate(r['tokens_per_s'])} tok/s; "
                 f"ETA {_fmt_duration(r['eta_s']) if r['eta_s'] is not None else '-'}")
    if r["mixture"]:
        lines.append("mixture:     " + ", ".join(f"{k} {v:.3f}" for k, v in r["mixture"].items()))
    if r["last_checkpoint"]:
        lines.append(f"checkpoint:  {r['last_checkpoint']} ({_fmt_duration(r['last_checkpoint_age_s'])} ago)")
    else:
        lines.append("checkpoint:  none yet")
    if r.get("best") and r["best"].get("step") is not None:
        loss = r["best"].get("loss")
        lines.append(f"best:        step {r['best']['step']}" + (f", val loss {loss:.4f}" if loss is not None else ""))
    about = [r["policy"]] if r.get("policy") else []
    if r.get("phase"):
        about.append(f"pivot at step {r['phase_start_step']}")
    about = f" ({', '.join(about)})" if about else ""
    lines.append(f"phase:       {r['phase']}{about}, segment {r['segment']}, engine restarts {r['restarts']}")
    if r.get("caps"):
        lines.append("caps:        " + ", ".join(f"{k} {r['floors'].get(k, 0):g}..{v:g}" for k, v in r["caps"].items()))
    if len(r.get("phases") or []) > 1:
        lines.append("pivots:      " + ", ".join(f"phase {p['phase']} at step {p['start_step']} ({p['policy']})"
                                                 for p in r["phases"][1:]))
    if r["replay_mismatches"]:
        lines.append(f"WARNING:     {r['replay_mismatches']} replayed step(s) differed from the first run "
                     "(a determinism bug; see replay_mismatches in .state.json)")
    if r.get("message"):
        lines.append(f"note:        {r['message']}")
    return "\n".join(lines)


def cmd_status(args) -> int:
    run = _resolve_run(args.run_dir)
    report = status_report(run)
    print(json.dumps(report, indent=1) if args.json else _fmt_status(report))
    return EXIT_OK
