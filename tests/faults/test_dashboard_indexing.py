"""The dashboard answers while it indexes a large log (a real uvicorn server)."""
from __future__ import annotations

from . import dashboard_scenarios


def test_queries_answer_while_a_large_log_is_indexed(tmp_path, record):
    record(dashboard_scenarios.dashboard_indexing(tmp_path)).check()
