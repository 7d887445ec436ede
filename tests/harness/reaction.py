"""The test's reaction delay: MICROGPT_TEST_REACTION_S seconds between seeing a trigger and acting on it.

Unset (the default) it is zero. Set, every wait in the end-to-end harness sleeps that long after
its condition holds, as if the engine were that much faster than the test: at 0.5 s the CPU engine
trains hundreds of TINY steps before the test acts. A suite that passes with it does not depend on
the engine's speed (docs/RELIABILITY.md, "Speed-independence").
"""

from __future__ import annotations

import os
import time

ENV = "MICROGPT_TEST_REACTION_S"


def reaction_delay(environ=os.environ) -> float:
    text = environ.get(ENV, "").strip()
    try:
        return max(0.0, float(text)) if text else 0.0
    except ValueError:
        raise ValueError(f"{ENV}={text!r} is not a number of seconds") from None


def react() -> None:
    """Called by every harness wait once its condition holds."""
    delay = reaction_delay()
    if delay:
        time.sleep(delay)
