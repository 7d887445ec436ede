"""Signals and misbehaving engines: SIGTERM inside a checkpoint write, SIGUSR1 storms, a hung
(SIGSTOPped) engine, an engine in a crash loop, a stop signal before training starts, SIGHUP."""

from __future__ import annotations

import shutil

from . import engine_scenarios, proxy_scenarios, run_dir_scenarios


def test_engine_sigterm_inside_checkpoint_write(engine_bin, tmp_path, record):
    out = record(engine_scenarios.engine_sigterm_in_write(tmp_path))
    out.check()
    shutil.rmtree(tmp_path / "ck")  # ~200 MB of checkpoints; kept only when the test fails


def test_engine_sigusr1_storm(engine_bin, tmp_path, record):
    out = record(engine_scenarios.engine_sigusr1_storm(tmp_path))
    out.check()


def test_proxy_sigusr1_storm(proxy_env, tmp_path, record):
    out = record(proxy_scenarios.proxy_sigusr1_storm(proxy_env, tmp_path))
    out.check()


def test_engine_sigstop_then_sigcont(engine_bin, tmp_path, record):
    out = record(engine_scenarios.engine_sigstop(tmp_path))
    out.check()


def test_proxy_kills_and_restarts_a_hung_engine(proxy_env, stopped_run, tmp_path, record):
    out = record(proxy_scenarios.proxy_hung_engine(proxy_env, stopped_run, tmp_path))
    out.check()


def test_proxy_stops_a_crash_loop(proxy_env, stopped_run, tmp_path, record):
    out = record(proxy_scenarios.proxy_crash_loop(proxy_env, stopped_run, tmp_path))
    out.check()


def test_proxy_stop_before_training(proxy_env, tmp_path, record):
    out = record(run_dir_scenarios.stop_before_training(proxy_env, tmp_path))
    out.check()


def test_proxy_sighup_while_training(proxy_env, stopped_run, tmp_path, record):
    out = record(run_dir_scenarios.sighup_while_training(proxy_env, stopped_run, tmp_path))
    out.check()
