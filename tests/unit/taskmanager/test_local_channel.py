"""LocalOutputChannel: a producer handing buffers to a consumer's InputGate in the same process, under
the same credits as over gRPC, and without encoding the records."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from weir.core.checkpointing import CheckpointKind
from weir.core.errors import ProtocolError
from weir.core.ids import SubtaskIndex
from weir.taskmanager.inflight import persistable
from weir.taskmanager.network.codec import (
    ChannelBuffer,
    ChannelClosedError,
    LocalBuffer,
    barrier_message,
    encode_records,
    encoded,
    end_of_stream_message,
    message_of,
    read_buffer,
    watermark_message,
)
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import OUTPUT_QUEUE_LIMIT, LocalOutputChannel
from weir.taskmanager.network.writer import RecordWriter
from weir.taskmanager.partitioners import RebalancePartitioner
from weir.wire import taskmanager_pb2


def local(*values: Any) -> LocalBuffer:
    return LocalBuffer(taskmanager_pb2.DataMessage(record_count=len(values)), list(values), [None] * len(values))


def values_of(buffer: ChannelBuffer) -> list[Any]:
    return read_buffer(buffer).values


class _Producer:
    """A local channel into channel ``channel`` of ``gate``; ``connect_now``: the gate is there at open."""

    def __init__(
        self,
        gate: InputGate | None,
        channel: int = 0,
        *,
        cancelled: threading.Event | None = None,
        gate_wait_s: float = 30.0,
    ) -> None:
        self.attached: list[LocalOutputChannel] = []
        self.wakes = 0
        header = taskmanager_pb2.ChannelHeader(consumer_channel=channel)
        header.consumer.vertex_uid = "sink"

        def attach(ch: LocalOutputChannel) -> None:
            if gate is None:
                self.attached.append(ch)  # the consumer is not deployed yet
            else:
                ch.connect(gate)

        self.channel = LocalOutputChannel(header, cancelled or threading.Event(), attach, gate_wait_s=gate_wait_s)
        self.channel.set_wakeup(self._wake)
        self.channel.open()

    def _wake(self) -> None:
        self.wakes += 1


def _taken(gate: InputGate) -> list[list[Any]]:
    out = []
    while (taken := gate.take()) is not None:
        out.append(values_of(taken.message))
    return out


def test_buffers_go_into_the_gate_one_per_credit_and_a_taken_buffer_pulls_the_next() -> None:
    gate = InputGate([0], initial_credits=2)
    producer = _Producer(gate)
    channel = producer.channel
    assert channel.credits == 2
    for i in range(4):
        channel.send(local(i))
    assert gate.channels[0].credits.queued == 2 and channel.queued == 2 and channel.credits == 0
    assert not channel.available(), f"{OUTPUT_QUEUE_LIMIT} buffers wait for credit: the task must take no input"
    taken = gate.take()
    assert taken is not None and values_of(taken.message) == [0]
    assert channel.queued == 1 and gate.channels[0].credits.queued == 2, "the freed credit did not pull a buffer"
    assert channel.available() and producer.wakes, "the producer was not told its channel became available"
    assert _taken(gate) == [[1], [2], [3]]
    assert channel.queued == 0 and channel.credits == 2 and channel.buffers_sent == 4 and channel.bytes_sent == 0


def test_records_are_handed_over_as_they_are_without_encoding() -> None:
    gate = InputGate([0], initial_credits=4)
    channel = _Producer(gate).channel
    record = {"key": "a", "value": [1, 2]}
    writer = RecordWriter([channel], RebalancePartitioner(SubtaskIndex(0), 1), None, None, flush_interval_s=1.0)
    writer.emit(record, 7)
    writer.broadcast_event(watermark_message(9))
    taken = gate.take()
    assert taken is not None and isinstance(taken.message, LocalBuffer)
    buffer = read_buffer(taken.message)
    assert buffer.values[0] is record and buffer.timestamps == [7] and buffer.size_bytes == 0
    assert message_of(taken.message).watermark == 9
    assert not writer.buffered() and writer._values[0] is not buffer.values, "the writer reuses a handed-over list"


def test_an_in_flight_capture_encodes_a_local_buffer_as_the_remote_one() -> None:
    remote = taskmanager_pb2.DataMessage(records=encode_records([1, 2], [None, 5]), record_count=2)
    remote.event = taskmanager_pb2.EVENT_KIND_WATERMARK
    remote.watermark = 3
    buffer = LocalBuffer(
        taskmanager_pb2.DataMessage(record_count=2, event=taskmanager_pb2.EVENT_KIND_WATERMARK, watermark=3),
        [1, 2],
        [None, 5],
    )
    assert persistable(buffer) == persistable(remote)
    assert encoded(buffer) == remote
    barrier = barrier_message(4, 0.0, CheckpointKind.CHECKPOINT)
    with_barrier = LocalBuffer(barrier, [1], [None])
    barrier.record_count = 1
    assert persistable(with_barrier) == persistable(
        taskmanager_pb2.DataMessage(records=encode_records([1], [None]), record_count=1)
    ), "a barrier must not be persisted, its records must"


def test_a_priority_barrier_goes_in_first_without_credit_and_answers_what_it_overtook() -> None:
    gate = InputGate([0], initial_credits=1)
    channel = _Producer(gate).channel
    for i in range(3):
        channel.send(local(i))  # 0 goes in on the one credit; 1 and 2 wait
    barrier = barrier_message(5, 0.0, CheckpointKind.CHECKPOINT)
    barrier.priority = True
    overtaken = channel.send_priority(barrier)
    assert [values_of(b) for b in overtaken] == [[1], [2]]
    first = gate.take()
    assert first is not None and message_of(first.message).priority and message_of(first.message).checkpoint_id == 5
    assert [values_of(b) for b in first.overtaken] == [[0]], "what the gate queued ahead of the barrier"
    assert _taken(gate) == [[0], [1], [2]]
    with pytest.raises(ProtocolError, match="no records"):
        channel.send_priority(taskmanager_pb2.DataMessage(record_count=1))


def test_a_finished_producer_drains_its_queue_and_then_is_gone_without_failing_the_consumer() -> None:
    gate = InputGate([0], initial_credits=1)
    channel = _Producer(gate).channel
    channel.send(local(1))
    channel.send(local(2))
    channel.send(end_of_stream_message())
    channel.close(drain=True)
    assert _taken(gate) == [[1], [2], []]
    assert gate.channels[0].ended
    assert gate.take() is None, "a drained channel after its end of stream must not fail the consumer"


def test_a_cancelled_producer_is_gone_at_once_and_fails_a_consumer_waiting_for_its_end_of_stream() -> None:
    gate = InputGate([0], initial_credits=1)
    cancelled = threading.Event()
    channel = _Producer(gate, cancelled=cancelled).channel
    channel.send(local(1))
    channel.send(local(2))
    cancelled.set()
    channel.close(drain=True)  # a cancelled task does not drain
    with pytest.raises(ChannelClosedError, match="lost its producer"):
        gate.take()
    assert channel.queued == 1, "a buffer went in after the channel was abandoned"


def test_a_consumer_deployed_later_gets_what_was_queued_before() -> None:
    producer = _Producer(None)
    channel = producer.channel
    channel.send(local(1))
    channel.send(local(2))
    assert not channel.available() and channel.credits == 0
    gate = InputGate([0], initial_credits=4)
    [attached] = producer.attached
    attached.connect(gate)
    assert _taken(gate) == [[1], [2]] and channel.available()


def test_a_consumer_that_never_comes_breaks_the_channel() -> None:
    producer = _Producer(None, gate_wait_s=0.0)
    channel = producer.channel
    assert channel.available(), "a broken channel is available: the next send reports it"
    with pytest.raises(ChannelClosedError, match="no task sink#0"):
        channel.send(local(1))
    gate = InputGate([0], initial_credits=4)
    producer.attached[0].connect(gate)  # deployed too late: told its producer is gone
    with pytest.raises(ChannelClosedError, match="lost its producer"):
        gate.take()


def test_a_closed_consumer_breaks_the_channel() -> None:
    gate = InputGate([0], initial_credits=1)
    producer = _Producer(gate)
    channel = producer.channel
    channel.send(local(1))
    channel.send(local(2))
    gate.close()
    assert producer.wakes and channel.available()
    with pytest.raises(ChannelClosedError, match="consumer closed the channel"):
        channel.send(local(3))


def test_a_channel_connects_once() -> None:
    gate = InputGate([0], initial_credits=1)
    _Producer(gate)
    second = _Producer(gate).channel
    with pytest.raises(ChannelClosedError, match="already connected"):
        second.send(local(1))


def test_a_timed_out_local_barrier_keeps_its_records_queued_in_memory() -> None:
    gate = InputGate([0], initial_credits=4)
    channel = _Producer(gate).channel
    channel.send(local(1))
    barrier = barrier_message(6, 0.0, CheckpointKind.CHECKPOINT)
    channel.send(LocalBuffer(barrier, [2], [None]))
    barrier.record_count = 1
    assert gate.prioritize(6) == 1
    first = gate.take()
    assert first is not None and message_of(first.message).priority
    assert [values_of(b) for b in first.overtaken] == [[1], [2]]
    rest = [gate.take() for _ in range(2)]
    assert all(r is not None and isinstance(r.message, LocalBuffer) for r in rest)
    assert [values_of(r.message) for r in rest if r is not None] == [[1], [2]]


def test_a_producer_and_a_consumer_thread_exchange_every_buffer_in_order() -> None:
    gate = InputGate([0], initial_credits=2)
    channel = _Producer(gate).channel
    count = 2000
    received: list[int] = []

    def consume() -> None:
        with gate.condition:
            while True:
                taken = gate.take()
                if taken is None:
                    gate.condition.wait(1.0)
                    continue
                if message_of(taken.message).event == taskmanager_pb2.EVENT_KIND_END_OF_STREAM:
                    return
                received.extend(values_of(taken.message))

    consumer = threading.Thread(target=consume)
    consumer.start()
    for i in range(count):
        while not channel.available():  # the task waits on its mailbox; here a short spin
            threading.Event().wait(0.0005)
        channel.send(local(i))
    channel.send(end_of_stream_message())
    channel.close(drain=True)
    consumer.join(30)
    assert not consumer.is_alive() and received == list(range(count))
    assert gate.channels[0].credits.queued == 0
