"""Fixtures of the data-parallel suite (tests/distributed/): the real MPI CPU engine under the real mpirun.

The MPI engine is build/microgpt_cpu_mpi (`make cpu` builds it when mpicc is found). The suite skips, with
the reason, only when mpirun itself is absent (`apt install openmpi-bin libopenmpi-dev`); with mpirun there and
no MPI engine it fails: CI must not go green without the binary it tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.shape import Shape
from proxy.supervision.engine_process import engine_binary
from proxy.supervision.ranks import default_launcher, mpi_binary

SINGLE = engine_binary("cpu")
MPI = mpi_binary(SINGLE)
# TINY with two micro-batches per step: 1 and 2 ranks both divide them.
TWO_MICRO = Shape(batch=2, grad_accum=2, steps=8, threads=1)

if shutil.which("mpirun") is None:
    pytest.skip("mpirun not found (apt install openmpi-bin libopenmpi-dev)", allow_module_level=True)


@pytest.fixture(scope="session")
def mpi_engine() -> Path:
    for binary in (SINGLE, MPI):
        if not binary.is_file():
            pytest.fail(f"{binary} not built (`make cpu` builds both when mpicc is found)", pytrace=False)
    return MPI


def under_mpirun(ranks: int, args: list[str]) -> list[str]:
    """argv of the MPI engine on `ranks` ranks through the proxy's own default launcher."""
    return [*default_launcher(ranks), str(MPI), *args]


# The proxy suite's helpers (real proxies, the engine under test): tests/proxy_e2e's, imported, not copied.
from proxy_e2e.conftest import (  # noqa: E402, F401
    Proxy,
    _reap_proxies,
    data_cache,
    engine,
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
