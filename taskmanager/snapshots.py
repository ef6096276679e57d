"""The keyed state of a task attempt's RocksDB in checkpoints: snapshots to the checkpoint storage and
restores from it, each done by a collaborator of :class:`RocksDBSnapshotter` (as Flink's
``RocksDBKeyedStateBackend`` hands snapshots to ``RocksIncrementalSnapshotStrategy`` and restores to
``RocksDBIncrementalRestoreOperation``):

- ``weir.taskmanager.snapshot_uploads``: incremental snapshots (a RocksDB checkpoint on the task thread,
  uploads on background threads, SSTs of a completed checkpoint reused);
- ``weir.taskmanager.snapshot_bookkeeping``: what is remembered of the uploads per job and attempt, and
  each snapshot's choice of what to reuse from it, that keeps a reused key one the JobManager has not
  deleted;
- ``weir.taskmanager.snapshot_restore`` with ``weir.taskmanager.restore_plan``: a restore downloads
  only the snapshots holding some of the wanted key groups and *adopts* the one the subtask owns most
  of (whole, at the same parallelism) as its database, with no entry copied, range-deleting the key
  groups it does not own; only the other snapshots' overlapping key groups are copied. The next
  snapshot then reuses the adopted snapshot's SSTs (when they are this job's checkpoint files);
- ``weir.taskmanager.snapshot_handles``: the handle naming a snapshot's files and key groups, and its
  JSON form in a task-state document.

Each task attempt with keyed operators has its own database and snapshotter (:class:`TaskKeyedState`),
so a snapshot holds only that subtask's key groups and uploads only its files. (A snapshotter over a
database shared by several subtasks still works: subtasks of one checkpoint share a local RocksDB
checkpoint only when nothing was written in between, same sequence number.)
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, TaskManagerId
from weir.core.paths import CheckpointPaths
from weir.taskmanager.snapshot_bookkeeping import ReuseBookkeeping, SnapshotBookkeeping
from weir.taskmanager.snapshot_handles import (
    KeyedStateHandle,
    KeyRanges,
    SnapshotError,
    SnapshotFile,
    SnapshotSource,
    keyed_state_from_document,
    keyed_state_to_document,
    relative_handle,
)
from weir.taskmanager.snapshot_restore import KeyedStateRestore, RestoreResult, SnapshotDownloads
from weir.taskmanager.snapshot_uploads import IncrementalSnapshots, SnapshotResult
from weir.taskmanager.state import RocksDBStateBackend

__all__ = [
    "KeyRanges",
    "KeyedStateHandle",
    "RestoreResult",
    "RocksDBSnapshotter",
    "SnapshotBookkeeping",
    "SnapshotError",
    "SnapshotFile",
    "SnapshotResult",
    "SnapshotSource",
    "TaskKeyedState",
    "keyed_state_from_document",
    "keyed_state_to_document",
    "relative_handle",
]

log = structlog.get_logger("weir.taskmanager.snapshots")


class RocksDBSnapshotter:
    """Snapshots and restores the keyed state of one ``RocksDBStateBackend`` (one task attempt's database).

    Thread-safe: task threads call ``begin`` and ``restore``; uploads and downloads run on
    ``transfer_threads`` background threads; notifications and ``forget_job`` come from RPC threads.
    What a snapshot may reuse is the subject of ``weir.taskmanager.snapshot_bookkeeping``'s docstring.
    """

    def __init__(
        self,
        state_backend: RocksDBStateBackend,
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
        # Next to the database, on the same file system: RocksDB checkpoints and an adopted restore are
        # hard links and renames.
        self.work_dir = work_dir or state_backend.path.with_name(state_backend.path.name + ".snapshots")
        self._transfers = ThreadPoolExecutor(transfer_threads, thread_name_prefix="snapshot-transfer")
        self._reuse = ReuseBookkeeping(paths, taskmanager_id, self.db_incarnation)
        self._uploads = IncrementalSnapshots(state_backend, self._reuse, storage, self.work_dir, self._transfers)
        self._downloads = SnapshotDownloads(storage, self.work_dir, self._transfers)
        self._restores = KeyedStateRestore(state_backend, self._downloads)

    # -- attempts and jobs --------------------------------------------------------------------------

    def start_attempt(self, job_id: JobId, attempt: int, restored: Iterable[KeyedStateHandle] = ()) -> None:
        """See ``ReuseBookkeeping.start_attempt``: call it before the attempt's restore."""
        self._reuse.start_attempt(job_id, attempt, restored)

    def forget_job(self, job_id: JobId) -> None:
        """The job ended (or none of its subtasks runs here any more): drop its bookkeeping, its local
        snapshots and its cached downloads. Idempotent. Call it once no subtask of the job runs or
        restores on this database; the job's keys in the database are not the snapshotter's."""
        self._uploads.forget_job(job_id)
        cached = self._downloads.forget(self._paths.job_dir(job_id))
        if cached:
            log.info("snapshot_restore_cache_forgotten", job_id=job_id, cached_files=cached)

    def bookkeeping(self, job_id: JobId) -> SnapshotBookkeeping | None:
        """What is remembered of the job's uploads; None once forgotten (or never snapshotted)."""
        return self._uploads.bookkeeping(job_id)

    # -- snapshots ----------------------------------------------------------------------------------

    def begin(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        ranges: KeyRanges,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        *,
        attempt: int | None = None,
        full: bool = False,
    ) -> Future[SnapshotResult]:
        """See ``IncrementalSnapshots.begin``: the synchronous part now, the uploads in the future."""
        return self._uploads.begin(job_id, checkpoint_id, ranges, kind, attempt=attempt, full=full)

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

    def notify_checkpoint_complete(
        self, job_id: JobId, checkpoint_id: CheckpointId, *, attempt: int | None = None
    ) -> None:
        self._reuse.notify_checkpoint_complete(job_id, checkpoint_id, attempt=attempt)

    def notify_checkpoint_aborted(
        self, job_id: JobId, checkpoint_id: CheckpointId, *, attempt: int | None = None
    ) -> None:
        self._reuse.notify_checkpoint_aborted(job_id, checkpoint_id, attempt=attempt)

    # -- restore ------------------------------------------------------------------------------------

    def restore(
        self,
        handles: Iterable[KeyedStateHandle],
        ranges: KeyRanges,
        storage: CheckpointStorage | None = None,
        *,
        job_id: JobId | None = None,
        attempt: int | None = None,
    ) -> RestoreResult:
        """Replace the state of ``ranges`` in the live database with what the handles hold for them.

        ``handles`` may be every handle of the checkpoint: only those overlapping ``ranges`` are read.
        A pristine database is replaced by the snapshot the subtask owns most of (see
        ``weir.taskmanager.restore_plan``); the rest is copied. Key groups no handle covers end up
        empty. Call it before any ``KeyedStateStore`` of the database is opened. ``storage``: where
        the handles' keys are (a savepoint's folder, another job's storage); default this TaskManager's
        checkpoint storage. ``job_id``: the handles are that job's own checkpoint, restored by its
        attempt ``attempt``: the adopted snapshot's SSTs are reused by the attempt's first snapshot
        (another job's, or a savepoint's, never are).
        """
        source = storage if storage is not None else self._storage
        result = self._restores.restore(handles, ranges, source)
        adopted = result.adopted
        if job_id is not None and adopted is not None and source is self._storage:
            self._reuse.adopt_restored_database(job_id, attempt, adopted)
        return result

    def clear_restore_cache(self) -> None:
        """Drop every downloaded SST (call once every subtask of a deployment has restored, when no
        restore runs: a running one may miss files). Idempotent; ``forget_job`` drops one job's."""
        cached = self._downloads.clear()
        if cached:
            log.info("snapshot_restore_cache_cleared", files=cached)

    # -- metrics and lifecycle ----------------------------------------------------------------------

    def live_sst_bytes(self) -> int:
        """Total size of the live database's SST files (the state size metric)."""
        return self._backend.live_sst_bytes()

    def close(self) -> None:
        """Wait for running uploads and downloads, then stop the background threads."""
        self._uploads.drain()
        self._transfers.shutdown(wait=True)
        self._uploads.close()
        self._downloads.close()


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
        self.backend = RocksDBStateBackend(directory / "state.db")
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
