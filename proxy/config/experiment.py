"""Experiment files: the schema, and loading one with one-line errors (docs/EXPERIMENTS.md).

An experiment file is JSON (docs/EXPERIMENTS.md describes every field). It is
validated strictly: an unknown key, a value of the wrong type, a cap below its
floor, floors summing above 1 or a missing data source is an error, and every
problem found is reported on one line that names the file, e.g.

    experiments/x.json: train.lr: expected a number, got "fast"; arms[1].sources: at least one source is required
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, field_validator, model_validator

from ..formats.engine_cli import MAX_STEP, setting_flags
from ..formats.frames import SAMPLE_MAX_COMPLETIONS
from ..formats.lr_schedule import DEFAULT_DECAY_FRACTION, DEFAULT_SCHEDULE, Schedule
from ..formats.parameters import n_params
from .bounds import cap_below_floor, check_caps_floors
from .config_file import config_error, format_validation_error, read_json
from .policies import BanditConfig, TargetConfig
from .sources import FILE, SourceConfig, TokensSource, is_token_source, path_problem
from .strict import MAX_ARMS, MAX_NAME, MAX_PATH, MAX_WORD, PathText, StrictModel, Word  # noqa: F401 - the bounds, re-exported
from .tracking import LogConfig

DEFAULT_LR = 6e-4  # GPT-2 small's, nanoGPT's
MAX_DEFAULT_WARMUP = 1000
DEFAULT_EVAL_TOKENS = 65536  # docs/EXPERIMENTS.md, "How many tokens an evaluation takes"
DATA_ARM = "main"  # the one arm an experiment's `data` becomes
ARM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAX_TOKEN_ID = 65536  # token shards and frames carry uint16 tokens

# Bounds on every name, string and list a user writes, so that every later use holds: a name in a file
# name (`<arm>.train.tok`, `runs/<name>`), in every `.loss.json` line (arms x (name + two floats) stays
# far below the 1 MiB a reader takes), in `.state.json` and phases.json, and on the dashboard; a sample
# audit of the most prompts x count x max_new fits in `.samples.json`'s cap (tests/faults check it).
# MAX_NAME and MAX_ARMS are in strict.py, where `.loss.json`'s readers take them from too.
MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 1000
MAX_SAMPLE_COUNT = 16
MAX_SAMPLE_TOKENS = 4096
# an audit (every prompt x count) is one SAMPLE frame: the bounds keep it within the engine's limit
assert MAX_PROMPTS * MAX_SAMPLE_COUNT <= SAMPLE_MAX_COMPLETIONS


def _name_check(what: str, why: str) -> AfterValidator:
    """Arm and experiment names: letters, digits, '_', '.', '-', not starting with '.' or '-'."""

    def check(value: str) -> str:
        if not ARM_NAME.match(value):
            raise ValueError(f"{what} {value!r} must be letters, digits, '_', '.', '-' ({why})")
        return value

    return AfterValidator(check)


ArmName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME), _name_check("arm name", "not starting with '.' or '-'")
]
RunName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME), _name_check("name", "it names the run directory")
]  # the run directory's default name


class ModelConfig(StrictModel):
    """The network's shape: GPT-2 style, weights tied (docs/ARCHITECTURE.md, "The model and its parameters")."""

    vocab: int = Field(ge=258, le=MAX_TOKEN_ID)
    ctx: int = Field(ge=1)
    dim: int = Field(ge=1)
    layers: int = Field(ge=1)
    heads: int = Field(ge=1)

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> ModelConfig:
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}")
        return self

    @property
    def n_params(self) -> int:
        return n_params(self.vocab, self.ctx, self.dim, self.layers)


class TrainConfig(StrictModel):
    """Optimizer, schedule and the proxy's cadence (checkpoints, evals, samples). Only max_steps is
    required; min_lr and warmup default to values derived from lr and max_steps (_derived_defaults)."""

    batch: int = Field(default=8, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    max_steps: int = Field(ge=1, le=MAX_STEP)  # the engine's steps are int32
    lr: float = Field(default=DEFAULT_LR, gt=0)
    min_lr: float = Field(ge=0)
    lr_schedule: Schedule = DEFAULT_SCHEDULE  # after the warmup (formats/lr_schedule.py)
    decay_fraction: float = Field(default=DEFAULT_DECAY_FRACTION, gt=0, le=1)  # wsd: the final fraction that decays
    warmup: int = Field(ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    seed: int = Field(default=1337, ge=0, lt=2**63)
    ckpt_every: int = Field(default=100, ge=0)
    ckpt_every_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)  # also on the clock; 0: off
    eval_every: int = Field(default=100, ge=0)
    # the held-out tokens each arm is evaluated on (rows of ctx predicted tokens); eval_rows, when given, wins
    eval_tokens: int = Field(default=DEFAULT_EVAL_TOKENS, ge=1)
    eval_rows: int | None = Field(default=None, ge=1)
    sample_every: int = Field(default=100, ge=0)
    log_every: int = Field(default=100, ge=0)  # a progress line every N steps (and every 30 s); 0: on the clock only
    lag: int = Field(default=2, ge=1)
    keep_last: int = Field(default=3, ge=0)
    milestone_every: int = Field(default=1000, ge=0)
    threads: int | None = Field(default=None, ge=1)
    # auto: bf16 on a GPU that has it, fp32 on the CPU; fp8: the linear layers' GEMMs through FP8 (docs/ENGINE.md,
    # "FP8"): the CPU engine always, the CUDA engine only where its check passes (proxy/qualification_fp8.py).
    precision: Literal["auto", "fp8"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data: Any) -> Any:
        """min_lr: lr / 10 (nanoGPT's and GPT-3's floor); warmup: 5% of max_steps, at most 1000 steps
        (GPT-3 warms up over its first few hundred million tokens). Only where the value they derive
        from is itself valid; otherwise that field's own error is the one reported."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        lr, steps = data.get("lr", DEFAULT_LR), data.get("max_steps")
        number = isinstance(lr, float | int) and not isinstance(lr, bool) and lr > 0
        if "min_lr" not in data:  # 0 in place of a bad lr's: only the lr's error is reported
            data["min_lr"] = float(f"{lr / 10:.12g}") if number else 0.0  # 6e-05, not 5.9999999999999995e-05
        if "warmup" not in data:
            good = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
            data["warmup"] = min(MAX_DEFAULT_WARMUP, steps // 20) if good else 0
        return data

    @model_validator(mode="after")
    def _lr_order(self) -> TrainConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr:g} is above lr {self.lr:g}")
        return self

    @property
    def rows(self) -> int:
        """Rows per TRAIN frame: batch * grad_accum."""
        return self.batch * self.grad_accum

    def eval_row_count(self, ctx: int, longest_val: int | None = None) -> int:
        """Validation rows per arm at each evaluation: eval_rows, else enough rows of `ctx` predicted
        tokens to hold eval_tokens, but no more than the longest arm's validation tokens (`longest_val`,
        when known) hold side by side: rows beyond that would only repeat its tokens."""
        if self.eval_rows is not None:
            return self.eval_rows
        rows = -(-self.eval_tokens // ctx)
        return rows if longest_val is None else max(1, min(rows, longest_val // (ctx + 1)))


class ArmConfig(StrictModel):
    """A bandit arm: a named data source (one or more sources, concatenated)."""

    name: ArmName
    sources: list[SourceConfig]
    cap: float = Field(default=1.0, ge=0, le=1)
    floor: float = Field(default=0.0, ge=0, le=1)
    # Counted in the validation loss an evaluation targets (scripts/eval_mixing.py); no policy reads it.
    target: bool = True

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list) -> list:
        if not v:
            raise ValueError("at least one source is required")
        if len(v) > 1 and any(is_token_source(src) for src in v):
            token = next(src for src in v if is_token_source(src))
            raise ValueError(
                f"a {token.kind} {token.target} source must be its arm's only source (its documents are token ids)"
            )
        return v

    @model_validator(mode="after")
    def _cap_floor(self) -> ArmConfig:
        problem = cap_below_floor(self.cap, self.floor)
        if problem:
            raise ValueError(problem)
        return self


class SampleConfig(StrictModel):
    """What the periodic sample audits generate (every train.sample_every steps)."""

    prompts: list[Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]] = Field(
        default_factory=lambda: ["def ", "import ", "The "], max_length=MAX_PROMPTS
    )
    max_new: int = Field(default=64, ge=1, le=MAX_SAMPLE_TOKENS)
    temperature: float = Field(default=0.8, ge=0)
    top_k: int = Field(default=40, ge=0)
    count: int = Field(default=1, ge=1, le=MAX_SAMPLE_COUNT)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one prompt is required")
        if not all(v):
            raise ValueError("a prompt must not be empty")
        return v


class Experiment(StrictModel):
    name: RunName
    model: ModelConfig
    train: TrainConfig
    bandit: BanditConfig = Field(default_factory=TargetConfig)  # policies.py: one model per policy
    # a Hugging Face tokenizer.json to use instead of training a byte-level BPE on the arms' text
    tokenizer: PathText | None = None
    # its end-of-text token (the separator between documents); None: the first of tokenizer.COMMON_EOTS it holds
    eot: Word | None = None
    # one dataset without a mixture: its sources become the one arm DATA_ARM (_data_is_one_arm)
    data: list[SourceConfig] | None = None
    arms: list[ArmConfig] = Field(default_factory=list, max_length=MAX_ARMS)
    samples: SampleConfig = Field(default_factory=SampleConfig)
    log: LogConfig = Field(default_factory=LogConfig)  # TensorBoard and W&B (config/tracking.py)
    _from_data: bool = PrivateAttr(default=False)  # its one arm was written as `data` (messages name it so)

    @field_validator("data", mode="before")
    @classmethod
    def _one_source_or_a_list(cls, data: Any) -> Any:
        return [data] if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _data_is_one_arm(cls, raw: Any) -> Any:
        """`"data": SOURCE or [SOURCES]` is the arm `{"name": DATA_ARM, "sources": [...]}`: read as that arm
        from here on (and dumped so), never beside `arms`."""
        if not isinstance(raw, dict) or raw.get("data") is None:
            return raw
        if raw.get("arms"):
            raise ValueError("give either data (one dataset) or arms (a mixture), not both")
        return raw

    @model_validator(mode="after")
    def _one_arm_from_data(self) -> Experiment:
        if self.data is not None:
            self.arms = [ArmConfig(name=DATA_ARM, sources=self.data)]
            self.data = None
            self._from_data = True
        if not self.arms:
            raise ValueError("no data: give data (one dataset) or arms (a mixture)")
        return self

    @field_validator("arms")
    @classmethod
    def _arms(cls, arms: list[ArmConfig]) -> list[ArmConfig]:
        if not arms:
            return arms  # data instead, or neither: _one_arm_from_data says so
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

    @model_validator(mode="after")
    def _tokens_need_a_tokenizer(self) -> Experiment:
        if self.tokenizer == "":
            raise ValueError("tokenizer must not be empty")
        if self.eot is not None and self.tokenizer is None:
            raise ValueError("eot names the end-of-text token of a given tokenizer: name the tokenizer too")
        token_arms = [a.name for a in self.arms if any(isinstance(s, TokensSource) for s in a.sources)]
        if token_arms and self.tokenizer is None:
            raise ValueError(
                f"arm {token_arms[0]!r} reads token files: the experiment must name their tokenizer "
                '("tokenizer": "path/to/tokenizer.json"), so that samples and exports decode'
            )
        return self

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
        return setting_flags(
            vocab=m.vocab,
            ctx=m.ctx,
            dim=m.dim,
            layers=m.layers,
            heads=m.heads,
            batch=t.batch,
            grad_accum=t.grad_accum,
            steps=t.max_steps,
            lr=t.lr,
            min_lr=t.min_lr,
            lr_schedule=t.lr_schedule,
            decay_fraction=t.decay_fraction,
            warmup=t.warmup,
            beta1=t.beta1,
            beta2=t.beta2,
            eps=t.eps,
            weight_decay=t.weight_decay,
            grad_clip=t.grad_clip,
            seed=t.seed,
            threads=t.threads,
        )


def source_problems(experiment: Experiment, experiment_dir: Path | str) -> list[str]:
    """Missing files, directories and patterns matching nothing, relative to `experiment_dir`."""
    problems = []
    if experiment.tokenizer is not None:
        problem = path_problem("tokenizer", experiment.tokenizer, FILE, experiment_dir)
        if problem:
            problems.append(problem)
    for i, arm in enumerate(experiment.arms):
        for j, src in enumerate(arm.sources):
            for name, text, what in src.path_fields():
                problem = path_problem(name, text, what, experiment_dir)
                if problem:
                    where = f"data[{j}]" if experiment._from_data else f"arms[{i}].sources[{j}]"
                    problems.append(f"{where}.{problem}")
    return problems


def parse_experiment(data: Any, path: Path | str = "<experiment>") -> Experiment:
    """Validate already-parsed JSON; raise ExperimentError (one line) on any problem."""
    if not isinstance(data, dict):
        raise config_error(path, [f"expected a JSON object at the top level, got {type(data).__name__}"])
    try:
        return Experiment.model_validate(data)
    except ValidationError as e:
        raise config_error(path, format_validation_error(e)) from None


def load_experiment(path: str | os.PathLike, check_sources: bool = True) -> Experiment:
    """Load and validate an experiment file. Relative source paths are resolved
    against the file's directory; with `check_sources`, a missing file or
    directory or a glob that matches nothing is an error too."""
    path = Path(path)
    exp = parse_experiment(read_json(path), path)
    if check_sources:
        problems = source_problems(exp, path.parent)
        if problems:
            raise config_error(path, problems)
    return exp
