"""Every hand-written CUDA kernel of the engine, its own source run on the
CPU (cuda_on_cpu.h), against the CPU engine's op or a float64 reference:
within the bounds tests/gpu uses, the same bits when the threads and blocks
run in reverse order, no hazard in shared or global memory, and clean under
AddressSanitizer and UndefinedBehaviorSanitizer. A kernel added to
microgpt/ without a check here fails test_every_kernel_is_checked."""

from __future__ import annotations

import re
from pathlib import Path

from cuda_cpu.conftest import CheckRun

REPO = Path(__file__).resolve().parents[2]
# A kernel definition: __global__ void [__launch_bounds__(...)] name(
KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def global_kernels() -> set[str]:
    """The names of every __global__ function under microgpt/."""
    names: list[str] = []
    for path in sorted((REPO / "microgpt").rglob("*")):
        if path.suffix in (".cu", ".cuh"):
            text = re.sub(r"//[^\n]*", "", path.read_text())
            names += KERNEL.findall(text)
    assert len(names) == len(set(names)), f"a kernel name is defined twice: {sorted(names)}"
    return set(names)


def test_the_kernel_count_is_read_from_the_source():
    kernels = global_kernels()
    assert "flash_attention_forward_kernel" in kernels and "layernorm_backward_kernel" in kernels
    assert len(kernels) >= 20


def test_every_kernel_is_checked(kernel_checks: dict[str, CheckRun]):
    run = kernel_checks["hazard"]
    launched = {k for c in run.cases for k in c.kernels}
    missing, unknown = global_kernels() - launched, launched - global_kernels()
    assert not missing, f"kernels in microgpt/ that no check in tests/cuda_cpu launches: {sorted(missing)}"
    assert not unknown, f"kernels launched that microgpt/ does not define: {sorted(unknown)}"
    assert len(launched) == len(global_kernels())


def _ran(run: CheckRun) -> None:
    assert run.returncode == 0, f"{run.variant} build: exit {run.returncode}\n{run.stderr}"
    assert run.cases, f"{run.variant} build ran no case\n{run.stderr}"


def test_kernels_match_their_references(kernel_checks: dict[str, CheckRun]):
    for run in kernel_checks.values():
        _ran(run)
        bad = [f"{run.variant} {c.case}: {f}" for c in run.cases for f in c.failures]
        assert not bad, "\n".join(bad)


def test_both_bf16_and_fp32_run(kernel_checks: dict[str, CheckRun]):
    names = [c.case for c in kernel_checks["hazard"].cases]
    for op in ("embedding", "layernorm", "bias", "gelu", "classifier", "gather_logits", "adamw", "attention_naive"):
        for dtype in ("fp32", "bf16"):
            assert any(n.startswith(f"{op}/{dtype}/") for n in names), f"no {op} case in {dtype}"


def test_two_runs_are_bitwise_equal(kernel_checks: dict[str, CheckRun]):
    run = kernel_checks["hazard"]
    _ran(run)
    assert all(c.runs == 2 for c in run.cases)
    bad = [f"{c.case}: {c.differs}" for c in run.cases if c.bitwise_repeat is not True]
    assert not bad, "outputs that changed when threads and blocks ran in reverse order:\n" + "\n".join(bad)


def test_no_hazards(kernel_checks: dict[str, CheckRun]):
    run = kernel_checks["hazard"]
    _ran(run)
    assert all(c.hazards is not None for c in run.cases), "the hazard build ran without its shadow"
    bad = [f"{c.case}: {r}" for c in run.cases for r in c.hazard_reports]
    assert not bad and all(c.hazards == 0 for c in run.cases), "\n".join(bad)


def test_sanitizers_are_clean(kernel_checks: dict[str, CheckRun]):
    run = kernel_checks["asan"]
    _ran(run)
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, run.stderr
    assert {c.case for c in run.cases} == {c.case for c in kernel_checks["hazard"].cases}
