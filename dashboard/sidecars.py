"""Read the run directory's small files: .state.json, phases.json, .samples.json,
experiment.json, and the checkpoint list. Each read is size-capped and any
malformed content reads as None (the page shows "unknown"), never an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

from proxy.formats import bounded_json
from proxy.formats.checkpoint import checkpoint_step
from proxy.formats.samples import MAX_TEXT
from proxy.rundir.layout import BEST, CHECKPOINTS, EXPERIMENT, OVERRIDES, PHASES, READ_LIMITS, SAMPLES, STATE
from proxy.rundir.overrides_record import OverridesRecord

from .run_files import read_small, scan_dir

LIMITS = {name: READ_LIMITS[name] for name in (STATE, PHASES, SAMPLES, EXPERIMENT, OVERRIDES)}  # the proxy's own caps
MAX_AUDITS = 20  # newest sample audits kept
MAX_SAMPLES_PER_AUDIT = 16
MAX_PHASES = 1000
MAX_CHECKPOINTS = 2000


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(name)


def read_json(root: Path, name: str) -> object:
    data = read_small(root, name, LIMITS[name])
    if data is None:
        return None
    try:
        return bounded_json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None


def read_state(root: Path) -> dict | None:
    obj = read_json(root, STATE)
    return obj if isinstance(obj, dict) else None


def read_phases(root: Path) -> list[dict] | None:
    obj = read_json(root, PHASES)
    if not isinstance(obj, list):
        return None
    return [p for p in obj if isinstance(p, dict)][-MAX_PHASES:]


def _text(v: object) -> str:
    s = v if isinstance(v, str) else ("" if v is None else json.dumps(v)[:MAX_TEXT])
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "…"


def read_samples(root: Path) -> list[dict] | None:
    """Newest audits last, each {"step", "time", "samples": [{"prompt", "completion"}]}."""
    obj = read_json(root, SAMPLES)
    if not isinstance(obj, list):
        return None
    out = []
    for audit in obj[-MAX_AUDITS:]:
        if not isinstance(audit, dict):
            continue
        given = audit.get("samples")
        samples = given if isinstance(given, list) else []
        out.append(
            {
                "step": audit.get("step") if isinstance(audit.get("step"), int) else None,
                "time": audit.get("time") if isinstance(audit.get("time"), (int, float)) else None,
                "samples": [
                    {"prompt": _text(s.get("prompt")), "completion": _text(s.get("completion"))}
                    for s in samples[:MAX_SAMPLES_PER_AUDIT]
                    if isinstance(s, dict)
                ],
            }
        )
    return out


def read_experiment(root: Path) -> dict | None:
    obj = read_json(root, EXPERIMENT)
    return obj if isinstance(obj, dict) else None


def read_overrides(root: Path) -> list[str] | None:
    """The `--set` overrides of the run's last launch (.overrides.json, proxy/rundir/overrides_record.py)."""
    obj = read_json(root, OVERRIDES)
    try:
        return OverridesRecord.model_validate(obj).overrides if obj is not None else None
    except ValueError:  # pydantic's ValidationError is one
        return None


def list_checkpoints(root: Path) -> list[dict]:
    """Checkpoint files (step_NNNNNN.bin, best.bin), newest step first. Temp files are not listed."""
    out = []
    for e in scan_dir(root, CHECKPOINTS):
        step = checkpoint_step(e.name)
        if step is None and e.name != BEST:
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not e.is_file(follow_symlinks=False):
            continue
        out.append({"name": e.name, "step": step, "bytes": st.st_size, "mtime": st.st_mtime})
    out.sort(key=lambda c: (c["step"] is None, c["step"] or 0), reverse=True)  # best.bin, then newest
    return out[:MAX_CHECKPOINTS]
