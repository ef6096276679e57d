from __future__ import annotations

import random

import pytest

from weir.errors import ProtocolError
from weir.ids import ChannelIndex
from weir.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    BoundedOutOfOrdernessWatermarks,
    ChannelStatus,
    WatermarkTracker,
)

C0, C1, C2 = ChannelIndex(0), ChannelIndex(1), ChannelIndex(2)


def test_bounded_out_of_orderness_generator() -> None:
    generator = BoundedOutOfOrdernessWatermarks(100)
    assert generator.current_watermark() == MIN_WATERMARK
    assert generator.poll() is None
    generator.on_event(1000)
    assert generator.current_watermark() == 899
    generator.on_event(950)
    assert generator.current_watermark() == 899
    assert generator.poll() == 899
    assert generator.poll() is None
    generator.on_event(2000)
    assert generator.poll() == 1899


def test_generator_handles_negative_and_zero_bound() -> None:
    generator = BoundedOutOfOrdernessWatermarks(0)
    generator.on_event(-5000)
    assert generator.current_watermark() == -5001
    with pytest.raises(ValueError):
        BoundedOutOfOrdernessWatermarks(-1)


def test_generator_is_monotonic_on_random_input() -> None:
    rng = random.Random(7)
    generator = BoundedOutOfOrdernessWatermarks(50)
    previous = generator.current_watermark()
    newest = None
    for _ in range(5000):
        timestamp = rng.randint(-1000, 100_000)
        generator.on_event(timestamp)
        newest = timestamp if newest is None else max(newest, timestamp)
        current = generator.current_watermark()
        assert current >= previous
        assert current == newest - 51
        previous = current


def test_combined_is_min_over_channels() -> None:
    tracker = WatermarkTracker(3)
    assert tracker.current == MIN_WATERMARK
    assert tracker.on_watermark(C0, 100) is None
    assert tracker.on_watermark(C1, 50) is None
    assert tracker.on_watermark(C2, 70) == 50
    assert tracker.on_watermark(C1, 80) == 70
    assert tracker.on_watermark(C2, 90) == 80
    assert tracker.on_watermark(C0, 60) is None  # stale on its channel
    assert tracker.channel_watermark(C0) == 100
    assert tracker.current == 80


def test_end_of_stream_counts_as_max() -> None:
    tracker = WatermarkTracker(2)
    tracker.on_watermark(C0, 10)
    tracker.on_watermark(C1, 20)
    assert tracker.current == 10
    assert tracker.on_end_of_stream(C0) == 20
    assert not tracker.all_ended
    assert tracker.on_end_of_stream(C1) == MAX_WATERMARK
    assert tracker.all_ended
    assert tracker.current == MAX_WATERMARK
    with pytest.raises(ProtocolError, match="after its end of stream"):
        tracker.on_watermark(C0, 30)
    with pytest.raises(ProtocolError, match="second end of stream"):
        tracker.on_end_of_stream(C0)


def test_idle_channel_does_not_hold_back_the_others() -> None:
    tracker = WatermarkTracker(2)
    tracker.on_watermark(C0, 100)
    assert tracker.current == MIN_WATERMARK
    assert tracker.mark_idle(C1) == 100
    assert tracker.mark_idle(C1) is None
    assert tracker.on_watermark(C0, 200) == 200
    assert tracker.channel_status(C1) is ChannelStatus.IDLE
    # The resumed channel is behind: it is left out until it catches up.
    assert tracker.on_watermark(C1, 150) is None
    assert tracker.channel_status(C1) is ChannelStatus.ACTIVE
    assert tracker.on_watermark(C0, 300) == 300
    assert tracker.on_watermark(C1, 320) is None
    assert tracker.on_watermark(C0, 400) == 320


def test_all_idle_moves_to_highest_idle_watermark() -> None:
    tracker = WatermarkTracker(3)
    tracker.on_watermark(C0, 10)
    tracker.on_watermark(C1, 30)
    tracker.on_watermark(C2, 20)
    assert tracker.mark_idle(C0) == 20
    assert tracker.mark_idle(C2) == 30
    assert not tracker.is_idle
    assert tracker.mark_idle(C1) is None
    assert tracker.is_idle
    tracker.mark_active(C0)
    assert not tracker.is_idle
    assert tracker.on_watermark(C0, 40) == 40


def test_idle_and_ended_channels() -> None:
    tracker = WatermarkTracker(2)
    tracker.on_watermark(C0, 10)
    assert tracker.mark_idle(C0) is None  # C1 is still active at MIN_WATERMARK
    assert tracker.on_end_of_stream(C1) == 10  # only the idle C0 is left: its watermark
    assert tracker.is_idle
    assert tracker.on_end_of_stream(C0) == MAX_WATERMARK
    with pytest.raises(ProtocolError):
        tracker.mark_idle(C0)
    with pytest.raises(ProtocolError):
        tracker.mark_active(C0)


def test_invalid_channels_and_sizes() -> None:
    with pytest.raises(ValueError):
        WatermarkTracker(0)
    tracker = WatermarkTracker(2)
    with pytest.raises(ValueError, match="input channel"):
        tracker.on_watermark(ChannelIndex(2), 5)
    with pytest.raises(ValueError, match="input channel"):
        tracker.on_watermark(ChannelIndex(-1), 5)


def test_randomized_monotonic_and_never_ahead_of_active_channels() -> None:
    rng = random.Random(42)
    for _ in range(200):
        channels = rng.randint(1, 6)
        tracker = WatermarkTracker(channels)
        emitted = [MIN_WATERMARK]
        for _ in range(200):
            channel = ChannelIndex(rng.randrange(channels))
            status = tracker.channel_status(channel)
            action = rng.random()
            if status is ChannelStatus.ENDED:
                continue
            if action < 0.75:
                result = tracker.on_watermark(channel, tracker.channel_watermark(channel) + rng.randint(-20, 50))
            elif action < 0.85:
                result = tracker.mark_idle(channel)
            elif action < 0.95:
                tracker.mark_active(channel)
                result = None
            else:
                result = tracker.on_end_of_stream(channel)
            if result is not None:
                assert result > emitted[-1]
                emitted.append(result)
            assert tracker.current == emitted[-1]
            statuses = [tracker.channel_status(ChannelIndex(c)) for c in range(channels)]
            if ChannelStatus.ACTIVE not in statuses and ChannelStatus.IDLE not in statuses:
                assert tracker.current == MAX_WATERMARK
        for index in range(channels):
            if tracker.channel_status(ChannelIndex(index)) is not ChannelStatus.ENDED:
                tracker.on_end_of_stream(ChannelIndex(index))
        assert tracker.current == MAX_WATERMARK
        assert tracker.all_ended


def test_combined_never_passes_a_channel_that_was_always_active() -> None:
    rng = random.Random(3)
    tracker = WatermarkTracker(4)
    latest = [MIN_WATERMARK] * 4
    for _ in range(2000):
        channel = rng.randrange(4)
        latest[channel] = max(latest[channel], latest[channel] + rng.randint(-5, 30))
        if latest[channel] == MIN_WATERMARK:
            latest[channel] = rng.randint(0, 10)
        tracker.on_watermark(ChannelIndex(channel), latest[channel])
        assert tracker.current == min(latest)
