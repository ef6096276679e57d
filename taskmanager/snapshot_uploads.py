"""Incremental snapshots of one RocksDB database to the checkpoint storage, after Flink's
``RocksIncrementalSnapshotStrategy``: what to upload, what to reuse, and what to remember of it.

A snapshot has a synchronous part on the task thread (flush the memtable, create a RocksDB checkpoint:
hard links, milliseconds) and an asynchronous part on a background thread (upload the files). SST files
are immutable and their names unique within one database, so an SST that the latest completed
checkpoint already references is not uploaded again: the handle lists it as ``reused``. Only files of a
checkpoint the task was told completed (or of the one its attempt restored, adopted as the database:
Flink's ``RocksDBIncrementalRestoreOperation`` hands the restored SSTs to the snapshot strategy as
``restoredSstFiles`` for the same reason) are reused, which is the JobManager's contract for reused
keys; an SST still uploading for a checkpoint in flight is uploaded again under the new checkpoint's
key (keys carry the uploading checkpoint id, see ``weir.core.paths``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, OperatorUid, TaskManagerId
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import CheckpointPaths
from weir.taskmanager.snapshot_handles import KeyedStateHandle, KeyRanges, SnapshotError, SnapshotFile
from weir.taskmanager.state import RocksDBStateBackend

log = structlog.get_logger("weir.taskmanager.snapshots")


@dataclass(frozen=True)
class SnapshotResult:
    """A finished snapshot and what it cost; ``uploaded_bytes`` counts only what this call uploaded."""

    handle: KeyedStateHandle
    sync_duration_s: float
    async_duration_s: float
    uploaded_bytes: int
    uploaded_files: int


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
    kind: CheckpointKind
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


class IncrementalSnapshots:
    """Snapshots one ``RocksDBStateBackend`` and uploads what the checkpoint storage lacks; remembers,
    per job and attempt, which uploaded SSTs a later snapshot may reuse.

    Thread-safe: task threads call ``begin``; uploads run on the ``transfers`` executor (shared with
    the restores' downloads); notifications and ``forget_job`` come from RPC threads.

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
        state_backend: RocksDBStateBackend,
        storage: CheckpointStorage,
        paths: CheckpointPaths,
        taskmanager_id: TaskManagerId,
        db_incarnation: str,
        work_dir: Path,
        transfers: Executor,
    ) -> None:
        self._backend = state_backend
        self._storage = storage
        self._paths = paths
        self.taskmanager_id = taskmanager_id
        self.db_incarnation = db_incarnation
        self._snapshot_root = work_dir / "local"
        shutil.rmtree(self._snapshot_root, ignore_errors=True)
        self._snapshot_root.mkdir(parents=True)

        self._lock = threading.Lock()
        self._indexes = itertools.count()
        self._local: dict[tuple[JobId, CheckpointId], _LocalSnapshot] = {}
        self._books: dict[JobId, _JobBook] = {}

        self._transfers = transfers
        self._async = ThreadPoolExecutor(4, thread_name_prefix="snapshot-async")

    # -- attempts and jobs --------------------------------------------------------------------------

    def start_attempt(self, job_id: JobId, attempt: int, restored: Iterable[KeyedStateHandle] = ()) -> None:
        """Attempt ``attempt`` of the job is being deployed here: call it for every subtask deployed,
        before its restore, with the keyed state handle(s) it restores from (none on a fresh start).

        The first call of a newer attempt drops everything remembered of the job's uploads: the job may
        have completed checkpoints elsewhere meanwhile, subsuming (and deleting) what was uploaded here.
        The restored checkpoint is retained by the JobManager until a checkpoint of this attempt
        completes, so the SSTs its handles list that are files of the live database may be reused:
        those of a handle of this database incarnation here, those of a snapshot the restore adopted
        as the database (``adopt_restored_database``). Later calls for the same attempt add their
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
        """The restored handles' SSTs that are files of the live database already: those of this
        database incarnation (a database that outlived an attempt)."""
        adopted = 0
        for handle in handles:
            if handle.taskmanager_id != self.taskmanager_id or handle.db_incarnation != self.db_incarnation:
                continue  # files of another database: none of them is in the live one
            adopted += self._confirm_restored(book, job_id, handle)
        return adopted

    def adopt_restored_database(self, job_id: JobId, attempt: int | None, handle: KeyedStateHandle) -> None:
        """The restore opened ``handle``'s snapshot as the live database (``RocksDBStateBackend.adopt``):
        its SSTs are files of the live database under the same names, and the JobManager retains the
        restored checkpoint until one of this attempt completes, so the next snapshot reuses the keys
        of those that are this job's shared SSTs instead of uploading them again (whatever TaskManager
        uploaded them). Call it after ``start_attempt`` and before the attempt's first snapshot."""
        with self._lock:
            book = self._book_for(job_id, attempt)
            if book is None:
                return
            adopted = self._confirm_restored(book, job_id, handle)
        log.info(
            "snapshot_restored_files_adopted",
            job_id=job_id,
            attempt=attempt,
            checkpoint_id=handle.checkpoint_id,
            files=adopted,
            of=len(handle.sst_files),
        )

    def _confirm_restored(self, book: _JobBook, job_id: JobId, handle: KeyedStateHandle) -> int:
        if book.snapshots_began or (book.confirmed_id is not None and book.confirmed_id != handle.checkpoint_id):
            return 0
        adopted = 0
        for f in handle.sst_files:
            key = self._paths.parse_shared_sst(f.key)
            if key is not None and key.job_id == job_id and key.file_name == f.file_name:
                book.confirmed_id = handle.checkpoint_id
                book.confirmed[f.file_name] = replace(f, reused=False)
                adopted += 1
        return adopted

    def forget_job(self, job_id: JobId) -> None:
        """The job ended (or none of its subtasks runs here any more): drop its bookkeeping and its
        local snapshots (each once its running upload, if any, is over: an upload that finishes later
        records nothing). Idempotent."""
        with self._lock:
            book = self._books.pop(job_id, None)
            local = [k for k in self._local if k[0] == job_id]
            for k in local:
                del self._local[k]  # deleted by ``_release`` when its last user is done
        if book is not None or local:
            log.info(
                "snapshot_job_forgotten",
                job_id=job_id,
                attempt=book.attempt if book is not None else None,
                snapshots_in_flight=len(local),
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
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
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

    def _take_local_snapshot(self, job_id: JobId, checkpoint_id: CheckpointId, kind: CheckpointKind) -> _LocalSnapshot:
        with self._backend.quiesced() as sequence:  # no batch lands between the flush and the checkpoint
            with self._lock:
                existing = self._local.get((job_id, checkpoint_id))
                if existing is not None and existing.sequence == sequence and existing.refs > 0:
                    existing.refs += 1
                    return existing
                index = next(self._indexes)
            path = self._snapshot_root / f"{index:06d}"
            try:
                self._backend.create_checkpoint(path)
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
        savepoint = local.kind is CheckpointKind.SAVEPOINT
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

    def drain(self) -> None:
        """Wait for the snapshots finishing (their uploads with them); no snapshot may begin after."""
        self._async.shutdown(wait=True)

    def close(self) -> None:
        """Delete the local snapshots: call it after ``drain`` once no upload runs."""
        shutil.rmtree(self._snapshot_root, ignore_errors=True)
