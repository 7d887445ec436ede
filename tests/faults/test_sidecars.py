"""Torn or garbage lines in .loss.json; missing or corrupt .state.json, .samples.json, phases.json:
handled as documented (ARCHITECTURE.md "The run directory", FORMATS.md "Run directory sidecars"), nothing lost."""

from __future__ import annotations

from . import proxy_scenarios


def test_torn_or_garbage_loss_log(proxy_env, stopped_run, tmp_path, record):
    out = record(
        proxy_scenarios.sidecar_cases(
            proxy_env,
            stopped_run,
            tmp_path,
            proxy_scenarios.LOSS_LOG_CASES,
            "loss-log-damage",
            "torn or garbage lines in .loss.json",
        )
    )
    out.check()


def test_missing_or_corrupt_sidecars(proxy_env, stopped_run, tmp_path, record):
    out = record(
        proxy_scenarios.sidecar_cases(
            proxy_env,
            stopped_run,
            tmp_path,
            proxy_scenarios.SIDECAR_CASES,
            "sidecar-damage",
            "missing or corrupt .state.json, .samples.json, phases.json",
        )
    )
    out.check()
