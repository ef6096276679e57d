from __future__ import annotations

import random

import pytest

from weir.core.errors import ProtocolError
from weir.core.ids import ChannelIndex
from weir.core.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    BoundedOutOfOrdernessWatermarks,
    ChannelStatus,
    PartitionStatusChange,
    PartitionWatermarks,
    StatusWatermarkValve,
    ValveOutput,
    WatermarkStatus,
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


def test_one_channel_answers_as_the_same_channel_beside_an_ended_one() -> None:
    """A tracker of one channel (its own short path: the combined watermark is that channel's) answers
    every event as a tracker of two whose second channel ended at the start (the general rule: an
    ended channel counts as MAX_WATERMARK), over random events including idleness and a watermark
    behind the combined one."""
    rng = random.Random(7)
    for _ in range(300):
        one, two = WatermarkTracker(1), WatermarkTracker(2)
        two.on_end_of_stream(C1)
        for _ in range(60):
            if one.channel_status(C0) is ChannelStatus.ENDED:
                break
            action = rng.random()
            if action < 0.7:
                watermark = one.channel_watermark(C0) + rng.randint(-30, 50)
                answers = (one.on_watermark(C0, watermark), two.on_watermark(C0, watermark))
            elif action < 0.8:
                answers = (one.mark_idle(C0), two.mark_idle(C0))
            elif action < 0.95:
                one.mark_active(C0)
                two.mark_active(C0)
                answers = (None, None)
            else:
                answers = (one.on_end_of_stream(C0), two.on_end_of_stream(C0))
            assert answers[0] == answers[1]
            assert (one.current, one.is_idle, one.all_ended) == (two.current, two.is_idle, two.all_ended)


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


# Source idleness: a source subtask's partitions (Flink's WatermarksWithIdleness) ----------------------

IDLE = WatermarkStatus.IDLE
ACTIVE = WatermarkStatus.ACTIVE


def records(watermarks: PartitionWatermarks, *partition_ts: tuple[int, int]) -> None:
    """What a source's poll does per record: the partition's generator and ``seen``."""
    for partition, ts in partition_ts:
        watermarks.generators[partition].on_event(ts)
        watermarks.seen.add(partition)


def test_an_empty_partition_goes_idle_after_the_timeout_and_the_watermark_advances() -> None:
    watermarks = PartitionWatermarks([0, 3], max_out_of_orderness_ms=0, idle_timeout_ms=1000, now=10.0)
    records(watermarks, (0, 5000))
    assert watermarks.advance(10.2) == (None, [])  # partition 3 (no record yet) holds it back
    records(watermarks, (0, 6000))
    assert watermarks.advance(10.999) == (None, [])  # not quite the timeout since the start
    records(watermarks, (0, 7000))
    assert watermarks.advance(11.0) == (6999, [PartitionStatusChange(3, IDLE)])
    assert watermarks.partition_status(3) is ChannelStatus.IDLE
    assert watermarks.status() is ACTIVE  # partition 0 is active
    records(watermarks, (0, 8000))
    assert watermarks.advance(11.5) == (7999, [])


def test_an_idle_partition_is_active_again_on_its_next_record_and_never_moves_the_watermark_back() -> None:
    watermarks = PartitionWatermarks([0, 1], max_out_of_orderness_ms=0, idle_timeout_ms=500, now=0.0)
    records(watermarks, (0, 5000))
    assert watermarks.advance(0.6) == (4999, [PartitionStatusChange(1, IDLE)])
    records(watermarks, (1, 3000))  # resumes behind the combined watermark
    assert watermarks.advance(0.7) == (None, [PartitionStatusChange(1, ACTIVE)])
    assert watermarks.current == 4999
    records(watermarks, (0, 7000))  # partition 1 is left out until it catches up
    assert watermarks.advance(0.8) == (6999, [])
    records(watermarks, (1, 8000))
    assert watermarks.advance(0.9) == (None, [])
    records(watermarks, (0, 9000))  # partition 1 holds it back again: min(8999, 7999)
    assert watermarks.advance(1.0) == (7999, [])


def test_a_subtask_whose_partitions_are_all_idle_is_idle_until_a_record() -> None:
    watermarks = PartitionWatermarks([2, 5], max_out_of_orderness_ms=10, idle_timeout_ms=100, now=0.0)
    records(watermarks, (2, 1000), (5, 2000))
    assert watermarks.advance(0.05) == (989, [])
    assert watermarks.status() is ACTIVE
    watermark, changes = watermarks.advance(0.2)
    assert changes == [PartitionStatusChange(2, IDLE), PartitionStatusChange(5, IDLE)]
    assert watermark == 1989  # all idle: the highest of theirs, as Flink's valve does
    assert watermarks.status() is IDLE
    assert watermarks.advance(5.0) == (None, [])  # stays idle, nothing more to announce
    records(watermarks, (5, 2500))
    assert watermarks.advance(5.1) == (2489, [PartitionStatusChange(5, ACTIVE)])
    assert watermarks.status() is ACTIVE


def test_a_subtask_without_partitions_is_idle_only_with_an_idle_timeout() -> None:
    assert PartitionWatermarks([], 0, idle_timeout_ms=100, now=0.0).status() is IDLE
    assert PartitionWatermarks([], 0, idle_timeout_ms=None, now=0.0).status() is ACTIVE
    assert PartitionWatermarks([], 0, idle_timeout_ms=100, now=0.0).advance(9.0) == (None, [])


def test_without_an_idle_timeout_an_empty_partition_holds_the_watermark_forever() -> None:
    watermarks = PartitionWatermarks([0, 1], max_out_of_orderness_ms=0, idle_timeout_ms=None, now=0.0)
    records(watermarks, (0, 5000))
    assert watermarks.advance(1e9) == (None, [])
    assert watermarks.status() is ACTIVE


def test_ended_partitions_count_as_max_and_never_go_idle() -> None:
    watermarks = PartitionWatermarks([0, 1], 0, idle_timeout_ms=100, now=0.0, ended=[1])
    records(watermarks, (0, 400))
    assert watermarks.advance(0.01) == (399, [])
    watermarks.end(0)
    assert watermarks.advance(10.0) == (MAX_WATERMARK, [])
    assert watermarks.status() is ACTIVE  # ended, not idle: the source finishes


def test_partition_idle_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PartitionWatermarks([0], 0, idle_timeout_ms=0, now=0.0)


# The consumer side: Flink's StatusWatermarkValve --------------------------------------------------


def test_a_consumer_leaves_an_idle_channel_out_of_its_watermark() -> None:
    valve = StatusWatermarkValve(WatermarkTracker(3))
    assert valve.on_watermark(C0, 100) == ValveOutput()
    assert valve.on_watermark(C1, 200) == ValveOutput()
    assert valve.on_idle(C2) == ValveOutput(watermark=100)  # the idle channel no longer holds it back
    assert valve.status is ACTIVE
    assert valve.on_watermark(C0, 300) == ValveOutput(watermark=200)


def test_a_consumer_whose_inputs_are_all_idle_is_idle_and_active_again_on_a_record() -> None:
    valve = StatusWatermarkValve(WatermarkTracker(2))
    valve.on_watermark(C0, 100)
    valve.on_watermark(C1, 150)
    assert valve.on_idle(C0) == ValveOutput(watermark=150)
    assert valve.on_idle(C1) == ValveOutput(status=IDLE)
    assert valve.status is IDLE
    assert valve.on_records(C1) == ValveOutput(status=ACTIVE)  # before the records are processed
    assert valve.on_records(C1) == ValveOutput()
    assert valve.tracker.channel_status(C0) is ChannelStatus.IDLE
    assert valve.on_watermark(C1, 400) == ValveOutput(watermark=400)


def test_a_watermark_or_an_active_event_ends_a_channels_idleness() -> None:
    valve = StatusWatermarkValve(WatermarkTracker(2))
    valve.on_watermark(C0, 100)
    valve.on_watermark(C1, 100)
    valve.on_idle(C0)
    assert valve.on_idle(C1) == ValveOutput(status=IDLE)
    assert valve.on_watermark(C0, 90) == ValveOutput(status=ACTIVE)  # behind: active, but no step back
    assert valve.tracker.current == 100
    assert valve.on_active(C1) == ValveOutput()  # already active as an operator
    assert valve.on_watermark(C0, 200) == ValveOutput()  # C1 is active again at 100
    assert valve.on_watermark(C1, 250) == ValveOutput(watermark=200)


def test_an_end_of_stream_leaving_only_idle_channels_makes_the_consumer_idle() -> None:
    valve = StatusWatermarkValve(WatermarkTracker(2))
    valve.on_watermark(C0, 10)
    assert valve.on_idle(C1) == ValveOutput(watermark=10)
    assert valve.on_end_of_stream(C0) == ValveOutput(status=IDLE)  # C1 idle at MIN: nothing to advance
    assert valve.on_end_of_stream(C1) == ValveOutput(watermark=MAX_WATERMARK)  # ended: finishing, not active
    assert valve.status is IDLE
