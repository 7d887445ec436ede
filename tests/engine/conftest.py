"""Shared fixtures for the engine suite (tests/engine/).

The engine is `build/microgpt_cpu`, or what MICROGPT_TEST_ENGINE names
(tests/harness/engines.py): `make test-gpu` runs this suite against the CUDA
engine too. A test of something only the CPU engine has (its --threads, its
float32 arithmetic checked against PyTorch) is marked `cpu_only` and skipped,
with the reason, on another. A missing binary is a test failure with a clear
message, never a skip: CI must not go green without an engine.

The shape, the engine wrapper and the test data are the harness's
(tests/harness/shape.py, engine.py, data.py); everything speaks the wire
formats through proxy/formats/, so this suite never re-implements a format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine import Engine
from harness.engines import engine_under_test
from harness.fsync_shim import build_fsync_shim
from harness.shape import Shape

ENGINE = engine_under_test()
TINY = Shape()

# Why a test is the CPU engine's alone (the reason its skip gives on another engine).
THREADS = "the CPU engine's --threads"
TORCH = (
    "the CPU engine's float32 arithmetic against PyTorch (the CUDA engine is compared with the CPU one "
    "in tests/gpu/test_vs_cpu.py)"
)


def cpu_only(why: str):
    """Skip on an engine built for anything but the CPU, saying why."""
    return pytest.mark.skipif(
        ENGINE.build not in ("cpu", None), reason=f"{why}; the engine under test is the {ENGINE.build} one"
    )


def lr_at(shape: Shape, s: int) -> float:
    """ENGINE.md's schedule for the update producing step s (1-based)."""
    from .torch_reference import lr_at as schedule

    return schedule(s, shape.lr, shape.min_lr, shape.warmup, shape.steps)


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    if ENGINE.problem:
        pytest.fail(f"{ENGINE.problem} (tests/engine needs an engine: `make cpu`)", pytrace=False)
    return ENGINE.path


@pytest.fixture
def cfg() -> Shape:
    return TINY


# ---------------------------------------------------------------------------
# slow or failing checkpoint writes (tests/harness/fsync_shim.py)


@pytest.fixture(scope="session")
def fsync_shim(tmp_path_factory) -> Path:
    """The fsync shim, built once per session."""
    return build_fsync_shim(tmp_path_factory.mktemp("shim"))


# ---------------------------------------------------------------------------
# running the engine


@pytest.fixture
def run_engine(engine_bin, tmp_path):
    """Factory: run_engine(args) -> Engine; every engine started is killed at teardown."""
    started: list[Engine] = []

    def _start(args: list, workdir: Path | None = None, env: dict | None = None) -> Engine:
        eng = Engine(engine_bin, args, workdir or tmp_path, env=env)
        started.append(eng)
        return eng

    yield _start
    for eng in started:
        eng.kill()


def dir_snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """name -> (bytes, mtime_ns) of every file in a directory."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir()) if p.is_file()}
