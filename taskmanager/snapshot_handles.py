"""The keyed state handle of one subtask's RocksDB snapshot, and its JSON form in a task-state document.

A handle names the uploaded files of one local RocksDB checkpoint (its SSTs, shared between
checkpoints, and its private MANIFEST, CURRENT, OPTIONS and WAL) and the ``(operator uid, key group
range)`` pairs of the subtask whose state it holds, as Flink's ``IncrementalRemoteKeyedStateHandle``
names its shared and private state with its ``KeyGroupRange``. The JSON form is a durable format
(``docs/formats.md``, "Task state").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.ids import CheckpointId, KeyGroup, OperatorUid, TaskManagerId
from weir.core.keygroups import KeyGroupRange

KeyRanges = Sequence[tuple[OperatorUid, KeyGroupRange]]


class SnapshotError(WeirError):
    """A local RocksDB snapshot or restore failed (disk full, corrupt download...)."""

    fault: Fault = Fault.INTERNAL


@dataclass(frozen=True)
class SnapshotFile:
    """One uploaded file of a snapshot: its object key, size, and its name in the RocksDB directory.

    ``reused``: uploaded for an earlier, completed checkpoint. The fields match
    ``weir.jobmanager.checkpointing.pending.StateObject`` (key, size_bytes, reused).
    """

    key: str
    size_bytes: int
    reused: bool
    file_name: str


@dataclass(frozen=True, order=True)
class SnapshotSource:
    """One local RocksDB checkpoint: the database incarnation of a TaskManager and the snapshot's index."""

    taskmanager_id: TaskManagerId
    db_incarnation: str
    checkpoint_id: CheckpointId
    snapshot_index: int


@dataclass(frozen=True)
class KeyedStateHandle:
    """The keyed state of one subtask in one checkpoint: a RocksDB snapshot and the ranges it covers.

    ``sst_files`` may be shared with other checkpoints and other subtasks; ``db_files`` (MANIFEST,
    CURRENT, OPTIONS, WAL) belong to this one local snapshot (``snapshot_index``), shared only by the
    subtasks whose snapshot it is.
    """

    taskmanager_id: TaskManagerId
    db_incarnation: str
    checkpoint_id: CheckpointId
    snapshot_index: int
    sst_files: tuple[SnapshotFile, ...]
    db_files: tuple[SnapshotFile, ...]
    ranges: tuple[tuple[OperatorUid, KeyGroupRange], ...]

    @property
    def snapshot(self) -> SnapshotSource:
        """The local RocksDB checkpoint the handle's files come from (subtasks of one TaskManager may
        share one when nothing was written between their snapshots)."""
        return SnapshotSource(self.taskmanager_id, self.db_incarnation, self.checkpoint_id, self.snapshot_index)

    @property
    def objects(self) -> tuple[SnapshotFile, ...]:
        """Every object the handle references (what the task acknowledges as its state objects)."""
        return self.sst_files + self.db_files

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.objects)

    @property
    def new_bytes(self) -> int:
        """Bytes uploaded for this checkpoint (the incremental size)."""
        return sum(f.size_bytes for f in self.objects if not f.reused)

    def overlap(self, ranges: KeyRanges) -> tuple[tuple[OperatorUid, KeyGroupRange], ...]:
        """The parts of ``ranges`` this handle covers."""
        out = []
        for uid, wanted in ranges:
            for own_uid, own in self.ranges:
                if own_uid == uid and (common := own.intersection(wanted)) is not None:
                    out.append((uid, common))
        return tuple(out)


def relative_handle(handle: KeyedStateHandle, folder: str) -> KeyedStateHandle:
    """The handle with its keys relative to ``folder`` (a savepoint's: every key lies under it)."""

    def relative(f: SnapshotFile) -> SnapshotFile:
        if not f.key.startswith(folder):
            raise SnapshotError(f"{f.key} lies outside the savepoint folder {folder}: a savepoint must hold its files")
        return replace(f, key=f.key[len(folder) :])

    return replace(
        handle,
        sst_files=tuple(relative(f) for f in handle.sst_files),
        db_files=tuple(relative(f) for f in handle.db_files),
    )


def keyed_state_to_document(handle: KeyedStateHandle) -> dict[str, Any]:
    """The handle as the JSON object of a task-state document's ``keyed_state`` (``docs/formats.md``)."""

    def files(of: tuple[SnapshotFile, ...]) -> list[dict[str, Any]]:
        return [{"key": f.key, "size_bytes": f.size_bytes, "reused": f.reused, "file_name": f.file_name} for f in of]

    return {
        "taskmanager_id": handle.taskmanager_id,
        "db_incarnation": handle.db_incarnation,
        "checkpoint_id": handle.checkpoint_id,
        "snapshot_index": handle.snapshot_index,
        "sst_files": files(handle.sst_files),
        "db_files": files(handle.db_files),
        "ranges": [[uid, r.start, r.end] for uid, r in handle.ranges],
    }


def keyed_state_from_document(document: Mapping[str, Any], where: str) -> KeyedStateHandle:
    """The handle in a task-state document's ``keyed_state``; ``where`` names the document in errors."""

    def files(of: Any) -> tuple[SnapshotFile, ...]:
        return tuple(
            SnapshotFile(
                _typed(f["key"], str),
                _typed(f["size_bytes"], int),
                _typed(f["reused"], bool),
                _typed(f["file_name"], str),
            )
            for f in of
        )

    try:
        return KeyedStateHandle(
            taskmanager_id=TaskManagerId(_typed(document["taskmanager_id"], str)),
            db_incarnation=_typed(document["db_incarnation"], str),
            checkpoint_id=CheckpointId(_typed(document["checkpoint_id"], int)),
            snapshot_index=_typed(document["snapshot_index"], int),
            sst_files=files(document["sst_files"]),
            db_files=files(document["db_files"]),
            ranges=tuple(
                (OperatorUid(_typed(uid, str)), KeyGroupRange(KeyGroup(_typed(start, int)), KeyGroup(_typed(end, int))))
                for uid, start, end in document["ranges"]
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SerializationError(f"keyed state handle in {where} is malformed: {type(exc).__name__}: {exc}") from exc


_T = TypeVar("_T")


def _typed(value: Any, kind: type[_T]) -> _T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value
