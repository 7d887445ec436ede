"""Paths out of the run (checkpoints/ or archive/ a symlink, at launch and swapped in while training),
step numbers beyond the engine's (a stray step_3000000000.bin), archive names that collide within one
second, a checkpoint written by another experiment among the run's."""

from __future__ import annotations

from . import path_scenarios as ps


def test_symlinks_out_of_the_run_are_refused(proxy_env, stopped_run, tmp_path, record):
    record(ps.symlinked_run_dirs(proxy_env, stopped_run, tmp_path)).check()


def test_huge_step_numbers_stay_bounded(proxy_env, stopped_run, tmp_path, record):
    record(ps.huge_step_numbers(proxy_env, stopped_run, tmp_path)).check()


def test_archive_names_never_collide(proxy_env, tmp_path, record):
    record(ps.archive_names(proxy_env, tmp_path)).check()


def test_checkpoint_of_another_experiment_is_refused(proxy_env, stopped_run, tmp_path, record):
    record(ps.foreign_checkpoint(proxy_env, stopped_run, tmp_path)).check()
