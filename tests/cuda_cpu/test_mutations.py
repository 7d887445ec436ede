"""The mutation check: bugs planted in copies of the kernels' source must each
be caught by the checks, so the harness cannot silently stop seeing them.
Each mutation replaces one exact piece of microgpt/cuda/ (found once), builds
the check unit that includes it in one variant (hazard, or asan for the one
that shows the sanitizers are live; the session's unmutated support objects
are reused) and runs the cases named; the test asserts the bug shows the way
it should: a hazard report naming the kernel, a wrong result, an
out-of-bounds access, an AddressSanitizer report, or a fatal error of the
execution layer."""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from cuda_cpu import build as builder
from cuda_cpu.conftest import CheckRun, run_checks

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # under microgpt/cuda/
    old: str  # replaced once; must occur exactly once
    new: str
    unit: str  # the check unit that includes it
    case: str  # the cases to run (a name prefix)
    shows: str  # "hazard", "wrong", "out-of-bounds", "asan" or "fatal"
    kernel: str  # the kernel a report must name
    variant: str = "hazard"


MUTATIONS = [
    Mutation(
        "barrier: the flash forward refills a K/V buffer other warps still read",
        "attention_flash.cuh",
        "        __syncthreads();  // every warp is done with buffer j & 1 before iteration j + 1 refills it\n",
        "",
        "kernels_flash",
        "attention_flash/bf16/B1_T130_H2_hd64",
        "hazard",
        "flash_attention_forward_kernel",
    ),
    Mutation(
        "cp.async wait: the flash loop waits for one group too few",
        "attention_flash.cuh",
        "        cp_async_wait<1>();  // tile j has landed; j + 1 may still be in flight",
        "        cp_async_wait<2>();",
        "kernels_flash",
        "attention_flash/bf16/B1_T130_H2_hd64",
        "wrong",
        "flash_attention_forward_kernel",
    ),
    Mutation(
        "buffer index: the flash forward reads the K tile being loaded",
        "attention_flash.cuh",
        "const __nv_bfloat16 *kt = ks + (j & 1) * BN * LD, *vt = vs + (j & 1) * BN * LD;\n\n"
        "        float s[BN / 8][4];",
        "const __nv_bfloat16 *kt = ks + ((j + 1) & 1) * BN * LD, *vt = vs + (j & 1) * BN * LD;\n\n"
        "        float s[BN / 8][4];",
        "kernels_flash",
        "attention_flash/bf16/B1_T130_H2_hd64",
        "wrong",
        "flash_attention_forward_kernel",
    ),
    Mutation(
        "bound: the flash kernels store rows past T",
        "attention_flash.cuh",
        "        if (row_a < T)\n            *reinterpret_cast",
        "        if (row_a < T + 16)\n            *reinterpret_cast",
        "kernels_flash",
        "attention_flash/bf16/B1_T100_H2_hd64",
        "out-of-bounds",
        "flash_attention",
    ),
    Mutation(
        "mask: the causal mask hides the diagonal too",
        "attention_flash.cuh",
        "s[nt][e] = diagonal && key > row ? -INFINITY",
        "s[nt][e] = diagonal && key >= row ? -INFINITY",
        "kernels_flash",
        "attention_flash/bf16/B1_T100_H2_hd64",
        "wrong",
        "flash_attention_forward_kernel",
    ),
    Mutation(
        "lane mapping: an ldmatrix B operand with the wrong lanes' rows",
        "attention_flash.cuh",
        "(row0 + (lane / 16) * 8 + lane % 8) * FlashTile<HD>::LD",
        "(row0 + (lane / 16) * 8 + (lane + 1) % 8) * FlashTile<HD>::LD",
        "kernels_flash",
        "attention_flash/bf16/B1_T64_H2_hd32",
        "wrong",
        "flash_attention_forward_kernel",
    ),
    Mutation(
        "aliasing: the backward preprocess reads its uint4 through a bf16x2 pointer again",
        "attention_flash.cuh",
        "        __nv_bfloat162 a2[4], c2[4];\n        memcpy(a2, &a, sizeof a);\n        memcpy(c2, &c, sizeof c);",
        "        const __nv_bfloat162 *a2 = reinterpret_cast<const __nv_bfloat162 *>(&a);\n"
        "        const __nv_bfloat162 *c2 = reinterpret_cast<const __nv_bfloat162 *>(&c);",
        "kernels_flash",
        "attention_flash/bf16/B1_T64_H2_hd32",
        "wrong",
        "flash_attention_backward_preprocess_kernel",
    ),
    Mutation(
        "barrier: the naive forward restages K/V while others read them",
        "attention.cuh",
        "    for (int k0 = 0; k0 <= last; k0 += S::KT) {\n"
        "        __syncthreads();\n"
        "        stage_tiles<Tx, HD, S::KT>(ks, vs, base + C, base + 2 * C, C3, k0, T, hd);\n"
        "        __syncthreads();\n"
        "        int kend = min(S::KT, last - k0 + 1);  // uniform",
        "    for (int k0 = 0; k0 <= last; k0 += S::KT) {\n"
        "        stage_tiles<Tx, HD, S::KT>(ks, vs, base + C, base + 2 * C, C3, k0, T, hd);\n"
        "        __syncthreads();\n"
        "        int kend = min(S::KT, last - k0 + 1);  // uniform",
        "kernels_attention",
        "attention_naive/fp32/B2_T70_H2_hd8",
        "hazard",
        "attention_forward_kernel",
    ),
    Mutation(
        "bound: LayerNorm rows past R",
        "layernorm.cuh",
        "    if (row >= R) return;  // whole warps leave together\n",
        "",
        "kernels_ops",
        "layernorm/fp32/R300_C72",
        "out-of-bounds",
        "layernorm_forward_kernel",
    ),
    Mutation(
        "bound: LayerNorm rows past R, under AddressSanitizer",
        "layernorm.cuh",
        "    if (row >= R) return;  // whole warps leave together\n",
        "",
        "kernels_ops",
        "layernorm/fp32/R300_C72",
        "asan",
        "layernorm_forward_kernel",
        variant="asan",
    ),
    Mutation(
        "barrier: the classifier overwrites a logit another thread still reads",
        "classifier.cuh",
        "    __syncthreads();  // every thread has read x[target] before anyone overwrites it\n",
        "",
        "kernels_ops",
        "classifier/fp32/BT37_V517",
        "hazard",
        "fused_classifier_kernel",
    ),
    Mutation(
        "warp: a shuffle in a branch only some lanes take",
        "layernorm.cuh",
        "    float mu = warp_sum(sum) / C;",
        "    float mu = (lane < 16 ? warp_sum(sum) : sum) / C;",
        "kernels_ops",
        "layernorm/fp32/R300_C72",
        "fatal",
        "layernorm_forward_kernel",
    ),
]


def mutate(m: Mutation, root: Path) -> None:
    """A copy of microgpt/ and tests/cuda_cpu/ under root, with m applied."""
    shutil.copytree(REPO / "microgpt", root / "microgpt")
    shutil.copytree(
        REPO / "tests" / "cuda_cpu", root / "tests" / "cuda_cpu", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = root / "microgpt" / "cuda" / m.file
    text = path.read_text()
    assert text.count(m.old) == 1, f"{m.name}: the text to replace occurs {text.count(m.old)} times in {m.file}"
    path.write_text(text.replace(m.old, m.new))


def run_mutation(m: Mutation, support: Path, scratch: Path) -> CheckRun:
    """m built (support: the build directory of m's variant whose support objects to reuse) and run."""
    root = scratch / str(MUTATIONS.index(m))
    mutate(m, root)
    binary = builder.build(
        m.variant, source_root=root, out=root / "build", kernel_units=(m.unit,), support_from=support, jobs=1
    )
    return run_checks(binary, m.variant, ["--runs", "1", m.case], timeout=300)


@pytest.fixture(scope="module")
def mutation_runs(kernel_checks) -> dict[str, CheckRun]:
    """Every mutation built and run, two at a time (the slowest build first)."""
    order = sorted(MUTATIONS, key=lambda m: m.variant != "asan")
    with tempfile.TemporaryDirectory(prefix="cuda_cpu_mutations.") as scratch:
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = list(
                pool.map(lambda m: run_mutation(m, kernel_checks[m.variant].binary.parent, Path(scratch)), order)
            )
    return {m.name: r for m, r in zip(order, runs, strict=False)}


def test_mutations_cover_what_the_issue_names():
    kinds = {m.name.split(":")[0] for m in MUTATIONS}
    assert {"barrier", "cp.async wait", "buffer index", "bound", "mask"} <= kinds
    assert len(MUTATIONS) >= 5


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name.split(":")[0] + ": " + m.case for m in MUTATIONS])
def test_mutation_is_caught(m: Mutation, mutation_runs: dict[str, CheckRun]):
    run = mutation_runs[m.name]
    what = f"{m.name}\nexit {run.returncode}; stderr: {run.stderr[-2000:]}\ncases: {run.cases}"
    if m.shows == "fatal":
        assert run.returncode == 3 and f"error: {m.kernel}" in run.stderr, what
        return
    if m.shows == "asan":
        assert run.returncode != 0 and "ERROR: AddressSanitizer" in run.stderr and m.kernel in run.stderr, what
        return
    assert run.returncode == 0 and run.cases, what
    reports = [r for c in run.cases for r in c.hazard_reports]
    if m.shows == "hazard":
        assert any(m.kernel in r and "microgpt/cuda/" in r for r in reports), what
    elif m.shows == "out-of-bounds":
        assert any("out-of-bounds" in r and m.kernel in r for r in reports), what
    else:
        assert any(c.failures for c in run.cases), what
