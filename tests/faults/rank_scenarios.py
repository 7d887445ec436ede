"""Data-parallel runs under faults: `proxy run --ranks 2` (the real mpirun, the real MPI CPU engine) while
one rank, then the other, then the launcher itself is killed with SIGKILL. mpirun ends the whole job when a
rank dies, the proxy restarts it from the newest sane checkpoint, and the finished run equals an
uninterrupted 1-rank run of the same experiment (docs/OPERATIONS.md, "Data-parallel runs")."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from harness.engine import Hang
from proxy.supervision.engine_process import engine_binary
from proxy.supervision.ranks import mpi_binary

from .proxy_harness import (
    LogTail,
    ProxyEnv,
    compare_with_reference,
    engine_record,
    expected_resume,
    no_traceback,
    write_fault_experiment,
)
from .scenarios import CkptWatch, Outcome, rng_for, tail_lines

RANKS = 2
# The fault experiment with two micro-batches per step (1 and 2 ranks divide them) and enough steps that
# every kill lands mid-run, however fast the steps go.
RANK_TRAIN = {"grad_accum": 2, "max_steps": 240, "eval_every": 80, "sample_every": 80}
VICTIMS = ("rank 1", "rank 0", "launcher")
RANK_KILL_CLASS = "kill -9 of one rank, or of the launcher, of a 2-rank run"


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
    env = ProxyEnv(root=root, experiment=exp, cache=root / "cache", ref=root / "reference-run")
    env.max_steps = RANK_TRAIN["max_steps"]
    rc, p = env.run(env.ref, "--ranks", "1", engine="cpu")
    if rc != 0:
        raise AssertionError(f"the 1-rank reference run exited {rc}: {tail_lines(p.stderr)}")
    return env


def _job(launcher_pid: int) -> dict[str, psutil.Process]:
    """The launcher and its ranks, by role ("launcher", "rank 0", "rank 1")."""
    launcher = psutil.Process(launcher_pid)
    found = {"launcher": launcher}
    for child in launcher.children(recursive=True):
        try:
            rank = child.environ().get("OMPI_COMM_WORLD_RANK")
        except psutil.Error:
            continue
        if rank is not None:
            found[f"rank {rank}"] = child
    return found


def rank_kill_storm(env: ProxyEnv, workdir: Path) -> Outcome:
    """SIGKILL rank 1, then rank 0, then mpirun, each a seeded number of steps into a launch. After each, every
    process of the job is gone, the next launch resumes from the newest valid checkpoint the log covers, and
    the run finishes equal to the 1-rank reference (steps, evals, samples, checkpoint bytes)."""
    name = "rank-kill"
    out = Outcome(RANK_KILL_CLASS, name)
    rng = rng_for(name)
    run = workdir / "run"
    watch = CkptWatch(run / "checkpoints")
    tail = LogTail(run / ".loss.json")
    p = env.start(run, "--ranks", str(RANKS), "--max-failures", "50", engine="cpu")
    seen, expected = 0, 0
    for victim in VICTIMS:
        got = tail.wait_new_segment(seen, p)
        if got is None:
            out.fail(f"the proxy exited {p.wait()} without training a new segment: {tail_lines(p.stderr)}")
        seg, resume = got
        if seen and resume != expected:
            out.fail(f"segment {seg} resumed from step {resume}; the newest valid checkpoint is step {expected}")
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
        os.kill(job[victim].pid, signal.SIGKILL)
        gone, alive = psutil.wait_procs(list(job.values()), timeout=60)
        if alive:
            out.fail(f"after the kill of {victim}, {len(alive)} process(es) of the job still run: {alive}")
        watch.check(out, f"after the kill of {victim}")
        expected = expected_resume(run, max_segment=seg)
    got = tail.wait_new_segment(seen, p)
    if got is None or got[1] != expected:
        out.fail(f"the last launch resumed from {got and got[1]}, expected step {expected}")
    out.end_fault()
    try:
        rc = p.finish(300)
    except Hang as exc:
        out.fail(str(exc))
    if rc != 0:
        out.fail(f"the last launch exited {rc}: {tail_lines(p.stderr)}")
    no_traceback(p, out, "last launch")
    watch.check(out, "at the end")
    out.note("engine segments", got[0])
    compare_with_reference(env, run, out)
    return out.close()
