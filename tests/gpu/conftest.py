"""The GPU suite (tests/gpu/): build/microgpt_cuda against the CPU reference.

Every test here is marked `gpu` and is skipped, with the reason, where no
NVIDIA GPU is visible (`nvidia-smi -L` fails and there is no /dev/nvidia0)
or build/microgpt_cuda has not been built (`make cuda`). Where a GPU is
visible, a missing CPU engine is a failure, not a skip.

The shape, the engine wrapper and the test data are the harness's
(tests/harness/shape.py, engine.py, data.py), which speaks the wire formats
through proxy/formats/. What the CUDA engine shares with the CPU one (signals,
resume, checkpoints, bad inputs) is tests/engine's, which `make test-gpu` runs
against the CUDA engine; this suite compares the two engines and checks what
only the CUDA engine has.

MICROGPT_CUDA_ENGINE / MICROGPT_CPU_ENGINE override the binaries, and
MICROGPT_GPU_SUITE=force runs the suite without the GPU check (to exercise
the harness itself with, say, MICROGPT_CUDA_ENGINE=build/microgpt_cpu).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from harness.engine import Engine
from harness.shape import Shape, proxy_args

REPO = Path(__file__).resolve().parents[2]
CUDA_ENGINE = Path(os.environ.get("MICROGPT_CUDA_ENGINE", REPO / "build" / "microgpt_cuda")).resolve()
CPU_ENGINE = Path(os.environ.get("MICROGPT_CPU_ENGINE", REPO / "build" / "microgpt_cpu")).resolve()
# The flash attention kernels alone (tests/gpu/flash_attention_check.cu, built by `make cuda`).
FLASH_CHECK = Path(os.environ.get("MICROGPT_FLASH_CHECK", REPO / "build" / "flash_attention_check")).resolve()


def gpu_skip_reason() -> str | None:
    """Why the GPU suite cannot run here, or None."""
    if os.environ.get("MICROGPT_GPU_SUITE") == "force":
        return None
    visible = Path("/dev/nvidia0").exists()
    smi = "not run"
    if not visible:
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
            visible = out.returncode == 0 and "GPU" in out.stdout
            smi = f"exit {out.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            smi = type(exc).__name__
    if not visible:
        return f"no NVIDIA GPU visible (no /dev/nvidia0; nvidia-smi -L: {smi})"
    if not (CUDA_ENGINE.is_file() and os.access(CUDA_ENGINE, os.X_OK)):
        return f"{CUDA_ENGINE} is missing: build it with `make cuda`"
    return None


_SKIP = gpu_skip_reason()


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if _SKIP:
                item.add_marker(pytest.mark.skip(reason=_SKIP))


@pytest.fixture(scope="session")
def cuda_bin() -> Path:
    return CUDA_ENGINE


@pytest.fixture(scope="session")
def flash_check_bin() -> Path:
    if not (FLASH_CHECK.is_file() and os.access(FLASH_CHECK, os.X_OK)):
        pytest.fail(f"{FLASH_CHECK} is missing: build it with `make cuda`", pytrace=False)
    return FLASH_CHECK


@pytest.fixture(scope="session")
def cpu_bin() -> Path:
    if not (CPU_ENGINE.is_file() and os.access(CPU_ENGINE, os.X_OK)):
        pytest.fail(f"{CPU_ENGINE} is missing: build it with `make cpu`", pytrace=False)
    return CPU_ENGINE


# ---------------------------------------------------------------------------
# configuration and data

# The suite's base shape: head dim 32, a vocabulary and context long enough for a learning curve.
BASE = Shape(vocab=512, ctx=128, dim=128, layers=2, heads=4, batch=4, steps=200, lr=1e-3, min_lr=1e-4, warmup=10)


def smooth(losses: dict[int, float], window: int = 10) -> np.ndarray:
    """Moving averages of a loss curve, in step order."""
    x = np.array([losses[s] for s in sorted(losses)])
    return np.convolve(x, np.ones(window) / window, mode="valid")


# ---------------------------------------------------------------------------
# running engines


def train(
    binary: Path,
    shape: Shape,
    workdir: Path,
    ckpt_dir: Path,
    steps: dict[int, bytes],
    *extra: str,
    env: dict | None = None,
) -> Engine:
    """Feed these TRAIN frames, then EOF (the engine checkpoints and exits 0)."""
    eng = Engine(binary, proxy_args(shape, ckpt_dir, *extra), workdir, env=env)
    for s in sorted(steps):
        eng.send(steps[s])
    eng.close_stdin()
    rc = eng.finish()
    assert rc == 0, f"{binary.name} exited {rc}; stderr: {eng.stderr}"
    assert not eng.of("error"), eng.of("error")
    return eng


@dataclass
class GradDump:
    """The first forward+backward of a run: its loss, raw gradients, and the
    engine (ready event, stderr) that computed them."""

    loss: float
    grads: np.ndarray
    engine: Engine

    @property
    def device(self) -> str:
        return self.engine.of("ready")[0]["device"]


def dump_grads_run(
    binary: Path, shape: Shape, workdir: Path, resume: Path, frame: bytes, *extra: str, env: dict | None = None
) -> GradDump:
    out = workdir / f"grads.{binary.name}.{time.monotonic_ns()}.bin"
    eng = Engine(
        binary,
        proxy_args(shape, workdir / "ckpt-unused", "--resume", str(resume), "--dump-grads", str(out), *extra),
        workdir,
        env=env,
    )
    eng.send(frame)
    ev = eng.wait_for("grads")
    eng.close_stdin()
    rc = eng.finish()
    assert rc == 0, f"{binary.name} exited {rc}; stderr: {eng.stderr}"
    grads = np.fromfile(out, dtype="<f4")
    assert grads.size == shape.n_params
    return GradDump(ev["loss"], grads, eng)


def dump_grads(
    binary: Path, shape: Shape, workdir: Path, resume: Path, frame: bytes, *extra: str, env: dict | None = None
) -> tuple[float, np.ndarray]:
    """(loss, gradients) of the first forward+backward from `resume` on `frame`."""
    run = dump_grads_run(binary, shape, workdir, resume, frame, *extra, env=env)
    return run.loss, run.grads
