"""Running proxy commands in the fault scenarios and checking what they left: the one line and exit code of a
refusal, the log only appended to, the checkpoints kept, temp files, a tmpfs or a full disk, a relaunch
compared with the reference (run_dir_scenarios.py, path_scenarios.py, process_scenarios.py and the others).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from harness.engine import Child, Hang
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint
from proxy.formats.loss_log import parse_line

from .engine_scenarios import try_mount_tmpfs, umount
from .proxy_harness import LogTail, ProxyEnv, compare_with_reference, no_traceback
from .proxy_scenarios import _snapshot
from .scenarios import REPO, Outcome, tail_lines

MEMORY_LIMIT = 8 << 30  # RLIMIT_AS of a proxy fed a device: a regression fails, it never eats the machine
REFUSE_TIMEOUT = 60.0  # a refusal is immediate; this only bounds a regression that hangs


# ---------------------------------------------------------------------------
# helpers


def proxy_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", *map(str, args)]


def run_cmd(argv: list[str], timeout: float = REFUSE_TIMEOUT, preexec_fn=None) -> tuple[int, Child]:
    """A `python -m proxy ...` command other than `run` (status, pivot, fork), in its own session."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    p = Child(argv, cwd=REPO, new_session=True, parse_events=False, env=env, preexec_fn=preexec_fn)
    return p.finish(timeout), p


def launch(start, out: Outcome, where: str) -> tuple[int, Child]:
    """`start()` (an env.run or run_cmd call): its (exit code, process); a hang fails the check."""
    try:
        return start()
    except Hang as exc:
        out.fail(f"{where}: {exc}")


def launch_and_compare(env: ProxyEnv, run: Path, out: Outcome, where: str) -> None:
    """Launch the same command on `run` (which resumes or trains from scratch); it must finish with exit 0
    and equal the uninterrupted run."""
    rc, p = launch(lambda: env.run(run, timeout=300), out, where)
    no_traceback(p, out, where)
    if rc != 0:
        out.fail(f"{where}: exited {rc}: {tail_lines(p.stderr)}")
    compare_with_reference(env, run, out, where=where)


def start_training(env: ProxyEnv, run: Path, out: Outcome, past: int = 2) -> Child:
    """`proxy run` on a stopped run, once it has logged `past` steps beyond its newest checkpoint (a proxy
    that exits first fails the check)."""
    newest = max((checkpoint_step(q) for q in list_checkpoints(run / "checkpoints")), default=0)
    p = env.start(run)
    if not LogTail(run / ".loss.json").wait_step(newest + past, p):
        out.fail(f"the proxy exited early: {tail_lines(p.stderr)}")
    return p


def memory_limit():
    """preexec_fn: RLIMIT_AS = MEMORY_LIMIT (with the engine's small needs well inside it)."""

    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return apply


def run_state(run: Path) -> dict:
    try:
        state = json.loads((run / ".state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def temp_files(run: Path) -> list[str]:
    """Temp files a write left behind: the proxy's `.<name>.<pid>.tmp`, the engine's `.step_*.bin.tmp`."""
    out = []
    for d in (run, run / "checkpoints"):
        if d.is_dir():
            out += [f"{d.name}/{p.name}" for p in d.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    return sorted(out)


def only_appended(run: Path, before: bytes, out: Outcome, where: str) -> None:
    """`.loss.json` kept every byte it had, and everything after them is whole lines of complete entries."""
    after = (run / ".loss.json").read_bytes()
    if not after.startswith(before):
        out.fail(f"{where}: .loss.json lost or changed bytes it had", data_lost=1)
    if after and not after.endswith(b"\n"):
        out.fail(f"{where}: .loss.json ends in a torn line ({after[-60:]!r})")
    bad = [ln for ln in after[len(before) :].split(b"\n") if ln.strip() and parse_line(ln) is None]
    if bad:
        out.fail(f"{where}: {len(bad)} appended line(s) are not complete entries (first {bad[0][:80]!r})")


def checkpoints_kept(run: Path, before: dict, out: Outcome, where: str) -> None:
    """Every checkpoint that was there is byte-identical, and every step_*.bin verifies."""
    now = _snapshot(run)
    for name, data in before.items():
        if now.get(name) != data:
            out.fail(f"{where}: {name} changed or vanished", data_lost=1)
    for p in list_checkpoints(run / "checkpoints"):
        reason = verify_checkpoint(p)
        if reason is not None and p.name not in before:
            out.fail(f"{where}: {p.name} does not verify ({reason}): a partial file a loader could take")


def one_line_exit(p: Child, rc: int, code: int, needle: str, out: Outcome, where: str) -> str:
    """Exit `code`, no traceback, exactly one stderr line containing `needle`, and it is the last."""
    no_traceback(p, out, where)
    lines = p.stderr_lines()
    hits = [ln for ln in lines if needle in ln]
    if rc != code or len(hits) != 1 or lines[-1] != hits[0]:
        out.fail(
            f"{where}: expected exit {code} and one last stderr line with {needle!r}; exit {rc}, stderr {lines[-4:]}"
        )
    return hits[0]


@contextmanager
def tmpfs(mountpoint: Path, size_bytes: int):
    """A tmpfs of `size_bytes` at `mountpoint` (yields None), or yields why it cannot be mounted."""
    why = try_mount_tmpfs(mountpoint, size_bytes)
    try:
        yield why
    finally:
        if why is None:
            umount(mountpoint)


def fill_disk(directory: Path) -> int:
    """Fill the file system holding `directory` to the last byte; returns the bytes written."""
    with open(directory / "filler", "ab", buffering=0) as f:
        return _fill(f)


def _fill(f) -> int:
    written = 0
    for block in (1 << 20, 4096, 512, 1):
        data = b"\0" * block
        while True:
            try:
                written += f.write(data)
            except OSError:
                break
    return written


@contextmanager
def disk_kept_full(directory: Path):
    """The file system holding `directory` filled to the last byte, and filled again every few
    milliseconds while the block runs: space the run frees (retention deleting an old checkpoint, a
    file replaced by a smaller one) is taken back at once, as by another writer on a shared disk, so the
    run cannot train on through a full disk by a lucky order of its deletes and writes. Yields the bytes
    written by the first fill."""
    stop = threading.Event()
    with open(directory / "filler", "ab", buffering=0) as f:
        first = _fill(f)

        def refill() -> None:
            while not stop.wait(0.002):
                _fill(f)

        keeper = threading.Thread(target=refill, name="disk-kept-full", daemon=True)
        keeper.start()
        try:
            yield first
        finally:
            stop.set()
            keeper.join()
