"""proxy/qualification_compare.py: the state comparison of a fast path's check against the verified path's."""

from __future__ import annotations

import numpy as np

from proxy.qualification_checks import CheckRun
from proxy.qualification_compare import compared_parts, state_figures, tensors

SHAPE = {"vocab": 32, "ctx": 8, "dim": 8, "layers": 2}
OPTIMIZER = {"lr": 1e-3, "min_lr": 1e-4, "beta1": 0.9, "beta2": 0.95}


def verified(rng: np.random.Generator) -> CheckRun:
    n = sum(b - a for _name, a, b in tensors(SHAPE))
    initial = rng.normal(0, 0.02, n).astype(np.float32)
    step = rng.normal(0, 1e-3, n).astype(np.float32)  # a few steps of lr 1e-3
    m = rng.normal(0, 1e-3, n).astype(np.float32)
    return CheckRun(weights=initial + step, m=m, v=(m * m + 1e-8).astype(np.float32), initial=initial)


def with_third(run: CheckRun, layer: int, third: int, rng: np.random.Generator) -> CheckRun:
    """A copy of `run` whose update of layer's QKV bias third (0 q, 1 k, 2 v) is other values of its size."""
    a = next(a for name, a, _b in tensors(SHAPE) if name == f"h{layer}.qkv.b") + third * SHAPE["dim"]
    b = a + SHAPE["dim"]
    weights = run.weights.copy()
    weights[a:b] = run.initial[a:b] + rng.normal(0, 1e-3, b - a).astype(np.float32)
    return CheckRun(weights=weights, m=run.m, v=run.v, initial=run.initial)


def test_every_qkv_bias_is_compared_in_thirds_and_the_rest_whole():
    parts = list(compared_parts(SHAPE))
    whole = list(tensors(SHAPE))
    assert sum(b - a for _n, a, b, _c in parts) == sum(b - a for _n, a, b in whole)
    assert [name for name, _a, _b, by_norm in parts if not by_norm] == ["h0.qkv.b[k]", "h1.qkv.b[k]"]


def test_the_key_bias_update_is_rounding_noise_and_not_compared_by_norm():
    """Its gradient is zero in exact arithmetic, so two honest paths' Adam steps there are unrelated."""
    rng = np.random.default_rng(0)
    base = verified(rng)
    figures, problems = state_figures(SHAPE, OPTIMIZER, with_third(base, 1, 1, rng), base)
    assert problems == [] and figures.update_rel == 0.0


def test_a_query_or_value_bias_update_off_still_fails():
    rng = np.random.default_rng(0)
    base = verified(rng)
    for third, part in ((0, "q"), (2, "v")):
        _figures, problems = state_figures(SHAPE, OPTIMIZER, with_third(base, 0, third, rng), base)
        assert any(f"update of h0.qkv.b[{part}] off by" in p for p in problems), problems
