"""The estimate a stop request is answered with (supervision/stop_notice.py), on each branch; the end-to-end
answer to a real SIGINT is tests/proxy_e2e/test_numbers_agree.py."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from proxy.supervision.launch import Outstanding
from proxy.supervision.stop_notice import _estimate, seconds


def launch(walls, last_wall, ready_at=None, head="step"):
    return SimpleNamespace(
        outstanding=deque([Outstanding(head, 7)]) if head else deque(),
        step_walls=deque(walls),
        last_step_wall=last_wall,
        ready_at=ready_at,
    )


def test_the_estimate_goes_by_the_median_of_the_last_steps():
    # an audit's long interval among the last 8 does not move the median; older intervals are not read
    walls = [100.0] * 10 + [11.0, 12.0, 10.0, 60.0, 11.0, 11.5, 10.5, 11.0]
    assert _estimate(launch(walls, 1000.0), 0.0, 1004.0) == "a step takes about 11s here, about 7.0s to go"
    assert _estimate(launch(walls, 1000.0), 900.0, 1030.0) == (
        "a step takes about 11s here, this one has taken 30s so far, then a checkpoint write (0.9s the slowest so far)"
    )


def test_the_first_step_of_a_launch_and_no_step_at_all():
    assert _estimate(launch([], 50.0, ready_at=20.0), 0.0, 55.0) == "a step takes about 30s here, about 25s to go"
    assert _estimate(launch([], None, ready_at=20.0), 0.0, 55.0) == (
        "no step of this launch has finished yet, so no estimate"
    )
    assert _estimate(launch([1.0], 50.0, head="sample"), 0.0, 55.0) == "no step to finish"
    assert _estimate(launch([1.0], 50.0, head=None), 120.0, 55.0) == (
        "no step to finish, then a checkpoint write (0.12s the slowest so far)"
    )


def test_durations_read_as_a_person_reads_them():
    assert [seconds(x) for x in (0.001, 0.0412, 0.5, 7.53, 42.2, 185.0)] == [
        "under 0.01s",
        "0.041s",
        "0.5s",
        "7.5s",
        "42s",
        "3m05s",
    ]
