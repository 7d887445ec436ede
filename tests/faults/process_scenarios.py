"""Process records and locks that lie: forged engine records, forged or deleted lock files, a copied live
run, a run directory replaced under its proxy.

Every scenario here runs as pid 1 of its own pid namespace (sandbox.py): the records it forges name pid
1, -1 and live processes that are not the engine, and a proxy that acted on one would signal every
process it can reach. Sentinels (sandbox.Sentinels) are the victims watched: after every fault they
must be alive and not stopped, the run's own processes must be the ones that ran, and the run must end
as the uninterrupted reference run does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import psutil

from harness.engine import TIMEOUT, Hang
from harness.gate import Gate
from proxy.formats import frames
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints
from proxy.rundir.identity import ensure_identity
from proxy.rundir.layout import RunDir

from .proxy_checks import proxy_cmd, run_cmd
from .proxy_harness import (
    LogTail,
    ProxyEnv,
    compare_with_reference,
    engine_alive,
    engine_record,
    no_traceback,
    read_log,
)
from .proxy_scenarios import copy_run
from .sandbox import Sentinels, require_namespace
from .scenarios import ENGINE, Outcome, tail_lines

RECORD_CLASS = 'forged engine records (pid true, 1, -1, "12", a live unrelated pid)'
COPY_CLASS = "a copied live run relaunched"
LOCK_CLASS = "lock files deleted or forged while the proxy runs"
MOVED_CLASS = "run directory moved or replaced under a live proxy"


def _env(env: dict) -> ProxyEnv:
    return ProxyEnv(**{k: Path(v) if k in ("root", "experiment", "cache", "ref") else v for k, v in env.items()})


def _newest(run: Path) -> int:
    return max((checkpoint_step(p) for p in list_checkpoints(run / "checkpoints")), default=0)


def _watch(sentinels: Sentinels, out: Outcome, where: str) -> None:
    for line in sentinels.damaged():
        out.fail(f"{where}: {line}")


def _segments(run: Path) -> set[int]:
    return {int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()}


def _live(env: ProxyEnv, run: Path, workdir: Path, out: Outcome, ahead: int = 3):
    """`proxy run` on a stopped run, held by a frame gate `ahead` steps past its newest checkpoint (3: no
    checkpoint is due where it waits), once it has trained them all: (proxy, gate); a proxy that exits first
    fails the check."""
    gate = Gate(workdir / f"gate-{run.name}", ENGINE.path)
    newest = _newest(run)
    gate.hold_after(newest + ahead)
    proxy = env.start(run, engine=gate.engine_flag)
    if not LogTail(run / ".loss.json").wait_step(newest + ahead, proxy):
        out.fail(f"the proxy on {run.name} exited early: {tail_lines(proxy.stderr)}")
    return proxy, gate


# ---------------------------------------------------------------------------
# forged engine records


def forged_engine_records(env: dict, template: str, workdir: str) -> Outcome:
    """RUN/.engine.json replaced by each forged record the adversarial test used (`true`, `1`, `-1`, `"12"`,
    `1.9`, bare or inside an otherwise valid record), by the run's own record pointing at a live unrelated
    process with its real start time (alone in its session, or in pid 1's group), and by a record written
    for another run. `proxy run` must report each in one line, signal nothing (the sentinels live), and
    finish as the reference run does."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(RECORD_CLASS, "forged-engine-records")
    sentinels = Sentinels()
    real = json.loads((template / ".engine.json").read_text())
    try:
        alone, grouped = sentinels.alone.pid, sentinels.grouped.pid
        cases = [
            ("bare pid true", {"pid": True}, "not an engine record"),
            ("bare pid 1", {"pid": 1}, "not an engine record"),
            ("bare pid -1", {"pid": -1}, "not an engine record"),
            ('bare pid "12"', {"pid": "12"}, "not an engine record"),
            ("bare pid 1.9", {"pid": 1.9}, "not an engine record"),
            ("record with pid true", {**real, "pid": True}, "not an engine record"),
            (
                "record with pid 1 and its real start time",
                {**real, "pid": 1, "create_time": psutil.Process(1).create_time()},
                "not an engine record",
            ),
            ("record with pid -1", {**real, "pid": -1}, "not an engine record"),
            ('record with pid "12"', {**real, "pid": "12"}, "not an engine record"),
            (
                "record naming a live unrelated process with its real start time",
                {**real, "pid": alone, "create_time": sentinels.create_time("unrelated")},
                f"names pid {alone}, but its command line",
            ),
            (
                "record naming a live process of pid 1's group with its real start time",
                {**real, "pid": grouped, "create_time": sentinels.create_time("pid 1's group")},
                f"names pid {grouped}, but its command line",
            ),
            (
                "record of another run naming a live process",
                {**real, "run_id": "0" * 32, "pid": alone, "create_time": sentinels.create_time("unrelated")},
                "not for this run",
            ),
        ]
        for i, (what, record, needle) in enumerate(cases):
            out.begin_fault()
            run = copy_run(template, workdir / f"run-{i}")
            # the copy's own identity, as its first launch mints it; the forger writes a record for this run
            ident = ensure_identity(RunDir(run), lambda _line: None)
            if record.get("run_id") == real.get("run_id"):
                record = {**record, "run_id": ident.run_id, "dev": ident.dev, "ino": ident.ino}
            (run / ".engine.json").write_text(json.dumps(record))
            try:
                rc, p = env.run(run, timeout=300)
            except Hang as exc:
                out.fail(f"{what}: {exc}")
            no_traceback(p, out, what)
            hits = [ln for ln in p.stderr_lines() if ".engine.json" in ln]
            if rc != 0 or len(hits) != 1 or needle not in hits[0] or "nothing signalled" not in hits[0]:
                out.fail(
                    f"{what}: expected exit 0 and one line naming .engine.json ({needle!r}, nothing signalled); "
                    f"exit {rc}, lines {hits or tail_lines(p.stderr)}"
                )
            elif i in (0, 9):
                out.note(f"{what}: the line", hits[0])
            _watch(sentinels, out, what)
            compare_with_reference(env, run, out, where=what)
            shutil.rmtree(run, ignore_errors=True)
        out.end_fault()
        _watch(sentinels, out, "at the end")
    finally:
        sentinels.close()
    return out.close()


# ---------------------------------------------------------------------------
# a copied live run


def copied_live_run(env: dict, template: str, workdir: str) -> Outcome:
    """`cp -a` of a run while its proxy and engine train, then `proxy run` on the copy (what killed the
    original's engine 60 s later): the copy must say it is a copy, leave the original's engine alone, and
    finish as the reference; the original, released, must finish too, without an engine restart."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(COPY_CLASS, "copied-live-run")
    sentinels = Sentinels()
    original = copy_run(template, workdir / "original")
    try:
        out.begin_fault()
        proxy, gate = _live(env, original, workdir, out)
        record = engine_record(original)
        segments = _segments(original)
        copy = workdir / "copy"
        cp = subprocess.run(["cp", "-a", str(original), str(copy)], capture_output=True, text=True)
        if cp.returncode != 0:
            out.fail(f"cp -a failed: {cp.stderr.strip()}")
        try:
            rc, p = env.run(copy, timeout=300)
        except Hang as exc:
            out.fail(f"the copy's proxy: {exc}")
            rc, p = None, None
        if p is not None:
            no_traceback(p, out, "the copy")
            said = [ln for ln in p.stderr_lines() if "is a copy of run" in ln]
            if rc != 0 or len(said) != 1:
                out.fail(f"the copy: exit {rc}, expected 0 and one line saying it is a copy: {tail_lines(p.stderr)}")
            else:
                out.note("the copy says", said[0])
            compare_with_reference(env, copy, out, where="the copy")
        if not engine_alive(record) or not proxy.alive():
            out.fail(
                f"the original's engine {record} or proxy {proxy.pid} did not survive the copy's launch", data_lost=0
            )
        _watch(sentinels, out, "after the copy ran")
        gate.open()
        rc = proxy.finish(300)
        no_traceback(proxy, out, "the original")
        if rc != 0:
            out.fail(f"the original exited {rc}: {tail_lines(proxy.stderr)}")
        if _segments(original) - segments:
            out.fail(
                f"the original's engine was restarted (segments {sorted(_segments(original))}, "
                f"before the copy {sorted(segments)})"
            )
        compare_with_reference(env, original, out, where="the original")
        _watch(sentinels, out, "at the end")
    finally:
        sentinels.close()
    return out.close()


# ---------------------------------------------------------------------------
# lock files deleted or forged


def forged_lock_files(env: dict, template: str, workdir: str) -> Outcome:
    """While a proxy trains: a `.lock` and `.pivot.lock` written with a sentinel's pid, then deleted, then
    the run's lock sought by a second `proxy run` (refused: the kernel holds the lock on the directory);
    `proxy status`, `proxy checkpoint` and `proxy stop` must find the real proxy (the checkpoint request
    reaches its engine, the stop ends it), never the sentinel; the run then finishes as the reference."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(LOCK_CLASS, "forged-lock-files")
    sentinels = Sentinels()
    run = copy_run(template, workdir / "run")
    try:
        proxy, gate = _live(env, run, workdir, out)
        record = engine_record(run)
        forged = f"{sentinels.alone.pid}\n"

        out.begin_fault()  # forged, then deleted lock files; a second proxy
        for name in (".lock", ".pivot.lock"):
            (run / name).write_text(forged)
        for forged_or_gone in ("forged", "deleted"):
            if forged_or_gone == "deleted":
                for name in (".lock", ".pivot.lock"):
                    (run / name).unlink(missing_ok=True)
            rc, second = run_cmd(env.argv(run))
            no_traceback(second, out, f"second proxy ({forged_or_gone} lock files)")
            lines = second.stderr_lines()
            if rc != 1 or not lines or f"in use by proxy pid {proxy.pid}" not in lines[-1]:
                out.fail(
                    f"second proxy with {forged_or_gone} lock files: exit {rc}, {lines[-2:]}; expected exit 1 "
                    f"naming proxy pid {proxy.pid}"
                )
            if engine_record(run) != record or not engine_alive(record):
                out.fail(f"second proxy with {forged_or_gone} lock files touched the first one's engine")
        _watch(sentinels, out, "second proxy")

        out.begin_fault()  # status and checkpoint with a forged .lock
        (run / ".lock").write_text(forged)
        rc, status = run_cmd(proxy_cmd("status", "--run-dir", run, "--json"))
        try:
            shown = json.loads("\n".join(status.lines)).get("proxy_pid") if rc == 0 else None
        except ValueError:
            shown = None
        if shown != proxy.pid:
            out.fail(f"proxy status shows proxy pid {shown}, the proxy is {proxy.pid}")
        seen = len(gate.received(frames.CHECKPOINT))
        rc, ck = run_cmd(proxy_cmd("checkpoint", "--run-dir", run))
        no_traceback(ck, out, "proxy checkpoint")
        if rc != 0 or f"proxy pid {proxy.pid}" not in "\n".join(ck.lines):
            out.fail(f"proxy checkpoint: exit {rc}, {ck.lines} {tail_lines(ck.stderr)}")
        try:
            if gate.wait_frame(frames.CHECKPOINT, seen, proxy.alive, TIMEOUT) is None:
                out.fail("the checkpoint request never reached the engine")
        except TimeoutError as exc:
            out.fail(f"the checkpoint request never reached the engine: {exc}")
        _watch(sentinels, out, "proxy checkpoint")

        out.begin_fault()  # stop with a forged .lock
        rc, stop = run_cmd(proxy_cmd("stop", "--run-dir", run, "--timeout", TIMEOUT))
        no_traceback(stop, out, "proxy stop")
        if rc != 0 or f"proxy pid {proxy.pid}" not in "\n".join(stop.lines):
            out.fail(f"proxy stop: exit {rc}, {stop.lines} {tail_lines(stop.stderr)}")
        rc = proxy.finish(TIMEOUT)
        if rc != 0:
            out.fail(f"the stopped proxy exited {rc}: {tail_lines(proxy.stderr)}")
        _watch(sentinels, out, "proxy stop")
        gate.open()
        done = env.run(run, timeout=300)
        no_traceback(done[1], out, "relaunch")
        if done[0] != 0:
            out.fail(f"relaunch exited {done[0]}: {tail_lines(done[1].stderr)}")
        compare_with_reference(env, run, out, where="relaunch")
        _watch(sentinels, out, "at the end")
    finally:
        sentinels.close()
    return out.close()


# ---------------------------------------------------------------------------
# the run directory moved or replaced


def _tree(root: Path) -> dict[str, bytes | None]:
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def moved_run_directory(env: dict, template: str, workdir: str) -> Outcome:
    """While a proxy trains, its run directory is renamed and a copy (or an empty directory) put in its
    place. The proxy must stop with one line (exit 1), kill its engine rather than let it checkpoint into the
    impostor, and write nothing there; the moved directory, relaunched, finishes as the reference."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(MOVED_CLASS, "moved-run-directory")
    sentinels = Sentinels()
    try:
        for impostor in ("a copy", "an empty directory"):
            out.begin_fault()
            run = copy_run(template, workdir / f"run-{impostor.split()[-1]}")
            proxy, gate = _live(env, run, workdir, out)
            record = engine_record(run)
            moved = run.with_name(run.name + ".moved")
            run.rename(moved)
            if impostor == "a copy":
                shutil.copytree(moved, run, symlinks=True)
            else:
                run.mkdir()
            before = _tree(run)
            try:
                rc = proxy.finish(TIMEOUT)
            except Hang as exc:
                out.fail(f"{impostor}: {exc}")
            no_traceback(proxy, out, impostor)
            lines = proxy.stderr_lines()
            if rc != 1 or not lines or "moved or replaced" not in lines[-1]:
                out.fail(
                    f"{impostor}: exit {rc}, last lines {lines[-2:]}; expected exit 1 and a last line saying "
                    "the run directory was moved or replaced"
                )
            else:
                out.note(f"{impostor}: last line", lines[-1])
            if engine_alive(record):
                out.fail(f"{impostor}: the engine {record} still runs")
            if _tree(run) != before:
                changed = sorted(k for k in set(before) | set(_tree(run)) if before.get(k) != _tree(run).get(k))
                out.fail(f"{impostor}: the proxy or its engine wrote into the impostor: {changed[:5]}")
            gate.open()
            done = env.run(moved, timeout=300)
            no_traceback(done[1], out, f"{impostor}: relaunch")
            if done[0] != 0:
                out.fail(f"{impostor}: relaunch of the moved run exited {done[0]}: {tail_lines(done[1].stderr)}")
            compare_with_reference(env, moved, out, where=f"{impostor}: relaunch")
            _watch(sentinels, out, impostor)
    finally:
        sentinels.close()
    return out.close()
