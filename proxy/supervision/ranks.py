"""Data-parallel launches: the rank count, the MPI engine binary, and the launcher command in front of it.

Written once here and imported by the proxy (`proxy run --ranks N --launcher CMD`), the tests and the
benchmark. The engine's side is microgpt/comm.h; docs/ARCHITECTURE.md, "Data-parallel runs".
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..errors import EXIT_USAGE, ProxyError
from .engine_process import EngineChoice, visible_gpu_count

MPIRUN = "mpirun"
# What to install when a launch needs mpirun and there is none (Debian/Ubuntu).
MPI_INSTALL_HINT = "apt install openmpi-bin libopenmpi-dev, then `make cpu` to build build/microgpt_cpu_mpi"
# How the data-parallel CUDA engine is built (microgpt/cuda.mk; docs/CUDA.md, "The NCCL build").
NCCL_BUILD_HINT = (
    "apt install openmpi-bin libopenmpi-dev and pip install nvidia-nccl-cu13 (cu12 for CUDA 12), then `make cuda` "
    "to build build/microgpt_cuda_mpi"
)
# The engines with a data-parallel build: each one's hint for building it.
BUILD_HINTS = {"cpu": MPI_INSTALL_HINT, "cuda": NCCL_BUILD_HINT}


class RanksError(ProxyError):
    """A data-parallel launch that cannot start; the message is one line."""

    code = EXIT_USAGE


def mpi_binary(engine: Path) -> Path:
    """The MPI build of an engine binary: build/microgpt_cpu -> build/microgpt_cpu_mpi (and microgpt_cuda ->
    microgpt_cuda_mpi, its NCCL build)."""
    return engine.with_name(engine.name + "_mpi")


def default_launcher(ranks: int) -> list[str]:
    """`mpirun -np N` on this machine. --oversubscribe: more ranks than cores is allowed (a 2-core CI box);
    --allow-run-as-root: Open MPI refuses root otherwise (containers). mpirun's default binding gives each
    rank its own core(s), and the CPU engine uses the cores it is bound to."""
    argv = [MPIRUN, "--oversubscribe", "-np", str(ranks)]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    return argv


def check_divides(ranks: int, grad_accum: int) -> None:
    """Each rank trains an equal, contiguous share of the step's micro-batches."""
    if ranks < 1:
        raise RanksError(f"--ranks {ranks}: at least 1")
    if grad_accum % ranks:
        raise RanksError(
            f"--ranks {ranks} does not divide the step's {grad_accum} micro-batches (train.grad_accum): "
            "each rank trains an equal share; choose a divisor of grad_accum"
        )


def launcher_argv(ranks: int, launcher: str | None) -> list[str]:
    """The command in front of the engine's: `--launcher CMD` split as a shell would, or mpirun -np N. Its
    program must be found (one line saying what to install, otherwise)."""
    if launcher is not None:
        argv = shlex.split(launcher)
        if not argv:
            raise RanksError("--launcher is empty")
        if shutil.which(argv[0]) is None:
            raise RanksError(f"--launcher: program {argv[0]!r} not found on PATH")
        return argv
    if shutil.which(MPIRUN) is None:
        raise RanksError(f"--ranks {ranks} needs an MPI launcher and `{MPIRUN}` is not on PATH: {MPI_INSTALL_HINT}")
    return default_launcher(ranks)


def data_parallel(engine: EngineChoice, ranks: int, launcher: str | None, grad_accum: int) -> EngineChoice:
    """The engine chosen, launched on `ranks` ranks: unchanged for 1 rank and no --launcher; otherwise its MPI
    build (the CPU engine's, or the CUDA engine's with NCCL) behind the launcher. The CUDA engine runs one rank
    per GPU, as many as asked. Every refusal is one line (RanksError, exit 2)."""
    if ranks == 1 and launcher is None:
        return engine
    check_divides(ranks, grad_accum)
    hint = BUILD_HINTS.get(engine.kind)
    if hint is None:
        raise RanksError(
            f"--ranks {ranks}: data-parallel training runs the MPI build of the cpu or cuda engine (--engine cpu "
            f"or cuda); the {engine.kind} engine trains on one rank"
        )
    argv = launcher_argv(ranks, launcher)
    binary = mpi_binary(engine.path)
    if not binary.is_file():
        raise RanksError(f"--ranks {ranks}: {binary} not built; {hint}")
    return replace(engine, path=binary, ranks=ranks, launcher=tuple(argv))


def say_unused_gpus(
    engine: EngineChoice, grad_accum: int, say: Callable[[str], object], gpus: int | None = None
) -> None:
    """--ranks not given: the engine trains alone. The CUDA engine with several visible GPUs says in one line
    which --ranks would train on them (the most GPUs whose count divides grad_accum), or why none can. It is not
    chosen for the user: the NCCL build has not run on a GPU yet (docs/CUDA.md, "The NCCL build"), and a path
    that never ran on a GPU is no one's default. `gpus`: the visible GPUs (counted when None)."""
    if engine.kind != "cuda":
        return
    if gpus is None:
        gpus = visible_gpu_count()
    if gpus <= 1:
        return
    n = max(d for d in range(1, gpus + 1) if grad_accum % d == 0)
    binary = mpi_binary(engine.path)
    why_not = (
        f"train.grad_accum {grad_accum} has no divisor from 2 to {gpus}"
        if n == 1
        else f"{binary} is not built ({NCCL_BUILD_HINT})"
        if not binary.is_file()
        else f"`{MPIRUN}` is not on PATH ({MPI_INSTALL_HINT})"
        if shutil.which(MPIRUN) is None
        else None
    )
    if why_not is not None:
        say(f"{gpus} GPUs visible, training on one: data-parallel needs more ({why_not})")
    else:
        say(f"{gpus} GPUs visible, training on one: --ranks {n} trains on {n}, one GPU each")


def recorded_ranks(state: dict | None) -> int | None:
    """The rank count `.state.json` says the run's last launch had: 1 where it names none (a run from before
    data-parallel training), None where the value is not a positive whole number (the file is never trusted)."""
    engine = (state or {}).get("engine", {})
    ranks = engine.get("ranks", 1) if isinstance(engine, dict) else None
    return ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1 else None


def say_rank_change(state: dict | None, ranks: int, trained_to: int, say: Callable[[str], object]) -> None:
    """A run resumed on another rank count than its last launch: allowed (a checkpoint does not depend on it,
    and the losses do not either on the CPU engine), and said; nothing is said when the record is unusable."""
    before = recorded_ranks(state)
    if trained_to > 0 and before is not None and before != ranks:
        say(
            f"rank count changed: the run trained on {before} rank(s) and resumes on {ranks} "
            "(checkpoints and, on the CPU engine, losses do not depend on it)"
        )
