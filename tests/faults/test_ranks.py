"""kill -9 of a rank or of the launcher, a rank that hangs, a rank that crashes (exits non-zero on SIGSEGV or
SIGABRT) and SIGTERM to the launcher, during `proxy run --ranks 2` (rank_scenarios.py)."""

from __future__ import annotations

from . import rank_scenarios


def test_rank_and_launcher_kills(rank_env, tmp_path, record):
    out = record(rank_scenarios.rank_kill_storm(rank_env, tmp_path))
    out.check()
    assert out.injected == len(rank_scenarios.KILLS)


def test_a_rank_that_hangs(rank_env, tmp_path, record):
    out = record(
        rank_scenarios.rank_kill_storm(
            rank_env, tmp_path, rank_scenarios.HANG, "rank-hang", rank_scenarios.RANK_HANG_CLASS
        )
    )
    out.check()
    assert out.injected == 1


def test_a_rank_that_crashes(rank_env, tmp_path, record):
    out = record(
        rank_scenarios.rank_kill_storm(
            rank_env, tmp_path, rank_scenarios.CRASHES, "rank-crash", rank_scenarios.RANK_CRASH_CLASS
        )
    )
    out.check()
    assert out.injected == len(rank_scenarios.CRASHES)


def test_sigterm_to_the_launcher(rank_env, tmp_path, record):
    out = record(
        rank_scenarios.rank_kill_storm(
            rank_env, tmp_path, rank_scenarios.LAUNCHER_TERMS, "launcher-term", rank_scenarios.LAUNCHER_TERM_CLASS
        )
    )
    out.check()
    assert out.injected == len(rank_scenarios.LAUNCHER_TERMS)
