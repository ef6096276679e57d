"""The in-flight data of an unaligned checkpoint: captured while it runs, persisted with it, replayed
on restore. Pure: no I/O, no clock.

In unaligned mode (FLIP-76) a checkpoint's barrier is a priority event: the producing task sends it
ahead of the buffers its output channels still queue, and the consuming task takes it ahead of the
buffers its input channel queues (``weir.taskmanager.network``). So the barrier overtakes data that was
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

The task keeps them in an :class:`InflightState`, stored as the versioned document of
``weir.core.inflight_state`` (which the JobManager reads too): input buffers by channel with the edge
each channel belongs to, output buffers by channel with the edge each output is, named as the plan
names it (:class:`OutputTarget`), so that a restore into another job or at another parallelism
routes every record to the operator it was on its way to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from weir.core import inflight_state
from weir.core.errors import ProtocolError, SerializationError
from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.inflight_state import (
    INFLIGHT_FORMAT,
    PERSISTED_EVENTS,
    InflightState,
    InputOrigin,
    OutputChannelKey,
    OutputTarget,
    encode_inflight,
    parse_message,
)
from weir.core.task_state import INFLIGHT_STATE_NAME
from weir.taskmanager.network.codec import ChannelBuffer, decode_records, encoded, message_of, records_of

__all__ = [
    "INFLIGHT_FORMAT",
    "INFLIGHT_STATE_NAME",
    "InflightCapture",
    "InflightCaptureError",
    "InflightState",
    "InputOrigin",
    "OutputChannelKey",
    "OutputTarget",
    "decode_inflight",
    "encode_inflight",
    "parse_message",
    "persistable",
]


class InflightCaptureError(SerializationError):
    """In-flight data was captured or completed against the capture protocol (a runtime bug)."""


def persistable(buffer: ChannelBuffer) -> bytes | None:
    """What of ``buffer`` an unaligned checkpoint keeps, serialized (a local buffer's records encoded
    now): its records and a watermark event, not a barrier, cancellation marker or end of stream (a
    checkpoint restored replays no control events). None when nothing is left."""
    message = message_of(buffer)
    if message.event in PERSISTED_EVENTS:
        return encoded(buffer).SerializeToString() if (message.record_count or message.event) else None
    if not message.record_count:
        return None
    return encoded(records_of(buffer)).SerializeToString()


class InflightCapture:
    """Collects one unaligned checkpoint's in-flight buffers at one task while its barriers arrive.
    Driven by the aligner's StartCapture / StopCapture / CaptureQueued and the task's reads, and by the
    snapshot's overtaken output buffers; :meth:`complete` once every channel stopped. Owned by the
    task thread. ``origins`` names the edge of each input channel, ``targets`` the edge of each output
    (by output index): the document keeps them with the buffers."""

    __slots__ = ("_blobs", "_capturing", "_origins", "_outputs", "_targets", "checkpoint_id")

    def __init__(
        self,
        checkpoint_id: CheckpointId,
        origins: Mapping[ChannelIndex, InputOrigin] | None = None,
        targets: Mapping[int, OutputTarget] | None = None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self._origins = dict(origins or {})
        self._targets = dict(targets or {})
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
        if key[0] not in self._targets:
            raise InflightCaptureError(
                f"checkpoint {self.checkpoint_id}: output channel {key} captured, but output {key[0]} names no edge"
            )
        self._outputs[key] = tuple(blob for m in messages if (blob := persistable(m)) is not None)

    def complete(self) -> InflightState:
        if self._capturing:
            raise InflightCaptureError(
                f"checkpoint {self.checkpoint_id}: capture completed while channels "
                f"{sorted(self._capturing)} still capture"
            )
        channels = {channel: tuple(blobs) for channel, blobs in sorted(self._blobs.items()) if blobs}
        outputs = {key: blobs for key, blobs in sorted(self._outputs.items()) if blobs}
        return InflightState(
            self.checkpoint_id,
            channels,
            outputs,
            {c: self._origins[c] for c in channels if c in self._origins},
            {edge: self._targets[edge] for edge in sorted({edge for edge, _ in outputs})},
        )


def _record_count(blob: bytes) -> int:
    """The records in a format-1 buffer (a record blob); ProtocolError for a blob of another shape."""
    return len(decode_records(blob)[0])


def decode_inflight(data: bytes, where: str) -> InflightState:
    """The in-flight state in ``data`` (``weir.core.inflight_state``); ``where`` names it in errors (the
    checkpoint and the task)."""
    try:
        return inflight_state.decode_inflight(data, where, _record_count)
    except ProtocolError as exc:  # a format-1 buffer that is no record blob
        raise SerializationError(f"in-flight state {where} is malformed: {exc}") from exc
