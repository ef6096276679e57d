"""The shares of a task's time between two snapshots of its running totals."""

from __future__ import annotations

import pytest

from weir.core.task_time import TimeRatios, TimeTotals, ratios_between


def test_the_shares_of_an_interval_add_up_to_one() -> None:
    earlier = TimeTotals(busy_s=1.0, backpressured_s=2.0, idle_s=3.0)
    later = TimeTotals(busy_s=1.5, backpressured_s=3.0, idle_s=3.5)
    assert ratios_between(earlier, later) == TimeRatios(busy=0.25, backpressured=0.5, idle=0.25)


def test_no_time_accounted_is_no_measurement() -> None:
    totals = TimeTotals(busy_s=1.0, backpressured_s=0.0, idle_s=2.0)
    assert ratios_between(totals, totals) is None
    assert ratios_between(TimeTotals(), TimeTotals()) is None


@pytest.mark.parametrize(
    ("later", "expected"),
    [
        (TimeTotals(busy_s=2.0, backpressured_s=0.0, idle_s=0.0), TimeRatios(1.0, 0.0, 0.0)),
        (TimeTotals(busy_s=1.0, backpressured_s=0.0, idle_s=4.0), TimeRatios(0.0, 0.0, 1.0)),
    ],
)
def test_a_total_that_went_back_counts_as_nothing(later: TimeTotals, expected: TimeRatios) -> None:
    """Totals never decrease; should one (a new attempt's task), its share is 0, never negative."""
    assert ratios_between(TimeTotals(busy_s=1.0, backpressured_s=1.0, idle_s=1.0), later) == expected
