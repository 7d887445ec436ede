"""The dashboard flooded by a thousand event-stream clients that never read, against a real uvicorn
server: streams bounded (503 beyond), /healthz answering, non-readers dropped, memory bounded and back
near its baseline afterwards."""

from __future__ import annotations

from . import flood_scenarios as fs


def test_event_stream_flood_is_bounded(tmp_path, record):
    record(fs.event_stream_flood(tmp_path)).check()


def test_exposed_dashboard_warns_on_the_terminal(proxy_env, stopped_run, tmp_path, record):
    record(fs.exposed_dashboard(proxy_env, stopped_run, tmp_path)).check()
