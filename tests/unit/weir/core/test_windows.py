from __future__ import annotations

import pickle
import random

import pytest

from weir.core.windows import (
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    cleanup_time,
    is_window_late,
    window_fires,
    window_start,
)


def test_time_window_value() -> None:
    window = TimeWindow(0, 1000)
    assert window.max_timestamp == 999
    assert window == TimeWindow(0, 1000)
    assert hash(window) == hash(TimeWindow(0, 1000))
    assert sorted([TimeWindow(5, 10), TimeWindow(0, 10)]) == [TimeWindow(0, 10), TimeWindow(5, 10)]
    assert str(window) == "[0, 1000)"
    with pytest.raises(AttributeError):
        window.start = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("timestamp", "offset", "size", "start"),
    [
        (0, 0, 1000, 0),
        (999, 0, 1000, 0),
        (1000, 0, 1000, 1000),
        (-1, 0, 1000, -1000),
        (-1000, 0, 1000, -1000),
        (-1001, 0, 1000, -2000),
        (150, 100, 1000, 100),
        (99, 100, 1000, -900),
        (5, -100, 1000, -100),
        (1_700_000_123_456, 0, 60_000, 1_700_000_100_000),
    ],
)
def test_window_start(timestamp: int, offset: int, size: int, start: int) -> None:
    assert window_start(timestamp, offset, size) == start


def test_tumbling_assigns_the_one_containing_window() -> None:
    assigner = TumblingEventTimeWindows(1000)
    assert assigner.assign(0) == (TimeWindow(0, 1000),)
    assert assigner.assign(999) == (TimeWindow(0, 1000),)
    assert assigner.assign(1000) == (TimeWindow(1000, 2000),)
    assert assigner.assign(-1) == (TimeWindow(-1000, 0),)
    assert assigner.assign(-1000) == (TimeWindow(-1000, 0),)
    assert assigner.assign(-1001) == (TimeWindow(-2000, -1000),)


def test_tumbling_with_offset() -> None:
    assigner = TumblingEventTimeWindows(1000, offset_ms=250)
    assert assigner.assign(250) == (TimeWindow(250, 1250),)
    assert assigner.assign(249) == (TimeWindow(-750, 250),)
    negative = TumblingEventTimeWindows(1000, offset_ms=-250)
    assert negative.assign(0) == (TimeWindow(-250, 750),)


@pytest.mark.parametrize(("size", "offset"), [(1, 0), (7, 3), (1000, 0), (1000, -999), (60_000, 17)])
def test_tumbling_randomized(size: int, offset: int) -> None:
    assigner = TumblingEventTimeWindows(size, offset)
    rng = random.Random(size)
    for _ in range(2000):
        timestamp = rng.randint(-(10**13), 10**13) if rng.random() < 0.5 else rng.randint(-3 * size, 3 * size)
        (window,) = assigner.assign(timestamp)
        assert window.start <= timestamp <= window.max_timestamp
        assert window.end - window.start == size
        assert (window.start - offset) % size == 0


def test_sliding_windows() -> None:
    assigner = SlidingEventTimeWindows(size_ms=1000, slide_ms=250)
    assert assigner.assign(0) == (
        TimeWindow(0, 1000),
        TimeWindow(-250, 750),
        TimeWindow(-500, 500),
        TimeWindow(-750, 250),
    )
    assert assigner.assign(-1) == (
        TimeWindow(-250, 750),
        TimeWindow(-500, 500),
        TimeWindow(-750, 250),
        TimeWindow(-1000, 0),
    )


@pytest.mark.parametrize(
    ("size", "slide", "offset"),
    [(1000, 250, 0), (1000, 1000, 0), (1000, 100, 50), (900, 300, -299), (1000, 300, 0), (10, 1, 0)],
)
def test_sliding_randomized(size: int, slide: int, offset: int) -> None:
    assigner = SlidingEventTimeWindows(size, slide, offset)
    rng = random.Random(size * slide)
    expected_count = -(-size // slide)
    for _ in range(2000):
        timestamp = rng.randint(-(10**12), 10**12) if rng.random() < 0.5 else rng.randint(-3 * size, 3 * size)
        windows = assigner.assign(timestamp)
        if size % slide == 0:
            assert len(windows) == size // slide
        else:
            assert len(windows) in (expected_count - 1, expected_count)
        assert len(set(windows)) == len(windows)
        for window in windows:
            assert window.start <= timestamp <= window.max_timestamp
            assert window.end - window.start == size
            assert (window.start - offset) % slide == 0
        assert [w.start for w in windows] == sorted((w.start for w in windows), reverse=True)


def test_cached_assignment_is_consistent_when_jumping_back_and_forth() -> None:
    tumbling = TumblingEventTimeWindows(100)
    sliding = SlidingEventTimeWindows(100, 50)
    for timestamp in (5, 7, 150, 6, 99, 100, -1, 5):
        assert tumbling.assign(timestamp) == (
            TimeWindow(window_start(timestamp, 0, 100), window_start(timestamp, 0, 100) + 100),
        )
        latest = window_start(timestamp, 0, 50)
        assert sliding.assign(timestamp) == (TimeWindow(latest, latest + 100), TimeWindow(latest - 50, latest + 50))


@pytest.mark.parametrize(
    "make",
    [
        lambda: TumblingEventTimeWindows(0),
        lambda: TumblingEventTimeWindows(-5),
        lambda: TumblingEventTimeWindows(100, 100),
        lambda: TumblingEventTimeWindows(100, -100),
        lambda: SlidingEventTimeWindows(0, 10),
        lambda: SlidingEventTimeWindows(100, 0),
        lambda: SlidingEventTimeWindows(100, 10, 10),
    ],
)
def test_invalid_assigners_are_rejected(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_assigners_are_values_and_survive_pickling() -> None:
    tumbling = TumblingEventTimeWindows(1000, 10)
    tumbling.assign(123_456)
    assert tumbling == TumblingEventTimeWindows(1000, 10)
    assert tumbling != TumblingEventTimeWindows(1000)
    assert hash(tumbling) == hash(TumblingEventTimeWindows(1000, 10))
    assert pickle.loads(pickle.dumps(tumbling)) == tumbling
    assert pickle.loads(pickle.dumps(tumbling)).assign(5) == (TimeWindow(-990, 10),)
    sliding = SlidingEventTimeWindows(1000, 500, 10)
    sliding.assign(77)
    copy = pickle.loads(pickle.dumps(sliding))
    assert copy == sliding and hash(copy) == hash(sliding)
    assert copy.assign(5) == sliding.assign(5)
    assert repr(sliding) == "SlidingEventTimeWindows(size_ms=1000, slide_ms=500, offset_ms=10)"


def test_window_fires_when_watermark_reaches_max_timestamp() -> None:
    window = TimeWindow(0, 1000)
    assert not window_fires(window, 998)
    assert window_fires(window, 999)
    assert window_fires(window, 5000)


def test_lateness() -> None:
    window = TimeWindow(0, 1000)
    assert not is_window_late(window, watermark=998, allowed_lateness_ms=0)
    assert is_window_late(window, watermark=999, allowed_lateness_ms=0)
    assert not is_window_late(window, watermark=1498, allowed_lateness_ms=500)
    assert is_window_late(window, watermark=1499, allowed_lateness_ms=500)
    assert cleanup_time(window, 500) == 1499


def test_cumulative_windows_are_every_grown_prefix_holding_the_timestamp() -> None:
    """Against the definition: the windows [start, start + k * step) of the aligned window of the
    size that contain the timestamp, for every timestamp of a few windows (negative ones too)."""
    from weir.core.windows import CumulativeEventTimeWindows

    for size, step in ((12, 3), (10, 10), (8, 1)):
        assigner = CumulativeEventTimeWindows(size, step)
        for ts in range(-3 * size, 3 * size):
            start = (ts // size) * size
            expected = {
                TimeWindow(start, start + k * step) for k in range(1, size // step + 1) if ts < start + k * step
            }
            assert set(assigner.assign(ts)) == expected, (size, step, ts)
            assert len(assigner.assign(ts)) == len(expected)


@pytest.mark.parametrize(("size", "step"), [(10, 3), (0, 1), (10, 0), (10, -5)])
def test_cumulative_windows_refuse_a_size_not_a_multiple_of_a_positive_step(size: int, step: int) -> None:
    from weir.core.windows import CumulativeEventTimeWindows

    with pytest.raises(ValueError, match="cumulative windows need a positive step"):
        CumulativeEventTimeWindows(size, step)
