"""`proxy verify`: every checkpoint of a run checked, and the one the next launch would resume from (docs/CLI.md).

Each `checkpoints/step_*.bin` and `best.bin` is read whole and checked as the
engine's loader checks it (size, trailer, CRC-32, shape against the run's
experiment), and a step file's header must hold the step its name says.
Verdicts: `valid`, `unverified` (a bare ANDREA file: it loads, but has no
checksum; a resume passes it over), `corrupt` (the reason follows). The
resume point comes from the proxy's one resume rule (rundir/resume.py). Exit
1 when any checkpoint is corrupt. Only reads: safe on a live run (a file its
retention deletes meanwhile is reported as gone, not as corrupt).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from ..config.experiment import Experiment
from ..errors import EXIT_FAILURE, EXIT_OK, ProxyError
from ..formats.checkpoint import (
    CheckpointError,
    header_step,
    list_checkpoints,
    misnamed,
    read_checkpoint,
    read_trailer,
    verify_checkpoint,
)
from ..formats.loss_log import LossLogIndex
from ..rundir.data import problems as data_problems
from ..rundir.data import read_definition
from ..rundir.foreign import experiment_shape, foreign_checkpoints, foreign_reason
from ..rundir.frozen import load_frozen_experiment
from ..rundir.layout import RunDir, RunDirError
from ..rundir.phases import read_phases
from ..rundir.resume import choose_resume
from .which_run import resolve_run

VALID, UNVERIFIED, CORRUPT, GONE = "valid", "unverified", "corrupt", "gone"


@dataclass
class CheckpointVerdict:
    name: str  # relative to the run directory
    verdict: str
    step: int | None
    reason: str | None = None
    refused: bool = False  # the engine refuses to load it (another model shape): a launch falls back past it


def check_file(path: Path, run: RunDir, experiment: Experiment) -> CheckpointVerdict:
    """One checkpoint's verdict: does it read and verify, and is it the run's model."""
    name = _name(path)
    reason = verify_checkpoint(path)
    if reason is not None and not path.exists():
        return CheckpointVerdict(name, GONE, None, "deleted while verifying (the live run's retention)")
    step = header_step(path)
    trailer = read_trailer(path) if reason is None else None
    if trailer is not None:
        foreign = foreign_reason(run, experiment, trailer, trailer.shape.n_params)
        if foreign is not None:
            return CheckpointVerdict(
                name, CORRUPT, step, f"foreign: {foreign}", trailer.shape != experiment_shape(experiment)
            )
        wrong_name = misnamed(path)
        if wrong_name is not None:
            return CheckpointVerdict(name, CORRUPT, step, wrong_name)
        return CheckpointVerdict(name, VALID, step)
    if reason is None:  # it verified, then lost its trailer: replaced in between
        reason = f"{path}: changed while it was verified"
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError as exc:
        return CheckpointVerdict(name, CORRUPT, step, str(exc).removeprefix(f"{path}: "))
    if ckpt.trailer is not None:  # it changed between the two reads
        return CheckpointVerdict(name, CORRUPT, step, reason.removeprefix(f"{path}: "))
    foreign = foreign_reason(run, experiment, None, ckpt.n_params)
    if foreign is not None:
        return CheckpointVerdict(name, CORRUPT, step, f"foreign: {foreign}", refused=True)
    return CheckpointVerdict(name, UNVERIFIED, step, "bare ANDREA file: no trailer, no checksum (a resume skips it)")


def resume_point(run: RunDir, experiment: Experiment, verdicts: list[CheckpointVerdict]) -> dict:
    """Where the next `proxy run` would resume, by the one resume rule, and why newer files were passed over.

    The rule checks a file's checksum and the log's coverage, not its shape: a checkpoint of another shape
    that it picks is refused by the engine at launch, and the proxy falls back to the next older one; so
    does this. Any other corrupt file the rule picks is reported as such: the launch would use it."""
    try:
        phases = read_phases(run)
    except RunDirError as exc:
        return {"checkpoint": None, "step": None, "reason": str(exc), "skipped": []}
    if not phases:
        return {"checkpoint": None, "step": 0, "reason": "never started: the next launch starts fresh", "skipped": []}
    refused = {v.name: v.reason for v in verdicts if v.refused}
    corrupt = {v.name: v.reason for v in verdicts if v.verdict == CORRUPT and not v.refused}
    index = LossLogIndex.load(run.loss_log)
    skipped: list[str] = []
    at_most: int | None = None
    while True:
        try:
            point = choose_resume(
                run.checkpoints, index, phases, set(), vocab=int(experiment.model.vocab), at_most=at_most
            )
        except ProxyError as exc:
            return {
                "checkpoint": None,
                "step": None,
                "reason": f"the next launch would stop: {exc}",
                "skipped": skipped,
            }
        skipped += [why.removeprefix(f"{run.checkpoints}/") for why in point.skipped]
        if point.path is None or _name(point.path) not in refused:
            break
        name = _name(point.path)
        skipped.append(f"{point.path.name}: the engine refuses it ({refused[name]})")
        at_most = point.step - 1
    if point.path is None:
        return {
            "checkpoint": None,
            "step": 0,
            "reason": "no usable checkpoint: the next launch starts fresh",
            "skipped": skipped,
        }
    name = _name(point.path)
    warning = (
        f"it is corrupt ({corrupt[name]}), but the next launch would use it: move it aside first"
        if name in corrupt
        else None
    )
    return {"checkpoint": name, "step": point.step, "reason": warning, "skipped": skipped}


def _name(path: Path) -> str:
    """How the report names a checkpoint: relative to the run directory."""
    return f"{path.parent.name}/{path.name}"


def data_report(run: RunDir) -> dict | None:
    """The frozen data definition checked: its files, what they hold, and what is wrong; None without one."""
    try:
        definition = read_definition(run)
    except RunDirError as exc:
        return {"tokenizer": None, "arms": {}, "changes": 0, "problems": [str(exc)]}
    if definition is None:
        return None
    return {
        "tokenizer": {
            "file": definition.tokenizer.file,
            "sha256": definition.tokenizer.sha256,
            "given": definition.tokenizer.given,
        },
        "arms": {name: arm.val.tokens for name, arm in definition.arms.items()},
        "changes": len(definition.changes),
        "problems": data_problems(run, definition),
    }


def verify_run(run: RunDir) -> dict:
    experiment = load_frozen_experiment(run)
    files = list_checkpoints(run.checkpoints) + ([run.best] if run.best.is_file() else [])
    verdicts = [check_file(p, run, experiment) for p in files]
    foreign = foreign_checkpoints(run, experiment)
    resume = (
        {"checkpoint": None, "step": None, "reason": f"the next launch would stop: {foreign}", "skipped": []}
        if foreign is not None
        else resume_point(run, experiment, verdicts)
    )
    data = data_report(run)
    return {
        "run_dir": str(run.root),
        "checkpoints": [asdict(v) for v in verdicts],
        "corrupt": sum(v.verdict == CORRUPT for v in verdicts) + (len(data["problems"]) if data else 0),
        "resume": resume,
        "data": data,
    }


def format_report(report: dict) -> str:
    rows = report["checkpoints"]
    counts = {k: sum(r["verdict"] == k for r in rows) for k in (VALID, UNVERIFIED, CORRUPT, GONE)}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    lines = [f"{report['run_dir']}: {len(rows)} checkpoint file(s)" + (f": {summary}" if summary else "")]
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        step = f"step {r['step']}" if r["step"] is not None else "-"
        lines.append(
            f"  {r['verdict']:<10}  {r['name']:<{width}}  {step}" + (f"  {r['reason']}" if r["reason"] else "")
        )
    resume = report["resume"]
    if resume["checkpoint"]:
        lines.append(
            f"next launch resumes from {resume['checkpoint']} (step {resume['step']})"
            + (f": WARNING: {resume['reason']}" if resume["reason"] else "")
        )
    else:
        lines.append(f"next launch: {resume['reason']}")
    lines += [f"  passed over: {why}" for why in resume["skipped"]]
    data = report["data"]
    if data is None:
        lines.append("data: none frozen (a run made before runs froze their data, or never launched)")
    elif data["problems"]:
        lines.append(f"data: CORRUPT: {'; '.join(data['problems'])}")
    else:
        changed = f"; {data['changes']} recorded data change(s)" if data["changes"] else ""
        lines.append(
            f"data: {data['tokenizer']['file']} and {len(data['arms'])} validation shard(s) verified ("
            + ", ".join(f"{name} {tokens:,} tokens" for name, tokens in data["arms"].items())
            + f"){changed}"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    report = verify_run(resolve_run(args.run_dir))
    print(json.dumps(report, indent=1) if args.json else format_report(report), file=out, flush=True)
    return EXIT_FAILURE if report["corrupt"] else EXIT_OK
