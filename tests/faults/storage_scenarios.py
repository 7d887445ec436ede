"""Fault scenarios of the proxy's own writes failing: RLIMIT_FSIZE that only `.loss.json` reaches, a run
directory on a tmpfs filled while training or full at the first launch, a read-only run directory.

Like run_dir_scenarios.py, every scenario runs real processes against a real run directory, returns an
Outcome, and asserts what survives: exit 5, one line naming the file and the errno, no torn line, every
line and valid checkpoint kept, and a relaunch that resumes bit-exactly once the cause is gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from harness.engine import TIMEOUT, Child

from .engine_scenarios import umount
from .proxy_checks import (
    checkpoints_kept,
    disk_kept_full,
    fill_disk,
    launch,
    launch_and_compare,
    one_line_exit,
    only_appended,
    run_state,
    start_training,
    temp_files,
    tmpfs,
)
from .proxy_harness import ProxyEnv, expected_resume, read_log
from .proxy_scenarios import _snapshot, copy_run, relaunch_and_compare
from .scenarios import Outcome, fsize_limit


def _check_storage_stop(
    p: Child, rc: int, run: Path, log: bytes, ckpts: dict, errno_name: str, out: Outcome, where: str
) -> None:
    """docs/OPERATIONS.md, "A full disk": exit 5, one last line naming the file and the errno, no torn
    line, every line and checkpoint kept, nothing half-written, `.state.json` stopped with the cause."""
    line = one_line_exit(p, rc, 5, f"({errno_name})", out, where)
    out.note(f"{where}: last line", line)
    only_appended(run, log, out, where)
    checkpoints_kept(run, ckpts, out, where)
    if temp_files(run):
        out.fail(f"{where}: temp files left behind: {temp_files(run)}")
    state = run_state(run)
    failure = state.get("write_failure") or {}
    if state.get("status") != "stopped" or failure.get("errno") != errno_name:
        out.fail(
            f"{where}: .state.json status {state.get('status')!r}, write_failure {failure}; expected "
            f"'stopped' and {errno_name}"
        )


def proxy_append_efbig(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-append-efbig",
    fault_class: str = "write error in the proxy's own files (proxy run, EFBIG)",
) -> Outcome:
    """RLIMIT_FSIZE that only `.loss.json` reaches (twice a checkpoint; the log is padded with a garbage
    line, which readers skip, to a few lines below it): an append fails partway with EFBIG. The proxy
    cuts the partial line off, stops the engine cleanly (it checkpoints: its files are below the limit),
    sets `.state.json` stopped with the cause, exits 5 with one line; relaunched without the limit the
    run finishes bit-identical to the uninterrupted one."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    ckpts = _snapshot(run)
    limit = 2 * max(len(b) for b in ckpts.values())
    log_path = run / ".loss.json"
    pad = limit - log_path.stat().st_size - 1200  # room for two or three more step lines
    with open(log_path, "ab") as f:
        f.write(b"#" * (pad - 1) + b"\n")
    log = log_path.read_bytes()
    out.begin_fault()
    rc, p = launch(lambda: env.run(run, preexec_fn=fsize_limit(limit), timeout=TIMEOUT), out, "under the limit")
    _check_storage_stop(p, rc, run, log, ckpts, "EFBIG", out, "append past RLIMIT_FSIZE")
    if p.stderr_lines() and "the engine stopped and wrote its checkpoint" not in p.stderr_lines()[-1]:
        out.fail(f"the engine was not stopped cleanly: {p.stderr_lines()[-1]}")
    out.note("RLIMIT_FSIZE (bytes)", limit)
    out.steps_lost += max(0, read_log(log_path).max_step - expected_resume(run))
    relaunch_and_compare(env, run, out, "relaunch without the limit")
    return out.close()


def proxy_disk_full_midrun(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-disk-full-midrun",
    fault_class: str = "full disk while the proxy runs (tmpfs, ENOSPC)",
) -> Outcome | str:
    """The run directory on a small tmpfs, filled to the last byte while the run trains and kept full (space
    retention frees is taken back at once; a run could otherwise train on): whichever write
    fails first (a `.loss.json` append, `.state.json`, or the engine's checkpoint, after which the proxy's
    next write fails), the proxy ends with exit 5 and one line, no torn line, every line and valid
    checkpoint kept, `.state.json` stopped with ENOSPC (written over itself: no block is free); after
    the filler is deleted the relaunch finishes bit-identical."""
    out = Outcome(fault_class, name)
    mnt = workdir / "mnt"
    with tmpfs(mnt, 8 << 20) as why:
        if why is not None:
            return f"cannot mount a tmpfs here ({why})"
        run = copy_run(template, mnt / "run")
        ckpts, log = _snapshot(run), (run / ".loss.json").read_bytes()
        p = start_training(env, run, out)
        out.begin_fault()
        with disk_kept_full(mnt) as written:
            out.note("bytes written to fill the disk", written)
            rc, _ = launch(lambda: (p.finish(TIMEOUT), p), out, "on the full disk")
        _check_storage_stop(p, rc, run, log, ckpts, "ENOSPC", out, "disk filled while training")
        out.steps_lost += max(0, read_log(run / ".loss.json").max_step - expected_resume(run))
        (mnt / "filler").unlink()
        relaunch_and_compare(env, run, out, "relaunch after freeing space")
    return out.close()


def proxy_disk_full_first_launch(
    env: ProxyEnv,
    workdir: Path,
    name: str = "proxy-disk-full-first-launch",
    fault_class: str = "full disk at a run's first launch (tmpfs, ENOSPC)",
) -> Outcome | str:
    """A new run directory on a tmpfs that is already full: the proxy's first write fails. Exit 5, one
    line naming the file, no traceback, no temp file; after freeing space the same command trains the
    whole run, bit-identical to the uninterrupted one."""
    out = Outcome(fault_class, name)
    mnt = workdir / "mnt"
    with tmpfs(mnt, 4 << 20) as why:
        if why is not None:
            return f"cannot mount a tmpfs here ({why})"
        run = mnt / "run"
        fill_disk(mnt)
        out.begin_fault()
        rc, p = launch(lambda: env.run(run, timeout=TIMEOUT), out, "first launch on a full disk")
        line = one_line_exit(p, rc, 5, "(ENOSPC)", out, "first launch on a full disk")
        out.note("last line", line)
        if temp_files(run):
            out.fail(f"temp files left behind: {temp_files(run)}")
        (mnt / "filler").unlink()
        launch_and_compare(env, run, out, "relaunch after freeing space")
    return out.close()


def proxy_read_only_at_launch(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-read-only",
    fault_class: str = "read-only run directory at launch (EROFS)",
) -> Outcome | str:
    """A stopped run seen through a read-only bind mount: the proxy's first write (its lock) fails with
    EROFS. Exit 5, one line, nothing changed; through a writable path the relaunch finishes bit-identical."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    view = workdir / "ro"
    view.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return "not root, or no mount(8)"
    r = subprocess.run(["mount", "--bind", str(run), str(view)], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot bind-mount here ({r.stderr.strip()})"
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"cannot remount read-only here ({r.stderr.strip()})"
        ckpts, log = _snapshot(run), (run / ".loss.json").read_bytes()
        out.begin_fault()
        rc, p = env.run(view, timeout=TIMEOUT)
        line = one_line_exit(p, rc, 5, "(EROFS)", out, "launch on a read-only mount")
        out.note("last line", line)
        checkpoints_kept(run, ckpts, out, "read-only launch")
        if (run / ".loss.json").read_bytes() != log:
            out.fail(".loss.json changed through a read-only mount", data_lost=1)
    finally:
        umount(view)
    relaunch_and_compare(env, run, out, "relaunch through a writable path")
    return out.close()
