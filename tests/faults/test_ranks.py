"""kill -9 of a rank or of the launcher, a rank that hangs, a rank that crashes (exits non-zero on SIGSEGV or
SIGABRT) and SIGTERM to the launcher, during `proxy run --ranks 2` (rank_scenarios.py)."""

from __future__ import annotations

import pytest

from . import rank_scenarios as rs

# (scenario name, the (role, signal) victims in order, the fault class it records)
CASES = [
    ("rank-kill", rs.KILLS, rs.RANK_KILL_CLASS),
    ("rank-hang", rs.HANG, rs.RANK_HANG_CLASS),
    ("rank-crash", rs.CRASHES, rs.RANK_CRASH_CLASS),
    ("launcher-term", rs.LAUNCHER_TERMS, rs.LAUNCHER_TERM_CLASS),
]


@pytest.mark.parametrize(("name", "victims", "fault_class"), CASES, ids=[c[0] for c in CASES])
def test_rank_faults(rank_env, tmp_path, record, name, victims, fault_class):
    out = record(rs.rank_kill_storm(rank_env, tmp_path, victims, name, fault_class))
    out.check()
    assert out.injected == len(victims)
