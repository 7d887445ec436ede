"""Judging a fast path's check runs against the verified path's (docs/CUDA.md, "Qualification").

A training path (attention, fused kernels, graph, or the chosen paths
together) is compared after CHECK_STEPS steps at the run's learning rate, on
the checkpoints both wrote: the update the steps made (Δw = final weights -
step 0's) and Adam's two moments, per parameter tensor, in norm and element
by element, plus every step's loss; its two runs must be bit-identical. The
KV cache must sample the recompute path's tokens, the asynchronous snapshot
write the synchronous writer's checkpoint bytes: both exactly.

Why these figures: AdamW is blind to the gradients' scale (m/sqrt(v) does
not change when every gradient is multiplied by a constant), so the weights
alone pass a path whose gradients are off by a factor: the moments catch it.
The moments are blind to the learning rate: the update catches a wrong or
stale one. A step not applied shows in both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from .formats.lr_schedule import lr_at
from .formats.parameters import param_layout
from .formats.qualification_record import Check, Figures, Verdict
from .qualification_checks import CHECK_SCHEDULE, CHECK_STEPS, MID_STEP, CheckRun

# The loss of every check step within LOSS_TOLERANCE of the verified path's: the GPU suite's bf16
# tolerance (tests/gpu/test_flash.py, test_bf16.py; with COSINE_MIN, their gradient-direction bound).
LOSS_TOLERANCE = 2e-2
COSINE_MIN = 0.99

# Per tensor, |x - x_verified| / |x_verified| (Euclidean norms). bf16 operands carry 8 significant
# bits (relative rounding 2^-9); summed in fp32 through the layers they leave a path's gradients
# around 1% from the verified path's. Adam's first moment is linear in the gradients: 5% is several
# times that noise, and a gradient off by a constant factor c is off by |c - 1| (a 10% scale error
# fails). The second moment is quadratic in them: twice the first's tolerance. The update is Adam's
# normalised step, close to sign(m) per element: an element whose gradient is near zero may flip,
# so bf16 noise of r in the gradients moves the update by about sqrt(r) in norm (1% -> ~10%); 25%
# leaves room for that, and a learning rate off by 25% or more (a stale one: the check's schedule
# decays from the peak to min_lr) fails.
MOMENT_RTOL = 0.05
SECOND_MOMENT_RTOL = 0.10
UPDATE_RTOL = 0.25
# Element by element, a moment may differ by MOMENT_ATOL_RMS times its tensor's RMS plus MOMENT_RTOL_ELEMENT
# of itself: 50 times the ~1% rounding noise, room for the tails of millions of elements, while a row or
# column of wrong values (a kernel's bad index) is off by about the tensor's own scale.
MOMENT_ATOL_RMS = 0.5
MOMENT_RTOL_ELEMENT = 0.25
# Each element of the update is bounded outright: Adam's bias-corrected step |m^/sqrt(v^)| is at most
# update_bound(t) at step t (Cauchy-Schwarz over the steps' gradients, whatever they are; decoupled
# weight decay only shrinks a difference), so two honest paths from the same weights differ by at most
# twice the sum of lr_t * update_bound(t). An element past it did not take an AdamW step at the run's
# learning rate. UPDATE_SLACK covers fp32 rounding.
UPDATE_SLACK = 1e-6


def update_bound(t: int, beta1: float, beta2: float) -> float:
    """The largest |m^_t / sqrt(v^_t)| any gradients give at step t (1-based)."""
    ratio = beta1 * beta1 / beta2
    series = sum(ratio**j for j in range(t))
    return (1 - beta1) / (1 - beta1**t) * math.sqrt((1 - beta2**t) / (1 - beta2)) * math.sqrt(series)


def max_update_difference(optimizer: dict[str, float]) -> float:
    """The most two AdamW trajectories of CHECK_STEPS steps at the check's schedule can differ by, per element."""
    b1, b2 = optimizer["beta1"], optimizer["beta2"]
    return 2 * sum(
        lr_at(t, lr=optimizer["lr"], min_lr=optimizer["min_lr"], warmup=1, steps=CHECK_STEPS, schedule=CHECK_SCHEDULE)
        * update_bound(t, b1, b2)
        for t in range(1, CHECK_STEPS + 1)
    )


# ------------------------------------------------------------------ per tensor


def tensors(shape: dict) -> Iterator[tuple[str, int, int]]:
    """(name, start, end) of every parameter tensor in the flat order."""
    at = 0
    for name, dims in param_layout(int(shape["vocab"]), int(shape["ctx"]), int(shape["dim"]), int(shape["layers"])):
        n = int(np.prod(dims))
        yield name, at, at + n
        at += n


def tensor_cosines(shape: dict, got: np.ndarray, ref: np.ndarray) -> list[tuple[str, float]]:
    """(name, cosine) of every parameter tensor's values, in the flat order (tests/gpu compares gradients)."""
    out = []
    for name, a, b in tensors(shape):
        x, y = got[a:b].astype(np.float64), ref[a:b].astype(np.float64)
        denom = np.linalg.norm(x) * np.linalg.norm(y)
        cos = float(np.dot(x, y) / denom) if denom > 0 else (1.0 if np.array_equal(x, y) else 0.0)
        out.append((name, cos if np.isfinite(cos) else -1.0))
    return out


def _relative(x: np.ndarray, y: np.ndarray) -> float:
    """|x - y| / |y|; 0 when both are zero, inf when only y is (or anything is not finite)."""
    diff, ref = float(np.linalg.norm(x - y)), float(np.linalg.norm(y))
    if not (math.isfinite(diff) and math.isfinite(ref)):
        return math.inf
    return diff / ref if ref > 0 else (0.0 if diff == 0 else math.inf)


def _excess(x: np.ndarray, y: np.ndarray, tol: np.ndarray | float) -> float:
    """The largest |x - y| / tol over the elements (> 1: some element is out of tolerance)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(x - y) / tol
    ratio = np.where(np.isnan(ratio), np.inf, ratio)  # a NaN anywhere is out of tolerance
    ratio = np.where((np.abs(x - y) == 0), 0.0, ratio)
    return float(ratio.max()) if ratio.size else 0.0


def compared_parts(shape: dict) -> Iterator[tuple[str, int, int, bool]]:
    """(name, start, end, by_norm) of every part of the state compared: each parameter tensor, but each
    layer's QKV bias in its thirds. The key bias's gradient is zero in exact arithmetic (adding a constant
    to every key adds q.b_k to each of a query's scores, which softmax ignores), so what the paths compute
    for it is rounding noise, which Adam scales up to full-sized steps: two honest paths differ by about
    100% there (measured on an H200: 139% for cuDNN attention, 95% for the fused step, every other tensor
    within 5%). Its third is held to the update's absolute bound only (`by_norm` False)."""
    dim = int(shape["dim"])
    for name, a, b in tensors(shape):
        if name.endswith(".qkv.b"):
            yield f"{name}[q]", a, a + dim, True
            yield f"{name}[k]", a + dim, a + 2 * dim, False
            yield f"{name}[v]", a + 2 * dim, b, True
        else:
            yield name, a, b, True


def _state(run: CheckRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, m, v) a check read back; ValueError for a run that did not (judge_training fails it)."""
    if run.weights is None or run.m is None or run.v is None:
        raise ValueError("the check wrote no final state to compare")
    return run.weights, run.m, run.v


def state_figures(shape: dict, optimizer: dict[str, float], run: CheckRun, base: CheckRun) -> tuple[Figures, list[str]]:
    """The figures of a training path's state against the verified path's, and what is out of tolerance."""
    (weights, m_run, v_run), (base_weights, m_base, v_base) = _state(run), _state(base)
    if base.initial is None:
        raise ValueError("the verified check wrote no step-0 state")
    initial = base.initial
    bound = max_update_difference(optimizer)
    worst = {"update": (0.0, ""), "m": (0.0, ""), "v": (0.0, "")}
    excess, excess_at = 0.0, ""
    for name, a, b, by_norm in compared_parts(shape):
        w0 = initial[a:b].astype(np.float64)
        du, dv = weights[a:b].astype(np.float64) - w0, base_weights[a:b].astype(np.float64) - w0
        m, mr = m_run[a:b].astype(np.float64), m_base[a:b].astype(np.float64)
        v, vr = v_run[a:b].astype(np.float64), v_base[a:b].astype(np.float64)
        if not by_norm:
            e = _excess(du, dv, bound + UPDATE_SLACK * np.abs(w0))
            if e > excess:
                excess, excess_at = e, f"update of {name}"
            continue
        for what, x, y in (("update", du, dv), ("m", m, mr), ("v", v, vr)):
            rel = _relative(x, y)
            if rel > worst[what][0]:
                worst[what] = (rel, name)
        for what, x, y, tol in (
            ("update", du, dv, bound + UPDATE_SLACK * np.abs(w0)),
            ("m", m, mr, MOMENT_ATOL_RMS * np.sqrt(np.mean(mr * mr)) + MOMENT_RTOL_ELEMENT * np.abs(mr)),
            ("v", v, vr, MOMENT_ATOL_RMS * np.sqrt(np.mean(vr * vr)) + MOMENT_RTOL_ELEMENT * np.abs(vr)),
        ):
            e = _excess(x, y, tol)
            if e > excess:
                excess, excess_at = e, f"{what} of {name}"
    problems = []
    for what, limit in (("update", UPDATE_RTOL), ("m", MOMENT_RTOL), ("v", SECOND_MOMENT_RTOL)):
        rel, name = worst[what]
        if not rel <= limit:
            problems.append(f"{what} of {name} off by {rel:.3g} in norm (tolerance {limit:g})")
    if not excess <= 1.0:
        problems.append(f"an element of the {excess_at} off by {excess:.3g} times its tolerance")
    top = max(
        ("update", "m", "v"),
        key=lambda k: worst[k][0] / {"update": UPDATE_RTOL, "m": MOMENT_RTOL, "v": SECOND_MOMENT_RTOL}[k],
    )
    figures = Figures(
        update_rel=_finite(worst["update"][0]),
        m_rel=_finite(worst["m"][0]),
        v_rel=_finite(worst["v"][0]),
        element_excess=_finite(excess),
        worst=f"{top} of {worst[top][1]}" if worst[top][1] else None,
    )
    return figures, problems


def _finite(x: float) -> float:
    """JSON holds no infinity: the largest float stands for it."""
    return x if math.isfinite(x) else float(np.finfo(np.float64).max)


# ------------------------------------------------------------------ verdicts


def crashed(runs: list[CheckRun]) -> Check | None:
    why = next((r.crashed for r in runs if r.crashed), None)
    return Check(verdict=Verdict.CRASHED, detail=f"the check crashed: {why}") if why else None


def judge_training(shape: dict, optimizer: dict[str, float], runs: list[CheckRun], base: CheckRun) -> Check:
    """A training path's runs (one or two) against the verified run."""
    failed = crashed(runs)
    if failed:
        return failed
    first = runs[0]
    try:
        size, base_size = _state(first)[0].size, _state(base)[0].size
    except ValueError as exc:
        return Check(verdict=Verdict.FAILED, detail=str(exc))
    if size != base_size:
        return Check(verdict=Verdict.FAILED, detail=f"a state of {size} values, the verified path's {base_size}")
    diffs = [abs(a - b) for a, b in zip(first.losses, base.losses, strict=False)]
    loss_diff = max(diffs) if diffs and all(math.isfinite(d) for d in diffs) else math.inf  # a NaN never passes
    try:
        figures, problems = state_figures(shape, optimizer, first, base)
    except ValueError as exc:
        return Check(verdict=Verdict.FAILED, detail=str(exc))
    bitwise = all(
        r.losses == first.losses and r.digests.get(CHECK_STEPS) == first.digests.get(CHECK_STEPS) for r in runs[1:]
    )
    if not loss_diff <= LOSS_TOLERANCE:
        problems.insert(0, f"loss off by {loss_diff:.3g} (tolerance {LOSS_TOLERANCE:g})")
    if not bitwise:
        problems.append("two runs differ")
    figures = figures.model_copy(update={"loss_diff": _finite(loss_diff), "bitwise": bitwise})
    if problems:
        return Check(verdict=Verdict.FAILED, detail="; ".join(problems), figures=figures)
    return Check(
        verdict=Verdict.PASSED,
        figures=figures,
        detail=(
            f"after {CHECK_STEPS} steps: loss off by {loss_diff:.3g}, update by {figures.update_rel:.3g}, "
            f"m by {figures.m_rel:.3g}, v by {figures.v_rel:.3g} in norm (worst: {figures.worst}); "
            f"elements within {figures.element_excess:.3g} of their tolerance; two runs bit-identical"
        ),
    )


def judge_kv_cache(run: CheckRun, base: CheckRun) -> Check:
    """The KV cache's run against the verified (recompute) run: the same training bits, the same tokens."""
    failed = crashed([run])
    if failed:
        return failed
    same_state = run.digests.get(CHECK_STEPS) == base.digests.get(CHECK_STEPS)
    equal = run.tokens == base.tokens
    figures = Figures(tokens_equal=equal, bitwise=same_state)
    if not equal:
        return Check(
            verdict=Verdict.FAILED,
            figures=figures,
            detail="sampled tokens differ from the recompute path's at the same seeds"
            + ("" if same_state else " (and the trained state differs too)"),
        )
    if not same_state:
        return Check(
            verdict=Verdict.FAILED, figures=figures, detail="the trained state differs from the verified run's"
        )
    return Check(
        verdict=Verdict.PASSED, figures=figures, detail="the same tokens as the recompute path at the same seeds"
    )


def judge_snapshot(run: CheckRun, base: CheckRun) -> Check:
    """The asynchronous snapshot's checkpoints against the synchronous writer's: the same bytes."""
    failed = crashed([run])
    if failed:
        return failed
    differ = [s for s in (MID_STEP, CHECK_STEPS) if run.digests.get(s) != base.digests.get(s)]
    figures = Figures(bytes_equal=not differ)
    if differ:
        return Check(
            verdict=Verdict.FAILED,
            figures=figures,
            detail="checkpoint bytes differ from the synchronous writer's at step " + ", ".join(str(s) for s in differ),
        )
    return Check(
        verdict=Verdict.PASSED,
        figures=figures,
        detail=f"checkpoints of steps {MID_STEP} and {CHECK_STEPS} byte-identical to the synchronous writer's",
    )
