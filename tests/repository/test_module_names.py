"""Names say what a module or a class is: no two modules of proxy/ and dashboard/ share a name (a package's
`__init__.py` and `__main__.py` aside), and no class name is defined twice in them, so a name in a traceback,
a doc or a grep means one thing."""

from __future__ import annotations

import ast
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


def classes_by_name() -> dict[str, list[str]]:
    """Every class defined in proxy/ and dashboard/ (nested ones and those inside functions too), by name."""
    found = defaultdict(list)
    for top in ("proxy", "dashboard"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_class_name_defined_twice():
    found = classes_by_name()
    assert len(found) > 100, "the scan found too few classes to mean anything"
    shared = {name: places for name, places in found.items() if len(places) > 1}
    assert not shared, f"class names defined more than once: {shared}"
