"""`proxy run --ranks N` with the real proxy, the real mpirun and the real MPI CPU engine: the same losses and
checkpoint bytes on 1 and 2 ranks; `proxy stop` of a 2-rank run ends in one checkpoint that resumes on 1 rank
to the uninterrupted run's bytes; a rank killed with SIGKILL ends in a restart and the same final bytes; bad
input is one line and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from proxy.supervision.ranks import MPI_INSTALL_HINT

from .conftest import (
    Proxy,
    last_steps,
    make_experiment,
    max_logged_step,
    one_line_error,
    proxy_env,
    run_args,
    run_cmd,
    state,
    wait_for,
)

MAX_STEPS = 96  # long enough that a stop or a kill after step 8 lands mid-run on a busy box
COMPARED = ("loss", "grad_norm", "lr", "tokens", "mixture")


def _experiment(directory: Path) -> Path:
    """TINY-TRAIN with two micro-batches per step (1 and 2 ranks divide them), a checkpoint every 16 steps."""
    return make_experiment(
        directory, "dp", batch=4, grad_accum=2, max_steps=MAX_STEPS, ckpt_every=16, eval_every=48, sample_every=48
    )


def _final(run_dir: Path) -> bytes:
    return (run_dir / "checkpoints" / f"step_{MAX_STEPS:06d}.bin").read_bytes()


def _logged(run_dir: Path) -> dict[int, tuple]:
    return {s: tuple(str(e.get(k)) for k in COMPARED) for s, e in last_steps(run_dir).items()}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, data_cache, engine) -> Path:
    """The uninterrupted 1-rank run every other run is compared with."""
    root = tmp_path_factory.mktemp("one-rank")
    run_dir = root / "run"
    done = run_cmd(run_args(_experiment(root), run_dir, "--ranks", "1"), data_cache)
    assert done.returncode == 0, done.stderr
    assert sorted(_logged(run_dir)) == list(range(1, MAX_STEPS + 1))
    return run_dir


def test_two_ranks_give_the_bits_of_one(one_rank, tmp_path, data_cache, mpi_engine):
    run_dir = tmp_path / "run"
    done = run_cmd(run_args(_experiment(tmp_path), run_dir, "--ranks", "2"), data_cache)
    assert done.returncode == 0, done.stderr
    assert "x 2 ranks" in done.stdout and "2 ranks through mpirun" in done.stdout
    assert any(" on 2 ranks) | ETA" in ln for ln in done.stdout.splitlines() if ln.startswith("step ")), done.stdout
    assert state(run_dir)["engine"]["ranks"] == 2
    assert _logged(run_dir) == _logged(one_rank)
    assert _final(run_dir) == _final(one_rank)


def test_proxy_stop_of_two_ranks_resumes_on_one(one_rank, tmp_path, data_cache, mpi_engine):
    run_dir = tmp_path / "run"
    proxy = Proxy(run_args(_experiment(tmp_path), run_dir, "--ranks", "2"), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 8, 120, "step 8", proxy)
    stop = run_cmd(["stop", "--run-dir", str(run_dir)], data_cache)
    assert stop.returncode == 0, stop.stderr
    assert proxy.wait() == 0, proxy.output()
    stopped_at = max_logged_step(run_dir)
    assert stopped_at < MAX_STEPS, "the run finished before the stop: nothing was tested"
    written = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*.bin"))
    # the periodic checkpoint(s) before the stop, and one for the stop at the last step trained
    assert written[-1] == f"step_{stopped_at:06d}.bin", written
    assert not list((run_dir / "checkpoints").glob(".*tmp*"))
    resumed = run_cmd(run_args(None, run_dir, "--ranks", "1"), data_cache)
    assert resumed.returncode == 0, resumed.stderr
    assert "rank count changed: the run trained on 2 rank(s) and resumes on 1" in resumed.stdout
    assert _logged(run_dir) == _logged(one_rank)
    assert _final(run_dir) == _final(one_rank)


def test_a_rank_killed_restarts_the_job(one_rank, tmp_path, data_cache, mpi_engine):
    """kill -9 of rank 1: mpirun ends the job, the proxy restarts it from the newest sane checkpoint."""
    run_dir = tmp_path / "run"
    proxy = Proxy(run_args(_experiment(tmp_path), run_dir, "--ranks", "2"), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 8, 120, "step 8", proxy)
    launcher = psutil.Process(state(run_dir)["engine"]["pid"])
    ranks = [p for p in launcher.children(recursive=True) if p.environ().get("OMPI_COMM_WORLD_RANK") == "1"]
    assert len(ranks) == 1, ranks
    os.kill(ranks[0].pid, signal.SIGKILL)
    assert proxy.wait() == 0, proxy.output()
    assert "launch 2:" in proxy.stdout(), proxy.output()
    assert _logged(run_dir) == _logged(one_rank)
    assert _final(run_dir) == _final(one_rank)


def _refused(tmp_path: Path, data_cache: Path, *extra: str, path: str | None = None) -> str:
    env = proxy_env(data_cache)
    if path is not None:
        env["PATH"] = path
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *run_args(_experiment(tmp_path), tmp_path / "run", *extra)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return one_line_error(done, 2)


def test_ranks_not_dividing_the_micro_batches(tmp_path, data_cache, mpi_engine):
    line = _refused(tmp_path, data_cache, "--ranks", "3")
    assert "--ranks 3 does not divide the step's 2 micro-batches" in line
    assert not (tmp_path / "run").exists()


def test_ranks_without_mpirun_says_what_to_install(tmp_path, data_cache, mpi_engine):
    line = _refused(tmp_path, data_cache, "--ranks", "2", path=str(tmp_path / "empty-path"))
    assert "`mpirun` is not on PATH" in line and MPI_INSTALL_HINT in line


def test_launcher_naming_a_missing_program(tmp_path, data_cache, mpi_engine):
    line = _refused(tmp_path, data_cache, "--ranks", "2", "--launcher", "no-such-launcher -n 2")
    assert line.endswith("--launcher: program 'no-such-launcher' not found on PATH")
