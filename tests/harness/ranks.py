"""The rank count the pivot, fork and kill-storm suites train the runs they test on: 1, unless
MICROGPT_TEST_RANKS says more.

    MICROGPT_TEST_RANKS=1   every run on one process (the default)
    MICROGPT_TEST_RANKS=2   the runs under test on 2 ranks of the MPI CPU engine under the real mpirun
                            (`proxy run --ranks 2`), each compared bit for bit with its reference, which
                            trains on 1 rank (a run's bits do not depend on the rank count on the CPU engine:
                            docs/ENGINE.md, "Data-parallel reduction")

The experiments of those suites take `grad_accum` = the rank count (each rank trains one micro-batch of a
step; 1 rank trains the same experiment with the same bits). A few tests run on 2 ranks whatever the variable
says (`with_two_ranks`), so that `make test` covers 2 ranks. The launcher, the MPI binary and the refusals are
the proxy's own (proxy/supervision/ranks.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proxy.supervision.engine_process import engine_binary
from proxy.supervision.ranks import MPI_INSTALL_HINT, MPIRUN, default_launcher, mpi_binary

ENV = "MICROGPT_TEST_RANKS"


def ranks_under_test(environ=os.environ) -> int:
    """MICROGPT_TEST_RANKS as a rank count (1 when unset); ValueError with one line when it is not one."""
    text = environ.get(ENV, "").strip() or "1"
    try:
        ranks = int(text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: expected a rank count (1, 2, ...)") from None
    if ranks < 1:
        raise ValueError(f"{ENV}={ranks}: at least 1")
    return ranks


def with_two_ranks(environ=os.environ) -> list[int]:
    """The rank counts of a suite's representative test: the one under test, and 2."""
    return sorted({ranks_under_test(environ), 2})


def ranks_problem(ranks: int, engine_kind: str) -> str | None:
    """Why `ranks` ranks cannot run here (one line), or None: 1 rank always can."""
    if ranks == 1:
        return None
    if engine_kind != "cpu":
        return f"{ENV}={ranks}: data-parallel runs train the MPI CPU engine; the engine under test is {engine_kind}"
    if shutil.which(MPIRUN) is None:
        return f"{ENV}={ranks}: `{MPIRUN}` is not on PATH: {MPI_INSTALL_HINT}"
    if not mpi_binary(engine_binary("cpu")).is_file():
        return f"{ENV}={ranks}: {mpi_binary(engine_binary('cpu'))} not built (`make cpu` builds it with mpicc)"
    return None


def mpirun_path() -> Path:
    """The mpirun a gate execs in front of the ranks (ranks_problem says when there is none)."""
    found = shutil.which(MPIRUN)
    if found is None:
        raise FileNotFoundError(f"`{MPIRUN}` is not on PATH: {MPI_INSTALL_HINT}")
    return Path(found)


def rank_flags(ranks: int) -> list[str]:
    """The `proxy run` flags of a launch on `ranks` ranks through the proxy's default launcher (none for 1)."""
    return [] if ranks == 1 else ["--ranks", str(ranks)]


def launcher_words(ranks: int) -> list[str]:
    """The proxy's default launcher's words after the program (`--oversubscribe -np N`, ...)."""
    return default_launcher(ranks)[1:]


def require_ranks(ranks: int, engine_kind: str) -> None:
    """A test on `ranks` ranks fails when they cannot run here, with the reason. It skips only where the ranks
    are a representative test's own (not asked for by MICROGPT_TEST_RANKS) and mpirun is absent (as
    tests/distributed skips) or the engine under test is not the CPU one (`make test-gpu`); with mpirun there
    and no MPI engine it fails: CI must not go green without the binary it tests."""
    problem = ranks_problem(ranks, engine_kind)
    if problem is None:
        return
    if ranks != ranks_under_test() and (engine_kind != "cpu" or shutil.which(MPIRUN) is None):
        pytest.skip(problem)
    pytest.fail(problem, pytrace=False)
