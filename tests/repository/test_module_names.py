"""Names say what a module is: no two modules of proxy/ and dashboard/ share a name (a package's
`__init__.py` and `__main__.py` aside), so a name in a traceback, a doc or a grep means one file."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = {"__init__.py", "__main__.py"}


def modules_by_name() -> dict[str, list[str]]:
    found = defaultdict(list)
    for top in ("proxy", "dashboard"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name not in PACKAGE_FILES:
                found[path.name].append(str(path.relative_to(ROOT)))
    return found


def test_no_two_modules_share_a_name():
    found = modules_by_name()
    assert len(found) > 50, "the scan found too few modules to mean anything"
    shared = {name: paths for name, paths in found.items() if len(paths) > 1}
    assert not shared, f"modules sharing a name: {shared}"
