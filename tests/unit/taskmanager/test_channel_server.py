"""The server half of the channels into a TaskManager: a remote producer's ``OpenChannel`` stream and a
local producer's connection, both to the consumer's input gate once it is registered, driven without
gRPC (the stream is an iterator of messages, as the servicer hands it over)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest

from weir.taskmanager.network.codec import ChannelClosedError, end_of_stream_message, message_of, watermark_message
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import LocalOutputChannel
from weir.taskmanager.network.server import ChannelServer
from weir.taskmanager.task_types import TaskAddress
from weir.wire import taskmanager_pb2

CONSUMER = TaskAddress("job", "sink", 0, 1)


def header(consumer: TaskAddress, channel: int = 0) -> taskmanager_pb2.ChannelHeader:
    h = taskmanager_pb2.ChannelHeader(consumer_channel=channel, attempt=consumer.attempt)
    h.consumer.job_id, h.consumer.vertex_uid = consumer.job_id, consumer.vertex_uid
    h.consumer.subtask = consumer.subtask
    return h


def local_channel(server: ChannelServer, consumer: TaskAddress) -> LocalOutputChannel:
    return LocalOutputChannel(header(consumer), threading.Event(), server.attach_local)


def test_a_local_producer_opened_before_its_consumer_is_connected_once_the_consumer_registers() -> None:
    server = ChannelServer("tm-test")
    channel = local_channel(server, CONSUMER)
    channel.open()
    channel.send(end_of_stream_message())
    assert channel.queued == 1 and channel.credits == 0, "it had no gate to go to"
    assert server.awaiting_consumers() == [CONSUMER]
    gate = InputGate([0])
    server.register(CONSUMER, gate)
    taken = gate.take()
    assert taken is not None and message_of(taken.message).event == taskmanager_pb2.EVENT_KIND_END_OF_STREAM
    assert server.awaiting_consumers() == []
    later = local_channel(server, CONSUMER)
    later.open()  # the gate is there: connected at once (a second producer of channel 0 is refused)
    with pytest.raises(ChannelClosedError, match="already connected"):
        later.send(end_of_stream_message())


class Stream:
    """A producer's request stream: messages put by the test, ended by ``close``."""

    def __init__(self) -> None:
        self._messages: queue.SimpleQueue[taskmanager_pb2.DataMessage | None] = queue.SimpleQueue()

    def put(self, message: taskmanager_pb2.DataMessage) -> None:
        self._messages.put(message)

    def close(self) -> None:
        self._messages.put(None)

    def __iter__(self) -> Iterator[taskmanager_pb2.DataMessage]:
        while (message := self._messages.get(timeout=10.0)) is not None:
            yield message


def test_a_remote_stream_waits_for_its_consumer_pushes_into_its_gate_and_streams_its_credits() -> None:
    server = ChannelServer("tm-test")
    stream = Stream()
    stream.put(taskmanager_pb2.DataMessage(header=header(CONSUMER)))
    credits = server.open_channel(iter(stream))
    first: list[taskmanager_pb2.CreditMessage] = []
    waiter = threading.Thread(target=lambda: first.append(next(credits)))
    waiter.start()  # the consumer is not deployed yet: the stream waits for its gate
    gate = InputGate([0], initial_credits=2)
    server.register(CONSUMER, gate)
    waiter.join(10)
    assert [c.credits for c in first] == [2] and not first[0].error
    stream.put(watermark_message(7))
    stream.put(end_of_stream_message())
    taken: list[int] = []
    while len(taken) < 2:
        received = gate.poll(10.0)
        assert received is not None, "the buffers did not reach the gate"
        taken.append(received[2].event)
    assert taken == [taskmanager_pb2.EVENT_KIND_WATERMARK, taskmanager_pb2.EVENT_KIND_END_OF_STREAM]
    assert next(credits).credits == 1  # each buffer taken grants a credit back
    stream.close()
    gate.close()
    assert [c.credits for c in credits] == [1]  # the second grant, then the gate closed: the stream ends


def test_a_remote_stream_whose_consumer_never_comes_is_refused_with_the_reason() -> None:
    server = ChannelServer("tm-test", gate_wait_s=0.05)
    stream = Stream()
    stream.put(taskmanager_pb2.DataMessage(header=header(CONSUMER)))
    (refusal,) = list(server.open_channel(iter(stream)))
    assert refusal.error == f"no task {CONSUMER} on tm-test"


def test_a_stopping_taskmanager_refuses_the_streams_waiting_for_a_consumer() -> None:
    server = ChannelServer("tm-test")
    stream = Stream()
    stream.put(taskmanager_pb2.DataMessage(header=header(CONSUMER)))
    answers: list[taskmanager_pb2.CreditMessage] = []
    waiter = threading.Thread(target=lambda: answers.extend(server.open_channel(iter(stream))))
    waiter.start()
    server.stop()
    waiter.join(10)
    assert not waiter.is_alive() and [a.error for a in answers] == [f"no task {CONSUMER} on tm-test"]
