"""Mixtures never exceed a cap, nor fall below a floor: not the bandit's weights (the capped-simplex
projection), and not the rows each arm gets in a batch (their rounding), whatever the float rounding.
A hypothesis property over projections of random points onto random valid caps and floors (sums on
and within the bounds' tolerance of 1 included) and random batch sizes and draws, seeded by FAULT_SEED."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from proxy.bandit.simplex import project_capped_simplex
from proxy.config.bounds import TOLERANCE, check_caps_floors
from proxy.data.batches import row_counts

from . import scenarios
from .scenarios import Outcome

EXAMPLES = 2000
NICE = [0.0, 0.05, 0.1, 0.125, 0.2, 0.25, 0.3, 1 / 3, 0.4, 0.5, 0.6, 2 / 3, 0.7, 0.75, 0.8, 0.9, 1.0]


@st.composite
def bounds_and_point(draw):
    """(v, floors, caps) with a non-empty capped simplex; sums of exactly 1 and within TOLERANCE of it."""
    k = draw(st.integers(1, 8))
    value = st.one_of(st.sampled_from(NICE), st.floats(0, 1))
    caps = [draw(value) for _ in range(k)]
    floors = [min(draw(value), c) for c in caps]
    if draw(st.booleans()):  # floors summing to 1 (or just off it), or caps summing to 1 (or just off it)
        which = draw(st.sampled_from(["floors", "caps"]))
        target = floors if which == "floors" else caps
        total = sum(target)
        if total > 0:
            scale = (1 + draw(st.sampled_from([0.0, TOLERANCE / 2, -TOLERANCE / 2, 1e-16, -1e-16]))) / total
            target[:] = [min(1.0, t * scale) for t in target]
            if which == "caps":
                floors = [min(f, c) for f, c in zip(floors, caps, strict=False)]
            else:
                caps = [max(f, c) for f, c in zip(floors, caps, strict=False)]
    v = [draw(st.floats(-10, 10)) for _ in range(k)]
    return np.array(v), np.array(floors), np.array(caps)


def test_mixtures_never_exceed_a_cap(record):
    out = Outcome("mixtures within caps and floors (weights and rows, property test)", "mixture-bounds")

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @seed(scenarios.fault_seed())
    @given(
        case=bounds_and_point(),
        rows=st.integers(1, 512),
        u=st.one_of(st.floats(0, 1, exclude_max=True), st.sampled_from([0.0, 0.5, 1 - 2**-53])),
    )
    def check(case, rows, u):
        v, floors, caps = case
        if check_caps_floors(dict(enumerate(caps)), dict(enumerate(floors))):
            return  # an empty capped simplex: refused by every loader, never projected onto
        out.begin_fault()
        w = project_capped_simplex(v, floors, caps)
        problems = []
        if np.any(w > caps) or np.any(w < floors) or abs(math.fsum(w) - 1) > TOLERANCE:
            problems.append(f"weights {w.tolist()} outside [{floors.tolist()}, {caps.tolist()}] or sum {math.fsum(w)}")
        n = row_counts(w, rows, u)
        for i in range(len(w)):
            most, least = math.ceil(Fraction(caps[i]) * rows), math.floor(Fraction(floors[i]) * rows)
            if not least <= n[i] <= most:
                problems.append(
                    f"arm {i}: {n[i]} of {rows} rows, bounds {least}..{most} (cap {caps[i]!r}, "
                    f"floor {floors[i]!r}, weight {w[i]!r}, u {u!r})"
                )
        if n.sum() != rows:
            problems.append(f"{n.sum()} rows assigned of {rows}")
        out.end_fault()
        if problems:
            out.fail("; ".join(problems))

    try:
        check()
    finally:
        record(out)
    out.check()
