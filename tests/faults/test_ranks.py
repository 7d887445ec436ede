"""kill -9 of a rank or of the launcher, and a rank that hangs, during `proxy run --ranks 2` (rank_scenarios.py)."""

from __future__ import annotations

import pytest

from . import rank_scenarios

PROBLEM = rank_scenarios.mpi_engine_problem()


@pytest.fixture(scope="module")
def rank_env(tmp_path_factory):
    if PROBLEM is not None and PROBLEM.startswith("mpirun"):
        pytest.skip(PROBLEM)
    if PROBLEM is not None:
        pytest.fail(PROBLEM, pytrace=False)
    return rank_scenarios.prepare_rank_env(tmp_path_factory.mktemp("faults-ranks"))


def test_rank_and_launcher_kills(rank_env, tmp_path, record):
    out = record(rank_scenarios.rank_kill_storm(rank_env, tmp_path))
    out.check()
    assert out.injected == len(rank_scenarios.KILLS)


def test_a_rank_that_hangs(rank_env, tmp_path, record):
    out = record(rank_scenarios.rank_kill_storm(rank_env, tmp_path, rank_scenarios.HANG, "rank-hang"))
    out.check()
    assert out.injected == 1
