"""Fields of `.loss.json` entries the dashboard plots (docs/FORMATS.md).

Anything malformed becomes NaN (a missing value) or, where the step itself is
not a non-negative integer, makes the entry unusable (None). Nothing here
raises on bad input.
"""
from __future__ import annotations

from typing import NamedTuple

NAN = float("nan")
# value columns every run has; the mixture weights follow as "mix:<arm>"
BASE_COLS = ("loss", "lr", "grad_norm", "ms", "tok_s")
MAX_ARMS = 64  # more mixture arms than this in one entry: the extra are ignored
MAX_NAME = 80


def num(v) -> float:
    """A finite float, or NaN for anything else (None, strings, bools, inf)."""
    t = type(v)
    if t is float:
        return v if v - v == 0.0 else NAN
    if t is int and -(1 << 1000) < v < (1 << 1000):
        return float(v)
    return NAN


def step_of(v) -> int | None:
    t = type(v)
    if t is int:
        return v if 0 <= v < 1 << 53 else None
    if t is float and v.is_integer() and 0 <= v < 2 ** 53:
        return int(v)
    return None


def arm_map(v) -> dict[str, float]:
    """{arm: finite float} from an entry's "arms"/"mixture" object (bad values dropped)."""
    if type(v) is not dict:
        return {}
    out = {}
    for k, x in v.items():
        if type(x) is float and x - x == 0.0 or type(x) is int and -(1 << 1000) < x < (1 << 1000):
            if type(k) is str and 0 < len(k) <= MAX_NAME:
                out[k] = float(x)
                if len(out) >= MAX_ARMS:
                    break
    return out


class StepFields(NamedTuple):
    step: int
    tokens: float
    time: float
    loss: float
    lr: float
    grad_norm: float
    ms: float
    mixture: dict


class EvalFields(NamedTuple):
    step: int
    loss: float
    arms: dict
    time: float


def step_fields(obj: dict) -> StepFields | None:
    if obj.get("type") != "step":
        return None
    step = obj.get("step")
    if type(step) is not int or not 0 <= step < 1 << 53:
        step = step_of(step)
        if step is None:
            return None
    g = obj.get
    return StepFields(step, num(g("tokens")), num(g("time")), num(g("loss")), num(g("lr")),
                      num(g("grad_norm")), num(g("ms")), arm_map(g("mixture")))


def eval_fields(obj: dict) -> EvalFields | None:
    if obj.get("type") != "eval":
        return None
    step = step_of(obj.get("step"))
    if step is None:
        return None
    return EvalFields(step, num(obj.get("loss")), arm_map(obj.get("arms")), num(obj.get("time")))


def tokens_per_s(f: StepFields, prev_step: int | None, prev_tokens: float | None) -> float:
    """Training throughput of one step: its tokens over its engine time.

    `tokens` is cumulative; the step's own tokens are the difference from the
    previous step when that is known, else the run's mean tokens per step.
    """
    if not (f.ms > 0) or not (f.tokens == f.tokens):
        return NAN
    if prev_step is not None and prev_step == f.step - 1 and prev_tokens is not None and f.tokens > prev_tokens:
        d = f.tokens - prev_tokens
    elif f.step > 0:
        d = f.tokens / f.step
    else:
        return NAN
    return d / (f.ms / 1000.0)
