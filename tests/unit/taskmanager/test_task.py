"""A Task driven through fakes, no network: its mailbox, the barrier aligner's every action, watermarks,
end of stream, and a record's path from the source through the chain into the record writer."""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, get_args

import pytest
import structlog

from tests.unit.taskmanager.fakes import FakeChannel, Harness, Journal, ListSource, Recording, make_task, writer_to
from weir.core.checkpointing import BarrierAlignment, CheckpointingMode, CheckpointKind
from weir.core.ids import ChannelIndex, CheckpointId, KeyGroup, SubtaskIndex
from weir.core.keygroups import KeyEncoder, KeyGroupRange, key_group_range_for_subtask
from weir.core.states import TaskState
from weir.core.task_state import InlineOperatorState, SubtaskLayout, TaskStateDocument
from weir.core.watermarks import MAX_WATERMARK
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.plan import build_plan
from weir.taskmanager import barrier_aligner as ba
from weir.taskmanager.checkpointer import UnalignedAck
from weir.taskmanager.inflight import (
    INFLIGHT_STATE_NAME,
    InflightState,
    InputOrigin,
    OutputTarget,
    decode_inflight,
    encode_inflight,
    parse_message,
)
from weir.taskmanager.mailbox import CheckpointRequest
from weir.taskmanager.network.codec import (
    Barrier,
    barrier_message,
    cancel_barrier_message,
    encode_records,
    end_of_stream_message,
    read_buffer,
    watermark_message,
)
from weir.taskmanager.task import Task
from weir.taskmanager.task_types import ChainRestore, InheritedRestore, TaskAddress, TaskCallbacks
from weir.wire import common_pb2, taskmanager_pb2

CHECKPOINT = CheckpointKind.CHECKPOINT


def data(*values: Any) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(
        records=encode_records(list(values), [None] * len(values)), record_count=len(values)
    )


@pytest.fixture
def op_task() -> Any:
    """The ``op -> sink`` vertex with two input channels, stopped after the test."""
    harnesses: list[Harness] = []

    def make(channels: int = 2) -> Harness:
        harness = make_task("op", channels)
        harnesses.append(harness)
        return harness

    yield make
    for harness in harnesses:
        harness.task.cancel()
        harness.task.join(10)


# The mailbox ------------------------------------------------------------------------------------


def test_a_checkpoint_notification_wakes_an_input_task_that_has_no_data(op_task: Any) -> None:
    h = op_task()
    h.task.start()
    h.wait_for_state(TaskState.RUNNING)
    h.task.notify_checkpoint_complete(4)
    h.journal.wait_for(lambda: ("complete", 4) in h.journal.of("op"))
    assert ("complete", 4) in h.journal.of("sink")  # every operator of the chain


def test_a_cancel_wakes_an_idle_input_task_at_once(op_task: Any) -> None:
    h = op_task()
    h.task.start()
    h.wait_for_state(TaskState.RUNNING)
    h.task.cancel()
    h.task.join(10)
    assert h.task.state is TaskState.CANCELED


# Barriers, cancellation markers, watermarks, end of stream --------------------------------------


def test_aligned_barriers_snapshot_the_chain_between_the_records_before_and_after(op_task: Any) -> None:
    h = op_task()
    gate = h.gate
    gate.push(0, data(1))
    gate.push(0, barrier_message(1, time.time(), CHECKPOINT))
    gate.push(0, data(2))  # behind the barrier: held back until channel 1's barrier arrives
    gate.push(1, data(3))
    gate.push(1, barrier_message(1, time.time(), CHECKPOINT))
    gate.push(0, end_of_stream_message())
    gate.push(1, end_of_stream_message())
    h.task.start()
    h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
    assert h.acks[0].snapshot.operator_states == {"op": b"op@1", "sink": b"sink@1"}
    assert h.task.state is TaskState.RUNNING  # waits for checkpoint 1's notification before it ends
    h.task.notify_checkpoint_complete(1)
    h.wait_for_state(TaskState.FINISHED)
    stream = h.out.stream()
    barrier_at = next(i for i, e in enumerate(stream) if e.startswith("Barrier:1:"))
    assert sorted(stream[:barrier_at]) == ["r:1", "r:3"]
    assert stream[barrier_at + 1 :] == ["r:2", f"WatermarkEvent:{MAX_WATERMARK}", "EndOfStream"]
    assert h.journal.of("op")[-1] == ("end_input",) and h.journal.of("sink")[-1] == ("end_input",)


def test_a_cancellation_marker_aborts_the_alignment_declines_and_is_forwarded(op_task: Any) -> None:
    h = op_task()
    h.gate.push(0, barrier_message(2, time.time(), CHECKPOINT))
    h.gate.push(1, cancel_barrier_message(2))
    h.gate.push(0, end_of_stream_message())
    h.gate.push(1, end_of_stream_message())
    h.task.start()
    h.wait_for_state(TaskState.FINISHED)
    assert ("decline", 2, "cancelled_upstream") in h.journal.of("task")
    assert h.out.stream() == ["CancelBarrier:2", f"WatermarkEvent:{MAX_WATERMARK}", "EndOfStream"]
    assert not h.acks


def test_the_head_sees_the_minimum_watermark_over_its_channels_until_each_ends(op_task: Any) -> None:
    h = op_task()
    h.gate.push(0, watermark_message(10))
    h.gate.push(1, watermark_message(20))
    h.gate.push(0, end_of_stream_message())  # channel 0 no longer holds the watermark back
    h.gate.push(1, end_of_stream_message())
    h.task.start()
    h.wait_for_state(TaskState.FINISHED)
    assert h.journal.of("op") == [
        ("open",),
        ("watermark", 10),
        ("watermark", 20),
        ("watermark", MAX_WATERMARK),
        ("end_input",),
    ]
    assert h.journal.of("sink")[1:] == [
        ("watermark", 10),
        ("watermark", 20),
        ("watermark", MAX_WATERMARK),
        ("end_input",),
    ]


# The barrier aligner's actions ------------------------------------------------------------------

CID = CheckpointId(7)


def _trigger(capture_inflight: bool = False) -> ba.TriggerSnapshot:
    return ba.TriggerSnapshot(CID, CHECKPOINT, 1.0, 1.5, capture_inflight=capture_inflight)


CARRIED_OUT: list[tuple[ba.Action, str]] = [
    (ba.BlockChannel(ChannelIndex(1)), "channel 1 blocked"),
    (ba.UnblockChannels((ChannelIndex(1),)), "channel 1 unblocked"),
    (_trigger(), "snapshot acknowledged, barrier forwarded"),
    (ba.ForwardCancellation(CID), "cancellation forwarded"),
    (ba.AbortedCheckpoint(CID, ba.AbortReason.CANCELLED_UPSTREAM), "declined"),
    (ba.AbortedCheckpoint(CID, ba.AbortReason.ABORTED_BY_JOBMANAGER), "not declined"),
    (ba.AllChannelsEnded(), "input ended"),
]
UNALIGNED_ACTIONS: list[ba.Action] = [  # carried out in the unaligned tests below
    _trigger(capture_inflight=True),
    ba.StartCapture(ChannelIndex(0), CID),
    ba.StopCapture(ChannelIndex(0), CID),
    ba.CaptureQueued(ChannelIndex(0), CID),
    ba.InflightCaptureComplete(CID),
]


def test_every_action_class_of_the_aligner_is_carried_out() -> None:
    covered = {type(a) for a, _ in CARRIED_OUT} | {type(a) for a in UNALIGNED_ACTIONS}
    assert covered == set(get_args(ba.Action))


@pytest.mark.parametrize(("action", "effect"), CARRIED_OUT, ids=[e for _, e in CARRIED_OUT])
def test_an_aligner_action_is_carried_out(action: ba.Action, effect: str) -> None:
    h = make_task("op", channels=2)
    if isinstance(action, ba.UnblockChannels):
        h.gate.block(1)
    h.task.input.apply([action])
    channel = h.gate.channels[1]
    task_journal = h.journal.of("task")
    match effect:
        case "channel 1 blocked":
            assert channel.blocked
        case "channel 1 unblocked":
            assert not channel.blocked
        case "snapshot acknowledged, barrier forwarded":
            assert task_journal == [("ack", 7)] and h.acks[0].alignment_s == pytest.approx(0.5)
            assert h.out.stream()[0].startswith("Barrier:7:")
        case "cancellation forwarded":
            assert h.out.stream() == ["CancelBarrier:7"]
        case "declined":
            assert task_journal == [("decline", 7, "cancelled_upstream")]
        case "not declined":
            assert task_journal == []
        case "input ended":
            assert h.task.input.ended


def test_the_unaligned_actions_capture_and_acknowledge_with_the_inflight_records() -> None:
    h = make_task("op", channels=2)
    h.task.input.apply([_trigger(capture_inflight=True), ba.StartCapture(ChannelIndex(1), CID)])
    assert h.out.stream()[0].startswith("Barrier:7:") and not h.acks  # forwarded at once, not acknowledged
    capture = h.task.checkpointer.capture
    assert capture is not None
    capture.add(ChannelIndex(1), data(1))
    h.task.input.apply(
        [ba.StopCapture(ChannelIndex(1), CID), ba.CaptureQueued(ChannelIndex(1), CID), ba.InflightCaptureComplete(CID)],
        overtaken=(data(2),),  # what channel 1's barrier overtook
    )
    (ack,) = h.acks
    inflight = decode_inflight(ack.snapshot.operator_states[INFLIGHT_STATE_NAME], "test")
    assert inflight == InflightState(CID, {ChannelIndex(1): (data(1).SerializeToString(), data(2).SerializeToString())})
    assert ack.snapshot.operator_states["op"] == b"op@7"
    assert ack.inflight_bytes == len(data(1).SerializeToString()) + len(data(2).SerializeToString())


def test_an_unaligned_checkpoint_that_overtook_nothing_reports_no_bytes_in_flight() -> None:
    """Its in-flight document is stored all the same (a restore reads it), but the bytes in flight
    the checkpoint statistics and metrics show are the buffers': an empty capture's document was
    reported as 53 bytes in flight, and a checkpoint taken after the sources had read everything
    looked like one holding records."""
    h = make_task("op", channels=1, mode=CheckpointingMode.UNALIGNED)
    h.task.input.apply([_trigger(capture_inflight=True), ba.StartCapture(ChannelIndex(0), CID)])
    h.task.input.apply([ba.StopCapture(ChannelIndex(0), CID), ba.InflightCaptureComplete(CID)])
    (ack,) = h.acks
    assert decode_inflight(ack.snapshot.operator_states[INFLIGHT_STATE_NAME], "test") == InflightState(CID)
    assert ack.inflight_bytes == 0


def test_a_capture_of_another_checkpoint_is_a_protocol_error() -> None:
    h = make_task("op", channels=2)
    with pytest.raises(ba.InputProtocolError, match="in-flight capture"):
        h.task.input.apply([ba.StartCapture(ChannelIndex(0), CID)])


def test_an_unaligned_ack_joins_its_snapshot_and_its_capture_in_either_order() -> None:
    h = make_task("op", channels=2)
    h.task.input.apply([_trigger()])
    (ack,) = h.acks
    for first_snapshot in (True, False):
        join = UnalignedAck()
        first = join.snapshot_done(ack) if first_snapshot else join.inflight_done(b"i", 7, ())
        second = join.inflight_done(b"i", 7, ()) if first_snapshot else join.snapshot_done(ack)
        assert first is None and second is not None
        assert second.snapshot.operator_states == {**ack.snapshot.operator_states, INFLIGHT_STATE_NAME: b"i"}
        assert second.inflight_bytes == 7
        assert join.snapshot_done(ack) is None  # sent once
    dropped = UnalignedAck()
    dropped.drop()
    dropped.snapshot_done(ack)
    assert dropped.inflight_done(b"i", 7, ()) is None


# The checkpoint timeline ------------------------------------------------------------------------


def test_an_aligned_ack_carries_the_timeline_of_its_barrier_and_snapshot(op_task: Any) -> None:
    h = op_task(1)
    before = time.time()
    h.gate.push(0, data(1))
    h.gate.push(0, barrier_message(3, before, CHECKPOINT))
    h.task.start()
    h.journal.wait_for(lambda: ("ack", 3) in h.journal.of("task"))
    after = time.time()
    timeline = h.acks[0].timeline
    assert timeline is not None
    (channel,) = timeline.channels
    assert (channel.channel, channel.upstream_vertex, channel.upstream_subtask) == (0, "src", 0)
    assert channel.barrier_at is not None
    assert before <= timeline.first_barrier_at == channel.barrier_at == timeline.alignment_end_at
    assert timeline.alignment_end_at <= timeline.sync_end_at <= timeline.async_end_at <= after


def test_a_source_ack_has_a_timeline_without_channels() -> None:
    h = make_task("src", source_values=[])
    before = time.time()
    h.task.checkpointer.trigger(CheckpointRequest(CID, before, CHECKPOINT))
    (ack,) = h.acks
    assert ack.timeline is not None and ack.timeline.channels == ()
    assert before <= ack.timeline.first_barrier_at == ack.timeline.alignment_end_at
    assert ack.timeline.alignment_end_at <= ack.timeline.sync_end_at <= ack.timeline.async_end_at


def test_an_unaligned_ack_carries_the_barriers_that_came_after_its_snapshot() -> None:
    h = make_task("op", channels=1, mode=CheckpointingMode.UNALIGNED)
    first = ba.BarrierArrival(ChannelIndex(0), 10.0)
    trigger = ba.TriggerSnapshot(CID, CHECKPOINT, 10.0, 10.0, capture_inflight=True, barriers=(first,))
    h.task.input.apply([trigger, ba.StartCapture(ChannelIndex(0), CID)])
    assert not h.acks
    h.task.input.apply(
        [ba.StopCapture(ChannelIndex(0), CID), ba.InflightCaptureComplete(CID, barriers=(first,))]
    )
    (ack,) = h.acks
    assert ack.timeline is not None
    assert [(c.channel, c.barrier_at) for c in ack.timeline.channels] == [(0, 10.0)]
    assert (ack.timeline.first_barrier_at, ack.timeline.alignment_end_at) == (10.0, 10.0)


def test_a_channel_without_a_barrier_has_none_in_the_timeline() -> None:
    h = make_task("op", channels=1)
    h.task.input.apply([ba.TriggerSnapshot(CID, CHECKPOINT, 1.0, 2.0, barriers=())])  # channel 0 ended
    (ack,) = h.acks
    assert ack.timeline is not None
    assert [(c.channel, c.barrier_at) for c in ack.timeline.channels] == [(0, None)]
    assert (ack.timeline.first_barrier_at, ack.timeline.alignment_end_at) == (1.0, 2.0)


def _values(h: Harness) -> list[str]:
    return [e for e in h.out.stream() if e.startswith("r:") or e.startswith("Barrier:")]


def test_an_unaligned_barrier_overtakes_and_the_records_behind_it_are_captured() -> None:
    h = make_task("op", channels=2, mode=CheckpointingMode.UNALIGNED)
    assert h.gate is not None
    try:
        h.gate.push(0, data(1))
        h.gate.push(0, barrier_message(1, time.time(), CHECKPOINT))
        h.task.start()
        h.journal.wait_for(lambda: any(e.startswith("Barrier:1:") for e in h.out.stream()))
        h.gate.push(0, data(2))  # after channel 0's barrier: not the checkpoint's
        h.gate.push(1, data(3, 4))  # in flight on channel 1: processed now and captured
        h.journal.wait_for(lambda: ("sink", "record", 4) in h.journal.entries)
        assert not h.acks  # channel 1's barrier is still to come
        h.gate.push(1, barrier_message(1, time.time(), CHECKPOINT))
        h.gate.push(1, data(5))
        h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
        states = h.acks[0].snapshot.operator_states
        assert states["op"] == b"op@1" and states["sink"] == b"sink@1"
        inflight = decode_inflight(states[INFLIGHT_STATE_NAME], "test")
        assert list(inflight.channels) == [1]
        assert [v for _, blob in inflight.replay() for v in read_buffer(parse_message(blob, "test")).values] == [3, 4]
        h.gate.push(0, end_of_stream_message())
        h.gate.push(1, end_of_stream_message())
        h.task.notify_checkpoint_complete(1)
        h.wait_for_state(TaskState.FINISHED)
        stream = _values(h)
        assert stream[:2] == ["r:1", stream[1]] and stream[1].startswith("Barrier:1:")
        assert sorted(stream[2:]) == ["r:2", "r:3", "r:4", "r:5"]
    finally:
        h.task.cancel()
        h.task.join(10)


def _priority_barrier(checkpoint_id: int) -> taskmanager_pb2.DataMessage:
    barrier = barrier_message(checkpoint_id, time.time(), CHECKPOINT)
    barrier.priority = True
    return barrier


def test_a_priority_barrier_overtakes_both_queues_and_the_checkpoint_keeps_what_it_overtook() -> None:
    """FLIP-76: the barrier is taken ahead of the input queue and sent ahead of the output queue; the
    buffers it overtook on both sides are the checkpoint's in-flight state, and still flow on."""
    h = make_task("op", channels=2, mode=CheckpointingMode.UNALIGNED)
    assert h.gate is not None
    h.out.overtake = [data(9)]  # what the output channel still queues when the barrier goes out
    try:
        h.gate.push(0, data(1))
        h.gate.push(0, data(2))
        h.gate.push(0, _priority_barrier(1))
        h.task.start()
        h.journal.wait_for(lambda: any(e.startswith("Barrier:1:") for e in h.out.stream()))
        h.gate.push(1, data(3))  # in flight on channel 1 until its barrier
        h.gate.push(1, data(4))
        h.gate.push(1, _priority_barrier(1))  # may overtake data(4), or come after it was read
        h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
        inflight = decode_inflight(h.acks[0].snapshot.operator_states[INFLIGHT_STATE_NAME], "test")
        by_channel = {
            c: [v for b in blobs for v in read_buffer(parse_message(b, "test")).values]
            for c, blobs in inflight.channels.items()
        }
        assert by_channel == {0: [1, 2], 1: [3, 4]}
        assert inflight.outputs == {(0, 0): (data(9).SerializeToString(),)}
        assert inflight.targets == {0: OutputTarget("down", 0, "op")}, "the buffers name the consumer they were for"
        assert h.acks[0].snapshot.operator_states["op"] == b"op@1", "the snapshot came after records 1 and 2"
        assert _values(h)[0].startswith("Barrier:1:"), "the barrier waited behind the queued records"
        h.gate.push(0, end_of_stream_message())
        h.gate.push(1, end_of_stream_message())
        h.task.notify_checkpoint_complete(1)
        h.wait_for_state(TaskState.FINISHED)
        assert sorted(_values(h)[1:]) == ["r:1", "r:2", "r:3", "r:4"]
    finally:
        h.task.cancel()
        h.task.join(10)


def test_an_aborted_unaligned_checkpoint_drops_its_capture_and_is_never_acknowledged() -> None:
    h = make_task("op", channels=2, mode=CheckpointingMode.UNALIGNED)
    assert h.gate is not None
    try:
        h.gate.push(0, barrier_message(1, time.time(), CHECKPOINT))
        h.task.start()
        h.journal.wait_for(lambda: any(e.startswith("Barrier:1:") for e in h.out.stream()))
        h.task.notify_checkpoint_aborted(1)
        h.journal.wait_for(lambda: ("aborted", 1) in h.journal.of("op"))
        h.gate.push(1, data(3))
        h.gate.push(1, barrier_message(1, time.time(), CHECKPOINT))
        h.gate.push(0, end_of_stream_message())
        h.gate.push(1, end_of_stream_message())
        h.wait_for_state(TaskState.FINISHED)
        assert not h.acks and h.task.checkpointer.capture is None
    finally:
        h.task.cancel()
        h.task.join(10)


# The final checkpoint: forced aligned in every mode (FLIP-147) ---------------------------------------


def _barriers(h: Harness) -> list[taskmanager_pb2.DataMessage]:
    return [m for m in h.out.sent if m.event == taskmanager_pb2.EVENT_KIND_BARRIER]


@pytest.mark.parametrize("timeout", [False, True])
def test_a_source_sends_the_final_barrier_in_order_and_forced_aligned_in_unaligned_mode(timeout: bool) -> None:
    """Its output still queues a buffer when the final checkpoint is triggered: the barrier waits
    behind it (an unaligned one would overtake it into the checkpoint's in-flight state, and the
    sink would pre-commit before those records reached it)."""
    h = make_task(
        "src",
        source_values=[1, 2, 3],
        mode=CheckpointingMode.UNALIGNED,
        aligned_checkpoint_timeout_s=0.001 if timeout else 0.0,  # aligned-checkpoint timeout or not
    )
    h.out.overtake = [data(9)]  # what the output channel queues, waiting for credit
    h.task.start()
    try:
        h.journal.wait_for(lambda: ("input_ended",) in h.journal.of("task"))
        h.task.trigger_checkpoint(CheckpointRequest(CheckpointId(3), time.time(), CHECKPOINT, final=True))
        h.journal.wait_for(lambda: ("ack", 3) in h.journal.of("task"))
        (barrier,) = _barriers(h)
        assert not barrier.priority, "the final barrier overtook what the output queued"
        assert read_buffer(barrier).event == Barrier(  # type: ignore[arg-type]
            3, barrier.checkpoint_timestamp, CHECKPOINT, BarrierAlignment.FORCED_ALIGNED
        )
        assert INFLIGHT_STATE_NAME not in h.acks[0].snapshot.operator_states
        assert h.acks[0].inflight_bytes == 0
        h.task.notify_checkpoint_complete(3)
        h.wait_for_state(TaskState.FINISHED)
    finally:
        h.task.cancel()
        h.task.join(10)


def test_a_periodic_checkpoint_of_a_source_in_unaligned_mode_still_overtakes() -> None:
    h = make_task("src", source_values=[1], mode=CheckpointingMode.UNALIGNED)
    h.out.overtake = [data(9)]
    h.task.checkpointer.trigger(CheckpointRequest(CID, time.time(), CHECKPOINT))
    (barrier,) = _barriers(h)
    assert barrier.priority and barrier.barrier_alignment == common_pb2.BARRIER_ALIGNMENT_BY_MODE
    inflight = decode_inflight(h.acks[0].snapshot.operator_states[INFLIGHT_STATE_NAME], "test")
    assert inflight.outputs == {(0, 0): (data(9).SerializeToString(),)}


def test_a_task_aligns_a_forced_aligned_barrier_in_unaligned_mode_and_forwards_it_in_order() -> None:
    """Both channels queue records ahead of the final barrier: the snapshot comes after all of them,
    nothing is captured in flight, and the barrier goes on in order and forced aligned."""
    h = make_task("op", channels=2, mode=CheckpointingMode.UNALIGNED)
    assert h.gate is not None
    h.out.overtake = [data(9)]
    forced = BarrierAlignment.FORCED_ALIGNED
    try:
        h.gate.push(0, data(1))
        h.gate.push(0, barrier_message(4, time.time(), CHECKPOINT, forced))
        h.task.start()
        h.journal.wait_for(lambda: ("sink", "record", 1) in h.journal.entries)
        h.gate.push(1, data(2, 3))
        h.gate.push(1, barrier_message(4, time.time(), CHECKPOINT, forced))
        h.journal.wait_for(lambda: ("ack", 4) in h.journal.of("task"))
        (ack,) = h.acks
        assert INFLIGHT_STATE_NAME not in ack.snapshot.operator_states and ack.inflight_bytes == 0
        assert [e for e in h.journal.of("sink") if e[0] in ("record", "snapshot")] == [
            ("record", 1),
            ("record", 2),
            ("record", 3),
            ("snapshot", 4),
        ]
        (barrier,) = _barriers(h)
        assert not barrier.priority and barrier.barrier_alignment == common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED
        stream = _values(h)
        assert stream[:3] == ["r:1", "r:2", "r:3"] and stream[3].startswith("Barrier:4:"), stream
        h.gate.push(0, end_of_stream_message())
        h.gate.push(1, end_of_stream_message())
        h.task.notify_checkpoint_complete(4)
        h.wait_for_state(TaskState.FINISHED)
    finally:
        h.task.cancel()
        h.task.join(10)


def test_a_restore_replays_the_inflight_records_in_channel_order_before_any_new_input() -> None:
    inflight = InflightState(
        CheckpointId(4),
        {ChannelIndex(1): (data(7, 8).SerializeToString(),), ChannelIndex(0): (data(6).SerializeToString(),)},
        {(0, 0): (data(5).SerializeToString(),)},  # what the barrier overtook in the output: sent first
        targets={0: OutputTarget("down", 0, "op")},
    )
    restore = ChainRestore(4, InlineOperatorState({"op": b"op@4", INFLIGHT_STATE_NAME: encode_inflight(inflight)}))
    h = make_task("op", channels=2, restore=restore, restore_checkpoint_id=4)
    assert h.gate is not None
    try:
        h.gate.push(0, data(1))
        h.gate.push(1, data(2))
        h.gate.push(0, end_of_stream_message())
        h.gate.push(1, end_of_stream_message())
        h.task.start()
        h.wait_for_state(TaskState.FINISHED)
        assert ("restore", b"op@4") in h.journal.of("op")
        assert not any(e[0] == "restore" and e[1] != b"op@4" for e in h.journal.of("op"))
        assert _values(h)[:4] == ["r:5", "r:6", "r:7", "r:8"]
        assert sorted(_values(h)[4:]) == ["r:1", "r:2"]
    finally:
        h.task.cancel()
        h.task.join(10)


def _old_op_document(subtask: int, inflight: InflightState) -> TaskStateDocument:
    return TaskStateDocument(
        job_id="old",
        vertex_uid="op",
        subtask=subtask,
        attempt=1,
        checkpoint_id=CheckpointId(4),
        layout=SubtaskLayout(
            2, 128, KeyGroupRange(KeyGroup(64 * subtask), KeyGroup(64 * subtask + 63)), ("op", "sink"), ()
        ),
        operator_state=InlineOperatorState({INFLIGHT_STATE_NAME: encode_inflight(inflight)}),
    )


def test_inherited_inflight_state_without_channel_origins_fails_the_task_with_the_documented_limit() -> None:
    old = InflightState(CheckpointId(4), {ChannelIndex(0): (data(1).SerializeToString(),)})  # no origins: older
    h = make_task("op", channels=2, restore=InheritedRestore(4, (_old_op_document(0, old),)), restore_checkpoint_id=4)
    h.task.start()
    h.wait_for_state(TaskState.FAILED)
    assert "does not say where input channel 0 comes from" in str(h.task.failure)
    assert "restored only into the same operator chain" in str(h.task.failure)
    assert h.task.failure is not None and not h.task.failure.retriable


def test_inherited_inflight_records_of_a_keyed_edge_go_where_their_key_groups_now_live() -> None:
    """Two old subtasks of "op" (parallelism 2) in flight: the new subtask keeps the input records of
    the keyed edge whose key group it owns, from both; it takes old subtask j's output records when
    j mod its parallelism is its own index, and emits them anew."""
    src = InputOrigin(0, "src")
    olds = (
        _old_op_document(
            0,
            InflightState(
                CheckpointId(4),
                {ChannelIndex(0): (data(*range(0, 20)).SerializeToString(),)},
                {},
                {ChannelIndex(0): src},
            ),
        ),
        _old_op_document(
            1,
            InflightState(
                CheckpointId(4),
                {ChannelIndex(0): (data(*range(20, 40)).SerializeToString(),)},
                {(0, 0): (data(100, 101).SerializeToString(),)},
                {ChannelIndex(0): src},
                {0: OutputTarget("down", 0, "op")},
            ),
        ),
    )
    h = make_task("op", channels=1)
    h.task.key_group_range = KeyGroupRange(KeyGroup(0), KeyGroup(63))  # as subtask 0 of 2
    key_group = KeyEncoder(128).key_group
    replay = h.task.restorer().redistributed_inflight(olds)
    assert replay is not None and replay.redistributed
    replayed = [v for _, m in replay.inputs for v in read_buffer(m).values]
    assert replayed == [v for v in range(40) if key_group(v) <= 63]
    assert 0 < len(replayed) < 40
    assert [v for _, m in replay.emits for v in read_buffer(m).values] == [100, 101]  # 1 mod 1 == 0


# In-flight output records, routed by the consumer they were queued for -----------------------------

TOTALS = OutputTarget("totals", 0, "src")
ARCHIVE = OutputTarget("archive", 0, "src")


def _fan_out_graph(journal: Journal, consumers: tuple[str, ...]) -> LogicalGraph:
    """An empty source whose vertex sends to each of ``consumers`` (sinks), edges in that order."""
    graph = LogicalGraph("fan-out", 1, 128)
    graph.add(Transformation("src", "src", OperatorKind.SOURCE, lambda: ListSource(journal, [])))
    for name in consumers:
        graph.add(Transformation(name, name, OperatorKind.SINK, functools.partial(Recording, journal, name)))
        graph.connect(Edge("src", name, Partitioning.REBALANCE))
    return graph


@dataclass
class _FanOut:
    """A source task of :func:`_fan_out_graph` with one fake channel per consumer vertex."""

    task: Task
    journal: Journal
    channels: dict[str, FakeChannel]

    def records(self) -> dict[str, list[str]]:
        return {name: [e for e in ch.stream() if e.startswith("r:")] for name, ch in self.channels.items()}

    def run_until_input_ended(self) -> None:
        self.task.start()
        try:
            self.journal.wait_for(lambda: ("input_ended",) in self.journal.of("task"))
        finally:
            self.task.cancel()
            self.task.join(10)

    def run_until_failed(self) -> str:
        self.task.start()
        try:
            self.journal.wait_for(lambda: self.task.state is TaskState.FAILED)
        finally:
            self.task.cancel()
            self.task.join(10)
        return str(self.task.failure)


def _fan_out_task(consumers: tuple[str, ...], restore: ChainRestore | InheritedRestore) -> _FanOut:
    journal = Journal()
    plan = build_plan(_fan_out_graph(journal, consumers))
    vertex = plan.vertices["src"]
    channels = {edge.consumer_vertex: FakeChannel() for edge in vertex.outputs}
    task = Task(
        address=TaskAddress(f"new-{uuid.uuid4().hex[:8]}", "src", 0, 1),
        plan=plan,
        vertex=vertex,
        job_name="fan-out",
        parameters={},
        writers=[writer_to(channels[edge.consumer_vertex]) for edge in vertex.outputs],
        gate=None,
        callbacks=TaskCallbacks(
            lambda _a, state, failure: journal.add("task", "state", state, failure),
            lambda _a, ack: journal.add("task", "ack", ack.snapshot.checkpoint_id),
            lambda _a, cid, reason: journal.add("task", "decline", cid, reason),
            lambda _a: journal.add("task", "input_ended"),
        ),
        taskmanager_id="tm-test",
        restore=restore,
        restore_checkpoint_id=7,
    )
    return _FanOut(task, journal, channels)


def _old_src_document(subtask: int, parallelism: int, inflight: bytes) -> TaskStateDocument:
    return TaskStateDocument(
        job_id="old",
        vertex_uid="src",
        subtask=subtask,
        attempt=1,
        checkpoint_id=CheckpointId(7),
        layout=SubtaskLayout(
            parallelism, 128, key_group_range_for_subtask(128, parallelism, SubtaskIndex(subtask)), ("src",), ()
        ),
        operator_state=InlineOperatorState({INFLIGHT_STATE_NAME: inflight}),
    )


def _format_2(outputs: dict[tuple[int, int], list[taskmanager_pb2.DataMessage]]) -> bytes:
    """An in-flight document as Weir wrote it before output buffers named their consumer."""
    entries = [
        {"output": edge, "channel": channel, "buffers": [base64.b64encode(m.SerializeToString()).decode() for m in ms]}
        for (edge, channel), ms in sorted(outputs.items())
    ]
    return json.dumps({"format": 2, "checkpoint_id": 7, "input": [], "output": entries}).encode()


def _queued(targets: dict[int, OutputTarget], outputs: dict[int, taskmanager_pb2.DataMessage]) -> bytes:
    """An in-flight document of the source: ``outputs`` queued on channel 0 of each output edge."""
    return encode_inflight(
        InflightState(
            CheckpointId(7), {}, {(e, 0): (m.SerializeToString(),) for e, m in outputs.items()}, targets=targets
        )
    )


def test_inherited_inflight_output_records_go_to_the_consumer_they_were_queued_for() -> None:
    """The old job sent to totals then archive; the new one sends to audit, archive, totals (audit added
    before the others): each in-flight record goes out to the consumer it was queued for, none to audit."""
    old = _queued({0: TOTALS, 1: ARCHIVE}, {0: data("t1", "t2"), 1: data("a1")})
    run = _fan_out_task(("audit", "archive", "totals"), InheritedRestore(7, (_old_src_document(0, 1, old),)))
    run.run_until_input_ended()
    assert run.records() == {"audit": [], "archive": ["r:a1"], "totals": ["r:t1", "r:t2"]}


def test_inflight_output_records_restored_at_another_parallelism_go_to_their_consumer() -> None:
    """Two old subtasks (parallelism 2), one with records for totals, one for archive, restored into
    one new subtask whose edges are in another order: each is emitted anew into its own consumer."""
    olds = (
        _old_src_document(0, 2, _queued({0: TOTALS, 1: ARCHIVE}, {0: data("t1")})),
        _old_src_document(1, 2, _queued({0: TOTALS, 1: ARCHIVE}, {1: data("a1", "a2")})),
    )
    run = _fan_out_task(("archive", "audit", "totals"), InheritedRestore(7, olds))
    replay = run.task.restorer().redistributed_inflight(olds)
    assert replay is not None
    assert [(edge, read_buffer(m).values) for edge, m in replay.emits] == [(2, ["t1"]), (0, ["a1", "a2"])]
    run.run_until_input_ended()
    assert run.records() == {"archive": ["r:a1", "r:a2"], "audit": [], "totals": ["r:t1"]}


def test_a_same_job_restore_reads_the_old_output_format_by_output_index() -> None:
    """After a failover the plan is the one that wrote the checkpoint: output index i is still edge i."""
    old = _format_2({(0, 0): [data("t1")], (1, 0): [data("a1")]})
    run = _fan_out_task(("totals", "archive"), ChainRestore(7, InlineOperatorState({INFLIGHT_STATE_NAME: old})))
    run.run_until_input_ended()
    assert run.records() == {"totals": ["r:t1"], "archive": ["r:a1"]}


def test_an_inherited_restore_reads_the_old_output_format_into_a_task_with_one_output() -> None:
    run = _fan_out_task(("totals",), InheritedRestore(7, (_old_src_document(0, 1, _format_2({(0, 0): [data("t1")]})),)))
    run.run_until_input_ended()
    assert run.records() == {"totals": ["r:t1"]}


def test_an_inherited_restore_refuses_the_old_output_format_when_the_task_has_several_outputs() -> None:
    """Which consumer output 0 meant is unknown once another job connected another consumer first: the
    task fails with one line naming the checkpoint, the task and what to do, and sends nothing."""
    old = _format_2({(0, 0): [data("t1")]})
    run = _fan_out_task(("audit", "totals"), InheritedRestore(7, (_old_src_document(0, 1, old),)))
    message = run.run_until_failed()
    assert "\n" not in message
    assert "checkpoint 7" in message and "src#0" in message and "2 outputs" in message
    assert "savepoint" in message
    assert run.task.failure is not None and not run.task.failure.retriable
    assert run.records() == {"audit": [], "totals": []}


def test_inflight_output_records_of_a_consumer_the_new_job_lacks_are_dropped_loudly() -> None:
    """The JobManager lets such a restore through only with --allow-non-restored-state: the task drops
    the records of the vanished consumer with a warning that counts them, and sends them nowhere else."""
    old = _queued({0: TOTALS, 1: ARCHIVE}, {0: data("t1", "t2"), 1: data("a1")})
    with structlog.testing.capture_logs() as logs:
        run = _fan_out_task(("audit", "archive"), InheritedRestore(7, (_old_src_document(0, 1, old),)))
        run.run_until_input_ended()
    assert run.records() == {"audit": [], "archive": ["r:a1"]}
    dropped = [e for e in logs if e["event"] == "inflight_records_dropped"]
    assert [(e["log_level"], e["consumer"], e["records"], e["checkpoint_id"]) for e in dropped] == [
        ("warning", "totals", 2, 7)
    ]


# A record's path --------------------------------------------------------------------------------


def test_records_flow_from_the_source_through_the_chain_into_the_writer_in_order() -> None:
    h = make_task("src", source_values=list(range(1200)))
    h.task.start()
    try:
        h.journal.wait_for(lambda: ("input_ended",) in h.journal.of("task"))
        h.task.trigger_checkpoint(CheckpointRequest(CheckpointId(3), time.time(), CHECKPOINT, final=True))
        h.journal.wait_for(lambda: ("ack", 3) in h.journal.of("task"))
        h.task.notify_checkpoint_complete(3)
        h.wait_for_state(TaskState.FINISHED)
    finally:
        h.task.cancel()
        h.task.join(10)
    stream = h.out.stream()
    assert stream[:1200] == [f"r:{v * 10}" for v in range(1200)]
    assert stream[1200] == f"WatermarkEvent:{MAX_WATERMARK}" and stream[1201].startswith("Barrier:3:")
    assert stream[1202:] == ["EndOfStream"]
    assert h.journal.of("map")[-1] == ("end_input",) and h.journal.of("source") == [("end_input",)]


def test_a_backpressured_source_waits_for_its_output_instead_of_spinning_and_counts_it() -> None:
    """The source stops polling while its output is unavailable and waits on its mailbox; its timers
    (buffer timeout, metrics sync) go on, so their deadlines never turn the wait into a busy loop."""
    h = make_task("src", source_values=list(range(100_000)))
    h.out.backpressured = True
    h.task.start()
    try:
        h.wait_for_state(TaskState.RUNNING)
        threading.Event().wait(1.5)  # a window of time to count wake-ups in (not a wait for an event)
        assert h.out.availability_checks < 200, f"{h.out.availability_checks} availability checks: a busy loop"
        assert h.task.sync_backpressure() > 1.0, "the wait for output is not counted as backpressured"
        assert h.task.chain.source.records_polled <= 500  # type: ignore[union-attr]  # one batch, then it waited
    finally:
        h.task.cancel()
        h.task.join(10)
