"""Window values without an operator: durations as timedelta, session merging, the new assigners."""

from __future__ import annotations

from datetime import timedelta

import pytest

from weir.core.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    merge_window,
    to_millis,
)


def test_a_duration_is_an_int_of_milliseconds_or_an_exact_timedelta() -> None:
    assert to_millis(250, "size") == 250
    assert to_millis(-5, "offset") == -5
    assert to_millis(timedelta(seconds=2), "size") == 2000
    assert to_millis(timedelta(minutes=1, milliseconds=3), "size") == 60_003
    assert to_millis(timedelta(milliseconds=-250), "offset") == -250
    assert to_millis(timedelta(0), "lateness") == 0
    with pytest.raises(ValueError, match="size must be a whole number of milliseconds"):
        to_millis(timedelta(microseconds=1500), "size")
    for wrong in (1.5, True, "10", None):
        with pytest.raises(TypeError, match="gap must be an int of milliseconds or a datetime.timedelta"):
            to_millis(wrong, "gap")  # type: ignore[arg-type]


def test_every_assigner_takes_timedelta_durations() -> None:
    assert TumblingEventTimeWindows(timedelta(seconds=1), timedelta(milliseconds=200)) == TumblingEventTimeWindows(
        1000, 200
    )
    assert SlidingEventTimeWindows(timedelta(seconds=10), timedelta(seconds=5), timedelta(seconds=1)) == (
        SlidingEventTimeWindows(10_000, 5000, 1000)
    )
    assert EventTimeSessionWindows(timedelta(seconds=3)) == EventTimeSessionWindows(3000)
    assert EventTimeSessionWindows.with_gap(timedelta(minutes=1)).gap_ms == 60_000
    assert EventTimeSessionWindows.with_gap(15) == EventTimeSessionWindows(15)
    assert TumblingProcessingTimeWindows(timedelta(seconds=1)) == TumblingProcessingTimeWindows(1000)
    assert TumblingProcessingTimeWindows(timedelta(seconds=1)) != TumblingEventTimeWindows(1000)
    with pytest.raises(ValueError, match="tumbling window offset must satisfy"):
        TumblingEventTimeWindows(timedelta(seconds=1), timedelta(seconds=1))
    with pytest.raises(ValueError, match="session gap must be > 0 ms"):
        EventTimeSessionWindows(timedelta(0))
    with pytest.raises(ValueError, match="tumbling window size must be > 0 ms"):
        TumblingProcessingTimeWindows(0)
    with pytest.raises(TypeError):
        SlidingEventTimeWindows(10, 2.5)  # type: ignore[arg-type]


def test_assigners_give_an_element_its_own_window() -> None:
    assert EventTimeSessionWindows(10).assign(-3) == (TimeWindow(-3, 7),)
    assert TumblingProcessingTimeWindows(10, 3).assign(12) == (TimeWindow(3, 13),)
    assert TumblingProcessingTimeWindows(10).assign(-1) == (TimeWindow(-10, 0),)
    assert repr(EventTimeSessionWindows(5)) == "EventTimeSessionWindows(gap_ms=5)"
    assert len({EventTimeSessionWindows(5), EventTimeSessionWindows(5), EventTimeSessionWindows(6)}) == 2


def test_windows_that_overlap_or_touch_intersect() -> None:
    a = TimeWindow(0, 10)
    assert a.intersects(TimeWindow(5, 15)) and TimeWindow(5, 15).intersects(a)
    assert a.intersects(TimeWindow(10, 20)) and TimeWindow(-10, 0).intersects(a)  # touching: Flink merges them
    assert not a.intersects(TimeWindow(11, 20)) and not TimeWindow(11, 20).intersects(a)
    assert a.intersects(TimeWindow(2, 3)) and TimeWindow(2, 3).intersects(a)
    assert a.cover(TimeWindow(20, 30)) == TimeWindow(0, 30)


def test_merge_window_absorbs_what_the_new_window_meets() -> None:
    sessions = [TimeWindow(30, 40), TimeWindow(0, 10), TimeWindow(15, 25)]
    assert merge_window(sessions, TimeWindow(50, 60)) == (TimeWindow(50, 60), ())
    assert merge_window([], TimeWindow(1, 2)) == (TimeWindow(1, 2), ())
    assert merge_window(sessions, TimeWindow(3, 8)) == (TimeWindow(0, 10), (TimeWindow(0, 10),))
    assert merge_window(sessions, TimeWindow(-5, 5)) == (TimeWindow(-5, 10), (TimeWindow(0, 10),))
    # bridging: touches [0, 10) and overlaps [15, 25), misses [30, 40) by one millisecond
    assert merge_window(sessions, TimeWindow(10, 29)) == (
        TimeWindow(0, 29),
        (TimeWindow(0, 10), TimeWindow(15, 25)),
    )
    assert merge_window(sessions, TimeWindow(9, 31)) == (
        TimeWindow(0, 40),
        (TimeWindow(0, 10), TimeWindow(15, 25), TimeWindow(30, 40)),
    )
