"""The GPU the CUDA engine will use, its driver and the cuDNN it loads, read without starting an engine
(docs/CUDA.md, "Qualification").

NVML (`libnvidia-ml.so.1`, installed with every NVIDIA driver, the library
nvidia-smi reads) answers through ctypes: no CUDA context, no allocation,
milliseconds. The device is the engine's device 0: the first entry of
CUDA_VISIBLE_DEVICES (an index or a GPU-/MIG- UUID), else index 0. NVML
numbers devices in PCI order, CUDA fastest first unless
CUDA_DEVICE_ORDER=PCI_BUS_ID: on a machine with GPUs of different models the
two can differ, so a qualification also checks that the engine's own ready
event names the same GPU (qualification.py). The cuDNN version is the
installed `nvidia-cudnn-cu13` (else `-cu12`) wheel's, the library the build
finds first (microgpt/cuda.mk), or "none".
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata

NVML_LIBRARY = "libnvidia-ml.so.1"
CUDNN_WHEELS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
_NAME_BYTES = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
_VERSION_BYTES = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE


class GpuIdentityError(Exception):
    """No GPU identity could be read; the message is one line."""


@dataclass(frozen=True)
class GpuIdentity:
    gpu: str
    driver: str


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise GpuIdentityError(f"NVML {what} failed (error {rc})")


def _engine_device() -> tuple[str, str]:
    """("index", "0") or ("uuid", "GPU-..."): the device CUDA numbers 0 for the engine."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return "index", "0"
    first = visible.split(",")[0].strip()
    if first.isdigit():
        return "index", first
    if first.startswith(("GPU-", "MIG-")):
        return "uuid", first
    raise GpuIdentityError(f"CUDA_VISIBLE_DEVICES={visible[:80]!r} names no device")


@dataclass(frozen=True)
class GpuUsage:
    """The engine's GPU right now: utilisation (percent of the last sample period a kernel ran) and memory."""

    gpu: str
    util_percent: float
    mem_used_bytes: int
    mem_total_bytes: int


class _Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


@contextmanager
def _engine_gpu() -> Iterator[tuple[ctypes.CDLL, ctypes.c_void_p]]:
    """NVML, initialised, and the handle of the engine's device; shut down after."""
    try:
        nvml = ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        raise GpuIdentityError(f"cannot load {NVML_LIBRARY} ({str(exc).splitlines()[0][:200]})") from None
    how, which = _engine_device()
    _check(nvml.nvmlInit_v2(), "init")
    try:
        handle = ctypes.c_void_p()
        if how == "index":
            _check(
                nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(which)), ctypes.byref(handle)), f"device {which}"
            )
        else:
            _check(nvml.nvmlDeviceGetHandleByUUID(which.encode(), ctypes.byref(handle)), f"device {which}")
        yield nvml, handle
    finally:
        nvml.nvmlShutdown()


def _name(nvml: ctypes.CDLL, handle: ctypes.c_void_p) -> str:
    name = ctypes.create_string_buffer(_NAME_BYTES)
    _check(nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(_NAME_BYTES)), "device name")
    return name.value.decode("utf-8", "replace")


def read_gpu_identity() -> GpuIdentity:
    """The engine's GPU and the driver, through NVML; GpuIdentityError when NVML cannot say."""
    with _engine_gpu() as (nvml, handle):
        gpu = _name(nvml, handle)
        driver = ctypes.create_string_buffer(_VERSION_BYTES)
        _check(nvml.nvmlSystemGetDriverVersion(driver, ctypes.c_uint(_VERSION_BYTES)), "driver version")
    return GpuIdentity(gpu=gpu, driver=driver.value.decode("utf-8", "replace"))


def read_gpu_usage() -> GpuUsage:
    """The engine's GPU's utilisation and memory, through NVML; GpuIdentityError when NVML cannot say."""
    with _engine_gpu() as (nvml, handle):
        gpu = _name(nvml, handle)
        util, mem = _Utilization(), _Memory()
        _check(nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)), "utilization")
        _check(nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)), "memory info")
    return GpuUsage(gpu=gpu, util_percent=float(util.gpu), mem_used_bytes=mem.used, mem_total_bytes=mem.total)


def cudnn_version() -> str:
    """The installed cuDNN wheel's version, or "none"."""
    for wheel in CUDNN_WHEELS:
        try:
            return metadata.version(wheel)
        except metadata.PackageNotFoundError:
            continue
    return "none"
