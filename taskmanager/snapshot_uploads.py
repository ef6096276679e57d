"""Incremental snapshots of one RocksDB database to the checkpoint storage, after Flink's
``RocksIncrementalSnapshotStrategy``: the local RocksDB checkpoint and its uploads.

A snapshot has a synchronous part on the task thread (flush the memtable, create a RocksDB checkpoint:
hard links, milliseconds) and an asynchronous part on a background thread (upload the files). SST files
are immutable and their names unique within one database, so an SST that the latest completed
checkpoint already references is not uploaded again: the handle lists it as ``reused``. Which SSTs may
be reused, and what is remembered of each upload for that, is ``weir.taskmanager.snapshot_bookkeeping``'s
(only files of a checkpoint the task was told completed, or of the one its attempt restored and adopted
as the database, are: the JobManager's contract for reused keys); an SST still uploading for a
checkpoint in flight is uploaded again under the new checkpoint's key (keys carry the uploading
checkpoint id, see ``weir.core.paths``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, OperatorUid
from weir.core.keygroups import KeyGroupRange
from weir.taskmanager.snapshot_bookkeeping import ReuseBookkeeping, SnapshotBookkeeping, UploadPlan
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


class IncrementalSnapshots:
    """Snapshots one ``RocksDBStateBackend`` and uploads what the checkpoint storage lacks, as ``reuse``
    (the database's ``ReuseBookkeeping``) decides on the task thread and records once uploaded.

    Thread-safe: task threads call ``begin``; uploads run on the ``transfers`` executor (shared with
    the restores' downloads), the rest of a snapshot on a thread of its own; ``forget_job`` comes
    from RPC threads.
    """

    def __init__(
        self,
        state_backend: RocksDBStateBackend,
        reuse: ReuseBookkeeping,
        storage: CheckpointStorage,
        work_dir: Path,
        transfers: Executor,
    ) -> None:
        self._backend = state_backend
        self._reuse = reuse
        self._storage = storage
        self._snapshot_root = work_dir / "local"
        shutil.rmtree(self._snapshot_root, ignore_errors=True)
        self._snapshot_root.mkdir(parents=True)

        self._lock = threading.Lock()
        self._indexes = itertools.count()
        self._local: dict[tuple[JobId, CheckpointId], _LocalSnapshot] = {}

        self._transfers = transfers
        self._async = ThreadPoolExecutor(4, thread_name_prefix="snapshot-async")

    # -- jobs ---------------------------------------------------------------------------------------

    def forget_job(self, job_id: JobId) -> None:
        """The job ended (or none of its subtasks runs here any more): drop its bookkeeping and its
        local snapshots (each once its running upload, if any, is over: an upload that finishes later
        records nothing). Idempotent."""
        book = self._reuse.forget_job(job_id)
        with self._lock:
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
            local_snapshots = sum(1 for k in self._local if k[0] == job_id)
        return self._reuse.bookkeeping(job_id, local_snapshots)

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
        """Take the synchronous part now; the future completes when every file is in the storage.

        Call it on the task thread at the barrier, after flushing the subtask's ``KeyedStateStore``
        caches. ``ranges`` are the subtask's ``(operator uid, key group range)`` pairs; ``kind`` is the
        ``CheckpointKind`` (a savepoint's private files go under its own folder). ``attempt``: the
        subtask's execution attempt; a snapshot of an attempt older than the job's current one reuses
        nothing and records nothing (its acknowledgement is discarded), a newer one starts it
        (``start_attempt`` without restored files). None: the current attempt. ``full``: a full
        checkpoint's snapshot, which uploads every file anew (``ReuseBookkeeping.plan_uploads``).
        """
        started = time.perf_counter()
        local = self._take_local_snapshot(job_id, checkpoint_id, kind)
        try:
            plan = self._plan_uploads(local, attempt, full=full)
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

    def _plan_uploads(self, local: _LocalSnapshot, attempt: int | None, *, full: bool) -> UploadPlan:
        """Choose what to reuse and start the uploads; on the task thread, so in barrier order."""

        def start_upload(key: str, name: str, size: int) -> Future[SnapshotFile]:
            return self._transfers.submit(self._upload, key, local.path / name, name, size)

        return self._reuse.plan_uploads(
            local.job_id, local.checkpoint_id, local.kind, local.index, local.files, attempt, start_upload, full=full
        )

    def _finish_snapshot(
        self,
        local: _LocalSnapshot,
        plan: UploadPlan,
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
            taskmanager_id=self._reuse.taskmanager_id,
            db_incarnation=self._reuse.db_incarnation,
            checkpoint_id=checkpoint,
            snapshot_index=local.index,
            sst_files=tuple(sst),
            db_files=tuple(f for f in uploaded if not f.file_name.endswith(".sst")),
            ranges=ranges,
        )
        self._reuse.record_snapshotted(job, checkpoint, plan, sst)
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

    def drain(self) -> None:
        """Wait for the snapshots finishing (their uploads with them); no snapshot may begin after."""
        self._async.shutdown(wait=True)

    def close(self) -> None:
        """Delete the local snapshots: call it after ``drain`` once no upload runs."""
        shutil.rmtree(self._snapshot_root, ignore_errors=True)
