"""`scripts/bench_cuda.py --ranks N`: the data-parallel CUDA engine (build/microgpt_cuda_mpi, gradients summed
over NCCL) on N GPUs against itself on one, with the same global batch.

A step is N micro-batches of --batch rows (--grad-accum N): one rank trains all N of them one after another, N
ranks one each. Both run the same binary under the same launcher (`mpirun -np 1` and `mpirun -np N`), so the
figure isolates the scaling: tokens/s at N over N times tokens/s at 1, measured in the same run (1.0 is
perfect). Nothing here has been measured yet: no machine with several GPUs has run it (docs/CUDA.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cuda_bench_report import Side

from proxy.supervision.ranks import default_launcher, mpi_binary


def ranks_variant(variant: str, ranks: int) -> str:
    """The side's name in the report: `naive, 8 ranks`."""
    return f"{variant}, {ranks} rank{'s' if ranks > 1 else ''}"


def launch(engine: Path, ranks: int) -> tuple[list[str], Path]:
    """(launcher words, binary) of the data-parallel build of `engine` on `ranks` ranks."""
    return default_launcher(ranks), mpi_binary(engine)


def scaling_efficiency(one: float | None, many: float | None, ranks: int) -> float | None:
    """tokens/s at `ranks` ranks over `ranks` times tokens/s at one; None where either was not measured."""
    if not one or not many or ranks < 1:
        return None
    return many / (ranks * one)


# bench(launcher, binary, grad_accum, variant): one Side (bench_cuda.bench_engine with these bound).
Bench = Callable[[list[str], Path, int, str], Side]


def bench_scaling(bench: Bench, engine: Path, ranks: int, variant: str) -> list[Side]:
    """The variant on 1 rank, then on `ranks` ranks, both stepping `ranks` micro-batches; the second side
    carries the scaling efficiency (extra: ranks, scaling_efficiency)."""
    sides = []
    for n in (1, ranks):
        argv, binary = launch(engine, n)
        side = bench(argv, binary, ranks, ranks_variant(variant, n))
        side.extra["ranks"] = n
        sides.append(side)
    sides[1].extra["scaling_efficiency"] = scaling_efficiency(sides[0].tokens_per_s, sides[1].tokens_per_s, ranks)
    return sides


def describe(side: Side) -> str | None:
    """The line bench_cuda prints under the N-rank side."""
    eff = side.extra.get("scaling_efficiency")
    if side.extra.get("ranks", 1) == 1 or "scaling_efficiency" not in side.extra:
        return None
    if eff is None:
        return f"    scaling efficiency on {side.extra['ranks']} ranks: not measured (a side was skipped)"
    n = side.extra["ranks"]
    return f"    scaling efficiency on {n} ranks: {eff:.1%} (tokens/s over {n}x one rank's, same global batch)"
