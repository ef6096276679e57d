"""The in-flight records of an unaligned checkpoint: captured while it runs, persisted with it, replayed
on restore. Pure: no I/O, no clock.

In unaligned mode (``taskmanager.barrier_aligner``) a task snapshots on the first barrier of a
checkpoint; the records it then reads on each other channel until that channel's barrier arrives
were sent before the barrier upstream, so they belong to the checkpoint. The task processes them as
usual and also appends them, as the received buffers' record blobs (``network.encode_records``), to
an :class:`InflightCapture`. Once every channel delivered its barrier (or ended), the capture becomes
an :class:`InflightState`, stored among the task's operator states under :data:`INFLIGHT_STATE_NAME`.
A restore runs the snapshot's state, then :meth:`InflightState.replay` (channel by channel, each in
arrival order) into the chain, before any new input: every record then affects the state once.

The stored document, format 1 (``docs/formats.md``)::

    {"format": 1, "checkpoint_id": int,
     "channels": [{"channel": int, "buffers": ["<base64 record blob>", ...]}, ...]}   # by channel
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from weir.core.documents import load_versioned, typed
from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.task_state import INFLIGHT_STATE_NAME

__all__ = [
    "INFLIGHT_FORMAT",
    "INFLIGHT_STATE_NAME",
    "InflightCapture",
    "InflightCaptureError",
    "InflightState",
    "decode_inflight",
    "encode_inflight",
]

INFLIGHT_FORMAT: Final = 1


class InflightCaptureError(SerializationError):
    """In-flight records were captured or completed against the capture protocol (a runtime bug)."""


@dataclass(frozen=True)
class InflightState:
    """The in-flight record blobs of one checkpoint, by input channel, each channel's in arrival order."""

    checkpoint_id: CheckpointId
    channels: Mapping[ChannelIndex, tuple[bytes, ...]] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(len(blob) for blobs in self.channels.values() for blob in blobs)

    @property
    def buffer_count(self) -> int:
        return sum(len(blobs) for blobs in self.channels.values())

    def replay(self) -> Iterator[tuple[ChannelIndex, bytes]]:
        """What a restore feeds the chain before any new input: channel by channel, in order."""
        for channel in sorted(self.channels):
            for blob in self.channels[channel]:
                yield channel, blob


class InflightCapture:
    """Collects one unaligned checkpoint's in-flight record blobs while its barriers arrive. Driven by
    the aligner's StartCapture / StopCapture and the task's reads; :meth:`complete` once every
    channel stopped. Owned by the task thread."""

    __slots__ = ("_blobs", "_capturing", "checkpoint_id")

    def __init__(self, checkpoint_id: CheckpointId) -> None:
        self.checkpoint_id = checkpoint_id
        self._capturing: set[ChannelIndex] = set()
        self._blobs: dict[ChannelIndex, list[bytes]] = {}

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

    def add(self, channel: ChannelIndex, blob: bytes) -> None:
        """A record blob read from ``channel``; kept only while the channel captures."""
        if blob and channel in self._capturing:
            self._blobs[channel].append(blob)

    def complete(self) -> InflightState:
        if self._capturing:
            raise InflightCaptureError(
                f"checkpoint {self.checkpoint_id}: capture completed while channels "
                f"{sorted(self._capturing)} still capture"
            )
        return InflightState(
            self.checkpoint_id, {channel: tuple(blobs) for channel, blobs in sorted(self._blobs.items()) if blobs}
        )


def encode_inflight(state: InflightState) -> bytes:
    return json.dumps(
        {
            "format": INFLIGHT_FORMAT,
            "checkpoint_id": state.checkpoint_id,
            "channels": [
                {"channel": channel, "buffers": [base64.b64encode(b).decode("ascii") for b in state.channels[channel]]}
                for channel in sorted(state.channels)
            ],
        },
        separators=(",", ":"),
    ).encode()


def decode_inflight(data: bytes, where: str) -> InflightState:
    """The in-flight state in ``data``; ``where`` names it in errors (the checkpoint and the task)."""
    document = load_versioned(
        data, f"in-flight state {where}", INFLIGHT_FORMAT, "restore it with the Weir version that wrote it"
    )
    try:
        channels: dict[ChannelIndex, tuple[bytes, ...]] = {}
        for entry in typed(document["channels"], list):
            channel = ChannelIndex(typed(entry["channel"], int))
            if channel in channels or channel < 0:
                raise ValueError(f"channel {channel} is listed twice or negative")
            channels[channel] = tuple(
                base64.b64decode(typed(b, str), validate=True) for b in typed(entry["buffers"], list)
            )
        return InflightState(CheckpointId(typed(document["checkpoint_id"], int)), channels)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise SerializationError(f"in-flight state {where} is malformed: {type(exc).__name__}: {exc}") from exc
