"""The data plane: channels between subtasks over gRPC, batched, with credit-based flow control.

A producing subtask opens one bidirectional ``OpenChannel`` stream per consumer subtask. It sends
buffers (a batch of records as one bytes blob, then at most one in-band event: watermark, watermark
status idle/active, barrier, end of stream); the consumer answers with credits. A buffer is only
sent against a credit, and the consumer grants a credit back only when its task has taken a buffer
out of the channel's queue, so each channel holds at most ``initial_credits`` buffers: memory is
bounded and a slow consumer backpressures its producers.

A producer and a consumer subtask in the same TaskManager skip gRPC: a :class:`LocalOutputChannel`
hands its buffers straight to the consumer's :class:`InputGate`, under the same credits, without a
thread of its own and without encoding the records (Flink's ``LocalInputChannel``). Its buffers are
:class:`LocalBuffer` values: the producer's lists of values and timestamps, shared with the consumer.
So, as between the operators of one chain, a record's value is one object on both sides: an operator
must not mutate a value it has emitted, nor a value it was given (Flink's contract with object reuse
enabled). The record writer never touches a list again once it handed it over. Records are encoded
only when an unaligned checkpoint captures a local buffer (:func:`encoded`).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

import grpc

from weir.core.checkpointing import BarrierAlignment, CheckpointKind
from weir.core.codec import (
    barrier_alignment_from_proto,
    barrier_alignment_to_proto,
    checkpoint_kind_from_proto,
    checkpoint_kind_to_proto,
)
from weir.core.columnar import BatchKeys, FieldKey, channel_table, decode_ipc, encode_ipc, is_batch, split_by_channel
from weir.core.errors import ProtocolError, ServiceUnavailableError
from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.serde import dumps_value, loads_value
from weir.core.watermarks import WatermarkStatus
from weir.taskmanager.credit import InputChannelCredits, OutputChannelCredits
from weir.wire import common_pb2, taskmanager_pb2, taskmanager_pb2_grpc

INITIAL_CREDITS = 4
RECORDS_PER_BUFFER = 1000
OUTPUT_QUEUE_LIMIT = 2
"""Buffers an output channel may queue, waiting for credit, before its task stops taking input. The
consumer's credits (``INITIAL_CREDITS``) keep the wire busy; this only covers the gap between two
credits. One input buffer may still push a channel past it (its outputs are never split)."""

Event = taskmanager_pb2.EventKind


def encode_records(values: list[Any], timestamps: list[int | None]) -> bytes:
    """One buffer's records as one blob: values and timestamps as two parallel lists, which pickle and
    unpickle faster than a list of (value, timestamp) pairs (no tuple per record)."""
    return dumps_value((values, timestamps))


COLUMNAR_ROWS_PER_BUFFER = 8192
"""Rows a columnar output channel gathers before it sends a buffer (the buffer timeout sends fewer)."""


def encode_into(msg: taskmanager_pb2.DataMessage, values: list[Any], timestamps: list[int | None]) -> None:
    """Set a buffer's records: record batches (the columnar path) as one Arrow IPC stream, counted by
    rows; other values as one ``encode_records`` blob."""
    if values and is_batch(values[0]):
        msg.records = encode_ipc(values)
        msg.encoding = taskmanager_pb2.RECORD_ENCODING_ARROW_IPC
        msg.record_count = sum(v.num_rows for v in values)
    else:
        msg.records = encode_records(values, timestamps)
        msg.record_count = len(values)


def decode_message_records(msg: taskmanager_pb2.DataMessage) -> tuple[list[Any], list[int | None]]:
    """The (values, timestamps) of a buffer off the wire: an Arrow IPC buffer as its one batch."""
    if not msg.record_count:
        return [], []
    match msg.encoding:
        case taskmanager_pb2.RECORD_ENCODING_PICKLE:
            return decode_records(msg.records)
        case taskmanager_pb2.RECORD_ENCODING_ARROW_IPC:
            return [decode_ipc(msg.records)], [None]
        case _:
            raise ProtocolError(f"unknown record encoding {msg.encoding} in a buffer")


def decode_records(blob: bytes) -> tuple[list[Any], list[int | None]]:
    """The (values, timestamps) of one buffer. Raises ProtocolError for a blob of another shape."""
    if not blob:
        return [], []
    decoded = loads_value(blob)
    if not (isinstance(decoded, tuple) and len(decoded) == 2 and len(decoded[0]) == len(decoded[1])):
        raise ProtocolError("a record buffer must hold two lists of equal length (values, timestamps)")
    return decoded  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class LocalBuffer:
    """A buffer of a local channel: its records as the producer emitted them, never encoded, and
    ``message``, which carries the record count and at most one event (its ``records`` field empty)."""

    message: taskmanager_pb2.DataMessage
    values: list[Any]
    timestamps: list[int | None]


ChannelBuffer = taskmanager_pb2.DataMessage | LocalBuffer
"""One buffer in a channel: a ``DataMessage`` off the wire (its records encoded) or a local buffer."""


def message_of(buffer: ChannelBuffer) -> taskmanager_pb2.DataMessage:
    """The message of a buffer: its record count, event and priority (a local one without records)."""
    match buffer:
        case LocalBuffer(message=message):
            return message
        case taskmanager_pb2.DataMessage():
            return buffer
        case _:
            assert_never(buffer)


def encoded(buffer: ChannelBuffer) -> taskmanager_pb2.DataMessage:
    """The buffer as it would go over the wire: a local buffer's records encoded (to persist it)."""
    match buffer:
        case LocalBuffer(message=message, values=values, timestamps=timestamps):
            msg = taskmanager_pb2.DataMessage()
            msg.CopyFrom(message)
            if values:
                encode_into(msg, values, timestamps)
            return msg
        case taskmanager_pb2.DataMessage():
            return buffer
        case _:
            assert_never(buffer)


def records_of(buffer: ChannelBuffer) -> ChannelBuffer:
    """The buffer's records alone, without its event."""
    match buffer:
        case LocalBuffer(message=message, values=values, timestamps=timestamps):
            return LocalBuffer(taskmanager_pb2.DataMessage(record_count=message.record_count), values, timestamps)
        case taskmanager_pb2.DataMessage():
            return taskmanager_pb2.DataMessage(
                records=buffer.records, record_count=buffer.record_count, encoding=buffer.encoding
            )
        case _:
            assert_never(buffer)


class ChannelClosedError(ServiceUnavailableError):
    """The other side of a channel went away (its TaskManager died or the task was cancelled)."""


class Cancelled(Exception):
    """Raised inside a task's thread when the task is being cancelled."""


# Producer side ------------------------------------------------------------------------------------


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


class KeyRejected(Protocol):
    """Told that the key selector of a keyed edge raised ``exc`` on record ``value``: raises (the task
    fails with the record named) or dead-letters the record and returns (the writer drops it)."""

    def __call__(self, exc: Exception, value: Any, timestamp: int | None) -> None: ...


class RecordWriter:
    """The records of one output edge, partitioned and batched per channel."""

    def __init__(
        self,
        channels: list[OutputChannel],
        partitioner: Any,
        key_selector: Any,
        key_group_of: Any,
        flush_interval_s: float,
        *,
        columnar: bool = False,
        max_parallelism: int = 0,
        key_rejected: KeyRejected | None = None,
    ) -> None:
        self.channels = channels
        self._partitioner = partitioner
        self._key_selector = key_selector
        self._key_rejected = key_rejected  # None: a key selector raising fails the task as it is
        self._key_group_of = key_group_of
        self._values: list[list[Any]] = [[] for _ in channels]
        self._timestamps: list[list[int | None]] = [[] for _ in channels]
        self._flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        self.records_out = 0
        self._single_channel = len(channels) == 1 and key_selector is None  # no partitioning to do
        self._rows = [0] * len(channels)
        if columnar:  # the edge carries record batches: partitioned on arrays, buffered by rows
            self.emit = self._emit_batch  # type: ignore[method-assign]
            if key_selector is not None:
                if not isinstance(key_selector, FieldKey):
                    raise ValueError(f"a columnar edge is keyed by a field name, not by {key_selector!r}")
                self._batch_keys = BatchKeys(key_selector.field, max_parallelism)
                self._channel_of = channel_table(lambda kg: partitioner.select_channels(kg)[0], max_parallelism)

    def _emit_batch(self, batch: Any, timestamp: int | None) -> None:
        if self._key_selector is not None:
            channels = self._channel_of[self._batch_keys.key_groups(batch)]
            parts = split_by_channel(batch, channels, len(self.channels))
        elif len(self.channels) == 1:
            parts = [(0, batch)]
        else:
            parts = [(ch, batch) for ch in self._partitioner.select_channels(None)]
        for ch, part in parts:
            self._values[ch].append(part)
            self._timestamps[ch].append(None)
            self._rows[ch] += part.num_rows
            if self._rows[ch] >= COLUMNAR_ROWS_PER_BUFFER:
                self._flush_channel(ch)
        self.records_out += batch.num_rows

    def emit(self, value: Any, timestamp: int | None) -> None:
        if self._single_channel:
            values = self._values[0]
            values.append(value)
            self._timestamps[0].append(timestamp)
            if len(values) >= RECORDS_PER_BUFFER:
                self._flush_channel(0)
        else:
            kg = None
            if self._key_selector is not None:
                try:
                    kg = self._key_group_of(self._key_selector(value))
                except Exception as exc:
                    if self._key_rejected is None:
                        raise
                    self._key_rejected(exc, value, timestamp)  # raises with the record named, or dead-letters it
                    return
            for ch in self._partitioner.select_channels(kg):
                values = self._values[ch]
                values.append(value)
                self._timestamps[ch].append(timestamp)
                if len(values) >= RECORDS_PER_BUFFER:
                    self._flush_channel(ch)
        self.records_out += 1

    def _flush_channel(self, ch: int, event: taskmanager_pb2.DataMessage | None = None) -> None:
        values, channel = self._values[ch], self.channels[ch]
        msg = event if event is not None else taskmanager_pb2.DataMessage()
        if values:
            timestamps = self._timestamps[ch]
            msg.record_count = self._rows[ch] or len(values)
            self._values[ch] = []  # the lists handed over are never touched again
            self._timestamps[ch] = []
            self._rows[ch] = 0
            if isinstance(channel, LocalOutputChannel):
                channel.send(LocalBuffer(msg, values, timestamps))
                return
            encode_into(msg, values, timestamps)
        if msg.record_count or msg.event:
            channel.send(msg)

    def flush(self) -> None:
        for ch in range(len(self.channels)):
            if self._values[ch]:
                self._flush_channel(ch)
        self._last_flush = time.monotonic()

    def flush_due(self, now: float) -> bool:
        """Whether the buffer timeout (``flush_interval_s``) passed since the last flush."""
        return now - self._last_flush >= self._flush_interval_s

    def buffered(self) -> bool:
        """Whether records wait in a buffer for the next flush."""
        return any(self._values)

    def flush_deadline(self) -> float:
        """When (monotonic) the buffer timeout of the records buffered now runs out."""
        return self._last_flush + self._flush_interval_s

    def broadcast_event(self, template: taskmanager_pb2.DataMessage) -> None:
        """Send an event to every channel, after the records buffered before it."""
        for ch in range(len(self.channels)):
            msg = taskmanager_pb2.DataMessage()
            msg.CopyFrom(template)
            self._flush_channel(ch, msg)
        self._last_flush = time.monotonic()

    def available(self) -> bool:
        """Whether every channel may take more (:meth:`RemoteOutputChannel.available`)."""
        return all(channel.available() for channel in self.channels)

    def broadcast_priority(self, template: taskmanager_pb2.DataMessage) -> list[list[ChannelBuffer]]:
        """Send a priority event (an unaligned barrier) to every channel ahead of what they queue; the
        records buffered now are queued first. Answers, per channel, the buffers it overtook. A forced
        aligned barrier (a final checkpoint's) must go in order: refused."""
        if template.barrier_alignment == common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED:
            raise ProtocolError(
                f"barrier {template.checkpoint_id} is forced aligned: it must not overtake the records before it"
            )
        self.flush()
        overtaken = []
        for channel in self.channels:
            msg = taskmanager_pb2.DataMessage()
            msg.CopyFrom(template)
            msg.priority = True
            overtaken.append(channel.send_priority(msg))
        return overtaken

    def close(self, *, drain: bool = False) -> None:
        for channel in self.channels:
            channel.close(drain=drain)


# Consumer side ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Queued:
    """A buffer in an input channel's queue, with its arrival number on the channel (0, 1, ...): a
    priority event is ahead of exactly the queued buffers numbered below its mark, whatever is taken
    from or deleted in the queue meanwhile; a count of the buffers ahead would go stale. Flink's
    ``RemoteInputChannel`` does the same: it keeps the sequence number of the last barrier and its
    in-flight buffers are those queued with a lower one."""

    arrival: int
    buffer: ChannelBuffer


@dataclass
class _InputChannel:
    index: int
    gate: int
    credits: InputChannelCredits
    buffers: deque[_Queued]
    announcements: queue.SimpleQueue[int | None]  # credit grants to a remote producer; None: closed
    local_producer: Callable[[int | None], None] | None = None  # credit grants to a local producer, instead
    blocked: bool = False
    ended: bool = False  # the task took the end-of-stream buffer
    eos_received: bool = False  # the end-of-stream buffer arrived (the producer may now hang up)
    connected: bool = False
    arrivals: int = 0  # buffers ever queued: the arrival number of the next one

    def queue(self, buffer: ChannelBuffer) -> None:
        self.buffers.append(_Queued(self.arrivals, buffer))
        self.arrivals += 1

    def ahead_of(self, mark: int) -> tuple[ChannelBuffer, ...]:
        """The queued buffers that arrived before ``mark``, in order."""
        return tuple(q.buffer for q in itertools.takewhile(lambda q: q.arrival < mark, self.buffers))


@dataclass(frozen=True)
class ReceivedBuffer:
    """A buffer the task took from one of its input channels; ``gate``: the head's input it feeds.
    For a priority event, ``overtaken``: the buffers that arrived on its channel before it and are
    still queued (the task takes them next, in order)."""

    channel: ChannelIndex
    gate: int
    message: ChannelBuffer
    overtaken: tuple[ChannelBuffer, ...] = ()


class InputGate:
    """All input channels of one subtask; the task thread takes buffers, round robin.

    ``condition`` guards the channels and is notified when a buffer arrives, a channel is unblocked or
    a producer is lost: the task's mailbox shares it, so that input and control mails wake the task
    through one signal."""

    def __init__(
        self, gates: list[int], initial_credits: int = INITIAL_CREDITS, condition: threading.Condition | None = None
    ) -> None:
        self._cond = condition if condition is not None else threading.Condition()
        self.channels = [
            _InputChannel(i, g, InputChannelCredits(initial_credits), deque(), queue.SimpleQueue())
            for i, g in enumerate(gates)
        ]
        self._initial_credits = initial_credits
        self._next = 0
        self._failure: str | None = None
        # Priority events by arrival, each with its mark: the arrival number its channel's next buffer
        # had then, so the buffers it overtook are those still queued with a lower one.
        self._priority: deque[tuple[_InputChannel, ChannelBuffer, int]] = deque()
        # In-order checkpoint barriers still queued: checkpoint id -> (its trigger time, how many).
        self._queued_barriers: dict[int, tuple[float, int]] = {}

    # Called by the gRPC servicer threads.

    def connect(self, channel: int) -> int:
        with self._cond:
            ch = self.channels[channel]
            if ch.connected:
                raise ProtocolError(f"input channel {channel} is already connected")
            ch.connected = True
            return self._initial_credits

    def connect_local(self, channel: int, grant: Callable[[int | None], None]) -> int:
        """Connect a producer in this process: its later credits go to ``grant`` (called on the task's
        thread, maybe with the gate's condition held; None once the gate closed) instead of the
        announcement queue. Answers the initial credits."""
        with self._cond:
            initial = self.connect(channel)
            self.channels[channel].local_producer = grant
            return initial

    def _announce(self, ch: _InputChannel, grant: int) -> None:
        if ch.local_producer is not None:
            ch.local_producer(grant)
        else:
            ch.announcements.put(grant)

    def push(self, channel: int, buffer: ChannelBuffer) -> None:
        msg = message_of(buffer)
        with self._cond:
            ch = self.channels[channel]
            if msg.priority:  # sent without credit, taken ahead of the queue
                if msg.record_count or msg.event != Event.EVENT_KIND_BARRIER:
                    raise ProtocolError(f"input channel {channel}: a priority message must be a bare barrier")
                self._priority.append((ch, buffer, ch.arrivals))
                self._cond.notify()
                return
            ch.credits.on_buffer_received()
            ch.queue(buffer)
            if _timeoutable(msg):
                timestamp, count = self._queued_barriers.get(msg.checkpoint_id, (msg.checkpoint_timestamp, 0))
                self._queued_barriers[msg.checkpoint_id] = (timestamp, count + 1)
            if msg.event == Event.EVENT_KIND_END_OF_STREAM:
                ch.eos_received = True
            self._cond.notify()

    def producer_gone(self, channel: int, reason: str) -> None:
        with self._cond:
            ch = self.channels[channel]
            if not ch.eos_received and self._failure is None:
                self._failure = f"input channel {channel} lost its producer: {reason}"
            self._cond.notify()

    # Called by the task thread.

    @property
    def condition(self) -> threading.Condition:
        return self._cond

    def take(self) -> ReceivedBuffer | None:
        """The next priority event, else the next buffer of an unblocked channel, without waiting;
        None when none is queued. Raises ChannelClosedError once a channel lost its producer before
        its end of stream."""
        with self._cond:
            priority = self.take_priority()
            if priority is not None:
                return priority
            n = len(self.channels)
            for step in range(n):
                ch = self.channels[(self._next + step) % n]
                if ch.buffers and not ch.blocked:
                    self._next = (ch.index + 1) % n
                    buffer = ch.buffers.popleft().buffer
                    msg = message_of(buffer)
                    if msg.event == Event.EVENT_KIND_END_OF_STREAM:
                        ch.ended = True
                    elif _timeoutable(msg):
                        self._barrier_taken(msg.checkpoint_id)
                    grant = ch.credits.on_buffer_consumed()
                    if grant:
                        self._announce(ch, grant)
                    return ReceivedBuffer(ChannelIndex(ch.index), ch.gate, buffer)
            return None

    def take_priority(self) -> ReceivedBuffer | None:
        """The next priority event, without waiting (a backpressured task takes only these); None
        when none arrived. Raises ChannelClosedError as :meth:`take` does."""
        with self._cond:
            if self._failure is not None:
                raise ChannelClosedError(self._failure)
            if not self._priority:
                return None
            return self._received_priority(*self._priority.popleft())

    def pending_priority(self) -> tuple[ReceivedBuffer, ...]:
        """The priority events not taken yet, each with what it overtook, in the order
        :meth:`take_priority` hands them out; nothing is taken."""
        with self._cond:
            return tuple(self._received_priority(*entry) for entry in self._priority)

    def _received_priority(self, ch: _InputChannel, msg: ChannelBuffer, mark: int) -> ReceivedBuffer:
        return ReceivedBuffer(ChannelIndex(ch.index), ch.gate, msg, ch.ahead_of(mark))

    def _barrier_taken(self, checkpoint_id: int) -> None:
        timestamp, count = self._queued_barriers.get(checkpoint_id, (0.0, 1))
        if count > 1:
            self._queued_barriers[checkpoint_id] = (timestamp, count - 1)
        else:
            self._queued_barriers.pop(checkpoint_id, None)

    def queued_barrier_times(self) -> dict[int, float]:
        """The in-order checkpoint barriers still queued: checkpoint id -> its trigger time (epoch s)."""
        with self._cond:
            return {cid: timestamp for cid, (timestamp, _) in self._queued_barriers.items()}

    def prioritize(self, checkpoint_id: int) -> int:
        """Turn the queued in-order barriers of ``checkpoint_id`` into priority events that overtake the
        buffers ahead of them (the aligned-checkpoint timeout). A barrier's records stay in its place;
        a bare barrier's slot is freed (its credit goes back). Answers how many were turned."""
        with self._cond:
            turned = 0
            for ch in self.channels:
                position = next(
                    (
                        i
                        for i, queued in enumerate(message_of(q.buffer) for q in ch.buffers)
                        if _timeoutable(queued) and queued.checkpoint_id == checkpoint_id
                    ),
                    None,
                )
                if position is None:
                    continue
                slot = ch.buffers[position]
                msg = message_of(slot.buffer)
                barrier = taskmanager_pb2.DataMessage(
                    event=msg.event,
                    checkpoint_id=msg.checkpoint_id,
                    checkpoint_kind=msg.checkpoint_kind,
                    checkpoint_timestamp=msg.checkpoint_timestamp,
                    priority=True,
                    barrier_alignment=msg.barrier_alignment,
                )
                if msg.record_count:  # the records before the barrier stay queued, as a buffer of their own
                    ch.buffers[position] = _Queued(slot.arrival, records_of(slot.buffer))
                    mark = slot.arrival + 1
                else:
                    del ch.buffers[position]
                    grant = ch.credits.on_buffer_consumed()
                    if grant:
                        self._announce(ch, grant)
                    mark = slot.arrival
                self._priority.append((ch, barrier, mark))
                turned += 1
            self._queued_barriers.pop(checkpoint_id, None)
            if turned:
                self._cond.notify()
            return turned

    def poll(self, timeout: float) -> tuple[int, int, ChannelBuffer] | None:
        """The next buffer of an unblocked channel as (channel, gate, message), waiting up to
        ``timeout``; None on timeout. (A task waits through its mailbox instead.)"""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                taken = self.take()
                if taken is not None:
                    return taken.channel, taken.gate, taken.message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def block(self, channel: int) -> None:
        with self._cond:
            self.channels[channel].blocked = True

    def unblock(self, channels: Collection[int] | None = None) -> None:
        with self._cond:
            for ch in self.channels:
                if channels is None or ch.index in channels:
                    ch.blocked = False
            self._cond.notify()

    def queued_buffers(self) -> int:
        return sum(len(ch.buffers) for ch in self.channels)

    def capacity(self) -> int:
        return len(self.channels) * self._initial_credits

    def close(self) -> None:
        """The task is done with its input: its producers are told (their channels end)."""
        for ch in self.channels:
            if ch.local_producer is not None:
                ch.local_producer(None)
            else:
                ch.announcements.put(None)


def _timeoutable(msg: taskmanager_pb2.DataMessage) -> bool:
    """An in-order checkpoint barrier, which the aligned-checkpoint timeout may turn into a priority one
    (a savepoint's barrier never: a savepoint stays aligned; nor a forced aligned one, a final
    checkpoint's, which must not overtake the records before it)."""
    return (
        msg.event == Event.EVENT_KIND_BARRIER
        and msg.checkpoint_kind != common_pb2.CHECKPOINT_KIND_SAVEPOINT
        and msg.barrier_alignment != common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED
    )


# Events in a channel, read by the consumer ------------------------------------------------------


@dataclass(frozen=True)
class WatermarkEvent:
    watermark: int


@dataclass(frozen=True)
class WatermarkIdle:
    """The producer went idle: leave the channel out of the watermark until it is active again."""


@dataclass(frozen=True)
class WatermarkActive:
    """The producer is active again."""


@dataclass(frozen=True)
class EndOfStream:
    """The producer ended; nothing follows on this channel."""


@dataclass(frozen=True)
class Barrier:
    checkpoint_id: CheckpointId
    timestamp: float
    kind: CheckpointKind
    alignment: BarrierAlignment = BarrierAlignment.BY_MODE


@dataclass(frozen=True)
class CancelBarrier:
    """The producer gave up on the checkpoint."""

    checkpoint_id: CheckpointId


ChannelEvent = WatermarkEvent | WatermarkIdle | WatermarkActive | EndOfStream | Barrier | CancelBarrier


@dataclass(frozen=True)
class Buffer:
    """One received buffer, decoded: its records, then at most one event."""

    values: list[Any]
    timestamps: list[int | None]
    size_bytes: int  # of the encoded records (0 for a local buffer: they were never encoded)
    event: ChannelEvent | None


def read_buffer(buffer: ChannelBuffer) -> Buffer:
    """Decode a received buffer (a local one's records as they are). Raises ProtocolError for records
    of another shape or an unknown event."""
    match buffer:
        case LocalBuffer(message=msg, values=values, timestamps=timestamps):
            return Buffer(values, timestamps, 0, _read_event(msg))
        case taskmanager_pb2.DataMessage():
            values, timestamps = decode_message_records(buffer)
            return Buffer(values, timestamps, len(buffer.records), _read_event(buffer))
        case _:
            assert_never(buffer)


def _read_event(msg: taskmanager_pb2.DataMessage) -> ChannelEvent | None:
    match msg.event:
        case Event.EVENT_KIND_UNSPECIFIED:
            return None
        case Event.EVENT_KIND_WATERMARK:
            return WatermarkEvent(msg.watermark)
        case Event.EVENT_KIND_WATERMARK_IDLE:
            return WatermarkIdle()
        case Event.EVENT_KIND_WATERMARK_ACTIVE:
            return WatermarkActive()
        case Event.EVENT_KIND_END_OF_STREAM:
            return EndOfStream()
        case Event.EVENT_KIND_BARRIER:
            kind = checkpoint_kind_from_proto(msg.checkpoint_kind or common_pb2.CHECKPOINT_KIND_CHECKPOINT)
            alignment = barrier_alignment_from_proto(msg.barrier_alignment)
            return Barrier(CheckpointId(msg.checkpoint_id), msg.checkpoint_timestamp, kind, alignment)
        case Event.EVENT_KIND_CANCEL_BARRIER:
            return CancelBarrier(CheckpointId(msg.checkpoint_id))
        case _:
            raise ProtocolError(f"unknown event kind {msg.event} in a buffer")


# Events in a channel, sent by the producer -------------------------------------------------------


def barrier_message(
    checkpoint_id: int,
    timestamp: float,
    kind: CheckpointKind,
    alignment: BarrierAlignment = BarrierAlignment.BY_MODE,
) -> taskmanager_pb2.DataMessage:
    """A checkpoint barrier; ``alignment`` FORCED_ALIGNED (a final checkpoint's) tells every task
    downstream to align it in any mode and never to take it ahead of its queue."""
    return taskmanager_pb2.DataMessage(
        event=Event.EVENT_KIND_BARRIER,
        checkpoint_id=checkpoint_id,
        checkpoint_timestamp=timestamp,
        checkpoint_kind=checkpoint_kind_to_proto(kind),
        barrier_alignment=barrier_alignment_to_proto(alignment),
    )


def cancel_barrier_message(checkpoint_id: int) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(event=Event.EVENT_KIND_CANCEL_BARRIER, checkpoint_id=checkpoint_id)


def watermark_message(watermark: int) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(event=Event.EVENT_KIND_WATERMARK, watermark=watermark)


def watermark_status_message(status: WatermarkStatus) -> taskmanager_pb2.DataMessage:
    """The producer went idle (its consumers leave the channel out of their watermark) or active again."""
    match status:
        case WatermarkStatus.IDLE:
            return taskmanager_pb2.DataMessage(event=Event.EVENT_KIND_WATERMARK_IDLE)
        case WatermarkStatus.ACTIVE:
            return taskmanager_pb2.DataMessage(event=Event.EVENT_KIND_WATERMARK_ACTIVE)
        case _:
            assert_never(status)


def end_of_stream_message() -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(event=Event.EVENT_KIND_END_OF_STREAM)
