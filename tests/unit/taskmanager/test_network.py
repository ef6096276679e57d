"""The data plane without gRPC: the consumer's InputGate and the producer's RecordWriter."""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from weir.core.checkpointing import BarrierAlignment, CheckpointKind
from weir.core.errors import ProtocolError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for, key_to_bytes, subtask_for_key_group
from weir.core.serde import dumps_value
from weir.taskmanager.network import writer as writer_module
from weir.taskmanager.network.codec import (
    Barrier,
    ChannelBuffer,
    ChannelClosedError,
    barrier_message,
    decode_records,
    encode_records,
    end_of_stream_message,
    message_of,
    read_buffer,
    watermark_message,
)
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import OUTPUT_QUEUE_LIMIT, RemoteOutputChannel
from weir.taskmanager.network.writer import RECORDS_PER_BUFFER, RecordWriter
from weir.taskmanager.partitioners import BroadcastPartitioner, KeyGroupPartitioner, RebalancePartitioner
from weir.wire import common_pb2, taskmanager_pb2

Event = taskmanager_pb2.EventKind


def data(*values: Any) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(
        records=encode_records(list(values), [None] * len(values)), record_count=len(values)
    )


def values_of(buffer: ChannelBuffer) -> list[Any]:
    return read_buffer(buffer).values


def announced(gate: InputGate, channel: int) -> list[int | None]:
    grants: list[int | None] = []
    while True:
        try:
            grants.append(gate.channels[channel].announcements.get_nowait())
        except queue.Empty:
            return grants


# InputGate ------------------------------------------------------------------------------------------


def test_poll_takes_buffers_round_robin_with_their_gate() -> None:
    gate = InputGate([0, 0, 1])
    gate.push(0, data("a1"))
    gate.push(0, data("a2"))
    gate.push(1, data("b1"))
    gate.push(1, data("b2"))
    gate.push(2, data("c1"))
    assert gate.queued_buffers() == 5
    polled = []
    while (item := gate.poll(0)) is not None:
        channel, input_gate, msg = item
        polled.append((channel, input_gate, values_of(msg)))
    assert polled == [(0, 0, ["a1"]), (1, 0, ["b1"]), (2, 1, ["c1"]), (0, 0, ["a2"]), (1, 0, ["b2"])]
    assert gate.queued_buffers() == 0


def test_poll_returns_none_when_nothing_is_queued() -> None:
    assert InputGate([0, 0]).poll(0) is None


def test_blocked_channels_are_skipped_until_unblocked() -> None:
    gate = InputGate([0, 0, 0])
    gate.push(0, data("a"))
    gate.push(1, data("b"))
    gate.push(2, data("c"))
    gate.block(0)
    gate.block(2)
    item = gate.poll(0)
    assert item is not None and item[0] == 1
    assert gate.poll(0) is None
    gate.unblock([2])
    item = gate.poll(0)
    assert item is not None and item[0] == 2
    assert gate.poll(0) is None
    gate.unblock()
    item = gate.poll(0)
    assert item is not None and values_of(item[2]) == ["a"]


def test_a_consumed_buffer_announces_a_credit() -> None:
    gate = InputGate([0, 0], initial_credits=2)
    assert gate.connect(0) == 2
    gate.push(0, data(1))
    gate.push(0, data(2))
    assert announced(gate, 0) == []
    gate.poll(0)
    assert announced(gate, 0) == [1]
    assert announced(gate, 1) == []
    gate.push(0, data(3))  # the announced credit allows one more buffer


def test_a_producer_overrunning_its_credit_is_a_protocol_error() -> None:
    gate = InputGate([0], initial_credits=2)
    gate.push(0, data(1))
    gate.push(0, data(2))
    with pytest.raises(ProtocolError, match="overran its credit"):
        gate.push(0, data(3))
    assert gate.queued_buffers() == 2
    assert gate.capacity() == 2


def test_a_channel_connects_once() -> None:
    gate = InputGate([0, 1])
    gate.connect(1)
    with pytest.raises(ProtocolError, match="input channel 1 is already connected"):
        gate.connect(1)


def test_end_of_stream_marks_the_channel_ended_when_taken() -> None:
    gate = InputGate([0, 0])
    gate.push(0, data("last"))
    gate.push(0, end_of_stream_message())
    channel = gate.channels[0]
    assert channel.eos_received and not channel.ended
    gate.poll(0)
    assert not channel.ended
    _, _, msg = gate.poll(0)  # type: ignore[misc]
    assert message_of(msg).event == Event.EVENT_KIND_END_OF_STREAM
    assert channel.ended and not gate.channels[1].ended


def test_producer_gone_after_end_of_stream_is_not_a_failure() -> None:
    gate = InputGate([0, 0])
    gate.push(0, data("x"))
    gate.push(0, end_of_stream_message())
    gate.producer_gone(0, "stream closed")
    assert values_of(gate.poll(0)[2]) == ["x"]  # type: ignore[index]
    assert message_of(gate.poll(0)[2]).event == Event.EVENT_KIND_END_OF_STREAM  # type: ignore[index]
    assert gate.poll(0) is None


def test_producer_gone_before_end_of_stream_fails_the_poll() -> None:
    gate = InputGate([0, 0])
    gate.push(0, data("queued"))
    gate.producer_gone(1, "UNAVAILABLE: connection reset")
    with pytest.raises(ChannelClosedError, match="input channel 1 lost its producer: UNAVAILABLE: connection reset"):
        gate.poll(0)
    assert ChannelClosedError.retriable


def test_poll_wakes_up_when_a_buffer_arrives() -> None:
    gate = InputGate([0])
    result: list[Any] = []
    poller = threading.Thread(target=lambda: result.append(gate.poll(30)))
    poller.start()
    gate.push(0, watermark_message(5))
    poller.join(10)
    assert not poller.is_alive()
    assert result[0][2].watermark == 5


def test_close_ends_every_announcement_queue() -> None:
    gate = InputGate([0, 1])
    gate.close()
    assert announced(gate, 0) == [None] and announced(gate, 1) == [None]


# RecordWriter ---------------------------------------------------------------------------------------


class FakeChannel:
    """What RecordWriter needs from a RemoteOutputChannel, recording what it is given."""

    def __init__(self) -> None:
        self.sent: list[taskmanager_pb2.DataMessage] = []
        self.credits = 4
        self.bytes_sent = 0
        self.backpressured_s = 0.0
        self.closed = False

    def send(self, msg: taskmanager_pb2.DataMessage) -> None:
        self.sent.append(msg)
        self.bytes_sent += len(msg.records)

    def send_priority(self, msg: taskmanager_pb2.DataMessage) -> list[taskmanager_pb2.DataMessage]:
        self.sent.append(msg)
        return []

    def available(self) -> bool:
        return True

    def close(self, *, drain: bool = False) -> None:
        self.closed = True

    def records(self) -> list[Any]:
        return [v for msg in self.sent for v in values_of(msg)]


def writer_for(channels: list[FakeChannel], partitioner: Any, key_selector: Any = None, interval: float = 60.0) -> Any:
    return RecordWriter(
        channels,  # type: ignore[arg-type]
        partitioner,
        key_selector,
        lambda key: key_group_for(key_to_bytes(key), 128),
        flush_interval_s=interval,
    )


def test_full_buffers_are_sent_and_the_rest_on_flush() -> None:
    channel = FakeChannel()
    writer = writer_for([channel], RebalancePartitioner(SubtaskIndex(0), 1))
    for i in range(2 * RECORDS_PER_BUFFER + 500):
        writer.emit(i, 1000 + i)
    assert [m.record_count for m in channel.sent] == [RECORDS_PER_BUFFER, RECORDS_PER_BUFFER]
    writer.flush()
    assert [m.record_count for m in channel.sent] == [RECORDS_PER_BUFFER, RECORDS_PER_BUFFER, 500]
    values, timestamps = decode_records(channel.sent[0].records)
    assert (values[:2], timestamps[:2]) == ([0, 1], [1000, 1001])
    assert channel.records() == list(range(2 * RECORDS_PER_BUFFER + 500))
    assert writer.records_out == 2 * RECORDS_PER_BUFFER + 500
    assert channel.bytes_sent == sum(len(m.records) for m in channel.sent)
    writer.flush()
    assert len(channel.sent) == 3  # nothing buffered: nothing sent


def test_each_channel_fills_its_own_buffer() -> None:
    channels = [FakeChannel(), FakeChannel()]
    writer = writer_for(channels, BroadcastPartitioner(2))
    for i in range(RECORDS_PER_BUFFER):
        writer.emit(i, None)
    assert [[m.record_count for m in c.sent] for c in channels] == [[RECORDS_PER_BUFFER], [RECORDS_PER_BUFFER]]
    assert writer.records_out == RECORDS_PER_BUFFER


def test_watermark_broadcast_carries_the_buffered_records_first() -> None:
    channels = [FakeChannel(), FakeChannel(), FakeChannel()]
    writer = writer_for(channels, RebalancePartitioner(SubtaskIndex(0), 3))
    for i in range(4):
        writer.emit(f"r{i}", i)
    assert all(not c.sent for c in channels)
    writer.broadcast_event(watermark_message(42))
    for c in channels:
        (msg,) = c.sent
        assert msg.event == Event.EVENT_KIND_WATERMARK and msg.watermark == 42
    assert [c.records() for c in channels] == [["r0", "r3"], ["r1"], ["r2"]]
    assert [c.sent[0].record_count for c in channels] == [2, 1, 1]
    writer.emit("after", 5)
    writer.flush()
    assert channels[1].sent[-1].event == Event.EVENT_KIND_UNSPECIFIED
    assert values_of(channels[1].sent[-1]) == ["after"]


def test_an_event_without_buffered_records_goes_alone() -> None:
    channels = [FakeChannel(), FakeChannel()]
    writer = writer_for(channels, RebalancePartitioner(SubtaskIndex(0), 2))
    writer.emit("only-on-0", 1)
    writer.broadcast_event(end_of_stream_message())
    assert channels[0].sent[0].record_count == 1
    (alone,) = channels[1].sent
    assert alone.event == Event.EVENT_KIND_END_OF_STREAM and alone.record_count == 0 and alone.records == b""


def test_hash_partitioning_sends_each_key_to_the_subtask_owning_its_key_group() -> None:
    channels = [FakeChannel() for _ in range(4)]
    writer = writer_for(channels, KeyGroupPartitioner(128, 4), key_selector=lambda v: v["user"])
    values = [{"user": f"user-{i % 23}", "n": i} for i in range(500)]
    for v in values:
        writer.emit(v, None)
    writer.flush()
    channel_of: dict[str, set[int]] = defaultdict(set)
    for index, channel in enumerate(channels):
        for v in channel.records():
            channel_of[v["user"]].add(index)
    assert len(channel_of) == 23
    for user, seen in channel_of.items():
        expected = subtask_for_key_group(128, 4, key_group_for(key_to_bytes(user), 128))
        assert seen == {expected}, user
    assert sorted(v["n"] for c in channels for v in c.records()) == list(range(500))
    # Order per key is kept.
    for c in channels:
        per_user: dict[str, list[int]] = defaultdict(list)
        for v in c.records():
            per_user[v["user"]].append(v["n"])
        assert all(ns == sorted(ns) for ns in per_user.values())


def test_hash_partitioning_remembers_a_channel_only_per_key_of_its_own_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer remembers the channel of ``str``, ``int`` and ``bytes`` keys and of tuples of those
    and None (SQL keys); a key equal to a remembered one but of another type (``1.0``, ``True``,
    ``(1.0,)``) encodes on its own and must not take the remembered channel, and forgetting every key
    at the limit must not move any key."""
    monkeypatch.setattr(writer_module, "CHANNEL_MEMO_KEYS", 7)
    channels = [FakeChannel() for _ in range(4)]
    writer = writer_for(channels, KeyGroupPartitioner(128, 4), key_selector=lambda v: v[0])
    keys: list[Any] = []
    for i in range(40):
        keys += [i, str(i), str(i).encode(), float(i), i % 2 == 0, (i, "x"), None]
        keys += [(i,), (float(i),), (i % 2 == 0,), (None, str(i)), ((i,),), (i, 2.5), (-(2**70) - i,)]
    values = [(key, n) for n, key in enumerate(keys * 2)]
    for v in values:
        writer.emit(v, None)
    writer.flush()
    for index, channel in enumerate(channels):
        for key, n in channel.records():
            assert index == subtask_for_key_group(128, 4, key_group_for(key_to_bytes(key), 128)), (key, n)
    assert sorted(n for c in channels for _, n in c.records()) == list(range(len(values)))
    assert len(writer._channel_of_key) <= 7


def test_a_flush_is_due_only_once_the_buffer_timeout_passed() -> None:
    channel = FakeChannel()
    writer = writer_for([channel], RebalancePartitioner(SubtaskIndex(0), 1), interval=60.0)
    writer.emit("x", None)
    assert not writer.flush_due(time.monotonic())
    assert writer.flush_due(time.monotonic() + 61.0)
    writer.flush()
    assert channel.records() == ["x"]
    assert not writer.flush_due(time.monotonic() + 59.0)  # the flush restarted the timeout


def test_close_closes_every_channel() -> None:
    channels = [FakeChannel(), FakeChannel()]
    writer_for(channels, BroadcastPartitioner(2)).close()
    assert all(c.closed for c in channels)


def test_record_encoding_round_trips() -> None:
    values, timestamps = [{"a": 1}, "b"], [5, None]
    assert decode_records(encode_records(values, timestamps)) == (values, timestamps)
    assert decode_records(b"") == ([], [])


@pytest.mark.parametrize("blob", [dumps_value([({"a": 1}, 5)]), dumps_value(([1, 2], [3])), dumps_value("x")])
def test_a_buffer_of_another_shape_is_a_protocol_error(blob: bytes) -> None:
    with pytest.raises(ProtocolError, match="two lists of equal length"):
        decode_records(blob)


# RemoteOutputChannel --------------------------------------------------------------------------------


def _unopened_channel(grpc_channel: grpc.Channel) -> RemoteOutputChannel:
    return RemoteOutputChannel(grpc_channel, taskmanager_pb2.ChannelHeader(), threading.Event())


class _Wire:
    """The channel's request stream, read by one thread the way gRPC reads it; what it sent, in order."""

    def __init__(self, channel: RemoteOutputChannel) -> None:
        self._sent: queue.Queue[Any] = queue.Queue()
        stream = channel._requests()
        assert next(stream).HasField("header")

        def read() -> None:
            for msg in stream:
                self._sent.put(msg)
            self._sent.put("end")

        threading.Thread(target=read, daemon=True).start()

    def next(self, timeout: float = 10.0) -> Any:
        """The next message sent; None if none in ``timeout`` seconds."""
        try:
            return self._sent.get(timeout=timeout)
        except queue.Empty:
            return None


def _grant(channel: RemoteOutputChannel, credits: int) -> None:
    with channel._cond:  # what the credit reader does when the consumer announces credit
        channel._credits.add_credits(credits)
        channel._cond.notify_all()


def test_send_queues_without_blocking_and_the_stream_sends_one_buffer_per_credit() -> None:
    with grpc.insecure_channel("127.0.0.1:9") as grpc_channel:  # never opened: we drive its stream
        channel = _unopened_channel(grpc_channel)
        wakes: list[int] = []
        channel.set_wakeup(lambda: wakes.append(1))
        wire = _Wire(channel)
        for i in range(OUTPUT_QUEUE_LIMIT):
            assert channel.available()
            channel.send(data(i))  # no credit: it queues, it does not block
        assert not channel.available() and channel.queued == OUTPUT_QUEUE_LIMIT
        assert wire.next(timeout=0.2) is None, "a buffer went out without credit"
        _grant(channel, 1)
        assert values_of(wire.next()) == [0]
        assert channel.available() and wakes, "the task was not told the channel became available"
        _grant(channel, 1)
        assert values_of(wire.next()) == [1]


def test_a_priority_barrier_overtakes_the_queue_without_credit() -> None:
    with grpc.insecure_channel("127.0.0.1:9") as grpc_channel:
        channel = _unopened_channel(grpc_channel)
        wire = _Wire(channel)
        channel.send(data(1))
        channel.send(data(2))
        barrier = barrier_message(5, 0.0, CheckpointKind.CHECKPOINT)
        barrier.priority = True
        overtaken = channel.send_priority(barrier)
        assert [values_of(m) for m in overtaken] == [[1], [2]]
        first = wire.next()
        assert first.priority and first.checkpoint_id == 5, "the barrier waited for credit or for the queue"
        _grant(channel, 2)
        assert [values_of(wire.next()), values_of(wire.next())] == [[1], [2]]
        with pytest.raises(ProtocolError, match="no records"):
            channel.send_priority(data(3))


def test_closing_a_finished_channel_drains_it_and_a_cancelled_one_ends_at_once() -> None:
    with grpc.insecure_channel("127.0.0.1:9") as grpc_channel:
        finished = _unopened_channel(grpc_channel)
        wire = _Wire(finished)
        finished.send(data(1))
        finished.close(drain=True)
        assert wire.next(timeout=0.2) is None, "the queued buffer went out without credit"
        _grant(finished, 1)
        assert values_of(wire.next()) == [1]
        assert wire.next() == "end"

        cancelled = _unopened_channel(grpc_channel)
        wire = _Wire(cancelled)
        cancelled.send(data(1))
        cancelled.close()
        assert wire.next() == "end"


def test_a_priority_barrier_is_taken_first_with_what_its_channel_queued_ahead_of_it() -> None:
    gate = InputGate([0, 0], initial_credits=4)
    gate.push(0, data(1))
    gate.push(1, data(10))
    gate.push(1, data(11))
    barrier = barrier_message(3, 0.0, CheckpointKind.CHECKPOINT)
    barrier.priority = True
    gate.push(1, barrier)
    gate.push(1, data(12))  # after the barrier: not overtaken
    assert gate.channels[1].credits.queued == 3, "the priority barrier took a credit"
    taken = gate.take()
    assert taken is not None and message_of(taken.message).priority and taken.channel == 1
    assert [values_of(m) for m in taken.overtaken] == [[10], [11]]
    assert gate.take_priority() is None
    rest = [gate.take() for _ in range(4)]
    assert sorted(values_of(r.message)[0] for r in rest if r is not None) == [1, 10, 11, 12]
    with pytest.raises(ProtocolError, match="bare barrier"):
        gate.push(0, taskmanager_pb2.DataMessage(priority=True, records=b"x", record_count=1))


# Typed buffers and events ---------------------------------------------------------------------------


def test_a_received_buffer_reads_as_its_records_and_a_typed_event() -> None:
    from weir.core.checkpointing import CheckpointKind
    from weir.core.watermarks import WatermarkStatus
    from weir.taskmanager.network.codec import (
        Barrier,
        CancelBarrier,
        EndOfStream,
        WatermarkActive,
        WatermarkEvent,
        WatermarkIdle,
        barrier_message,
        cancel_barrier_message,
        read_buffer,
        watermark_status_message,
    )

    msg = data("a", "b")
    msg.MergeFrom(barrier_message(4, 12.5, CheckpointKind.SAVEPOINT))
    buffer = read_buffer(msg)
    assert buffer.values == ["a", "b"] and buffer.size_bytes == len(msg.records)
    assert buffer.event == Barrier(4, 12.5, CheckpointKind.SAVEPOINT)  # type: ignore[arg-type]
    assert read_buffer(cancel_barrier_message(4)).event == CancelBarrier(4)  # type: ignore[arg-type]
    assert read_buffer(watermark_message(9)).event == WatermarkEvent(9)
    assert read_buffer(watermark_status_message(WatermarkStatus.IDLE)).event == WatermarkIdle()
    assert read_buffer(watermark_status_message(WatermarkStatus.ACTIVE)).event == WatermarkActive()
    assert read_buffer(end_of_stream_message()).event == EndOfStream()
    assert read_buffer(data(1)).event is None
    unknown = taskmanager_pb2.DataMessage(event=99)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="unknown event kind 99"):
        read_buffer(unknown)


def test_a_writer_reports_when_its_buffered_records_are_due() -> None:
    channel = FakeChannel()
    writer = writer_for([channel], RebalancePartitioner(SubtaskIndex(0), 1), interval=60.0)
    assert not writer.buffered()
    writer.emit("x", None)
    assert writer.buffered() and writer.flush_deadline() >= time.monotonic() + 59.0
    writer.flush()
    assert not writer.buffered()


def test_a_timed_out_barrier_is_turned_into_a_priority_one_that_overtakes_its_queue() -> None:
    gate = InputGate([0, 0], initial_credits=4)
    gate.push(0, data(1))
    with_records = barrier_message(7, 100.0, CheckpointKind.CHECKPOINT)
    with_records.records, with_records.record_count = data(2).records, 1  # records flushed with the barrier
    gate.push(0, with_records)
    gate.push(0, data(3))
    gate.push(1, data(10))
    gate.push(1, barrier_message(7, 100.0, CheckpointKind.CHECKPOINT))
    assert gate.queued_barrier_times() == {7: 100.0}
    assert gate.prioritize(7) == 2
    assert gate.queued_barrier_times() == {}
    first, second = gate.take_priority(), gate.take_priority()
    assert first is not None and second is not None
    assert message_of(first.message).priority and message_of(second.message).priority
    assert read_buffer(first.message).event == Barrier(7, 100.0, CheckpointKind.CHECKPOINT, BarrierAlignment.BY_MODE)  # type: ignore[arg-type]
    assert {
        first.channel: [values_of(m) for m in first.overtaken],
        second.channel: [values_of(m) for m in second.overtaken],
    } == {
        0: [[1], [2]],  # the barrier's own records stay queued, ahead of it
        1: [[10]],
    }
    assert announced(gate, 1) == [1], "the bare barrier's slot was not given back"
    rest = [gate.take() for _ in range(4)]
    assert [values_of(r.message) for r in rest if r is not None and r.channel == 0] == [[1], [2], [3]]
    assert gate.prioritize(7) == 0


def test_a_barrier_carries_its_alignment_and_one_that_does_not_say_is_refused() -> None:
    forced = barrier_message(3, 1.5, CheckpointKind.CHECKPOINT, BarrierAlignment.FORCED_ALIGNED)
    assert forced.barrier_alignment == common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED
    event = read_buffer(forced).event
    assert event == Barrier(3, 1.5, CheckpointKind.CHECKPOINT, BarrierAlignment.FORCED_ALIGNED)  # type: ignore[arg-type]
    assert read_buffer(barrier_message(3, 1.5, CheckpointKind.CHECKPOINT)).event == Barrier(
        3,  # type: ignore[arg-type]
        1.5,
        CheckpointKind.CHECKPOINT,
        BarrierAlignment.BY_MODE,
    )
    unspecified = barrier_message(3, 1.5, CheckpointKind.CHECKPOINT)
    unspecified.ClearField("barrier_alignment")
    with pytest.raises(ProtocolError, match="BARRIER_ALIGNMENT_UNSPECIFIED"):
        read_buffer(unspecified)


def test_a_forced_aligned_barrier_never_times_out_into_a_priority_one() -> None:
    """A final checkpoint's barrier waits in its queue whatever the aligned-checkpoint timeout says:
    the task asks the gate for the queued barriers to turn, and it is never among them."""
    gate = InputGate([0, 0], initial_credits=4)
    gate.push(0, data(1))
    gate.push(0, barrier_message(9, 100.0, CheckpointKind.CHECKPOINT, BarrierAlignment.FORCED_ALIGNED))
    gate.push(1, barrier_message(10, 101.0, CheckpointKind.CHECKPOINT))
    assert gate.queued_barrier_times() == {10: 101.0}
    assert gate.prioritize(9) == 0
    assert gate.take_priority() is None
    taken = [gate.take() for _ in range(3)]
    assert [read_buffer(t.message).event for t in taken if t is not None and t.channel == 0] == [
        None,
        Barrier(9, 100.0, CheckpointKind.CHECKPOINT, BarrierAlignment.FORCED_ALIGNED),  # type: ignore[arg-type]
    ]


def test_a_writer_refuses_to_send_a_forced_aligned_barrier_as_a_priority_event() -> None:
    channel = FakeChannel()
    writer = writer_for([channel], RebalancePartitioner(SubtaskIndex(0), 1))
    writer.emit("x", None)
    forced = barrier_message(4, 0.0, CheckpointKind.CHECKPOINT, BarrierAlignment.FORCED_ALIGNED)
    with pytest.raises(ProtocolError, match="forced aligned"):
        writer.broadcast_priority(forced)
    assert channel.sent == [], "nothing went out"


def test_a_savepoint_barrier_never_times_out_into_a_priority_one() -> None:
    gate = InputGate([0], initial_credits=4)
    gate.push(0, data(1))
    gate.push(0, barrier_message(8, 100.0, CheckpointKind.SAVEPOINT))
    assert gate.queued_barrier_times() == {}
    assert gate.prioritize(8) == 0
    assert gate.take_priority() is None


def test_a_pending_priority_barrier_keeps_its_place_when_an_earlier_barrier_times_out_before_it() -> None:
    """Barrier 6 overtakes b1, barrier 5 and b2 on arrival; then barrier 5 times out and its slot goes.
    Barrier 6 overtook b1 and b2 only: q1 came after it, and must not be handed to the checkpoint."""
    gate = InputGate([0], initial_credits=8)
    gate.push(0, data("b1"))
    gate.push(0, barrier_message(5, 100.0, CheckpointKind.CHECKPOINT))
    gate.push(0, data("b2"))
    gate.push(0, _priority(6))
    gate.push(0, data("q1"))
    assert gate.prioritize(5) == 1
    first, second = gate.take_priority(), gate.take_priority()
    assert first is not None and message_of(first.message).checkpoint_id == 6
    assert [values_of(m) for m in first.overtaken] == [["b1"], ["b2"]]
    assert second is not None and message_of(second.message).checkpoint_id == 5
    assert [values_of(m) for m in second.overtaken] == [["b1"]]


def _priority(checkpoint_id: int) -> taskmanager_pb2.DataMessage:
    barrier = barrier_message(checkpoint_id, float(checkpoint_id), CheckpointKind.CHECKPOINT)
    barrier.priority = True
    return barrier


# A buffer as the gate model sees it: (values, event kind, checkpoint id).
Described = tuple[tuple[Any, ...], int, int]


def _described(buffer: ChannelBuffer) -> Described:
    msg = message_of(buffer)
    return tuple(values_of(buffer)), msg.event, msg.checkpoint_id


@dataclass
class _Queued:
    """A buffer of the model's channel queue: when it arrived, and what it is."""

    arrived_at: int
    what: Described


@dataclass
class _PendingPriority:
    """A priority event of the model: its channel, checkpoint, and the arrival time before which the
    channel's buffers are ahead of it."""

    channel: int
    checkpoint_id: int
    boundary: int


@dataclass
class _GateModel:
    """What an InputGate should answer, from arrival times alone: a priority event overtakes exactly
    the buffers that arrived on its channel before it and are still queued."""

    queues: list[list[_Queued]]
    pending: list[_PendingPriority] = field(default_factory=list)
    blocked: set[int] = field(default_factory=set)
    clock: int = 0

    def tick(self) -> int:
        self.clock += 2
        return self.clock

    def overtaken(self, event: _PendingPriority) -> list[Described]:
        return [q.what for q in self.queues[event.channel] if q.arrived_at < event.boundary]

    def queued_barriers(self) -> set[int]:
        return {q.what[2] for queue in self.queues for q in queue if q.what[1] == Event.EVENT_KIND_BARRIER}


def _check_gate(gate: InputGate, model: _GateModel, step: str) -> None:
    pending = gate.pending_priority()
    assert [(p.channel, message_of(p.message).checkpoint_id) for p in pending] == [
        (e.channel, e.checkpoint_id) for e in model.pending
    ], step
    for received, event in zip(pending, model.pending, strict=True):
        assert [_described(b) for b in received.overtaken] == model.overtaken(event), step
    assert gate.queued_buffers() == sum(len(q) for q in model.queues), step
    assert set(gate.queued_barrier_times()) == model.queued_barriers(), step


_GATE_ACTIONS = (
    *("data",) * 3,
    *("with_records", "barrier", "priority", "prioritize"),
    *("take", "take", "take_priority", "block", "unblock", "next_checkpoint"),
)


def _random_gate_run(rng: random.Random) -> int:
    """One seeded interleaving of pushes (records, records with a barrier, bare in-order barriers,
    priority barriers), timeouts, blocks, takes and priority takes, checked after every step; answers
    how many priority events were taken with something overtaken."""
    channels, credits = rng.randint(1, 3), rng.randint(2, 5)
    gate = InputGate([0] * channels, initial_credits=credits)
    model = _GateModel([[] for _ in range(channels)])
    value = iter(range(10**6))
    checkpoint = iter(range(1, 10**6))
    aligned = next(checkpoint)  # the in-order barriers' checkpoint, shared by the channels
    sent_barrier = [0] * channels
    overtook = 0
    for step in range(rng.randint(20, 120)):
        channel = rng.randrange(channels)
        room = len(model.queues[channel]) < credits
        action = rng.choice(_GATE_ACTIONS)
        if action in ("data", "with_records", "barrier") and not room:
            action = "take"
        if action in ("with_records", "barrier") and sent_barrier[channel] == aligned:
            action = "data"  # a channel carries one barrier per checkpoint
        match action:
            case "data" | "with_records" | "barrier":
                msg = data(next(value)) if action != "barrier" else taskmanager_pb2.DataMessage()
                if action != "data":
                    msg.MergeFrom(barrier_message(aligned, float(aligned), CheckpointKind.CHECKPOINT))
                    sent_barrier[channel] = aligned
                gate.push(channel, msg)
                model.queues[channel].append(_Queued(model.tick(), _described(msg)))
            case "priority":
                cid = next(checkpoint)
                gate.push(channel, _priority(cid))
                model.pending.append(_PendingPriority(channel, cid, model.tick()))
            case "prioritize":
                cid = rng.choice(sorted(model.queued_barriers() | {aligned}))
                turned = 0
                for c, queue in enumerate(model.queues):
                    at = next((i for i, q in enumerate(queue) if q.what[1:] == (Event.EVENT_KIND_BARRIER, cid)), None)
                    if at is None:
                        continue
                    barrier = queue[at]
                    if barrier.what[0]:  # its records stay queued, ahead of it
                        queue[at] = _Queued(barrier.arrived_at, (barrier.what[0], Event.EVENT_KIND_UNSPECIFIED, 0))
                        model.pending.append(_PendingPriority(c, cid, barrier.arrived_at + 1))
                    else:
                        del queue[at]
                        model.pending.append(_PendingPriority(c, cid, barrier.arrived_at))
                    turned += 1
                assert gate.prioritize(cid) == turned, step
            case "take":
                taken = gate.take()
                if model.pending:
                    event = model.pending.pop(0)
                    assert taken is not None and message_of(taken.message).priority, step
                    overtook += bool(taken.overtaken)
                elif taken is None:
                    assert all(not q or c in model.blocked for c, q in enumerate(model.queues)), step
                else:
                    assert taken.channel not in model.blocked, step
                    assert _described(taken.message) == model.queues[taken.channel].pop(0).what, step
            case "take_priority":
                taken = gate.take_priority()
                assert (taken is None) == (not model.pending), step
                if taken is not None:
                    event = model.pending.pop(0)
                    assert (taken.channel, message_of(taken.message).checkpoint_id) == (
                        event.channel,
                        event.checkpoint_id,
                    ), step
                    overtook += bool(taken.overtaken)
            case "block":
                gate.block(channel)
                model.blocked.add(channel)
            case "unblock":
                gate.unblock([channel])
                model.blocked.discard(channel)
            case "next_checkpoint":
                aligned = next(checkpoint)
            case _:
                raise AssertionError(action)
        _check_gate(gate, model, f"step {step}: {action} on channel {channel}")
    return overtook


def test_what_a_priority_event_overtook_stays_true_over_random_interleavings() -> None:
    overtook = sum(_random_gate_run(random.Random(f"gate-{seed}")) for seed in range(400))
    assert overtook > 400, "the runs hardly ever took a priority event that overtook something"


def test_a_full_checkpoints_barrier_says_so_through_the_codec_and_any_other_does_not() -> None:
    """`weir checkpoint --full`: the flag rides on the barrier to every task downstream (which then
    uploads every file of its RocksDB snapshot anew); a barrier without it is an incremental one's."""
    full = barrier_message(8, 2.5, CheckpointKind.CHECKPOINT, full=True)
    assert full.full_checkpoint
    assert read_buffer(full).event == Barrier(8, 2.5, CheckpointKind.CHECKPOINT, BarrierAlignment.BY_MODE, True)  # type: ignore[arg-type]
    incremental = read_buffer(barrier_message(8, 2.5, CheckpointKind.CHECKPOINT)).event
    assert isinstance(incremental, Barrier) and not incremental.full
