"""The consumer TaskManager's half of every channel into it: which input gates are here, the
``OpenChannel`` stream of a remote producer, and the connection of a local one.

A remote producer's stream names its consumer in its first message (``ChannelHeader``); the
server waits for that consumer's task to be deployed (its gate registered, at most
``GATE_WAIT_S``), connects the channel, then pushes every buffer that arrives into the gate on a
thread of its own while the response stream sends the credits the gate grants. A local producer that
opens before its consumer is deployed is connected when the gate registers. In Flink the consumer
requests its producer's partition (``PartitionRequestServerHandler``); in Weir the producer opens the
stream, so the consumer side is the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc

from weir.core.errors import WeirError
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import GATE_WAIT_S, LocalOutputChannel
from weir.taskmanager.task_types import TaskAddress
from weir.wire import taskmanager_pb2


def consumer_of(header: taskmanager_pb2.ChannelHeader) -> TaskAddress:
    """The consumer task attempt a channel's header names."""
    consumer = header.consumer
    return TaskAddress(consumer.job_id, consumer.vertex_uid, consumer.subtask, header.attempt)


class ChannelServer:
    """The input gates of this TaskManager's tasks, by task attempt, and the channels into them."""

    def __init__(self, taskmanager_id: str, gate_wait_s: float = GATE_WAIT_S) -> None:
        self._taskmanager_id = taskmanager_id
        self._gate_wait_s = gate_wait_s
        self._cond = threading.Condition()
        self._gates: dict[TaskAddress, InputGate] = {}
        self._awaiting: dict[TaskAddress, list[LocalOutputChannel]] = {}  # local producers, by consumer
        self._stopping = False

    def register(self, consumer: TaskAddress, gate: InputGate) -> None:
        """Make a deployed task's gate reachable by its producers: remote ones (:meth:`open_channel`
        waits for it) and local ones (connected now if they opened first)."""
        with self._cond:
            self._gates[consumer] = gate
            producers = self._awaiting.pop(consumer, [])
            self._cond.notify_all()
        for producer in producers:
            producer.connect(gate)

    def unregister(self, consumer: TaskAddress) -> None:
        """The task ended: no channel connects to its gate any more."""
        with self._cond:
            self._gates.pop(consumer, None)

    def forget_attempts(self, job_id: str, matches: Callable[[int], bool]) -> None:
        """The attempts of the job that ``matches`` are over here: their gates and the local producers
        still waiting for one of their consumers go."""
        with self._cond:
            for consumer in [a for a in self._gates if a.job_id == job_id and matches(a.attempt)]:
                del self._gates[consumer]
            for consumer in [a for a in self._awaiting if a.job_id == job_id and matches(a.attempt)]:
                del self._awaiting[consumer]

    def awaiting_consumers(self) -> list[TaskAddress]:
        """The consumers that local producers wait for (not deployed here yet)."""
        with self._cond:
            return list(self._awaiting)

    def attach_local(self, channel: LocalOutputChannel) -> None:
        """Connect a local output channel to its consumer's gate, now or once the consumer is deployed
        (as :meth:`open_channel` waits for a remote producer's consumer)."""
        consumer = consumer_of(channel.header)
        with self._cond:
            gate = self._gates.get(consumer)
            if gate is None:
                self._awaiting.setdefault(consumer, []).append(channel)
                return
        channel.connect(gate)

    def stop(self) -> None:
        """The TaskManager stops: streams still waiting for their consumer are refused."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def open_channel(self, requests: Iterator[taskmanager_pb2.DataMessage]) -> Iterator[taskmanager_pb2.CreditMessage]:
        """Serve one remote producer's ``OpenChannel`` stream: its buffers into the consumer's gate,
        the gate's credits back; an error message (and the end of the stream) when the consumer is not
        here in time or the channel is connected already."""
        try:
            first = next(requests)
        except StopIteration:
            return
        consumer = consumer_of(first.header)
        gate = self._await_gate(consumer)
        if gate is None:
            yield taskmanager_pb2.CreditMessage(error=f"no task {consumer} on {self._taskmanager_id}")
            return
        channel = first.header.consumer_channel
        try:
            initial = gate.connect(channel)
        except WeirError as exc:
            yield taskmanager_pb2.CreditMessage(error=str(exc))
            return

        def pump() -> None:
            try:
                for msg in requests:
                    gate.push(channel, msg)
            except grpc.RpcError as exc:  # server side: a bare RpcError, often without a code()
                code = exc.code() if callable(getattr(exc, "code", None)) else None
                gate.producer_gone(channel, f"producer stream cut ({code.name if code else type(exc).__name__})")
            except WeirError as exc:
                gate.producer_gone(channel, str(exc))
            else:
                gate.producer_gone(channel, "stream closed")

        threading.Thread(target=pump, name=f"channel-in-{consumer}-{channel}", daemon=True).start()
        yield taskmanager_pb2.CreditMessage(credits=initial)
        announcements = gate.channels[channel].announcements
        while True:
            grant = announcements.get()
            if grant is None:
                return
            yield taskmanager_pb2.CreditMessage(credits=grant)

    def _await_gate(self, consumer: TaskAddress) -> InputGate | None:
        """The consumer's gate once it is registered; None after ``gate_wait_s`` or once stopping."""
        deadline = time.monotonic() + self._gate_wait_s
        with self._cond:
            while consumer not in self._gates:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return None
                self._cond.wait(min(remaining, 1.0))
            return self._gates[consumer]
