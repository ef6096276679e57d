from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from weir.core.checkpointing import BarrierAlignment, CheckpointingMode
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.taskmanager.barrier_aligner import (
    AbortedCheckpoint,
    AbortReason,
    Action,
    AllChannelsEnded,
    BarrierAligner,
    BarrierArrival,
    BlockChannel,
    CaptureQueued,
    CheckpointKind,
    ForwardCancellation,
    InflightCaptureComplete,
    InputProtocolError,
    StartCapture,
    StopCapture,
    TriggerSnapshot,
    UnblockChannels,
)

TASK = TaskId(JobId("job"), OperatorUid("join"), SubtaskIndex(0))
EO = CheckpointingMode.EXACTLY_ONCE
ALO = CheckpointingMode.AT_LEAST_ONCE
UNALIGNED = CheckpointingMode.UNALIGNED
SAVEPOINT = CheckpointKind.SAVEPOINT
CHECKPOINT = CheckpointKind.CHECKPOINT
FORCED = BarrierAlignment.FORCED_ALIGNED

C0, C1, C2 = ChannelIndex(0), ChannelIndex(1), ChannelIndex(2)
CP1, CP2, CP3, CP5 = CheckpointId(1), CheckpointId(2), CheckpointId(3), CheckpointId(5)

MakeAligner = Callable[..., BarrierAligner]


@pytest.fixture
def make_aligner() -> MakeAligner:
    def make(num_channels: int = 3, mode: CheckpointingMode = EO) -> BarrierAligner:
        return BarrierAligner(TASK, num_channels, mode)

    return make


def trigger(checkpoint: int, started: float, at: float, *, capture: bool = False) -> TriggerSnapshot:
    return TriggerSnapshot(CheckpointId(checkpoint), CHECKPOINT, started, at, capture_inflight=capture)


def unblock(*channels: int) -> UnblockChannels:
    return UnblockChannels(tuple(ChannelIndex(c) for c in channels))


def aborted(checkpoint: int, reason: AbortReason) -> tuple[AbortedCheckpoint, ForwardCancellation]:
    return AbortedCheckpoint(CheckpointId(checkpoint), reason), ForwardCancellation(CheckpointId(checkpoint))


# Exactly once (aligned).


def test_single_input_snapshots_on_the_barrier(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(1)
    assert aligner.on_barrier(C0, CP1, now=3.0) == (trigger(1, 3.0, 3.0),)
    assert aligner.pending_checkpoint is None
    assert aligner.blocked_channels == frozenset()
    assert aligner.last_completed_checkpoint == CP1


def test_aligned_blocks_each_barriered_channel_until_the_last_barrier(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3)
    assert aligner.on_barrier(C1, CP1, now=1.0) == (BlockChannel(C1),)
    assert aligner.pending_checkpoint == CP1
    assert aligner.on_barrier(C0, CP1, now=2.0) == (BlockChannel(C0),)
    assert aligner.blocked_channels == {C0, C1}
    actions = aligner.on_barrier(C2, CP1, now=4.5)
    assert actions == (trigger(1, 1.0, 4.5), unblock(0, 1))
    snapshot = actions[0]
    assert isinstance(snapshot, TriggerSnapshot) and snapshot.alignment_duration == 3.5
    assert aligner.pending_checkpoint is None
    assert aligner.blocked_channels == frozenset()


def test_savepoint_kind_is_carried_to_the_snapshot(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    aligner.on_barrier(C0, CP1, SAVEPOINT, now=0.0)
    assert aligner.on_barrier(C1, CP1, SAVEPOINT, now=1.0) == (
        TriggerSnapshot(CP1, SAVEPOINT, 0.0, 1.0),
        unblock(0),
    )


def test_reading_a_blocked_channel_is_a_protocol_error(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    aligner.on_barrier(C0, CP1, now=0.0)
    with pytest.raises(InputProtocolError, match="blocked"):
        aligner.on_barrier(C0, CP2, now=1.0)
    with pytest.raises(InputProtocolError, match="blocked"):
        aligner.on_end_of_stream(C0, now=1.0)


def test_events_after_end_of_stream_or_on_unknown_channels_are_protocol_errors(
    make_aligner: MakeAligner,
) -> None:
    aligner = make_aligner(2)
    aligner.on_end_of_stream(C0, now=0.0)
    with pytest.raises(InputProtocolError, match="after its end of stream"):
        aligner.on_barrier(C0, CP1, now=1.0)
    with pytest.raises(InputProtocolError, match="2 input channels"):
        aligner.on_barrier(C2, CP1, now=1.0)


def test_an_aligner_needs_a_channel() -> None:
    with pytest.raises(ValueError):
        BarrierAligner(TASK, 0, EO)


def test_barriers_older_than_the_pending_or_completed_checkpoint_are_ignored(
    make_aligner: MakeAligner,
) -> None:
    aligner = make_aligner(2)
    aligner.on_barrier(C0, CP2, now=0.0)
    assert aligner.on_barrier(C1, CP1, now=1.0) == ()
    assert aligner.blocked_channels == {C0}
    assert aligner.on_barrier(C1, CP2, now=2.0) == (trigger(2, 0.0, 2.0), unblock(0))
    assert aligner.on_barrier(C0, CP1, now=3.0) == ()
    assert aligner.on_barrier(C0, CP2, now=3.0) == ()
    assert aligner.blocked_channels == frozenset()
    assert aligner.pending_checkpoint is None


def test_a_newer_barrier_subsumes_the_pending_checkpoint(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3)
    aligner.on_barrier(C0, CP1, now=0.0)
    aligner.on_barrier(C1, CP1, now=1.0)
    assert aligner.on_barrier(C2, CP2, now=2.0) == (
        unblock(0, 1),
        *aborted(1, AbortReason.SUBSUMED),
        BlockChannel(C2),
    )
    assert aligner.pending_checkpoint == CP2
    assert aligner.blocked_channels == {C2}
    aligner.on_barrier(C0, CP2, now=3.0)
    assert aligner.on_barrier(C1, CP2, now=4.0) == (trigger(2, 2.0, 4.0), unblock(0, 2))


def test_a_cancellation_marker_aborts_the_pending_checkpoint_once(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_cancellation(C1, CP1) == (unblock(0), *aborted(1, AbortReason.CANCELLED_UPSTREAM))
    assert aligner.pending_checkpoint is None
    assert aligner.blocked_channels == frozenset()
    assert aligner.on_cancellation(C2, CP1) == ()
    assert aligner.on_barrier(C2, CP1, now=1.0) == ()
    assert aligner.on_barrier(C2, CP2, now=2.0) == (BlockChannel(C2),)


def test_a_cancellation_for_a_future_checkpoint_is_forwarded_and_its_barriers_ignored(
    make_aligner: MakeAligner,
) -> None:
    aligner = make_aligner(2)
    assert aligner.on_cancellation(C0, CP5) == (ForwardCancellation(CP5),)
    assert aligner.on_cancellation(C1, CP5) == ()
    assert aligner.on_barrier(C1, CP5, now=1.0) == ()
    assert aligner.on_barrier(C1, CP3, now=1.0) == ()
    assert aligner.pending_checkpoint is None
    aligner.on_barrier(C0, CheckpointId(6), now=2.0)
    assert aligner.on_barrier(C1, CheckpointId(6), now=3.0) == (trigger(6, 2.0, 3.0), unblock(0))


def test_a_cancellation_for_a_newer_checkpoint_subsumes_the_pending_one(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_cancellation(C1, CP2) == (
        unblock(0),
        *aborted(1, AbortReason.SUBSUMED),
        ForwardCancellation(CP2),
    )
    assert aligner.on_barrier(C2, CP2, now=1.0) == ()


def test_a_cancellation_for_an_old_checkpoint_is_ignored(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    aligner.on_barrier(C0, CP2, now=0.0)
    assert aligner.on_cancellation(C1, CP1) == ()
    assert aligner.pending_checkpoint == CP2


def test_end_of_stream_of_the_last_missing_channel_completes_the_alignment(
    make_aligner: MakeAligner,
) -> None:
    aligner = make_aligner(3)
    aligner.on_barrier(C0, CP1, now=0.0)
    aligner.on_barrier(C1, CP1, now=1.0)
    assert aligner.on_end_of_stream(C2, now=2.0) == (trigger(1, 0.0, 2.0), unblock(0, 1))
    assert aligner.live_channels == {C0, C1}


def test_end_of_stream_during_alignment_stops_the_channel_counting(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_end_of_stream(C2, now=1.0) == ()
    assert aligner.on_barrier(C1, CP1, now=2.0) == (trigger(1, 0.0, 2.0), unblock(0))


def test_channels_ended_before_the_checkpoint_do_not_count(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    aligner.on_end_of_stream(C1, now=0.0)
    assert aligner.on_barrier(C0, CP1, now=1.0) == (trigger(1, 1.0, 1.0),)


def test_all_channels_ended(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    assert aligner.on_end_of_stream(C0, now=0.0) == ()
    assert not aligner.all_ended
    assert aligner.on_end_of_stream(C1, now=1.0) == (AllChannelsEnded(),)
    assert aligner.all_ended
    assert aligner.live_channels == frozenset()


def test_jobmanager_abort_of_the_pending_checkpoint(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.abort(CP1) == (unblock(0), *aborted(1, AbortReason.ABORTED_BY_JOBMANAGER))
    assert aligner.pending_checkpoint is None
    assert aligner.on_barrier(C1, CP1, now=1.0) == ()
    assert aligner.abort(CP1) == ()


def test_jobmanager_abort_ahead_turns_the_barriers_into_one_cancellation(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    assert aligner.abort(CP2) == ()
    assert aligner.on_barrier(C0, CP1, now=0.0) == (BlockChannel(C0),)
    assert aligner.on_barrier(C1, CP1, now=1.0) == (trigger(1, 0.0, 1.0), unblock(0))
    assert aligner.on_barrier(C1, CP2, now=2.0) == (ForwardCancellation(CP2),)
    assert aligner.on_barrier(C0, CP2, now=3.0) == ()
    assert aligner.pending_checkpoint is None
    assert aligner.on_barrier(C0, CP3, now=4.0) == (BlockChannel(C0),)


def test_jobmanager_abort_ahead_is_forgotten_once_a_newer_checkpoint_starts(
    make_aligner: MakeAligner,
) -> None:
    aligner = make_aligner(1)
    aligner.abort(CP2)
    assert aligner.on_barrier(C0, CP3, now=0.0) == (trigger(3, 0.0, 0.0),)
    assert aligner.on_barrier(C0, CP2, now=1.0) == ()


def test_jobmanager_abort_of_a_completed_checkpoint_is_ignored(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(1)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.abort(CP1) == ()
    assert aligner.last_completed_checkpoint == CP1


# At least once.


def test_at_least_once_never_blocks_and_snapshots_on_the_last_barrier(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3, ALO)
    assert aligner.on_barrier(C0, CP1, now=0.0) == ()
    assert aligner.blocked_channels == frozenset()
    assert aligner.on_barrier(C2, CP1, now=1.0) == ()
    assert aligner.pending_checkpoint == CP1
    assert aligner.on_barrier(C1, CP1, now=2.0) == (trigger(1, 0.0, 2.0),)


def test_at_least_once_rejects_a_second_barrier_on_one_channel(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, ALO)
    aligner.on_barrier(C0, CP1, now=0.0)
    with pytest.raises(InputProtocolError, match="twice"):
        aligner.on_barrier(C0, CP1, now=1.0)


def test_at_least_once_channel_that_delivered_its_barrier_may_end(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, ALO)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_end_of_stream(C0, now=1.0) == ()
    assert aligner.on_end_of_stream(C1, now=2.0) == (trigger(1, 0.0, 2.0), AllChannelsEnded())


def test_at_least_once_subsumed_and_cancelled_checkpoints_unblock_nothing(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, ALO)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_barrier(C0, CP2, now=1.0) == aborted(1, AbortReason.SUBSUMED)
    assert aligner.on_cancellation(C1, CP2) == aborted(2, AbortReason.CANCELLED_UPSTREAM)


# Unaligned.


def test_unaligned_snapshots_on_the_first_barrier_and_captures_the_other_channels(
    make_aligner: MakeAligner,
) -> None:
    aligner = make_aligner(3, UNALIGNED)
    assert aligner.on_barrier(C1, CP1, now=0.0) == (
        trigger(1, 0.0, 0.0, capture=True),
        CaptureQueued(C1, CP1),
        StartCapture(C0, CP1),
        StartCapture(C2, CP1),
    )
    assert aligner.blocked_channels == frozenset()
    assert aligner.capturing_channels == {C0, C2}
    assert aligner.on_barrier(C2, CP1, now=1.0) == (StopCapture(C2, CP1), CaptureQueued(C2, CP1))
    assert aligner.capturing_channels == {C0}
    assert aligner.on_barrier(C0, CP1, now=2.0) == (
        StopCapture(C0, CP1),
        CaptureQueued(C0, CP1),
        InflightCaptureComplete(CP1),
    )
    assert aligner.pending_checkpoint is None
    assert aligner.last_completed_checkpoint == CP1


def test_unaligned_single_input_keeps_only_what_its_barrier_overtook(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(1, UNALIGNED)
    assert aligner.on_barrier(C0, CP1, now=0.0) == (
        trigger(1, 0.0, 0.0, capture=True),
        CaptureQueued(C0, CP1),
        InflightCaptureComplete(CP1),
    )
    assert aligner.pending_checkpoint is None


def test_a_priority_barrier_of_a_newer_checkpoint_may_arrive_on_a_blocked_channel(make_aligner: MakeAligner) -> None:
    """A savepoint aligns (aligned even in unaligned mode); the JobManager aborts it and starts the
    next checkpoint, whose priority barrier overtakes the blocked queue before the abort arrives."""
    aligner = make_aligner(2, UNALIGNED)
    assert aligner.on_barrier(C0, CP1, SAVEPOINT, now=0.0) == (BlockChannel(C0),)
    assert aligner.on_barrier(C0, CP2, now=1.0, priority=True) == (
        unblock(0),
        *aborted(1, AbortReason.SUBSUMED),
        trigger(2, 1.0, 1.0, capture=True),
        CaptureQueued(C0, CP2),
        StartCapture(C1, CP2),
    )


def test_unaligned_end_of_stream_stops_the_capture(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, UNALIGNED)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_end_of_stream(C1, now=1.0) == (StopCapture(C1, CP1), InflightCaptureComplete(CP1))


# Barrier arrival times (the checkpoint's timeline).


def arrivals(*pairs: tuple[int, float]) -> tuple[BarrierArrival, ...]:
    return tuple(BarrierArrival(ChannelIndex(c), at) for c, at in pairs)


def snapshot_of(actions: tuple[Action, ...]) -> TriggerSnapshot:
    found = [a for a in actions if isinstance(a, TriggerSnapshot)]
    assert len(found) == 1, actions
    return found[0]


def capture_complete_of(actions: tuple[Action, ...]) -> InflightCaptureComplete:
    found = [a for a in actions if isinstance(a, InflightCaptureComplete)]
    assert len(found) == 1, actions
    return found[0]


@pytest.mark.parametrize("mode", [EO, ALO])
def test_the_snapshot_carries_each_channels_barrier_time(make_aligner: MakeAligner, mode: CheckpointingMode) -> None:
    aligner = make_aligner(3, mode)
    aligner.on_barrier(C2, CP1, now=10.0)
    aligner.on_barrier(C0, CP1, now=10.5)
    snapshot = snapshot_of(aligner.on_barrier(C1, CP1, now=12.25))
    assert snapshot.barriers == arrivals((2, 10.0), (0, 10.5), (1, 12.25))
    assert (snapshot.alignment_started_at, snapshot.triggered_at) == (10.0, 12.25)


def test_a_channel_that_ends_before_its_barrier_has_no_barrier_time(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3)
    aligner.on_barrier(C0, CP1, now=1.0)
    aligner.on_barrier(C2, CP1, now=2.0)
    snapshot = snapshot_of(aligner.on_end_of_stream(C1, now=5.0))
    assert snapshot.barriers == arrivals((0, 1.0), (2, 2.0))
    assert snapshot.triggered_at == 5.0  # the alignment ended with the channel


def test_a_subsumed_checkpoints_barriers_do_not_leak_into_the_next(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2)
    aligner.on_barrier(C0, CP1, now=1.0)
    aligner.abort(CP1)  # the blocked channel is released
    aligner.on_barrier(C1, CP2, now=3.0)
    snapshot = snapshot_of(aligner.on_barrier(C0, CP2, now=4.0))
    assert snapshot.barriers == arrivals((1, 3.0), (0, 4.0))


def test_unaligned_barriers_after_the_snapshot_come_with_the_capture_complete(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3, UNALIGNED)
    snapshot = snapshot_of(aligner.on_barrier(C1, CP1, now=1.0, priority=True))
    assert snapshot.barriers == arrivals((1, 1.0))
    assert (snapshot.alignment_started_at, snapshot.triggered_at) == (1.0, 1.0)  # the snapshot starts at once
    assert aligner.on_barrier(C0, CP1, now=3.0, priority=True) == (StopCapture(C0, CP1), CaptureQueued(C0, CP1))
    complete = capture_complete_of(aligner.on_barrier(C2, CP1, now=7.5, priority=True))
    assert complete.barriers == arrivals((1, 1.0), (0, 3.0), (2, 7.5))


def test_unaligned_a_channel_ending_instead_of_its_barrier_is_left_out(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, UNALIGNED)
    aligner.on_barrier(C0, CP1, now=1.0)
    complete = capture_complete_of(aligner.on_end_of_stream(C1, now=2.0))
    assert complete.barriers == arrivals((0, 1.0))


def test_a_timed_out_alignment_keeps_the_blocked_channels_barrier_times() -> None:
    aligner = BarrierAligner(TASK, 3, UNALIGNED, aligned_start=True)
    assert aligner.on_barrier(C0, CP1, now=1.0) == (BlockChannel(C0),)
    snapshot = snapshot_of(aligner.on_barrier(C1, CP1, now=4.0, priority=True))
    assert snapshot.capture_inflight
    assert snapshot.barriers == arrivals((0, 1.0), (1, 4.0))
    assert (snapshot.alignment_started_at, snapshot.triggered_at) == (1.0, 4.0)
    complete = capture_complete_of(aligner.on_barrier(C2, CP1, now=6.0))
    assert complete.barriers == arrivals((0, 1.0), (1, 4.0), (2, 6.0))


def test_unaligned_cancellation_stops_every_capture(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(3, UNALIGNED)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_cancellation(C1, CP1) == (
        StopCapture(C1, CP1),
        StopCapture(C2, CP1),
        *aborted(1, AbortReason.CANCELLED_UPSTREAM),
    )
    assert aligner.capturing_channels == frozenset()


def test_unaligned_newer_barrier_restarts_the_capture(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, UNALIGNED)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_barrier(C0, CP2, now=1.0) == (
        StopCapture(C1, CP1),
        *aborted(1, AbortReason.SUBSUMED),
        trigger(2, 1.0, 1.0, capture=True),
        CaptureQueued(C0, CP2),
        StartCapture(C1, CP2),
    )


def test_unaligned_savepoints_are_aligned(make_aligner: MakeAligner) -> None:
    aligner = make_aligner(2, UNALIGNED)
    assert aligner.on_barrier(C0, CP1, SAVEPOINT, now=0.0) == (BlockChannel(C0),)
    assert aligner.capturing_channels == frozenset()
    assert aligner.on_barrier(C1, CP1, SAVEPOINT, now=1.0) == (
        TriggerSnapshot(CP1, SAVEPOINT, 0.0, 1.0),
        unblock(0),
    )


# A final checkpoint's barrier is forced aligned (Flink's FORCED_ALIGNED): aligned in every mode.


def final_trigger(checkpoint: int, started: float, at: float) -> TriggerSnapshot:
    return TriggerSnapshot(CheckpointId(checkpoint), CHECKPOINT, started, at, alignment=FORCED)


@pytest.mark.parametrize("aligned_start", [False, True])
def test_unaligned_mode_aligns_a_forced_aligned_barrier_and_captures_nothing(aligned_start: bool) -> None:
    """A bounded job's final checkpoint: blocked channels, no capture, the snapshot once every
    barrier is in, and the snapshot says the barrier it forwards is forced aligned too."""
    aligner = BarrierAligner(TASK, 3, UNALIGNED, aligned_start=aligned_start)
    assert aligner.on_barrier(C1, CP1, now=0.0, alignment=FORCED) == (BlockChannel(C1),)
    assert aligner.capturing_channels == frozenset() and aligner.blocked_channels == {C1}
    assert aligner.on_barrier(C0, CP1, now=1.0, alignment=FORCED) == (BlockChannel(C0),)
    assert aligner.on_barrier(C2, CP1, now=2.0, alignment=FORCED) == (final_trigger(1, 0.0, 2.0), unblock(0, 1))
    assert aligner.pending_checkpoint is None and aligner.last_completed_checkpoint == CP1


@pytest.mark.parametrize("aligned_start", [False, True])
def test_a_forced_aligned_single_input_snapshots_on_its_barrier_without_capture(aligned_start: bool) -> None:
    aligner = BarrierAligner(TASK, 1, UNALIGNED, aligned_start=aligned_start)
    assert aligner.on_barrier(C0, CP1, now=3.0, alignment=FORCED) == (final_trigger(1, 3.0, 3.0),)


def test_a_forced_aligned_checkpoint_is_never_switched_to_unaligned() -> None:
    """The aligned-checkpoint timeout never turns a final barrier (the gate never prioritizes one):
    should another barrier of the checkpoint come as a priority one, the checkpoint stays aligned."""
    aligner = timeoutable(3)
    assert aligner.on_barrier(C0, CP1, now=0.0, alignment=FORCED) == (BlockChannel(C0),)
    assert aligner.on_barrier(C1, CP1, now=5.0, priority=True) == (BlockChannel(C1),)
    assert aligner.capturing_channels == frozenset()
    assert aligner.on_barrier(C2, CP1, now=6.0, alignment=FORCED) == (final_trigger(1, 0.0, 6.0), unblock(0, 1))


@pytest.mark.parametrize("aligned_start", [False, True])
def test_a_forced_aligned_barrier_that_comes_as_a_priority_event_is_a_protocol_error(aligned_start: bool) -> None:
    """It would have overtaken records the aligned snapshot must hold."""
    aligner = BarrierAligner(TASK, 2, UNALIGNED, aligned_start=aligned_start)
    with pytest.raises(InputProtocolError, match="forced aligned"):
        aligner.on_barrier(C0, CP1, now=0.0, priority=True, alignment=FORCED)


@pytest.mark.parametrize(("mode", "first"), [(EO, (BlockChannel(C0),)), (ALO, ())])
def test_other_modes_carry_the_forced_alignment_to_the_snapshot(
    make_aligner: MakeAligner, mode: CheckpointingMode, first: tuple[Action, ...]
) -> None:
    aligner = make_aligner(2, mode)
    assert aligner.on_barrier(C0, CP1, now=0.0, alignment=FORCED) == first
    actions = aligner.on_barrier(C1, CP1, now=1.0, alignment=FORCED)
    assert snapshot_of(actions) == final_trigger(1, 0.0, 1.0)


def test_a_forced_aligned_checkpoint_after_unaligned_ones_aligns() -> None:
    aligner = BarrierAligner(TASK, 2, UNALIGNED)
    aligner.on_barrier(C0, CP1, now=0.0, priority=True)
    aligner.on_barrier(C1, CP1, now=1.0, priority=True)
    assert aligner.last_completed_checkpoint == CP1
    assert aligner.on_barrier(C1, CP2, now=2.0, alignment=FORCED) == (BlockChannel(C1),)
    assert aligner.on_end_of_stream(C0, now=3.0) == (final_trigger(2, 2.0, 3.0), unblock(1))


# Unaligned with an aligned start (aligned-checkpoint-timeout): aligned until a priority barrier.


def timeoutable(num_channels: int) -> BarrierAligner:
    return BarrierAligner(TASK, num_channels, UNALIGNED, aligned_start=True)


def test_an_aligned_start_aligns_in_order_barriers_and_completes_aligned() -> None:
    aligner = timeoutable(2)
    assert aligner.on_barrier(C0, CP1, now=0.0) == (BlockChannel(C0),)
    assert aligner.on_barrier(C1, CP1, now=1.0) == (trigger(1, 0.0, 1.0), unblock(0))
    assert aligner.capturing_channels == frozenset()


def test_a_priority_barrier_switches_an_aligning_checkpoint_to_unaligned() -> None:
    aligner = timeoutable(3)
    assert aligner.on_barrier(C0, CP1, now=0.0) == (BlockChannel(C0),)
    assert aligner.on_barrier(C1, CP1, now=5.0, priority=True) == (
        trigger(1, 0.0, 5.0, capture=True),  # alignment took 5 s, then the switch
        unblock(0),  # what channel 0 queues follows its barrier: not the checkpoint's
        CaptureQueued(C1, CP1),
        StartCapture(C2, CP1),
    )
    assert aligner.blocked_channels == frozenset() and aligner.capturing_channels == {C2}
    assert aligner.on_barrier(C2, CP1, now=6.0) == (  # in order, after everything it delivered
        StopCapture(C2, CP1),
        CaptureQueued(C2, CP1),
        InflightCaptureComplete(CP1),
    )
    assert aligner.last_completed_checkpoint == CP1


def test_a_switch_on_the_last_barrier_completes_at_once() -> None:
    aligner = timeoutable(2)
    aligner.on_barrier(C0, CP1, now=0.0)
    assert aligner.on_barrier(C1, CP1, now=5.0, priority=True) == (
        trigger(1, 0.0, 5.0, capture=True),
        unblock(0),
        CaptureQueued(C1, CP1),
        InflightCaptureComplete(CP1),
    )
    assert aligner.pending_checkpoint is None


def test_a_first_priority_barrier_starts_unaligned_and_savepoints_never_switch() -> None:
    aligner = timeoutable(2)
    assert aligner.on_barrier(C0, CP1, now=0.0, priority=True) == (
        trigger(1, 0.0, 0.0, capture=True),
        CaptureQueued(C0, CP1),
        StartCapture(C1, CP1),
    )
    assert aligner.on_barrier(C1, CP1, now=1.0) == (
        StopCapture(C1, CP1),
        CaptureQueued(C1, CP1),
        InflightCaptureComplete(CP1),
    )
    assert aligner.on_barrier(C0, CP2, SAVEPOINT, now=2.0) == (BlockChannel(C0),)
    assert aligner.on_barrier(C1, CP2, SAVEPOINT, now=3.0, priority=True) == (
        TriggerSnapshot(CP2, SAVEPOINT, 2.0, 3.0),
        unblock(0),
    )


def test_exactly_once_mode_never_switches() -> None:
    aligner = BarrierAligner(TASK, 2, EO, aligned_start=True)
    assert aligner.on_barrier(C0, CP1, now=0.0) == (BlockChannel(C0),)
    assert aligner.on_barrier(C1, CP1, now=5.0, priority=True) == (trigger(1, 0.0, 5.0), unblock(0))


# Randomized, after Flink's AlignedCheckpointsMassiveRandomTest: a fake input gate with K channels,
# each a queue of sequence-tagged records and checkpoint markers, drained in a random interleaving
# that never polls a blocked channel. In unaligned mode a barrier the gate may prioritize (a
# checkpoint's, not a savepoint's nor a forced aligned one's) is sometimes taken ahead of the records
# queued before it, as the producer's priority send or the aligned-checkpoint timeout would.


@dataclass(frozen=True)
class Record:
    seq: int


@dataclass(frozen=True)
class Barrier:
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class Cancel:
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class End:
    pass


Event = Record | Barrier | Cancel | End


@dataclass(frozen=True)
class Gate:
    channels: tuple[tuple[Event, ...], ...]
    kinds: dict[CheckpointId, CheckpointKind]
    alignments: dict[CheckpointId, BarrierAlignment]

    def prioritizable(self, checkpoint_id: CheckpointId) -> bool:
        """Whether the gate may take this checkpoint's barriers ahead of their queue."""
        return self.kinds[checkpoint_id] is CHECKPOINT and self.alignments[checkpoint_id] is BarrierAlignment.BY_MODE

    def records_before(self, checkpoint_id: CheckpointId) -> tuple[int, ...]:
        """Per channel, the records before its first marker of this checkpoint or a later one."""
        counts = []
        for events in self.channels:
            count = 0
            for event in events:
                if isinstance(event, Barrier | Cancel) and event.checkpoint_id >= checkpoint_id:
                    break
                count += isinstance(event, Record)
            counts.append(count)
        return tuple(counts)

    def markers(self, checkpoint_id: CheckpointId) -> list[Event]:
        return [
            event
            for events in self.channels
            for event in events
            if isinstance(event, Barrier | Cancel) and event.checkpoint_id == checkpoint_id
        ]

    def skipped_by_a_live_channel(self, checkpoint_id: CheckpointId) -> bool:
        for events in self.channels:
            ids = [event.checkpoint_id for event in events if isinstance(event, Barrier | Cancel)]
            if checkpoint_id not in ids and any(later > checkpoint_id for later in ids):
                return True
        return False


def random_gate(rng: random.Random) -> Gate:
    num_checkpoints = rng.randint(1, 6)
    ids = [CheckpointId(n) for n in range(1, num_checkpoints + 1)]
    kinds = {n: SAVEPOINT if rng.random() < 0.15 else CHECKPOINT for n in ids}
    alignments = {
        n: FORCED if kinds[n] is CHECKPOINT and rng.random() < 0.25 else BarrierAlignment.BY_MODE for n in ids
    }
    cancelled_upstream = {n for n in ids if rng.random() < 0.2}
    channels = []
    for _ in range(rng.randint(1, 6)):
        events: list[Event] = []
        seq = 0
        ends_after = num_checkpoints if rng.random() < 0.7 else rng.randint(0, num_checkpoints - 1)
        for n in ids[:ends_after]:
            for _ in range(rng.randint(0, 3)):
                events.append(Record(seq))
                seq += 1
            if n in cancelled_upstream and rng.random() < 0.6:
                events.append(Cancel(n))
            elif rng.random() >= 0.05:
                events.append(Barrier(n))
        for _ in range(rng.randint(0, 3)):
            events.append(Record(seq))
            seq += 1
        events.append(End())
        channels.append(tuple(events))
    return Gate(tuple(channels), kinds, alignments)


@dataclass
class Operator:
    """What the input loop and the operator do with the aligner's actions, with checks."""

    gate: Gate
    mode: CheckpointingMode
    consumed: list[int]
    blocked: set[ChannelIndex] = field(default_factory=set)
    capturing: dict[ChannelIndex, CheckpointId] = field(default_factory=dict)
    captured: Counter[tuple[CheckpointId, ChannelIndex]] = field(default_factory=Counter)
    unaligned_snapshots: dict[CheckpointId, tuple[int, ...]] = field(default_factory=dict)
    completed: list[CheckpointId] = field(default_factory=list)
    aborted: list[CheckpointId] = field(default_factory=list)
    forwarded: set[CheckpointId] = field(default_factory=set)
    aborted_by_jobmanager: set[CheckpointId] = field(default_factory=set)
    barrier_reads: dict[CheckpointId, list[BarrierArrival]] = field(default_factory=dict)  # as the loop read them
    overtaken: tuple[ChannelIndex, int] | None = None  # the priority barrier being handled: its channel, records
    forced_completed: int = 0
    ended: int = 0

    def read_record(self, channel: ChannelIndex) -> None:
        assert channel not in self.blocked
        self.consumed[channel] += 1
        if channel in self.capturing:
            self.captured[self.capturing[channel], channel] += 1

    def apply(self, actions: tuple[Action, ...]) -> None:
        for action in actions:
            self._apply(action)

    def _apply(self, action: Action) -> None:
        match action:
            case BlockChannel(channel):
                assert self.mode is not ALO
                assert channel not in self.blocked
                self.blocked.add(channel)
            case UnblockChannels(channels):
                assert set(channels) <= self.blocked
                self.blocked -= set(channels)
            case TriggerSnapshot(checkpoint_id, kind, started_at, triggered_at, capture_inflight, alignment):
                assert kind is self.gate.kinds[checkpoint_id]
                assert alignment is self.gate.alignments[checkpoint_id]
                if alignment is FORCED:
                    assert not capture_inflight, "a forced aligned checkpoint captured records in flight"
                    self.forced_completed += 1
                assert triggered_at >= started_at
                reads = tuple(self.barrier_reads[checkpoint_id])
                assert action.barriers == reads  # every barrier of it read so far, when it was read
                assert started_at == reads[0].at
                assert triggered_at == reads[-1].at or not capture_inflight and triggered_at > reads[-1].at
                before = self.gate.records_before(checkpoint_id)
                if capture_inflight:
                    assert self.mode is UNALIGNED
                    self.unaligned_snapshots[checkpoint_id] = tuple(self.consumed)
                    return
                if self.mode is ALO:
                    assert all(seen >= owed for seen, owed in zip(self.consumed, before, strict=True))
                else:
                    assert tuple(self.consumed) == before, (checkpoint_id, self.consumed, before)
                self._complete(checkpoint_id)
            case StartCapture(channel, checkpoint_id):
                assert channel not in self.capturing
                self.capturing[channel] = checkpoint_id
            case StopCapture(channel, checkpoint_id):
                assert self.capturing.pop(channel) == checkpoint_id
            case CaptureQueued(channel, checkpoint_id):
                assert channel not in self.capturing
                if self.overtaken is not None:  # what the priority barrier overtook is the checkpoint's
                    overtaken_channel, records = self.overtaken
                    assert overtaken_channel == channel
                    self.captured[checkpoint_id, channel] += records
            case InflightCaptureComplete(checkpoint_id):
                assert checkpoint_id not in self.capturing.values()
                assert action.barriers == tuple(self.barrier_reads[checkpoint_id])
                snapshot = self.unaligned_snapshots.pop(checkpoint_id)
                with_inflight = tuple(
                    seen + self.captured[checkpoint_id, ChannelIndex(channel)] for channel, seen in enumerate(snapshot)
                )
                assert with_inflight == self.gate.records_before(checkpoint_id)
                self._complete(checkpoint_id)
            case AbortedCheckpoint(checkpoint_id, reason):
                assert checkpoint_id not in self.completed and checkpoint_id not in self.aborted
                if reason is AbortReason.ABORTED_BY_JOBMANAGER:
                    assert checkpoint_id in self.aborted_by_jobmanager
                self.unaligned_snapshots.pop(checkpoint_id, None)
                self.aborted.append(checkpoint_id)
            case ForwardCancellation(checkpoint_id):
                assert checkpoint_id not in self.forwarded
                self.forwarded.add(checkpoint_id)
            case AllChannelsEnded():
                self.ended += 1

    def _complete(self, checkpoint_id: CheckpointId) -> None:
        assert not self.completed or self.completed[-1] < checkpoint_id
        assert checkpoint_id not in self.aborted_by_jobmanager
        assert not any(isinstance(marker, Cancel) for marker in self.gate.markers(checkpoint_id))
        self.completed.append(checkpoint_id)


def priority_barrier(gate: Gate, queue: list[Event]) -> int | None:
    """Where the next marker of this channel's queue is, if it is a barrier the gate may take ahead
    of the records queued before it."""
    for index, event in enumerate(queue):
        match event:
            case Record():
                continue
            case Barrier(checkpoint_id) if gate.prioritizable(checkpoint_id):
                return index
            case _:
                return None
    return None


def drain(gate: Gate, mode: CheckpointingMode, rng: random.Random, *, aligned_start: bool = False) -> Operator:
    aligner = BarrierAligner(TASK, len(gate.channels), mode, aligned_start=aligned_start)
    operator = Operator(gate, mode, consumed=[0] * len(gate.channels))
    queues = [list(events) for events in gate.channels]
    now = 0.0
    while True:
        now += 1.0
        if rng.random() < 0.02:
            checkpoint_id = CheckpointId(rng.randint(1, len(gate.kinds) + 1))
            if checkpoint_id not in operator.completed:
                operator.aborted_by_jobmanager.add(checkpoint_id)
            operator.apply(aligner.abort(checkpoint_id))
        if mode is UNALIGNED and rng.random() < 0.3:
            ahead = [(c, at) for c, queue in enumerate(queues) if (at := priority_barrier(gate, queue)) is not None]
            if ahead:  # a priority barrier: taken before the records queued ahead of it, even on a blocked channel
                c, at = rng.choice(ahead)
                channel = ChannelIndex(c)
                barrier = queues[c].pop(at)
                assert isinstance(barrier, Barrier)
                checkpoint_id = barrier.checkpoint_id
                operator.barrier_reads.setdefault(checkpoint_id, []).append(BarrierArrival(channel, now))
                operator.overtaken = (channel, at)
                operator.apply(
                    aligner.on_barrier(channel, checkpoint_id, gate.kinds[checkpoint_id], now=now, priority=True)
                )
                operator.overtaken = None
                continue
        readable = [
            ChannelIndex(channel) for channel, queue in enumerate(queues) if queue and channel not in operator.blocked
        ]
        if not readable:
            break
        channel = rng.choice(readable)
        event = queues[channel].pop(0)
        match event:
            case Record():
                operator.read_record(channel)
            case Barrier(checkpoint_id):
                operator.barrier_reads.setdefault(checkpoint_id, []).append(BarrierArrival(channel, now))
                kind, alignment = gate.kinds[checkpoint_id], gate.alignments[checkpoint_id]
                operator.apply(aligner.on_barrier(channel, checkpoint_id, kind, now=now, alignment=alignment))
            case Cancel(checkpoint_id):
                operator.apply(aligner.on_cancellation(channel, checkpoint_id))
            case End():
                operator.apply(aligner.on_end_of_stream(channel, now=now))
        assert operator.blocked == aligner.blocked_channels
        assert set(operator.capturing) == aligner.capturing_channels
        if mode is ALO:
            assert not operator.blocked
        if mode is UNALIGNED and operator.blocked:
            pending = aligner.pending_checkpoint
            assert pending is not None
            assert aligned_start or not gate.prioritizable(pending), "unaligned mode blocked a channel"

    assert not any(queues), "the gate did not drain: deadlock"
    assert aligner.pending_checkpoint is None
    assert operator.ended == 1
    assert not operator.capturing
    assert set(operator.completed).isdisjoint(operator.aborted)
    return operator


@pytest.mark.parametrize(("mode", "aligned_start"), [(EO, False), (ALO, False), (UNALIGNED, False), (UNALIGNED, True)])
def test_massive_random_interleavings(mode: CheckpointingMode, aligned_start: bool) -> None:
    completions = forced = 0
    for seed in range(700):
        rng = random.Random(f"{mode.value}-{aligned_start}-{seed}" if aligned_start else f"{mode.value}-{seed}")
        gate = random_gate(rng)
        operator = drain(gate, mode, rng, aligned_start=aligned_start)
        completions += len(operator.completed)
        forced += operator.forced_completed
        if mode is not EO:
            continue
        for checkpoint_id in gate.kinds:
            markers = gate.markers(checkpoint_id)
            undisturbed = (
                any(isinstance(marker, Barrier) for marker in markers)
                and not any(isinstance(marker, Cancel) for marker in markers)
                and not gate.skipped_by_a_live_channel(checkpoint_id)
                and checkpoint_id not in operator.aborted_by_jobmanager
            )
            if undisturbed:
                assert checkpoint_id in operator.completed, (seed, checkpoint_id)
    assert completions > 700
    assert forced > 100, "too few forced aligned checkpoints completed to show they stay aligned"
