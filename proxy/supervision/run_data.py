"""The data a launch trains on: prepared (or found in the cache) and held to the run's frozen definition.

Until the run's first trained step its definition is provisional: each launch
prepares the data from the experiment and freezes them again (tokenizer,
validation shards, each source's absolute path and fingerprint;
rundir/data.py). From then on:

- every source is fingerprinted again and compared with the frozen one; a
  source that changed or vanished (the tokenizer file the experiment names
  included) stops the launch with one line naming it and what changed,
  unless `--allow-data-change`: then the run trains on the sources as they
  are and the change is recorded in data.json;
- the run keeps its frozen tokenizer whatever happens to the sources (the
  model's embeddings are its ids), and is evaluated on its frozen
  validation shards, so its evaluation curve stays comparable;
- the training tokens come from the cache entry the definition names while
  the sources match it, else are prepared again with the frozen tokenizer
  (the same bytes, for unchanged sources).

A run that trained before runs froze their data freezes, at its next launch,
the data it was prepared with: the cache entry of format 1 its sources and
vocabulary name (prepare.py `v1_key`), the only place its tokenizer is; if
that entry is gone the launch stops with one line (a tokenizer trained now
would not be the run's).

`proxy run --run-dir DIR` without an experiment file reads the sources at
their frozen absolute paths, so relative paths need not resolve against DIR.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.experiment import Experiment
from ..config.sources import Source
from ..data.prepare import DataError, Hashes, PreparedData, fingerprints, load_cached, prepare_data, v1_key
from ..data.source_files import SourceError, source_files, source_fingerprint
from ..data.tokenizer import GIVEN_LIMIT, Tokenizer
from ..errors import EXIT_USAGE, ProxyError, add_note
from ..formats.token_files import TokenSegment
from ..rundir.data import (
    DataDefinition,
    FrozenSource,
    checked_definition,
    freeze,
    record_change,
    run_tokenizer,
    run_val_arrays,
)
from ..rundir.layout import RunDir
from ..safe_fs import UnsafeFileError, read_regular

SHOWN = 3  # changes named in the refusal; the rest are counted


@dataclass
class RunData:
    tokenizer: Tokenizer
    tokenizer_json: bytes
    train: dict[str, list[TokenSegment]]  # each arm's training tokens
    val: dict[str, np.ndarray]  # each arm's frozen validation tokens
    definition: DataDefinition


def resolved_experiment(
    experiment: Experiment, experiment_dir: Path, definition: DataDefinition | None = None
) -> Experiment:
    """The experiment with every source path (and the tokenizer's) absolute: joined to `experiment_dir`, or,
    with `definition`, taken from it (where the run read them) for each source it records."""
    arms = []
    for arm in experiment.arms:
        frozen = definition.arms.get(arm.name) if definition is not None else None
        sources: list[Source] = []
        for i, src in enumerate(arm.sources):
            recorded = frozen.sources[i] if frozen is not None and i < len(frozen.sources) else None
            if (
                recorded is not None
                and recorded.kind == src.kind
                and set(recorded.paths) == {name for name, _v, _w in src.path_fields()}
            ):
                sources.append(src.model_copy(update=recorded.paths))
            else:
                sources.append(src.resolved(experiment_dir))
        arms.append(arm.model_copy(update={"sources": sources}))
    tokenizer = experiment.tokenizer
    if tokenizer is not None:
        given = definition.tokenizer.given if definition is not None else None
        tokenizer = (
            given if given is not None else os.path.normpath(os.path.join(os.path.abspath(experiment_dir), tokenizer))
        )
    return experiment.model_copy(update={"arms": arms, "tokenizer": tokenizer})


def _frozen_sources(experiment: Experiment, fingerprints: dict[str, list[str]]) -> dict[str, list[FrozenSource]]:
    out = {}
    for arm in experiment.arms:
        sources = []
        for src, fp in zip(arm.sources, fingerprints[arm.name], strict=False):
            files = source_files(src, "/")
            sources.append(
                FrozenSource(
                    kind=src.kind,
                    paths={n: v for n, v, _w in src.path_fields()},
                    fingerprint=fp,
                    files=len(files),
                    bytes=sum(p.stat().st_size for p in files),
                )
            )
        out[arm.name] = sources
    return out


def _describe(src: Source) -> str:
    return f"{src.kind} {', '.join(v for _n, v, _w in src.path_fields()) or src.target}"


def compare(definition: DataDefinition, experiment: Experiment) -> tuple[list[str], bool, dict[str, list[str]]]:
    """What differs between the frozen sources and the (resolved) experiment's, one phrase each; whether a
    source vanished; the fingerprints of the arms whose sources could all be read."""
    changes, vanished, fps = [], False, {}
    hashes = Hashes()
    for arm in experiment.arms:
        frozen = definition.arms.get(arm.name)
        if frozen is None:
            changes.append(f"arm {arm.name!r} is not in the frozen data (the experiment gained it)")
            continue
        if [s.kind for s in arm.sources] != [s.kind for s in frozen.sources]:
            changes.append(
                f"arm {arm.name!r} reads {', '.join(s.kind for s in arm.sources)}, it was frozen reading "
                f"{', '.join(s.kind for s in frozen.sources)}"
            )
            continue
        arm_fps = []
        for i, (src, was) in enumerate(zip(arm.sources, frozen.sources, strict=False)):
            what = f"arm {arm.name!r} source {i} ({_describe(src)})"
            try:
                now = source_fingerprint(src, "/", hashes)
                files = source_files(src, "/")
            except (SourceError, OSError) as exc:
                changes.append(f"{what} vanished ({str(exc)[:300]})")
                vanished = True
                continue
            arm_fps.append(now)
            if now != was.fingerprint:
                size = sum(p.stat().st_size for p in files)
                detail = (
                    f"{was.files} file(s), {was.bytes:,} bytes then; {len(files)} file(s), {size:,} bytes now"
                    if (was.files, was.bytes) != (len(files), size)
                    else f"the same {size:,} bytes in {len(files)} file(s), other content"
                )
                changes.append(f"{what} changed since the run froze it ({detail})")
        if len(arm_fps) == len(arm.sources):
            fps[arm.name] = arm_fps
    for arm in experiment.arms:  # the arms the definition lacks: fingerprinted all the same
        if arm.name not in definition.arms:
            try:
                fps[arm.name] = [source_fingerprint(src, "/", hashes) for src in arm.sources]
            except (SourceError, OSError) as exc:
                changes.append(f"arm {arm.name!r} cannot be read ({str(exc)[:300]})")
                vanished = True
    if experiment.tokenizer is not None:
        path = Path(experiment.tokenizer)
        try:
            digest = hashlib.sha256(read_regular(path, GIVEN_LIMIT)).hexdigest()
            if digest != definition.tokenizer.sha256:
                changes.append(
                    f"tokenizer {path} is not the run's frozen tokenizer any more (the run keeps the frozen one)"
                )
        except (OSError, UnsafeFileError) as exc:
            changes.append(f"tokenizer {path} vanished ({exc}); the run keeps its frozen copy")
    return changes, vanished, fps


def _prepare(
    experiment: Experiment, cache_dir: Path, tokenizer_json: bytes | None, fps: dict[str, list[str]] | None = None
) -> PreparedData:
    return prepare_data(experiment, "/", cache_dir, tokenizer_json=tokenizer_json, fps=fps)


def _arms_for_freeze(experiment: Experiment, data: PreparedData, fps: dict[str, list[str]]) -> dict:
    try:
        sources = _frozen_sources(experiment, fps)
    except (SourceError, OSError) as exc:
        raise DataError(f"the sources changed while being prepared: {exc}") from None
    return {
        arm: (sources[arm], data.val_shards[arm], sum(s.tokens for s in data.train[arm]))
        for arm in experiment.arm_names
    }


def _legacy(run: RunDir, experiment: Experiment, cache_dir: Path, warn: Callable[[str], object]) -> PreparedData:
    """A run that trained before runs froze their data: the cache entry (format 1) it was prepared with,
    which alone holds its tokenizer; ProxyError when it is gone."""
    try:
        fps = fingerprints(experiment, "/")
        key = v1_key(experiment, "/", fps)
    except DataError as exc:
        add_note(
            exc,
            f"{run.root} trained before runs froze their data, and its sources cannot be read to find "
            "the data it was prepared with",
        )
        raise
    data = load_cached(experiment, "/", cache_dir, key)
    if data is None:
        raise ProxyError(
            f"{run.root} trained before runs froze their data, and the data it was prepared with are "
            f"not in the cache ({cache_dir}/data-{key[:24]}): a tokenizer trained now would not be its "
            "own; relaunch it with the version that made it, or start a new run",
            EXIT_USAGE,
        )
    warn(
        f"{run.root} trained before runs froze their data; freezing the data it was prepared with "
        f"({data.path}) into {run.data_dir}"
    )
    data.fingerprints = fps
    return data


def open_run_data(
    run: RunDir,
    experiment: Experiment,
    experiment_dir: Path,
    cache_dir: Path,
    *,
    binding: bool,
    allow_change: bool,
    from_frozen: bool,
    resume_step: int,
    warn: Callable[[str], object],
) -> RunData:
    """The launch's data (module docstring). ProxyError (one line, exit 2) for a bad source, a refused data
    change, or damaged frozen data."""
    definition = checked_definition(run)
    data: PreparedData | None  # below, None until found in the cache or prepared
    if not binding or definition is None:
        resolved = resolved_experiment(experiment, experiment_dir, definition if from_frozen else None)
        data = _legacy(run, resolved, cache_dir, warn) if binding else _prepare(resolved, cache_dir, None)
        definition = freeze(
            run,
            vocab=experiment.model.vocab,
            cache_key=data.key,
            tokenizer=data.tokenizer,
            tokenizer_json=data.tokenizer_json,
            given=resolved.tokenizer,
            arms=_arms_for_freeze(resolved, data, data.fingerprints),
        )
        return RunData(
            data.tokenizer,
            data.tokenizer_json,
            data.train,
            run_val_arrays(run, definition, experiment.arm_names),
            definition,
        )

    tokenizer, tokenizer_json = run_tokenizer(run, definition)
    resolved = resolved_experiment(experiment, experiment_dir, definition if from_frozen else None)
    changes, vanished, fps = compare(definition, resolved)
    if changes and not allow_change:
        more = f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
        raise ProxyError(
            f"{run.root}: {'; '.join(changes[:SHOWN])}{more}; pass --allow-data-change to train on "
            "the sources as they are now (recorded in data/data.json), or restore them",
            EXIT_USAGE,
        )
    frozen_fps = {name: [s.fingerprint for s in arm.sources] for name, arm in definition.arms.items()}
    same_sources = all(fps.get(arm.name) == frozen_fps.get(arm.name) for arm in resolved.arms)
    data = None
    if same_sources or vanished:  # the cache entry the run was frozen from holds exactly its data
        data = load_cached(resolved, "/", cache_dir, definition.cache_key)
        if data is not None and data.tokenizer_json != tokenizer_json:
            data = None
        if data is None and vanished:
            raise ProxyError(
                f"{run.root}: {changes[0]}, and the data prepared from it are no longer in the cache "
                f"({cache_dir}); restore the source to continue",
                EXIT_USAGE,
            )
    if data is None:
        data = _prepare(resolved, cache_dir, tokenizer_json, fps)
    if changes:
        arms = {} if vanished else _arms_for_freeze(resolved, data, fps)
        definition = record_change(run, definition, data.key, arms, changes, resume_step)
        warn(
            f"training on changed data (--allow-data-change): {'; '.join(changes[:SHOWN])}"
            + (f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else "")
            + "; recorded in data/data.json"
        )
    val = run_val_arrays(run, definition, experiment.arm_names)
    return RunData(tokenizer, tokenizer_json, data.train, val, definition)
