"""Incremental snapshots of a task's RocksDB to the checkpoint storage, and restores from them.

A snapshot has a synchronous part on the task thread (flush the memtable, create a RocksDB checkpoint:
hard links, milliseconds) and an asynchronous part on a background thread (upload the files). SST files
are immutable and their names unique within one database incarnation, so an SST that the latest
completed checkpoint already references is not uploaded again: the handle lists it as ``reused``. Only
files of a checkpoint the task was told completed (or of the one its attempt restored) are reused, which
is the JobManager's contract for reused keys; an SST still uploading for a checkpoint in flight is
uploaded again under the new checkpoint's key (keys carry the uploading checkpoint id, see ``weir.core.paths``).

Each task attempt with keyed operators has its own database and snapshotter (``TaskKeyedState``), so a
snapshot holds only that subtask's key groups and uploads only its files. (A snapshotter over a database
shared by several subtasks still works: subtasks of one checkpoint share a local RocksDB checkpoint only
when nothing was written in between, same sequence number.)

A restore downloads only the files of the handles overlapping the wanted ranges, opens each snapshot as a
read-only database built from them, and copies the restored subtask's key ranges into the live database
after deleting those ranges. With one database per subtask that is the handle of the subtask's own
earlier attempt (at a rescale, the handles of the subtasks whose ranges overlap).

What may be reused is the subject of ``RocksDBSnapshotter``'s docstring: a reused key the JobManager has
deleted makes it abort the checkpoint (``released_state``), and a TaskManager that keeps reusing it aborts
every checkpoint.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import os
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog
from rocksdict import AccessType, Checkpoint, Options, Rdict, ReadOptions, WriteBatch

from weir.connectors.object_storage import CheckpointStorage
from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, TaskManagerId
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import CheckpointPaths
from weir.taskmanager.state import StateBackend, key_group_range_bounds

KeyRanges = Sequence[tuple[OperatorUid, KeyGroupRange]]

_RESTORE_BATCH = 10_000  # entries per WriteBatch when copying restored state into the live database

log = structlog.get_logger("weir.taskmanager.snapshots")


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


@dataclass(frozen=True)
class SnapshotResult:
    """A finished snapshot and what it cost; ``uploaded_bytes`` counts only what this call uploaded."""

    handle: KeyedStateHandle
    sync_duration_s: float
    async_duration_s: float
    uploaded_bytes: int
    uploaded_files: int


@dataclass(frozen=True)
class RestoreResult:
    entries: int
    handles_used: int
    downloaded_bytes: int
    duration_s: float


@dataclass(frozen=True)
class SnapshotBookkeeping:
    """What the snapshotter remembers of one job (``RocksDBSnapshotter.bookkeeping``), for tests and logs.

    ``reusable`` are the SSTs the next snapshot of a later checkpoint may list as reused (before the
    check against ``open_checkpoints``); ``open_checkpoints`` were snapshotted here and neither
    completed nor aborted as far as this TaskManager was told.
    """

    job_id: JobId
    attempt: int | None
    confirmed_checkpoint_id: CheckpointId | None
    reusable: tuple[SnapshotFile, ...]
    open_checkpoints: tuple[CheckpointId, ...]
    local_snapshots: int


@dataclass
class _LocalSnapshot:
    """A RocksDB checkpoint directory on local disk, used by ``refs`` subtask snapshots."""

    job_id: JobId
    checkpoint_id: CheckpointId
    kind: str | enum.Enum
    index: int
    path: Path
    sequence: int
    files: dict[str, int] = field(default_factory=dict)  # file name -> size
    refs: int = 1


@dataclass
class _JobBook:
    """The upload bookkeeping of one attempt of one job; a new attempt gets a new book, never a cleared one,
    so that a snapshot of an earlier attempt still uploading records nothing into the new one."""

    attempt: int | None
    # The latest checkpoint known to be completed (or the restored one) and its SSTs by file name.
    confirmed_id: CheckpointId | None = None
    confirmed: dict[str, SnapshotFile] = field(default_factory=dict)
    # Open checkpoints (snapshotted here, not yet completed or aborted): the SST keys their snapshots on
    # this TaskManager reference, recorded when each snapshot chose what to reuse (on the task thread).
    referenced: dict[CheckpointId, set[str]] = field(default_factory=dict)
    reusing: set[CheckpointId] = field(default_factory=set)  # open checkpoints that reused an SST here
    aborted: set[CheckpointId] = field(default_factory=set)  # aborted after the confirmed one
    # Uploads started per checkpoint, by object key: subtasks of one checkpoint upload a file once.
    uploads: dict[CheckpointId, dict[str, Future[SnapshotFile]]] = field(default_factory=dict)
    # SSTs referenced by the finished snapshots of a checkpoint, by file name: confirmed on completion.
    snapshotted: dict[CheckpointId, dict[str, SnapshotFile]] = field(default_factory=dict)
    snapshots_began: bool = False  # from then on a restored handle is no longer adopted
    # Savepoints snapshotted here: self-contained, they neither reuse nor become reusable.
    savepoints: set[CheckpointId] = field(default_factory=set)

    def is_open(self, checkpoint_id: CheckpointId) -> bool:
        newer = self.confirmed_id is None or checkpoint_id > self.confirmed_id
        return newer and checkpoint_id not in self.aborted

    def reusable(self, checkpoint_id: CheckpointId) -> dict[str, SnapshotFile]:
        """The confirmed SSTs a snapshot of ``checkpoint_id`` may reuse: those every open checkpoint
        between the confirmed one and this one references too (see the class docstring)."""
        if not self.confirmed:
            return {}
        between = [keys for cid, keys in self.referenced.items() if self.is_open(cid) and cid < checkpoint_id]
        return {name: f for name, f in self.confirmed.items() if all(f.key in keys for keys in between)}

    def drop_through(self, checkpoint_id: CheckpointId) -> None:
        for table in (self.referenced, self.uploads, self.snapshotted):
            for cid in [c for c in table if c <= checkpoint_id]:
                del table[cid]
        self.reusing = {c for c in self.reusing if c > checkpoint_id}
        self.aborted = {c for c in self.aborted if c > checkpoint_id}


@dataclass(frozen=True)
class _UploadPlan:
    """The asynchronous part of one subtask snapshot, decided on the task thread."""

    book: _JobBook | None  # None: the snapshot belongs to no current attempt and records nothing
    reused: tuple[SnapshotFile, ...]
    waiting: tuple[Future[SnapshotFile], ...]
    started_here: tuple[Future[SnapshotFile], ...]


class RocksDBSnapshotter:
    """Snapshots and restores the keyed state of one ``StateBackend`` (one task attempt's database).

    Thread-safe: task threads call ``begin`` and ``restore`` concurrently; uploads and downloads run on
    ``transfer_threads`` background threads; notifications and ``forget_job`` come from RPC threads.

    **Never reuse a key the JobManager may have deleted.** The coordinator deletes an uploaded object
    only once no retained checkpoint and no acknowledged in-flight checkpoint references it
    (``CheckpointCoordinator._release``): after a completion subsumes older checkpoints, after an abort
    (the aborted checkpoint's objects that nothing retained references) and after a failed persist. The
    latest completed checkpoint is always retained. So a key is safe to reuse while some checkpoint that
    references it is certainly retained. The snapshotter keeps, per job and attempt:

    * ``confirmed``: the SSTs of the latest checkpoint it was told completed (or, at the start of an
      attempt, of the restored checkpoint: the JobManager retains it, see ``start_attempt``). That
      checkpoint stays retained until a newer one completes, and within one attempt no checkpoint
      completes without the acknowledgements of this TaskManager's subtasks: a newer completed one is
      one of the *open* checkpoints, snapshotted here and not yet reported completed or aborted
      (notifications are best effort: late, reordered or lost).
    * A snapshot of checkpoint ``n`` reuses a confirmed SST only if every open checkpoint between the
      confirmed one and ``n`` references the same key: whichever of them completed, the key is in a
      retained checkpoint. A subtask snapshots its checkpoints in id order and chooses what to reuse on
      the task thread (``begin``), so an open checkpoint that may complete has recorded its keys first.
    * Across attempts none of this holds (the job may have completed checkpoints on other TaskManagers,
      subsuming everything uploaded here): ``start_attempt`` starts from nothing but the restored
      checkpoint's own files, and snapshots of an earlier attempt still uploading reuse nothing and
      record nothing.
    * Keys first uploaded for a checkpoint carry its id and are only confirmed once it completed; an
      aborted checkpoint's uploads are never reused (the coordinator deletes them).

    **An abort that may have released state** resets ``confirmed``: an abort's ``DeleteObjects`` holds
    the aborted checkpoint's new uploads (never reused) and the keys no retained checkpoint references.
    A confirmed key can be among those only if the confirmed checkpoint is no longer retained, which is
    what the coordinator's ``released_state`` abort reports, and such an abort can only be of a
    checkpoint whose snapshots here reused SSTs. So an aborted checkpoint that reused SSTs on this
    TaskManager drops ``confirmed`` (the next snapshot uploads its SSTs again, the next completion
    confirms again); one that reused nothing drops only its own uploads. That is what ends a loop of
    ``released_state`` aborts whatever made the bookkeeping stale.
    """

    def __init__(
        self,
        state_backend: StateBackend,
        storage: CheckpointStorage,
        paths: CheckpointPaths,
        taskmanager_id: TaskManagerId,
        *,
        work_dir: Path | None = None,
        transfer_threads: int = 4,
        db_incarnation: str | None = None,
    ) -> None:
        self._backend = state_backend
        self._storage = storage
        self._paths = paths
        self.taskmanager_id = taskmanager_id
        self.db_incarnation = db_incarnation or uuid.uuid4().hex[:16]
        # Next to the database, on the same file system: RocksDB checkpoints are hard links.
        self.work_dir = work_dir or state_backend.path.with_name(state_backend.path.name + ".snapshots")
        self._snapshot_root = self.work_dir / "local"
        self._restore_root = self.work_dir / "restore"
        self._cache_root = self.work_dir / "cache"
        for stale in (self._snapshot_root, self._restore_root):
            shutil.rmtree(stale, ignore_errors=True)
            stale.mkdir(parents=True)

        self._lock = threading.Lock()
        self._indexes = itertools.count()
        self._local: dict[tuple[JobId, CheckpointId], _LocalSnapshot] = {}
        self._books: dict[JobId, _JobBook] = {}
        self._downloads: dict[str, Future[int]] = {}

        self._transfers = ThreadPoolExecutor(transfer_threads, thread_name_prefix="snapshot-transfer")
        self._async = ThreadPoolExecutor(4, thread_name_prefix="snapshot-async")

    # -- attempts and jobs --------------------------------------------------------------------------

    def start_attempt(self, job_id: JobId, attempt: int, restored: Iterable[KeyedStateHandle] = ()) -> None:
        """Attempt ``attempt`` of the job is being deployed here: call it for every subtask deployed,
        before its restore, with the keyed state handle(s) it restores from (none on a fresh start).

        The first call of a newer attempt drops everything remembered of the job's uploads: the job may
        have completed checkpoints elsewhere meanwhile, subsuming (and deleting) what was uploaded here.
        The restored checkpoint is retained by the JobManager until a checkpoint of this attempt
        completes, so the SSTs its handles list under this TaskManager's current database incarnation
        may be reused (they are files of the live database). Later calls for the same attempt add their
        handles until the attempt's first snapshot; calls for an earlier attempt are ignored. Idempotent.
        """
        with self._lock:
            book = self._book_for(job_id, attempt)
            if book is None:
                log.info("snapshot_attempt_stale", job_id=job_id, attempt=attempt, current=self._books[job_id].attempt)
                return
            adopted = self._adopt_restored(book, job_id, restored)
        if adopted:
            log.info(
                "snapshot_restored_files_adopted",
                job_id=job_id,
                attempt=attempt,
                checkpoint_id=book.confirmed_id,
                files=adopted,
            )

    def _book_for(self, job_id: JobId, attempt: int | None) -> _JobBook | None:
        """The job's book for ``attempt`` (None: any), started if the attempt is new; None if it is older."""
        book = self._books.get(job_id)
        if book is not None and (attempt is None or book.attempt == attempt):
            return book
        if book is not None and book.attempt is not None and attempt is not None and attempt < book.attempt:
            return None
        fresh = _JobBook(attempt)
        self._books[job_id] = fresh
        log.info(
            "snapshot_attempt_started",
            job_id=job_id,
            attempt=attempt,
            previous_attempt=book.attempt if book is not None else None,
            dropped_reusable=len(book.confirmed) if book is not None else 0,
        )
        return fresh

    def _adopt_restored(self, book: _JobBook, job_id: JobId, handles: Iterable[KeyedStateHandle]) -> int:
        adopted = 0
        for handle in handles:
            if book.snapshots_began or handle.taskmanager_id != self.taskmanager_id:
                continue
            if handle.db_incarnation != self.db_incarnation:
                continue  # files of another database: none of them is in the live one
            if book.confirmed_id is not None and book.confirmed_id != handle.checkpoint_id:
                continue
            book.confirmed_id = handle.checkpoint_id
            for f in handle.sst_files:
                key = self._paths.parse_shared_sst(f.key)
                mine = (job_id, self.taskmanager_id, self.db_incarnation, f.file_name)
                if key is not None and (key.job_id, key.taskmanager_id, key.db_incarnation, key.file_name) == mine:
                    book.confirmed[f.file_name] = replace(f, reused=False)
                    adopted += 1
        return adopted

    def forget_job(self, job_id: JobId) -> None:
        """The job ended (or none of its subtasks runs here any more): drop its bookkeeping, its restore
        cache entries, and its local snapshots (each once its running upload, if any, is over: an upload
        that finishes later records nothing). Idempotent.

        Call it once no subtask of the job runs or restores on this database. The job's keys in the
        database are not the snapshotter's (``StateBackend``); it owns no per-job directory.
        """
        with self._lock:
            book = self._books.pop(job_id, None)
            local = [k for k in self._local if k[0] == job_id]
            for k in local:
                del self._local[k]  # deleted by ``_release`` when its last user is done
            prefix = self._paths.job_dir(job_id)
            cached = [key for key in self._downloads if key.startswith(prefix)]
            for key in cached:
                del self._downloads[key]
        shutil.rmtree(self._cache_root.joinpath(*[p for p in prefix.split("/") if p]), ignore_errors=True)
        if book is not None or local or cached:
            log.info(
                "snapshot_job_forgotten",
                job_id=job_id,
                attempt=book.attempt if book is not None else None,
                snapshots_in_flight=len(local),
                cached_files=len(cached),
            )

    def bookkeeping(self, job_id: JobId) -> SnapshotBookkeeping | None:
        """What is remembered of the job's uploads; None once forgotten (or never snapshotted)."""
        with self._lock:
            book = self._books.get(job_id)
            if book is None:
                return None
            return SnapshotBookkeeping(
                job_id=job_id,
                attempt=book.attempt,
                confirmed_checkpoint_id=book.confirmed_id,
                reusable=tuple(sorted(book.confirmed.values(), key=lambda f: f.file_name)),
                open_checkpoints=tuple(sorted(c for c in book.referenced if book.is_open(c))),
                local_snapshots=sum(1 for k in self._local if k[0] == job_id),
            )

    # -- snapshots ----------------------------------------------------------------------------------

    def begin(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        ranges: KeyRanges,
        kind: str | enum.Enum = "checkpoint",
        *,
        attempt: int | None = None,
    ) -> Future[SnapshotResult]:
        """Take the synchronous part now; the future completes when every file is in the storage.

        Call it on the task thread at the barrier, after flushing the subtask's ``KeyedStateStore``
        caches. ``ranges`` are the subtask's ``(operator uid, key group range)`` pairs; ``kind`` is the
        ``CheckpointKind`` (a savepoint's private files go under its own folder). ``attempt``: the
        subtask's execution attempt; a snapshot of an attempt older than the job's current one reuses
        nothing and records nothing (its acknowledgement is discarded), a newer one starts it
        (``start_attempt`` without restored files). None: the current attempt.
        """
        started = time.perf_counter()
        local = self._take_local_snapshot(job_id, checkpoint_id, kind)
        try:
            plan = self._plan_uploads(local, attempt)
        except BaseException:
            self._release(local)
            raise
        sync_duration = time.perf_counter() - started
        try:
            return self._async.submit(self._finish_snapshot, local, plan, tuple(ranges), sync_duration)
        except BaseException:
            wait(plan.started_here)  # they read this local snapshot
            self._release(local)
            raise

    def snapshot(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        ranges: KeyRanges,
        timeout: float | None = None,
        *,
        attempt: int | None = None,
    ) -> KeyedStateHandle:
        """``begin`` and wait for the upload."""
        return self.begin(job_id, checkpoint_id, ranges, attempt=attempt).result(timeout).handle

    def _take_local_snapshot(self, job_id: JobId, checkpoint_id: CheckpointId, kind: str | enum.Enum) -> _LocalSnapshot:
        db = self._backend.db
        with self._backend.lock:  # no batch lands between the flush and the checkpoint
            db.flush()
            sequence = db.latest_sequence_number()
            with self._lock:
                existing = self._local.get((job_id, checkpoint_id))
                if existing is not None and existing.sequence == sequence and existing.refs > 0:
                    existing.refs += 1
                    return existing
                index = next(self._indexes)
            path = self._snapshot_root / f"{index:06d}"
            try:
                Checkpoint(db).create_checkpoint(str(path))
            except Exception as exc:
                shutil.rmtree(path, ignore_errors=True)
                raise SnapshotError(
                    f"checkpoint {checkpoint_id} of job {job_id}: could not create a RocksDB checkpoint in "
                    f"{path}: {exc}; check the free disk space"
                ) from exc
        files = {entry.name: entry.stat().st_size for entry in os.scandir(path) if entry.is_file()}
        local = _LocalSnapshot(job_id, checkpoint_id, kind, index, path, sequence, files)
        with self._lock:
            self._local[(job_id, checkpoint_id)] = local
        return local

    def _release(self, local: _LocalSnapshot) -> None:
        with self._lock:
            local.refs -= 1
            if local.refs > 0:
                return
            if self._local.get((local.job_id, local.checkpoint_id)) is local:
                del self._local[(local.job_id, local.checkpoint_id)]
        shutil.rmtree(local.path, ignore_errors=True)

    def _plan_uploads(self, local: _LocalSnapshot, attempt: int | None) -> _UploadPlan:
        """Choose what to reuse and start the uploads; on the task thread, so in barrier order."""
        job, checkpoint = local.job_id, local.checkpoint_id
        reused: list[SnapshotFile] = []
        waiting: list[Future[SnapshotFile]] = []
        started_here: list[Future[SnapshotFile]] = []
        savepoint = _is_savepoint(local.kind)
        with self._lock:
            book = self._book_for(job, attempt)
            current = book is not None and book.is_open(checkpoint)
            if book is not None:
                book.snapshots_began = True
                if savepoint:
                    book.savepoints.add(checkpoint)
            reusable = book.reusable(checkpoint) if current and book is not None and not savepoint else {}
            uploads = book.uploads.setdefault(checkpoint, {}) if current and book is not None else {}
            sst_keys: set[str] = set()
            for name, size in sorted(local.files.items()):
                if name.endswith(".sst") and not savepoint:
                    known = reusable.get(name)
                    if known is not None and known.size_bytes == size:
                        reused.append(replace(known, reused=True))
                        sst_keys.add(known.key)
                        continue
                    key = self._paths.shared_sst(job, self.taskmanager_id, self.db_incarnation, checkpoint, name)
                    sst_keys.add(key)
                else:
                    key = self._paths.db_file(
                        job, checkpoint, self.taskmanager_id, self.db_incarnation, local.index, name, local.kind
                    )
                future = uploads.get(key)
                if future is None:
                    future = self._transfers.submit(self._upload, key, local.path / name, name, size)
                    uploads[key] = future
                    started_here.append(future)
                waiting.append(future)
            if current and book is not None and not savepoint:
                book.referenced.setdefault(checkpoint, set()).update(sst_keys)
                if reused:
                    book.reusing.add(checkpoint)
        if book is None or not current:
            log.info(
                "snapshot_outside_attempt",
                job_id=job,
                checkpoint_id=checkpoint,
                attempt=attempt,
                reason="earlier attempt" if book is None else "checkpoint already completed or aborted",
            )
        return _UploadPlan(book if current else None, tuple(reused), tuple(waiting), tuple(started_here))

    def _finish_snapshot(
        self,
        local: _LocalSnapshot,
        plan: _UploadPlan,
        ranges: tuple[tuple[OperatorUid, KeyGroupRange], ...],
        sync_duration: float,
    ) -> SnapshotResult:
        started = time.perf_counter()
        job, checkpoint = local.job_id, local.checkpoint_id
        try:
            wait(plan.waiting)  # even when one fails: the others read files of this local snapshot
            uploaded = [f.result() for f in plan.waiting]
        finally:
            # An upload reads the local snapshot of the call that started it, which waits for it first.
            self._release(local)

        sst = sorted([*plan.reused, *(f for f in uploaded if f.file_name.endswith(".sst"))], key=lambda f: f.file_name)
        handle = KeyedStateHandle(
            taskmanager_id=self.taskmanager_id,
            db_incarnation=self.db_incarnation,
            checkpoint_id=checkpoint,
            snapshot_index=local.index,
            sst_files=tuple(sst),
            db_files=tuple(f for f in uploaded if not f.file_name.endswith(".sst")),
            ranges=ranges,
        )
        with self._lock:
            book = plan.book
            if (
                book is not None
                and self._books.get(job) is book
                and book.is_open(checkpoint)
                and checkpoint not in book.savepoints
            ):
                book.snapshotted.setdefault(checkpoint, {}).update((f.file_name, replace(f, reused=False)) for f in sst)
        own = [f.result() for f in plan.started_here]
        return SnapshotResult(
            handle=handle,
            sync_duration_s=sync_duration,
            async_duration_s=time.perf_counter() - started,
            uploaded_bytes=sum(f.size_bytes for f in own),
            uploaded_files=len(own),
        )

    def _upload(self, key: str, path: Path, file_name: str, size: int) -> SnapshotFile:
        self._storage.put_file(key, path)
        return SnapshotFile(key, size, False, file_name)

    # -- notifications ------------------------------------------------------------------------------

    def _notified_book(self, job_id: JobId, attempt: int | None) -> _JobBook | None:
        book = self._books.get(job_id)
        if book is None or attempt is None or book.attempt is None or attempt == book.attempt:
            return book
        if attempt < book.attempt:
            return None  # about a checkpoint of an earlier attempt: nothing of it is remembered
        return self._book_for(job_id, attempt)  # a newer attempt than any deployed here: start it

    def notify_checkpoint_complete(
        self, job_id: JobId, checkpoint_id: CheckpointId, *, attempt: int | None = None
    ) -> None:
        """The checkpoint completed: its SSTs become the ones later snapshots reuse (idempotent).

        ``attempt``: the attempt the JobManager completed it in; a notification of an earlier attempt
        is ignored. If no snapshot of it was taken here (none recorded), what was confirmed before may
        be subsumed: nothing is reused until the next completion of a checkpoint snapshotted here.
        """
        with self._lock:
            book = self._notified_book(job_id, attempt)
            if book is None or (book.confirmed_id is not None and checkpoint_id <= book.confirmed_id):
                return
            if checkpoint_id in book.savepoints:
                book.savepoints.discard(checkpoint_id)  # its files are the user's: nothing to reuse
                book.uploads.pop(checkpoint_id, None)
                return
            files = book.snapshotted.get(checkpoint_id)
            dropped = len(book.confirmed) if files is None else 0
            book.confirmed = dict(files) if files is not None else {}
            book.confirmed_id = checkpoint_id
            book.drop_through(checkpoint_id)
        if dropped:
            log.warning(
                "snapshot_reuse_reset",
                job_id=job_id,
                checkpoint_id=checkpoint_id,
                reason="completed without a snapshot recorded here",
                dropped_files=dropped,
            )

    def notify_checkpoint_aborted(
        self, job_id: JobId, checkpoint_id: CheckpointId, *, attempt: int | None = None
    ) -> None:
        """The checkpoint was aborted: the JobManager may delete its uploads, so they are never reused;
        if its snapshots here reused SSTs, the abort may have released state (see the class docstring)
        and nothing confirmed is reused any more until the next completion. Idempotent."""
        with self._lock:
            book = self._notified_book(job_id, attempt)
            if book is None or not book.is_open(checkpoint_id):
                return
            book.aborted.add(checkpoint_id)
            book.uploads.pop(checkpoint_id, None)
            book.snapshotted.pop(checkpoint_id, None)
            book.referenced.pop(checkpoint_id, None)
            released = checkpoint_id in book.reusing
            book.reusing.discard(checkpoint_id)
            dropped = len(book.confirmed) if released else 0
            confirmed_id = book.confirmed_id
            if released:
                book.confirmed = {}
        if dropped:
            log.warning(
                "snapshot_reuse_reset",
                job_id=job_id,
                checkpoint_id=checkpoint_id,
                reason="aborted after reusing SSTs: the JobManager may have released them",
                confirmed_checkpoint_id=confirmed_id,
                dropped_files=dropped,
            )

    # -- restore ------------------------------------------------------------------------------------

    def restore(
        self, handles: Iterable[KeyedStateHandle], ranges: KeyRanges, storage: CheckpointStorage | None = None
    ) -> RestoreResult:
        """Replace the state of ``ranges`` in the live database with what the handles hold for them.

        ``handles`` may be every handle of the checkpoint: only those overlapping ``ranges`` are read,
        and only their files not already in the local cache are downloaded. Key groups no handle covers
        end up empty. Call it before the subtask's ``KeyedStateStore`` caches hold anything.
        ``storage``: where the handles' keys are (a savepoint's folder, another job's storage); default
        this TaskManager's checkpoint storage.
        """
        source_storage = storage if storage is not None else self._storage
        started = time.perf_counter()
        wanted = tuple(ranges)
        groups: dict[tuple[TaskManagerId, str, CheckpointId, int], list[KeyedStateHandle]] = defaultdict(list)
        for handle in handles:
            if handle.overlap(wanted):
                source = (handle.taskmanager_id, handle.db_incarnation, handle.checkpoint_id, handle.snapshot_index)
                groups[source].append(handle)

        for uid, key_groups in wanted:
            self._backend.delete_prefix_range(*_range_bounds(uid, key_groups))
        entries = 0
        downloaded = 0
        for same_snapshot in groups.values():
            parts = {part for handle in same_snapshot for part in handle.overlap(wanted)}
            copied, fetched = self._restore_snapshot(
                same_snapshot[0], sorted(parts, key=_range_sort_key), source_storage
            )
            entries += copied
            downloaded += fetched
        return RestoreResult(entries, sum(len(g) for g in groups.values()), downloaded, time.perf_counter() - started)

    def _restore_snapshot(
        self, handle: KeyedStateHandle, parts: list[tuple[OperatorUid, KeyGroupRange]], storage: CheckpointStorage
    ) -> tuple[int, int]:
        directory = self._restore_root / uuid.uuid4().hex
        directory.mkdir(parents=True)
        try:
            sst_downloads = [(f, self._cached(f, storage)) for f in handle.sst_files]
            meta_downloads = [
                (f, self._transfers.submit(storage.get_file, f.key, directory / f.file_name)) for f in handle.db_files
            ]
            fetched = 0
            for f, (future, started_here) in sst_downloads:
                downloaded = future.result()
                fetched += downloaded if started_here else 0  # another restore's download counts there
                _link_or_copy(self._cache_path(self._cache_key(f, storage)), directory / f.file_name)
            for f, meta in meta_downloads:
                meta.result()
                fetched += f.size_bytes
            return self._copy_ranges(handle, directory, parts), fetched
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _copy_ranges(
        self, handle: KeyedStateHandle, directory: Path, parts: list[tuple[OperatorUid, KeyGroupRange]]
    ) -> int:
        try:
            source = Rdict(str(directory), Options(raw_mode=True), access_type=AccessType.read_only())
        except Exception as exc:
            raise SnapshotError(
                f"checkpoint {handle.checkpoint_id}: the snapshot {handle.snapshot_index} of TaskManager "
                f"{handle.taskmanager_id} (db {handle.db_incarnation}) does not open as a RocksDB database: {exc}"
            ) from exc
        copied = 0
        try:
            for uid, key_groups in parts:
                start, end = _range_bounds(uid, key_groups)
                read = ReadOptions()
                read.set_iterate_upper_bound(end)
                batch = WriteBatch(raw_mode=True)
                pending = 0
                for key, value in source.items(from_key=start, read_opt=read):
                    batch.put(key, value)
                    pending += 1
                    if pending == _RESTORE_BATCH:
                        self._backend.write(batch)
                        copied += pending
                        batch, pending = WriteBatch(raw_mode=True), 0
                if pending:
                    self._backend.write(batch)
                    copied += pending
        finally:
            source.close()
        return copied

    def _cache_path(self, key: str) -> Path:
        return self._cache_root.joinpath(*key.split("/"))

    def _cache_key(self, sst: SnapshotFile, storage: CheckpointStorage) -> str:
        """Where ``sst`` is cached: its key, under a folder of the storage's own when it is not this
        TaskManager's (a savepoint's keys are relative to its folder, so two savepoints share names)."""
        if storage is self._storage:
            return sst.key
        return f"_foreign/{hashlib.sha256(storage.uri.encode()).hexdigest()[:16]}/{sst.key}"

    def _cached(self, sst: SnapshotFile, storage: CheckpointStorage) -> tuple[Future[int], bool]:
        """A future of the bytes downloaded to have ``sst`` in the cache (0: it already was), and whether
        this call started it."""
        key = self._cache_key(sst, storage)
        with self._lock:
            future = self._downloads.get(key)
            if future is None or (future.done() and future.exception() is not None):
                future = self._transfers.submit(self._download, sst, storage, key)
                self._downloads[key] = future
                return future, True
            return future, False

    def _download(self, sst: SnapshotFile, storage: CheckpointStorage, cache_key: str) -> int:
        path = self._cache_path(cache_key)
        if path.is_file() and path.stat().st_size == sst.size_bytes:
            return 0
        storage.get_file(sst.key, path)
        size = path.stat().st_size
        if size != sst.size_bytes:
            path.unlink(missing_ok=True)
            raise SnapshotError(f"downloaded {sst.key} has {size} bytes, the snapshot handle says {sst.size_bytes}")
        return size

    def clear_restore_cache(self) -> None:
        """Drop every downloaded SST (call once every subtask of a deployment has restored, when no
        restore runs: a running one may miss files). Idempotent; ``forget_job`` drops one job's."""
        with self._lock:
            cached = len(self._downloads)
            self._downloads.clear()
        shutil.rmtree(self._cache_root, ignore_errors=True)
        if cached:
            log.info("snapshot_restore_cache_cleared", files=cached)

    # -- metrics and lifecycle ----------------------------------------------------------------------

    def live_sst_bytes(self) -> int:
        """Total size of the live database's SST files (the state size metric)."""
        value = self._backend.db.property_int_value("rocksdb.live-sst-files-size")
        return int(value or 0)

    def close(self) -> None:
        """Wait for running uploads and downloads, then stop the background threads."""
        self._async.shutdown(wait=True)
        self._transfers.shutdown(wait=True)
        shutil.rmtree(self._snapshot_root, ignore_errors=True)
        shutil.rmtree(self._restore_root, ignore_errors=True)


def _is_savepoint(kind: str | enum.Enum) -> bool:
    return (kind.value if isinstance(kind, enum.Enum) else kind) == "savepoint"


def _range_bounds(uid: OperatorUid, key_groups: KeyGroupRange) -> tuple[bytes, bytes]:
    return key_group_range_bounds(uid, key_groups.start, key_groups.end)


def _range_sort_key(part: tuple[OperatorUid, KeyGroupRange]) -> tuple[str, KeyGroup]:
    return part[0], part[1].start


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


class TaskKeyedState:
    """The keyed state of one task attempt: its own RocksDB, and the snapshotter of that database only.

    A snapshot therefore uploads only the files of this subtask's key groups, and a restore from its
    handle downloads only those. ``discard`` (when the task ends) waits for uploads still running, then
    deletes the database and its snapshot directories.
    """

    def __init__(
        self,
        directory: Path,
        storage: CheckpointStorage,
        paths: CheckpointPaths,
        taskmanager_id: TaskManagerId,
        *,
        transfer_threads: int = 2,
    ) -> None:
        shutil.rmtree(directory, ignore_errors=True)  # a fresh database: state returns only by a restore
        self.directory = directory
        self.backend = StateBackend(directory / "state.db")
        self.snapshotter = RocksDBSnapshotter(
            self.backend,
            storage,
            paths,
            taskmanager_id,
            work_dir=directory / "snapshots",
            transfer_threads=transfer_threads,
        )
        self._lock = threading.Lock()
        self._discarded = False

    def live_sst_bytes(self) -> int:
        """The database's SST bytes; 0 once discarded."""
        with self._lock:
            return 0 if self._discarded else self.snapshotter.live_sst_bytes()

    def discard(self) -> None:
        """Close and delete the database once its running uploads are over. Idempotent."""
        with self._lock:
            if self._discarded:
                return
            self._discarded = True
        self.snapshotter.close()
        self.backend.close()
        shutil.rmtree(self.directory, ignore_errors=True)
