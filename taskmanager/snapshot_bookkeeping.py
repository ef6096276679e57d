"""What a TaskManager remembers of the snapshots it uploaded, per job and attempt, and the choice each
new snapshot makes from it: which SSTs to reuse, which to upload. After the part of Flink's
``RocksIncrementalSnapshotStrategy`` that keeps ``uploadedSstFiles`` per completed checkpoint (and is
handed the restored SSTs by ``RocksDBIncrementalRestoreOperation``); the uploads themselves are
``weir.taskmanager.snapshot_uploads``'.

**Never reuse a key the JobManager may have deleted.** The coordinator deletes an uploaded object
only once no retained checkpoint and no acknowledged in-flight checkpoint references it
(``CheckpointCoordinator._release``): after a completion subsumes older checkpoints, after an abort
(the aborted checkpoint's objects that nothing retained references) and after a failed persist. The
latest completed checkpoint is always retained. So a key is safe to reuse while some checkpoint that
references it is certainly retained. The bookkeeping keeps, per job and attempt:

* ``confirmed``: the SSTs of the latest checkpoint it was told completed (or, at the start of an
  attempt, of the restored checkpoint: the JobManager retains it, see ``start_attempt``). That
  checkpoint stays retained until a newer one completes, and within one attempt no checkpoint
  completes without the acknowledgements of this TaskManager's subtasks: a newer completed one is
  one of the *open* checkpoints, snapshotted here and not yet reported completed or aborted
  (notifications are best effort: late, reordered or lost).
* A snapshot of checkpoint ``n`` reuses a confirmed SST only if every open checkpoint between the
  confirmed one and ``n`` references the same key: whichever of them completed, the key is in a
  retained checkpoint. A subtask snapshots its checkpoints in id order and chooses what to reuse on
  the task thread (``plan_uploads``), so an open checkpoint that may complete has recorded its keys first.
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

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import structlog

from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, TaskManagerId
from weir.core.paths import CheckpointPaths
from weir.taskmanager.snapshot_handles import KeyedStateHandle, SnapshotFile

log = structlog.get_logger("weir.taskmanager.snapshots")

StartUpload = Callable[[str, str, int], "Future[SnapshotFile]"]
"""Starts the upload of one file of a local snapshot: (object key, file name, size) -> its future."""


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
class JobBook:
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
        between the confirmed one and this one references too (see the module docstring)."""
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
class UploadPlan:
    """The asynchronous part of one subtask snapshot, decided on the task thread."""

    book: JobBook | None  # None: the snapshot belongs to no current attempt and records nothing
    reused: tuple[SnapshotFile, ...]
    waiting: tuple[Future[SnapshotFile], ...]
    started_here: tuple[Future[SnapshotFile], ...]


class ReuseBookkeeping:
    """The books of one database's snapshots, one per job (its current attempt), under one lock.

    Thread-safe: task threads call ``start_attempt``, ``adopt_restored_database`` and ``plan_uploads``;
    upload threads ``record_snapshotted``; notifications and ``forget_job`` come from RPC threads.
    """

    def __init__(self, paths: CheckpointPaths, taskmanager_id: TaskManagerId, db_incarnation: str) -> None:
        self._paths = paths
        self.taskmanager_id = taskmanager_id
        self.db_incarnation = db_incarnation
        self._lock = threading.Lock()
        self._books: dict[JobId, JobBook] = {}

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

    def _book_for(self, job_id: JobId, attempt: int | None) -> JobBook | None:
        """The job's book for ``attempt`` (None: any), started if the attempt is new; None if it is older."""
        book = self._books.get(job_id)
        if book is not None and (attempt is None or book.attempt == attempt):
            return book
        if book is not None and book.attempt is not None and attempt is not None and attempt < book.attempt:
            return None
        fresh = JobBook(attempt)
        self._books[job_id] = fresh
        log.info(
            "snapshot_attempt_started",
            job_id=job_id,
            attempt=attempt,
            previous_attempt=book.attempt if book is not None else None,
            dropped_reusable=len(book.confirmed) if book is not None else 0,
        )
        return fresh

    def _adopt_restored(self, book: JobBook, job_id: JobId, handles: Iterable[KeyedStateHandle]) -> int:
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

    def _confirm_restored(self, book: JobBook, job_id: JobId, handle: KeyedStateHandle) -> int:
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

    def forget_job(self, job_id: JobId) -> JobBook | None:
        """Drop the job's book (the one dropped, if any). Idempotent."""
        with self._lock:
            return self._books.pop(job_id, None)

    def bookkeeping(self, job_id: JobId, local_snapshots: int) -> SnapshotBookkeeping | None:
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
                local_snapshots=local_snapshots,
            )

    # -- snapshots ----------------------------------------------------------------------------------

    def plan_uploads(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        kind: CheckpointKind,
        snapshot_index: int,
        files: Mapping[str, int],
        attempt: int | None,
        start_upload: StartUpload,
        *,
        full: bool = False,
    ) -> UploadPlan:
        """Choose what of a local snapshot's ``files`` (name -> size) to reuse and start the other
        uploads; on the task thread, so in barrier order.

        ``full``: a full checkpoint (Flink's FULL_CHECKPOINT, whose files are shared forward only): it
        reuses nothing, so every SST goes up anew under its own id, and its SSTs are recorded as any
        checkpoint's, for later checkpoints to reuse once it completed."""
        job, checkpoint = job_id, checkpoint_id
        reused: list[SnapshotFile] = []
        waiting: list[Future[SnapshotFile]] = []
        started_here: list[Future[SnapshotFile]] = []
        savepoint = kind is CheckpointKind.SAVEPOINT
        with self._lock:
            book = self._book_for(job, attempt)
            current = book is not None and book.is_open(checkpoint)
            if book is not None:
                book.snapshots_began = True
                if savepoint:
                    book.savepoints.add(checkpoint)
            reuses = current and book is not None and not savepoint and not full
            reusable = book.reusable(checkpoint) if reuses and book is not None else {}
            uploads = book.uploads.setdefault(checkpoint, {}) if current and book is not None else {}
            sst_keys: set[str] = set()
            for name, size in sorted(files.items()):
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
                        job, checkpoint, self.taskmanager_id, self.db_incarnation, snapshot_index, name, kind
                    )
                future = uploads.get(key)
                if future is None:
                    future = start_upload(key, name, size)
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
        return UploadPlan(book if current else None, tuple(reused), tuple(waiting), tuple(started_here))

    def record_snapshotted(
        self, job_id: JobId, checkpoint_id: CheckpointId, plan: UploadPlan, sst: Iterable[SnapshotFile]
    ) -> None:
        """A snapshot's uploads finished: its SSTs become its checkpoint's, confirmed when it completes
        (unless its attempt or checkpoint is over by now, or it is a savepoint)."""
        with self._lock:
            book = plan.book
            if (
                book is not None
                and self._books.get(job_id) is book
                and book.is_open(checkpoint_id)
                and checkpoint_id not in book.savepoints
            ):
                book.snapshotted.setdefault(checkpoint_id, {}).update(
                    (f.file_name, replace(f, reused=False)) for f in sst
                )

    # -- notifications ------------------------------------------------------------------------------

    def _notified_book(self, job_id: JobId, attempt: int | None) -> JobBook | None:
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
        if its snapshots here reused SSTs, the abort may have released state (see the module docstring)
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
