"""The hang watchdog (supervision/watchdog.py), without an engine: a pause of the proxy is not the engine's
silence, a hang is confirmed by the engine's CPU time."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from types import SimpleNamespace

from proxy.supervision.watchdog import BUSY_FACTOR, PAUSE_S, Watchdog


def _segment(silent_s: float, **kw) -> SimpleNamespace:
    """What the watchdog reads of a segment: a step outstanding, ready, steps timed, silent for silent_s."""
    fields = dict(
        number=1,
        last_activity=time.monotonic() - silent_s,
        outstanding=deque([SimpleNamespace(kind="step", work=1.0)]),
        hung=False,
        killed=False,
        exit_reason=None,
        ready={},
        last_step_wall=1.0,
        ckpt_pending=False,
        step_walls=deque([0.01] * 5),
    )
    fields.update(kw)
    seg = SimpleNamespace(**fields)
    seg.excuse_silence = lambda s: setattr(seg, "last_activity", seg.last_activity + s)
    return seg


def _cpu(values):
    it = iter(values)
    return lambda: next(it)


def test_a_pause_of_the_proxy_is_not_the_engines_silence():
    dog = Watchdog(5.0, 0.2)
    seg = _segment(21.0)  # silent since 1 s before the proxy was stopped for 20 s
    start = time.monotonic()
    dog.look(seg, start - 20.0)  # the last look before the stop
    credit = dog.look(seg, start)
    assert 19.0 < credit < 20.0 and dog.quiet(seg, start) < 2.0
    assert not dog.hung(seg, 0.0, False, _cpu([0.0, 0.0]))
    # a short gap (a loop iteration, a busy machine) is the engine's silence as before
    assert dog.look(seg, start + PAUSE_S - 0.1) == 0.0


def test_a_pause_is_said_even_when_an_event_ended_the_silence():
    """The loop handles an event read the moment the proxy runs again before it looks at the watchdog: the
    engine's silence is over (nothing to take off it), yet the proxy was stopped, and the look says how long."""
    dog = Watchdog(5.0, 0.2)
    start = time.monotonic()
    seg = _segment(0.0)
    dog.look(seg, start - 15.0)  # the last look before the stop
    seg.last_activity = start  # the event written while the proxy was stopped, handled first
    paused = dog.look(seg, start)
    assert 14.0 < paused < 15.0 and dog.paused_s == 0.0 and dog.quiet(seg, start) == 0.0


def test_hang_confirmed_by_cpu_time():
    # stopped or blocked: no CPU between the halfway sample and the end of the allowance: hung
    dog = Watchdog(5.0, 0.2)
    seg = _segment(3.0)
    assert not dog.hung(seg, 0.0, False, _cpu([10.0]))  # the halfway sample
    seg.last_activity -= 3.0  # three seconds later, silent for 6 s
    dog.sample = replace(dog.sample, at=dog.sample.at - 3.0, silence_from=seg.last_activity)
    assert dog.hung(seg, 0.0, False, _cpu([10.0])) and "no CPU" in dog.verdict
    # computing: one more allowance, then hung whatever the CPU does
    dog = Watchdog(5.0, 0.2)
    seg = _segment(3.0)
    dog.hung(seg, 0.0, False, _cpu([10.0]))
    seg.last_activity -= 3.0
    dog.sample = replace(dog.sample, at=dog.sample.at - 3.0, silence_from=seg.last_activity)
    assert not dog.hung(seg, 0.0, False, _cpu([13.0]))
    seg.last_activity -= BUSY_FACTOR * 5.0
    dog.sample = replace(dog.sample, silence_from=seg.last_activity)
    assert dog.hung(seg, 0.0, False, _cpu([30.0])) and "computing" in dog.verdict
    # an event read but not yet handled is never a hang
    assert not Watchdog(5.0, 0.2).hung(_segment(60.0), 0.0, True, _cpu([]))
