"""The machine-code gates (sass_gates.py) on the CUDA engine's kernels for
sm_80 and sm_90: no spills, no local memory, registers and shared memory
within sass_budget.json, the HMMA the tensor-core kernels are written to
issue. Skipped, with the reason, where there is no nvcc, no cuobjdump (toolkit
or wheel), or no cuBLAS to build the engine with; no GPU needed."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_cpu import sass_gates as gates

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _need_tools() -> None:
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not found: no CUDA toolkit, so no machine code to check")
    if not gates.find_tool("cuobjdump"):
        pytest.skip("cuobjdump not found (install the nvidia-cuda-cuobjdump wheel: scripts/install_test_deps.sh)")


@pytest.fixture(scope="module")
def engine_code() -> dict[str, dict[str, gates.KernelCode]]:
    """The machine code of build/microgpt_cuda, built first if it is out of date."""
    _need_tools()
    out = subprocess.run(["make", "-s", "cuda"], cwd=REPO, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        if "has no cuBLAS" in out.stderr:  # microgpt/cuda.mk CUDA_SKIP
            pytest.skip("cuBLAS not found: build/microgpt_cuda cannot be built here (make cuda says how to install it)")
        pytest.fail(f"make cuda failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}", pytrace=False)
    return gates.machine_code(gates.ENGINE)


@pytest.fixture(scope="module")
def spill_code(tmp_path_factory) -> dict[str, dict[str, gates.KernelCode]]:
    _need_tools()
    fatbin = tmp_path_factory.mktemp("spill") / "spill_kernel.fatbin"
    subprocess.run(
        [
            "nvcc",
            "-fatbin",
            "-O3",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=sm_90",
            str(HERE / "spill_kernel.cu"),
            "-o",
            str(fatbin),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return gates.machine_code(fatbin)


def test_engine_kernels_pass_the_gates(engine_code):
    bad = gates.check(engine_code, gates.load_budget())
    assert not bad, "\n".join(bad)


def test_both_architectures_and_every_kernel_are_read(engine_code):
    assert set(gates.ARCHS) <= set(engine_code)
    for arch in gates.ARCHS:
        names = {k.split("<")[0] for k in engine_code[arch]}
        assert {"flash_attention_forward_kernel", "layernorm_forward_kernel", "adamw_kernel"} <= names
        assert len(engine_code[arch]) == len(engine_code[gates.ARCHS[0]])


def test_tensor_core_kernels_contain_their_hmma(engine_code):
    for arch in gates.ARCHS:
        flash = {k: c for k, c in engine_code[arch].items() if gates.flash_hmma(k) is not None}
        assert len(flash) == 9, sorted(flash)  # forward, dK/dV, dQ at head dims 32, 64, 128
        for kernel, c in flash.items():
            assert c.hmma == gates.flash_hmma(kernel) > 0, f"{arch} {kernel}: {c.hmma} HMMA"
        assert all(c.hmma == 0 for k, c in engine_code[arch].items() if k not in flash and "flash" not in k)


def test_the_gates_fail_on_a_kernel_made_to_spill(spill_code):
    generous = {arch: {"spill_kernel": {"registers": 255, "shared": 0}} for arch in gates.ARCHS}
    bad = gates.check(spill_code, generous)
    for arch in gates.ARCHS:
        assert any(line.startswith(f"{arch} spill_kernel: ") and "stack frame" in line for line in bad), bad
        assert any(line.startswith(f"{arch} spill_kernel: ") and "LDL/STL" in line for line in bad), bad


def test_the_gates_fail_over_budget_and_name_the_kernel(engine_code):
    budget = gates.load_budget()
    tight = copy.deepcopy(budget)
    tight["sm_80"]["flash_attention_forward_kernel<64>"]["registers"] -= 1
    tight["sm_90"]["layernorm_forward_kernel<float>"]["shared"] = -1
    tight["sm_90"]["flash_attention_backward_dq_kernel<128>"]["hmma"] += 16
    del tight["sm_80"]["adamw_kernel<float>"]
    tight["sm_90"]["gone_kernel<1>"] = {"registers": 1, "shared": 0}
    bad = gates.check(engine_code, tight)
    regs = engine_code["sm_80"]["flash_attention_forward_kernel<64>"].registers
    assert f"sm_80 flash_attention_forward_kernel<64>: {regs} registers > budget {regs - 1}" in bad
    assert any(
        b.startswith("sm_90 layernorm_forward_kernel<float>: ") and "shared memory > budget -1" in b for b in bad
    )
    assert any(b.startswith("sm_90 flash_attention_backward_dq_kernel<128>: 96 HMMA") for b in bad), bad
    assert any(b.startswith("sm_80 adamw_kernel<float>: no budget") for b in bad)
    assert any(b.startswith("sm_90 gone_kernel<1>: in the budget but not in the binary") for b in bad)
    assert len(bad) == 5, bad
    assert not gates.check(engine_code, budget)
