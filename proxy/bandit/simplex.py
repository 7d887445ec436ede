"""Euclidean projection onto the capped simplex {w : floor_i <= w_i <= cap_i, sum w = 1}.

The projection of v is w_i = clip(v_i - tau, floor_i, cap_i) for the one shift
tau that makes the sum 1 (the KKT conditions of min ||w - v||^2 over the box
and the hyperplane). g(tau) = sum_i clip(v_i - tau, floor_i, cap_i) is
continuous and non-increasing, so tau is found by bisection; the free
coordinates (strictly inside their bounds) then give tau exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..config.bounds import check_caps_floors


def check_bounds(floors: np.ndarray, caps: np.ndarray) -> None:
    """ValueError unless {floor <= w <= cap, sum w = 1} is a non-empty set (config/bounds.py's rules)."""
    if floors.shape != caps.shape:
        raise ValueError(f"floors {floors.shape} and caps {caps.shape} differ in shape")
    problems = check_caps_floors(
        {str(i): c for i, c in enumerate(caps.tolist())}, {str(i): f for i, f in enumerate(floors.tolist())}
    )
    if problems:
        raise ValueError("; ".join(problems))


def project_capped_simplex(
    v: npt.ArrayLike, floors: npt.ArrayLike, caps: npt.ArrayLike, iters: int = 200
) -> np.ndarray:
    """The point of {floor <= w <= cap, sum w = 1} nearest to `v` (float64). Every w_i is within
    [floor_i, cap_i] exactly; the sum is 1 up to rounding (up to config/bounds.py's TOLERANCE where the bounds
    allow one point)."""
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    lo_b = np.asarray(floors, dtype=np.float64).reshape(-1)
    hi_b = np.asarray(caps, dtype=np.float64).reshape(-1)
    if v.shape != lo_b.shape:
        raise ValueError(f"v has {v.size} entries, floors/caps {lo_b.size}")
    if not np.all(np.isfinite(v)):
        raise ValueError("v must be finite")
    check_bounds(lo_b, hi_b)
    # Floors summing to 1 (or, within the tolerance, above), or caps summing to 1 (or, within it, below):
    # the set is that one point. It is returned as it is: scaling it to sum exactly 1 would lift an arm
    # above its cap (or drop one below its floor) by the rounding; the sum is 1 within the tolerance.
    if lo_b.sum() >= 1.0:
        return lo_b.copy()
    if hi_b.sum() <= 1.0:
        return hi_b.copy()

    def g(tau: float) -> float:
        return float(np.clip(v - tau, lo_b, hi_b).sum())

    lo, hi = float(np.min(v - hi_b)), float(np.max(v - lo_b))  # g(lo) = sum caps >= 1 >= sum floors = g(hi)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if g(mid) > 1.0:
            lo = mid
        else:
            hi = mid
    tau = 0.5 * (lo + hi)
    w = np.clip(v - tau, lo_b, hi_b)
    free = (v - tau > lo_b) & (v - tau < hi_b)
    if free.any():  # exact shift on the free set, given which bounds are active
        fixed = w[~free].sum()
        tau_exact = (v[free].sum() - (1.0 - fixed)) / free.sum()
        w_free = np.clip(v[free] - tau_exact, lo_b[free], hi_b[free])
        w[free] = w_free
    # Absorb the last rounding error in a coordinate with room for it.
    r = 1.0 - w.sum()
    if r != 0.0:
        room = (hi_b - w) if r > 0 else (w - lo_b)
        k = int(np.argmax(room))
        w[k] = min(hi_b[k], max(lo_b[k], w[k] + r))
    return w
