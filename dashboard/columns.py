"""The value columns the dashboard plots per step, and a step's throughput.

The fields themselves are read from `.loss.json` by proxy/formats/loss_log.py
(`step_fields`, `eval_fields`): one reader of the log for the proxy and the
dashboard.
"""
from __future__ import annotations

from proxy.formats.loss_log import NAN, StepFields

# value columns every run has; the mixture weights follow as "mix:<arm>"
BASE_COLS = ("loss", "lr", "grad_norm", "ms", "tok_s")


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
