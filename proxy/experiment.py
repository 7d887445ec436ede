"""Experiment files: schema, loading with one-line errors, caps files, engine flags.

An experiment file is JSON (docs/EXPERIMENTS.md describes every field). It is
validated strictly: an unknown key, a value of the wrong type, a cap below its
floor, floors summing above 1 or a missing data source is an error, and every
problem found is reported on one line that names the file, e.g.

    experiments/x.json: train.lr: expected a number, got "fast"; arms[1].sources: at least one source is required
"""
from __future__ import annotations

import glob as _glob
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# Built-in sources (docs/EXPERIMENTS.md, "Sources"). random_tokens is the one whose
# documents are token ids, not text: it is made after the tokenizer and trains no part of it.
BUILTIN_SOURCES = ("stdlib_code", "stdlib_docstrings", "pydoc_topics", "random_tokens", "repeated_names")
TOKEN_SOURCES = ("random_tokens",)
ARM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAX_TOKEN_ID = 65536  # token shards and frames carry uint16 tokens


class ExperimentError(ValueError):
    """A bad experiment or caps file. The message is one line naming the file and each problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ModelConfig(_Strict):
    """The network's shape: GPT-2 style, weights tied (DESIGN.md, "The model")."""
    vocab: int = Field(ge=258, le=MAX_TOKEN_ID)
    ctx: int = Field(ge=1)
    dim: int = Field(ge=1)
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)

    @model_validator(mode="after")
    def _heads_divide_dim(self):
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}")
        return self

    @property
    def n_params(self) -> int:
        v, t, c, l = self.vocab, self.ctx, self.dim, self.layers
        return v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c


class TrainConfig(_Strict):
    """Optimizer, schedule and the proxy's cadence (checkpoints, evals, samples)."""
    batch: int = Field(ge=1)
    grad_accum: int = Field(default=1, ge=1)
    max_steps: int = Field(ge=1)
    lr: float = Field(gt=0)
    min_lr: float = Field(ge=0)
    warmup: int = Field(ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    seed: int = Field(ge=0, lt=2**63)
    ckpt_every: int = Field(default=100, ge=0)
    eval_every: int = Field(default=100, ge=0)
    eval_rows: int = Field(ge=1)
    sample_every: int = Field(default=100, ge=0)
    lag: int = Field(default=2, ge=1)
    keep_last: int = Field(default=3, ge=0)
    milestone_every: int = Field(default=1000, ge=0)
    threads: Optional[int] = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _lr_order(self):
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr:g} is above lr {self.lr:g}")
        return self

    @property
    def rows(self) -> int:
        """Rows per TRAIN frame: batch * grad_accum."""
        return self.batch * self.grad_accum


# Which bandit parameters belong to which policy; setting one that the chosen
# policy does not use is an error (it would silently do nothing).
_POLICY_PARAMS = {
    "ucb1": {"c", "ema_alpha", "reward_scale", "temperature"},
    "exp3": {"ema_alpha", "smoothing"},
    "uniform": {"ema_alpha"},
    "progress": {"ema_alpha", "window", "explore", "smoothing", "record_alpha"},
}


class BanditConfig(_Strict):
    """The mixture policy (docs/EXPERIMENTS.md, "Bandit policies")."""
    policy: Literal["ucb1", "exp3", "uniform", "progress"] = "progress"  # docs/DATA-MIXING.md: the one that won
    # ucb1
    c: float = Field(default=1.0, ge=0)
    reward_scale: float = Field(default=1000.0, gt=0)
    temperature: float = Field(default=10.0, ge=0)
    # both: EMA of each arm's loss (ucb1's reward baseline; shown for exp3)
    ema_alpha: float = Field(default=0.1, gt=0, le=1)
    # exp3: weight of the old estimate in the smoothed reward update
    smoothing: float = Field(default=0.9, ge=0, lt=1)
    # progress: the EMA whose record lows it follows, the pulls its speed is fitted over, the spare
    # mass spread evenly
    record_alpha: float = Field(default=0.05, gt=0, le=1)
    window: int = Field(default=100, ge=3)
    explore: float = Field(default=0.05, ge=0, le=1)

    @model_validator(mode="after")
    def _params_match_policy(self):
        # A parameter of another policy left at its default is accepted, so a
        # dump of a validated config (which writes every field) loads again.
        stray = sorted(k for k in self.model_fields_set - {"policy"} - _POLICY_PARAMS[self.policy]
                       if getattr(self, k) != type(self).model_fields[k].default)
        if stray:
            raise ValueError(f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to policy {self.policy!r}")
        return self


class SourceConfig(_Strict):
    """One data source: exactly one of file, glob, dir, jsonl, builtin."""
    file: Optional[str] = None
    glob: Optional[str] = None
    dir: Optional[str] = None
    jsonl: Optional[str] = None
    builtin: Optional[Literal[BUILTIN_SOURCES]] = None
    suffix: Optional[str] = None          # dir: only files whose name ends with this
    field: Optional[str] = None           # jsonl: the text field (default "text")
    modules: Optional[list[str]] = None   # builtin stdlib_code / stdlib_docstrings: only these modules/packages
    max_chars: Optional[int] = Field(default=None, ge=1)  # any: keep documents until this many characters

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k in ("file", "glob", "dir", "jsonl", "builtin") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a source needs exactly one of file, glob, dir, jsonl, builtin"
                             + (f" (got {', '.join(kinds)})" if kinds else ""))
        kind = kinds[0]
        if self.suffix is not None and kind != "dir":
            raise ValueError("suffix applies only to a dir source")
        if self.field is not None and kind != "jsonl":
            raise ValueError("field applies only to a jsonl source")
        if self.modules is not None and self.builtin not in ("stdlib_code", "stdlib_docstrings"):
            raise ValueError("modules applies only to builtin stdlib_code and stdlib_docstrings")
        if self.modules is not None and (not self.modules or not all(self.modules)):
            raise ValueError("modules must be a non-empty list of module names")
        if self.max_chars is not None and self.builtin in TOKEN_SOURCES:
            raise ValueError(f"max_chars does not apply to builtin {self.builtin} (its documents are tokens)")
        for k in ("file", "glob", "dir", "jsonl"):
            if getattr(self, k) == "":
                raise ValueError(f"{k} must not be empty")
        return self

    @property
    def kind(self) -> str:
        for k in ("file", "glob", "dir", "jsonl", "builtin"):
            if getattr(self, k) is not None:
                return k
        raise AssertionError("validated source without a kind")

    @property
    def target(self) -> str:
        return getattr(self, self.kind)


class ArmConfig(_Strict):
    """A bandit arm: a named data source (one or more sources, concatenated)."""
    name: str
    sources: list[SourceConfig]
    cap: float = Field(default=1.0, ge=0, le=1)
    floor: float = Field(default=0.0, ge=0, le=1)
    # Counted in the validation loss an evaluation targets (scripts/eval_mixing.py); no policy reads it.
    target: bool = True

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not ARM_NAME.match(v):
            raise ValueError(f"arm name {v!r} must be letters, digits, '_', '.', '-' (not starting with '.' or '-')")
        return v

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list) -> list:
        if not v:
            raise ValueError("at least one source is required")
        if len(v) > 1 and any(src.builtin in TOKEN_SOURCES for src in v):
            raise ValueError(f"a builtin {'/'.join(TOKEN_SOURCES)} source must be its arm's only source")
        return v

    @model_validator(mode="after")
    def _cap_floor(self):
        if self.cap < self.floor:
            raise ValueError(f"cap {self.cap:g} is below floor {self.floor:g}")
        return self


class SampleConfig(_Strict):
    """What the periodic sample audits generate (every train.sample_every steps)."""
    prompts: list[str] = Field(default_factory=lambda: ["def ", "import ", "The "])
    max_new: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.8, ge=0)
    top_k: int = Field(default=40, ge=0)
    count: int = Field(default=1, ge=1)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one prompt is required")
        if not all(v):
            raise ValueError("a prompt must not be empty")
        return v


class Experiment(_Strict):
    name: str
    model: ModelConfig
    train: TrainConfig
    bandit: BanditConfig = Field(default_factory=BanditConfig)
    arms: list[ArmConfig]
    samples: SampleConfig = Field(default_factory=SampleConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not ARM_NAME.match(v):
            raise ValueError(f"name {v!r} must be letters, digits, '_', '.', '-' (it names the run directory)")
        return v

    @field_validator("arms")
    @classmethod
    def _arms(cls, arms: list[ArmConfig]) -> list[ArmConfig]:
        if not arms:
            raise ValueError("at least one arm is required")
        if len(arms) > MAX_TOKEN_ID:
            raise ValueError(f"at most {MAX_TOKEN_ID} arms (group ids are uint16)")
        names = [a.name for a in arms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate arm name {', '.join(map(repr, dup))}")
        problems = check_caps_floors({a.name: a.cap for a in arms}, {a.name: a.floor for a in arms})
        if not any(a.target for a in arms):
            problems.append("at least one arm must be a target")
        if problems:
            raise ValueError("; ".join(problems))
        return arms

    @property
    def arm_names(self) -> list[str]:
        return [a.name for a in self.arms]

    @property
    def caps(self) -> dict[str, float]:
        return {a.name: a.cap for a in self.arms}

    @property
    def floors(self) -> dict[str, float]:
        return {a.name: a.floor for a in self.arms}

    @property
    def target_arms(self) -> list[str]:
        return [a.name for a in self.arms if a.target]

    def engine_flags(self) -> list[str]:
        """The engine's command-line flags for this experiment's model and optimizer (docs/ENGINE.md)."""
        m, t = self.model, self.train
        flags = [
            ("--vocab", m.vocab), ("--ctx", m.ctx), ("--dim", m.dim), ("--layers", m.layers), ("--heads", m.heads),
            ("--batch", t.batch), ("--grad-accum", t.grad_accum), ("--steps", t.max_steps),
            ("--lr", t.lr), ("--min-lr", t.min_lr), ("--warmup", t.warmup),
            ("--beta1", t.beta1), ("--beta2", t.beta2), ("--eps", t.eps),
            ("--weight-decay", t.weight_decay), ("--grad-clip", t.grad_clip), ("--seed", t.seed),
        ]
        if t.threads is not None:
            flags.append(("--threads", t.threads))
        out: list[str] = []
        for flag, value in flags:
            out += [flag, repr(float(value)) if isinstance(value, float) else str(int(value))]
        return out


def check_caps_floors(caps: dict[str, float], floors: dict[str, float]) -> list[str]:
    """Problems that make the capped simplex empty (per arm, then in total)."""
    problems = [f"{n}: cap {caps[n]:g} is below floor {floors[n]:g}" for n in caps if caps[n] < floors[n]]
    total_floor = math.fsum(floors.values())
    if total_floor > 1 + 1e-9:
        problems.append(f"floors sum to {total_floor:g}, above 1")
    total_cap = math.fsum(caps.values())
    if total_cap < 1 - 1e-9:
        problems.append(f"caps sum to {total_cap:g}, below 1 (no mixture fits)")
    return problems


# ---------------------------------------------------------------------------
# Error formatting: pydantic errors -> "path: problem" phrases, one line.

_TYPE_WORDS = {
    "int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "string_type": "a string", "bool_type": "true or false",
    "list_type": "a list", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object",
}


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _short(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _phrase(err: dict) -> str:
    loc = tuple(p for p in err.get("loc", ()) if not (isinstance(p, str) and p.startswith("function-")))
    kind = err.get("type", "")
    where = _loc(loc)
    if kind == "extra_forbidden":
        parent, key = _loc(loc[:-1]), loc[-1] if loc else "?"
        return f"{parent + ': ' if parent else ''}unknown key {key!r}"
    if kind == "missing":
        return f"{where}: missing (required)"
    if kind in _TYPE_WORDS:
        return f"{where}: expected {_TYPE_WORDS[kind]}, got {_short(err.get('input'))}"
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    elif msg.startswith("Assertion failed, "):
        msg = msg[len("Assertion failed, "):]
    else:
        msg = msg[0].lower() + msg[1:] if msg else msg
        if "input" in err and kind not in ("literal_error",):
            msg += f", got {_short(err['input'])}"
        elif kind == "literal_error":
            msg += f", got {_short(err.get('input'))}"
    return f"{where}: {msg}" if where else msg


def format_validation_error(err: ValidationError) -> list[str]:
    seen: list[str] = []
    for e in err.errors(include_url=False):
        p = _phrase(e)
        if p not in seen:
            seen.append(p)
    return seen


def _fail(path: Path | str, problems: list[str]) -> ExperimentError:
    return ExperimentError(f"{path}: " + "; ".join(p.replace("\n", " ") for p in problems))


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(path, ["no such file"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(path, [f"cannot read: {e}"]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(path, [f"not JSON: {e.msg} at line {e.lineno} column {e.colno}"]) from None


def source_problems(experiment: Experiment, experiment_dir: Path | str) -> list[str]:
    """Missing files, directories and globs matching nothing, relative to `experiment_dir`."""
    base = Path(experiment_dir)
    problems = []
    for i, arm in enumerate(experiment.arms):
        for j, src in enumerate(arm.sources):
            where = f"arms[{i}].sources[{j}].{src.kind}"
            if src.kind in ("file", "jsonl"):
                p = base / src.target
                if not p.is_file():
                    problems.append(f"{where}: no such file {src.target!r} (looked at {p})")
            elif src.kind == "dir":
                p = base / src.target
                if not p.is_dir():
                    problems.append(f"{where}: no such directory {src.target!r} (looked at {p})")
            elif src.kind == "glob":
                pattern = src.target if os.path.isabs(src.target) else str(base / src.target)
                if not any(Path(m).is_file() for m in _glob.glob(pattern, recursive=True)):
                    problems.append(f"{where}: pattern {src.target!r} matches no file (looked for {pattern})")
    return problems


def parse_experiment(data: Any, path: Path | str = "<experiment>") -> Experiment:
    """Validate already-parsed JSON; raise ExperimentError (one line) on any problem."""
    if not isinstance(data, dict):
        raise _fail(path, [f"expected a JSON object at the top level, got {type(data).__name__}"])
    try:
        return Experiment.model_validate(data)
    except ValidationError as e:
        raise _fail(path, format_validation_error(e)) from None


def load_experiment(path: str | os.PathLike, check_sources: bool = True) -> Experiment:
    """Load and validate an experiment file. Relative source paths are resolved
    against the file's directory; with `check_sources`, a missing file or
    directory or a glob that matches nothing is an error too."""
    path = Path(path)
    exp = parse_experiment(_read_json(path), path)
    if check_sources:
        problems = source_problems(exp, path.parent)
        if problems:
            raise _fail(path, problems)
    return exp


# ---------------------------------------------------------------------------
# Caps files: {"caps": {"arm": 0.5}, "floors": {"arm": 0.05}}, either map partial.

class CapsFile(_Strict):
    caps: dict[str, float] = Field(default_factory=dict)
    floors: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ranges(self):
        bad = [f"{kind}.{arm}: {v:g} is outside [0, 1]"
               for kind, m in (("caps", self.caps), ("floors", self.floors))
               for arm, v in m.items() if not (0.0 <= v <= 1.0)]
        if bad:
            raise ValueError("; ".join(bad))
        return self


def apply_caps(caps_file: CapsFile, experiment: Experiment, path: Path | str = "<caps>",
               base: tuple[dict, dict] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Merge a caps file over `base` (default: the experiment's caps and floors) and check the result."""
    names = experiment.arm_names
    caps, floors = (dict(base[0]), dict(base[1])) if base else (experiment.caps, experiment.floors)
    problems = [f"{kind}: unknown arm {arm!r} (arms: {', '.join(names)})"
                for kind, m in (("caps", caps_file.caps), ("floors", caps_file.floors))
                for arm in m if arm not in names]
    if problems:
        raise _fail(path, problems)
    caps.update(caps_file.caps)
    floors.update(caps_file.floors)
    problems = check_caps_floors(caps, floors)
    if problems:
        raise _fail(path, problems)
    return caps, floors


def load_caps(path: str | os.PathLike, experiment: Experiment,
              base: tuple[dict, dict] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Read a caps file; return the full (caps, floors) maps for every arm.

    Arms the file does not name keep the values in `base` (default: the
    experiment's). Unknown arm, cap below floor, floors above 1, caps below 1,
    a value outside [0, 1] or a file that is not JSON raise ExperimentError.
    """
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, dict):
        raise _fail(path, [f"expected a JSON object, got {type(data).__name__}"])
    try:
        cf = CapsFile.model_validate(data)
    except ValidationError as e:
        raise _fail(path, format_validation_error(e)) from None
    return apply_caps(cf, experiment, path, base)
