"""Inputs that cannot be read as they claim: `proxy eval --data` given a device, a FIFO, a huge file or a
directory; data sources that refuse reads (EACCES, EIO, EINVAL, EISDIR, ENOTDIR). One line, exit 2."""

from __future__ import annotations

from . import input_scenarios as ins


def test_eval_data_reads_only_regular_files_within_a_cap(proxy_env, stopped_run, tmp_path, record):
    record(ins.eval_data(proxy_env, stopped_run, tmp_path)).check()


def test_unreadable_sources_are_one_line(proxy_env, tmp_path, record):
    record(ins.unreadable_sources(proxy_env, tmp_path)).check()
