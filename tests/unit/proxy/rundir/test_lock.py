"""The run lock (rundir/lock.py)."""

from __future__ import annotations

import os

import pytest

from proxy.rundir.layout import RunDir, RunDirError
from proxy.rundir.lock import RunLock, run_lock_holder


def test_lock_is_exclusive_and_reports_the_owner(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    assert run_lock_holder(run) is None
    lock = RunLock(run).acquire()
    try:
        assert run_lock_holder(run).pid == os.getpid()
        # this test is no `python -m proxy run` of the run: the kernel names it, and it is no proxy
        assert not run_lock_holder(run).is_proxy
        with pytest.raises(RunDirError, match=f"in use by pid {os.getpid()}, which is not a proxy of this run"):
            RunLock(run).acquire()
        (run.root / ".lock").write_text("1\n")  # a file of the run names nobody: the kernel holds the lock
        assert run_lock_holder(run).pid == os.getpid()
    finally:
        lock.release()
    assert run_lock_holder(run) is None
    with RunLock(run):
        pass
