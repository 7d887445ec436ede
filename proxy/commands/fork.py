"""`proxy fork --run-dir DIR --at STEP --to NEW_DIR [--caps NEW.json]` (docs/OPERATIONS.md, "Fork").

A new run directory that continues DIR's run from its checkpoint at STEP (or
the nearest older valid one, said in the output), so that two configurations
run forward from the same weights and can be compared side by side
(`proxy dashboard --run-dir DIR --run-dir NEW_DIR` overlays them).

NEW_DIR gets:

- `experiment.json`: a byte copy (and the `archive/experiment_*.json` copies
  of experiments the run was changed from, which tell the proxy to allow the
  optimizer settings to differ, as in DIR);
- `data/`: the frozen data definition (tokenizer, validation shards, the
  sources' paths and fingerprints), each file verified, then copied;
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

Everything is built in a temp directory next to NEW_DIR (temp_names.py: created
exclusively under a name no one can predict) and renamed into place, so a
failed fork leaves nothing behind; the temp directories of forks and exports
killed there earlier are removed first. DIR is only read (it may even
be running); no file in it is created, changed or removed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from .. import temp_names
from ..atomic import copy_synced, fsync_dir, json_bytes, make_dirs, storage_guard, write_synced
from ..config.caps import load_pivot_caps, phase_bounds
from ..config.experiment import Experiment
from ..errors import EXIT_OK, ProxyError, add_note
from ..formats import bounded_json
from ..formats.checkpoint import verify_checkpoint
from ..formats.loss_log import LossLogIndex, encode_line, open_log, read_raw_line
from ..formats.samples import read_audits
from ..formats.state import ArmStatus, RunState
from ..rundir.apply_pivot import archive_dir_for, archive_name
from ..rundir.data import copy_definition
from ..rundir.frozen import replaced_experiments
from ..rundir.history import check_history, write_receipt
from ..rundir.layout import (
    ARCHIVE,
    CHECKPOINTS,
    EXPERIMENT,
    EXPERIMENT_SEAL,
    LOSS_LOG,
    PHASES,
    PIVOT_RECEIPT,
    SAMPLES,
    STATE,
    RunDir,
    relative_checkpoint,
)
from ..rundir.phases import Phase
from ..rundir.resume import newest_covered
from .targets import TargetError, check_new_dir, make_parents
from .which_run import resolve_run, started_run


class ForkRaced(ProxyError):
    """The live run changed the checkpoint a fork was copying (exit 1: the user tries again)."""


def _check_target(to: Path, source: Path) -> None:
    check_new_dir(to, "--to")
    src, dst = source.resolve(), to.resolve()
    if dst == src or src in dst.parents:
        raise TargetError(f"--to {to} is inside the run being forked ({source}); give a path outside it")


def main(args: argparse.Namespace) -> int:
    run = resolve_run(args.run_dir)
    try:
        return fork(run, args.at, Path(args.to), Path(args.caps) if args.caps else None)
    except ProxyError as exc:  # nothing was written: the new directory is built aside and renamed into place
        add_note(exc, f"cannot fork {run.root}")
        raise


def fork(run: RunDir, at: int, to: Path, caps_path: Path | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    _check_target(to, run.root)
    experiment, phases = started_run(run, "no phases (the run was never started); nothing to fork")

    # the checkpoint: the newest at or before `at` that verifies and whose whole history the log holds
    index = LossLogIndex.load(run.loss_log)
    check_history(run, phases, index)
    point = newest_covered(run.checkpoints, index, phases, vocab=int(experiment.model.vocab), at_most=at)
    skipped, chosen, c = point.skipped, point.path, point.step
    if chosen is None:
        raise ProxyError(
            f"no valid checkpoint at or before step {at} in {run.checkpoints}"
            + (f" ({'; '.join(skipped)})" if skipped else "")
        )
    inherited = [p for p in phases if p.phase == 0 or p.start_step < c]
    inherited = phases[: len(inherited)]  # a prefix: start steps never decrease
    new_phases = list(inherited)
    if caps_path is not None:
        caps, floors, policy = load_pivot_caps(caps_path, experiment, inherited[-1])
        new_phases.append(
            Phase(
                phase=len(inherited),
                start_step=c,
                policy=policy,
                caps=caps,
                floors=floors,
                checkpoint=relative_checkpoint(c),
            )
        )

    make_parents(to, "--to")
    temp_names.remove_leftovers(to.parent, (temp_names.FORK, temp_names.EXPORT))  # of killed forks, exports
    with storage_guard(to, "create a temp directory beside"):
        tmp = temp_names.make_dir(to.parent, to.name, temp_names.FORK)
    try:
        make_dirs(tmp / CHECKPOINTS)
        try:
            copy_synced(chosen, tmp / CHECKPOINTS / chosen.name)
        except FileNotFoundError:
            raise ForkRaced(
                f"{chosen} vanished while being copied (the live run's retention deleted it); try again"
            ) from None
        reason = verify_checkpoint(tmp / CHECKPOINTS / chosen.name)
        if reason is not None:
            raise ForkRaced(f"the copy of {chosen} does not verify ({reason}); try again")
        copy_synced(run.experiment, tmp / EXPERIMENT)
        if run.experiment_seal.exists():  # checked against the frozen copy by started_run
            copy_synced(run.experiment_seal, tmp / EXPERIMENT_SEAL)
        copy_definition(run, tmp, experiment.arm_names)
        n_steps, n_evals = _copy_log(index, c, tmp / LOSS_LOG)
        write_synced(tmp / PHASES, json_bytes([p.to_dict() for p in new_phases]))

        # sidecar archives of the inherited pivots and of experiment changes
        for changed in replaced_experiments(run):
            make_dirs(tmp / ARCHIVE)
            copy_synced(changed, tmp / ARCHIVE / changed.name)
        for p in inherited[1:]:
            src = archive_dir_for(run, phases, p.phase)
            if src.is_dir() and not src.is_symlink():
                make_dirs(tmp / ARCHIVE / src.name)
                for name in (SAMPLES, STATE, PIVOT_RECEIPT):  # the sidecars a pivot archives, and its receipt
                    if (src / name).exists():
                        copy_synced(src / name, tmp / ARCHIVE / src.name / name)

        # the current phase's sample audits up to c
        last = inherited[-1]
        source = (
            run.samples if last.phase == phases[-1].phase else archive_dir_for(run, phases, last.phase + 1) / SAMPLES
        )
        audits = [a.to_dict() for a in read_audits(source) if a.step <= c]
        state = _fork_state(run, experiment, index, new_phases, c, to)
        if caps_path is not None:
            arch = tmp / ARCHIVE / archive_name(new_phases, c, new_phases[-1].phase)
            make_dirs(arch)
            write_synced(arch / SAMPLES, json_bytes(audits))
            write_synced(arch / STATE, json_bytes(dict(state.to_dict(), phase=last.phase, policy=last.policy)))
            write_receipt(arch, new_phases[-1])
            audits = []
        write_synced(tmp / SAMPLES, json_bytes(audits))
        write_synced(tmp / STATE, json_bytes(state.to_dict()))
        for d in [tmp / CHECKPOINTS, tmp / ARCHIVE, tmp]:
            if d.is_dir():
                fsync_dir(d)
        with storage_guard(to, "rename the fork into"):
            os.rename(tmp, to)  # over an empty NEW_DIR too
        fsync_dir(to.parent)
    except BaseException as exc:
        temp_names.remove_entry(tmp)
        if isinstance(exc, OSError):  # cli.py says which file and why (exit 1)
            add_note(exc, f"cannot write {to}")
        raise

    if c != at:
        why = f"; skipped: {'; '.join(skipped)}" if skipped else ""
        print(
            f"no valid checkpoint at step {at}: forking at step {c}, the nearest older valid one{why}",
            file=out,
            flush=True,
        )
    pivot = (
        f"; new phase {new_phases[-1].phase} ({new_phases[-1].policy}) from {caps_path}"
        if caps_path is not None
        else ""
    )
    print(
        f"forked {run.root} at step {c} into {to}: {n_steps} steps and {n_evals} evals inherited, "
        f"phases 0..{inherited[-1].phase}{pivot}",
        file=out,
        flush=True,
    )
    print(f"continue with: proxy run --run-dir {to}", file=out, flush=True)
    return EXIT_OK


def _copy_log(index: LossLogIndex, c: int, dst: Path) -> tuple[int, int]:
    """The last entry of each step <= c and of each eval <= c, in step order, marked inherited."""
    lines = []
    n_steps = n_evals = 0
    if index.path.exists():
        with open_log(index.path) as f:

            def read(offset: int) -> bytes:
                # the whole line: fields this version does not know too
                obj = bounded_json.loads(read_raw_line(f, offset))
                obj["inherited"] = True
                return encode_line(obj)

            for s in range(1, c + 1):
                if s in index.steps:
                    lines.append(read(index.steps[s][0]))
                    n_steps += 1
                if s in index.evals:
                    lines.append(read(index.evals[s]))
                    n_evals += 1
    write_synced(dst, b"".join(lines))
    return n_steps, n_evals


def _fork_state(
    run: RunDir, experiment: Experiment, index: LossLogIndex, phases: list[Phase], c: int, to: Path
) -> RunState:
    entry = index.step(c) if c > 0 else None
    p = phases[-1]
    caps, floors = phase_bounds(experiment, p)
    mixture = entry.mixture if entry is not None else {}
    return RunState(
        step=c,
        phase=p.phase,
        policy=p.policy,
        status="stopped",
        arms={
            n: ArmStatus(pulls=0, weight=float(mixture.get(n, 0.0)), cap=caps[n], floor=floors[n])
            for n in experiment.arm_names
        },
        tokens=entry.tokens if entry is not None else 0,
        last_checkpoint=str(to / relative_checkpoint(c)),
        experiment=experiment.name,
        max_steps=int(experiment.train.max_steps),
        segment=index.max_segment,
        loss=entry.loss if entry is not None else None,
        message=f"forked from {run.root} at step {c}; `proxy run --run-dir {to}` continues it",
        extra={"fork": {"from": str(run.root.resolve()), "step": c, "time": time.time()}},
    )
