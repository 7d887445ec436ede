"""Fixtures and collection rules of every suite."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.engine import LIVE

_STARTED = time.time()

TESTS = Path(__file__).resolve().parent
# The suites whose tests share a build directory (cuda_cpu: build/cuda_cpu) or one session's results and
# reference run (faults: its results file, the kill count): under `pytest -n N --dist loadgroup` (`make
# test`) all the tests of one such suite run in the same worker, in order.
ONE_WORKER_SUITES = ("cuda_cpu", "faults")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its hook adds them to the node ids)
def pytest_collection_modifyitems(items):
    for item in items:
        suite = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        if suite in ONE_WORKER_SUITES:
            item.add_marker(pytest.mark.xdist_group(suite))


@pytest.fixture(autouse=True)
def _no_process_left():
    """The children (harness.engine.Child) a test started and left running, because a check failed before
    the test stopped them, are killed when it ends: none outlives its test. Those of a fixture of wider scope
    started before the test and are left alone."""
    started = len(LIVE)
    yield
    for child in LIVE[started:]:
        child.kill()
    del LIVE[started:]


def pytest_terminal_summary(terminalreporter):
    """The kill count of the fault suite, when it ran in this session: one line per kill storm and the
    total of `kill -9` faults injected and survived, read back from the results file its conftest wrote."""
    from faults import scenarios

    try:
        doc = json.loads(scenarios.results_path().read_text())
    except (OSError, ValueError):
        return
    storms = [o for o in doc.get("outcomes", []) if scenarios.is_kill(o)]
    if doc.get("started", 0) < _STARTED or not storms:
        return  # an earlier session's, or no kill storm ran
    machine = doc.get("machine", {})
    gpu = f" on {machine['gpu']}" if machine.get("gpu") else ""
    terminalreporter.write_sep("-", f"kill storms ({machine.get('engine_kind')} engine {machine.get('engine')}{gpu})")
    for o in storms:
        terminalreporter.write_line(
            f"{o['scenario']}: {o['injected']} kills, {o['survived']} survived, data lost {o['data_lost']}"
        )
    kills = scenarios.kill_counts(doc["outcomes"])
    terminalreporter.write_line(f"kill -9 faults: {kills['injected']} injected, {kills['survived']} survived")
