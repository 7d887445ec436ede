"""What scripts/bench_cuda.py records about the machine it measured on: the GPU (name, driver, CUDA,
dense bf16 peak), nvcc, the cuDNN wheel, the commit, a process's GPU memory. Each is None where it
cannot be read (no GPU, no git)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# Standard library only, so importable on the GPU image; bench_cuda.py puts the repository on sys.path.
from proxy import gpu_identity

REPO = Path(__file__).resolve().parents[1]

# Dense bf16 tensor-core peaks (datasheet, SXM parts), TFLOP/s.
PEAKS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "4090": 165.0}


def gpu_peak(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, peak in PEAKS.items():
        if key in name:
            return peak
    return None


def run_text(cmd: list[str]) -> str | None:
    """stdout of a short command, or None when it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_facts() -> dict:
    """GPU name, driver and CUDA version (nvidia-smi), nvcc release: None where unknown."""
    query = run_text(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    name, driver = "unknown GPU", None
    if query and query.strip():
        parts = [p.strip() for p in query.strip().splitlines()[0].split(",")]
        name, driver = parts[0], parts[1] if len(parts) > 1 else None
    banner = run_text(["nvidia-smi"]) or ""
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", banner)
    nvcc = re.search(r"release ([0-9.]+), V([0-9.]+)", run_text(["nvcc", "--version"]) or "")
    return {
        "gpu": name,
        "driver": driver,
        "cuda": cuda.group(1) if cuda else None,
        "nvcc": nvcc.group(2) if nvcc else None,
    }


def cudnn_version() -> str | None:
    """The nvidia-cudnn wheel's version (the cuDNN the engine loads, docs/CUDA.md), or None: the qualification's
    own reading (proxy/gpu_identity.py), so a benchmark and a verdict name the same cuDNN."""
    version = gpu_identity.cudnn_version()
    return None if version == "none" else version


def source_commit() -> str | None:
    """The commit of this checkout (with "-dirty" when it has uncommitted changes), or None without git."""
    head = run_text(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"])
    if not head:
        return None
    dirty = run_text(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return head.strip() + ("-dirty" if dirty else "")


def process_gpu_mib(pid: int) -> float | None:
    """GPU memory nvidia-smi attributes to pid (MiB), or None."""
    out = run_text(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None
