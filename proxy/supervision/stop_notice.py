"""The line a stop request is answered with at once: what the engine finishes before it exits, and roughly
how long that takes, from this launch's recent step times (docs/CLI.md, "Signals")."""

from __future__ import annotations

import statistics

from .launch import EngineLaunch
from .throughput import fmt_duration

RECENT_STEPS = 8  # the step intervals the estimate goes by: the last few, so a machine that slowed down counts


def stop_notice(launch: EngineLaunch, ckpt_ms: float, now: float) -> str:
    """`stop requested: the engine ... and exits (...)` for a stop taken at monotonic time `now`; `ckpt_ms`: the
    slowest checkpoint write seen (the exit writes one)."""
    return f"stop requested: the engine {launch.in_flight()} and exits ({_estimate(launch, ckpt_ms, now)})"


def _estimate(launch: EngineLaunch, ckpt_ms: float, now: float) -> str:
    write = f", then a checkpoint write ({seconds(ckpt_ms / 1000)} the slowest so far)" if ckpt_ms > 0 else ""
    head = launch.outstanding[0] if launch.outstanding else None
    if head is None or head.kind != "step":  # an audit is given up between two tokens; no step is computing
        return "no step to finish" + write
    recent = list(launch.step_walls)[-RECENT_STEPS:]
    if launch.last_step_wall is not None and recent:
        per_step = statistics.median(recent)
        since = now - launch.last_step_wall
    elif launch.last_step_wall is not None and launch.ready_at is not None:
        per_step = launch.last_step_wall - launch.ready_at  # the launch's first step is all there is to go by
        since = now - launch.last_step_wall
    else:
        return "no step of this launch has finished yet, so no estimate" + write
    left = per_step - since
    to_go = f"about {seconds(left)} to go" if left > 0 else f"this one has taken {seconds(since)} so far"
    return f"a step takes about {seconds(per_step)} here, {to_go}" + write


def seconds(x: float) -> str:
    """A duration as a person reads it: 0.041s, 7.5s, 42s, 3m05s."""
    if x < 0.01:
        return "under 0.01s"
    if x < 10:
        return f"{x:.2g}s" if x < 1 else f"{x:.1f}s"
    return f"{x:.0f}s" if x < 60 else fmt_duration(x)
