"""What a channel carries, and how it is encoded on the wire (the data plane's codec).

A buffer is a batch of records as one bytes blob (two parallel lists of values and timestamps,
pickled; a columnar edge's record batches as one Arrow IPC stream), then at most one in-band event:
watermark, watermark status idle/active, checkpoint barrier, cancellation marker, end of stream. A
local channel's buffer (:class:`LocalBuffer`) keeps the producer's lists as they are, never encoded;
it is encoded only when an unaligned checkpoint persists it (:func:`encoded`). The producer makes
events with the ``*_message`` functions; the consumer decodes a buffer with :func:`read_buffer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never

from weir.core.checkpointing import BarrierAlignment, CheckpointKind
from weir.core.codec import (
    barrier_alignment_from_proto,
    barrier_alignment_to_proto,
    checkpoint_kind_from_proto,
    checkpoint_kind_to_proto,
)
from weir.core.columnar import decode_ipc, encode_ipc, is_batch
from weir.core.errors import ProtocolError, ServiceUnavailableError
from weir.core.ids import CheckpointId
from weir.core.serde import dumps_value, loads_value
from weir.core.watermarks import WatermarkStatus
from weir.wire import common_pb2, taskmanager_pb2

Event = taskmanager_pb2.EventKind


def encode_records(values: list[Any], timestamps: list[int | None]) -> bytes:
    """One buffer's records as one blob: values and timestamps as two parallel lists, which pickle and
    unpickle faster than a list of (value, timestamp) pairs (no tuple per record)."""
    return dumps_value((values, timestamps))


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
    return decoded


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
    full: bool = False  # a full checkpoint's: the snapshots it starts reuse no file of an earlier one


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
            return Barrier(
                CheckpointId(msg.checkpoint_id), msg.checkpoint_timestamp, kind, alignment, msg.full_checkpoint
            )
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
    *,
    full: bool = False,
) -> taskmanager_pb2.DataMessage:
    """A checkpoint barrier; ``alignment`` FORCED_ALIGNED (a final checkpoint's) tells every task
    downstream to align it in any mode and never to take it ahead of its queue; ``full``: a full
    checkpoint's, whose snapshots reuse no file of an earlier checkpoint."""
    return taskmanager_pb2.DataMessage(
        event=Event.EVENT_KIND_BARRIER,
        checkpoint_id=checkpoint_id,
        checkpoint_timestamp=timestamp,
        checkpoint_kind=checkpoint_kind_to_proto(kind),
        barrier_alignment=barrier_alignment_to_proto(alignment),
        full_checkpoint=full,
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
