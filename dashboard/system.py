"""The system panel's numbers: this machine's CPU, memory and GPU over time, and a run's MFU.

Who measures what (docs/DASHBOARD.md, "System"): the machine's CPU utilisation and memory, and the GPU's
utilisation and memory through NVML (proxy/gpu_identity.py), are sampled here, by the dashboard server,
every SAMPLE_EVERY_S while it runs, and are this machine's: they describe a run only when the dashboard
runs where the run trains (as `proxy run` starts it), and the panel names the host. The engine process's
own CPU and RSS are the proxy's measurements (.state.json's `engine`), never re-measured here. MFU comes
from the run's own files alone: its engine's reported parameter count and GPU (.state.json), its model
shape (experiment.json) and the engine's tokens/s of each step.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TypeGuard

import psutil

from proxy.gpu_identity import GpuIdentityError, read_gpu_usage

SAMPLE_EVERY_S = 2.0
MAX_SAMPLES = 1800  # an hour at SAMPLE_EVERY_S


@dataclass(frozen=True)
class SystemSample:
    time: float
    cpu_percent: float  # of all cores
    mem_used_bytes: int
    mem_total_bytes: int
    gpu_util_percent: float | None
    gpu_mem_used_bytes: int | None
    gpu_mem_total_bytes: int | None


class SystemSampler:
    """A daemon thread sampling this machine every `every_s`; the newest MAX_SAMPLES are kept."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S):
        self.every_s = every_s
        self.host = socket.gethostname()
        self.samples: deque[SystemSample] = deque(maxlen=MAX_SAMPLES)
        self.gpu: str | None = None
        self.no_gpu: str | None = None  # why there are no GPU numbers (one line), once NVML said so
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="system-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        psutil.cpu_percent(None)  # starts psutil's interval, which it keeps per thread: in this one
        while not self._stop.wait(self.every_s):
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # a sampler never takes the server down; the panel says the last error
                self.no_gpu = self.no_gpu or f"sampling failed: {str(exc)[:200]}"

    def sample(self) -> SystemSample:
        mem = psutil.virtual_memory()
        util = used = total = None
        if self.no_gpu is None:
            try:
                gpu = read_gpu_usage()
                self.gpu, util, used, total = gpu.gpu, gpu.util_percent, gpu.mem_used_bytes, gpu.mem_total_bytes
            except GpuIdentityError as exc:  # no driver, no device: CPU only from now on
                self.no_gpu = str(exc)
        return SystemSample(
            time.time(), psutil.cpu_percent(None), mem.total - mem.available, mem.total, util, used, total
        )

    def payload(self, since: float | None) -> dict:
        """The samples newer than `since` as columns, and what the panel says of the machine."""
        rows = [s for s in list(self.samples) if since is None or s.time > since]
        cols: dict = {k: [getattr(s, k) for s in rows] for k in asdict(SystemSample(0, 0, 0, 0, None, None, None))}
        return {
            "host": self.host,
            "cpus": psutil.cpu_count(),
            "every_s": self.every_s,
            "gpu": self.gpu,
            "no_gpu": self.no_gpu,
            "samples": cols,
        }


# ---------------------------------------------------------------- MFU

# Dense peak FLOP/s by GPU model and the CUDA engine's compute precision, from NVIDIA's data sheets (SXM
# parts: H100 and H200 share theirs). bf16: tensor cores, fp32 accumulate; fp32: CUDA cores (the engine's
# fp32 matmuls are CUBLAS_COMPUTE_32F, never TF32: docs/CUDA.md). The first name found in the GPU's name
# wins, so the longer names come first.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756e12, "fp32": 51.2e12}),
    ("H100", {"bf16": 989.4e12, "fp32": 66.9e12}),
    ("H200", {"bf16": 989.4e12, "fp32": 66.9e12}),
    ("A100", {"bf16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362.05e12, "fp32": 91.6e12}),
    ("L4", {"bf16": 121e12, "fp32": 30.3e12}),
    ("A10", {"bf16": 125e12, "fp32": 31.2e12}),
    ("RTX 4090", {"bf16": 165.2e12, "fp32": 82.6e12}),
)


def peak_flops(device: str, precision: str) -> float | None:
    for name, peaks in PEAK_FLOPS:
        if name in device:
            return peaks.get(precision)
    return None


def flops_per_token(n_params: int, layers: int, dim: int, ctx: int) -> float:
    """Training FLOPs per token: 6N (forward and backward of every weight) plus 12·L·d·T for attention's
    scores and weighted sum (the PaLM paper's appendix B, as nanoGPT's estimate_mfu counts them)."""
    return 6.0 * n_params + 12.0 * layers * dim * ctx


def _count(v: object) -> TypeGuard[int]:
    return type(v) is int and v > 0


def mfu_info(state: dict | None, experiment: dict | None) -> dict:
    """{"flops_per_token", "peak_flops", "gpu", "precision"} of a run trained by the CUDA engine on a GPU of
    known peak, else {"why": one line} (MFU of the engine's tokens/s = tokens/s · flops_per_token / peak)."""
    eng = (state or {}).get("engine") or {}
    if eng.get("kind") != "cuda":
        return {"why": f"MFU is for the CUDA engine (this run: {eng.get('kind') or 'engine unknown'})"}
    model = (experiment or {}).get("model") or {}
    n, layers, dim, ctx = eng.get("n_params"), model.get("layers"), model.get("dim"), model.get("ctx")
    if not (_count(n) and _count(layers) and _count(dim) and _count(ctx)):
        return {"why": "MFU needs the engine's parameter count and the model's layers, dim and ctx"}
    device, precision = str(eng.get("device") or ""), str(eng.get("precision") or "")
    peak = peak_flops(device, precision)
    if peak is None:
        return {"why": f"no peak FLOP/s known for {device.split(',')[0] or 'this GPU'} at {precision or '?'}"}
    fpt = flops_per_token(n, layers, dim, ctx)
    return {"flops_per_token": fpt, "peak_flops": peak, "gpu": device.split(",")[0], "precision": precision}
