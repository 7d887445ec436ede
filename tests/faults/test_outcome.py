"""The checks of a scenario are assertions: the first broken invariant fails the test where it is found,
and the outcome as it stood still reaches the reliability report."""

from __future__ import annotations

import pytest

from .scenarios import MADE, FaultCheckFailed, Outcome


def test_a_failed_check_fails_the_test_where_it_is():
    out = Outcome("a class", "a scenario")
    out.begin_fault()
    out.begin_fault()
    with pytest.raises(FaultCheckFailed, match="a scenario: the log lost step 7") as failed:
        out.fail("the log lost step 7", data_lost=1)
    assert failed.value.outcome is out and out in MADE
    assert (out.injected, out.survived, out.data_lost, out.failures) == (2, 1, 1, ["the log lost step 7"])
    with pytest.raises(AssertionError):
        out.check()


def test_a_failure_after_a_storm_fails_all_its_faults():
    out = Outcome("a class", "a storm", one_storm=True)
    for _ in range(5):
        out.begin_fault()
    with pytest.raises(FaultCheckFailed):
        out.fail("the final checkpoint differs from the reference")
    assert (out.injected, out.survived) == (5, 0)


def test_an_outcome_without_failures_passes():
    out = Outcome("a class", "a scenario")
    out.begin_fault()
    out.check()
    assert (out.injected, out.survived) == (1, 1)
