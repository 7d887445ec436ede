"""`.loss.json`: JSON Lines, append-only (docs/FORMATS.md).

Writing: one `write(2)` per whole line, so a killed proxy loses at most the
line being written; fsync at every checkpoint and every few seconds. On open,
a file that does not end in "\n" (a torn last line) gets a "\n" first, so the
torn fragment stays a line of its own that readers skip.

Reading: any line that is not a complete JSON object of a known type is
skipped; for a step seen twice the last entry wins. The index keeps byte
offsets, not entries, so a run of a million steps replays in little memory.

A step line's fields are declared once, in step_fields.py (the field table).

Reading for display (the dashboard): every field is checked on its own; a
malformed value becomes NaN and an entry whose step is not a non-negative
integer is dropped (`step_fields`, `eval_fields`), so one bad field never hides
the rest of a plotted entry. Both readers keep at most MAX_ARMS arms of
MAX_NAME characters, the bounds the experiment schema enforces.

Replay: the bandit is rebuilt from the per-arm losses of the steps of the
current phase; steps re-trained after a restart are compared with the entries
the crashed segment left behind (`compare_replayed`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ..atomic import append_whole, open_append, sync_fd
from ..divergence import lowest_bound
from ..run_names import LOSS_LINE_LIMIT
from ..safe_fs import capped_lines, open_regular
from . import bounded_json
from .step_fields import COMPARED_FIELDS, NAN, StepEntry, StepFields, arm_map, num, step_fields, step_of  # noqa: F401


@dataclass
class EvalEntry:
    step: int
    loss: float
    arms: dict[str, float]
    time: float
    phase: int
    segment: int
    inherited: bool = False

    def to_dict(self) -> dict:
        out = {
            "type": "eval",
            "step": self.step,
            "loss": self.loss,
            "arms": self.arms,
            "time": self.time,
            "phase": self.phase,
            "segment": self.segment,
        }
        if self.inherited:
            out["inherited"] = True
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> EvalEntry:
        return cls(
            step=int(obj["step"]),
            loss=float(obj["loss"]),
            arms={str(k): float(v) for k, v in dict(obj.get("arms") or {}).items()},
            time=float(obj.get("time", 0.0)),
            phase=int(obj.get("phase", 0)),
            segment=int(obj.get("segment", 0)),
            inherited=bool(obj.get("inherited", False)),
        )


def eval_loss(parts: Iterable[tuple[float, float]]) -> float:
    """An eval entry's `loss`: the (loss, tokens) of each arm, weighted by tokens, summed in the order given."""
    parts = list(parts)
    total = sum(t for _, t in parts)
    return sum(loss * t for loss, t in parts) / total


_KINDS: dict[object, type[StepEntry] | type[EvalEntry]] = {"step": StepEntry, "eval": EvalEntry}


def parse_line(line: bytes | str) -> StepEntry | EvalEntry | None:
    """One line of the log, or None for anything that is not a complete known entry."""
    try:
        obj = bounded_json.loads(line)
        kind = _KINDS.get(obj.get("type")) if isinstance(obj, dict) else None
        return kind.from_dict(obj) if kind else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


# ---------------------------------------------------------------- writing


def encode_line(obj: dict) -> bytes:
    """One entry as a whole line of the log."""
    return (json.dumps(obj, separators=(", ", ": "), allow_nan=False) + "\n").encode("utf-8")


class LossLogWriter:
    """Appends whole lines (atomic.py: a failed append leaves no torn line and raises StorageError);
    fsyncs on demand and at most `fsync_every` seconds apart."""

    def __init__(self, path: str | os.PathLike, fsync_every: float = 5.0):
        self.path = Path(path)
        self.fsync_every = fsync_every
        self.fd = open_append(self.path)
        self.dirty = False
        self.last_fsync = time.monotonic()
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":  # a torn last line: never glue the next entry onto it
            append_whole(self.fd, b"\n", self.path)
            self.dirty = True

    def append(self, entry: StepEntry | EvalEntry) -> None:
        append_whole(self.fd, encode_line(entry.to_dict()), self.path)
        self.dirty = True

    def fsync(self) -> None:
        if self.dirty:
            sync_fd(self.fd, self.path)
            self.dirty = False
        self.last_fsync = time.monotonic()

    def maybe_fsync(self) -> None:
        if self.dirty and time.monotonic() - self.last_fsync >= self.fsync_every:
            self.fsync()

    def close(self) -> None:
        """fsync and close; the descriptor is closed even when the fsync fails (and that is raised)."""
        if self.fd >= 0:
            try:
                self.fsync()
            finally:
                os.close(self.fd)
                self.fd = -1


# ---------------------------------------------------------------- reading


def open_log(path: str | os.PathLike) -> BinaryIO:
    """The log opened for reading by safe_fs's rules (a regular file, no symlink out of its directory)."""
    return open_regular(path, None, within=Path(path).parent)


def read_raw_line(f: BinaryIO, offset: int) -> bytes:
    """The line at byte `offset`; b"" past the end, or when it is longer than LOSS_LINE_LIMIT."""
    f.seek(offset)
    line = f.readline(LOSS_LINE_LIMIT + 1)
    return line if len(line) <= LOSS_LINE_LIMIT else b""


def read_line(f: BinaryIO, offset: int) -> StepEntry | EvalEntry | None:
    """The entry on the line at byte `offset` (None if it is not one, or is longer than LOSS_LINE_LIMIT)."""
    return parse_line(read_raw_line(f, offset))


def iter_lines(path: str | os.PathLike, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(offset, line bytes) for every line from byte `start` (the last may be unterminated); a line
    longer than LOSS_LINE_LIMIT is skipped, as no entry is ever that long."""
    with open_log(path) as f:
        yield from capped_lines(f, LOSS_LINE_LIMIT, start)


def _lowest(table: dict[int, int], key: int, value: int) -> None:
    if key not in table or value < table[key]:
        table[key] = value


@dataclass
class LossLogIndex:
    """Where the last entry of each step lives (byte offsets), plus a little summary."""

    path: Path
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # step -> (offset, phase)
    evals: dict[int, int] = field(default_factory=dict)  # step -> offset
    phase_first: dict[int, int] = field(default_factory=dict)  # phase -> the lowest step of any entry in it
    phase_first_step: dict[int, int] = field(default_factory=dict)  # phase -> the lowest step entry's step
    # step -> its last entry's loss, only where that loss may not be sane for some model (above the lowest
    # bound, or not finite): few entries in a healthy run; the resume rule asks whether a step diverged
    high_losses: dict[int, float] = field(default_factory=dict)
    max_segment: int = 0
    skipped: int = 0

    @classmethod
    def load(cls, path: str | os.PathLike) -> LossLogIndex:
        index = cls(Path(path))
        if not index.path.exists():
            return index
        lowest = lowest_bound()
        for offset, line in iter_lines(index.path):
            if not line.strip():
                continue
            entry = parse_line(line)
            if entry is None:
                index.skipped += 1
                continue
            index.max_segment = max(index.max_segment, entry.segment)
            _lowest(index.phase_first, entry.phase, entry.step)
            if isinstance(entry, StepEntry):
                _lowest(index.phase_first_step, entry.phase, entry.step)
                index.steps[entry.step] = (offset, entry.phase)
                if not entry.loss <= lowest:  # NaN included
                    index.high_losses[entry.step] = entry.loss
                else:
                    index.high_losses.pop(entry.step, None)
            else:
                index.evals[entry.step] = offset
        return index

    def _read(self, offset: int) -> StepEntry | EvalEntry | None:
        with open_log(self.path) as f:
            return read_line(f, offset)

    def step(self, step: int) -> StepEntry | None:
        where = self.steps.get(step)
        entry = self._read(where[0]) if where else None
        return entry if isinstance(entry, StepEntry) else None

    def eval(self, step: int) -> EvalEntry | None:
        offset = self.evals.get(step)
        entry = self._read(offset) if offset is not None else None
        return entry if isinstance(entry, EvalEntry) else None

    def iter_steps(self, first: int, last: int) -> Iterator[tuple[int, StepEntry | None]]:
        """Last entries of steps first..last in step order (a missing step yields None, as does an offset
        that no longer holds a step entry: the log changed since it was indexed)."""
        with open_log(self.path) as f:
            for s in range(first, last + 1):
                where = self.steps.get(s)
                entry = read_line(f, where[0]) if where is not None else None
                yield s, entry if isinstance(entry, StepEntry) else None

    def gap(self, phase: int, after: int, through: int) -> tuple[int, int | None]:
        """(how many steps in (after, through] have no last entry of `phase`, the first of them or None).
        Time and memory go by the entries the log holds, never by the distance between the two steps (a
        stray step_3000000000.bin asks about three billion steps)."""
        if through <= after:
            return 0, None
        held = sum(1 for s, (_offset, p) in self.steps.items() if after < s <= through and p == phase)
        count = (through - after) - held
        if count == 0:
            return 0, None
        first = after + 1
        while first in self.steps and self.steps[first][1] == phase:  # at most `held` steps on
            first += 1
        return count, first

    def first_diverged(self, phase: int, after: int, through: int, sane: Callable[[float], bool]) -> int | None:
        """The first step in (after, through] whose last entry is of `phase` and whose loss `sane(loss)`
        refuses, or None."""
        bad = [
            s
            for s, loss in self.high_losses.items()
            if after < s <= through and self.steps[s][1] == phase and not sane(loss)
        ]
        return min(bad, default=None)

    def max_step(self) -> int:
        return max(self.steps, default=0)


def read_tail(path: str | os.PathLike, max_bytes: int = 1 << 20) -> list[StepEntry | EvalEntry]:
    """The complete entries in the last `max_bytes` of the log, in file order."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        return []
    start = max(0, size - max_bytes)
    out = []
    for i, (_offset, line) in enumerate(iter_lines(path, start)):
        if i == 0 and start > 0:
            continue  # probably a partial line
        entry = parse_line(line)
        if entry is not None:
            out.append(entry)
    return out


# ---------------------------------------------------------------- reading for display


class EvalFields(NamedTuple):
    step: int
    loss: float
    arms: dict
    time: float


def eval_fields(obj: dict) -> EvalFields | None:
    """An eval entry's plotted fields (None: not an eval entry, or no usable step)."""
    if obj.get("type") != "eval":
        return None
    step = step_of(obj.get("step"))
    if step is None:
        return None
    return EvalFields(step, num(obj.get("loss")), arm_map(obj.get("arms")), num(obj.get("time")))


# ---------------------------------------------------------------- replay


@dataclass
class ReplayMismatch:
    """A step re-trained after a restart that differs from the crashed segment's entry."""

    step: int
    recorded_segment: int
    replayed_segment: int
    fields: list[str]
    recorded: dict
    replayed: dict
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "recorded_segment": self.recorded_segment,
            "replayed_segment": self.replayed_segment,
            "fields": self.fields,
            "recorded": self.recorded,
            "replayed": self.replayed,
            "time": self.time,
        }

    def message(self) -> str:
        parts = [f"{f} {self.replayed.get(f)!r} != {self.recorded.get(f)!r}" for f in self.fields]
        return (
            f"determinism: step {self.step} replayed in segment {self.replayed_segment} differs "
            f"from segment {self.recorded_segment}: " + "; ".join(parts)
        )


def compare_replayed(recorded: StepEntry, replayed: StepEntry) -> ReplayMismatch | None:
    """Bitwise comparison (floats parse from the same 9-digit text, so == is exact)."""
    a, b = recorded.to_dict(), replayed.to_dict()
    differ = [f for f in COMPARED_FIELDS if a.get(f) != b.get(f)]
    if not differ:
        return None
    return ReplayMismatch(
        step=replayed.step,
        recorded_segment=recorded.segment,
        replayed_segment=replayed.segment,
        fields=differ,
        recorded={f: a.get(f) for f in differ},
        replayed={f: b.get(f) for f in differ},
    )
