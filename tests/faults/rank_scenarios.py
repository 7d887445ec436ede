"""Data-parallel runs under faults: `proxy run --ranks 2` (the real mpirun, the real MPI CPU engine) while
one rank, then the other, then the launcher itself is killed with SIGKILL; a rank hangs (SIGSTOP); a rank dies
of a signal the engine does not catch (SIGSEGV, SIGABRT: it exits non-zero without a word); the launcher gets
SIGTERM (mpirun forwards it to the ranks and kills them some 2 s later). mpirun ends the whole job when a
rank dies, the proxy restarts it from the newest sane checkpoint, and the finished run equals an
uninterrupted 1-rank run of the same experiment (docs/OPERATIONS.md, "Data-parallel runs")."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil

from proxy.formats.checkpoint import list_checkpoints
from proxy.supervision.engine_process import engine_binary
from proxy.supervision.ranks import mpi_binary

from .proxy_harness import (
    LogTail,
    ProxyEnv,
    compare_with_reference,
    engine_record,
    expected_resume,
    finish_last_launch,
    write_fault_experiment,
)
from .scenarios import CkptWatch, Outcome, rng_for, tail_lines

RANKS = 2
# The fault experiment with two micro-batches per step (1 and 2 ranks divide them) and enough steps that
# every kill lands mid-run, however fast the steps go.
RANK_TRAIN = {"grad_accum": 2, "max_steps": 240, "eval_every": 80, "sample_every": 80}
# A model wider than the fault suite's (a 2-rank step of some 20 ms on an idle 2-core box, not 1 ms): a launch
# trains for seconds, so a kill aimed a few steps after a resume lands long before the launch ends.
RANK_MODEL = {"vocab": 300, "ctx": 64, "dim": 128, "layers": 2, "heads": 4}
# (role, signal), in order. A rank stopped with SIGSTOP hangs the job (rank 0 waits in a collective): the
# watchdog (--hang-timeout) kills the launcher, the proxy the rest of its session.
KILLS = (("rank 1", signal.SIGKILL), ("rank 0", signal.SIGKILL), ("launcher", signal.SIGKILL))
HANG = (("rank 1", signal.SIGSTOP),)
# A rank that crashes: the engine handles SIGTERM, SIGINT and SIGUSR1 only, so SIGSEGV and SIGABRT end the
# rank at once, as a fault of its own would (no checkpoint, no exit event; mpirun reports it and ends the job).
CRASHES = (("rank 1", signal.SIGSEGV), ("rank 0", signal.SIGABRT))
# SIGTERM to mpirun (a `kill` of the launcher, a scheduler ending it): it forwards the signal to every rank,
# whose handlers stop them at the next step boundary with one checkpoint, and SIGKILLs what is left ~2 s later.
LAUNCHER_TERMS = (("launcher", signal.SIGTERM), ("launcher", signal.SIGTERM))
HANG_TIMEOUT_S = 4
RANK_KILL_CLASS = "kill -9 of one rank, or of the launcher, of a 2-rank run"
RANK_HANG_CLASS = "a rank that hangs (SIGSTOP) in a 2-rank run"
RANK_CRASH_CLASS = "a rank that dies non-zero (SIGSEGV, SIGABRT) in a 2-rank run"
LAUNCHER_TERM_CLASS = "SIGTERM to the launcher (mpirun) of a 2-rank run"


def mpi_engine_problem() -> str | None:
    """Why the scenario cannot run here (no mpirun, no MPI engine), or None."""
    from shutil import which

    if which("mpirun") is None:
        return "mpirun not found (apt install openmpi-bin libopenmpi-dev)"
    if not mpi_binary(engine_binary("cpu")).is_file():
        return "build/microgpt_cpu_mpi not built (`make cpu` with mpicc)"
    return None


def prepare_rank_env(root: Path) -> ProxyEnv:
    """The experiment, its data, and its uninterrupted run on one rank: the reference."""
    root.mkdir(parents=True, exist_ok=True)
    exp = write_fault_experiment(root / "exp", **RANK_TRAIN)
    spec = json.loads(exp.read_text())
    spec["model"] = RANK_MODEL
    exp.write_text(json.dumps(spec, indent=1))
    env = ProxyEnv(root=root, experiment=exp, cache=root / "cache", ref=root / "reference-run")
    env.max_steps = RANK_TRAIN["max_steps"]
    rc, p = env.run(env.ref, "--ranks", "1", engine="cpu")
    if rc != 0:
        raise AssertionError(f"the 1-rank reference run exited {rc}: {tail_lines(p.stderr)}")
    return env


def _job(launcher_pid: int) -> dict[str, psutil.Process]:
    """The launcher and its ranks, by role ("launcher", "rank 0", "rank 1"); {} when the launcher is gone."""
    try:
        launcher = psutil.Process(launcher_pid)
        children = launcher.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found = {"launcher": launcher}
    for child in children:
        try:
            rank = child.environ().get("OMPI_COMM_WORLD_RANK")
        except psutil.Error:
            continue
        if rank is not None:
            found[f"rank {rank}"] = child
    return found


def check_resume(run: Path, seen: int, seg: int, resume: int, at_kill: set[str], out: Outcome, p) -> None:
    """Segment `seg` resumed from a checkpoint that verifies and whose steps the log of the segments before it
    covers, and from none older than the newest such among those on disk when the kill landed. (The dead job's
    rank 0 may still finish a write, or steps, after the kill: the proxy waits for the whole job before it
    chooses, so it may resume later than that, never earlier.)"""
    floor = expected_resume(run, max_segment=seen, among=at_kill)
    usable = resume == 0 or expected_resume(run, max_segment=seen, among={f"step_{resume:06d}.bin"}) == resume
    if resume < floor or not usable:
        out.fail(
            f"segment {seg} resumed from step {resume}: "
            + (
                f"older than step {floor}, valid and logged when the kill landed"
                if resume < floor
                else "not a valid checkpoint whose steps are all logged"
            )
            + f": {tail_lines(p.stderr)}"
        )
    if resume > floor:
        out.bump("resumes later than the newest checkpoint at the kill (the dead job's rank 0 wrote on)")


def count_lost(tail: LogTail, seen: int, resume: int, out: Outcome) -> None:
    """The steps the killed launch (segment `seen`) trained past the checkpoint the next one resumed from; a
    launch that wrote a checkpoint at its last step on the way out (the ranks' stop on a forwarded SIGTERM)
    lost none."""
    lost = max(0, tail.by_segment.get(seen, 0) - resume)
    out.steps_lost += lost
    if not lost:
        out.bump("launches that ended in a checkpoint at their last step (nothing to redo)")


def rank_kill_storm(
    env: ProxyEnv, workdir: Path, victims=KILLS, name: str = "rank-kill", fault_class: str = RANK_KILL_CLASS
) -> Outcome:
    """Each of `victims` (KILLS: SIGKILL rank 1, then rank 0, then mpirun; HANG: SIGSTOP rank 1; CRASHES;
    LAUNCHER_TERMS) a seeded number of steps into a launch. After each, every
    process of the job is gone, the next launch resumes as check_resume says, and the run finishes equal to
    the 1-rank reference (steps, evals, samples, checkpoint bytes)."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    run = workdir / "run"
    watch = CkptWatch(run / "checkpoints")
    tail = LogTail(run / ".loss.json")
    hang = ("--hang-timeout", str(HANG_TIMEOUT_S)) if victims == HANG else ()
    p = env.start(run, "--ranks", str(RANKS), "--max-failures", "50", *hang, engine="cpu")
    seen, at_kill = 0, set()
    for victim, sig in victims:
        got = tail.wait_new_segment(seen, p)
        if got is None:
            out.fail(f"the proxy exited {p.wait()} without training a new segment: {tail_lines(p.stderr)}")
        seg, resume = got
        if seen:
            check_resume(run, seen, seg, resume, at_kill, out, p)
            count_lost(tail, seen, resume, out)
        out.end_fault()
        seen = seg
        target = resume + rng.randint(3, 12)
        if not tail.wait_step(target, p, segment=seg):
            out.fail(f"the proxy exited {p.wait()} before step {target}: {tail_lines(p.stderr)}")
        rec = engine_record(run)
        if rec is None:
            out.fail(".engine.json names no engine while the run trains")
        job = _job(rec[0])
        if victim not in job:
            out.fail(f"no {victim} among the launcher's processes: {sorted(job)}")
        out.begin_fault()
        os.kill(job[victim].pid, sig)
        at_kill = {c.name for c in list_checkpoints(run / "checkpoints")}
        gone, alive = psutil.wait_procs(list(job.values()), timeout=60 + HANG_TIMEOUT_S * 3)
        if alive:
            out.fail(f"after the kill of {victim}, {len(alive)} process(es) of the job still run: {alive}")
        watch.check(out, f"after the kill of {victim}")
    got = tail.wait_new_segment(seen, p)
    if got is None:
        out.fail(f"the proxy exited {p.wait()} without a last launch: {tail_lines(p.stderr)}")
    check_resume(run, seen, got[0], got[1], at_kill, out, p)
    count_lost(tail, seen, got[1], out)
    out.end_fault()
    finish_last_launch(p, out)
    watch.check(out, "at the end")
    out.note("engine segments", got[0])
    compare_with_reference(env, run, out)
    return out.close()
