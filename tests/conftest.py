"""Fixtures of every suite."""
from __future__ import annotations

import pytest

from harness.engine import LIVE


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
