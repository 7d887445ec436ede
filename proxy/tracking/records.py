"""What the tracker logs, read from the run directory's own records: `.loss.json` (through its reader,
formats/loss_log.py), `.samples.json` and `phases.json`.

A step is new when it is past the last step read or belongs to a later phase
(a pivot re-trains from its step); a step replayed after a restart is the
same step again (the proxy checks it is bit-identical) and is read once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from ..formats import bounded_json
from ..formats.loss_log import EvalEntry, StepEntry, iter_lines, parse_line
from ..formats.samples import SampleAudit, read_audits
from ..rundir.layout import RunDir
from ..rundir.phases import read_phases
from ..safe_fs import UnsafeFileError
from ..supervision.throughput import ThroughputMeter

SAMPLES_TAG = "samples"  # a sample audit's note; EVENTS_TAG a pivot's or a fork's
EVENTS_TAG = "events"
CONFIG_TAG = "config"  # the effective experiment, at step 0 (W&B takes it as the run's config instead)


@dataclass
class StepPoint:
    step: int
    phase: int
    wall: float
    scalars: dict[str, float]


@dataclass
class EvalPoint:
    step: int
    phase: int
    wall: float
    scalars: dict[str, float]


@dataclass
class Note:
    """A pivot, a fork or a sample audit, logged as text at its step."""

    step: int
    wall: float
    tag: str
    text: str
    phase: int = 0  # a pivot's new phase, a fork's current one (sinks write a note once, by their marks)
    rows: list[tuple[str, str]] = field(default_factory=list)  # a sample audit's (prompt, completion)


def step_scalars(entry: StepEntry, smoothed: float | None, tokens_per_s: float | None) -> dict[str, float]:
    out = {
        "train/loss": entry.loss,
        "train/lr": entry.lr,
        "train/grad_norm": entry.grad_norm,
        "train/tokens": float(entry.tokens),
    }
    if smoothed is not None:  # always, once a step was observed
        out["train/loss_smoothed"] = smoothed
    if tokens_per_s is not None:
        out["train/tokens_per_s"] = tokens_per_s
    out.update({f"mixture/{arm}": w for arm, w in entry.mixture.items()})
    out.update({f"train_arm/{arm}": loss for arm, loss in entry.arms.items()})
    return out


class RunRecords:
    """Follows one run directory: `poll()` returns what appeared since the last call, in file order."""

    def __init__(self, run: RunDir):
        self.run = run
        self.offset = 0  # bytes of `.loss.json` read (whole lines only)
        self.step = -1
        self.phase = 0
        self.eval_step = -1
        self.eval_phase = 0
        self.tokens: int | None = None
        self.progress = ThroughputMeter()
        self.inherited = False
        self.samples_seen = -1
        self.samples_mtime: float | None = None
        self.config_read = False

    def poll(self) -> list[StepPoint | EvalPoint | Note]:
        return self._config() + self._log() + self._samples()

    def _config(self) -> list[Note]:
        """The frozen (effective) experiment, once, as indented JSON."""
        if self.config_read:
            return []
        self.config_read = True
        try:
            text = json.dumps(bounded_json.loads(self.run.read_small(self.run.experiment)), indent=2)
        except (OSError, UnsafeFileError, ValueError, RecursionError):
            return []
        return [Note(0, time.time(), CONFIG_TAG, "```\n" + text + "\n```")]

    def _log(self) -> list[StepPoint | EvalPoint | Note]:
        out: list[StepPoint | EvalPoint | Note] = []
        if not self.run.loss_log.exists():
            return out
        for offset, line in iter_lines(self.run.loss_log, self.offset):
            if not line.endswith(b"\n"):
                break  # being written: read again next time
            self.offset = offset + len(line)
            entry = parse_line(line)
            if isinstance(entry, StepEntry):
                out += self._step(entry)
            elif isinstance(entry, EvalEntry) and (entry.step > self.eval_step or entry.phase > self.eval_phase):
                self.eval_step, self.eval_phase = entry.step, entry.phase
                scalars = {"val/loss": entry.loss}
                scalars.update({f"val/{arm}": loss for arm, loss in entry.arms.items()})
                out.append(EvalPoint(entry.step, entry.phase, entry.time, scalars))
        return out

    def _step(self, entry: StepEntry) -> list[StepPoint | Note]:
        out: list[StepPoint | Note] = []
        if entry.phase > self.phase:
            out.append(self._pivot_note(entry))
        elif entry.step <= self.step:
            return out  # replayed after a restart: read once
        if self.inherited and not entry.inherited:
            out.append(
                Note(entry.step, entry.time, EVENTS_TAG, f"fork: this run continues from step {self.step}", entry.phase)
            )
        self.inherited = entry.inherited
        rate = None
        if self.tokens is not None and entry.ms > 0 and entry.step == self.step + 1:
            rate = (entry.tokens - self.tokens) / (entry.ms / 1000.0)
        self.progress.observe(entry.time, entry.tokens, entry.step, entry.loss, entry.ms)
        self.step, self.phase, self.tokens = entry.step, entry.phase, entry.tokens
        out.append(StepPoint(entry.step, entry.phase, entry.time, step_scalars(entry, self.progress.smoothed, rate)))
        return out

    def _pivot_note(self, entry: StepEntry) -> Note:
        about = ""
        try:
            phase = next((p for p in read_phases(self.run) if p.phase == entry.phase), None)
        except Exception:  # phases.json unreadable: the note says less, the step is logged all the same
            phase = None
        if phase is not None:
            caps = ", ".join(f"{arm} {phase.floors.get(arm, 0):g}..{cap:g}" for arm, cap in phase.caps.items())
            about = f" (policy {phase.policy}; caps {caps})"
        return Note(
            entry.step, entry.time, EVENTS_TAG, f"pivot: phase {entry.phase} from step {entry.step}{about}", entry.phase
        )

    def _samples(self) -> list[Note]:
        try:
            mtime = os.stat(self.run.samples).st_mtime
        except OSError:
            return []
        if mtime == self.samples_mtime:
            return []
        self.samples_mtime = mtime
        out = []
        for audit in read_audits(self.run.samples):
            if audit.step > self.samples_seen:
                self.samples_seen = audit.step
                out.append(_audit_note(audit))
        return out


def _audit_note(audit: SampleAudit) -> Note:
    rows = [(s.prompt, s.completion) for s in audit.samples]
    text = "\n\n".join(f"**{p!r}** → {c!r}" for p, c in rows)
    return Note(audit.step, audit.time, SAMPLES_TAG, text, rows=rows)
