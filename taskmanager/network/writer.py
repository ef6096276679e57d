"""The record writer of one output edge (partitioned, batched per channel) and the task's outputs.

A record leaves the chain through the :class:`NetworkOutput` of its edge into that edge's
:class:`RecordWriter`, which picks the channel(s) with the edge's partitioner and batches records
per channel until a buffer is full (``RECORDS_PER_BUFFER``) or the buffer timeout flushes it.
:class:`TaskOutputs` is every edge of one subtask: what the task's loop asks of its outputs
(availability, flush deadlines) and what a checkpoint sends through them (barriers, in order or as
priority events), as Flink's ``OperatorChain`` does with its stream outputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from weir.core.columnar import BatchKeys, FieldKey, channel_table, concat, split_by_channel
from weir.core.errors import ProtocolError
from weir.core.keygroups import PLAIN_KEY_ITEMS
from weir.core.watermarks import WatermarkStatus
from weir.taskmanager.network.codec import (
    ChannelBuffer,
    LocalBuffer,
    encode_into,
    end_of_stream_message,
    watermark_message,
    watermark_status_message,
)
from weir.taskmanager.network.output_channels import LocalOutputChannel, OutputChannel
from weir.taskmanager.partitioners import KeyGroupPartitioner
from weir.wire import common_pb2, taskmanager_pb2

RECORDS_PER_BUFFER = 1000
COLUMNAR_ROWS_PER_BUFFER = 8192
"""Rows a columnar output channel gathers before it sends a buffer (the buffer timeout sends fewer)."""
CHANNEL_MEMO_KEYS = 100_000
"""Keys whose channel a hash-partitioned writer remembers; past it, it forgets them all at once."""


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
        self._columnar = columnar
        if columnar:  # the edge carries record batches: partitioned on arrays, buffered by rows
            # The columnar path takes record batches, not records: bound once, at construction.
            self.emit = self._emit_batch  # type: ignore[method-assign,assignment]
            if key_selector is not None:
                if not isinstance(key_selector, FieldKey):
                    raise ValueError(f"a columnar edge is keyed by a field name, not by {key_selector!r}")
                self._batch_keys = BatchKeys(key_selector.field, max_parallelism)
                self._channel_of = channel_table(lambda kg: partitioner.select_channels(kg)[0], max_parallelism)
        elif key_selector is not None and isinstance(partitioner, KeyGroupPartitioner):
            # Hash partitioning: one channel per key group, so per key; bound once, at construction.
            self._channel_of_key: dict[Any, int] = {}
            self.emit = self._emit_hashed  # type: ignore[method-assign]

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

    def _emit_hashed(self, value: Any, timestamp: int | None) -> None:
        """:meth:`emit` on a hash-partitioned edge: the channel of a ``str``, ``int`` or ``bytes`` key,
        or a tuple of those and None (a SQL key), seen before is one dict lookup (what ``KeyEncoder``
        remembers, for the same reason: equal values of other types may encode differently), up to
        ``CHANNEL_MEMO_KEYS`` keys."""
        memo = self._channel_of_key
        try:
            key = self._key_selector(value)
            kind = type(key)
            if kind is tuple:  # a SQL key: remembered when its items are of one type per value
                remembered = True
                for item in key:
                    if type(item) not in PLAIN_KEY_ITEMS:
                        remembered = False
                        break
            else:
                remembered = kind is str or kind is int or kind is bytes
            ch = memo.get(key) if remembered else None
            if ch is None:
                kg = self._key_group_of(key)
        except Exception as exc:
            if self._key_rejected is None:
                raise
            self._key_rejected(exc, value, timestamp)  # raises with the record named, or dead-letters it
            return
        if ch is None:
            ch = self._partitioner.select_channels(kg)[0]
            if remembered:
                if len(memo) >= CHANNEL_MEMO_KEYS:
                    memo.clear()
                memo[key] = ch
        values = self._values[ch]
        values.append(value)
        self._timestamps[ch].append(timestamp)
        if len(values) >= RECORDS_PER_BUFFER:
            self._flush_channel(ch)
        self.records_out += 1

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
                if self._columnar and len(values) > 1:  # one batch per buffer, as a remote channel's
                    values, timestamps = [concat(values)], [None]
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


class NetworkOutput:
    """An edge out of the chain into its RecordWriter; watermarks ride along with the next flush.
    ``emit`` is the writer's own, bound once (no call in between)."""

    __slots__ = ("emit", "pending_watermark", "writer")

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self.emit: Callable[[Any, int | None], None] = writer.emit
        self.pending_watermark: int | None = None

    def emit_watermark(self, watermark: int) -> None:
        self.pending_watermark = watermark

    def end_of_stream(self) -> None:
        self.flush()
        self.writer.broadcast_event(end_of_stream_message())

    def flush_deadline(self) -> float | None:
        """When the buffer timeout of what waits here runs out; None when nothing waits."""
        if self.pending_watermark is None and not self.writer.buffered():
            return None
        return self.writer.flush_deadline()

    def maybe_flush(self, now: float) -> None:
        """Flush once the buffer timeout passed since the last flush."""
        if self.writer.flush_due(now):
            self.flush()

    def flush(self) -> None:
        wm = self.pending_watermark
        if wm is not None:
            self.pending_watermark = None
            self.writer.broadcast_event(watermark_message(wm))
        else:
            self.writer.flush()


class TaskOutputs:
    """Every output edge of one subtask, in the order of its vertex's outputs: the chain emits into
    :attr:`edges`; the task's loop asks whether they can take more and when a buffer timeout runs out;
    a checkpoint flushes them and broadcasts its barrier through them (Flink's ``OperatorChain``:
    ``getStreamOutputs``, ``flushOutputs``, ``broadcastEvent``)."""

    __slots__ = ("_status", "edges", "writers")

    def __init__(self, writers: Sequence[RecordWriter]) -> None:
        self.writers = tuple(writers)
        self.edges = tuple(NetworkOutput(w) for w in self.writers)
        self._status = WatermarkStatus.ACTIVE  # what this subtask last announced downstream

    def available(self) -> bool:
        """Whether every channel may take more (``output_channels.OUTPUT_QUEUE_LIMIT``): a task whose
        outputs are not available is backpressured and takes no more input."""
        return all(w.available() for w in self.writers)

    def flush(self) -> None:
        """Send what every edge buffers (and a watermark waiting for the next flush)."""
        for edge in self.edges:
            edge.flush()

    def flush_deadline(self) -> float | None:
        """The earliest buffer timeout (monotonic) of what the edges buffer; None when nothing waits."""
        deadlines = [d for edge in self.edges if (d := edge.flush_deadline()) is not None]
        return min(deadlines) if deadlines else None

    def flush_due(self, now: float) -> None:
        """Flush each edge whose buffer timeout ran out by ``now`` (monotonic)."""
        for edge in self.edges:
            edge.maybe_flush(now)

    def broadcast(self, message: taskmanager_pb2.DataMessage) -> None:
        """Send an event to every channel of every edge, behind the records buffered before it."""
        for w in self.writers:
            w.broadcast_event(message)

    def broadcast_priority(self, message: taskmanager_pb2.DataMessage) -> list[list[list[ChannelBuffer]]]:
        """Send a priority event (an unaligned barrier) ahead of what every channel queues; answers,
        per edge and channel, the buffers it overtook."""
        return [w.broadcast_priority(message) for w in self.writers]

    def announce(self, status: WatermarkStatus) -> bool:
        """Tell every consumer that this subtask went idle or active, after the records and the
        watermark already emitted (so they arrive in order); False when that was already said."""
        if status is self._status:
            return False
        self._status = status
        self.flush()
        self.broadcast(watermark_status_message(status))
        return True

    @property
    def records_out(self) -> int:
        return sum(w.records_out for w in self.writers)

    @property
    def channels(self) -> list[OutputChannel]:
        return [ch for w in self.writers for ch in w.channels]

    def close(self, *, drain: bool) -> None:
        """End every channel: with ``drain`` once what they queue went out (a finished task)."""
        for w in self.writers:
            w.close(drain=drain)
