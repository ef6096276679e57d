"""The task-state document: what one subtask acknowledges for one checkpoint, as versioned JSON.

The TaskManager encodes it into ``AcknowledgeCheckpointRequest.state_handle``; the JobManager keeps
it as opaque bytes in the checkpoint's metadata and hands it back in
``DeployTaskRequest.restore_state_handle``. It is small: each operator's own state (its
``snapshot_state`` bytes, stored as they are) is inline only while the task's total stays below
``INLINE_STATE_LIMIT_BYTES``; above it the bytes are one object in checkpoint storage
(``CheckpointPaths.task_state``) and the document holds its key, size and each operator's slice.
Both processes read it through this module (the JobManager to find a sink's state when it resolves
an ended job's transactions, and to hand a restore at another parallelism the documents of the old
subtasks), so neither imports the other. A broadcast operator's state is never inline nor in the
task's object: it is a content-addressed object that the subtasks holding the same copy share (the
checkpoint stores it once), named in ``operator_state.broadcast``. Formats 2 and 3
(``docs/formats.md``)::

    {"format": 2,
     "task": {"job_id", "vertex_uid", "subtask", "attempt"},
     "layout": {"parallelism": int, "max_parallelism": int,
                "operator_uids": [str, ...],               # the chain's operators, head first
                "keyed_operator_uids": [str, ...],         # those of them with keyed state
                "state_schemas": {"<keyed operator uid>": [{"name", "serializer", "version"}]}},
     "checkpoint_id": int,
     "key_group_range": [start, end],                       # both inclusive
     "operator_state": {"inline": {"<operator uid>": "<base64>"}}
                     | {"object": {"key", "size_bytes",
                                   "slices": [{"operator_uid", "offset", "length"}]}},
                       # format 3 only, beside either: broadcast states, one content-addressed object each
                       + {"broadcast": {"<operator uid>": {"key", "size_bytes", "sha256"}}},
     "keyed_state": null | {...}}     # the RocksDB snapshot handle, weir.taskmanager.snapshots' own format

Format 3 is format 2 with the optional ``operator_state.broadcast`` (``weir.core.broadcast_state``):
it is written only by a task with broadcast state, so a document without it stays format 2, which an
older Weir reads; this one reads both.

``layout.state_schemas`` (optional: absent, every state is version 1 of ``pickle``) records the schema
each keyed operator declared for each of its states (``weir.core.state_schema``), so that a restore
can tell whether the job reads it as it is, migrates it, or must refuse it.

Format 1 named keyed state by ``<job id>/<operator uid>`` inside RocksDB; format 2 by the operator uid
alone, so that state moves between jobs. A format-1 document is refused with a clear error.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar, assert_never

from weir.core.broadcast_state import BroadcastStateRef, check_broadcast_state
from weir.core.documents import load_versioned, typed
from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, KeyGroup
from weir.core.keygroups import KeyGroupRange
from weir.core.state_schema import StoredSchema

TASK_STATE_FORMAT: Final = 3
"""The format a document with broadcast state is written in; one without is written as format 2."""
TASK_STATE_FORMAT_WITHOUT_BROADCAST: Final = 2
INFLIGHT_STATE_NAME: Final = "__inflight__"
"""The reserved operator-state name under which a task stores the in-flight records of an unaligned
checkpoint (``weir.taskmanager.inflight``); no operator is restored from it. A restore into another job
or at another parallelism redistributes it (the records go where their keys now live) only into the
same operator chain, and never the data of a broadcast edge (:data:`INFLIGHT_REDISTRIBUTION_REFUSED`)."""
INFLIGHT_REDISTRIBUTION_REFUSED: Final = (
    "unaligned in-flight state is restored only into the same operator chain (its channels and outputs), and "
    "not across a broadcast edge at another parallelism: take a savepoint (always aligned) and restore from it"
)
INLINE_STATE_LIMIT_BYTES: Final = 20 * 1024
"""A task's operator state below this many bytes stays in the acknowledgement (Flink's threshold)."""


@dataclass(frozen=True)
class InlineOperatorState:
    """Each operator's state bytes by operator uid, carried in the document itself; ``broadcast``: the
    broadcast operators' states, each a content-addressed object (``weir.core.broadcast_state``)."""

    states: Mapping[str, bytes]
    broadcast: Mapping[str, BroadcastStateRef] = field(default_factory=dict, hash=False)

    @property
    def size_bytes(self) -> int:
        return sum(len(b) for b in self.states.values())


@dataclass(frozen=True)
class OperatorStateSlice:
    """Where one operator's state lies in the task's state object."""

    operator_uid: str
    offset: int
    length: int


@dataclass(frozen=True)
class StoredOperatorState:
    """The task's operator states as one object in checkpoint storage: its key, size and slices;
    ``broadcast`` as :class:`InlineOperatorState`'s."""

    key: str
    size_bytes: int
    slices: tuple[OperatorStateSlice, ...]
    broadcast: Mapping[str, BroadcastStateRef] = field(default_factory=dict, hash=False)


OperatorStateHandle = InlineOperatorState | StoredOperatorState


@dataclass(frozen=True)
class SubtaskLayout:
    """Where a subtask sat in its job when it took the snapshot: what a restore at another parallelism
    or into another job needs to know of it besides its state."""

    parallelism: int
    max_parallelism: int
    key_group_range: KeyGroupRange
    operator_uids: tuple[str, ...]
    keyed_operator_uids: tuple[str, ...]
    state_schemas: Mapping[str, tuple[StoredSchema, ...]] = field(default_factory=dict, hash=False)
    """The declared schema of each state of each keyed operator, by operator uid; a state (or an
    operator) it does not name is version 1 pickle."""


@dataclass(frozen=True)
class TaskStateDocument:
    """One subtask's state in one checkpoint. ``keyed_state`` is the JSON object of its RocksDB
    snapshot handle, encoded and decoded by the TaskManager (None: the chain has no keyed operator)."""

    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    checkpoint_id: CheckpointId
    layout: SubtaskLayout
    operator_state: OperatorStateHandle
    keyed_state: Mapping[str, Any] | None = None

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self.layout.key_group_range

    @property
    def format(self) -> int:
        """The format the document is written in: 3 when it names broadcast state, else 2."""
        return TASK_STATE_FORMAT if self.operator_state.broadcast else TASK_STATE_FORMAT_WITHOUT_BROADCAST

    @property
    def operator_state_uids(self) -> tuple[str, ...]:
        """The operators with operator state in this document."""
        match self.operator_state:
            case InlineOperatorState(states=states):
                own = tuple(sorted(states))
            case StoredOperatorState(slices=slices):
                own = tuple(s.operator_uid for s in slices)
        return own + tuple(sorted(self.operator_state.broadcast))


def pack_operator_states(
    states: Mapping[str, bytes], key: str, broadcast: Mapping[str, BroadcastStateRef] | None = None
) -> tuple[StoredOperatorState, bytes]:
    """The handle of ``states`` written as one object under ``key`` (beside the ``broadcast`` ones), and
    the object's bytes."""
    slices: list[OperatorStateSlice] = []
    offset = 0
    for uid in sorted(states):
        slices.append(OperatorStateSlice(uid, offset, len(states[uid])))
        offset += len(states[uid])
    blob = b"".join(states[uid] for uid in sorted(states))
    return StoredOperatorState(key, len(blob), tuple(slices), dict(broadcast or {})), blob


def relative_operator_state(handle: OperatorStateHandle, folder: str) -> OperatorStateHandle:
    """The handle with its objects' keys relative to ``folder`` (a savepoint's)."""

    def relative(key: str) -> str:
        if not key.startswith(folder):
            raise SerializationError(f"{key} lies outside the savepoint folder {folder}")
        return key[len(folder) :]

    broadcast = {uid: replace(ref, key=relative(ref.key)) for uid, ref in handle.broadcast.items()}
    match handle:
        case InlineOperatorState():
            return replace(handle, broadcast=broadcast)
        case StoredOperatorState(key=key):
            return replace(handle, key=relative(key), broadcast=broadcast)
        case _:
            assert_never(handle)


def read_operator_states(handle: OperatorStateHandle, get_bytes: Callable[[str], bytes]) -> dict[str, bytes]:
    """Each operator's state bytes, read from checkpoint storage through ``get_bytes`` when stored
    (a broadcast state's object checked against its size and digest)."""
    states: dict[str, bytes]
    match handle:
        case InlineOperatorState():
            states = dict(handle.states)
        case StoredOperatorState(key=key, size_bytes=size, slices=slices):
            blob = get_bytes(key)
            if len(blob) != size:
                raise SerializationError(
                    f"operator state object {key} is {len(blob)} bytes, its handle says {size}: "
                    "the object was replaced or truncated; restore from another checkpoint"
                )
            states = {s.operator_uid: blob[s.offset : s.offset + s.length] for s in slices}
        case _:
            assert_never(handle)
    for uid, ref in handle.broadcast.items():
        states[uid] = check_broadcast_state(ref, get_bytes(ref.key))
    return states


def encode_task_state(document: TaskStateDocument) -> bytes:
    operator_state: dict[str, Any]
    match document.operator_state:
        case InlineOperatorState(states=states):
            operator_state = {"inline": {uid: base64.b64encode(states[uid]).decode("ascii") for uid in sorted(states)}}
        case StoredOperatorState(key=key, size_bytes=size, slices=slices):
            operator_state = {
                "object": {
                    "key": key,
                    "size_bytes": size,
                    "slices": [
                        {"operator_uid": s.operator_uid, "offset": s.offset, "length": s.length} for s in slices
                    ],
                }
            }
    if document.operator_state.broadcast:
        operator_state["broadcast"] = {
            uid: {"key": ref.key, "size_bytes": ref.size_bytes, "sha256": ref.sha256}
            for uid, ref in sorted(document.operator_state.broadcast.items())
        }
    layout = document.layout
    kg = layout.key_group_range
    return json.dumps(
        {
            "format": document.format,
            "task": {
                "job_id": document.job_id,
                "vertex_uid": document.vertex_uid,
                "subtask": document.subtask,
                "attempt": document.attempt,
            },
            "layout": {
                "parallelism": layout.parallelism,
                "max_parallelism": layout.max_parallelism,
                "operator_uids": list(layout.operator_uids),
                "keyed_operator_uids": list(layout.keyed_operator_uids),
                "state_schemas": {
                    uid: [{"name": s.name, "serializer": s.serializer, "version": s.version} for s in schemas]
                    for uid, schemas in sorted(layout.state_schemas.items())
                },
            },
            "checkpoint_id": document.checkpoint_id,
            "key_group_range": [kg.start, kg.end],
            "operator_state": operator_state,
            "keyed_state": document.keyed_state,
        },
        separators=(",", ":"),
    ).encode()


def decode_task_state(data: bytes, where: str) -> TaskStateDocument:
    """The document in ``data``; ``where`` names it in errors (e.g. the metadata key and the task)."""
    document = load_versioned(
        data,
        f"task state {where}",
        (TASK_STATE_FORMAT_WITHOUT_BROADCAST, TASK_STATE_FORMAT),
        "restore it with the Weir version that wrote it",
    )
    try:
        task = document["task"]
        layout = document["layout"]
        start, end = document["key_group_range"]
        keyed = document["keyed_state"]
        if keyed is not None and not isinstance(keyed, dict):
            raise TypeError("keyed_state must be an object or null")
        return TaskStateDocument(
            job_id=typed(task["job_id"], str),
            vertex_uid=typed(task["vertex_uid"], str),
            subtask=typed(task["subtask"], int),
            attempt=typed(task["attempt"], int),
            checkpoint_id=CheckpointId(typed(document["checkpoint_id"], int)),
            layout=SubtaskLayout(
                parallelism=typed(layout["parallelism"], int),
                max_parallelism=typed(layout["max_parallelism"], int),
                key_group_range=KeyGroupRange(KeyGroup(typed(start, int)), KeyGroup(typed(end, int))),
                operator_uids=tuple(typed(uid, str) for uid in typed(layout["operator_uids"], list)),
                keyed_operator_uids=tuple(typed(uid, str) for uid in typed(layout["keyed_operator_uids"], list)),
                state_schemas=_state_schemas(layout.get("state_schemas", {})),
            ),
            operator_state=_operator_state(
                document["operator_state"], broadcast_allowed=document["format"] == TASK_STATE_FORMAT
            ),
            keyed_state=keyed,
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise SerializationError(f"task state {where} is malformed: {type(exc).__name__}: {exc}") from exc


def _state_schemas(value: Any) -> dict[str, tuple[StoredSchema, ...]]:
    return {
        typed(uid, str): tuple(
            StoredSchema(typed(s["name"], str), typed(s["serializer"], str), typed(s["version"], int))
            for s in typed(schemas, list)
        )
        for uid, schemas in typed(value, dict).items()
    }


def _broadcast_refs(value: Any) -> dict[str, BroadcastStateRef]:
    refs: dict[str, BroadcastStateRef] = {}
    for uid, ref in typed(value, dict).items():
        refs[typed(uid, str)] = BroadcastStateRef(
            uid, typed(ref["key"], str), typed(ref["size_bytes"], int), typed(ref["sha256"], str)
        )
    return refs


def _operator_state(value: Any, *, broadcast_allowed: bool) -> OperatorStateHandle:
    if not isinstance(value, dict):
        raise TypeError("operator_state must be an object")
    if "broadcast" in value and not broadcast_allowed:
        raise ValueError("operator_state.broadcast is written in format 3 only")
    broadcast = _broadcast_refs(value.get("broadcast", {}))
    own = {k: v for k, v in value.items() if k != "broadcast"}
    if len(own) != 1:
        raise ValueError("operator_state must hold exactly one of 'inline' and 'object'")
    if "inline" in own:
        inline = own["inline"]
        if not isinstance(inline, dict):
            raise TypeError("operator_state.inline must be an object")
        return InlineOperatorState(
            {typed(uid, str): base64.b64decode(typed(b64, str), validate=True) for uid, b64 in inline.items()},
            broadcast,
        )
    stored = own["object"]
    handle = StoredOperatorState(
        key=typed(stored["key"], str),
        size_bytes=typed(stored["size_bytes"], int),
        slices=tuple(
            OperatorStateSlice(typed(s["operator_uid"], str), typed(s["offset"], int), typed(s["length"], int))
            for s in stored["slices"]
        ),
        broadcast=broadcast,
    )
    for s in handle.slices:
        if s.offset < 0 or s.length < 0 or s.offset + s.length > handle.size_bytes:
            raise ValueError(
                f"slice of {s.operator_uid} ({s.offset}+{s.length}) lies outside the {handle.size_bytes}-byte object"
            )
    return handle


_T = TypeVar("_T")
