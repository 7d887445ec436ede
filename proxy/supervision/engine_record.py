"""RUN/.engine.json: the engine the proxy launched last, and how an engine a killed proxy left is reaped.

When a proxy is killed, its engine sees EOF on stdin, checkpoints and exits
by itself; the next `proxy run` (or an offline `proxy pivot`) gives it
`orphan_grace_s` to do so and then kills its process group. Nothing in a run
directory is trusted (docs/ARCHITECTURE.md), and a wrong kill here once took
a whole machine down, so the record is only a pointer to check, never a
reason to signal:

- it must parse as EngineRecord, strictly: a pid that is a JSON integer > 1
  (never `true`, `1.9`, `"12"`, 1 or -1), a start time, the engine's whole
  command line, the SHA-256 of a random token, and the run id and directory
  it was written for (rundir/identity.py);
- its run id and directory must be this run's own: a copied run directory
  holds the original's record, which names the original's live engine;
- the live process must match it: the same start time (a reused pid does
  not), the same command line, the leader of its own process group (the
  engine is started in a session of its own), and a token in its
  environment (MICROGPT_ENGINE_TOKEN, which only the proxy that launched it
  passed) whose hash is the recorded one;
- and, what no copied or forged record can carry: the checkpoint directory
  the live process writes to (`--ckpt-dir` of its own command line, resolved
  from its own working directory) must be this run's `checkpoints/`, by
  device and inode. Every field above can be copied from another run's
  record along with that run's live engine (the token too: the record holds
  only its hash, but the hash is what is compared), and that engine writes
  into its own run, never this one.

Reaping happens only while this process holds the run's lock (so no live
proxy of the run owns the engine) and the path still leads to the directory
locked. A record that fails any check is reported in one line and ignored.
The checks run again, through a pidfd that keeps naming the verified
process, right before the SIGKILL, which goes only to that group.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil
from pydantic import BaseModel, ConfigDict, Field

from ..atomic import atomic_write_json
from ..processes import (
    FileIdentity,
    group_leader,
    identity_seen_by,
    open_pidfd,
    pidfd_exited,
    same_command,
    signal_group,
)
from ..rundir.identity import RUN_ID_PATTERN, RunIdentity, read_record
from ..rundir.layout import RunDir

if TYPE_CHECKING:
    from ..rundir.lock import RunLock

TOKEN_ENV = "MICROGPT_ENGINE_TOKEN"  # in the engine's environment: the proxy that launched it set it
PID_MAX = 1 << 22  # the kernel's largest pid_max
START_TIME_SLACK_S = 0.01  # psutil's create time, read twice, agrees to far better than this
CKPT_DIR_FLAG = "--ckpt-dir"  # formats/engine_cli.py's: where the engine writes its checkpoints
RECORD_VERSION = 2  # 2: the token's hash, never the token (version 1 records are not engine records)
WAIT_STEP_S = 0.1  # how often the grace period looks whether the orphan has exited


def new_token() -> str:
    return secrets.token_hex(16)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class EngineRecord(BaseModel):
    """RUN/.engine.json (docs/FORMATS.md, "The engine record")."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    version: int = Field(RECORD_VERSION, ge=RECORD_VERSION, le=RECORD_VERSION)
    pid: int = Field(gt=1, le=PID_MAX)
    create_time: float = Field(gt=0, allow_inf_nan=False)
    argv: list[str] = Field(min_length=1, max_length=512)
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    dev: int = Field(ge=0)
    ino: int = Field(ge=0)


def record_engine(
    run: RunDir, identity: RunIdentity, pid: int, create_time: float | None, argv: list[str], token: str
) -> None:
    """Write the record of an engine just launched (nothing when its start time could not be read: it has
    already exited, and no record is better than one that cannot be verified)."""
    if create_time is None:
        return
    record = EngineRecord(
        pid=pid,
        create_time=create_time,
        argv=argv,
        token_sha256=token_hash(token),
        run_id=identity.run_id,
        dev=identity.dev,
        ino=identity.ino,
    )
    atomic_write_json(run.engine_record, record.model_dump(mode="json"))


def read_engine_record(run: RunDir) -> tuple[EngineRecord | None, str | None]:
    """(the record, None); (None, why it is not one); (None, None) when there is none."""
    return read_record(run, run.engine_record, EngineRecord, "an engine record")


def _checkpoints_of(proc: psutil.Process) -> FileIdentity | None:
    """The directory the live process `proc` writes its checkpoints to, by its own command line and working
    directory (None: it names none, or none that exists)."""
    cmdline = proc.cmdline()
    places = [cmdline[i + 1] for i, word in enumerate(cmdline[:-1]) if word == CKPT_DIR_FLAG]
    places += [word[len(CKPT_DIR_FLAG) + 1 :] for word in cmdline if word.startswith(CKPT_DIR_FLAG + "=")]
    if len(places) != 1:
        return None
    return identity_seen_by(proc.pid, places[0])


def _mismatch(record: EngineRecord, proc: psutil.Process, checkpoints: FileIdentity | None) -> str | None:
    """Why the live process `proc` is not the engine `record` describes, writing to this run's checkpoint
    directory `checkpoints`, or None when it is."""
    try:
        if abs(proc.create_time() - record.create_time) > START_TIME_SLACK_S:
            return "gone"  # the pid now belongs to a process started at another time: a reused pid
        if proc.status() == psutil.STATUS_ZOMBIE:
            return "gone"
        if not same_command(proc.cmdline(), record.argv):
            return "its command line is not the recorded engine's"
        if not group_leader(record.pid):
            return "it does not lead a process group of its own, as every engine the proxy starts does"
        token = proc.environ().get(TOKEN_ENV)
        if token is None or token_hash(token) != record.token_sha256:
            return f"its environment lacks the token ({TOKEN_ENV}) of the proxy that launched the engine"
        if checkpoints is None or _checkpoints_of(proc) != checkpoints:
            return (
                f"its {CKPT_DIR_FLAG} is not this run's checkpoints directory (by device and inode): it is "
                "another run's engine"
            )
    except psutil.AccessDenied:
        return "it cannot be inspected (another user's process)"
    except psutil.Error:
        return "gone"
    return None


def verified_engine(run: RunDir, identity: RunIdentity, warn: Callable[[str], None]) -> psutil.Process | None:
    """The live engine RUN/.engine.json names, once every check passes; None otherwise (with one line
    through `warn` for a record that fails a check, none for an engine that simply exited)."""
    record, unusable = read_engine_record(run)
    if record is None:
        if unusable:
            warn(f"{unusable}; ignored, nothing signalled")
        return None
    path = run.engine_record
    if (record.run_id, record.dev, record.ino) != (identity.run_id, identity.dev, identity.ino):
        if record.run_id != identity.copied_from:  # a copy's inherited record: ensure_identity said so
            warn(
                f"{path} was written for run {record.run_id} in directory {FileIdentity(record.dev, record.ino)}, "
                f"not for this run ({identity.run_id} in {identity.directory}); ignored, nothing signalled "
                f"(pid {record.pid} left alone)"
            )
        return None
    try:
        proc = psutil.Process(record.pid)
    except psutil.Error:
        return None
    try:
        checkpoints = FileIdentity.of(run.checkpoints)
    except OSError:
        checkpoints = None
    why = _mismatch(record, proc, checkpoints)
    if why == "gone":
        return None
    if why is not None:
        warn(f"{path} names pid {record.pid}, but {why}; ignored, nothing signalled")
        return None
    return proc


def reap_orphan(
    run: RunDir, identity: RunIdentity, lock: RunLock, grace_s: float, warn: Callable[[str], None]
) -> str | None:
    """An engine a killed proxy left running gets `grace_s` to finish its EOF checkpoint, then its process
    group is killed. Only under `lock`, this run's lock held by the caller: no live proxy of the run owns
    that engine. Returns a line describing what was done, or None if there was no such engine."""
    if lock.fd is None:
        raise RuntimeError("reap_orphan needs the run's lock held")  # a programming error, never a user's
    lock.check()  # the path still leads to the directory locked: run.checkpoints is this run's
    proc = verified_engine(run, identity, warn)
    if proc is None:
        return None
    pid = proc.pid
    pidfd = open_pidfd(pid)
    try:
        # verified again once the pidfd is open: from here it names the very process the checks passed
        if verified_engine(run, identity, warn) is None:
            return None
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            if _exited(proc, pidfd):
                return f"waited for the previous engine (pid {pid}) to finish its checkpoint and exit"
            time.sleep(WAIT_STEP_S)
        # checked again: it may have exited this instant, or the record changed
        if _exited(proc, pidfd) or verified_engine(run, identity, warn) is None:
            return None
        signal_group(pid, signal.SIGKILL)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    try:
        proc.wait(10)
    except psutil.Error:
        pass
    return f"killed the previous engine (pid {pid}), still running {grace_s:.0f}s after its proxy ended"


def _exited(proc: psutil.Process, pidfd: int | None) -> bool:
    """Whether the verified engine has exited (its pidfd, where the kernel gives one; psutil otherwise)."""
    if pidfd is not None:
        return pidfd_exited(pidfd)
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
