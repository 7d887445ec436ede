"""Process records and locks that lie: forged engine records (`true`, `1`, `-1`, `"12"`, a live unrelated
pid with its real start time), forged and deleted lock files, a copied live run, a run directory
replaced under its proxy. Each scenario runs as pid 1 of its own pid namespace (sandbox.py), so that a
wrong kill cannot reach a process outside it; sentinels inside are the victims watched."""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest

from . import sandbox
from .scenarios import Outcome

_WHY = sandbox.unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"no pid namespace for forged process records: {_WHY}")


def _in_sandbox(function: str, proxy_env, stopped_run, tmp_path, timeout: float = 900) -> Outcome:
    started = time.monotonic()
    data = sandbox.run_scenario(
        function, timeout, env=asdict(proxy_env), template=str(stopped_run), workdir=str(tmp_path)
    )
    outcome = Outcome(**{k: v for k, v in data.items() if k != "seconds"})
    outcome._t0 = started  # the scenario's time, sandbox included
    return outcome


def test_forged_engine_records_signal_nothing(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("process_scenarios.forged_engine_records", proxy_env, stopped_run, tmp_path)).check()


def test_copied_live_run_leaves_the_original_alone(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("process_scenarios.copied_live_run", proxy_env, stopped_run, tmp_path)).check()


def test_forged_and_deleted_lock_files(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("process_scenarios.forged_lock_files", proxy_env, stopped_run, tmp_path)).check()


def test_run_directory_replaced_under_a_live_proxy(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("process_scenarios.moved_run_directory", proxy_env, stopped_run, tmp_path)).check()
