"""`proxy status`: step, loss, speed, ETA, mixture, checkpoints, phases, alive or not (docs/CLI.md).

Alive or not comes from the run's lock, not from `.state.json`; step, loss,
speed and mixture from the tail of `.loss.json` (last entry per step); the
phase from `phases.json`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..dashboard_address import exposure_warning
from ..errors import EXIT_OK
from ..formats import bounded_json
from ..formats.checkpoint import checkpoint_files
from ..formats.loss_log import EvalEntry, StepEntry, read_tail
from ..formats.state import Goodput, finite_json, read_state
from ..rundir.layout import EXPERIMENT, RunDir, RunDirError
from ..rundir.lock import run_lock_holder
from ..rundir.overrides_record import OverridesRecord, read_overrides
from ..rundir.phases import read_phases
from ..safe_fs import UnsafeFileError
from ..supervision.goodput import overhead_summary
from ..supervision.throughput import WINDOW_STEPS, ThroughputMeter, fmt_duration, fmt_rate
from .which_run import resolve_run


def newest_durable_checkpoint(run: RunDir, state: dict, alive: bool) -> Path | None:
    """While a proxy runs, the last checkpoint its engine announced (`.state.json`): a newer file on disk
    may still be being written. Otherwise, or when that file is gone, the newest on disk."""
    announced = state.get("last_checkpoint")
    if alive and isinstance(announced, str) and announced:
        path = Path(announced) if Path(announced).is_absolute() else run.root / announced
        if path.is_file():
            return path
    ckpts = checkpoint_files(run.checkpoints)  # a 0-byte file or a directory under a checkpoint's name is not one
    return ckpts[0] if ckpts else None


def _dashboard(recorded: object) -> dict | None:
    """The running proxy's dashboard as `.state.json` records it, with the warning for an address other
    machines can reach (worked out again here: the snapshot is never trusted)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("host"), str):
        return None
    url = recorded.get("url") if isinstance(recorded.get("url"), str) else None
    return {"url": url, "host": recorded["host"], "warning": exposure_warning(recorded["host"])}


def _int(value: object, at_most: int | None) -> int:
    """A count `.state.json` holds (a snapshot anyone can edit): a non-negative int, at most `at_most` when
    that is known, else 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    return min(value, at_most) if at_most else value


def status_report(run: RunDir) -> dict:
    """Everything `proxy status` shows, as a dict (also `--json`)."""
    state = read_state(run.state) or {}
    try:
        experiment = bounded_json.loads(run.read_small(run.experiment))
    except UnsafeFileError:
        raise
    except (OSError, ValueError, RecursionError):
        experiment = {}
    if not isinstance(experiment, dict):
        experiment = {}
    given = experiment.get("train")
    train = given if isinstance(given, dict) else {}
    try:
        max_steps = int(train.get("max_steps") or state.get("max_steps") or 0)
    except (TypeError, ValueError):  # a hand-edited file: shown as unknown
        max_steps = 0
    tail = read_tail(run.loss_log)
    steps = {}
    for e in tail:
        if isinstance(e, StepEntry):
            steps[e.step] = e  # last entry per step wins
    ordered = [steps[s] for s in sorted(steps)]
    # a step past max_steps is none this run trains (a forged or foreign line): named in a warning, not counted
    beyond = [e for e in ordered if max_steps and e.step > max_steps]
    if max_steps:
        ordered = [e for e in ordered if e.step <= max_steps]
    evals = [e for e in tail if isinstance(e, EvalEntry)]
    progress = ThroughputMeter()  # the same window as the running proxy's figures
    window = ordered[-WINDOW_STEPS:]
    for before, e in zip([None, *window], window, strict=False):
        # running time only: the time between two launches (a stopped run, a restart) is not counted
        progress.observe(
            e.time, e.tokens, e.step, e.loss, e.ms, new_launch=before is not None and before.segment != e.segment
        )
    rates = progress.rates(max_steps)
    last = ordered[-1] if ordered else None
    try:
        phases = read_phases(run)
    except RunDirError:
        phases = []
    current = phases[-1] if phases else None
    holder = run_lock_holder(run)
    owner = None if holder is None or holder.foreign else (holder.pid or -1)  # another holder is no proxy
    newest = newest_durable_checkpoint(run, state, alive=owner is not None)
    status = state.get("status") or ("running" if owner else "not started")
    if owner is None and status == "running":
        status = "not running (the proxy ended without finishing; relaunch the run command to resume)"
    engine = state.get("engine") or {}
    return {
        "run_dir": str(run.root),
        "experiment": experiment.get("name"),
        "alive": owner is not None,
        "proxy_pid": owner if owner and owner > 0 else None,
        "status": status,
        "step": last.step if last else _int(state.get("step"), max_steps),
        "max_steps": max_steps,
        "steps_beyond_max": [e.step for e in beyond][-3:],
        "loss": last.loss if last else None,
        "loss_smoothed": progress.smoothed,
        "val_loss": evals[-1].loss if evals else None,
        "val_step": evals[-1].step if evals else None,
        "tokens": last.tokens if last else _int(state.get("tokens"), None),
        "tokens_per_s": rates.tokens_per_s,
        "engine_tokens_per_s": rates.engine_tokens_per_s,
        "eta_s": rates.eta_s if owner else None,
        "goodput": state.get("goodput"),
        "mixture": last.mixture if last else {},
        "last_checkpoint": str(newest) if newest else None,
        "last_checkpoint_age_s": time.time() - newest.stat().st_mtime if newest else None,
        "best": state.get("best"),
        "phase": current.phase if current else state.get("phase", 0),
        "phase_start_step": current.start_step if current else 0,
        "policy": current.policy if current else state.get("policy"),
        "caps": current.caps if current else None,
        "floors": current.floors if current else None,
        "phases": [{"phase": p.phase, "start_step": p.start_step, "policy": p.policy} for p in phases],
        "segment": state.get("segment"),
        "restarts": state.get("restarts", 0),
        "engine": {k: engine.get(k) for k in ("kind", "device", "pid", "alive", "rss_bytes", "cpu_percent", "ranks")}
        if owner
        else None,
        "replay_mismatches": int(state.get("replay_mismatch_count") or 0),
        "dashboard": _dashboard(state.get("dashboard")) if owner else None,
        "message": state.get("message"),
        "lock_holder": holder.describe() if holder is not None and holder.foreign else None,
        # the frozen experiment is the effective one; these are the `--set` values the last launch gave it
        "overrides": (read_overrides(run) or OverridesRecord()).overrides,
    }


def format_status(r: dict) -> str:
    """The report as the lines `proxy status` prints."""
    lines = [f"run:         {r['run_dir']} (experiment {r['experiment']})"]
    alive = f"proxy pid {r['proxy_pid']}" if r["alive"] else "no proxy running"
    eng = r.get("engine") or {}
    if eng.get("pid"):
        alive += f", engine pid {eng['pid']} {'alive' if eng.get('alive') else 'not running'}"
        if (eng.get("ranks") or 1) > 1:
            alive += f" ({eng['ranks']} ranks)"
        if eng.get("cpu_percent") is not None:
            alive += f", cpu {eng['cpu_percent']:.0f}%"
        if eng.get("rss_bytes"):
            alive += f", rss {eng['rss_bytes'] / 2**20:.0f} MiB"
    lines.append(f"status:      {r['status']} ({alive})")
    if r.get("overrides"):
        lines.append(
            "overrides:   " + ", ".join(r["overrides"]) + " (--set; the effective experiment is "
            f"{Path(r['run_dir']) / EXPERIMENT})"
        )
    pct = f" ({100 * r['step'] / r['max_steps']:.1f}%)" if r["max_steps"] else ""
    lines.append(f"step:        {r['step']} / {r['max_steps']}{pct}")
    if r.get("steps_beyond_max"):
        lines.append(
            f"WARNING:     .loss.json logs step {r['steps_beyond_max'][-1]}, beyond max_steps "
            f"{r['max_steps']}: a line this run did not write (not counted)"
        )
    if r["loss"] is not None:
        val = f"; val {r['val_loss']:.4f} at step {r['val_step']}" if r["val_loss"] is not None else ""
        lines.append(f"loss:        {r['loss']:.4f} (smoothed {r['loss_smoothed']:.4f}){val}")
    lines.append(
        f"tokens:      {r['tokens']:,} at {fmt_rate(r['tokens_per_s'])} tok/s (engine "
        f"{fmt_rate(r['engine_tokens_per_s'])}); "
        f"ETA {fmt_duration(r['eta_s']) if r['eta_s'] is not None else '-'}"
    )
    goodput = Goodput.from_dict(r.get("goodput"))
    if goodput is not None and goodput.overhead is None:
        lines.append("goodput:     no figure before the first step")
    elif goodput is not None:
        lines.append(
            f"goodput:     {overhead_summary(goodput)} of {fmt_duration(goodput.wall_s)} "
            f"since {'this' if r['alive'] else 'the last'} proxy's engine was ready"
        )
    if r["mixture"]:
        lines.append("mixture:     " + ", ".join(f"{k} {v:.3f}" for k, v in r["mixture"].items()))
    if r["last_checkpoint"]:
        lines.append(f"checkpoint:  {r['last_checkpoint']} ({fmt_duration(r['last_checkpoint_age_s'])} ago)")
    else:
        lines.append("checkpoint:  none yet")
    if r.get("best") and r["best"].get("step") is not None:
        loss = r["best"].get("loss")
        lines.append(f"best:        step {r['best']['step']}" + (f", val loss {loss:.4f}" if loss is not None else ""))
    facts = [r["policy"]] if r.get("policy") else []
    if r.get("phase"):
        facts.append(f"pivot at step {r['phase_start_step']}")
    about = f" ({', '.join(facts)})" if facts else ""
    lines.append(f"phase:       {r['phase']}{about}, segment {r['segment']}, engine restarts {r['restarts']}")
    if r.get("caps"):
        lines.append("caps:        " + ", ".join(f"{k} {r['floors'].get(k, 0):g}..{v:g}" for k, v in r["caps"].items()))
    if len(r.get("phases") or []) > 1:
        lines.append(
            "pivots:      "
            + ", ".join(f"phase {p['phase']} at step {p['start_step']} ({p['policy']})" for p in r["phases"][1:])
        )
    dashboard = r.get("dashboard") or {}
    if dashboard.get("warning"):
        lines.append(f"WARNING:     {dashboard['warning']}: {dashboard.get('url')}")
    if r["replay_mismatches"]:
        lines.append(
            f"WARNING:     {r['replay_mismatches']} replayed step(s) differed from the first run "
            "(a determinism bug; see replay_mismatches in .state.json)"
        )
    if r.get("lock_holder"):
        lines.append(f"WARNING:     the run directory is locked by {r['lock_holder']}; nothing signalled")
    if r.get("message"):
        lines.append(f"note:        {r['message']}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    report = status_report(resolve_run(args.run_dir))
    # strict JSON: a NaN or an infinity read from the log is null
    print(json.dumps(finite_json(report), indent=1, allow_nan=False) if args.json else format_status(report))
    return EXIT_OK
