"""Processes proven ours, and hang detection that knows the proxy's own pauses.

- A live run's engine record copied into another run (its own run identity fields put in): the other
  run's relaunch must leave the live engine alone (one line), as must a record whose argv was edited to
  name the other run's checkpoints and a record naming the live run's proxy itself.
- A foreign process holding the run directory's lock (`flock -x RUN sleep 300`, a Python script named
  `proxy` running `proxy run` of another directory, one running `proxy status` of this one): `proxy
  checkpoint`, `pivot`, `stop` (with and without --no-wait), `status` and a second `run` each say one
  line naming it as no proxy of this run and signal nothing; the holder survives, the run is unchanged.
- The proxy SIGSTOPped for three times --hang-timeout, then SIGCONT: no kill, no replayed step, no
  failure counted; and the proxy stopped while its engine is truly hung (SIGSTOPped too): the hang is
  still found, once, in the proxy's own running time, and the engine restarted.

Every scenario runs as pid 1 of its own pid namespace (sandbox.py), with sentinels as the victims watched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from harness.engine import TIMEOUT, Hang
from harness.gate import Gate
from proxy.processes import FileIdentity, flock_holder
from proxy.rundir.identity import ensure_identity
from proxy.rundir.layout import RunDir

from .process_scenarios import _env, _newest, _segments, _tree, _watch
from .proxy_checks import proxy_cmd, run_cmd
from .proxy_harness import (
    LogTail,
    compare_with_reference,
    engine_alive,
    engine_record,
    no_traceback,
    read_log,
    write_fault_experiment,
)
from .proxy_scenarios import copy_run
from .sandbox import Sentinels, require_namespace
from .scenarios import ENGINE, Outcome, tail_lines

FORGED_CLASS = "a live run's engine record copied into another run"
FOREIGN_CLASS = "a foreign process holding the run directory's lock"
PAUSE_CLASS = "the proxy SIGSTOPped longer than --hang-timeout"

HANG_TIMEOUT = 5.0
LONG_STEPS = 1_000_000  # run A of the forged record: never done before it is stopped
PAUSE_S = 3 * HANG_TIMEOUT  # the proxy's pause: three hang timeouts, as the 15 s against 5
HOLDER_CODE = """import fcntl, os, sys, time
fd = os.open(os.environ["HOLD_RUN"], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
time.sleep(300)
"""  # no signal handler: SIGUSR1, SIGUSR2 or SIGTERM would end it


def _engine_lines(p) -> list[str]:
    return [ln for ln in p.stderr_lines() if ".engine.json" in ln]


# ---------------------------------------------------------------------------
# a live run's engine record copied into another run


def forged_record_of_live_run(env: dict, template: str, workdir: str) -> Outcome:
    """Run A trains a long experiment on the engine itself (no frame gate: the gate's wrapper would change
    the engine's command line, and with it the record, which hid this fault). Runs B, copies of a stopped
    run, each get as `.engine.json` A's record with B's run id, device and inode (what killed A's engine
    60 s later); then that record with its argv's --ckpt-dir edited to B's checkpoints; then a record
    naming A's proxy itself with its real start time and command line. Each `proxy run` of B says one line
    naming .engine.json, signals nothing, and finishes as the reference at once; A's proxy and engine live
    through all three, and A, stopped, stops cleanly without an engine restart."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(FORGED_CLASS, "forged-record-of-live-run")
    sentinels = Sentinels()
    live = workdir / "A"
    long_run = write_fault_experiment(
        workdir / "long", max_steps=LONG_STEPS, ckpt_every=500, eval_every=500, sample_every=500
    )
    proxy = env.start(live, experiment=long_run)
    try:
        if not LogTail(live / ".loss.json").wait_step(5, proxy):
            out.fail(f"run A exited early: {tail_lines(proxy.stderr)}")
        record = engine_record(live)
        a_record = json.loads((live / ".engine.json").read_text())
        segments = _segments(live)
        a_proxy = psutil.Process(proxy.pid)
        argv = list(a_record["argv"])
        at = argv.index("--ckpt-dir")
        cases = [
            ("A's record with B's run identity", lambda b: a_record, "not this run's checkpoints directory"),
            (
                "A's record, its --ckpt-dir edited to B's checkpoints",
                lambda b: {**a_record, "argv": argv[: at + 1] + [str(b / "checkpoints")] + argv[at + 2 :]},
                "its command line is not the recorded engine's",
            ),
            (
                "a record naming A's live proxy (its real start time and command line)",
                lambda b: {
                    **a_record,
                    "pid": proxy.pid,
                    "create_time": a_proxy.create_time(),
                    "argv": a_proxy.cmdline()[1:],
                },
                "lacks the token",
            ),
        ]
        for i, (what, forge, needle) in enumerate(cases):
            out.begin_fault()
            other = copy_run(template, workdir / f"B-{i}")
            ident = ensure_identity(RunDir(other), lambda _line: None)
            forged = {**forge(other), "run_id": ident.run_id, "dev": ident.dev, "ino": ident.ino}
            (other / ".engine.json").write_text(json.dumps(forged))
            started = time.monotonic()
            try:
                rc, p = env.run(other, timeout=300)
            except Hang as exc:
                out.fail(f"{what}: {exc}")
            no_traceback(p, out, what)
            hits = _engine_lines(p)
            if rc != 0 or len(hits) != 1 or needle not in hits[0] or "nothing signalled" not in hits[0]:
                out.fail(
                    f"{what}: expected exit 0 and one line naming .engine.json ({needle!r}, nothing "
                    f"signalled); exit {rc}, lines {hits or tail_lines(p.stderr)}"
                )
            out.note(f"{what}: the line", hits[0])
            out.note(f"{what}: B's run took (s)", round(time.monotonic() - started, 1))
            if not engine_alive(record) or not proxy.alive():
                out.fail(f"{what}: A's engine {record} or proxy {proxy.pid} did not survive B's relaunch")
            _watch(sentinels, out, what)
            compare_with_reference(env, other, out, where=f"B ({what})")
        out.end_fault()
        rc, stop = run_cmd(proxy_cmd("stop", "--run-dir", live, "--timeout", TIMEOUT), timeout=TIMEOUT + 30)
        no_traceback(stop, out, "proxy stop of A")
        rc = proxy.finish(TIMEOUT)
        no_traceback(proxy, out, "A")
        state = json.loads((live / ".state.json").read_text())
        if rc != 0 or state.get("status") != "stopped" or state.get("restarts"):
            out.fail(
                f"A: exit {rc}, status {state.get('status')}, restarts {state.get('restarts')}: "
                f"{tail_lines(proxy.stderr)}"
            )
        if _segments(live) != segments:
            out.fail(f"A's engine was restarted (segments {sorted(_segments(live))}, before {sorted(segments)})")
        _watch(sentinels, out, "at the end")
    finally:
        if proxy.alive():
            proxy.kill_all()
        sentinels.close()
    return out.close()


# ---------------------------------------------------------------------------
# a foreign process holding the run's lock


def _hold(argv: list[str], run: Path, out: Outcome, what: str) -> subprocess.Popen:
    """Start a holder of `run`'s flock; return it once the kernel names it as the holder."""
    holder = subprocess.Popen(argv, env=dict(os.environ, HOLD_RUN=str(run)), start_new_session=True)
    target = FileIdentity.of(run)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        named = flock_holder(target)
        if named is not None and named.pid == holder.pid:
            return holder
        if holder.poll() is not None:
            break
        time.sleep(0.02)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    out.fail(f"{what}: the holder never took the run's lock (exit {holder.poll()})")


def _run_files(run: Path) -> dict:
    """The run's files and contents, less RUN/.pivot.lock: the empty file every `proxy pivot` flocks before
    it looks at the run (its own mutual exclusion, not a change to the run)."""
    tree = _tree(run)
    tree.pop(".pivot.lock", None)
    return tree


def _intact(holder: subprocess.Popen, out: Outcome, where: str) -> None:
    try:
        if holder.poll() is not None or psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED:
            out.fail(
                f"{where}: the lock holder (pid {holder.pid}) was signalled: "
                f"{'exit ' + str(holder.returncode) if holder.poll() is not None else 'stopped'}"
            )
    except psutil.Error:
        out.fail(f"{where}: the lock holder (pid {holder.pid}) is gone")


def foreign_lock_holders(env: dict, template: str, workdir: str) -> Outcome:
    """A stopped run's directory flocked by a process that is no proxy of it; for each holder, every
    command that signals the proxy or reports it: one line naming the holder's pid as no proxy of this run
    (exit 1; `status` exit 0 showing no proxy, with a WARNING line), no signal (the holder lives, running),
    the run directory unchanged. Released, the run finishes as the reference."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(FOREIGN_CLASS, "foreign-lock-holders")
    sentinels = Sentinels()
    run = copy_run(template, workdir / "run")
    other = copy_run(template, workdir / "other")
    fake = workdir / "fake" / "proxy"  # a script named like the console script
    fake.parent.mkdir()
    fake.write_text(HOLDER_CODE)
    caps = workdir / "caps.json"
    caps.write_text(json.dumps({"caps": {"dots": 0.9, "semis": 0.9}, "floors": {"dots": 0.1, "semis": 0.1}}))
    holders = [
        ("flock -x RUN sleep 300", ["flock", "-x", str(run), "sleep", "300"]),
        (
            "a script named proxy running `proxy run` of another run directory",
            [sys.executable, str(fake), "run", "--run-dir", str(other)],
        ),
        (
            "a script named proxy running `proxy status` of this run directory",
            [sys.executable, str(fake), "status", "--run-dir", str(run)],
        ),
    ]
    commands = [
        ("checkpoint", proxy_cmd("checkpoint", "--run-dir", run), 1),
        ("pivot", proxy_cmd("pivot", "--run-dir", run, "--caps", caps), 1),
        ("stop --no-wait", proxy_cmd("stop", "--run-dir", run, "--no-wait"), 1),
        ("stop", proxy_cmd("stop", "--run-dir", run, "--timeout", "10"), 1),
        ("run", env.argv(run), 1),
    ]
    try:
        before = _run_files(run)
        for what, argv in holders:
            out.begin_fault()
            holder = _hold(argv, run, out, what)
            try:
                named = f"pid {holder.pid}, which is not a proxy of this run"
                for name, cmd, code in commands:
                    rc, p = run_cmd(cmd, timeout=120)
                    no_traceback(p, out, f"[{what}] proxy {name}")
                    lines = [ln for ln in p.stderr_lines() if ln.strip()]
                    if rc != code or len(lines) != 1 or named not in lines[0]:
                        out.fail(
                            f"[{what}] proxy {name}: exit {rc}, stderr {lines[-3:]}; expected exit {code} and "
                            f"one line naming {named!r}"
                        )
                    if name != "run" and "nothing" not in lines[0]:
                        out.fail(f"[{what}] proxy {name}: the line does not say nothing was done: {lines[0]}")
                    out.note(f"[{what}] proxy {name}", lines[0])
                    _intact(holder, out, f"[{what}] proxy {name}")
                rc, p = run_cmd(proxy_cmd("status", "--run-dir", run, "--json"))
                try:
                    shown = json.loads("\n".join(p.lines)) if rc == 0 else {}
                except ValueError:
                    shown = {}
                if (
                    rc != 0
                    or shown.get("proxy_pid") is not None
                    or shown.get("alive")
                    or named not in str(shown.get("lock_holder"))
                ):
                    out.fail(
                        f"[{what}] proxy status --json: exit {rc}, proxy_pid {shown.get('proxy_pid')}, alive "
                        f"{shown.get('alive')}, lock_holder {shown.get('lock_holder')!r}"
                    )
                rc, p = run_cmd(proxy_cmd("status", "--run-dir", run))
                warned = [ln for ln in p.lines if ln.startswith("WARNING:") and named in ln]
                if rc != 0 or len(warned) != 1 or any("proxy pid" in ln for ln in p.lines):
                    out.fail(f"[{what}] proxy status: exit {rc}, {p.lines}")
                out.note(f"[{what}] proxy status", warned[0])
                _intact(holder, out, f"[{what}] proxy status")
                _watch(sentinels, out, what)
                now = _run_files(run)
                if now != before:
                    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
                    out.fail(f"[{what}]: the run directory changed: {changed[:5]}", data_lost=1)
            finally:  # its whole session: `flock`'s child `sleep` holds the lock too
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait()
        out.end_fault()
        rc, p = env.run(run, timeout=300)
        no_traceback(p, out, "relaunch")
        if rc != 0:
            out.fail(f"relaunch once released: exit {rc}: {tail_lines(p.stderr)}")
        compare_with_reference(env, run, out, where="relaunch")
        _watch(sentinels, out, "at the end")
    finally:
        sentinels.close()
    return out.close()


# ---------------------------------------------------------------------------
# the proxy stopped longer than --hang-timeout


def _hang_lines(p) -> list[str]:
    return [ln for ln in p.stderr_lines() if "sent nothing for" in ln]


def _pause_lines(p) -> list[str]:
    return [ln for ln in p.stderr_lines() if "the proxy itself did not run" in ln]


def stopped_proxy(env: dict, template: str, workdir: str) -> Outcome:
    """`proxy run --hang-timeout 5`, its engine held by a frame gate a few steps past the newest checkpoint:
    (1) the proxy SIGSTOPped for 15 s, then SIGCONT (and the gate opened): no hang reported, no engine
    killed, no new segment, no step replayed, one line saying the proxy did not run; (2) later, the engine
    SIGSTOPped (a real hang) and the proxy with it for 15 s, then the proxy SIGCONT: the hang is found once,
    `using no CPU`, and the engine restarted from the newest valid checkpoint. The run finishes as the
    reference, with exactly one restart."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(PAUSE_CLASS, "stopped-proxy")
    sentinels = Sentinels()
    run = copy_run(template, workdir / "run")
    gate = Gate(workdir / "gate", ENGINE.path)
    tail = LogTail(run / ".loss.json")
    first = _newest(run) + 3
    later = first + 8
    try:
        gate.hold_after(first)
        proxy = env.start(run, "--hang-timeout", HANG_TIMEOUT, engine=gate.engine_flag)
        if not tail.wait_step(first, proxy):
            out.fail(f"the proxy exited early: {tail_lines(proxy.stderr)}")
        segments = _segments(run)

        out.begin_fault()  # (1) the proxy stopped, the engine healthy
        os.kill(proxy.pid, signal.SIGSTOP)
        time.sleep(PAUSE_S)
        os.kill(proxy.pid, signal.SIGCONT)
        gate.hold_after(later)  # only now: the proxy's first look after the pause finds the engine silent
        if not tail.wait_step(later, proxy):
            out.fail(f"(1) the proxy exited after its pause: {tail_lines(proxy.stderr)}")
        if _hang_lines(proxy) or _segments(run) != segments:
            out.fail(
                f"(1) the healthy engine was taken for hung: {_hang_lines(proxy)}, segments "
                f"{sorted(_segments(run))} (before {sorted(segments)})"
            )
        if len(_pause_lines(proxy)) != 1:
            out.fail(f"(1) expected one line saying the proxy did not run: {tail_lines(proxy.stderr)}")
        out.note("(1) the line", _pause_lines(proxy)[0])
        if read_log(run / ".loss.json").max_step < later:
            out.fail("(1) the run did not go on after the pause")

        out.begin_fault()  # (2) the engine truly hung while the proxy is stopped
        record = engine_record(run)
        logged = read_log(run / ".loss.json").max_step
        os.kill(record[0], signal.SIGSTOP)
        os.kill(proxy.pid, signal.SIGSTOP)
        gate.open()  # the restarted engine trains to the end
        time.sleep(PAUSE_S)
        resumed = time.monotonic()
        os.kill(proxy.pid, signal.SIGCONT)
        got = tail.wait_new_segment(max(segments), proxy)
        if got is None:
            out.fail(f"(2) the proxy exited instead of restarting the hung engine: {tail_lines(proxy.stderr)}")
        out.note("(2) seconds from SIGCONT to the restarted segment", round(time.monotonic() - resumed, 1))
        hung = _hang_lines(proxy)
        if len(hung) != 1 or "using no CPU" not in hung[0]:
            out.fail(f"(2) expected one hang line saying the engine used no CPU: {hung}")
        out.note("(2) the line", hung[0])
        out.steps_lost += max(0, logged - got[1])
        if engine_alive(record):
            out.fail(f"(2) the hung engine {record} still runs")

        rc = proxy.finish(300)
        no_traceback(proxy, out, "stopped proxy run")
        if rc != 0:
            out.fail(f"exit {rc}: {tail_lines(proxy.stderr)}")
        state = json.loads((run / ".state.json").read_text())
        if state.get("restarts") != 1 or len(_hang_lines(proxy)) != 1:
            out.fail(
                f"expected exactly one restart (the real hang): restarts {state.get('restarts')}, hang lines "
                f"{_hang_lines(proxy)}"
            )
        compare_with_reference(env, run, out)
        _watch(sentinels, out, "at the end")
    finally:
        sentinels.close()
    return out.close()
