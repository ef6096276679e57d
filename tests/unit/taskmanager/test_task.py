"""A Task driven through fakes, no network: its mailbox, the barrier aligner's every action, watermarks,
end of stream, and a record's path from the source through the chain into the record writer."""

from __future__ import annotations

import time
from typing import Any, get_args

import pytest

from taskmanager import barrier_aligner as ba
from taskmanager.mailbox import CheckpointRequest
from taskmanager.network import (
    barrier_message,
    cancel_barrier_message,
    encode_records,
    end_of_stream_message,
    watermark_message,
)
from taskmanager.task import UnsupportedCheckpointAction
from tests.unit.taskmanager.fakes import Harness, make_task
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.states import TaskState
from weir.core.watermarks import MAX_WATERMARK
from weir.wire import taskmanager_pb2

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
REFUSED: list[ba.Action] = [
    _trigger(capture_inflight=True),
    ba.StartCapture(ChannelIndex(0), CID),
    ba.StopCapture(ChannelIndex(0), CID),
    ba.InflightCaptureComplete(CID),
]


def test_every_action_class_of_the_aligner_is_carried_out_or_refused() -> None:
    covered = {type(a) for a, _ in CARRIED_OUT} | {type(a) for a in REFUSED}
    assert covered == set(get_args(ba.Action))


@pytest.mark.parametrize(("action", "effect"), CARRIED_OUT, ids=[e for _, e in CARRIED_OUT])
def test_an_aligner_action_is_carried_out(action: ba.Action, effect: str) -> None:
    h = make_task("op", channels=2)
    if isinstance(action, ba.UnblockChannels):
        h.gate.block(1)
    h.task._apply([action])  # noqa: SLF001
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
            assert h.task._input_ended  # noqa: SLF001


@pytest.mark.parametrize("action", REFUSED, ids=[type(a).__name__ for a in REFUSED])
def test_an_unaligned_checkpoint_action_fails_the_task_with_a_clear_error(action: ba.Action) -> None:
    h = make_task("op", channels=2)
    with pytest.raises(UnsupportedCheckpointAction, match=r"checkpoint 7 needs \w+ .*unaligned checkpoints"):
        h.task._apply([action])  # noqa: SLF001
    assert not h.acks and h.out.stream() == []


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
