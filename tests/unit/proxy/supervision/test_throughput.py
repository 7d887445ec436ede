"""Throughput and ETA (supervision/throughput.py)."""

from __future__ import annotations

import pytest

from proxy.supervision.throughput import SMOOTHING_MEMORY, ThroughputMeter, smooth, smoothed_over


def test_rates_count_the_wall_clock_and_the_engine_apart():
    """10 steps of 1000 tokens, 0.5 s of compute each, 1 s apart, and a 5 s audit after step 5: the wall
    clock sees 14 s for the 9 intervals, the engine 4.5 s."""
    p = ThroughputMeter()
    t = 100.0
    for s in range(1, 11):
        t += 1.0 + (5.0 if s == 6 else 0.0)
        p.observe(t, 1000 * s, s, 4.0, ms=500.0)
    rates = p.rates(max_steps=20)
    assert rates.tokens_per_s == pytest.approx(9000 / 14.0)
    assert rates.engine_tokens_per_s == pytest.approx(9000 / 4.5)
    assert rates.eta_s == pytest.approx(10 * 14.0 / 9)  # the ETA runs at the wall-clock rate


def test_rates_window_spans_the_last_minutes():
    p = ThroughputMeter(window_s=60.0, window_steps=1000)
    for s in range(1, 301):  # a step a second, 100 ms of compute; a 20 s stall every 50 steps
        p.observe(s + 20.0 * (s // 50), 10 * s, s, 4.0, ms=100.0)
    (t0, _k, _s0, _ms), (t1, _k1, _s1, _ms1) = p.window[0], p.window[-1]
    assert t1 - t0 >= 60.0 and p.window[1][0] > t1 - 60.0  # just over a minute, no more
    assert p.window_ms == pytest.approx(100.0 * (len(p.window) - 1))
    short = ThroughputMeter(window_s=1e9, window_steps=5)
    for s in range(1, 12):
        short.observe(float(s), 10 * s, s, 4.0, ms=float(s))
    assert [e[2] for e in short.window] == [7, 8, 9, 10, 11] and short.window_ms == pytest.approx(8 + 9 + 10 + 11)
    assert ThroughputMeter().rates(10) == (None, None, None)


def test_a_clock_jump_is_not_an_interval():
    """Steps 1 s apart (0.5 s of compute) with the wall clock set a year ahead after step 10 and back two
    years after step 20: each jump counts as the step's compute time, so the rates and the ETA are the
    steady ones (never days, never unknown); a real 5-minute audit still counts in full."""
    steady = ThroughputMeter()
    jumped = ThroughputMeter()
    t = year = 365 * 86400.0
    for s in range(1, 31):
        t += 1.0
        steady.observe(t, 1000 * s, s, 4.0, ms=500.0)
        jumped.observe(t + (year if 10 < s <= 20 else -year if s > 20 else 0.0), 1000 * s, s, 4.0, ms=500.0)
    want = steady.rates(max_steps=130)
    got = jumped.rates(max_steps=130)
    assert want.eta_s == pytest.approx(100 * 29 / 29)
    assert got.eta_s is not None and got.eta_s == pytest.approx(100 * 28.0 / 29)  # two intervals became 0.5 s
    assert got.tokens_per_s == pytest.approx(29000 / 28.0)
    audit = ThroughputMeter(window_s=1e9)
    for s in range(1, 5):
        audit.observe(1000.0 + s + (300.0 if s > 2 else 0.0), 1000 * s, s, 4.0, ms=500.0)
    assert audit.rates(max_steps=4 + 3).eta_s == pytest.approx(3 * 303.0 / 3)


def test_time_between_launches_is_not_running_time():
    """Two launches of 10 steps, 1 s apart (0.5 s of compute each), with the run stopped 5 minutes between
    them: counted as a new launch, the stop adds only the first step's compute, so the rate is the running
    one; counted as an interval (what `proxy status` did), it drags the rate far down."""
    running, counted = ThroughputMeter(), ThroughputMeter()
    t = 1000.0
    for s in range(1, 21):
        t += 1.0 + (300.0 if s == 11 else 0.0)
        running.observe(t, 1000 * s, s, 4.0, ms=500.0, new_launch=s == 11)
        counted.observe(t, 1000 * s, s, 4.0, ms=500.0)
    assert running.rates(max_steps=20).tokens_per_s == pytest.approx(19000 / 18.5)
    assert counted.rates(max_steps=20).tokens_per_s < running.rates(max_steps=20).tokens_per_s / 10


def test_the_smoothed_loss_rebuilt_from_the_log_is_the_one_fed_since_step_one():
    """A meter restarted at step 600 with the smoothed loss of the last SMOOTHING_MEMORY logged losses carries
    on bit for bit like one fed every step (the resume's rule); restarted from the raw loss, it would not."""
    losses = [8.0 - 4.0 * s / 1000 + (0.3 if s % 7 == 0 else 0.0) for s in range(1, 1001)]
    whole = ThroughputMeter()
    for s, loss in enumerate(losses, 1):
        whole.observe(float(s), s, s, loss)
    resumed = ThroughputMeter()
    resumed.restart(losses[599], smoothed_over(losses[600 - SMOOTHING_MEMORY : 600]))
    for s, loss in enumerate(losses[600:], 601):
        resumed.observe(float(s), s, s, loss)
        if s == 601:
            assert resumed.smoothed == smoothed_over(losses[:601]) != smooth(losses[599], loss)
    assert resumed.smoothed == whole.smoothed == smoothed_over(losses)
