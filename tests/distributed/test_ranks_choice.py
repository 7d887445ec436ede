"""Which binary `proxy run --ranks N` launches for each engine (proxy/supervision/ranks.py): the CPU engine's
MPI build, the CUDA engine's NCCL build (build/microgpt_cuda_mpi), and for a custom engine path a refusal; a
missing build is one line saying how to make it. The binaries here are empty files in a scratch build
directory: nothing is launched (the GPU suite, tests/gpu/test_nccl.py, runs the real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.supervision.engine_process import EngineChoice
from proxy.supervision.ranks import BUILD_HINTS, NCCL_BUILD_HINT, RanksError, data_parallel, default_launcher


def _build(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_each_engine_runs_its_mpi_build(tmp_path, kind):
    build = _build(tmp_path, f"microgpt_{kind}", f"microgpt_{kind}_mpi")
    chosen = data_parallel(EngineChoice(build / f"microgpt_{kind}", kind), 2, None, 4)
    assert chosen.path == build / f"microgpt_{kind}_mpi"
    assert chosen.ranks == 2 and chosen.kind == kind
    assert list(chosen.launcher) == default_launcher(2)


def test_one_rank_runs_the_engine_itself(tmp_path):
    build = _build(tmp_path, "microgpt_cuda")
    engine = EngineChoice(build / "microgpt_cuda", "cuda")
    assert data_parallel(engine, 1, None, 4) == engine


def test_a_missing_nccl_build_says_how_to_make_it(tmp_path):
    build = _build(tmp_path, "microgpt_cuda")
    with pytest.raises(RanksError) as err:
        data_parallel(EngineChoice(build / "microgpt_cuda", "cuda"), 2, None, 4)
    line = str(err.value)
    assert "\n" not in line
    assert line == f"--ranks 2: {build / 'microgpt_cuda_mpi'} not built; {NCCL_BUILD_HINT}"
    assert "nvidia-nccl-cu13" in NCCL_BUILD_HINT and BUILD_HINTS["cuda"] == NCCL_BUILD_HINT


def test_a_custom_engine_trains_on_one_rank(tmp_path):
    build = _build(tmp_path, "my_engine", "my_engine_mpi")
    with pytest.raises(RanksError) as err:
        data_parallel(EngineChoice(build / "my_engine", "custom"), 2, None, 4)
    assert "the custom engine trains on one rank" in str(err.value)
