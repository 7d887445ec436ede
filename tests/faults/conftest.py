"""Fixtures of the fault-injection suite (tests/faults/).

- The seed: FAULT_SEED (default scenarios.DEFAULT_SEED), shown in the header and
  with every failure, so a failing run can be repeated with the same choices.
- `record(outcome)`: every scenario's outcome is kept and, at the end of the
  session, written as JSON to $FAULT_RESULTS (default
  test-artifacts/faults/results.json, results-cuda.json for the CUDA engine);
  scripts/reliability_report.py turns it into the tables of docs/RELIABILITY.md.
- `proxy_env`: the tiny fault experiment, its data, and one uninterrupted run
  of it (the reference every proxy-level scenario is compared with).
- `stopped_run`: a copy-on-use template of that experiment stopped halfway by
  SIGTERM, for the scenarios that damage a run directory and relaunch.
- `rank_env`: the data-parallel fault experiment (two micro-batches per step) and
  its uninterrupted run on 1 rank (rank_scenarios.py), the reference of every
  scenario on 2 ranks (rank kills, the kill storm on MICROGPT_TEST_RANKS ranks).
- The kill count: at the end of the session, one line per kill storm and the
  total of `kill -9` faults injected and survived, on the engine under test
  (MICROGPT_TEST_ENGINE; `make test-gpu` shows it for the CUDA engine),
  printed by tests/conftest.py from the results file (under `pytest -n` the
  outcomes are a worker's).

A missing engine binary is a failure with a clear message, never a skip.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import pytest

from . import proxy_harness, proxy_scenarios, rank_scenarios, scenarios

_OUTCOMES: list[dict] = []
_TEST_RESULTS: dict[str, str] = {}
_STARTED = time.time()


def pytest_report_header(config):
    return [f"fault injection: FAULT_SEED={scenarios.fault_seed()} (set FAULT_SEED to change or reproduce)"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not item.nodeid.startswith("tests/faults/") and "/faults/" not in str(item.fspath):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _TEST_RESULTS[node_id(item)] = report.outcome
    if report.failed:
        seed = scenarios.fault_seed()
        report.sections.append(
            ("fault seed", f"FAULT_SEED={seed}\nreproduce: FAULT_SEED={seed} python -m pytest '{node_id(item)}'")
        )


def node_id(item) -> str:
    """The test's node id without the `@group` that `pytest -n --dist loadgroup` appends (tests/conftest.py)."""
    return item.nodeid.partition("@")[0]


def pytest_sessionfinish(session, exitstatus):
    if not _OUTCOMES and not _TEST_RESULTS:
        return
    path = scenarios.results_path()
    for o in _OUTCOMES:
        o["test_outcome"] = _TEST_RESULTS.get(o["test"], "unknown")
    engine = scenarios.ENGINE
    doc = {
        "seed": scenarios.fault_seed(),
        "started": _STARTED,
        "seconds": round(time.time() - _STARTED, 1),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "engine": str(engine.path),
            "engine_kind": engine.kind,
            "gpu": gpu_name(engine),
        },
        "tests": _TEST_RESULTS,
        "outcomes": _OUTCOMES,
        "kills": scenarios.kill_counts(_OUTCOMES),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, path)
    except OSError as exc:  # the results are a by-product; never fail the session over them
        print(f"\nfaults: cannot write {path}: {exc}")


def gpu_name(engine) -> str | None:
    """The GPU's name (nvidia-smi) where the engine under test is the CUDA one, else None."""
    if engine.kind != "cuda":
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return ", ".join(names) if out.returncode == 0 and names else None


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    engine = scenarios.ENGINE
    if engine.problem:
        pytest.fail(f"{engine.problem} (tests/faults needs an engine: `make cpu`)", pytrace=False)
    return engine.path


@pytest.fixture
def record(request):
    """record(outcome): keep the outcome for the results file, then return it. An outcome whose scenario a
    failed check ended (scenarios.FaultCheckFailed) is kept too, as it stood."""
    scenarios.MADE.clear()
    kept: list[scenarios.Outcome] = []

    def _record(outcome: scenarios.Outcome) -> scenarios.Outcome:
        outcome.close()
        d = outcome.to_dict()
        d["test"] = node_id(request.node)
        _OUTCOMES.append(d)
        kept.append(outcome)
        return outcome

    yield _record
    for outcome in scenarios.MADE:  # ended by a failed check before its scenario returned it
        if outcome.failures and not any(outcome is k for k in kept):
            _record(outcome)
    scenarios.MADE.clear()


@pytest.fixture(scope="session")
def proxy_env(engine_bin, tmp_path_factory) -> proxy_harness.ProxyEnv:
    return proxy_harness.prepare_proxy_env(tmp_path_factory.mktemp("faults-proxy"))


@pytest.fixture(scope="session")
def stopped_run(proxy_env, tmp_path_factory) -> Path:
    """A run of the fault experiment stopped at step >= 20 by SIGTERM (copy it before damaging it)."""
    return proxy_scenarios.make_partial_run(proxy_env, tmp_path_factory.mktemp("faults-stopped") / "run")


@pytest.fixture(scope="session")
def rank_env(tmp_path_factory) -> proxy_harness.ProxyEnv:
    """Skipped without mpirun (as tests/distributed is); a failure when mpirun is there and the MPI engine
    is not built."""
    problem = rank_scenarios.mpi_engine_problem()
    if problem is not None and problem.startswith("mpirun"):
        pytest.skip(problem)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    return rank_scenarios.prepare_rank_env(tmp_path_factory.mktemp("faults-ranks"))
