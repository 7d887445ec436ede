"""The proxy's fault scenarios (tests/faults/test_kills.py, test_checkpoints.py, test_disk.py, test_signals.py,
test_sidecars.py): kill storms under the proxy, damaged sidecars, a full disk, corrupt checkpoints, hung
and crashing engines, signal storms (scenarios.py says how scenarios are built).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

from harness.data import make_shard
from harness.engine import TIMEOUT, Child, Hang
from harness.gate import KILL_SLACK, Gate
from harness.shape import Shape
from proxy.formats.checkpoint import checkpoint_files, checkpoint_step, list_checkpoints

from .engine_scenarios import checkpoint_regions, flip_bit
from .proxy_harness import (
    LogTail,
    ProxyEnv,
    compare_with_reference,
    engine_alive,
    engine_record,
    expected_resume,
    finish_last_launch,
    first_resume,
    kill_engine,
    no_traceback,
    read_log,
    wait_engine_gone,
    write_fault_experiment,
)
from .scenarios import (
    ENGINE,
    CkptWatch,
    Outcome,
    compare_files,
    fsize_limit,
    rng_for,
    run_standalone,
    tail_lines,
    temps_in,
)

# ---------------------------------------------------------------------------
# proxy scenarios


PROXY_KILL_KINDS = {
    "proxy": "kill -9 of the proxy's process group",
    "engine": "kill -9 of the engine under the proxy",
    "both": "kill -9 of the proxy and the engine together",
}


def slow_write_engine(directory: Path, shim: Path, delay_ms: int) -> Path:
    """An executable the proxy can run as its engine (`--engine PATH`): the engine, exec'd (so its pid is
    the one the proxy records and kills) with every fsync delayed, so that a checkpoint's background write
    lasts at least 2 x delay_ms (the file's fsync, then its directory's) while training goes on."""
    path = Path(directory) / "engine-slow-writes.sh"
    path.write_text(
        f"#!/bin/sh\nexport LD_PRELOAD='{shim}' MG_TEST_FSYNC_DELAY_MS={int(delay_ms)}\nexec '{ENGINE.path}' \"$@\"\n"
    )
    path.chmod(0o755)
    return path


def unannounced_checkpoint(run: Path) -> bool:
    """A step_*.bin newer than the last checkpoint .state.json names (the proxy writes it at every ckpt
    event): a write between its rename and its ckpt event, or an event the proxy never handled."""
    newest = list_checkpoints(run / "checkpoints")
    try:
        announced = checkpoint_step(json.loads((run / ".state.json").read_text()).get("last_checkpoint") or "")
    except (OSError, ValueError, AttributeError):
        announced = None
    return bool(newest) and (checkpoint_step(newest[0]) or 0) > (announced or 0)


def proxy_kill_storm(
    env: ProxyEnv,
    workdir: Path,
    kind: str,
    n_kills: int,
    engine: str | None = None,
    write_s: float | None = None,
    name: str | None = None,
    fault_class: str | None = None,
    ranks: int = 1,
) -> Outcome:
    """SIGKILL the proxy (its process group), the engine, or both, at seeded random moments (40% of
    them right after a checkpointing step, in or around the write); relaunch the same command when the
    proxy died. Every relaunch resumes from the newest valid checkpoint whose steps are all in
    .loss.json; no valid checkpoint is ever lost; the finished run equals the uninterrupted one.

    The engine runs behind a frame gate: every launch waits at its first step until the storm has
    aimed the next kill (its target depends on where the launch resumed), then trains to at most
    KILL_SLACK steps past the target. However fast the engine, each kill lands at its target or a
    little after, and the run cannot finish before the storm has landed its kills.

    With `write_s` (an engine whose checkpoint writes take about that long, e.g. slow_write_engine),
    every kill lands at a random moment within write_s after a checkpointing step was logged: inside
    the background write, while the engine trains on and before its ckpt event.

    On `ranks` > 1 the run trains on the MPI CPU engine under mpirun, gated in front of mpirun, and "the
    engine" is the launcher (.engine.json's pid). The ranks of a killed mpirun may still write a checkpoint
    on their way out (rank 0 sees its stdin end), so a relaunch may resume later than the newest valid logged
    checkpoint on disk just after the kill, never earlier, and only from a valid logged one."""
    name = name or f"proxy-kill-{kind}"
    out = Outcome(fault_class or PROXY_KILL_KINDS[kind], name)
    rng = rng_for(name)
    run = workdir / "run"
    watch = CkptWatch(run / "checkpoints")
    tail = LogTail(run / ".loss.json")
    gate = Gate(workdir / "gate", engine or ENGINE.path, ranks)
    gate.hold_after(0)
    extra = ("--max-failures", "50", *gate.rank_flags)  # kills of the engine are not a crash loop here
    p = env.start(run, *extra, engine=gate.engine_flag)
    procs = [p]
    seen, expected, lost_from, kills, launches = 0, 0, 0, 0, 0
    on_disk: set[str] | None = None  # checkpoints left by the engine just killed (the proxy chooses among them)
    while True:
        launch = gate.wait_launch(launches, p.alive, TIMEOUT)
        if launch is None:
            out.fail(f"the proxy exited {p.wait()} without launching an engine: {tail_lines(p.stderr)}")
        launches += 1
        target = None
        if kills < n_kills:
            resume, ce = launch.first_step - 1, env.ckpt_every
            # Delays are a few steps' worth at most: a step of this model takes about a
            # millisecond, and the gate holds the engine KILL_SLACK steps past the target.
            if write_s is not None:
                target, delay = (resume // ce + rng.randint(1, 2)) * ce, rng.uniform(0.0, write_s)
            elif rng.random() < 0.4:
                target, delay = (resume // ce + rng.randint(1, 2)) * ce, rng.uniform(0.0, 0.003)
            else:
                target, delay = resume + rng.randint(1, 2 * ce), rng.uniform(0.0, 0.006)
            if target >= env.max_steps - 1:
                out.bump("kills skipped: too close to the end")
                target = None
        if target is None:
            gate.open()
        else:
            gate.hold_after(target + KILL_SLACK)
        got = tail.wait_new_segment(seen, p)
        if got is None:
            out.fail(f"the proxy exited {p.wait()} without training a new segment: {tail_lines(p.stderr)}")
        seg, resume = got
        if resume != launch.first_step - 1:
            out.fail(
                f"segment {seg} logged step {resume + 1} first; its engine's first frame was step {launch.first_step}"
            )
        if kind == "engine" and kills:
            expected = expected_resume(run, max_segment=seen, among=on_disk)
            lost_from = read_log(run / ".loss.json", max_segment=seen).max_step
        if ranks > 1 and resume > expected and expected_resume(run, seen, among={f"step_{resume:06d}.bin"}) == resume:
            out.bump("resumes later than the newest checkpoint at the kill (the killed job's rank 0 wrote on)")
        elif resume != expected:
            out.fail(
                f"segment {seg} resumed from step {resume}; the newest valid checkpoint covered by "
                f".loss.json is step {expected}"
            )
        out.steps_lost += max(0, lost_from - resume)
        out.end_fault()
        seen = seg
        if target is None:
            break
        if not tail.wait_step(target, p, segment=seg):
            out.fail(f"the proxy exited {p.wait()} before step {target}: {tail_lines(p.stderr)}")
        time.sleep(delay)
        rec = engine_record(run)
        if not engine_alive(rec):
            out.fail(f".engine.json names {rec}, not a running engine")
        gate.hold_after(0)  # the next launch waits at its first step for its own target
        kills += 1
        out.begin_fault()
        if kind in ("proxy", "both"):
            p.killpg()
            if kind == "both":
                kill_engine(rec)
            p.wait()
            if not wait_engine_gone(rec):
                out.fail(f"kill {kills}: the orphaned engine pid {rec[0]} did not exit within 90s")
            if temps_in(run / "checkpoints"):
                out.bump("kills that left a checkpoint temp file (inside a write)")
            elif unannounced_checkpoint(run):
                out.bump("kills that left a checkpoint the proxy had not seen announced")
            watch.check(out, f"after kill {kills}")
            no_traceback(p, out, f"killed proxy {kills}")
            lost_from = read_log(run / ".loss.json").max_step
            expected = expected_resume(run)
            p = env.start(run, *extra, engine=gate.engine_flag)
            procs.append(p)
        else:
            kill_engine(rec)
            time.sleep(0.01)
            on_disk = {c.name for c in list_checkpoints(run / "checkpoints")}
            if temps_in(run / "checkpoints"):
                out.bump("kills that left a checkpoint temp file (inside a write)")
            elif unannounced_checkpoint(run):
                out.bump("kills that left a checkpoint the proxy had not seen announced")
            watch.check(out, f"after kill {kills}")
    finish_last_launch(p, out)
    watch.check(out, "at the end")
    trained_on = json.loads((run / ".state.json").read_text()).get("engine", {}).get("ranks")
    if trained_on != ranks:
        out.fail(f".state.json says the last launch trained on {trained_on} rank(s), not {ranks}")
    out.note("proxy launches", len(procs))
    out.note("engine segments", seen)
    compare_with_reference(env, run, out)
    return out.close()


def make_partial_run(env: ProxyEnv, dest: Path, stop_at: int = 20) -> Path:
    """A run stopped halfway with SIGTERM to the proxy (the documented stop): the sidecar template.
    The engine is held at `stop_at` by a frame gate until the stop (whose STOP frame passes it)."""
    gate = Gate(dest.parent / "gate", ENGINE.path)
    gate.hold_after(stop_at)
    p = env.start(dest, engine=gate.engine_flag)
    if not LogTail(dest / ".loss.json").wait_step(stop_at, p):
        raise AssertionError(f"proxy exited early: {tail_lines(p.stderr)}")
    p.send_signal(signal.SIGTERM)
    rc = p.finish(TIMEOUT)
    state = json.loads((dest / ".state.json").read_text())
    if rc != 0 or state.get("status") != "stopped":
        raise AssertionError(f"SIGTERM to the proxy: exit {rc}, status {state.get('status')}: {tail_lines(p.stderr)}")
    return dest


def copy_run(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    for name in (".lock",):
        (dest / name).unlink(missing_ok=True)
    return dest


def _snapshot(run: Path) -> dict:
    return {p.name: p.read_bytes() for p in list_checkpoints(run / "checkpoints")}


def relaunch_and_compare(
    env: ProxyEnv, run: Path, out: Outcome, where: str, samples_after: int = 0, *extra, expect_resume: int | None = None
) -> Child | None:
    """Relaunch the same command on `run`; it must resume where documented, finish with exit 0, keep
    every byte `.loss.json` had (append-only), and equal the uninterrupted run."""
    before_log = (run / ".loss.json").read_bytes() if (run / ".loss.json").exists() else b""
    newest = max((checkpoint_step(p) for p in checkpoint_files(run / "checkpoints")), default=0)
    expected = expected_resume(run) if expect_resume is None else expect_resume
    old_segments = max((int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()), default=0)
    try:
        rc, p = env.run(run, *extra, timeout=300)
    except Hang as exc:
        out.fail(f"{where}: {exc}")
    no_traceback(p, out, where)
    if rc != 0:
        out.fail(f"{where}: relaunch exited {rc}: {tail_lines(p.stderr)}")
    resumed = first_resume(run, old_segments)
    if resumed != expected:
        out.fail(f"{where}: resumed from step {resumed}, expected step {expected}")
    else:
        out.steps_lost += max(0, newest - resumed)
    after = (run / ".loss.json").read_bytes()
    prefix = before_log if before_log.endswith(b"\n") or not before_log else before_log + b"\n"
    if not after.startswith(prefix):
        out.fail(f"{where}: .loss.json was rewritten, not appended to (earlier bytes changed)", data_lost=1)
    compare_with_reference(env, run, out, samples_after, where)
    return p


def _garbage_lines(rng: random.Random) -> list[bytes]:
    pool = [
        b"{",
        b"}",
        b"[1, 2, 3]",
        b'"a string"',
        b"null",
        b"42",
        b'{"type": "unknown", "step": 3}',
        b'{"type": "step"}',
        b'{"type": "step", "step": "seven", "loss": 1.0}',
        b"\x00" * 17,
        b"\xff\xfe\xfd not utf-8 \xc3\x28",
        b'{"type": "step", "step": 9, "lo',
        b"   ",
        b"\t",
        bytes(rng.randrange(1, 255) for _ in range(40)).replace(b"\n", b" "),
    ]
    return rng.sample(pool, 6)


def _mut_loss_torn(run: Path, rng) -> str:
    log = run / ".loss.json"
    raw = log.read_bytes()
    start = raw.rstrip(b"\n").rfind(b"\n") + 1
    cut = rng.randint(start + 1, len(raw) - 2)
    log.write_bytes(raw[:cut])
    return f"last line cut after {cut - start} of {len(raw) - start} bytes"


def _mut_loss_garbage(run: Path, rng) -> str:
    log = run / ".loss.json"
    lines = log.read_bytes().split(b"\n")[:-1]
    junk = _garbage_lines(rng)
    for g in junk:
        lines.insert(rng.randrange(0, len(lines) + 1), g)
    log.write_bytes(b"\n".join(lines) + b"\n")
    return f"{len(junk)} garbage lines inserted"


def _mut_delete(fname):
    def mutate(run: Path, rng) -> str:
        (run / fname).unlink()
        return f"{fname} deleted"

    return mutate


def _mut_bytes(fname):
    def mutate(run: Path, rng) -> str:
        (run / fname).write_bytes(bytes(rng.randrange(256) for _ in range(300)))
        return f"{fname} replaced by 300 random bytes"

    return mutate


def _mut_truncate(fname):
    def mutate(run: Path, rng) -> str:
        raw = (run / fname).read_bytes()
        (run / fname).write_bytes(raw[: rng.randint(1, max(1, len(raw) - 2))])
        return f"{fname} truncated"

    return mutate


def _mut_json(fname, obj):
    def mutate(run: Path, rng) -> str:
        (run / fname).write_text(json.dumps(obj))
        return f"{fname} = {json.dumps(obj)[:80]}"

    return mutate


# (case name, mutation, "resume" | "refuse")
LOSS_LOG_CASES = [("torn last line", _mut_loss_torn, "resume"), ("garbage lines", _mut_loss_garbage, "resume")]
SIDECAR_CASES = [
    (".state.json missing", _mut_delete(".state.json"), "resume"),
    (".state.json random bytes", _mut_bytes(".state.json"), "resume"),
    (
        ".state.json wrong types",
        _mut_json(
            ".state.json",
            {
                "arms": "x",
                "replay_mismatches": 7,
                "replay_mismatch_count": "many",
                "status": 5,
                "step": "x",
                "engine": [],
                "best": 3,
            },
        ),
        "resume",
    ),
    (".samples.json missing", _mut_delete(".samples.json"), "resume"),
    (".samples.json truncated", _mut_truncate(".samples.json"), "resume"),
    (".samples.json wrong types", _mut_json(".samples.json", [{"step": "x"}, 5, {"samples": 3}, None]), "resume"),
    ("phases.json missing", _mut_delete("phases.json"), "resume"),
    ("phases.json random bytes", _mut_bytes("phases.json"), "refuse"),
    ("phases.json wrong types", _mut_json("phases.json", [{"phase": 0, "start_step": "zero", "policy": 1}]), "refuse"),
]


def sidecar_cases(env: ProxyEnv, template: Path, workdir: Path, cases, name: str, fault_class: str) -> Outcome:
    """Damage one run-directory file of a stopped run, relaunch the same command.

    "resume" cases: the run resumes where documented, finishes, appends to .loss.json without
    changing a byte, and equals the uninterrupted run. "refuse" cases (an unreadable phases.json:
    the phase history cannot be guessed): one clear line, non-zero exit, no traceback, nothing in the
    run directory changed; restoring the file and relaunching loses nothing.
    """
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    newest = max(checkpoint_step(p) for p in list_checkpoints(template / "checkpoints"))
    for i, (case, mutate, expect) in enumerate(cases):
        run = copy_run(template, workdir / f"case{i}")
        what = mutate(run, rng)
        where = f"[{case}: {what}]"
        out.begin_fault()
        # audits in a deleted or damaged .samples.json are gone by the user's hand; compare the later ones
        samples_after = newest if case.startswith(".samples.json") else 0
        if expect == "resume":
            relaunch_and_compare(env, run, out, where, samples_after=samples_after)
            continue
        fname = case.split()[0]
        damaged = (run / fname).read_bytes()
        log, ckpts = (run / ".loss.json").read_bytes(), _snapshot(run)
        try:
            rc, p = env.run(run, timeout=TIMEOUT)
        except Hang as exc:
            out.fail(f"{where}: {exc}")
        lines = p.stderr_lines()
        no_traceback(p, out, where)
        if rc != 2 or len(lines) != 1 or fname not in lines[0]:  # docs/CLI.md: 2 is a bad run directory
            out.fail(f"{where}: expected exit 2 and one line naming {fname}; exit {rc}, stderr {lines}")
        out.note(f"{case}: message", lines[-1] if lines else None)
        if (run / fname).read_bytes() != damaged or (run / ".loss.json").read_bytes() != log or _snapshot(run) != ckpts:
            out.fail(f"{where}: the refused relaunch changed the run directory", data_lost=1)
        shutil.copy(template / fname, run / fname)
        relaunch_and_compare(env, run, out, f"{where} after restoring {fname}")
    return out.close()


def proxy_disk_full(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-disk-full",
    fault_class: str = "write error during a checkpoint (proxy run, EFBIG)",
) -> Outcome:
    """A stopped run relaunched under RLIMIT_FSIZE of half a checkpoint (inherited by the engine): the
    next checkpoint fails with EFBIG (engine exit 5). The proxy restarts it like any crash and stops as
    a crash loop (exit 3) with a last line naming the failed write; every checkpoint stays as it was,
    no partial file, .loss.json only appended to; relaunched without the limit it finishes equal to
    the uninterrupted run."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    ckpts = _snapshot(run)
    log = (run / ".loss.json").read_bytes()
    limit = len(next(iter(ckpts.values()))) // 2
    newest = max(checkpoint_step(workdir / n) for n in ckpts)
    out.begin_fault()
    try:
        rc, p = env.run(run, preexec_fn=fsize_limit(limit), timeout=TIMEOUT)
    except Hang as exc:
        out.fail(str(exc))
    lines = p.stderr_lines()
    no_traceback(p, out, "under RLIMIT_FSIZE")
    # docs/OPERATIONS.md: an engine exit is a crash; five without progress are a crash loop (exit 3)
    if rc != 3 or not lines or "crash loop" not in lines[-1] or "File too large" not in lines[-1]:
        out.fail(
            f"expected exit 3 and a last line about the crash loop naming the failed write "
            f"(File too large); exit {rc}, {lines[-3:]}"
        )
    out.note("exit code", rc)
    out.note("last line", lines[-1] if lines else None)
    out.note("RLIMIT_FSIZE (bytes)", limit)
    if _snapshot(run) != ckpts:
        out.fail("the checkpoints changed while every save failed", data_lost=1)
    if temps_in(run / "checkpoints"):
        out.fail(f"temp files left: {temps_in(run / 'checkpoints')}")
    if not (run / ".loss.json").read_bytes().startswith(log):
        out.fail(".loss.json was rewritten", data_lost=1)
    out.steps_lost += max(0, read_log(run / ".loss.json").max_step - newest)
    relaunch_and_compare(env, run, out, "relaunch without the limit")
    return out.close()


def proxy_corrupt_checkpoint(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-corrupt-checkpoint",
    fault_class: str = "corrupted newest checkpoint (proxy falls back)",
) -> Outcome:
    """The newest checkpoint of a stopped run (1) has a bit flipped in its weights: the proxy skips
    it, saying why, and resumes from the next older one; (2) is a valid checkpoint of another model
    shape: the engine rejects it (exit 3) and the proxy falls back to the next older one. Both runs
    finish equal to the uninterrupted run."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    newest = list_checkpoints(template / "checkpoints")[0]
    step = checkpoint_step(newest)
    # (1) a flipped bit
    run = copy_run(template, workdir / "flip")
    raw = (run / "checkpoints" / newest.name).read_bytes()
    begin, end = checkpoint_regions(raw)["weights"]
    (run / "checkpoints" / newest.name).write_bytes(flip_bit(raw, rng.randrange(begin * 8, end * 8)))
    out.begin_fault()
    p = relaunch_and_compare(env, run, out, "[bit flip in the newest checkpoint]")
    if p is not None and not any("not resuming from" in ln and "checksum mismatch" in ln for ln in p.stderr_lines()):
        out.fail(f"the proxy skipped the corrupt checkpoint without saying why: {p.stderr_lines()[-5:]}")
    # (2) another model's checkpoint under the newest name
    run = copy_run(template, workdir / "shape")
    other = Shape(vocab=300, ctx=16, dim=8, layers=1, heads=2, batch=4, steps=step, warmup=4, threads=1)
    shard = make_shard(workdir / "other.tok", other.vocab)
    rc, q = run_standalone(other, shard, workdir / "other", 0, resume=None)
    if rc != 0:
        out.fail(f"could not make the other-shape checkpoint: {tail_lines(q.stderr)}")
    shutil.copy(workdir / "other" / newest.name, run / "checkpoints" / newest.name)
    out.begin_fault()
    view = copy_run(template, workdir / "older-view")
    (view / "checkpoints" / newest.name).unlink()
    older = expected_resume(view)
    p = relaunch_and_compare(env, run, out, "[another model's checkpoint as the newest]", expect_resume=older)
    if p is not None:
        log = (run / "engine.log").read_text(errors="replace")
        if "shape mismatch" not in log:
            out.fail(
                f"the engine never got (and rejected) the other model's checkpoint: engine.log tail {tail_lines(log)}"
            )
        out.note("another model's checkpoint: stderr", tail_lines(p.stderr, 2))
    return out.close()


def proxy_hung_engine(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    n_hangs: int = 2,
    hang_timeout: float = 2.0,
    name: str = "proxy-hung-engine",
    fault_class: str = "hung engine (SIGSTOP)",
) -> Outcome:
    """SIGSTOP the engine at seeded moments under `--hang-timeout 2`: the proxy notices, kills its
    process group, restarts from the newest valid checkpoint; the run finishes equal to the
    uninterrupted one. A frame gate holds each launch at its first step until its target is set,
    then at the target, so the SIGSTOP finds the engine there however fast it is."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    run = copy_run(template, workdir / "run")
    tail = LogTail(run / ".loss.json")
    gate = Gate(workdir / "gate", ENGINE.path)
    gate.hold_after(0)
    p = env.start(run, "--hang-timeout", hang_timeout, engine=gate.engine_flag)
    seen = max((int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()), default=0)
    expected = expected_resume(run)
    detect = []
    stopped_at = None
    for i in range(n_hangs + 1):
        launch = gate.wait_launch(i, p.alive, TIMEOUT)
        if launch is None:
            out.fail(f"the proxy exited {p.wait()} instead of launching an engine: {tail_lines(p.stderr)}")
        target = None if i == n_hangs else min(env.max_steps - 2, launch.first_step - 1 + rng.randint(1, 6))
        if target is None:
            gate.open()
        else:
            gate.hold_after(target)
        got = tail.wait_new_segment(seen, p)
        if got is None:
            out.fail(f"the proxy exited {p.wait()} instead of restarting the hung engine: {tail_lines(p.stderr)}")
        seg, resume = got
        if i:
            detect.append(round(time.monotonic() - stopped_at, 2))
            expected = expected_resume(run, max_segment=seen)
            out.steps_lost += max(0, read_log(run / ".loss.json", max_segment=seen).max_step - resume)
        if resume != expected:
            out.fail(f"segment {seg} resumed from {resume}, expected {expected}")
        out.end_fault()
        seen = seg
        if target is None:
            break
        if not tail.wait_step(target, p, segment=seg):
            out.fail(f"the proxy exited early: {tail_lines(p.stderr)}")
        rec = engine_record(run)
        gate.hold_after(0)  # the restarted engine waits at its first step for its own target
        out.begin_fault()
        os.kill(rec[0], signal.SIGSTOP)
        stopped_at = time.monotonic()
    rc = p.finish(300)
    no_traceback(p, out, "hung engine run")
    if rc != 0:
        out.fail(f"exit {rc}: {tail_lines(p.stderr)}")
    hung_lines = [ln for ln in p.stderr_lines() if "sent nothing for" in ln]
    if len(hung_lines) < n_hangs:
        out.fail(f"expected {n_hangs} hang reports on stderr, got {hung_lines}")
    out.note("seconds from SIGSTOP to the restarted segment", detect)
    out.note("--hang-timeout", hang_timeout)
    compare_with_reference(env, run, out)
    return out.close()


CRASHING_ENGINES = {
    "segfaults at once": "#!/bin/sh\nulimit -c 0\necho 'engine: about to crash' >&2\nkill -SEGV $$\n",
    "prints junk and exits 1": "#!/bin/sh\necho 'this is not an event'\necho '{\"event\": 5}'\n"
    "echo 'engine exploded' >&2\nexit 1\n",
}


def proxy_crash_loop(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-crash-loop",
    fault_class: str = "crash loop (engine dies at every start)",
) -> Outcome:
    """An engine that dies at every start: the proxy gives up after --max-failures with exit 3 and a
    clear message, records status crashloop, changes no checkpoint and no logged step; relaunched
    with a working engine the run finishes equal to the uninterrupted one."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    for i, (case, script) in enumerate(CRASHING_ENGINES.items()):
        wrapper = workdir / f"engine{i}.sh"
        wrapper.write_text(script)
        wrapper.chmod(0o755)
        ckpts, log = _snapshot(run), (run / ".loss.json").read_bytes()
        out.begin_fault()
        try:
            rc, p = env.run(run, "--max-failures", 3, engine=str(wrapper), timeout=TIMEOUT)
        except Hang as exc:
            out.fail(f"[{case}] {exc}")
        lines = p.stderr_lines()
        no_traceback(p, out, case)
        if rc != 3 or not lines or "crash loop" not in lines[-1]:
            out.fail(f"[{case}] expected exit 3 with a last line about the crash loop; exit {rc}, {lines[-3:]}")
        out.note(f"{case}: last line", lines[-1] if lines else None)
        try:
            status = json.loads((run / ".state.json").read_text()).get("status")
        except (OSError, ValueError):
            status = None
        if status != "crashloop":
            out.fail(f"[{case}] .state.json status {status!r}, expected 'crashloop'")
        if _snapshot(run) != ckpts:
            out.fail(f"[{case}] checkpoints changed", data_lost=1)
        after = read_log(run / ".loss.json")
        if (
            not (run / ".loss.json").read_bytes().startswith(log)
            or after.max_step != read_log(template / ".loss.json").max_step
        ):
            out.fail(f"[{case}] .loss.json changed", data_lost=1)
    relaunch_and_compare(env, run, out, "relaunch with a working engine")
    return out.close()


def proxy_sigusr1_storm(
    env: ProxyEnv,
    workdir: Path,
    n_signals: int = 200,
    name: str = "proxy-sigusr1-storm",
    fault_class: str = "SIGUSR1 storm (proxy)",
) -> Outcome:
    """200 SIGUSR1 to the proxy while it trains (each asks for a checkpoint): training goes on, every
    checkpoint verifies, and the finished run equals the uninterrupted one. A frame gate paces the
    engine by the storm (one more step every few signals, up to `last`), so the storm and training
    interleave whatever the engine's speed, and the storm ends before the last steps (where the proxy
    restores the default handlers)."""
    out = Outcome(fault_class, name, one_storm=True)
    rng = rng_for(name)
    run = workdir / "run"
    tail = LogTail(run / ".loss.json")
    gate = Gate(workdir / "gate", ENGINE.path)
    last = env.max_steps - 7
    limit = 1
    gate.hold_after(limit)
    p = env.start(run, engine=gate.engine_flag)
    if not tail.wait_step(1, p):
        out.fail(f"the proxy exited early: {tail_lines(p.stderr)}")
    sent = 0
    while sent < n_signals and p.alive():
        paced = 1 + sent * (last - 1) // n_signals
        if paced != limit:
            limit = paced
            gate.hold_after(limit)
        p.send_signal(signal.SIGUSR1)
        sent += 1
        out.begin_fault()
        time.sleep(rng.uniform(0.0, 0.0008))
    gate.open()
    rc = p.finish(300)
    no_traceback(p, out, "storm")
    if rc != 0:
        out.fail(f"exit {rc}: {tail_lines(p.stderr)}")
    if sent < n_signals:
        out.fail(f"only {sent} signals went out while the proxy trained")
    CkptWatch(run / "checkpoints").check(out, "after the storm")
    out.note("SIGUSR1 sent", sent)
    out.note("checkpoint files", len(list_checkpoints(run / "checkpoints")))
    compare_with_reference(env, run, out)
    return out.close()


def proxy_keep_all(
    env: ProxyEnv,
    workdir: Path,
    name: str = "proxy-keep-last-0",
    fault_class: str = "checkpoint retention with keep_last 0 (keep all)",
) -> Outcome:
    """docs/EXPERIMENTS.md: `keep_last` 0 keeps all checkpoints. A run with it must still hold every
    periodic checkpoint at the end (a deleted one is a lost valid checkpoint)."""
    out = Outcome(fault_class, name)
    exp = write_fault_experiment(workdir / "exp", keep_last=0)
    run = workdir / "run"
    out.begin_fault()
    rc, p = env.run(run, experiment=exp)
    no_traceback(p, out, "keep_last 0 run")
    if rc != 0:
        out.fail(f"exit {rc}: {tail_lines(p.stderr)}")
    have = {p.name for p in list_checkpoints(run / "checkpoints")}
    want = {f"step_{s:06d}.bin" for s in range(env.ckpt_every, env.max_steps + 1, env.ckpt_every)}
    missing = sorted(want - have)
    if missing:
        out.fail(f"keep_last 0 deleted {len(missing)} periodic checkpoints: {missing}", data_lost=len(missing))
    compare_files(env.ref / "checkpoints", run / "checkpoints", out)
    return out.close()
