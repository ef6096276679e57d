"""Broadcast state stored once per checkpoint: content-addressed objects that subtasks with the same
copy share (docs/formats.md, "Broadcast state").

Every subtask of a broadcast process operator holds a copy of the same map state (written only from
the broadcast input). Flink checkpoints every subtask's copy (its ``OperatorStateHandle`` in
``BROADCAST`` mode) and on restore gives new subtask *i* one old copy (``i mod old parallelism``); the
checkpoint holds *p* copies. Weir keeps each subtask's own copy as its restore point, which stays
right in every mode, but stores a copy under the SHA-256 of its bytes: subtasks whose copies are
byte-equal (every subtask at an aligned checkpoint whose broadcast input has one channel) write the
same key, so the checkpoint holds one object, and each task-state document references it.

Why not one designated copy for all: at an unaligned checkpoint a barrier overtakes the broadcast
records queued before it, so subtask 0 may have applied a rule that is still in subtask 1's input
(its channel state, replayed to it alone after a restore). Each subtask's copy plus its own in-flight
records is the whole broadcast prefix before the barrier; another subtask's copy plus them applies a
rule twice or misses one. With content addresses such a checkpoint stores each distinct copy once
(at most *p*), and each subtask restores its own with its own replay.

The decisions are pure: :func:`place_operator_states` splits a task's operator states into its own
(inline, or packed into the task's object) and its broadcast ones (one content-addressed object
each, a key written once however many subtasks name it); :func:`inherited_copy` picks the old copy a
subtask restored at another parallelism takes (there the restore refuses in-flight records of a
broadcast edge, so every old copy it accepts is the whole prefix).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

from weir.core.errors import SerializationError

DIGEST_ALGORITHM: Final = "sha256"


@dataclass(frozen=True)
class BroadcastStateRef:
    """One operator's broadcast state as a content-addressed object: its key in checkpoint storage,
    its size and the SHA-256 (hex) of its bytes, which its key ends with."""

    operator_uid: str
    key: str
    size_bytes: int
    sha256: str


def content_digest(data: bytes) -> str:
    """The SHA-256 of ``data`` in hex: the content address of a broadcast state."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class StatePlacement:
    """Where a task's operator states go: ``own`` (inline or the task's object), ``broadcast`` (a
    reference each) and ``writes``, the content-addressed objects to write, by key (one per distinct
    copy; the same key from several subtasks holds the same bytes)."""

    own: Mapping[str, bytes]
    broadcast: Mapping[str, BroadcastStateRef] = field(default_factory=dict)
    writes: Mapping[str, bytes] = field(default_factory=dict)


def place_operator_states(
    states: Mapping[str, bytes],
    broadcast_uids: Collection[str],
    broadcast_key: Callable[[str, str], str],
) -> StatePlacement:
    """Split ``states`` (operator uid → bytes): the operators in ``broadcast_uids`` go to
    content-addressed objects, keyed ``broadcast_key(operator uid, digest)``; the others stay the
    task's own."""
    own: dict[str, bytes] = {}
    refs: dict[str, BroadcastStateRef] = {}
    writes: dict[str, bytes] = {}
    for uid, data in states.items():
        if uid not in broadcast_uids:
            own[uid] = data
            continue
        digest = content_digest(data)
        key = broadcast_key(uid, digest)
        refs[uid] = BroadcastStateRef(uid, key, len(data), digest)
        writes[key] = data
    return StatePlacement(own, refs, writes)


def check_broadcast_state(ref: BroadcastStateRef, data: bytes) -> bytes:
    """``data`` if it is the object ``ref`` names (its size and digest); else a SerializationError."""
    if len(data) != ref.size_bytes or content_digest(data) != ref.sha256:
        raise SerializationError(
            f"broadcast state object {ref.key} of operator {ref.operator_uid!r} does not hold the content its "
            f"handle names ({len(data)} bytes, {ref.size_bytes} expected, or another SHA-256): the object was "
            "replaced or truncated; restore from another checkpoint"
        )
    return data


def inherited_copy(subtask: int, old_parallelism: int) -> int:
    """The old subtask whose copy new subtask ``subtask`` takes at a restore at another parallelism or
    into another job: ``subtask mod old_parallelism``, Flink's round robin (an old subtask that wrote
    no copy held an empty map, and so does the new one)."""
    if old_parallelism < 1 or subtask < 0:
        raise ValueError(f"subtask {subtask} of an old parallelism {old_parallelism}: both must be valid")
    return subtask % old_parallelism
