"""What `proxy run` tells people while it runs: `.state.json`, rewritten every few seconds, and progress lines."""

from __future__ import annotations

import os
import time

from ..formats.state import ArmStatus, RunState, write_state
from .context import Console, RunContext
from .goodput import overhead_summary
from .launch import EngineLaunch
from .report import RunReport
from .throughput import fmt_duration, fmt_rate


def last_step(launch: EngineLaunch | None) -> int:
    return launch.last_step if launch is not None else 0


PROGRESS_EVERY_S = 30.0  # the longest the terminal goes without a progress line, however slow the steps


def say_progress(
    console: Console, report: RunReport, launch: EngineLaunch, max_steps: int, on_clock: bool = False
) -> None:
    """`step 200/300 | loss 4.2023 (smoothed 4.2741) | 31.9k tok/s (engine 35.2k) | ETA 0m01s | mixture
    code 0.62, docstrings 0.28, topics 0.10`: tokens/s of wall-clock time and of the engine's step compute
    alone, over the window of throughput.py; the mixture the last step was drawn from. A line the clock
    asked for ends with `last step 0m12s ago` (the engine is inside a step, or an audit). Before this
    launch's first step, how long the engine has been at it instead."""
    now = time.monotonic()
    report.progress_said_at(now)
    progress = report.progress
    head = f"step {launch.last_step}/{max_steps}"
    if launch.ready_at is None:
        console.say(f"{head} | waiting for the engine to be ready")
        return
    if launch.last_step_wall is None:  # nothing trained yet in this launch
        console.say(
            f"{head} | first step of this launch in progress "
            f"({fmt_duration(now - launch.ready_at)} since the engine was ready)"
        )
        return
    rates = progress.rates(max_steps)
    parts = [head]
    if progress.last_loss is not None:
        smoothed = f" (smoothed {progress.smoothed:.4f})" if progress.smoothed is not None else ""
        parts.append(f"loss {progress.last_loss:.4f}{smoothed}")
    ranks = report.engine.ranks
    on_ranks = f" on {ranks} ranks" if ranks > 1 else ""  # data-parallel: the job's tokens, all ranks together
    parts.append(f"{fmt_rate(rates.tokens_per_s)} tok/s (engine {fmt_rate(rates.engine_tokens_per_s)}{on_ranks})")
    parts.append(f"ETA {fmt_duration(rates.eta_s)}")
    if len(progress.mixture or ()) > 1:  # one arm (a single dataset): always 1.00, nothing to say
        parts.append("mixture " + ", ".join(f"{arm} {w:.2f}" for arm, w in progress.mixture.items()))
    if on_clock:  # no step count asked for it: say how long the engine has been at the next one
        parts.append(f"last step {fmt_duration(now - launch.last_step_wall)} ago")
    console.say(" | ".join(parts))


def say_progress_on_clock(
    console: Console, report: RunReport, launch: EngineLaunch, max_steps: int, poll_s: float
) -> None:
    """A progress line when PROGRESS_EVERY_S have passed since the last one (or since the engine was
    ready), less `poll_s`, how late the caller may look next: the terminal is never silent for longer,
    however slow the steps."""
    start = report.progress_said
    if launch.ready_at is not None and (start is None or start < launch.ready_at):
        start = launch.ready_at
    if start is not None and time.monotonic() - start >= PROGRESS_EVERY_S - poll_s:
        say_progress(console, report, launch, max_steps, on_clock=True)


def say_checkpoint(ctx: RunContext, step: int, name: str, reason: object, write_ms: float, stall_ms: float) -> None:
    """`checkpoint step_000200.bin (step 200; periodic, write 33 ms, stall 0 ms) | overhead 6.6% (...)`:
    the overhead is the wall time since the engine was ready that did not go to steps (goodput.py)."""
    ctx.say(
        f"checkpoint {name} (step {step}; {reason}, write {write_ms:.0f} ms, stall {stall_ms:.0f} ms) | "
        f"{overhead_summary(ctx.report.goodput.status())}"
    )


def _arm_status(ctx: RunContext) -> dict[str, ArmStatus]:
    """Per-arm figures: the bandit's own (pulls, EMA, reward), the mixture weights, the caps and floors."""
    bandit = ctx.bandit
    weights = list(bandit.weights()) if bandit is not None else [0.0] * len(ctx.arm_names)
    raw = bandit.state() if bandit is not None else {}
    arms = raw.get("arms") if isinstance(raw, dict) else None
    per_arm = arms if isinstance(arms, dict) else {}
    out = {}
    for i, name in enumerate(ctx.arm_names):
        given = per_arm.get(name)
        info = given if isinstance(given, dict) else {}
        out[name] = ArmStatus(
            pulls=int(info.get("pulls") or 0),
            ema=info.get("ema"),
            reward=info.get("reward"),
            weight=float(weights[i]),
            cap=float(ctx.caps.get(name, 1.0)),
            floor=float(ctx.floors.get(name, 0.0)),
        )
    return out


def write_run_state(ctx: RunContext, launch: EngineLaunch | None, force: bool = False) -> None:
    """Rewrite `.state.json` (at most every `state_every_s` unless `force`). StorageError (disk full, I/O
    error) is raised, as for every write; any other failure is a warning."""
    report = ctx.report
    now = time.monotonic()
    if not force and now - report.last_state_write < ctx.opts.state_every_s:
        return
    report.state_written_at(now)
    if launch is not None:
        alive = launch.engine.alive()
        rss, cpu = launch.engine.usage() if alive else (None, None)
        report.engine_usage(alive, rss, cpu)
    rates = report.progress.rates(ctx.max_steps)
    try:
        bandit_state = ctx.bandit.state() if ctx.bandit is not None else {}
    except Exception:
        bandit_state = {}
    best = (
        {"step": report.best_step, "loss": report.best_loss, "path": str(ctx.run.best)}
        if report.best_step is not None
        else None
    )
    state = RunState(
        step=last_step(launch),
        phase=ctx.phase.phase,
        policy=ctx.phase.policy,
        status=report.status,
        arms=_arm_status(ctx),
        tokens=report.tokens,
        tokens_per_s=rates.tokens_per_s,
        eta_s=rates.eta_s if report.status == "running" else None,
        last_checkpoint=report.last_ckpt_path,
        engine=report.engine,
        experiment=ctx.experiment.name,
        max_steps=ctx.max_steps,
        segment=ctx.launch_number,
        loss=report.progress.last_loss,
        loss_smoothed=report.progress.smoothed,
        best=best,
        restarts=report.restarts,
        message=report.message,
        write_failure=report.write_failure,
        dashboard=report.dashboard,
        proxy_pid=os.getpid(),
        replay_mismatch_count=report.mismatch_count,
        replay_mismatches=report.mismatches,
        dropped_arms=sorted(report.dropped_arms),
        bandit=bandit_state,
        engine_tokens_per_s=rates.engine_tokens_per_s,
        goodput=report.goodput.status(),
    )
    ctx.lock.check()  # the path still leads to the run this proxy locked
    try:
        write_state(ctx.run.state, state)
    except (OSError, ValueError, TypeError) as exc:  # not StorageError (a full disk): that stops the run
        ctx.warn(f"cannot write {ctx.run.state}: {exc}")
