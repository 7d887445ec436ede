"""Corrupted checkpoints are rejected as documented (or loaded, for a bare ANDREA file), with
fallback to the next older one; retention never deletes what `keep_last 0` says it keeps."""

from __future__ import annotations

from . import engine_scenarios, proxy_scenarios


def test_engine_rejects_corrupt_checkpoints(engine_bin, tmp_path, record):
    """A bit flipped in each region (step, n_params, weights, m, v, trailer, meta, footer), truncation
    at seeded lengths, wrong n_params, another model's file, foreign files, a bare ANDREA file."""
    out = record(engine_scenarios.engine_corruption(tmp_path))
    out.check()


def test_proxy_falls_back_from_a_corrupt_newest_checkpoint(proxy_env, stopped_run, tmp_path, record):
    out = record(proxy_scenarios.proxy_corrupt_checkpoint(proxy_env, stopped_run, tmp_path))
    out.check()


def test_keep_last_0_keeps_every_checkpoint(proxy_env, tmp_path, record):
    out = record(proxy_scenarios.proxy_keep_all(proxy_env, tmp_path))
    out.check()
