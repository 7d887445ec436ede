"""`eval_mixing.py --compare`: a mixing summary's results against another's, field by field, exactly.

What must reproduce bit for bit is everything a summary holds for a mix (the
losses, steps, shares and goals, each number as it was rounded into the JSON),
not its `how` block (the command, the machine, wall times, the load), which
is no part of a mix. Numbers are compared exactly: a summary is the same bits
or it is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CompareError(ValueError):
    """The summary to compare with is not one (unreadable, not JSON, no mixes); one line."""


def read_mixes(path: Path) -> dict[str, Any]:
    """The `mixes` of the summary at `path`."""
    try:
        mixes = json.loads(path.read_text())["mixes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CompareError(f"{path}: not a mixing summary ({e})") from None
    if not isinstance(mixes, dict):
        raise CompareError(f"{path}: not a mixing summary (its mixes are not an object)")
    return mixes


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def first_difference(ours: Any, theirs: Any, where: str = "") -> str | None:
    """Where two JSON values first differ (a dotted path, list items by index, and both values), or None.
    Keys are walked in our order, then the keys only theirs has; an int and a float of the same value differ
    (they are not the same JSON)."""
    if type(ours) is not type(theirs):
        return f"{where or 'the mix'}: {_show(ours)} here, {_show(theirs)} there"
    if isinstance(ours, dict):
        for key in [*ours, *(k for k in theirs if k not in ours)]:
            at = f"{where}.{key}" if where else str(key)
            if key not in theirs:
                return f"{at}: only here"
            if key not in ours:
                return f"{at}: only there"
            found = first_difference(ours[key], theirs[key], at)
            if found:
                return found
        return None
    if isinstance(ours, list):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        if len(ours) != len(theirs):
            return f"{where}: {len(ours)} items here, {len(theirs)} there"
        return None
    # a number's JSON text is its bits as the summary holds them (-0.0 is not 0.0)
    return None if json.dumps(ours) == json.dumps(theirs) else f"{where}: {_show(ours)} here, {_show(theirs)} there"


def compare_mixes(ours: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(mix, its first difference or None) for every mix of `ours`; a mix `theirs` lacks differs."""
    return [
        (name, "not in the other summary" if name not in theirs else first_difference(mix, theirs[name]))
        for name, mix in ours.items()
    ]
