"""The CUDA kernels on the CPU (tests/cuda_cpu): builds the checks in both
variants (build.py: hazard, asan) once per session and runs them side by
side; the tests read the results. Needs only the host compilers: no nvcc, no
GPU."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cuda_cpu import build as builder

RUN_TIMEOUT = 420.0


@dataclass(frozen=True)
class OutputError:
    """One output's errors against the reference, and the bounds they are held to."""

    norm: float | None
    row: float | None
    bound: float
    row_bound: float


@dataclass(frozen=True)
class CaseResult:
    """One line of cuda_cpu_check's output (cuda_cpu_check.cpp)."""

    case: str
    kernels: list[str]
    errors: dict[str, OutputError]
    failures: list[str]
    runs: int
    bitwise_repeat: bool | None
    hazards: int | None
    hazard_reports: list[str]
    differs: str | None = None

    @classmethod
    def parse(cls, line: str) -> CaseResult:
        doc = json.loads(line)
        doc["errors"] = {k: OutputError(**v) for k, v in doc["errors"].items()}
        return cls(**doc)


@dataclass
class CheckRun:
    """One run of a check binary: its cases, exit status, stderr, seconds."""

    variant: str
    binary: Path
    returncode: int
    stderr: str
    seconds: float
    cases: list[CaseResult] = field(default_factory=list)


def run_checks(binary: Path, variant: str, args: list[str], timeout: float = RUN_TIMEOUT) -> CheckRun:
    start = time.monotonic()
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout)
    run = CheckRun(variant, binary, out.returncode, out.stderr[-6000:], time.monotonic() - start)
    run.cases = [CaseResult.parse(line) for line in out.stdout.splitlines() if line.strip()]
    return run


@pytest.fixture(scope="session")
def kernel_checks() -> dict[str, CheckRun]:
    """Both variants built and run: hazard twice per case (in order, then
    reversed), asan once."""
    try:
        binaries = dict(
            zip(builder.VARIANTS, builder.build_all([builder.plan(v) for v in builder.VARIANTS]), strict=False)
        )
    except builder.BuildError as exc:
        pytest.fail(f"building the kernel checks failed: {exc}", pytrace=False)
    runs = {"hazard": ["--runs", "2"], "asan": ["--runs", "1"]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(runs, pool.map(lambda v: run_checks(binaries[v], v, runs[v]), runs), strict=False))
    return done
