"""The document of an unaligned checkpoint's in-flight buffers at one task, stored under the reserved
operator-state name ``__inflight__`` (:data:`weir.core.task_state.INFLIGHT_STATE_NAME`). Pure: no I/O.

Both processes read it through this module: the TaskManager replays it on restore
(``weir.taskmanager.inflight`` captures the buffers, ``weir.taskmanager.restorer`` replays them); the JobManager
checks, before a new job starts from another job's retained checkpoint, that every consumer its
output buffers were queued for is still connected (``weir.core.rescale``), as Flink's
``StateAssignmentOperation`` checks the state of every operator before a restore.

Format 3 (``docs/formats.md``)::

    {"format": 3, "checkpoint_id": int,
     "input":  [{"channel": int, "gate": int, "producer": str,                          # by channel
                 "buffers": ["<base64 DataMessage>", ...]}, ...],
     "output": [{"output": int, "channel": int,                                        # by channel
                 "consumer": str, "input": int, "operator": str, "side_output": str | null,
                 "buffers": ["<base64 DataMessage>", ...]}, ...]}

An input entry's ``gate`` and ``producer`` name the network edge the channel belongs to
(:class:`InputOrigin`); an output entry's ``consumer``, ``input``, ``operator`` and ``side_output``
name the network edge its buffers were queued on, as the plan names it from the producer's side
(:class:`OutputTarget`). ``output`` (the edge's index among the task's outputs) and ``channel`` only
place the buffers in the plan that wrote them: a restore routes output buffers by their target, so a
new job that connects its chain to another consumer, before or after the old ones, still sends each
record to the consumer it was queued for.

Format 2 (output entries ``{"output", "channel", "buffers"}``: by output index only) is still read:
its output buffers can be routed only where the index still means the same edge, the same job's
plan (a restore after a failover), or a task with a single output; elsewhere the restore is refused.
Format 1 (input record blobs only, ``"channels": [{"channel", "buffers"}]``) is still read.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from weir.core.documents import load_versioned, typed
from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex, CheckpointId
from weir.wire import taskmanager_pb2

__all__ = [
    "INFLIGHT_FORMAT",
    "PERSISTED_EVENTS",
    "InflightState",
    "InputOrigin",
    "OutputChannelKey",
    "OutputTarget",
    "decode_inflight",
    "encode_inflight",
    "parse_message",
    "queued_output_targets",
]

INFLIGHT_FORMAT: Final = 3
_READABLE_FORMATS: Final = (1, 2, 3)
_REMEDY: Final = "restore it with the Weir version that wrote it"

_Event = taskmanager_pb2.EventKind
PERSISTED_EVENTS: Final = frozenset(
    {
        _Event.EVENT_KIND_UNSPECIFIED,
        _Event.EVENT_KIND_WATERMARK,
        _Event.EVENT_KIND_WATERMARK_IDLE,
        _Event.EVENT_KIND_WATERMARK_ACTIVE,
    }
)
"""The events a persisted buffer may carry besides its records (never a barrier or end of stream)."""

OutputChannelKey = tuple[int, int]
"""(output edge index, channel index) of a task's output channel."""


@dataclass(frozen=True)
class InputOrigin:
    """Where an input channel's records come from: the head's input (gate) and the producing vertex,
    which name the network edge in the job plan."""

    gate: int
    producer_vertex: str


@dataclass(frozen=True)
class OutputTarget:
    """The network edge an output channel belongs to, named as the job plan names it from the producer's
    side (``weir.plan.NetworkEdge.target``): the consumer vertex, the input of its head the edge feeds,
    the operator of the producing chain that emits into it, and the side output it carries (None: the
    operator's main output). Unlike an output's index, it means the same edge in another job."""

    consumer: str
    input: int
    operator: str
    side_output: str | None = None

    def __str__(self) -> str:
        side = f" (side output {self.side_output!r})" if self.side_output is not None else ""
        return f"{self.operator}{side} -> {self.consumer} input {self.input}"


def parse_message(blob: bytes, where: str) -> taskmanager_pb2.DataMessage:
    """One persisted buffer back as a ``DataMessage``; SerializationError if it is not one."""
    message = taskmanager_pb2.DataMessage()
    try:
        message.ParseFromString(blob)
    except Exception as exc:  # protobuf's DecodeError
        raise SerializationError(f"in-flight buffer {where} is not a DataMessage: {exc}") from exc
    if message.event not in PERSISTED_EVENTS or message.priority:
        raise SerializationError(f"in-flight buffer {where} carries a control event ({message.event})")
    return message


@dataclass(frozen=True)
class InflightState:
    """The in-flight buffers of one checkpoint at one task: ``channels`` by input channel, ``outputs``
    by output channel, each in its order; ``origins`` names the edge of each input channel, ``targets``
    the edge of each output (by output index). A state decoded from format 2 has no ``targets``."""

    checkpoint_id: CheckpointId
    channels: Mapping[ChannelIndex, tuple[bytes, ...]] = field(default_factory=dict)
    outputs: Mapping[OutputChannelKey, tuple[bytes, ...]] = field(default_factory=dict)
    origins: Mapping[ChannelIndex, InputOrigin] = field(default_factory=dict)  # of the input channels
    targets: Mapping[int, OutputTarget] = field(default_factory=dict)  # of the output edges, by index

    @property
    def size_bytes(self) -> int:
        return sum(len(b) for blobs in (*self.channels.values(), *self.outputs.values()) for b in blobs)

    @property
    def buffer_count(self) -> int:
        return sum(len(blobs) for blobs in (*self.channels.values(), *self.outputs.values()))

    @property
    def targets_named(self) -> bool:
        """Whether every output buffer says which edge it was queued on (format 3), so that a restore
        can route it into another plan."""
        return all(edge in self.targets for edge, _ in self.outputs)

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


def _b64(blobs: Iterable[bytes]) -> list[str]:
    return [base64.b64encode(b).decode("ascii") for b in blobs]


def encode_inflight(state: InflightState) -> bytes:
    """The document of ``state`` in the current format. Raises SerializationError for output buffers
    whose target is not known (a state read from format 2 is never written again)."""
    unnamed = sorted({edge for edge, _ in state.outputs} - set(state.targets))
    if unnamed:
        raise SerializationError(
            f"the in-flight state of checkpoint {state.checkpoint_id} has buffers of output(s) {unnamed} "
            "without the edge they were queued on"
        )
    return json.dumps(
        {
            "format": INFLIGHT_FORMAT,
            "checkpoint_id": state.checkpoint_id,
            "input": [_input_entry(state, c) for c in sorted(state.channels)],
            "output": [_output_entry(state, key) for key in sorted(state.outputs)],
        },
        separators=(",", ":"),
    ).encode()


def _input_entry(state: InflightState, channel: ChannelIndex) -> dict[str, Any]:
    entry: dict[str, Any] = {"channel": channel}
    origin = state.origins.get(channel)
    if origin is not None:
        entry |= {"gate": origin.gate, "producer": origin.producer_vertex}
    return entry | {"buffers": _b64(state.channels[channel])}


def _output_entry(state: InflightState, key: OutputChannelKey) -> dict[str, Any]:
    target = state.targets[key[0]]
    return {
        "output": key[0],
        "channel": key[1],
        "consumer": target.consumer,
        "input": target.input,
        "operator": target.operator,
        "side_output": target.side_output,
        "buffers": _b64(state.outputs[key]),
    }


def _buffers(entry: Any) -> tuple[bytes, ...]:
    return tuple(base64.b64decode(typed(b, str), validate=True) for b in typed(entry["buffers"], list))


def _load(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    document = load_versioned(data, f"in-flight state {where}", _READABLE_FORMATS, _REMEDY)
    return document, document["format"]


def _output_entries(
    document: dict[str, Any], found: int
) -> Iterator[tuple[OutputChannelKey, OutputTarget | None, Any]]:
    """Each output entry with its channel and, from format 3 on, its target (checked: one per edge)."""
    keys: set[OutputChannelKey] = set()
    targets: dict[int, OutputTarget] = {}
    for entry in typed(document.get("output", []), list):
        key = (typed(entry["output"], int), typed(entry["channel"], int))
        if key in keys or min(key) < 0:
            raise ValueError(f"output channel {key} is listed twice or negative")
        keys.add(key)
        if found < 3:
            yield key, None, entry
            continue
        side_output = entry["side_output"]
        target = OutputTarget(
            typed(entry["consumer"], str),
            typed(entry["input"], int),
            typed(entry["operator"], str),
            typed(side_output, str) if side_output is not None else None,
        )
        if targets.setdefault(key[0], target) != target:
            raise ValueError(f"output {key[0]} names two edges: {targets[key[0]]} and {target}")
        yield key, target, entry


def decode_inflight(data: bytes, where: str, count_records: Callable[[bytes], int]) -> InflightState:
    """The in-flight state in ``data``; ``where`` names it in errors (the checkpoint and the task).
    ``count_records`` counts the records of a format-1 buffer (a record blob, which it turns into a
    ``DataMessage``); it raises for a blob of another shape."""
    what = f"in-flight state {where}"
    document, found = _load(data, where)
    try:
        channels: dict[ChannelIndex, tuple[bytes, ...]] = {}
        outputs: dict[OutputChannelKey, tuple[bytes, ...]] = {}
        origins: dict[ChannelIndex, InputOrigin] = {}
        targets: dict[int, OutputTarget] = {}
        for entry in typed(document["channels" if found == 1 else "input"], list):
            channel = ChannelIndex(typed(entry["channel"], int))
            if channel in channels or channel < 0:
                raise ValueError(f"input channel {channel} is listed twice or negative")
            blobs = _buffers(entry)
            channels[channel] = (
                tuple(
                    taskmanager_pb2.DataMessage(records=b, record_count=count_records(b)).SerializeToString()
                    for b in blobs
                )
                if found == 1
                else blobs
            )
            if "gate" in entry:
                origins[channel] = InputOrigin(typed(entry["gate"], int), typed(entry["producer"], str))
        for key, target, entry in _output_entries(document, found):
            outputs[key] = _buffers(entry)
            if target is not None:
                targets[key[0]] = target
        for blobs in (*channels.values(), *outputs.values()):
            for blob in blobs:
                parse_message(blob, where)
        return InflightState(CheckpointId(typed(document["checkpoint_id"], int)), channels, outputs, origins, targets)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise SerializationError(f"{what} is malformed: {type(exc).__name__}: {exc}") from exc


def queued_output_targets(data: bytes, where: str) -> dict[int, OutputTarget | None]:
    """The output edges (by index in the plan that wrote it) the document holds buffers for, each with
    the edge it names (None: written before format 3, which named none). Reads no buffer."""
    document, found = _load(data, where)
    try:
        return {
            key[0]: target for key, target, entry in _output_entries(document, found) if typed(entry["buffers"], list)
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise SerializationError(f"in-flight state {where} is malformed: {type(exc).__name__}: {exc}") from exc
