"""The producer side of a subtask's channels: one output channel per consumer subtask.

A :class:`RemoteOutputChannel` is one bidirectional ``OpenChannel`` gRPC stream to the consumer's
TaskManager: buffers go out against credit, credits come back (the server half is
``weir.taskmanager.network.server``). A :class:`LocalOutputChannel` hands its buffers straight to a
consumer's input gate in the same TaskManager, under the same credits (Flink's ``LocalInputChannel``).
Either queues a buffer and never blocks the task; the task takes no more input while a channel queues
:data:`OUTPUT_QUEUE_LIMIT` buffers (Flink's output availability).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import grpc

from weir.core.errors import ProtocolError
from weir.taskmanager.credit import OutputChannelCredits
from weir.taskmanager.network.codec import ChannelBuffer, ChannelClosedError
from weir.taskmanager.network.gate import InputGate
from weir.wire import taskmanager_pb2, taskmanager_pb2_grpc

OUTPUT_QUEUE_LIMIT = 2
"""Buffers an output channel may queue, waiting for credit, before its task stops taking input. The
consumer's credits (``INITIAL_CREDITS``) keep the wire busy; this only covers the gap between two
credits. One input buffer may still push a channel past it (its outputs are never split)."""


class RemoteOutputChannel:
    """One producer -> consumer stream. ``send`` queues a buffer and never blocks; the stream sends
    queued buffers one per credit, in order. The task takes no more input while any of its channels
    queues :data:`OUTPUT_QUEUE_LIMIT` buffers or more (:meth:`available`), so a slow consumer still
    backpressures its producers, and a backpressured task still handles its mails and priority events
    (Flink's output availability, FLIP-27/76). A priority event (an unaligned barrier) goes out first,
    without credit, overtaking the queued buffers (:meth:`send_priority`)."""

    def __init__(
        self,
        grpc_channel: grpc.Channel,
        header: taskmanager_pb2.ChannelHeader,
        cancelled: threading.Event,
    ) -> None:
        self._stub = taskmanager_pb2_grpc.TaskManagerServiceStub(grpc_channel)
        self._header = header
        self._cancelled = cancelled
        self._credits = OutputChannelCredits()
        self._cond = threading.Condition()
        self._queue: deque[taskmanager_pb2.DataMessage] = deque()  # waiting for credit, in order
        self._priority: deque[taskmanager_pb2.DataMessage] = deque()  # sent first, without credit
        self._wake: Callable[[], None] = _nothing  # tells the task the channel may have become available
        self._error: str | None = None
        self._draining = False  # closed: send what is queued, then end the stream
        self._abandoned = False  # closed: end the stream at once
        self.buffers_sent = 0
        self.bytes_sent = 0

    def set_wakeup(self, wake: Callable[[], None]) -> None:
        """``wake`` is called (from the channel's threads, holding no lock of the channel) whenever a
        queued buffer went out or the channel broke: the task waiting for output availability re-checks."""
        self._wake = wake

    def open(self) -> None:
        self._responses = self._stub.OpenChannel(self._requests())
        self._reader = threading.Thread(target=self._read_credits, name="credit-reader", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[taskmanager_pb2.DataMessage]:
        yield taskmanager_pb2.DataMessage(header=self._header)
        while True:
            with self._cond:
                while True:
                    if self._abandoned or self._error is not None:
                        return
                    if self._priority:
                        msg = self._priority.popleft()
                        break
                    if self._queue and self._credits.can_send():
                        self._credits.on_buffer_sent()
                        msg = self._queue.popleft()
                        break
                    if self._draining and not self._queue:
                        return
                    self._cond.wait()
            self._wake()
            yield msg

    def _read_credits(self) -> None:
        try:
            for credit in self._responses:
                with self._cond:
                    if credit.error:
                        self._error = credit.error
                    else:
                        self._credits.add_credits(credit.credits)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            with self._cond:
                if not (self._draining or self._abandoned):
                    self._error = f"{exc.code().name}: {exc.details()}"
                self._cond.notify_all()
        else:
            with self._cond:
                if not (self._draining or self._abandoned):
                    self._error = "consumer closed the channel"
                self._cond.notify_all()
        self._wake()

    def _check_open(self) -> None:
        if self._error is not None:
            raise ChannelClosedError(
                f"channel to {self._header.consumer.vertex_uid}#{self._header.consumer.subtask} broke: {self._error}"
            )

    def send(self, msg: taskmanager_pb2.DataMessage) -> None:
        """Queue ``msg`` behind the buffers queued before it. Raises ChannelClosedError once the
        channel broke."""
        with self._cond:
            self._check_open()
            self._queue.append(msg)
            self.buffers_sent += 1
            self.bytes_sent += len(msg.records)
            self._cond.notify_all()

    def send_priority(self, msg: taskmanager_pb2.DataMessage) -> list[ChannelBuffer]:
        """Send ``msg`` ahead of every queued buffer, without credit; answers the buffers it overtook
        (still queued, they go out after it): an unaligned checkpoint persists them."""
        if msg.record_count:
            raise ProtocolError("a priority event carries no records")
        with self._cond:
            self._check_open()
            overtaken: list[ChannelBuffer] = list(self._queue)
            self._priority.append(msg)
            self._cond.notify_all()
            return overtaken

    def available(self) -> bool:
        """Whether the task may produce more into this channel: it queues fewer than
        :data:`OUTPUT_QUEUE_LIMIT` buffers (or it broke, which the next send reports)."""
        return len(self._queue) < OUTPUT_QUEUE_LIMIT or self._error is not None

    @property
    def queued(self) -> int:
        """Buffers waiting for credit."""
        return len(self._queue)

    @property
    def credits(self) -> int:
        return self._credits.credits

    def close(self, *, drain: bool = False) -> None:
        """End the stream: with ``drain`` once the queued buffers went out (a task that finished),
        else at once (a task cancelled or failed)."""
        with self._cond:
            if drain and not self._cancelled.is_set():
                self._draining = True
            else:
                self._abandoned = True
            self._cond.notify_all()


GATE_WAIT_S = 30.0
"""How long an output channel waits for its consumer's task to be deployed before it breaks."""


class LocalOutputChannel:
    """One producer -> consumer channel inside one TaskManager: the interface and flow control of
    :class:`RemoteOutputChannel`, without gRPC, a thread or encoding. ``send`` queues a buffer and
    never blocks; queued buffers go into the consumer's :class:`InputGate` one per credit, in order,
    pushed by whichever thread finds one to go: the producer's in ``send``, or the consumer's when it
    takes a buffer and so grants a credit back (:meth:`InputGate.connect_local`). A priority event goes
    in first, without credit.

    The channel's own lock is never held while calling into the gate, so the gate's condition may be
    held while the gate calls the channel back (it is reentrant: the gate pushes into itself then).

    The consumer's gate may be registered after the producer deployed: the TaskManager connects the
    channel when it registers the gate (:meth:`connect`); the channel breaks if that takes longer than
    ``gate_wait_s``."""

    def __init__(
        self,
        header: taskmanager_pb2.ChannelHeader,
        cancelled: threading.Event,
        attach: Callable[[LocalOutputChannel], None],
        gate_wait_s: float = GATE_WAIT_S,
    ) -> None:
        self.header = header
        self._cancelled = cancelled
        self._attach = attach
        self._gate_wait_s = gate_wait_s
        self._connect_deadline: float | None = None  # set by open
        self._lock = threading.Lock()
        self._credits = OutputChannelCredits()
        self._gate: InputGate | None = None
        self._channel = header.consumer_channel
        self._queue: deque[ChannelBuffer] = deque()  # waiting for credit, in order
        self._priority: deque[ChannelBuffer] = deque()  # pushed first, without credit
        self._pushing = False  # a thread is pushing buffers into the gate; others leave it to that one
        self._wake: Callable[[], None] = _nothing
        self._error: str | None = None
        self._draining = False
        self._abandoned = False
        self._gone_told = False  # the gate was told the producer is gone
        self.buffers_sent = 0
        self.bytes_sent = 0  # nothing is encoded: always 0

    def set_wakeup(self, wake: Callable[[], None]) -> None:
        """``wake`` is called (holding no lock of the channel) whenever a queued buffer went into the
        gate on the consumer's thread or the channel broke: the task waiting for availability re-checks."""
        self._wake = wake

    def open(self) -> None:
        with self._lock:
            self._connect_deadline = time.monotonic() + self._gate_wait_s
        self._attach(self)

    def connect(self, gate: InputGate) -> None:
        """The consumer's gate is there: connect to it (the TaskManager calls this once)."""
        try:
            initial = gate.connect_local(self._channel, self._on_credit)
        except ProtocolError as exc:
            with self._lock:
                self._error = str(exc)
            self._wake()
            return
        with self._lock:
            self._gate = gate
            if self._error is None and not self._abandoned:
                self._credits.add_credits(initial)
        self._push()

    def _on_credit(self, grant: int | None) -> None:
        """From the gate, on the consumer's thread: ``grant`` credits more, or None once it closed."""
        with self._lock:
            if grant is None:
                if not (self._draining or self._abandoned) and self._error is None:
                    self._error = "consumer closed the channel"
                self._gone_told = True  # the gate is gone: nothing more to tell it
            else:
                self._credits.add_credits(grant)
        if self._push() or grant is None:
            self._wake()

    def _next(self) -> ChannelBuffer | None:
        """The next buffer to push, with the lock held; None when none may go now."""
        if self._gate is None or self._abandoned or self._error is not None:
            return None
        if self._priority:
            return self._priority.popleft()
        if self._queue and self._credits.can_send():
            self._credits.on_buffer_sent()
            return self._queue.popleft()
        return None

    def _push(self) -> bool:
        """Push what may go now into the gate, unless another thread is at it (it then pushes what
        this one would have: it checks again before it stops). Answers whether a buffer went."""
        with self._lock:
            if self._pushing:
                return False
            self._pushing = True
        pushed = False
        gone: str | None = None
        try:
            while True:
                with self._lock:
                    buffer = self._next()
                    if buffer is None:
                        self._pushing = False
                        gone = self._gone_reason()
                        gate = self._gate
                        break
                    gate = self._gate
                assert gate is not None
                gate.push(self._channel, buffer)
                pushed = True
        except BaseException as exc:
            with self._lock:
                self._pushing = False
                self._error = f"pushing into the input gate failed: {exc}"
            raise
        if gone is not None and gate is not None:
            gate.producer_gone(self._channel, gone)
        return pushed

    def _gone_reason(self) -> str | None:
        """Why the producer is gone, once the consumer is to be told (once, with the lock held)."""
        if self._gone_told or self._gate is None:
            return None
        if self._abandoned:
            reason = "producer closed the channel"
        elif self._draining and not self._queue and not self._priority:
            reason = "stream closed"
        elif self._error is not None:
            reason = self._error
        else:
            return None
        self._gone_told = True
        return reason

    def _expire_connect(self) -> None:
        """With the lock held: break the channel if its consumer's gate did not come in time."""
        if self._error is None and self._gate is None and self._connect_deadline is not None:
            if time.monotonic() > self._connect_deadline:
                consumer = self.header.consumer
                self._error = f"no task {consumer.vertex_uid}#{consumer.subtask} here after {self._gate_wait_s:g} s"

    def _check_open(self) -> None:
        """With the lock held: raise ChannelClosedError once the channel broke."""
        self._expire_connect()
        if self._error is not None:
            raise ChannelClosedError(
                f"channel to {self.header.consumer.vertex_uid}#{self.header.consumer.subtask} broke: {self._error}"
            )

    def send(self, buffer: ChannelBuffer) -> None:
        """Queue ``buffer`` behind the buffers queued before it and push what credit allows. The
        producer must not change its records afterwards. Raises ChannelClosedError once the channel broke."""
        with self._lock:
            self._check_open()
            self._queue.append(buffer)
            self.buffers_sent += 1
        self._push()

    def send_priority(self, msg: taskmanager_pb2.DataMessage) -> list[ChannelBuffer]:
        """Push ``msg`` ahead of every queued buffer, without credit; answers the buffers it overtook
        (still queued, they go after it): an unaligned checkpoint persists them."""
        if msg.record_count:
            raise ProtocolError("a priority event carries no records")
        with self._lock:
            self._check_open()
            overtaken = list(self._queue)
            self._priority.append(msg)
        self._push()
        return overtaken

    def available(self) -> bool:
        """As :meth:`RemoteOutputChannel.available`; a channel whose consumer did not come in time breaks."""
        with self._lock:
            self._expire_connect()
            return len(self._queue) < OUTPUT_QUEUE_LIMIT or self._error is not None

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def credits(self) -> int:
        return self._credits.credits

    def close(self, *, drain: bool = False) -> None:
        """End the channel: with ``drain`` once the queued buffers went in (a task that finished),
        else at once (a task cancelled or failed); the consumer is then told its producer is gone."""
        with self._lock:
            if drain and not self._cancelled.is_set():
                self._draining = True
            else:
                self._abandoned = True
        self._push()


OutputChannel = RemoteOutputChannel | LocalOutputChannel


def _nothing() -> None:
    return None
