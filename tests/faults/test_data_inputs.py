"""Data and storage a run trusts too much: frozen validation ids beyond the vocabulary, a full
disk only the engine's checkpoints meet, a device or FIFO named as a checkpoint."""

from __future__ import annotations

import pytest

from . import data_scenarios as ds


def test_frozen_validation_ids_beyond_the_vocabulary(proxy_env, stopped_run, tmp_path, record):
    record(ds.frozen_val_beyond_vocab(proxy_env, stopped_run, tmp_path)).check()


def test_engine_disk_full_ends_with_exit_5(proxy_env, stopped_run, tmp_path, record):
    out = ds.engine_disk_full(proxy_env, stopped_run, tmp_path)
    if isinstance(out, str):
        pytest.skip(f"{out}; the proxy's own full-disk cases need it too")
    record(out).check()


def test_eval_checkpoint_that_is_not_a_regular_file(proxy_env, stopped_run, tmp_path, record):
    record(ds.checkpoint_not_regular(proxy_env, stopped_run, tmp_path)).check()


def test_status_of_forged_steps_and_clock_jumps(proxy_env, stopped_run, tmp_path, record):
    record(ds.status_forged_steps(proxy_env, stopped_run, tmp_path)).check()


def test_eval_of_a_huge_single_word_is_bounded(proxy_env, stopped_run, tmp_path, record):
    record(ds.eval_huge_word(proxy_env, stopped_run, tmp_path)).check()


def test_hostile_table_sources(proxy_env, tmp_path, record):
    record(ds.table_sources(proxy_env, tmp_path)).check()


def test_init_from_non_finite_weights(proxy_env, tmp_path, record):
    record(ds.init_from_non_finite(proxy_env, tmp_path)).check()
