"""No Python file of the test suite runs past 800 lines: a scenario module holds one kind of fault, a helper
module one job (tests/faults: scenarios.py the shared parts, engine_scenarios.py, proxy_scenarios.py,
proxy_harness.py, proxy_checks.py, ...)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 800


def test_no_test_module_over_the_limit():
    files = sorted((ROOT / "tests").rglob("*.py"))
    assert len(files) > 50
    long = {
        str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert not long, f"test modules over {LIMIT} lines: {long}"
