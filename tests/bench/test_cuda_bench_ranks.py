"""`scripts/bench_cuda.py --ranks N` (scripts/bench_cuda_ranks.py) without a GPU: the scaling arithmetic, the
arguments, the missing data-parallel build, and a real measurement through the real mpirun of the MPI CPU
engine, which speaks the same protocol (`bench_engine` drives any engine binary; the CUDA one needs a GPU).
The figures of that CPU run are not the GPU's and are not reported anywhere: the test checks what is measured
and how the efficiency is formed from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import bench_cuda  # noqa: E402
import bench_cuda_ranks as dp  # noqa: E402
from cuda_bench_report import Side  # noqa: E402

from proxy.supervision.ranks import default_launcher  # noqa: E402

CPU_ENGINE = REPO / "build" / "microgpt_cpu"
TINY = dict(dim=32, layers=2, heads=4, vocab=64, ctx=16)


def test_efficiency_is_tokens_per_second_at_n_over_n_times_one():
    assert dp.scaling_efficiency(1000.0, 3600.0, 4) == pytest.approx(0.9)
    assert dp.scaling_efficiency(1000.0, 2000.0, 2) == 1.0
    assert dp.scaling_efficiency(None, 2000.0, 2) is None and dp.scaling_efficiency(1000.0, None, 2) is None


def test_each_side_runs_the_mpi_build_behind_its_launcher():
    calls = []

    def fake(argv: list[str], binary: Path, accum: int, name: str) -> Side:
        calls.append((argv, binary, accum, name))
        return Side("engine", name, tokens_per_s=100.0 if len(calls) == 1 else 150.0)

    one, two = dp.bench_scaling(fake, Path("build/microgpt_cuda"), 2, "naive")
    assert calls == [
        (default_launcher(1), Path("build/microgpt_cuda_mpi"), 2, "naive, 1 rank"),
        (default_launcher(2), Path("build/microgpt_cuda_mpi"), 2, "naive, 2 ranks"),
    ]
    assert one.extra == {"ranks": 1} and two.extra == {"ranks": 2, "scaling_efficiency": 0.75}
    assert dp.describe(one) is None
    assert dp.describe(two) == (
        "    scaling efficiency on 2 ranks: 75.0% (tokens/s over 2x one rank's, same global batch)"
    )


def test_arguments():
    assert bench_cuda.parse_args(["--ranks", "8"]).ranks == 8
    assert bench_cuda.parse_args([]).ranks is None
    with pytest.raises(SystemExit):
        bench_cuda.parse_args(["--ranks", "1"])


def test_a_missing_data_parallel_build_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "microgpt_cuda").write_bytes(b"")  # the single-GPU engine alone
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_cuda.py"), "--engine", str(tmp_path / "microgpt_cuda")]
        + ["--ranks", "2", "--no-torch"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"bench_cuda: {tmp_path / 'microgpt_cuda_mpi'} not found: build it with `make cuda` (or pass --no-engine)"
    )


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found (apt install openmpi-bin)")
def test_a_real_measurement_on_the_mpi_cpu_engine():
    if not (CPU_ENGINE.with_name("microgpt_cpu_mpi")).is_file():
        pytest.fail("build/microgpt_cpu_mpi is missing: `make cpu` builds it where mpicc is found", pytrace=False)

    def bench(argv: list[str], binary: Path, accum: int, name: str) -> Side:
        return bench_cuda.bench_engine(binary, TINY, 2, 4, 1, 0, "fp32", "naive", "verified", argv, accum, name)

    one, two = dp.bench_scaling(bench, CPU_ENGINE, 2, "naive")
    assert not one.skipped and not two.skipped, (one.skipped, two.skipped)
    assert one.tokens_per_s and two.tokens_per_s and one.step_ms and two.step_ms
    # A step is 2 micro-batches of 2 rows of 16 tokens on both sides: 64 tokens.
    assert one.tokens_per_s == pytest.approx(64 / (one.step_ms / 1e3))
    assert two.tokens_per_s == pytest.approx(64 / (two.step_ms / 1e3))
    assert two.extra["scaling_efficiency"] == pytest.approx(two.tokens_per_s / (2 * one.tokens_per_s))
    assert two.variant == "naive, 2 ranks" and one.variant == "naive, 1 rank"
