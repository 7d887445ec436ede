"""phases.json: the run's phases, an append-only list (docs/FORMATS.md, docs/OPERATIONS.md "Pivot").

Phase 0 is written when the run is created; each pivot appends one. Steps
`start_step + 1` onwards belong to a phase, until the next one starts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..atomic import atomic_write_bytes, json_bytes
from .layout import PHASES, READ_LIMITS, RunDir, RunDirError

if TYPE_CHECKING:  # for annotations only: readers of phases.json need not load the schema (pydantic)
    from ..config.experiment import Experiment


@dataclass
class Phase:
    """One entry of phases.json (docs/FORMATS.md)."""

    phase: int
    start_step: int
    policy: str
    caps: dict[str, float]
    floors: dict[str, float]
    time: float = field(default_factory=time.time)
    checkpoint: str | None = None

    @classmethod
    def from_dict(cls, obj: dict) -> Phase:
        try:
            return cls(
                phase=int(obj["phase"]),
                start_step=int(obj["start_step"]),
                policy=str(obj["policy"]),
                caps={str(k): float(v) for k, v in dict(obj.get("caps") or {}).items()},
                floors={str(k): float(v) for k, v in dict(obj.get("floors") or {}).items()},
                time=float(obj.get("time") or 0.0),
                checkpoint=obj.get("checkpoint"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(f"phases.json: malformed phase entry ({exc})") from None

    def to_dict(self) -> dict:
        return asdict(self)

    def contains(self, step: int) -> bool:
        """Steps after the phase's start belong to it (the start step is the previous phase's last)."""
        return step > self.start_step


def read_phases(run: RunDir) -> list[Phase]:
    try:
        obj = run.read_json(run.phases)
    except FileNotFoundError:
        return []
    if not isinstance(obj, list):
        raise RunDirError(f"{run.phases}: not a JSON list")
    phases = [Phase.from_dict(p) for p in obj]
    for i, p in enumerate(phases):
        if p.phase != i:
            raise RunDirError(f"{run.phases}: phase {i} is numbered {p.phase}")
    return phases


def encode_phases(run: RunDir, phases: list[Phase]) -> bytes:
    """phases.json's bytes; RunDirError when they would outgrow what its readers take (READ_LIMITS)."""
    data = json_bytes([p.to_dict() for p in phases])
    if len(data) > READ_LIMITS[PHASES]:
        raise RunDirError(
            f"{run.phases}: {len(phases)} phases would take {len(data)} bytes, more than the "
            f"{READ_LIMITS[PHASES]} it may have; no more pivots fit"
        )
    return data


def write_phases(run: RunDir, phases: list[Phase]) -> None:
    atomic_write_bytes(run.phases, encode_phases(run, phases))


def first_phase(experiment: Experiment) -> Phase:
    """Phase 0 from the experiment's arms and bandit policy."""
    return Phase(
        phase=0,
        start_step=0,
        policy=experiment.bandit.policy,
        caps={a.name: float(a.cap) for a in experiment.arms},
        floors={a.name: float(a.floor) for a in experiment.arms},
    )


def owned_steps(phases: list[Phase], through: int) -> list[tuple[Phase, int, int]]:
    """Which phase owns which of the steps 1..through: (phase, first, last) in step order. A phase owns
    the steps from its start_step + 1 until the next phase starts (a pivot at k: steps <= k belong to the
    phases before it; of two pivots at the same step, the later owns the steps)."""
    out = []
    for i, p in enumerate(phases):
        end = phases[i + 1].start_step if i + 1 < len(phases) else through
        first, last = p.start_step + 1, min(end, through)
        if first <= last:
            out.append((p, first, last))
    return out


def ensure_phases(run: RunDir, experiment: Experiment, provisional: bool = False) -> list[Phase]:
    """phases.json with phase 0 written at run creation (again, from this experiment, while `provisional`:
    no step trained yet); returns the list."""
    phases = read_phases(run)
    fresh = first_phase(experiment)
    stale = (
        provisional
        and len(phases) == 1
        and (phases[0].policy, phases[0].caps, phases[0].floors) != (fresh.policy, fresh.caps, fresh.floors)
    )
    if not phases or stale:
        phases = [fresh]
        write_phases(run, phases)
    return phases


def next_phase(
    phases: list[Phase], start_step: int, policy: str, caps: dict, floors: dict, checkpoint: str | None
) -> Phase:
    """The phase a pivot appends to `phases`."""
    return Phase(
        phase=len(phases),
        start_step=start_step,
        policy=policy,
        caps=dict(caps),
        floors=dict(floors),
        checkpoint=checkpoint,
    )


def append_phase(run: RunDir, start_step: int, policy: str, caps: dict, floors: dict, checkpoint: str | None) -> Phase:
    """The seam for `proxy pivot`: append a new phase (the list is only ever appended to)."""
    phases = read_phases(run)
    phase = next_phase(phases, start_step, policy, caps, floors, checkpoint)
    write_phases(run, phases + [phase])
    return phase
