"""The engine the suites drive: the CPU engine, unless MICROGPT_TEST_ENGINE names another.

    MICROGPT_TEST_ENGINE=cpu         build/microgpt_cpu (the default)
    MICROGPT_TEST_ENGINE=cuda        build/microgpt_cuda, on a visible NVIDIA GPU (`make test-gpu`)
    MICROGPT_TEST_ENGINE=/some/path  that binary (to exercise the switch itself, e.g. with the CPU engine)

Every proxy run in the tests names its engine with `--engine` (`EngineUnderTest.flag`): a test
never drives an engine because of what the machine happens to have. `auto` is refused for that
reason. The names and the GPU check are the proxy's own (proxy/supervision/engine_process.py).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from proxy.supervision.engine_process import EngineError, choose_engine, engine_binary, gpu_visible

ENV = "MICROGPT_TEST_ENGINE"


@dataclass(frozen=True)
class EngineUnderTest:
    request: str  # what MICROGPT_TEST_ENGINE asked for: cpu, cuda or a path
    path: Path  # the binary (absent when `problem` says so)
    kind: str  # what the proxy reports in .state.json: cpu, cuda or custom (a path)
    problem: str | None  # one line: why this engine cannot run here, or None

    @property
    def flag(self) -> str:
        """The `proxy run --engine` value."""
        return self.request if self.kind in ("cpu", "cuda") else str(self.path)

    @property
    def build(self) -> str | None:
        """cpu or cuda: what the binary was built as (a path's too, by its --version); None if unknown."""
        if self.kind in ("cpu", "cuda"):
            return self.kind
        return None if self.problem else built_as(self.path)


@functools.cache
def built_as(path: Path) -> str | None:
    """cpu or cuda, from `ENGINE --version` (`microgpt engine 0.1.0 (cpu; ...)`); None if it does not say."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"microgpt engine \S+ \((cpu|cuda);", out)
    return m.group(1) if m else None


def engine_under_test(environ=os.environ) -> EngineUnderTest:
    request = environ.get(ENV, "").strip() or "cpu"
    kind = request if request in ("cpu", "cuda") else "custom"
    path = engine_binary(request)
    if request == "auto":
        return EngineUnderTest(
            request,
            path,
            kind,
            f"{ENV}=auto: name the engine (cpu, cuda or a path); a test never picks one by what the machine has",
        )
    try:
        choice = choose_engine(request)
    except EngineError as exc:
        return EngineUnderTest(request, path.resolve(), kind, f"{ENV}={request}: {exc}")
    if choice.kind == "cuda" and not gpu_visible():
        return EngineUnderTest(
            request,
            choice.path,
            kind,
            f"{ENV}=cuda: no NVIDIA GPU visible (no /dev/nvidia0, and `nvidia-smi -L` lists none)",
        )
    return EngineUnderTest(request, choice.path, choice.kind, None)
