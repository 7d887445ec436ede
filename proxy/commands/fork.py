"""`proxy fork --run-dir DIR --at STEP --to NEW_DIR [--caps NEW.json]` (docs/OPERATIONS.md, "Fork").

A new run directory that continues DIR's run from its checkpoint at STEP (or
the nearest older valid one, said in the output), so that two configurations
run forward from the same weights and can be compared side by side
(`proxy dashboard --run-dir DIR --run-dir NEW_DIR` overlays them).

NEW_DIR gets:

- `experiment.json`: a byte copy (and the `archive/experiment_*.json` copies
  of experiments the run was changed from, which tell the proxy to allow the
  optimizer settings to differ, as in DIR);
- `checkpoints/step_<c>.bin`: a copy of the checkpoint;
- `.loss.json`: the last entry of every step 1..c and the last eval entry of
  every eval step <= c, in step order, each with `"inherited": true` (the
  rest of each line unchanged);
- `phases.json`: DIR's phases that began before step c (those that own steps
  <= c), plus, with `--caps`, a new phase starting at c;
- `.samples.json`: the audits of the current phase up to c (with `--caps`,
  they go to `archive/pivot_<c>/`, as a pivot would put them);
- `archive/pivot_*`: the sidecar archives of the inherited pivots;
- `.state.json`: a snapshot saying where the fork came from (status
  `stopped`).

Everything is built in a temp directory next to NEW_DIR and renamed into
place, so a failed fork leaves nothing behind. DIR is only read (it may even
be running); no file in it is created, changed or removed.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..atomic import fsync_dir
from ..formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint
from ..config.caps import load_pivot_caps, phase_bounds
from ..formats.loss_log import LossLogIndex
from ..rundir.layout import Phase, RunDir, RunDirError, read_phases

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class ForkError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = code


def phase_of(phases: list[Phase], step: int) -> int:
    """The phase that owns `step` (a pivot at k: steps <= k belong to the phases before it)."""
    owner = 0
    for p in phases:
        if p.phase == 0 or p.start_step < step:
            owner = p.phase
    return owner


def uncovered(index: LossLogIndex, phases: list[Phase], step: int) -> list[int]:
    """Steps 1..step whose last log entry is absent or from another phase than the one owning it."""
    return [s for s in range(1, step + 1)
            if s not in index.steps or index.steps[s][1] != phase_of(phases, s)]


def _check_target(to: Path, source: Path) -> None:
    if to.exists() or to.is_symlink():
        if not to.is_dir() or to.is_symlink():
            raise ForkError(f"{to} exists and is not a directory; give a new path with --to", EXIT_USAGE)
        if any(to.iterdir()):
            raise ForkError(f"{to} exists and is not empty; give a new path with --to", EXIT_USAGE)
    src, dst = source.resolve(), to.resolve()
    if dst == src or src in dst.parents:
        raise ForkError(f"{to} is inside the run being forked ({source}); give a path outside it", EXIT_USAGE)
    if not to.parent.is_dir():
        raise ForkError(f"{to.parent}: no such directory", EXIT_USAGE)


def _fsynced_copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=1, allow_nan=False) + "\n").encode()


def fork(run: RunDir, at: int, to: Path, caps_path: Path | None = None, out=None) -> int:
    from ..config.experiment import ExperimentError, load_experiment
    from .pivot import archive_dir_for, archive_name, relative_checkpoint

    out = out or sys.stdout
    if at < 0:
        raise ForkError("--at must be a step >= 0", EXIT_USAGE)
    _check_target(to, run.root)
    try:
        experiment = load_experiment(run.experiment, check_sources=False)
    except ExperimentError as exc:
        raise ForkError(str(exc), EXIT_USAGE) from None
    try:
        phases = read_phases(run)
    except RunDirError as exc:
        raise ForkError(str(exc), EXIT_USAGE) from None
    if not phases:
        raise ForkError(f"{run.phases}: no phases (the run was never started); nothing to fork", EXIT_USAGE)

    # the checkpoint: the newest at or before `at` that verifies and whose history the log holds
    index = LossLogIndex.load(run.loss_log)
    skipped, chosen = [], None
    for path in list_checkpoints(run.checkpoints):
        step = checkpoint_step(path)
        if step > at:
            continue
        reason = verify_checkpoint(path)
        if reason is None:
            gaps = uncovered(index, phases, step)
            reason = f"{path.name}: .loss.json lacks {len(gaps)} of its steps (first {gaps[0]})" if gaps else None
        if reason is None:
            chosen = path
            break
        skipped.append(reason)
    if chosen is None:
        raise ForkError(f"no valid checkpoint at or before step {at} in {run.checkpoints}"
                        + (f" ({'; '.join(skipped)})" if skipped else ""))
    c = checkpoint_step(chosen)
    inherited = [p for p in phases if p.phase == 0 or p.start_step < c]
    inherited = phases[:len(inherited)]  # a prefix: start steps never decrease
    new_phases = list(inherited)
    if caps_path is not None:
        try:
            caps, floors, policy = load_pivot_caps(caps_path, experiment, inherited[-1])
        except ExperimentError as exc:
            raise ForkError(str(exc), EXIT_USAGE) from None
        new_phases.append(Phase(phase=len(inherited), start_step=c, policy=policy, caps=caps, floors=floors,
                                checkpoint=relative_checkpoint(c)))

    tmp = to.parent / f".{to.name}.fork-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "checkpoints").mkdir(parents=True)
        try:
            _fsynced_copy(chosen, tmp / "checkpoints" / chosen.name)
        except FileNotFoundError:
            raise ForkError(f"{chosen} vanished while being copied (the live run's retention deleted it); "
                            "try again") from None
        reason = verify_checkpoint(tmp / "checkpoints" / chosen.name)
        if reason is not None:
            raise ForkError(f"the copy of {chosen} does not verify ({reason}); try again")
        _fsynced_copy(run.experiment, tmp / "experiment.json")
        n_steps, n_evals = _copy_log(index, c, tmp / ".loss.json")
        _write(tmp / "phases.json", _json([p.to_dict() for p in new_phases]))

        # sidecar archives of the inherited pivots and of experiment changes
        if run.archive.is_dir():
            for changed in sorted(run.archive.glob("experiment_*.json")):
                (tmp / "archive").mkdir(exist_ok=True)
                _fsynced_copy(changed, tmp / "archive" / changed.name)
        for p in inherited[1:]:
            src = archive_dir_for(run, phases, p.phase)
            if src.is_dir():
                (tmp / "archive").mkdir(exist_ok=True)
                shutil.copytree(src, tmp / "archive" / src.name, ignore=shutil.ignore_patterns("checkpoints"))

        # the current phase's sample audits up to c
        last = inherited[-1]
        source = run.samples if last.phase == phases[-1].phase else archive_dir_for(run, phases, last.phase + 1) \
            / run.samples.name
        audits = _audits_upto(source, c)
        state = _fork_state(run, experiment, index, new_phases, c, to)
        if caps_path is not None:
            arch = tmp / "archive" / archive_name(new_phases, c, new_phases[-1].phase)
            arch.mkdir(parents=True)
            _write(arch / ".samples.json", _json(audits))
            _write(arch / ".state.json", _json(dict(state, phase=last.phase, policy=last.policy)))
            audits = []
        _write(tmp / ".samples.json", _json(audits))
        _write(tmp / ".state.json", _json(state))
        for d in [tmp / "checkpoints", tmp / "archive", tmp]:
            if d.is_dir():
                fsync_dir(d)
        os.rename(tmp, to)  # over an empty NEW_DIR too
        fsync_dir(to.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if c != at:
        why = f"; skipped: {'; '.join(skipped)}" if skipped else ""
        print(f"no valid checkpoint at step {at}: forking at step {c}, the nearest older valid one{why}",
              file=out, flush=True)
    pivot = (f"; new phase {new_phases[-1].phase} ({new_phases[-1].policy}) from {caps_path}"
             if caps_path is not None else "")
    print(f"forked {run.root} at step {c} into {to}: {n_steps} steps and {n_evals} evals inherited, "
          f"phases 0..{inherited[-1].phase}{pivot}", file=out, flush=True)
    print(f"continue with: proxy run --run-dir {to}", file=out, flush=True)
    return EXIT_OK


def _copy_log(index: LossLogIndex, c: int, dst: Path) -> tuple[int, int]:
    """The last entry of each step <= c and of each eval <= c, in step order, marked inherited."""
    lines = []
    n_steps = n_evals = 0
    if index.path.exists():
        with open(index.path, "rb") as f:
            def read(offset: int) -> bytes:
                f.seek(offset)
                obj = json.loads(f.readline())
                obj["inherited"] = True
                return (json.dumps(obj, separators=(", ", ": "), allow_nan=False) + "\n").encode()

            for s in range(1, c + 1):
                if s in index.steps:
                    lines.append(read(index.steps[s][0]))
                    n_steps += 1
                if s in index.evals:
                    lines.append(read(index.evals[s]))
                    n_evals += 1
    _write(dst, b"".join(lines))
    return n_steps, n_evals


def _audits_upto(path: Path, c: int) -> list:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [a for a in raw if isinstance(a, dict) and isinstance(a.get("step"), int) and a["step"] <= c] \
        if isinstance(raw, list) else []


def _fork_state(run: RunDir, experiment, index: LossLogIndex, phases: list[Phase], c: int, to: Path) -> dict:
    entry = index.step(c) if c > 0 else None
    p = phases[-1]
    caps, floors = phase_bounds(experiment, p)
    mixture = entry.mixture if entry is not None else {}
    return {
        "step": c, "phase": p.phase, "policy": p.policy, "status": "stopped",
        "arms": {n: {"pulls": 0, "ema": None, "reward": None, "weight": float(mixture.get(n, 0.0)),
                     "cap": caps[n], "floor": floors[n]} for n in experiment.arm_names},
        "tokens": entry.tokens if entry is not None else 0, "tokens_per_s": None, "eta_s": None,
        "last_checkpoint": str(to / "checkpoints" / f"step_{c:06d}.bin"),
        "engine": {"kind": None, "device": None, "pid": None, "alive": False, "rss_bytes": None,
                   "cpu_percent": None, "mem_bytes": None},
        "updated": time.time(), "experiment": experiment.name, "max_steps": int(experiment.train.max_steps),
        "segment": index.max_segment, "loss": entry.loss if entry is not None else None,
        "restarts": 0, "replay_mismatch_count": 0, "replay_mismatches": [],
        "message": f"forked from {run.root} at step {c}; `proxy run --run-dir {to}` continues it",
        "fork": {"from": str(run.root.resolve()), "step": c, "time": time.time()},
    }
