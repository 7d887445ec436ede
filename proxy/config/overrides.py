"""`proxy run EXPERIMENT.json --set train.lr=0.001 --set log.tensorboard=true` (docs/CLI.md, "--set").

Each `--set KEY=VALUE` replaces one field of the experiment before it is
validated: KEY is dotted (`train.lr`; an integer part indexes a list,
`arms.0.cap`), VALUE is JSON where it parses as JSON (`0.001`, `true`,
`[1, 2]`, `"text"`) and a string otherwise (`cosine`). The result is checked
by the same schema as the file, so an unknown key or a bad value is one line
and exit 2. The effective experiment, not the file, is what the run freezes
(RUN/experiment.json), and a started run treats it as any changed file:
--allow-experiment-change (rundir/frozen.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import json_bytes
from ..formats import bounded_json
from .config_file import ExperimentError, config_error, read_json, short
from .experiment import Experiment, load_experiment, parse_experiment, source_problems

MAX_OVERRIDES = 64  # --set options on one command line
MAX_DEPTH = 8  # parts of a dotted key (the schema nests four deep at most)


@dataclass(frozen=True)
class Override:
    text: str  # as given: "train.lr=0.001"
    path: tuple[str, ...]
    value: Any


def parse_override(text: str) -> Override:
    """One `--set KEY=VALUE`; ExperimentError (exit 2) for a malformed one."""
    key, sep, raw = text.partition("=")
    parts = tuple(key.split("."))
    if not sep or not key or not all(parts):
        raise ExperimentError(f"--set {short(text)}: expected KEY=VALUE with a dotted KEY (e.g. train.lr=0.001)")
    if len(parts) > MAX_DEPTH:
        raise ExperimentError(f"--set {short(text)}: a key of at most {MAX_DEPTH} parts")
    try:
        value = bounded_json.loads(raw)
    except (ValueError, RecursionError):
        value = raw  # not JSON: the text itself (`--set train.lr_schedule=wsd`)
    return Override(text, parts, value)


def apply_overrides(data: Any, overrides: list[Override]) -> Any:
    """A copy of the parsed experiment JSON with each override applied in order (a later one wins). A key
    missing from an object is added (the schema then names an unknown one); a list is indexed by an
    integer part within it."""
    out = copy.deepcopy(data)
    for o in overrides:
        node = out
        for depth, part in enumerate(o.path):
            where = ".".join(o.path[:depth]) or "the experiment"
            last = depth == len(o.path) - 1
            if isinstance(node, dict):
                if last:
                    node[part] = o.value
                else:
                    node = node.setdefault(part, {})
            elif isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ExperimentError(
                        f"--set {short(o.text)}: {where} is a list of {len(node)}; {short(part)} is no index in it"
                    )
                if last:
                    node[int(part)] = o.value
                else:
                    node = node[int(part)]
            else:
                raise ExperimentError(f"--set {short(o.text)}: {where} is {short(node)}, not an object")
    return out


def load_effective(
    path: Path, texts: list[str], check_sources: bool = True, model_defaults: dict[str, int] | None = None
) -> tuple[Experiment, bytes | None]:
    """The experiment file with the `--set` overrides applied and validated, and the bytes the run freezes
    (None when they are the file's own). `model_defaults`: the `model` block's values where the file gives
    none (`--init-from`'s config.json), applied before the overrides."""
    if not texts and not model_defaults:
        return load_experiment(path, check_sources=check_sources), None
    if len(texts) > MAX_OVERRIDES:
        raise ExperimentError(f"--set: at most {MAX_OVERRIDES} overrides, got {len(texts)}")
    overrides = [parse_override(t) for t in texts]
    data = read_json(path)
    if not isinstance(data, dict):
        raise config_error(path, [f"expected a JSON object at the top level, got {type(data).__name__}"])
    filled = with_model_defaults(data, model_defaults or {})
    if not texts and filled == data:
        return load_experiment(path, check_sources=check_sources), None
    data = apply_overrides(filled, overrides)
    label = f"{path}" + (f" with --set {', '.join(short(t) for t in texts)}" if texts else "")
    experiment = parse_experiment(data, label)
    if check_sources:
        problems = source_problems(experiment, path.parent)
        if problems:
            raise config_error(label, problems)
    return experiment, json_bytes(data)


def with_model_defaults(data: dict, defaults: dict[str, int]) -> dict:
    """`data` with each key of `defaults` its `model` block lacks added (a block that is no object is left to
    the schema's message)."""
    model = data.get("model", {})
    if not defaults or not isinstance(model, dict):
        return data
    return {**data, "model": {**defaults, **model}}
