"""Machine-code gates: what nvcc made of the engine's kernels, for sm_80 and
sm_90, checked without a GPU (cuobjdump reads the binary).

For every kernel of every architecture: no local memory and no stack frame
(LOCAL and STACK in cuobjdump's resource usage), no spill instruction (LDL,
STL in the SASS), registers and static shared memory within the committed
budget (sass_budget.json), and, for the tensor-core kernels, exactly the HMMA
count their loop body is written to issue (FLASH_HMMA below: one HMMA per
mma.sync m16n8k16, the loops over k and n fully unrolled, the loop over
tiles not). A kernel without a budget entry, an entry without a kernel, or an
architecture missing from the binary fails too. Each failure is one line
naming the architecture, the kernel and the figure.

cuobjdump (and nvdisasm, which it runs for the SASS) come from the CUDA
toolkit or the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels
(scripts/install_test_deps.sh installs them where nvcc exists).

    python tests/cuda_cpu/sass_gates.py [BINARY]            # check (default build/microgpt_cuda)
    python tests/cuda_cpu/sass_gates.py --write-budget      # record the current registers and shared memory
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUDGET = HERE / "sass_budget.json"
ENGINE = REPO / "build" / "microgpt_cuda"
ARCHS = ("sm_80", "sm_90")


def flash_hmma(kernel: str) -> int | None:
    """The HMMA instructions one loop iteration (one streamed tile) of a flash
    kernel issues, from its tile shapes (attention_flash.cuh, FlashShape):
    a product of a 16-row warp tile, X (16 x K) times Y (K x N), is
    (K / 16) * (N / 8) mma.sync m16n8k16. None for other kernels."""
    m = re.fullmatch(r"flash_attention_(forward|backward_dkv|backward_dq)_kernel<(\d+)>", kernel)
    if not m:
        return None
    kind, hd = m.group(1), int(m.group(2))
    step = 32 if hd == 128 else 64  # dK/dV's query tile and dQ's key tile; the forward's key tile is 64

    def products(k: int, n: int) -> int:
        return (k // 16) * (n // 8)

    if kind == "forward":  # S = Q K^T (k = hd, n = 64 keys), O += P V (k = 64 keys, n = hd)
        return products(hd, 64) + products(64, hd)
    if kind == "backward_dq":  # S = Q K^T, dP = dY V^T (k = hd, n = step keys), dQ += dS K (k = step, n = hd)
        return 2 * products(hd, step) + products(step, hd)
    # dK/dV: S^T = K Q^T, dP^T = V dY^T (k = hd, n = step queries), dV += P^T dY, dK += dS^T Q (k = step, n = hd)
    return 2 * products(hd, step) + 2 * products(step, hd)


class GateError(RuntimeError):
    """A tool is missing or failed; the message is one line."""


@dataclass
class KernelCode:
    """One kernel's machine code for one architecture."""

    registers: int
    stack: int
    shared: int
    local: int
    hmma: int = 0
    spill_instructions: int = 0  # LDL, STL


def find_tool(name: str) -> Path | None:
    """A CUDA binary tool: on the PATH, next to nvcc, or in an nvidia-* wheel."""
    found = shutil.which(name)
    if found:
        return Path(found)
    nvcc = shutil.which("nvcc")
    if nvcc:
        out = subprocess.run(
            [nvcc, "-dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], capture_output=True, text=True
        )
        for line in out.stderr.splitlines():
            if line.startswith("#$ _HERE_="):
                candidate = Path(line.split("=", 1)[1]) / name
                if candidate.is_file():
                    return candidate
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob(f"*/bin/{name}")):
            return candidate
    return None


def _tool_output(args: list[str]) -> str:
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise GateError(f"{' '.join(args)} failed (exit {out.returncode}): {out.stderr.strip()[:300]}")
    return out.stdout


def short_name(mangled: str, demangled: dict[str, str]) -> str:
    """'void flash_attention_forward_kernel<64>(__nv_bfloat16*, ...)' -> 'flash_attention_forward_kernel<64>'."""
    name = demangled.get(mangled, mangled)
    name = re.sub(r"^void\s+", "", name)
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def _demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return dict(zip(names, lines, strict=False)) if out.returncode == 0 and len(lines) == len(names) else {}


def machine_code(binary: Path) -> dict[str, dict[str, KernelCode]]:
    """arch -> kernel -> its figures, from cuobjdump's resource usage and SASS."""
    cuobjdump = find_tool("cuobjdump")
    if not cuobjdump:
        raise GateError("cuobjdump not found (CUDA toolkit, or pip install nvidia-cuda-cuobjdump)")
    usage = _tool_output([str(cuobjdump), "-res-usage", str(binary)])
    sass = _tool_output([str(cuobjdump), "-sass", str(binary)])
    raw: dict[str, dict[str, KernelCode]] = {}
    arch, function = None, None
    for line in usage.splitlines():
        if m := re.match(r"\s*arch = (sm_\d+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function (\S+):", line):
            function = m.group(1)
        elif function and (m := re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)):
            raw.setdefault(arch, {})[function] = KernelCode(*map(int, m.groups()))
            function = None
    arch, function = None, None
    for line in sass.splitlines():
        if m := re.match(r"\s*arch = (sm_\d+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function : (\S+)", line):
            function = m.group(1)
        elif function and (m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)):
            code = raw.get(arch, {}).get(function)
            if code is None:
                continue
            op = m.group(1)
            code.hmma += op == "HMMA"
            code.spill_instructions += op in ("LDL", "STL")
    demangled = _demangle(sorted({f for per_arch in raw.values() for f in per_arch}))
    return {a: {short_name(f, demangled): c for f, c in per_arch.items()} for a, per_arch in raw.items()}


def check(code: dict[str, dict[str, KernelCode]], budget: dict, archs=ARCHS) -> list[str]:
    """The failures, one line each (none: every gate passes)."""
    bad: list[str] = []
    for arch in archs:
        have, allowed = code.get(arch), budget.get(arch, {})
        if have is None:
            bad.append(f"{arch}: no {arch} code in the binary")
            continue
        for kernel in sorted(set(allowed) - set(have)):
            bad.append(f"{arch} {kernel}: in the budget but not in the binary (remove it from {BUDGET.name})")
        for kernel, c in sorted(have.items()):
            b = allowed.get(kernel)
            if c.local:
                bad.append(f"{arch} {kernel}: {c.local} bytes of local memory (must be 0)")
            if c.stack:
                bad.append(f"{arch} {kernel}: a {c.stack}-byte stack frame (spills or a stack array; must be 0)")
            if c.spill_instructions:
                bad.append(f"{arch} {kernel}: {c.spill_instructions} local loads/stores (LDL/STL: spills; must be 0)")
            if b is None:
                bad.append(f"{arch} {kernel}: no budget (add it to {BUDGET.name}: --write-budget)")
                continue
            if c.registers > b["registers"]:
                bad.append(f"{arch} {kernel}: {c.registers} registers > budget {b['registers']}")
            if c.shared > b["shared"]:
                bad.append(f"{arch} {kernel}: {c.shared} bytes of static shared memory > budget {b['shared']}")
            if b.get("hmma") is not None and c.hmma != b["hmma"]:
                bad.append(
                    f"{arch} {kernel}: {c.hmma} HMMA instructions, expected {b['hmma']} (one loop body's mma.sync)"
                )
    return bad


def budget_for(code: dict[str, dict[str, KernelCode]], archs=ARCHS) -> dict:
    """A budget holding the current registers and shared memory, and the expected HMMA counts."""
    out: dict = {}
    for arch in archs:
        out[arch] = {}
        for kernel, c in sorted(code.get(arch, {}).items()):
            entry = {"registers": c.registers, "shared": c.shared}
            if (hmma := flash_hmma(kernel)) is not None:
                entry["hmma"] = hmma
            out[arch][kernel] = entry
    return out


def budget_text(budget: dict) -> str:
    """sass_budget.json: one line per kernel, so a change reads as one line of diff."""
    lines = [
        '{"about": "Per-kernel machine-code budget of build/microgpt_cuda (tests/cuda_cpu/sass_gates.py): '
        'registers and static shared memory (bytes) at most, HMMA exactly (flash kernels)."'
    ]
    for arch in budget:
        entries = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in budget[arch].items()]
        lines.append(f' "{arch}": {{\n' + ",\n".join(entries) + "\n }")
    return ",\n".join(lines) + "\n}\n"


def load_budget() -> dict:
    doc = json.loads(BUDGET.read_text())
    return {arch: doc[arch] for arch in ARCHS if arch in doc}


def main(argv: list[str]) -> int:
    write = "--write-budget" in argv
    paths = [a for a in argv if a != "--write-budget"]
    binary = Path(paths[0]) if paths else ENGINE
    try:
        code = machine_code(binary)
    except GateError as exc:
        print(f"sass_gates: {exc}", file=sys.stderr)
        return 2
    if write:
        BUDGET.write_text(budget_text(budget_for(code)))
        print(f"sass_gates: wrote {BUDGET}")
        return 0
    bad = check(code, load_budget())
    for line in bad:
        print(line)
    kernels = sum(len(v) for v in code.values())
    print(f"sass_gates: {kernels} kernels over {len(code)} architectures, {len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
