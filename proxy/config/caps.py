"""Caps files, and the caps and floors in force in a phase (docs/EXPERIMENTS.md, "Caps files").

A caps file is `{"caps": {"<arm>": 0.5}, "floors": {"<arm>": 0.05}}`, either
map partial: arms it does not name keep the values in force. A pivot's caps
file may also name `"policy"`. The merged maps must pass the rules in
config/bounds.py; every problem is reported on one line naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from pydantic import Field, ValidationError, model_validator

from .bounds import check_caps_floors, range_problems
from .config_file import ExperimentError, config_error, format_validation_error, quoted, read_json, short
from .experiment import Experiment, StrictModel
from .policies import POLICIES


class PhaseBounds(Protocol):
    """What a phase of phases.json (rundir/phases.py's Phase, a layer above this one) says of the bounds."""

    @property
    def policy(self) -> str: ...
    @property
    def caps(self) -> Mapping[str, float]: ...
    @property
    def floors(self) -> Mapping[str, float]: ...


class CapsFile(StrictModel):
    caps: dict[str, float] = Field(default_factory=dict)
    floors: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ranges(self) -> CapsFile:
        bad = range_problems(self.caps, self.floors)
        if bad:
            raise ValueError("; ".join(bad))
        return self


def phase_bounds(experiment: Experiment, phase: PhaseBounds | None) -> tuple[dict[str, float], dict[str, float]]:
    """The full caps and floors in force in `phase`: the experiment's, overridden by what the phase names
    (arms the experiment does not define are dropped). `phase` None: the experiment's own."""
    caps, floors = dict(experiment.caps), dict(experiment.floors)
    if phase is not None:
        caps.update({k: float(v) for k, v in phase.caps.items() if k in caps})
        floors.update({k: float(v) for k, v in phase.floors.items() if k in floors})
    return caps, floors


def apply_caps(
    caps_file: CapsFile, experiment: Experiment, path: Path | str = "<caps>", base: tuple[dict, dict] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """Merge a caps file over `base` (default: the experiment's caps and floors) and check the result."""
    names = experiment.arm_names
    caps, floors = (dict(base[0]), dict(base[1])) if base else (experiment.caps, experiment.floors)
    problems = [
        f"{kind}: unknown arm {quoted(arm)} (arms: {', '.join(names)})"
        for kind, m in (("caps", caps_file.caps), ("floors", caps_file.floors))
        for arm in m
        if arm not in names
    ]
    if problems:
        raise config_error(path, problems)
    caps.update(caps_file.caps)
    floors.update(caps_file.floors)
    problems = check_caps_floors(caps, floors)
    if problems:
        raise config_error(path, problems)
    return caps, floors


def _read_object(path: Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict):
        raise config_error(path, [f"expected a JSON object, got {type(data).__name__}"])
    return dict(data)


def _validate(path: Path, data: dict) -> CapsFile:
    try:
        return CapsFile.model_validate(data)
    except ValidationError as e:
        raise config_error(path, format_validation_error(e)) from None


def load_caps(
    path: str | os.PathLike, experiment: Experiment, base: tuple[dict, dict] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """Read a caps file; return the full (caps, floors) maps for every arm.

    Arms the file does not name keep the values in `base` (default: the
    experiment's). Unknown arm, cap below floor, floors above 1, caps below 1,
    a value outside [0, 1] or a file that is not JSON raise ExperimentError.
    """
    path = Path(path)
    return apply_caps(_validate(path, _read_object(path)), experiment, path, base)


def load_pivot_caps(
    path: str | os.PathLike, experiment: Experiment, phase: PhaseBounds | None
) -> tuple[dict[str, float], dict[str, float], str]:
    """A pivot's caps file over the bounds in force in `phase`: (caps, floors, policy) for every arm.

    Besides `caps` and `floors` it may name `"policy"` (default: the phase's,
    or the experiment's without a phase). Raises ExperimentError (one line
    naming the file).
    """
    path = Path(path)
    data = _read_object(path)
    current = phase.policy if phase is not None else experiment.bandit.policy
    policy = data.pop("policy", current)
    if policy not in POLICIES:
        raise config_error(path, [f"policy: expected one of {', '.join(map(repr, POLICIES))}, got {short(policy)}"])
    caps, floors = apply_caps(_validate(path, data), experiment, path, phase_bounds(experiment, phase))
    return caps, floors, str(policy)


def check_request(request: dict, experiment: Experiment) -> tuple[dict, dict, str]:
    """The caps, floors and policy of a pivot request (`.pivot_request.json`), checked again: a request file
    is input too. Raises ExperimentError saying what is wrong."""
    names = experiment.arm_names
    try:
        caps = {str(k): float(v) for k, v in dict(request["caps"]).items()}
        floors = {str(k): float(v) for k, v in dict(request["floors"]).items()}
        policy = str(request.get("policy") or experiment.bandit.policy)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExperimentError(f"malformed pivot request ({exc})") from None
    if set(caps) != set(names) or set(floors) != set(names):
        raise ExperimentError(
            f"pivot request names arms {short(sorted(set(caps) | set(floors)))}, the experiment {sorted(names)}"
        )
    problems = check_caps_floors(caps, floors)
    if policy not in POLICIES:
        problems.append(f"unknown policy {quoted(policy)}")
    if problems:
        raise ExperimentError("bad pivot request: " + "; ".join(problems))
    return caps, floors, policy
