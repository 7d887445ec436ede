"""Diverged runs: the engine refuses to write or load non-finite weights and moments; the proxy stops at
the first step whose loss is not sane (proxy/divergence.py) or on the engine's exit 6, naming the newest
sane checkpoint, which retention keeps and every resume goes back to; no crash loop."""

from __future__ import annotations

from . import divergence_scenarios as ds


def test_engine_refuses_non_finite_state(engine_bin, tmp_path, record):
    record(ds.engine_non_finite(tmp_path)).check()


def test_proxy_stops_a_diverging_run(proxy_env, stopped_run, tmp_path, record):
    record(ds.proxy_divergence(proxy_env, stopped_run, tmp_path)).check()
