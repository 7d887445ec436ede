"""Processes proven ours and the proxy's own pauses (proof_scenarios.py): a live run's engine record copied
into another run, foreign holders of the run's lock, the proxy SIGSTOPped longer than --hang-timeout. Each
runs as pid 1 of its own pid namespace (sandbox.py)."""

from __future__ import annotations

import pytest

from . import sandbox
from .test_process_records import _in_sandbox

_WHY = sandbox.unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"no pid namespace for forged process records: {_WHY}")


def test_live_runs_record_copied_into_another_run(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("proof_scenarios.forged_record_of_live_run", proxy_env, stopped_run, tmp_path)).check()


def test_foreign_lock_holders_are_never_signalled(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("proof_scenarios.foreign_lock_holders", proxy_env, stopped_run, tmp_path)).check()


def test_stopped_proxy_is_no_hung_engine(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("proof_scenarios.stopped_proxy", proxy_env, stopped_run, tmp_path)).check()
