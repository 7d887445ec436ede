"""Foreign checkpoints: a checkpoint file that is not this run's model (docs/OPERATIONS.md, "Foreign checkpoints").

A checkpoint's trailer carries its model shape and, in its metadata, the name
of the experiment that wrote it (formats/engine_cli.py's --meta). A checkpoint
of another shape cannot be loaded as the run's model; one written by another
experiment loads, but its steps are not the ones the run's `.loss.json`
records, so resuming from it would replay a history that is not its own.
`proxy export`, `sample` and `eval` refuse both (commands/model_source.py);
`proxy run` refuses to start while a file written by another experiment sits
among its checkpoints (the engine would write over it, retention would
delete it), and `proxy verify` says so. A checkpoint of another shape under
the run's checkpoints is left to the engine, which refuses to load it; the
proxy then falls back to the next older one.
"""

from __future__ import annotations

from ..config.experiment import Experiment
from ..formats import bounded_json
from ..formats.checkpoint import Trailer, list_checkpoints, read_trailer
from ..formats.parameters import ModelShape
from ..safe_fs import read_regular
from .frozen import replaced_experiments
from .layout import EXPERIMENT, READ_LIMITS, RunDir


def experiment_shape(experiment: Experiment) -> ModelShape:
    m = experiment.model
    return ModelShape(m.vocab, m.ctx, m.dim, m.layers, m.heads)


def describe_shape(s: ModelShape) -> str:
    return f"vocab {s.vocab}, ctx {s.ctx}, dim {s.dim}, layers {s.layers}, heads {s.heads}"


def experiment_names(run: RunDir, experiment: Experiment) -> set[str]:
    """The names the run's experiment has had: now (`experiment`, and the frozen copy's), and before each
    --allow-experiment-change."""
    names = {experiment.name}
    for replaced in [run.experiment, *replaced_experiments(run)]:
        try:  # by safe_fs's rules: a frozen copy that is /dev/zero or a FIFO is refused elsewhere, never read
            raw = read_regular(replaced, READ_LIMITS[EXPERIMENT], within=run.root)
            names.add(str(bounded_json.loads(raw).get("name")))
        except (OSError, ValueError, AttributeError, RecursionError):  # UnsafeFileError is a ValueError
            pass
    return names


def meta_experiment(trailer: Trailer) -> str | None:
    """The experiment name the proxy wrote into the checkpoint's metadata (engine_args' --meta), if any."""
    try:
        meta = bounded_json.loads(trailer.meta).get("meta")
    except (ValueError, AttributeError):
        return None
    name = meta.get("experiment") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def other_experiment(run: RunDir, experiment: Experiment, trailer: Trailer) -> str | None:
    """Why a checkpoint was written by another experiment than `run`'s, or None."""
    named = meta_experiment(trailer)
    if named is not None and named not in experiment_names(run, experiment):
        return f"written by experiment {named!r}, {run.root} is {experiment.name!r}"
    return None


def foreign_reason(run: RunDir, experiment: Experiment, trailer: Trailer | None, n_params: int) -> str | None:
    """Why a checkpoint that reads is not the model of `run` (another shape, or a trailer naming another
    experiment), or None. A bare file (no trailer) can only be checked by its parameter count."""
    expected = experiment_shape(experiment)
    if trailer is None:
        if n_params != expected.n_params:
            return f"{n_params} parameters, the model of {run.root} has {expected.n_params}"
        return None
    if trailer.shape != expected:
        return f"its model is {describe_shape(trailer.shape)}, the model of {run.root} is {describe_shape(expected)}"
    return other_experiment(run, experiment, trailer)


def foreign_checkpoints(run: RunDir, experiment: Experiment) -> str | None:
    """One line naming the checkpoints of `run` written by another experiment (read from their trailers,
    the files' tails only), or None when there are none: `proxy run` refuses to start over them."""
    names = experiment_names(run, experiment)
    found = []
    for path in list_checkpoints(run.checkpoints):
        trailer = read_trailer(path)
        named = meta_experiment(trailer) if trailer is not None else None
        if named is not None and named not in names:
            found.append((path, named))
    if not found:
        return None
    path, named = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"{path}{more}: foreign checkpoint: written by experiment {named!r}, {run.root} is {experiment.name!r}; "
        f"move it out of {run.checkpoints} (nothing was changed)"
    )
