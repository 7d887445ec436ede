"""`.state.json`: the run's snapshot, an atomic rewrite (docs/FORMATS.md).

`.state.json` is a snapshot for people and the dashboard; the proxy never
trusts it over `.loss.json` (the bandit is rebuilt from the log). It is read
back only to carry reports forward (replay mismatches, restarts, dropped
arms) and to update it where no proxy runs (a finished run, an offline
pivot). Every writer writes a RunState, so every `.state.json` has one shape.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import overload

from ..atomic import atomic_write_bytes, json_bytes, overwrite_in_place
from ..errors import FULL_DISK, StorageError
from ..run_names import READ_LIMITS, STATE
from ..safe_fs import UnsafeFileError, read_regular
from . import bounded_json

STATUSES = ("running", "stopped", "finished", "crashloop", "diverged")


def _known(cls: type, obj: dict) -> dict:
    """The entries of `obj` that are fields of the dataclass `cls`."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in obj.items() if k in names}


@dataclass
class ArmStatus:
    pulls: int = 0
    ema: float | None = None
    reward: float | None = None
    weight: float = 0.0
    cap: float = 1.0
    floor: float = 0.0


@dataclass
class EngineStatus:
    kind: str | None = None
    device: str | None = None
    pid: int | None = None
    alive: bool = False
    rss_bytes: int | None = None
    cpu_percent: float | None = None
    mem_bytes: int | None = None
    path: str | None = None
    threads: int | None = None
    precision: str | None = None
    version: str | None = None  # the ready event's: the engine's version
    source: str | None = None  # the ready event's: `git describe` of the source the binary was built from
    n_params: int | None = None  # the ready event's: the model's parameter count
    ranks: int = 1  # data-parallel ranks (the engine's `ready` event says how many started)


AUDIT_KINDS = ("sample", "eval", "checkpoint")  # what the engine does between steps, besides training


@dataclass
class AuditTime:
    """One kind of audit: how many, and the seconds the engine's step loop spent on them."""

    count: int = 0
    s: float = 0.0


@dataclass
class Goodput:
    """Where the wall-clock time of `proxy run` went, from its first engine's `ready` event to the last event
    its engines sent (work in flight is not yet counted).

    `step_s` is the engine's step compute (the step events' `ms`); each audit kind's
    seconds are the engine's own timing of it (a sample or eval event's `ms`; a
    checkpoint's `snapshot_ms + wait_ms`, the step loop's stall while the write runs in
    the background); `other_s` is the rest: frames the engine waited for, engine
    restarts, the last checkpoint's wait at exit. `tokens_per_s` is `tokens / wall_s`.
    """

    wall_s: float = 0.0
    step_s: float = 0.0
    steps: int = 0
    tokens: int = 0
    audits: dict[str, AuditTime] = field(default_factory=lambda: {k: AuditTime() for k in AUDIT_KINDS})
    other_s: float = 0.0
    overhead: float | None = None  # 1 - step_s / wall_s; null before the first step
    tokens_per_s: float | None = None

    @classmethod
    def from_dict(cls, obj: object) -> Goodput | None:
        """The account as read back from `.state.json`, or None unless its figures are numbers (the
        snapshot is never trusted)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("audits"), dict):
            return None
        try:
            audits = {
                str(k): AuditTime(count=int(_number(a["count"])), s=_number(a["s"])) for k, a in obj["audits"].items()
            }
            return cls(
                wall_s=_number(obj["wall_s"]),
                step_s=_number(obj["step_s"]),
                steps=int(_number(obj["steps"])),
                tokens=int(_number(obj["tokens"])),
                audits=audits,
                other_s=_number(obj["other_s"]),
                overhead=_number_or_null(obj["overhead"]),
                tokens_per_s=_number_or_null(obj["tokens_per_s"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _number(value: object) -> float:
    """A finite JSON number; anything else is a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def _number_or_null(value: object) -> float | None:
    """A finite JSON number or null; anything else is a ValueError."""
    return None if value is None else _number(value)


@dataclass
class RunState:
    """Every field of FORMATS.md's `.state.json`, plus the proxy's reports."""

    step: int = 0
    phase: int = 0
    policy: str = ""
    status: str = "running"
    arms: dict[str, ArmStatus] = field(default_factory=dict)
    tokens: int = 0
    tokens_per_s: float | None = None  # wall clock, over the last few minutes (goodput)
    eta_s: float | None = None
    last_checkpoint: str | None = None
    engine: EngineStatus = field(default_factory=EngineStatus)
    updated: float = field(default_factory=time.time)
    # beyond FORMATS.md's list
    engine_tokens_per_s: float | None = None  # the engine's step compute alone, over the same steps
    goodput: Goodput | None = None
    experiment: str = ""
    max_steps: int = 0
    segment: int = 0
    loss: float | None = None
    loss_smoothed: float | None = None
    best: dict | None = None  # {"step", "loss", "path"}
    restarts: int = 0
    message: str | None = None
    write_failure: dict | None = None  # {"path", "errno", "error"}: the write whose failure stopped the run
    dashboard: dict | None = None  # {"url", "host"} of the dashboard `proxy run` started
    proxy_pid: int | None = None
    replay_mismatch_count: int = 0
    replay_mismatches: list[dict] = field(default_factory=list)  # newest last, at most 50
    dropped_arms: list[str] = field(default_factory=list)
    bandit: dict = field(default_factory=dict)  # the bandit's own state()
    extra: dict = field(default_factory=dict)  # fields written beside these (a fork's `fork`), kept as read

    def to_dict(self) -> dict:
        out = asdict(self)
        extra = out.pop("extra")
        out.update({k: v for k, v in extra.items() if k not in out})
        return finite_json(out)

    @classmethod
    def from_dict(cls, obj: dict) -> RunState:
        """A snapshot as read back: known fields as written (not validated: it is never trusted), arms and
        engine as their dataclasses, anything else in `extra`."""
        values = _known(cls, obj)
        values.pop("extra", None)
        arms = values.get("arms")
        values["arms"] = (
            {str(n): ArmStatus(**_known(ArmStatus, a)) for n, a in arms.items() if isinstance(a, dict)}
            if isinstance(arms, dict)
            else {}
        )
        engine = values.get("engine")
        values["engine"] = EngineStatus(**_known(EngineStatus, engine)) if isinstance(engine, dict) else EngineStatus()
        values["goodput"] = Goodput.from_dict(values.get("goodput"))
        return cls(**values, extra={k: v for k, v in obj.items() if k not in values})


@overload  # a dict stays a dict
def finite_json(obj: dict) -> dict: ...
@overload
def finite_json(obj: object) -> object: ...
def finite_json(obj: object) -> object:
    """`obj` with every NaN and infinity as None (null): JSON has neither, so strict readers refuse them."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {str(k): finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return finite_json(obj.item())
    if hasattr(obj, "tolist"):  # numpy array
        return finite_json(obj.tolist())
    return obj


def write_state(path: str | os.PathLike, state: RunState) -> None:
    """Replace `path` atomically with `state`, stamped `updated` now. On a full disk, where no temp file can
    be made, the snapshot is written over the old one in place if it fits in its blocks (so that a run
    stopped by the full disk says so); StorageError otherwise."""
    data = json_bytes(replace(state, updated=time.time()).to_dict())
    try:
        atomic_write_bytes(path, data)
    except StorageError as exc:
        if exc.errno not in FULL_DISK or not overwrite_in_place(path, data):
            raise


def read_state(path: str | os.PathLike) -> dict | None:
    """The last snapshot as a plain dict, or None if absent or unreadable. A name that is not a regular
    file within its size cap (a FIFO, a device, a symlink out of the run) raises UnsafeFileError."""
    path = Path(path)
    try:
        obj = bounded_json.loads(read_regular(path, READ_LIMITS[STATE], within=path.parent))
    except UnsafeFileError:
        raise
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def load_state(path: str | os.PathLike) -> RunState | None:
    """The last snapshot as a RunState, or None if absent or unreadable."""
    obj = read_state(path)
    return RunState.from_dict(obj) if obj is not None else None
