"""Temp names and JSON a run trusts too much: temp names planted with symlinks, files
and directories (the data freeze, fork, export, a pivot's archive, the proxy's and the engine's temp files),
the temp files and directories a kill -9 leaves, a fork's frozen data, JSON nested without bound. Each
scenario runs as pid 1 of its own pid namespace (sandbox.py): temp names carry pids, and there every pid is
the scenario's own."""

from __future__ import annotations

import pytest

from . import sandbox
from .test_process_records import _in_sandbox

_WHY = sandbox.unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"no pid namespace: {_WHY}")


def test_deep_json_is_a_damaged_line_or_one_line(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("nesting_scenarios.deep_json", proxy_env, stopped_run, tmp_path)).check()


def test_planted_temp_names_are_never_followed(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("temp_scenarios.planted_temp_names", proxy_env, stopped_run, tmp_path)).check()


def test_kill9_leftovers_are_removed_by_the_next_command(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("temp_scenarios.kill9_leftovers", proxy_env, stopped_run, tmp_path)).check()


def test_real_kill9_leftovers_are_removed_by_the_same_command(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("temp_scenarios.real_kill9_leftovers", proxy_env, stopped_run, tmp_path)).check()


def test_a_forks_data_is_what_run_eval_and_export_accept(proxy_env, stopped_run, tmp_path, record):
    record(_in_sandbox("temp_scenarios.fork_data", proxy_env, stopped_run, tmp_path)).check()
