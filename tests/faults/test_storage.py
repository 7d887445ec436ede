"""The proxy's own writes failing: a file-size limit (EFBIG), a full disk mid-run and at the first
launch (ENOSPC, a real tmpfs), a read-only run directory (EROFS), an I/O error (EIO, injected into
the log's write in-process: no device here can be made to fail on demand). Always one line, exit 5,
no torn line, every complete line and valid checkpoint kept, and bit-identical once the cause is gone."""

from __future__ import annotations

import errno
import os

import pytest

from proxy.errors import StorageError
from proxy.formats.loss_log import LossLogWriter, StepEntry

from . import storage_scenarios
from .scenarios import Outcome


def _recorded_or_skip(out, record):
    if isinstance(out, str):
        pytest.skip(f"{out}; the RLIMIT_FSIZE case covers failed writes")
    record(out).check()


def test_proxy_append_past_the_file_size_limit(proxy_env, stopped_run, tmp_path, record):
    record(storage_scenarios.proxy_append_efbig(proxy_env, stopped_run, tmp_path)).check()


def test_proxy_disk_full_while_training(proxy_env, stopped_run, tmp_path, record):
    _recorded_or_skip(storage_scenarios.proxy_disk_full_midrun(proxy_env, stopped_run, tmp_path), record)


def test_proxy_disk_full_at_first_launch(proxy_env, tmp_path, record):
    _recorded_or_skip(storage_scenarios.proxy_disk_full_first_launch(proxy_env, tmp_path), record)


def test_proxy_read_only_run_directory(proxy_env, stopped_run, tmp_path, record):
    _recorded_or_skip(storage_scenarios.proxy_read_only_at_launch(proxy_env, stopped_run, tmp_path), record)


def test_log_append_io_error_leaves_no_torn_line(tmp_path, monkeypatch, record):
    """EIO after half a line was written: the half is cut off, StorageError names the file and EIO."""
    out = Outcome("I/O error appending to .loss.json (EIO, injected in-process)", "loss-log-eio")
    path = tmp_path / ".loss.json"
    writer = LossLogWriter(path)
    entry = StepEntry(
        step=1,
        loss=4.0,
        lr=1e-3,
        grad_norm=1.0,
        tokens=64,
        time=1.0,
        ms=1.0,
        arms={"a": 4.0},
        mixture={"a": 1.0},
        phase=0,
        segment=1,
    )
    writer.append(entry)
    before = path.read_bytes()
    real_write = os.write

    def failing_write(fd, data):
        if fd == writer.fd and len(data) > 1:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_write(fd, data)

    out.begin_fault()
    monkeypatch.setattr(os, "write", failing_write)
    try:
        writer.append(StepEntry(**{**entry.__dict__, "step": 2}))
        out.fail("the failed append raised nothing")
    except StorageError as exc:
        if "(EIO)" not in str(exc) or str(path) not in str(exc) or "\n" in str(exc):
            out.fail(f"not one line naming the file and EIO: {exc}")
    monkeypatch.undo()
    if path.read_bytes() != before:
        out.fail(f"the half-written line stayed: {path.read_bytes()[len(before) :]!r}", data_lost=1)
    writer.append(StepEntry(**{**entry.__dict__, "step": 3}))
    writer.close()
    if path.read_bytes().count(b"\n") != 2:
        out.fail("the next append did not land as a whole line after the failed one")
    record(out).check()
