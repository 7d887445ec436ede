"""The dashboard answers while it indexes a large log (a real uvicorn server), and reads a line without
a newline one chunk at a time under its lock."""

from __future__ import annotations

from . import dashboard_scenarios


def test_queries_answer_while_a_large_log_is_indexed(tmp_path, record):
    record(dashboard_scenarios.dashboard_indexing(tmp_path)).check()


def test_an_overlong_line_is_read_a_chunk_at_a_time(tmp_path, monkeypatch, record):
    record(dashboard_scenarios.overlong_line_reads(tmp_path, monkeypatch)).check()
