"""The capped-simplex projection (bandit/simplex.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxy.bandit import project_capped_simplex

from .three_arms import TOL


@st.composite
def bounded_problem(draw):
    k = draw(st.integers(1, 8))
    floors = np.array(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k)))
    if floors.sum() > 1:
        floors = floors / floors.sum() * draw(st.floats(0, 1))
    extra = np.array(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k)))
    caps = np.minimum(1.0, floors + extra)
    assume(caps.sum() >= 1)
    v = np.array(draw(st.lists(st.floats(-1e3, 1e3), min_size=k, max_size=k)))
    return v, floors, caps


@given(bounded_problem())
@settings(max_examples=400, deadline=None)
def test_projection_within_bounds_and_sums_to_one(problem):
    v, floors, caps = problem
    w = project_capped_simplex(v, floors, caps)
    assert w.shape == v.shape
    assert np.all(w >= floors - TOL) and np.all(w <= caps + TOL)
    assert abs(w.sum() - 1.0) < TOL


@given(bounded_problem(), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_projection_is_nearest_point(problem, seed):
    v, floors, caps = problem
    w = project_capped_simplex(v, floors, caps)
    # any other feasible point (a random convex move towards another feasible point) is no closer
    rng = np.random.default_rng(seed)
    other = project_capped_simplex(rng.normal(size=v.size) * 3, floors, caps)
    for t in (0.01, 0.3, 1.0):
        u = (1 - t) * w + t * other
        assert np.sum((u - v) ** 2) >= np.sum((w - v) ** 2) - 1e-7


def test_projection_known_values():
    np.testing.assert_allclose(project_capped_simplex([1, 1, 1, 1], np.zeros(4), np.ones(4)), [0.25] * 4)
    np.testing.assert_allclose(project_capped_simplex([0.9, 0.05, 0.05], [0.1] * 3, [0.5, 1, 1]), [0.5, 0.25, 0.25])
    np.testing.assert_allclose(project_capped_simplex([5, 0, 0], [0.1, 0.1, 0.1], [1, 1, 1]), [0.8, 0.1, 0.1])
    np.testing.assert_allclose(project_capped_simplex([0.2, 0.3, 0.5], [0, 0, 0], [1, 1, 1]), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_capped_simplex([0, 0], [0.5, 0.5], [1, 1]), [0.5, 0.5])
    with pytest.raises(ValueError, match="floors sum"):
        project_capped_simplex([0, 0], [0.6, 0.6], [1, 1])
    with pytest.raises(ValueError, match="caps sum"):
        project_capped_simplex([0, 0], [0, 0], [0.3, 0.3])
