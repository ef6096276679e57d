"""Every object key of the checkpoint storage, built and parsed in one place.

Ids are zero-padded so that listing a folder returns checkpoints in id order. A job's objects::

    <prefix>/<job>/_job                                                    the submitted job
    <prefix>/<job>/_artifact                                               its files (weir.api.artifacts)
    <prefix>/<job>/checkpoints/chk-00000000000000000042/_metadata          written last, atomically
    <prefix>/<job>/checkpoints/chk-00000000000000000042/tasks/<vertex>/00003  a task's operator state
    <prefix>/<job>/checkpoints/chk-00000000000000000042/broadcast/<operator>/<sha-256>  a broadcast state, once
    <prefix>/<job>/checkpoints/chk-00000000000000000042/db/<tm>/<db>/000007/MANIFEST-000005
    <prefix>/<job>/savepoints/sp-00000000000000000043/_metadata
    <prefix>/<job>/shared/<tm>/<db>/00000000000000000042-000123.sst        SST shared by checkpoints

``<db>`` is the incarnation of one task attempt's RocksDB (a new one each time a database is created).
SST file numbers are unique within one incarnation, and the uploading checkpoint id is part of a shared
key so that an upload never lands on a key the JobManager may still be deleting for an aborted
checkpoint. The other files of a RocksDB checkpoint (MANIFEST, CURRENT, OPTIONS, WAL) are small and
private to one local snapshot (``000007`` above), so they live under the checkpoint's folder.

Folder methods return keys ending in ``/``, ready to use as listing prefixes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple, assert_never

from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskManagerId

METADATA_FILE = "_metadata"
JOB_RECORD_FILE = "_job"
JOB_ARTIFACT_FILE = "_artifact"

_ID_DIGITS = 20  # every non-negative int64 fits
_SUBTASK_DIGITS = 5  # max parallelism is 32768
_SNAPSHOT_DIGITS = 6
_CHECKPOINTS, _CHECKPOINT_STEM = "checkpoints", "chk"
_SAVEPOINTS, _SAVEPOINT_STEM = "savepoints", "sp"
_KIND_FOLDER = rf"(?P<folder>{_CHECKPOINTS}/{_CHECKPOINT_STEM}|{_SAVEPOINTS}/{_SAVEPOINT_STEM})"
_METADATA_RE = re.compile(rf"(?P<job>[^/]+)/{_KIND_FOLDER}-(?P<id>\d{{20}})/_metadata")
_CHECKPOINT_OBJECT_RE = re.compile(rf"(?P<job>[^/]+)/{_KIND_FOLDER}-(?P<id>\d{{20}})/(?P<name>[^/].*)")
_SHARED_RE = re.compile(r"(?P<job>[^/]+)/shared/(?P<tm>[^/]+)/(?P<db>[^/]+)/(?P<id>\d{20})-(?P<file>[^/]+)")


class MetadataKey(NamedTuple):
    job_id: JobId
    checkpoint_id: CheckpointId
    kind: CheckpointKind


class CheckpointObjectKey(NamedTuple):
    """An object inside one checkpoint's (or savepoint's) folder; ``name`` is relative to that folder."""

    job_id: JobId
    checkpoint_id: CheckpointId
    kind: CheckpointKind
    name: str

    @property
    def is_metadata(self) -> bool:
        return self.name == METADATA_FILE


class SharedSstKey(NamedTuple):
    job_id: JobId
    taskmanager_id: TaskManagerId
    db_incarnation: str
    checkpoint_id: CheckpointId
    file_name: str


def _folders(kind: CheckpointKind) -> tuple[str, str]:
    """The folder of a kind's folders in a job's, and the stem of each one's name: the object names
    are where a CheckpointKind becomes text."""
    match kind:
        case CheckpointKind.CHECKPOINT:
            return _CHECKPOINTS, _CHECKPOINT_STEM
        case CheckpointKind.SAVEPOINT:
            return _SAVEPOINTS, _SAVEPOINT_STEM
        case unreachable:
            assert_never(unreachable)


def _kind_of(folder: str) -> CheckpointKind:
    """The kind of a folder matched by ``_KIND_FOLDER``."""
    return CheckpointKind.SAVEPOINT if folder == f"{_SAVEPOINTS}/{_SAVEPOINT_STEM}" else CheckpointKind.CHECKPOINT


def _segment(what: str, value: str) -> str:
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{what} {value!r} cannot be part of an object key: it must be non-empty without '/'")
    return value


def _checkpoint_id(checkpoint_id: int) -> str:
    if not 0 <= checkpoint_id < 10**_ID_DIGITS:
        raise ValueError(f"checkpoint id must be a non-negative int64, got {checkpoint_id}")
    return f"{checkpoint_id:0{_ID_DIGITS}d}"


class CheckpointPaths:
    """The object keys of all jobs under one prefix of the checkpoint storage."""

    def __init__(self, prefix: str = "") -> None:
        parts = [p for p in prefix.split("/") if p]
        for part in parts:
            _segment("prefix segment", part)
        self.prefix = "".join(f"{p}/" for p in parts)

    def __repr__(self) -> str:
        return f"CheckpointPaths({self.prefix!r})"

    def job_dir(self, job_id: JobId) -> str:
        return f"{self.prefix}{_segment('job id', job_id)}/"

    def job_record(self, job_id: JobId) -> str:
        """The submitted job, written at submission so that a restarted JobManager can recover it."""
        return self.job_dir(job_id) + JOB_RECORD_FILE

    def job_of_record(self, key: str) -> JobId | None:
        """The job whose record ``key`` is (None: not a job record's key under this prefix)."""
        suffix = "/" + JOB_RECORD_FILE
        if not key.startswith(self.prefix) or not key.endswith(suffix):
            return None
        job = key[len(self.prefix) : -len(suffix)]
        return JobId(job) if job and "/" not in job else None

    def job_artifact(self, job_id: JobId) -> str:
        """The job's artifact (``weir run --py-files``), written before its record: the zip every
        TaskManager, and a JobManager that takes over, loads the job from."""
        return self.job_dir(job_id) + JOB_ARTIFACT_FILE

    def checkpoints_dir(self, job_id: JobId, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> str:
        """The folder holding every checkpoint (or savepoint) folder of a job: list it on recovery."""
        return self.job_dir(job_id) + _folders(kind)[0] + "/"

    def checkpoint_dir(
        self, job_id: JobId, checkpoint_id: CheckpointId, kind: CheckpointKind = CheckpointKind.CHECKPOINT
    ) -> str:
        folder, stem = _folders(kind)
        return f"{self.job_dir(job_id)}{folder}/{stem}-{_checkpoint_id(checkpoint_id)}/"

    def metadata(
        self, job_id: JobId, checkpoint_id: CheckpointId, kind: CheckpointKind = CheckpointKind.CHECKPOINT
    ) -> str:
        return self.checkpoint_dir(job_id, checkpoint_id, kind) + METADATA_FILE

    def metadata_key_fn(self) -> Callable[[JobId, CheckpointId, CheckpointKind], str]:
        """``metadata`` with the signature ``CheckpointCoordinator(metadata_key=...)`` expects."""

        def metadata_key(job_id: JobId, checkpoint_id: CheckpointId, kind: CheckpointKind) -> str:
            return self.metadata(job_id, checkpoint_id, kind)

        return metadata_key

    def task_state(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        vertex_uid: OperatorUid,
        subtask: SubtaskIndex,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> str:
        """A task's operator states (``weir.core.task_state``), one object per subtask, when they are too
        large to stay inline in its acknowledgement."""
        if not 0 <= subtask < 10**_SUBTASK_DIGITS:
            raise ValueError(f"subtask index must be in 0..{10**_SUBTASK_DIGITS - 1}, got {subtask}")
        base = self.checkpoint_dir(job_id, checkpoint_id, kind)
        return f"{base}tasks/{_segment('operator uid', vertex_uid)}/{subtask:0{_SUBTASK_DIGITS}d}"

    def broadcast_state(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        operator_uid: OperatorUid,
        digest: str,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> str:
        """A broadcast operator's state, content-addressed (``weir.core.broadcast_state``): the subtasks
        whose copies are the same write (and reference) this one object."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"a broadcast state is named by the SHA-256 of its bytes in hex, got {digest!r}")
        base = self.checkpoint_dir(job_id, checkpoint_id, kind)
        return f"{base}broadcast/{_segment('operator uid', operator_uid)}/{digest}"

    def shared_dir(self, job_id: JobId) -> str:
        """The folder of every shared SST of a job (for orphan clean-up after a JobManager restart)."""
        return self.job_dir(job_id) + "shared/"

    def shared_sst(
        self,
        job_id: JobId,
        taskmanager_id: TaskManagerId,
        db_incarnation: str,
        checkpoint_id: CheckpointId,
        file_name: str,
    ) -> str:
        """An SST file of one RocksDB incarnation, as uploaded by ``checkpoint_id`` (later ones reuse it)."""
        return (
            f"{self.shared_dir(job_id)}{_segment('taskmanager id', taskmanager_id)}/"
            f"{_segment('db incarnation', db_incarnation)}/{_checkpoint_id(checkpoint_id)}-"
            f"{_segment('file name', file_name)}"
        )

    def db_file(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        taskmanager_id: TaskManagerId,
        db_incarnation: str,
        snapshot_index: int,
        file_name: str,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> str:
        """A private file (MANIFEST, CURRENT, OPTIONS, WAL) of one local RocksDB snapshot."""
        if not 0 <= snapshot_index < 10**_SNAPSHOT_DIGITS:
            raise ValueError(f"snapshot index must be in 0..{10**_SNAPSHOT_DIGITS - 1}, got {snapshot_index}")
        return (
            f"{self.checkpoint_dir(job_id, checkpoint_id, kind)}db/{_segment('taskmanager id', taskmanager_id)}/"
            f"{_segment('db incarnation', db_incarnation)}/{snapshot_index:0{_SNAPSHOT_DIGITS}d}/"
            f"{_segment('file name', file_name)}"
        )

    # -- parsing keys read back from a listing ------------------------------------------------------

    def _relative(self, key: str) -> str | None:
        return key[len(self.prefix) :] if key.startswith(self.prefix) else None

    def parse_metadata_key(self, key: str) -> MetadataKey | None:
        """``(job_id, checkpoint_id, kind)`` of a metadata key; ``None`` for any other key."""
        relative = self._relative(key)
        match = _METADATA_RE.fullmatch(relative) if relative is not None else None
        if match is None:
            return None
        return MetadataKey(JobId(match["job"]), CheckpointId(int(match["id"])), _kind_of(match["folder"]))

    def parse_checkpoint_object(self, key: str) -> CheckpointObjectKey | None:
        """The checkpoint folder a key lies in (metadata, inline task state, private db files); ``None``
        for a key outside every checkpoint and savepoint folder."""
        relative = self._relative(key)
        match = _CHECKPOINT_OBJECT_RE.fullmatch(relative) if relative is not None else None
        if match is None:
            return None
        return CheckpointObjectKey(
            JobId(match["job"]), CheckpointId(int(match["id"])), _kind_of(match["folder"]), match["name"]
        )

    def parse_shared_sst(self, key: str) -> SharedSstKey | None:
        """The parts of a shared SST key; ``None`` for any other key."""
        relative = self._relative(key)
        match = _SHARED_RE.fullmatch(relative) if relative is not None else None
        if match is None:
            return None
        return SharedSstKey(
            JobId(match["job"]),
            TaskManagerId(match["tm"]),
            match["db"],
            CheckpointId(int(match["id"])),
            match["file"],
        )


def metadata_folder(metadata_key: str) -> str:
    """The folder (ending in ``/``, or empty) that holds a ``_metadata`` object."""
    return metadata_key[: -len(METADATA_FILE)] if metadata_key.endswith(METADATA_FILE) else metadata_key


def external_path(storage_uri: str, metadata_key: str) -> str:
    """A retained checkpoint's external path (Flink's): the URI of its folder in the checkpoint storage
    at ``storage_uri``, what ``weir checkpoints`` shows and ``weir run --from-checkpoint`` takes."""
    folder = metadata_key[: -len(METADATA_FILE)] if metadata_key.endswith(METADATA_FILE) else metadata_key
    return f"{storage_uri.rstrip('/')}/{folder}"


def metadata_key_of(storage_uri: str, path: str) -> str | None:
    """The metadata key an external path (or the URI of its ``_metadata``, or a key relative to the
    storage) names in the checkpoint storage at ``storage_uri``; None when it lies in another storage."""
    root = storage_uri.rstrip("/") + "/"
    if path.startswith("/") and root.startswith("file:///"):
        path = f"file://{path}"
    if path.startswith(root):
        relative = path[len(root) :]
    elif "://" in path or path.startswith("/"):
        return None
    else:
        relative = path
    relative = relative.strip("/")
    if not relative.endswith(METADATA_FILE):
        relative = f"{relative}/{METADATA_FILE}"
    return relative


_CHECKPOINT_FOLDER_RE = re.compile(
    rf"(?P<root>.*?)/?(?P<folder>[^/]+/{_CHECKPOINTS}/{_CHECKPOINT_STEM}-\d{{20}})/?(?:{METADATA_FILE})?"
)


class StateLocation(NamedTuple):
    """Where a checkpoint's or savepoint's metadata is: the URI of the storage root its keys are
    relative to, and the metadata's key under it (docs/formats.md)."""

    root_uri: str
    metadata_key: str


def locate_state(path: str) -> StateLocation:
    """The storage root and metadata key of an external path (a folder URI or its ``_metadata``): a
    checkpoint folder ``…/<job>/checkpoints/chk-<id>/`` has its keys relative to the storage root
    above ``<job>``; any other folder is a savepoint, whose keys are relative to the folder itself."""
    path = f"file://{path}" if path.startswith("/") else path
    match = _CHECKPOINT_FOLDER_RE.fullmatch(path)
    if match is not None and match["root"]:
        return StateLocation(match["root"], f"{match['folder']}/{METADATA_FILE}")
    folder = path[: -len(METADATA_FILE)] if path.endswith(METADATA_FILE) else path
    return StateLocation(folder.rstrip("/"), METADATA_FILE)
