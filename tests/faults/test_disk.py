"""A full disk or a write error during a checkpoint: the save fails loudly (exit 5, one line), the
previous checkpoint stays valid, no partial file is left that a loader would take, and the run,
once there is room again, resumes and ends byte-identical."""

from __future__ import annotations

import pytest

from . import engine_scenarios, proxy_scenarios


def test_engine_full_disk_tmpfs(engine_bin, tmp_path, record):
    out = engine_scenarios.engine_disk_full_tmpfs(tmp_path)
    if isinstance(out, str):
        pytest.skip(f"{out}; the RLIMIT_FSIZE scenarios below cover failed writes")
    record(out).check()


def test_engine_write_error_efbig(engine_bin, tmp_path, record):
    out = record(engine_scenarios.engine_write_error_rlimit(tmp_path))
    out.check()


def test_proxy_run_write_error_efbig(proxy_env, stopped_run, tmp_path, record):
    out = record(proxy_scenarios.proxy_disk_full(proxy_env, stopped_run, tmp_path))
    out.check()
