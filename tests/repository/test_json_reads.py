"""Every JSON the proxy and the dashboard read goes through proxy/formats/bounded_json.py:
Python's json module recurses once per `[`, so a 200,000-deep line under any size cap would otherwise be a
RecursionError, which no handler of malformed JSON catches. This scans proxy/ and dashboard/ for any other
JSON parser call; the few that remain are listed here, each with why it is safe."""

from __future__ import annotations

import ast
from pathlib import Path

from proxy.formats import bounded_json

ROOT = Path(__file__).resolve().parents[2]
PARSERS = {"json": {"load", "loads", "JSONDecoder"}, "orjson": {"loads"}, "_orjson": {"loads"}}

# (file, the call as written) -> why it may parse without bounded_json
ALLOWED = {
    ("proxy/formats/bounded_json.py", "json.loads"): "the one loader itself, after its depth check",
    ("dashboard/log_follower.py", "_orjson.loads"): "orjson parses without recursing in Python and refuses "
    "nesting past 1024 with its JSONDecodeError, a ValueError "
    "the follower takes as a damaged line",
}


def calls_in(source: str, rel: str) -> list[tuple[str, str, int]]:
    """(rel, `module.function`, line) of every JSON parser call or import of one in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, rel)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in PARSERS.get(node.value.id, ())
        ):
            found.append((rel, f"{node.value.id}.{node.attr}", node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module in PARSERS:
            found += [
                (rel, f"{node.module}.{a.name}", node.lineno) for a in node.names if a.name in PARSERS[node.module]
            ]
    return found


def parser_calls() -> list[tuple[str, str, int]]:
    """calls_in every module of proxy/ and dashboard/."""
    return [
        call
        for top in ("proxy", "dashboard")
        for path in sorted((ROOT / top).rglob("*.py"))
        for call in calls_in(path.read_text(), str(path.relative_to(ROOT)))
    ]


def test_every_json_read_is_bounded():
    calls = parser_calls()
    assert any(call[:2] in ALLOWED for call in calls), "the scan found none of the allowed calls: it scans nothing"
    stray = [f"{f}:{line}: {call}" for f, call, line in calls if (f, call) not in ALLOWED]
    assert not stray, (
        f"JSON parsed without proxy/formats/bounded_json.py (a deep nesting would be a RecursionError): {stray}"
    )


def test_the_scan_sees_a_stray_call():
    """The scan's own check: the calls it must find are found."""
    source = (
        "import json\nx = json.loads(data)\nfrom json import load\ny = orjson.loads(b)\nz = bounded_json.loads(c)\n"
    )
    assert sorted(calls_in(source, "x.py")) == [
        ("x.py", "json.load", 3),
        ("x.py", "json.loads", 2),
        ("x.py", "orjson.loads", 4),
    ]


def test_the_limit_is_exact():
    """Depth MAX_DEPTH parses; one more is TooDeep, a json.JSONDecodeError; brackets in strings do not count;
    200,000 deep is refused without recursing."""
    limit = bounded_json.MAX_DEPTH
    assert bounded_json.loads("[" * limit + "]" * limit) is not None
    for deep in (
        "[" * (limit + 1) + "]" * (limit + 1),
        '{"a": ' * (limit + 1) + "1" + "}" * (limit + 1),
        "[" * 200_000 + "]" * 200_000,
    ):
        try:
            bounded_json.loads(deep)
        except bounded_json.TooDeep as exc:
            assert isinstance(exc, ValueError) and "nested deeper than" in str(exc)
        else:
            raise AssertionError("too deep, not refused")
    text = '{"s": "' + "[" * 1000 + '\\"' + "{" * 1000 + '"}'
    assert bounded_json.depth(text) == 1 and bounded_json.loads(text)["s"].startswith("[[")
    assert bounded_json.loads(b'[1, {"a": [2]}]') == [1, {"a": [2]}]
