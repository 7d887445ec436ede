"""Which checkpoint `proxy export | sample | eval` work on, and the run it belongs to (docs/CLI.md).

`--run-dir DIR [--step N|latest|best]` names a checkpoint of a run: `latest`
(the default) is the one the next `proxy run` would resume from (the proxy's
one resume rule, rundir/resume.py), `best` is `checkpoints/best.bin`, `N` is
`checkpoints/step_N.bin`. `--checkpoint PATH` names a file; its run is
`--run-dir` when given, else the run directory that holds it
(`RUN/checkpoints/PATH`), else none (then only the weights can be used).

Every checkpoint is verified here (size, trailer, checksum) and must match
its run's model shape: a missing, corrupt or foreign file ends the command
with one line, before any engine starts or anything is written.

The tokenizer and the validation tokens come from the run alone (its frozen
data definition, rundir/data.py, every file checked against its SHA-256),
never from the sources, which may have changed or gone since. A run made
before runs froze their data has them from the prepared-data cache entry it
was made with (with a warning), if it is still there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from ..arguments import STEP_BEST as BEST
from ..arguments import STEP_LATEST as LATEST
from ..config.config_file import ExperimentError
from ..config.experiment import Experiment
from ..data.prepare import DataError, default_cache_dir, load_cached, v1_key
from ..data.tokenizer import Tokenizer
from ..errors import EXIT_FAILURE, EXIT_USAGE, ProxyError, add_note
from ..formats.checkpoint import (
    Checkpoint,
    CheckpointError,
    Trailer,
    checkpoint_path,
    header_step,
    read_checkpoint,
    read_trailer,
    verify_checkpoint,
)
from ..formats.loss_log import LossLogIndex
from ..formats.parameters import ModelShape
from ..formats.shard import shard_segment
from ..rundir.data import checked_definition, run_tokenizer, run_val_arrays
from ..rundir.foreign import experiment_shape, foreign_reason
from ..rundir.layout import CHECKPOINTS, EXPERIMENT, RunDir, RunDirError
from ..rundir.resume import choose_resume
from ..safe_fs import NO_SUCH_FILE, regular_file_problem
from .which_run import resolve_run, started_run


@dataclass(frozen=True)
class ModelSource:
    """A verified checkpoint, its model shape, and its run (None: a checkpoint outside any run)."""

    path: Path
    step: int
    shape: ModelShape
    run: RunDir | None
    experiment: Experiment | None
    warnings: list[str] = field(default_factory=list)  # a bare ANDREA file's: nothing was verified

    def require_run(self, what: str) -> tuple[RunDir, Experiment]:
        """The run, for what needs its tokenizer or data; ProxyError naming `what` when there is none."""
        if self.run is None or self.experiment is None:
            raise ProxyError(
                f"{self.path} is not in a run directory, and {what} comes from the run: "
                "pass --run-dir DIR of the run it came from",
                EXIT_USAGE,
            )
        return self.run, self.experiment

    def engine_settings(self) -> dict:
        """The engine settings for this checkpoint: its own shape, and the run's thread count."""
        s = self.shape
        threads = self.experiment.train.threads if self.experiment is not None else None
        return dict(vocab=s.vocab, ctx=s.ctx, dim=s.dim, layers=s.layers, heads=s.heads, threads=threads)


def _run_holding(path: Path) -> RunDir | None:
    """The run directory whose checkpoints/ holds `path`, if any."""
    folder = path.resolve().parent
    if folder.name == CHECKPOINTS and (folder.parent / EXPERIMENT).is_file():
        return RunDir(folder.parent)
    return None


def _chosen(run: RunDir, step: str | int) -> Path:
    """The checkpoint `--step` names in `run`."""
    if step == BEST:
        if not run.best.is_file():
            raise ProxyError(
                f"{run.best}: no best checkpoint yet (it is written at the first eval that has a checkpoint)",
                EXIT_FAILURE,
            )
        return run.best
    if step == LATEST:
        experiment, phases = started_run(run, "no phases (the run was never started); no checkpoint")
        point = choose_resume(
            run.checkpoints, LossLogIndex.load(run.loss_log), phases, set(), vocab=int(experiment.model.vocab)
        )
        if point.path is None:
            skipped = f" ({'; '.join(point.skipped)})" if point.skipped else ""
            raise ProxyError(f"{run.checkpoints}: no valid checkpoint to use{skipped}", EXIT_FAILURE)
        return point.path
    path = checkpoint_path(run.checkpoints, int(step))
    if not path.is_file():
        raise ProxyError(f"{path}: no checkpoint at step {step} in {run.root}", EXIT_USAGE)
    return path


def read_model_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint a command reads a model from; ProxyError (one line, exit 2) when it does not parse (it
    may have changed since it verified)."""
    try:
        return read_checkpoint(path)
    except CheckpointError as exc:
        add_note(exc, "corrupt checkpoint")
        raise


def _verified(path: Path) -> tuple[Trailer | None, int, list[str]]:
    """(trailer, n_params, warnings) of a checkpoint that verifies, or of a bare ANDREA file (no trailer: it
    loads with a warning, as the engine loads it); ProxyError saying why for anything else."""
    reason = verify_checkpoint(path)
    trailer = read_trailer(path) if reason is None else None
    if trailer is not None:
        return trailer, trailer.shape.n_params, []
    ckpt = read_model_checkpoint(path)
    if ckpt.trailer is not None:  # it reads, but did not verify (a file that changed in between)
        raise ProxyError(f"corrupt checkpoint: {reason}", EXIT_USAGE)
    return None, ckpt.n_params, ckpt.warnings


def _shape_of(
    path: Path, trailer: Trailer | None, n_params: int, experiment: Experiment | None, run: RunDir | None
) -> ModelShape:
    """The checkpoint's model shape; ProxyError when it is not the run's model (a foreign checkpoint)."""
    if experiment is None or run is None:  # no run: only the file says its shape
        if trailer is None:
            raise ProxyError(
                f"{path}: a bare ANDREA file holds no model shape; pass --run-dir DIR of its run", EXIT_USAGE
            )
        return trailer.shape
    reason = foreign_reason(run, experiment, trailer, n_params)
    if reason is not None:
        raise ProxyError(f"{path}: foreign checkpoint: {reason}", EXIT_USAGE)
    return experiment_shape(experiment)


def resolve_source(run_dir: str | None, step: str | int | None, checkpoint: str | None) -> ModelSource:
    """The checkpoint `--run-dir`, `--step` (a step, LATEST or BEST; cli.py) and `--checkpoint` name, verified,
    with its shape and run."""
    if checkpoint is not None and step is not None:
        raise ProxyError("give --step or --checkpoint, not both", EXIT_USAGE)
    if checkpoint is not None:
        path = Path(checkpoint)
        problem = regular_file_problem(path)
        if problem == NO_SUCH_FILE:
            raise ProxyError(f"{path}: no such checkpoint file", EXIT_USAGE)
        if problem is not None:  # /dev/zero, a FIFO: never read
            raise ProxyError(f"{path}: {problem}; a checkpoint is a regular file", EXIT_USAGE)
        run = resolve_run(run_dir) if run_dir else _run_holding(path)
    else:
        run = resolve_run(run_dir)
        path = _chosen(run, step if step is not None else LATEST)
    trailer, n_params, warnings = _verified(path)
    experiment = started_run(run, "no phases (the run was never started)")[0] if run is not None else None
    shape = _shape_of(path, trailer, n_params, experiment, run)
    step_in_file = header_step(path)
    return ModelSource(
        path=path, step=int(step_in_file or 0), shape=shape, run=run, experiment=experiment, warnings=warnings
    )


@dataclass(frozen=True)
class HeldData:
    """What a command uses of the run's data: its tokenizer (and the file's bytes), its validation tokens."""

    tokenizer: Tokenizer
    tokenizer_json: bytes
    val: dict[str, np.ndarray]


def run_data(
    source: ModelSource, cache_dir: str | None, what: str, need_val: bool = False, err: TextIO | None = None
) -> HeldData:
    """The run's tokenizer (and with `need_val` each arm's validation tokens), from its frozen data definition;
    ProxyError (one line) when the run has none to give or they are damaged."""
    run, experiment = source.require_run(what)
    try:
        definition = checked_definition(run)
        if definition is not None:
            tokenizer, raw = run_tokenizer(run, definition)
            val = run_val_arrays(run, definition, experiment.arm_names) if need_val else {}
            return HeldData(tokenizer, raw, val)
    except RunDirError as exc:
        add_note(exc, f"{what} of {run.root}")
        raise
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    try:  # relative source paths resolve against the run directory (as for `proxy run --run-dir`)
        key = v1_key(experiment, run.root)
    except (DataError, ExperimentError) as exc:
        add_note(exc, f"the data of {run.root} (made before runs froze their data)")
        raise
    data = load_cached(experiment, run.root, cache, key)
    if data is None:
        raise ProxyError(
            f"{run.root} holds no frozen data (made before runs froze them), and the data it was "
            f"prepared with are not in the cache ({cache}/data-{key[:24]}); {what} cannot be had",
            EXIT_USAGE,
        )
    print(
        f"proxy: warning: {run.root} holds no frozen data (made before runs froze them); {what} comes from the "
        f"prepared-data cache ({data.path}); a `proxy run` of it freezes them",
        file=err or sys.stderr,
        flush=True,
    )
    val = {arm: shard_segment(data.val_shards[arm])[0].array() for arm in experiment.arm_names} if need_val else {}
    return HeldData(data.tokenizer, data.tokenizer_json, val)


def say_warnings(source: ModelSource, err: TextIO | None = None) -> None:
    for line in source.warnings:
        print(f"proxy: warning: {line}", file=err or sys.stderr, flush=True)
