"""The in-flight data of an unaligned checkpoint: captured while it runs, persisted with it, replayed
on restore. Pure: no I/O, no clock.

In unaligned mode (FLIP-76) a checkpoint's barrier is a priority event: the producing task sends it
ahead of the buffers its output channels still queue, and the consuming task takes it ahead of the
buffers its input channel queues (``taskmanager.network``). So the barrier overtakes data that was
produced before it, and that data is the checkpoint's in-flight state, in two parts:

- **input**, per input channel of the consuming task: the buffers it read from a channel after its
  snapshot (which it took on the first barrier) until that channel's barrier, then the buffers that
  channel queued ahead of its barrier when the barrier arrived (:class:`InflightCapture`);
- **output**, per output channel of a task: the buffers queued, not yet sent, when its barrier
  overtook them.

The task processes and sends those buffers as usual, and also keeps copies in the checkpoint. A
restore replays the output part into the output channels and the input part into the chain before
any new input, channel by channel, each in its original order: every record then affects the state
exactly once. A buffer is kept as its ``DataMessage`` (records and at most one watermark or
watermark-status event; never a barrier or end of stream), serialized.

The stored document, format 2 (``docs/formats.md``)::

    {"format": 2, "checkpoint_id": int,
     "input":  [{"channel": int, "gate": int, "producer": str,                         # by channel
                 "buffers": ["<base64 DataMessage>", ...]}, ...],
     "output": [{"output": int, "channel": int, "buffers": ["<base64 DataMessage>", ...]}, ...]}

``gate`` and ``producer`` (the head's input index and the producing vertex of the channel) let a
restore at another parallelism route the records (``taskmanager.task``); a document without them
restores only at the parallelism that wrote it. Format 1 (input record blobs only,
``"channels": [{"channel", "buffers": [<base64 record blob>]}]``) is still read.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from taskmanager.network import ChannelBuffer, decode_records, encoded, message_of, records_of
from weir.core.documents import load_versioned, typed
from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.task_state import INFLIGHT_STATE_NAME
from weir.wire import taskmanager_pb2

__all__ = [
    "INFLIGHT_FORMAT",
    "INFLIGHT_STATE_NAME",
    "InflightCapture",
    "InflightCaptureError",
    "InflightState",
    "InputOrigin",
    "OutputChannelKey",
    "decode_inflight",
    "encode_inflight",
    "persistable",
]

INFLIGHT_FORMAT: Final = 2
_READABLE_FORMATS: Final = (1, 2)

_Event = taskmanager_pb2.EventKind
_PERSISTED_EVENTS: Final = frozenset(
    {
        _Event.EVENT_KIND_UNSPECIFIED,
        _Event.EVENT_KIND_WATERMARK,
        _Event.EVENT_KIND_WATERMARK_IDLE,
        _Event.EVENT_KIND_WATERMARK_ACTIVE,
    }
)

OutputChannelKey = tuple[int, int]
"""(output edge index, channel index) of a task's output channel."""


@dataclass(frozen=True)
class InputOrigin:
    """Where an input channel's records come from: the head's input (gate) and the producing vertex,
    which name the network edge in the job plan."""

    gate: int
    producer_vertex: str


class InflightCaptureError(SerializationError):
    """In-flight data was captured or completed against the capture protocol (a runtime bug)."""


def persistable(buffer: ChannelBuffer) -> bytes | None:
    """What of ``buffer`` an unaligned checkpoint keeps, serialized (a local buffer's records encoded
    now): its records and a watermark event, not a barrier, cancellation marker or end of stream (a
    checkpoint restored replays no control events). None when nothing is left."""
    message = message_of(buffer)
    if message.event in _PERSISTED_EVENTS:
        return encoded(buffer).SerializeToString() if (message.record_count or message.event) else None
    if not message.record_count:
        return None
    return encoded(records_of(buffer)).SerializeToString()


def parse_message(blob: bytes, where: str) -> taskmanager_pb2.DataMessage:
    """One persisted buffer back as a ``DataMessage``; SerializationError if it is not one."""
    message = taskmanager_pb2.DataMessage()
    try:
        message.ParseFromString(blob)
    except Exception as exc:  # protobuf's DecodeError
        raise SerializationError(f"in-flight buffer {where} is not a DataMessage: {exc}") from exc
    if message.event not in _PERSISTED_EVENTS or message.priority:
        raise SerializationError(f"in-flight buffer {where} carries a control event ({message.event})")
    return message


@dataclass(frozen=True)
class InflightState:
    """The in-flight buffers of one checkpoint at one task: ``channels`` by input channel, ``outputs``
    by output channel, each in its order."""

    checkpoint_id: CheckpointId
    channels: Mapping[ChannelIndex, tuple[bytes, ...]] = field(default_factory=dict)
    outputs: Mapping[OutputChannelKey, tuple[bytes, ...]] = field(default_factory=dict)
    origins: Mapping[ChannelIndex, InputOrigin] = field(default_factory=dict)  # of the input channels

    @property
    def size_bytes(self) -> int:
        return sum(len(b) for blobs in (*self.channels.values(), *self.outputs.values()) for b in blobs)

    @property
    def buffer_count(self) -> int:
        return sum(len(blobs) for blobs in (*self.channels.values(), *self.outputs.values()))

    def replay(self) -> Iterator[tuple[ChannelIndex, bytes]]:
        """The input part, as a restore feeds it to the chain before any new input: by channel, in order."""
        for channel in sorted(self.channels):
            for blob in self.channels[channel]:
                yield channel, blob

    def replay_outputs(self) -> Iterator[tuple[OutputChannelKey, bytes]]:
        """The output part, as a restore sends it before anything else: by channel, in order."""
        for key in sorted(self.outputs):
            for blob in self.outputs[key]:
                yield key, blob


class InflightCapture:
    """Collects one unaligned checkpoint's in-flight buffers at one task while its barriers arrive.
    Driven by the aligner's StartCapture / StopCapture / CaptureQueued and the task's reads, and by the
    snapshot's overtaken output buffers; :meth:`complete` once every channel stopped. Owned by the
    task thread."""

    __slots__ = ("_blobs", "_capturing", "_origins", "_outputs", "checkpoint_id")

    def __init__(self, checkpoint_id: CheckpointId, origins: Mapping[ChannelIndex, InputOrigin] | None = None) -> None:
        self.checkpoint_id = checkpoint_id
        self._origins = dict(origins or {})
        self._capturing: set[ChannelIndex] = set()
        self._blobs: dict[ChannelIndex, list[bytes]] = {}
        self._outputs: dict[OutputChannelKey, tuple[bytes, ...]] = {}

    @property
    def capturing(self) -> frozenset[ChannelIndex]:
        return frozenset(self._capturing)

    def is_capturing(self, channel: ChannelIndex) -> bool:
        return channel in self._capturing

    def start(self, channel: ChannelIndex) -> None:
        if channel in self._capturing:
            raise InflightCaptureError(f"checkpoint {self.checkpoint_id}: channel {channel} started capturing twice")
        self._capturing.add(channel)
        self._blobs.setdefault(channel, [])

    def stop(self, channel: ChannelIndex) -> None:
        if channel not in self._capturing:
            raise InflightCaptureError(
                f"checkpoint {self.checkpoint_id}: channel {channel} stopped capturing but was not capturing"
            )
        self._capturing.discard(channel)

    def add(self, channel: ChannelIndex, message: ChannelBuffer) -> None:
        """A buffer read from ``channel``; kept only while the channel captures."""
        if channel in self._capturing:
            blob = persistable(message)
            if blob is not None:
                self._blobs[channel].append(blob)

    def add_queued(self, channel: ChannelIndex, messages: Iterable[ChannelBuffer]) -> None:
        """The buffers ``channel`` queued ahead of its barrier, which overtook them: they follow what
        was captured from the channel before, whether or not it still captures."""
        if channel in self._capturing:
            raise InflightCaptureError(
                f"checkpoint {self.checkpoint_id}: channel {channel}'s queued buffers came while it still captures"
            )
        blobs = self._blobs.setdefault(channel, [])
        blobs.extend(blob for m in messages if (blob := persistable(m)) is not None)

    def add_outputs(self, key: OutputChannelKey, messages: Iterable[ChannelBuffer]) -> None:
        """The buffers output channel ``key`` still queued when the barrier overtook them."""
        if key in self._outputs:
            raise InflightCaptureError(f"checkpoint {self.checkpoint_id}: output channel {key} captured twice")
        self._outputs[key] = tuple(blob for m in messages if (blob := persistable(m)) is not None)

    def complete(self) -> InflightState:
        if self._capturing:
            raise InflightCaptureError(
                f"checkpoint {self.checkpoint_id}: capture completed while channels "
                f"{sorted(self._capturing)} still capture"
            )
        channels = {channel: tuple(blobs) for channel, blobs in sorted(self._blobs.items()) if blobs}
        return InflightState(
            self.checkpoint_id,
            channels,
            {key: blobs for key, blobs in sorted(self._outputs.items()) if blobs},
            {c: self._origins[c] for c in channels if c in self._origins},
        )


def _b64(blobs: Iterable[bytes]) -> list[str]:
    return [base64.b64encode(b).decode("ascii") for b in blobs]


def encode_inflight(state: InflightState) -> bytes:
    return json.dumps(
        {
            "format": INFLIGHT_FORMAT,
            "checkpoint_id": state.checkpoint_id,
            "input": [_input_entry(state, c) for c in sorted(state.channels)],
            "output": [
                {"output": key[0], "channel": key[1], "buffers": _b64(state.outputs[key])}
                for key in sorted(state.outputs)
            ],
        },
        separators=(",", ":"),
    ).encode()


def _input_entry(state: InflightState, channel: ChannelIndex) -> dict[str, Any]:
    entry: dict[str, Any] = {"channel": channel}
    origin = state.origins.get(channel)
    if origin is not None:
        entry |= {"gate": origin.gate, "producer": origin.producer_vertex}
    return entry | {"buffers": _b64(state.channels[channel])}


def _buffers(entry: Any) -> tuple[bytes, ...]:
    return tuple(base64.b64decode(typed(b, str), validate=True) for b in typed(entry["buffers"], list))


def _from_record_blob(blob: bytes) -> bytes:
    """A format-1 buffer (a record blob) as a format-2 one (a DataMessage with those records)."""
    count = len(decode_records(blob)[0])
    return taskmanager_pb2.DataMessage(records=blob, record_count=count).SerializeToString()


def decode_inflight(data: bytes, where: str) -> InflightState:
    """The in-flight state in ``data``; ``where`` names it in errors (the checkpoint and the task)."""
    what = f"in-flight state {where}"
    document = load_versioned(data, what, _READABLE_FORMATS, "restore it with the Weir version that wrote it")
    found = document["format"]
    try:
        channels: dict[ChannelIndex, tuple[bytes, ...]] = {}
        outputs: dict[OutputChannelKey, tuple[bytes, ...]] = {}
        origins: dict[ChannelIndex, InputOrigin] = {}
        for entry in typed(document["channels" if found == 1 else "input"], list):
            channel = ChannelIndex(typed(entry["channel"], int))
            if channel in channels or channel < 0:
                raise ValueError(f"input channel {channel} is listed twice or negative")
            blobs = _buffers(entry)
            channels[channel] = tuple(_from_record_blob(b) for b in blobs) if found == 1 else blobs
            if "gate" in entry:
                origins[channel] = InputOrigin(typed(entry["gate"], int), typed(entry["producer"], str))
        for entry in typed(document.get("output", []), list):
            key = (typed(entry["output"], int), typed(entry["channel"], int))
            if key in outputs or min(key) < 0:
                raise ValueError(f"output channel {key} is listed twice or negative")
            outputs[key] = _buffers(entry)
        for blobs in (*channels.values(), *outputs.values()):
            for blob in blobs:
                parse_message(blob, where)
        return InflightState(CheckpointId(typed(document["checkpoint_id"], int)), channels, outputs, origins)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise SerializationError(f"{what} is malformed: {type(exc).__name__}: {exc}") from exc
