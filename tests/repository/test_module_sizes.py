"""No Python module of proxy/ or dashboard/ runs past 500 lines: a module holds one job, and a longer one is
split by job (as proxy/data/source_files.py and source_readers.py were), never by line count alone."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500


def test_no_product_module_over_the_limit():
    files = sorted(p for top in ("proxy", "dashboard") for p in (ROOT / top).rglob("*.py"))
    assert len(files) > 50, "the scan found too few modules to mean anything"
    long = {
        str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert not long, f"modules over {LIMIT} lines: {long}"
