"""The CPU engine on 1, 2 and 4 MPI ranks gives the bits of one process (docs/ENGINE.md, "Data-parallel
reduction"): step losses, gradient norms and checkpoint bytes. Real mpirun, real engine, no mocks.

Standalone (the engine reads the shard on rank 0) and proxy mode (frames on mpirun's stdin, which it forwards
to rank 0); a rank count that does not divide the micro-batches is one line and a non-zero exit; a signal that
reaches one rank only is agreed on by all at the next step boundary and ends in one checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from harness.data import make_shard, train_frames
from harness.engine import Engine, parse_events
from harness.shape import proxy_args, standalone_args
from proxy.formats import frames

from .conftest import SINGLE, TWO_MICRO, under_mpirun

TIMEOUT = 120


def _standalone(argv: list[str], cwd: Path) -> tuple[list, subprocess.CompletedProcess]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return parse_events(done.stdout), done


def _steps(events) -> list[tuple[int, float, float]]:
    return [(e["step"], e["loss"], e["grad_norm"]) for e in events if e.kind == "step"]


@pytest.mark.parametrize("ranks", [2, 4])
def test_standalone_ranks_match_one_process(mpi_engine, tmp_path, ranks):
    shape = TWO_MICRO.but(grad_accum=4) if ranks == 4 else TWO_MICRO
    shard = make_shard(tmp_path / "shard.bin", shape.vocab)
    runs = {}
    for name, argv in (
        ("single", [str(SINGLE), *standalone_args(shape, shard, tmp_path / "single", 4)]),
        ("mpi1", under_mpirun(1, standalone_args(shape, shard, tmp_path / "mpi1", 4))),
        (f"mpi{ranks}", under_mpirun(ranks, standalone_args(shape, shard, tmp_path / f"mpi{ranks}", 4))),
    ):
        events, done = _standalone(argv, tmp_path)
        assert done.returncode == 0, (name, done.stderr.decode())
        runs[name] = events
    ready = [e for e in runs[f"mpi{ranks}"] if e.kind == "ready"]
    assert len(ready) == 1 and ready[0]["ranks"] == ranks  # events come from rank 0 only
    reference = _steps(runs["single"])
    assert [s for s, _, _ in reference] == list(range(1, shape.steps + 1))
    for name in runs:
        assert _steps(runs[name]) == reference, name
    for step in (4, 8):
        files = [(tmp_path / name / f"step_{step:06d}.bin").read_bytes() for name in runs]
        assert all(f == files[0] for f in files), f"checkpoint of step {step} differs between rank counts"


def test_ranks_not_dividing_the_micro_batches_is_one_line(mpi_engine, tmp_path):
    shard = make_shard(tmp_path / "shard.bin", TWO_MICRO.vocab)
    events, done = _standalone(under_mpirun(3, standalone_args(TWO_MICRO, shard, tmp_path / "ck", 4)), tmp_path)
    assert done.returncode != 0
    ours = [line for line in done.stderr.decode().splitlines() if line.startswith("microgpt: error:")]
    assert ours == [
        "microgpt: error: 3 ranks do not divide the step's 2 micro-batches (--grad-accum): each rank trains an "
        "equal share"
    ]
    assert [e.kind for e in events] == ["error"]
    assert not list((tmp_path / "ck").glob("step_*"))


def _rank_pids(launcher: psutil.Process) -> dict[int, int]:
    """rank -> pid of the engines mpirun started (its children with OMPI_COMM_WORLD_RANK set)."""
    found: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in launcher.children(recursive=True):
            try:
                rank = child.environ().get("OMPI_COMM_WORLD_RANK")
            except psutil.Error:
                continue
            if rank is not None and child.name().startswith("microgpt"):
                found[int(rank)] = child.pid
        if len(found) == 2:
            return found
        time.sleep(0.05)
    raise AssertionError(f"mpirun's ranks not found: {found}")


def _proxy_mode(tmp_path: Path, name: str, argv0: list[str], act=None) -> Engine:
    """Frames for steps 1..8 on stdin (after step 3 `act(engine)` runs), then STOP; the finished engine."""
    binary, *rest = argv0
    eng = Engine(Path(binary), [*rest, *proxy_args(TWO_MICRO, tmp_path / name)], tmp_path, timeout=TIMEOUT)
    eng.wait_for("ready")
    steps = train_frames(TWO_MICRO, 1, 8)
    for s, tokens, groups in steps[:3]:
        eng.train(s, tokens, groups)
    eng.wait_for("step", step=3)
    if act is not None:
        act(eng)
    for s, tokens, groups in steps[3:]:
        eng.train(s, tokens, groups)
    eng.send(frames.stop_frame())
    assert eng.finish(TIMEOUT) == 0, eng.stderr
    return eng


def test_frames_on_two_ranks_match_one_process(mpi_engine, tmp_path):
    one = _proxy_mode(tmp_path, "one", [str(SINGLE)])
    two = _proxy_mode(tmp_path, "two", under_mpirun(2, []))
    assert two.losses() == one.losses() and len(one.losses()) == 8
    assert [e["grad_norm"] for e in two.of("step")] == [e["grad_norm"] for e in one.of("step")]
    assert [(e["step"], e["reason"]) for e in two.of("ckpt")] == [(8, "stop")]
    assert (tmp_path / "two" / "step_000008.bin").read_bytes() == (tmp_path / "one" / "step_000008.bin").read_bytes()


@pytest.mark.parametrize(
    "sig,targets",
    [(signal.SIGUSR1, (1,)), (signal.SIGUSR1, (0, 1)), (signal.SIGTERM, (1,))],
    ids=["usr1", "usr1-all", "term"],
)
def test_a_signal_to_one_rank_is_agreed_at_the_next_step(mpi_engine, tmp_path, sig, targets):
    """The signal reaches rank 1 only (a preemption notice may reach any rank), or every rank (as mpirun
    forwards SIGUSR1), between two steps: after the next step rank 0 checkpoints (SIGUSR1, training goes on)
    or checkpoints and exits 0 (SIGTERM); exactly one checkpoint."""

    def signal_rank_1(eng: Engine) -> None:
        pids = _rank_pids(psutil.Process(eng.proc.pid))
        for rank in targets:
            os.kill(pids[rank], sig)
        time.sleep(0.5)  # landed before step 4's frame arrives

    one = _proxy_mode(tmp_path, "one", [str(SINGLE)])
    if sig == signal.SIGUSR1:
        two = _proxy_mode(tmp_path, "two", under_mpirun(2, []), signal_rank_1)
        assert [(e["step"], e["reason"]) for e in two.of("ckpt")] == [(4, "sigusr1"), (8, "stop")]
        assert two.losses() == one.losses()
        assert (tmp_path / "two" / "step_000008.bin").read_bytes() == (
            tmp_path / "one" / "step_000008.bin"
        ).read_bytes()
        return
    binary, *rest = under_mpirun(2, [])
    eng = Engine(Path(binary), [*rest, *proxy_args(TWO_MICRO, tmp_path / "two")], tmp_path, timeout=TIMEOUT)
    eng.wait_for("ready")
    steps = train_frames(TWO_MICRO, 1, 8)
    for s, tokens, groups in steps[:3]:
        eng.train(s, tokens, groups)
    eng.wait_for("step", step=3)
    signal_rank_1(eng)
    eng.train(*steps[3])
    assert eng.finish(TIMEOUT) == 0, eng.stderr
    assert [(e["step"], e["reason"]) for e in eng.of("ckpt")] == [(4, "signal")]
    assert [e["reason"] for e in eng.of("exit")] == ["signal"]
    assert eng.losses() == {s: one.losses()[s] for s in range(1, 5)}


@pytest.mark.parametrize("ranks", [1, 2])
def test_two_sigusr1_before_one_step_boundary_are_one_checkpoint(mpi_engine, tmp_path, ranks):
    """Two SIGUSR1 to every process within one step's window (after step 3, before step 4's frame): one
    checkpoint on a single process as on 2 ranks. The flag is one bit on both: a request for the state on
    disk, which one checkpoint of it serves. One process is idle and checkpoints step 3 at the first signal
    (the second finds step 3 saved); the ranks agree after the next step and rank 0 checkpoints step 4.
    Training goes on to the bits of an unsignalled run."""

    def signal_twice(eng: Engine) -> None:
        pids = [eng.proc.pid] if ranks == 1 else list(_rank_pids(psutil.Process(eng.proc.pid)).values())
        for _ in range(2):
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            time.sleep(0.2)
        time.sleep(0.3)  # both landed before step 4's frame arrives

    quiet = _proxy_mode(tmp_path, "quiet", [str(SINGLE)])
    argv = [str(SINGLE)] if ranks == 1 else under_mpirun(2, [])
    signalled = _proxy_mode(tmp_path, "signalled", argv, signal_twice)
    checkpointed = 3 if ranks == 1 else 4
    assert [(e["step"], e["reason"]) for e in signalled.of("ckpt")] == [(checkpointed, "sigusr1"), (8, "stop")]
    assert signalled.losses() == quiet.losses()
    final = "step_000008.bin"
    assert (tmp_path / "signalled" / final).read_bytes() == (tmp_path / "quiet" / final).read_bytes()


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_info_flags_under_mpirun_exit_zero(mpi_engine, tmp_path, flag):
    # Answered before the rank joins the job: a rank that joined and left without MPI_Finalize fails the launch.
    done = subprocess.run(
        under_mpirun(2, [flag]), cwd=tmp_path, capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    first = "microgpt engine " if flag == "--version" else "usage: "
    assert done.stdout.decode().splitlines()[0].startswith(first)
