"""Incremental snapshots of the TaskManager's RocksDB to the checkpoint storage, and restores from them.

A snapshot has a synchronous part on the task thread (flush the memtable, create a RocksDB checkpoint:
hard links, milliseconds) and an asynchronous part on a background thread (upload the files). SST files
are immutable and their names unique within one database incarnation, so an SST that the latest
completed checkpoint already references is not uploaded again: the handle lists it as ``reused``. Only
files of a checkpoint the task was told completed are reused, which is the JobManager's contract for
reused keys; an SST still uploading for a checkpoint in flight is uploaded again under the new
checkpoint's key (keys carry the uploading checkpoint id, see ``weir.paths``).

One database holds the state of every subtask on the TaskManager. Each subtask snapshots at its own
barrier: subtasks of one checkpoint share a local RocksDB checkpoint only when nothing was written in
between (same sequence number). Sharing one taken at an earlier subtask's barrier would lose what a later
subtask wrote before its own barrier.

A restore opens each needed snapshot as a read-only database built from its downloaded files, and copies
the restored subtask's key ranges into the live database after deleting those ranges.
"""

from __future__ import annotations

import enum
import itertools
import os
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from rocksdict import AccessType, Checkpoint, Options, Rdict, ReadOptions, WriteBatch

from connectors.checkpoint_storage import CheckpointStorage
from taskmanager.state import StateBackend, key_group_range_bounds
from weir.errors import Fault, WeirError
from weir.ids import CheckpointId, JobId, KeyGroup, OperatorUid, TaskManagerId
from weir.keygroups import KeyGroupRange
from weir.paths import CheckpointPaths

KeyRanges = Sequence[tuple[OperatorUid, KeyGroupRange]]

_RESTORE_BATCH = 10_000  # entries per WriteBatch when copying restored state into the live database


class SnapshotError(WeirError):
    """A local RocksDB snapshot or restore failed (disk full, corrupt download...)."""

    fault: Fault = "internal"


@dataclass(frozen=True)
class SnapshotFile:
    """One uploaded file of a snapshot: its object key, size, and its name in the RocksDB directory.

    ``reused``: uploaded for an earlier, completed checkpoint. The fields match
    ``jobmanager.checkpointing.pending.StateObject`` (key, size_bytes, reused).
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


class RocksDBSnapshotter:
    """Snapshots and restores the keyed state of one TaskManager's ``StateBackend``.

    Thread-safe: task threads call ``begin`` and ``restore`` concurrently; uploads and downloads run on
    ``transfer_threads`` background threads.
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
        # Uploads started per checkpoint, by object key: subtasks of one checkpoint upload a file once.
        self._uploads: dict[tuple[JobId, CheckpointId], dict[str, Future[SnapshotFile]]] = defaultdict(dict)
        # SSTs referenced by the finished snapshots of a checkpoint, by file name: confirmed on completion.
        self._snapshotted: dict[tuple[JobId, CheckpointId], dict[str, SnapshotFile]] = defaultdict(dict)
        # SSTs of the latest completed checkpoint, per job: the only ones a new snapshot may reuse.
        self._confirmed: dict[JobId, tuple[CheckpointId, dict[str, SnapshotFile]]] = {}
        self._downloads: dict[str, Future[int]] = {}

        self._transfers = ThreadPoolExecutor(transfer_threads, thread_name_prefix="snapshot-transfer")
        self._async = ThreadPoolExecutor(4, thread_name_prefix="snapshot-async")

    # -- snapshots ----------------------------------------------------------------------------------

    def begin(
        self,
        job_id: JobId,
        checkpoint_id: CheckpointId,
        ranges: KeyRanges,
        kind: str | enum.Enum = "checkpoint",
    ) -> Future[SnapshotResult]:
        """Take the synchronous part now; the future completes when every file is in the storage.

        Call it on the task thread at the barrier, after flushing the subtask's ``KeyedStateStore``
        caches. ``ranges`` are the subtask's ``(operator uid, key group range)`` pairs; ``kind`` is the
        ``CheckpointKind`` (a savepoint's private files go under its own folder).
        """
        started = time.perf_counter()
        local = self._take_local_snapshot(job_id, checkpoint_id, kind)
        sync_duration = time.perf_counter() - started
        try:
            return self._async.submit(self._upload_snapshot, local, tuple(ranges), sync_duration)
        except BaseException:
            self._release(local)
            raise

    def snapshot(
        self, job_id: JobId, checkpoint_id: CheckpointId, ranges: KeyRanges, timeout: float | None = None
    ) -> KeyedStateHandle:
        """``begin`` and wait for the upload."""
        return self.begin(job_id, checkpoint_id, ranges).result(timeout).handle

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

    def _upload_snapshot(
        self, local: _LocalSnapshot, ranges: tuple[tuple[OperatorUid, KeyGroupRange], ...], sync_duration: float
    ) -> SnapshotResult:
        started = time.perf_counter()
        job, checkpoint = local.job_id, local.checkpoint_id
        try:
            reused: list[SnapshotFile] = []
            waiting: list[Future[SnapshotFile]] = []
            started_here: list[Future[SnapshotFile]] = []
            with self._lock:
                latest = self._confirmed.get(job)
                confirmed = latest[1] if latest is not None else {}
                uploads = self._uploads[(job, checkpoint)]
                for name, size in sorted(local.files.items()):
                    if name.endswith(".sst"):
                        known = confirmed.get(name)
                        if known is not None and known.size_bytes == size:
                            reused.append(replace(known, reused=True))
                            continue
                        key = self._paths.shared_sst(job, self.taskmanager_id, self.db_incarnation, checkpoint, name)
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
            wait(waiting)  # even when one fails: the others read files of this local snapshot
            uploaded = [f.result() for f in waiting]
        finally:
            # An upload reads the local snapshot of the call that started it, which waits for it first.
            self._release(local)

        sst = sorted([*reused, *(f for f in uploaded if f.file_name.endswith(".sst"))], key=lambda f: f.file_name)
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
            self._snapshotted[(job, checkpoint)].update((f.file_name, replace(f, reused=False)) for f in sst)
        own = [f.result() for f in started_here]
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

    def notify_checkpoint_complete(self, job_id: JobId, checkpoint_id: CheckpointId) -> None:
        """The checkpoint completed: its SSTs become the ones later snapshots reuse (idempotent)."""
        with self._lock:
            files = self._snapshotted.get((job_id, checkpoint_id))
            latest = self._confirmed.get(job_id)
            if files is not None and (latest is None or latest[0] < checkpoint_id):
                self._confirmed[job_id] = (checkpoint_id, dict(files))
            for table in (self._snapshotted, self._uploads):
                for job, checkpoint in [k for k in table if k[0] == job_id and k[1] <= checkpoint_id]:
                    del table[(job, checkpoint)]

    def notify_checkpoint_aborted(self, job_id: JobId, checkpoint_id: CheckpointId) -> None:
        """The checkpoint was aborted: the JobManager may delete its uploads, so they are never reused."""
        with self._lock:
            self._snapshotted.pop((job_id, checkpoint_id), None)
            self._uploads.pop((job_id, checkpoint_id), None)

    def forget_job(self, job_id: JobId) -> None:
        """The job ended or was redeployed elsewhere: drop what is remembered of its uploads."""
        with self._lock:
            self._confirmed.pop(job_id, None)
            for table in (self._snapshotted, self._uploads):
                for key in [k for k in table if k[0] == job_id]:
                    del table[key]

    # -- restore ------------------------------------------------------------------------------------

    def restore(self, handles: Iterable[KeyedStateHandle], ranges: KeyRanges) -> RestoreResult:
        """Replace the state of ``ranges`` in the live database with what the handles hold for them.

        ``handles`` may be every handle of the checkpoint: only those overlapping ``ranges`` are read,
        and only their files not already in the local cache are downloaded. Key groups no handle covers
        end up empty. Call it before the subtask's ``KeyedStateStore`` caches hold anything.
        """
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
            copied, fetched = self._restore_snapshot(same_snapshot[0], sorted(parts, key=_range_sort_key))
            entries += copied
            downloaded += fetched
        return RestoreResult(entries, sum(len(g) for g in groups.values()), downloaded, time.perf_counter() - started)

    def _restore_snapshot(
        self, handle: KeyedStateHandle, parts: list[tuple[OperatorUid, KeyGroupRange]]
    ) -> tuple[int, int]:
        directory = self._restore_root / uuid.uuid4().hex
        directory.mkdir(parents=True)
        try:
            sst_downloads = [(f, self._cached(f)) for f in handle.sst_files]
            meta_downloads = [
                (f, self._transfers.submit(self._storage.get_file, f.key, directory / f.file_name))
                for f in handle.db_files
            ]
            fetched = 0
            for f, (future, started_here) in sst_downloads:
                downloaded = future.result()
                fetched += downloaded if started_here else 0  # another restore's download counts there
                _link_or_copy(self._cache_path(f.key), directory / f.file_name)
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

    def _cached(self, sst: SnapshotFile) -> tuple[Future[int], bool]:
        """A future of the bytes downloaded to have ``sst`` in the cache (0: it already was), and whether
        this call started it."""
        with self._lock:
            future = self._downloads.get(sst.key)
            if future is None or (future.done() and future.exception() is not None):
                future = self._transfers.submit(self._download, sst)
                self._downloads[sst.key] = future
                return future, True
            return future, False

    def _download(self, sst: SnapshotFile) -> int:
        path = self._cache_path(sst.key)
        if path.is_file() and path.stat().st_size == sst.size_bytes:
            return 0
        self._storage.get_file(sst.key, path)
        size = path.stat().st_size
        if size != sst.size_bytes:
            path.unlink(missing_ok=True)
            raise SnapshotError(f"downloaded {sst.key} has {size} bytes, the snapshot handle says {sst.size_bytes}")
        return size

    def clear_restore_cache(self) -> None:
        """Drop downloaded SSTs (call once every subtask of a deployment has restored)."""
        with self._lock:
            self._downloads.clear()
        shutil.rmtree(self._cache_root, ignore_errors=True)

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


def _range_bounds(uid: OperatorUid, key_groups: KeyGroupRange) -> tuple[bytes, bytes]:
    return key_group_range_bounds(uid, key_groups.start, key_groups.end)


def _range_sort_key(part: tuple[OperatorUid, KeyGroupRange]) -> tuple[str, KeyGroup]:
    return part[0], part[1].start


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
