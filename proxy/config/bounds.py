"""The rules a set of caps and floors must follow, written once.

Every arm's weight is kept in [floor, cap], and the weights sum to 1, so the
set of allowed mixtures (the capped simplex) is empty unless each floor is at
most its cap, the floors sum to at most 1 and the caps to at least 1. The
experiment file, caps files, pivot requests and the bandit all check these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

TOLERANCE = 1e-9  # sums within this of 1 count as 1


def cap_below_floor(cap: float, floor: float) -> str | None:
    """The problem with one arm's bounds, or None."""
    return f"cap {cap:g} is below floor {floor:g}" if cap < floor else None


def range_problems(caps: Mapping[str, float], floors: Mapping[str, float]) -> list[str]:
    """Values outside [0, 1] (NaN included), named `caps.<arm>` / `floors.<arm>`."""
    return [
        f"{kind}.{arm}: {value:g} is outside [0, 1]"
        for kind, values in (("caps", caps), ("floors", floors))
        for arm, value in values.items()
        if not 0.0 <= value <= 1.0
    ]


def check_caps_floors(caps: Mapping[str, float], floors: Mapping[str, float]) -> list[str]:
    """Problems that make the capped simplex empty: ranges, each arm, then the totals."""
    problems = range_problems(caps, floors)
    problems += [
        f"{arm}: {problem}" for arm in caps if (problem := cap_below_floor(caps[arm], floors[arm])) is not None
    ]
    total_floor = math.fsum(floors.values())
    if total_floor > 1 + TOLERANCE:
        problems.append(f"floors sum to {total_floor:g}, above 1")
    total_cap = math.fsum(caps.values())
    if total_cap < 1 - TOLERANCE:
        problems.append(f"caps sum to {total_cap:g}, below 1 (no mixture fits)")
    return problems
