"""The goodput account of `proxy run`: wall-clock time against what the engine reports it spent.

The clock starts at the first `ready` event of this proxy (data preparation and
the engine's start-up are before it), runs through engine restarts, and stops
at the last event the engine sent: work still in flight (a step taking minutes
on a CPU) is not counted as overhead before its event says what it was, and
there is no figure before the first step. The
engine times its own work in its events, so the split needs no guessing: a
step event's `ms` is step compute; a sample or eval event's `ms` is that
audit; a ckpt event's `snapshot_ms + wait_ms` is what the checkpoint cost the
step loop (the write itself runs in the background). Whatever is left is
`other`: frames the engine waited for, restarts, the wait for the last write
at exit. `.state.json` carries the result (formats/state.py, `Goodput`).
"""

from __future__ import annotations

from ..formats.state import AUDIT_KINDS, AuditTime, Goodput


def checkpoint_stall_ms(fields: dict) -> float:
    """The step loop's time on one checkpoint, from its ckpt event: the snapshot and the wait for the
    previous write (an engine that writes synchronously reports neither: then the whole write)."""
    if "snapshot_ms" in fields or "wait_ms" in fields:
        return float(fields.get("snapshot_ms") or 0.0) + float(fields.get("wait_ms") or 0.0)
    return float(fields.get("ms") or 0.0)


class GoodputMeter:
    """Fed the engine's events as they come (`seen(when)` with the monotonic time each was read, then what
    it reports); `status()` is the account up to the last event seen."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.until: float | None = None  # the last event seen
        self.step_ms = 0.0
        self.steps = 0
        self.tokens = 0
        self.audit_ms = {kind: 0.0 for kind in AUDIT_KINDS}
        self.audit_count = {kind: 0 for kind in AUDIT_KINDS}

    def ready(self, now: float) -> None:
        """An engine is ready: the clock starts at the first one and keeps running through restarts."""
        if self.started is None:
            self.started = now
        self.seen(now)

    def seen(self, when: float) -> None:
        """An event read at `when`: the account runs up to it."""
        if self.until is None or when > self.until:
            self.until = when

    def step(self, ms: float, tokens: int) -> None:
        self.step_ms += ms
        self.steps += 1
        self.tokens += tokens

    def audit(self, kind: str, ms: float) -> None:
        self.audit_ms[kind] += ms
        self.audit_count[kind] += 1

    def status(self) -> Goodput | None:
        """The account up to the last event; None before an engine was ready. The overhead (and the
        tokens/s) stay unknown until a step was trained: before that there is nothing to compare with."""
        if self.started is None or self.until is None:
            return None
        wall_s = max(0.0, self.until - self.started)
        step_s = self.step_ms / 1000.0
        audits = {k: AuditTime(count=self.audit_count[k], s=self.audit_ms[k] / 1000.0) for k in AUDIT_KINDS}
        other_s = wall_s - step_s - sum(a.s for a in audits.values())
        measured = wall_s > 0 and self.steps > 0
        return Goodput(
            wall_s=wall_s,
            step_s=step_s,
            steps=self.steps,
            tokens=self.tokens,
            audits=audits,
            other_s=other_s,
            overhead=1.0 - step_s / wall_s if measured else None,
            tokens_per_s=self.tokens / wall_s if measured else None,
        )


def overhead_summary(goodput: Goodput | None) -> str:
    """`overhead 8.1% (sample 3.0%, eval 5.0%, checkpoint 0.1%, other 0.0%)`: shares of the wall time."""
    if goodput is None or not goodput.wall_s > 0 or goodput.overhead is None:
        return "overhead ? (no step yet)"
    shares = [(k, a.s) for k, a in goodput.audits.items()] + [("other", goodput.other_s)]
    return f"overhead {goodput.overhead:.1%} (" + ", ".join(f"{k} {s / goodput.wall_s:.1%}" for k, s in shares) + ")"
