"""The GPU suite (tests/gpu/): build/microgpt_cuda against the CPU reference.

Every test here is marked `gpu` and is skipped, with the reason, where no
NVIDIA GPU is visible (`nvidia-smi -L` fails and there is no /dev/nvidia0)
or build/microgpt_cuda has not been built (`make cuda`). Where a GPU is
visible, a missing CPU engine is a failure, not a skip.

The engines are driven through the wire formats in proxy/formats/ (frames,
shards, checkpoints, the engine's command line); nothing here re-implements a
format.
MICROGPT_CUDA_ENGINE / MICROGPT_CPU_ENGINE override the binaries, and
MICROGPT_GPU_SUITE=force runs the suite without the GPU check (to exercise
the harness itself with, say, MICROGPT_CUDA_ENGINE=build/microgpt_cpu).
"""
from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from proxy.formats import frames
from proxy.formats.engine_cli import engine_args, setting_flags
from proxy.formats.parameters import n_params, param_layout

REPO = Path(__file__).resolve().parents[2]
CUDA_ENGINE = Path(os.environ.get("MICROGPT_CUDA_ENGINE", REPO / "build" / "microgpt_cuda")).resolve()
CPU_ENGINE = Path(os.environ.get("MICROGPT_CPU_ENGINE", REPO / "build" / "microgpt_cpu")).resolve()
# The flash attention kernels alone (tests/gpu/flash_attention_check.cu, built by `make cuda`).
FLASH_CHECK = Path(os.environ.get("MICROGPT_FLASH_CHECK", REPO / "build" / "flash_attention_check")).resolve()
TIMEOUT = 300.0


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


@dataclass(frozen=True)
class Shape:
    """Model, batch and optimizer settings; every one is passed explicitly."""
    vocab: int = 512
    ctx: int = 128
    dim: int = 128
    layers: int = 2
    heads: int = 4
    batch: int = 4
    grad_accum: int = 1
    steps: int = 200
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 10
    seed: int = 1337

    def but(self, **kw) -> "Shape":
        return replace(self, **kw)

    @property
    def rows(self) -> int:
        return self.batch * self.grad_accum

    @property
    def n_params(self) -> int:
        return n_params(self.vocab, self.ctx, self.dim, self.layers)

    def flags(self) -> list[str]:
        return setting_flags(**asdict(self))

    def tensors(self) -> list[tuple[str, int, int]]:
        """(name, begin, end) of every parameter tensor, in the flat order (proxy/formats/parameters.py)."""
        out, at = [], 0
        for name, shape in param_layout(self.vocab, self.ctx, self.dim, self.layers):
            size = int(np.prod(shape))
            out.append((name, at, at + size))
            at += size
        assert at == self.n_params
        return out


def markov_rows(shape: Shape, n_rows: int, seed: int) -> np.ndarray:
    """[n_rows, T+1] tokens from a fixed sparse Markov chain (4 likely successors
    per token), so the loss has somewhere to go and learning curves mean something."""
    chain = np.random.default_rng(12345)
    succ = chain.integers(0, shape.vocab, size=(shape.vocab, 4))
    rng = np.random.default_rng(seed)
    rows = np.empty((n_rows, shape.ctx + 1), dtype=np.uint16)
    tok = rng.integers(0, shape.vocab, size=n_rows)
    for t in range(shape.ctx + 1):
        rows[:, t] = tok
        pick = rng.integers(0, 4, size=n_rows)
        noise = rng.random(n_rows) < 0.1
        tok = np.where(noise, rng.integers(0, shape.vocab, size=n_rows), succ[tok, pick])
    return rows


def smooth(losses: dict[int, float], window: int = 10) -> np.ndarray:
    """Moving averages of a loss curve, in step order."""
    x = np.array([losses[s] for s in sorted(losses)])
    return np.convolve(x, np.ones(window) / window, mode="valid")


def train_frames(shape: Shape, first: int, last: int, seed: int = 7) -> dict[int, bytes]:
    """TRAIN frames for steps first..last; the data of a step depends on the step only."""
    out = {}
    for s in range(first, last + 1):
        rows = markov_rows(shape, shape.rows, seed * 100_003 + s)
        groups = (np.arange(shape.rows) % 3).astype(np.uint16)
        out[s] = frames.train_frame(s, rows, groups)
    return out


# ---------------------------------------------------------------------------
# running engines


class Engine:
    """A running engine in proxy mode: events read on a thread, stderr to a file."""

    def __init__(self, binary: Path, args: list[str], cwd: Path, env: dict | None = None):
        cwd.mkdir(parents=True, exist_ok=True)
        self.stderr_path = cwd / f"stderr.{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "wb")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.args = [str(binary), *args]
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     cwd=cwd, env=full_env)
        self.events: list = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put(None)

    def stderr(self) -> str:
        if not self._stderr.closed:  # finish() closes it; the file stays readable
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def next_event(self, timeout: float = TIMEOUT):
        try:
            line = self._q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout}s from {self.args}; stderr: {self.stderr()}") from None
        if line is None:
            return None
        ev = frames.parse_event(line)
        self.events.append(ev)
        return ev

    def wait_for(self, kind: str, timeout: float = TIMEOUT, **match):
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(max(0.01, deadline - time.monotonic()))
            if ev is None:
                raise AssertionError(f"stdout ended before a {kind} event {match}; rc={self.proc.poll()} "
                                     f"stderr: {self.stderr()}")
            if ev.kind == "error" and kind != "error":
                raise AssertionError(f"engine error: {ev.fields}; stderr: {self.stderr()}")
            if ev.kind == kind and all(ev.get(k) == v for k, v in match.items()):
                return ev

    def finish(self, timeout: float = TIMEOUT) -> int:
        """Close stdin, read every remaining event, return the exit code."""
        self.close_stdin()
        while self.next_event(timeout) is not None:
            pass
        rc = self.proc.wait(timeout)
        self._stderr.close()
        return rc

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.kind == kind]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("step")}


def proxy_args(shape: Shape, ckpt_dir: Path, *extra: str) -> list[str]:
    return engine_args(ckpt_dir, ckpt_every=0, settings=shape.flags(), extra=extra)


def train(binary: Path, shape: Shape, workdir: Path, ckpt_dir: Path, steps: dict[int, bytes], *extra: str,
          env: dict | None = None) -> Engine:
    """Feed these TRAIN frames, then EOF (the engine checkpoints and exits 0)."""
    eng = Engine(binary, proxy_args(shape, ckpt_dir, *extra), workdir, env)
    for s in sorted(steps):
        eng.send(steps[s])
    rc = eng.finish()
    assert rc == 0, f"{binary.name} exited {rc}; stderr: {eng.stderr()}"
    assert not eng.of("error"), eng.of("error")
    return eng


def initial_checkpoint(cpu_bin: Path, shape: Shape, ckpt_dir: Path) -> Path:
    """step_000000.bin written by the CPU engine (a CHECKPOINT frame at step 0)."""
    eng = Engine(cpu_bin, proxy_args(shape, ckpt_dir), ckpt_dir.parent)
    eng.send(frames.checkpoint_frame())
    ev = eng.wait_for("ckpt", step=0)
    assert eng.finish() == 0
    return Path(ev["path"]) if Path(ev["path"]).is_absolute() else ckpt_dir.parent / ev["path"]


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


def dump_grads_run(binary: Path, shape: Shape, workdir: Path, resume: Path, frame: bytes, *extra: str,
                   env: dict | None = None) -> GradDump:
    out = workdir / f"grads.{binary.name}.{time.monotonic_ns()}.bin"
    eng = Engine(binary, proxy_args(shape, workdir / "ckpt-unused", "--resume", str(resume), "--dump-grads", str(out),
                                    *extra), workdir, env)
    eng.send(frame)
    ev = eng.wait_for("grads")
    rc = eng.finish()
    assert rc == 0, f"{binary.name} exited {rc}; stderr: {eng.stderr()}"
    grads = np.fromfile(out, dtype="<f4")
    assert grads.size == shape.n_params
    return GradDump(ev["loss"], grads, eng)


def dump_grads(binary: Path, shape: Shape, workdir: Path, resume: Path, frame: bytes, *extra: str,
               env: dict | None = None) -> tuple[float, np.ndarray]:
    """(loss, gradients) of the first forward+backward from `resume` on `frame`."""
    run = dump_grads_run(binary, shape, workdir, resume, frame, *extra, env=env)
    return run.loss, run.grads
