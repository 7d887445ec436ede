"""kill -9 of the proxy and its tracker together at seeded random moments while it writes TensorBoard event
files, then the same command relaunched: each step in the event file once, with the log's loss."""

from __future__ import annotations

from . import tracking_scenarios


def test_tracker_killed_with_the_proxy(proxy_env, tmp_path, record):
    out = record(tracking_scenarios.tracker_kill_storm(proxy_env, tmp_path, n_kills=3))
    out.check()
    assert out.injected == 3
