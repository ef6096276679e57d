"""Restores a subtask's keyed state from snapshot handles: download, then adopt or copy, as
``weir.taskmanager.restore_plan`` decides (Flink's ``RocksDBIncrementalRestoreOperation``).

The SSTs are downloaded into a cache keyed by object key (subtasks restoring from the same snapshot
download each file once) and hard-linked from there into a directory per snapshot with that
snapshot's private files (MANIFEST, CURRENT, OPTIONS, WAL). An adopted snapshot's directory becomes
the database (``RocksDBStateBackend.adopt``) and its key groups the subtask does not own are
range-deleted; a copied one is opened read-only and only the overlapping key ranges are copied, then
it is deleted. Every download of a restore starts at once, on the transfer threads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.state_layout import key_group_range_bounds
from weir.taskmanager.restore_plan import KeyedRestorePlan, Parts, plan_keyed_restore
from weir.taskmanager.snapshot_handles import KeyedStateHandle, KeyRanges, SnapshotError, SnapshotFile
from weir.taskmanager.state import ReadOnlyState, RocksDBStateBackend

log = structlog.get_logger("weir.taskmanager.snapshots")


@dataclass(frozen=True)
class RestoreResult:
    """What a restore did: ``copied_entries`` were copied entry by entry (0 when every snapshot used
    was adopted); ``adopted`` is the snapshot opened as the database (None: none was)."""

    plan: KeyedRestorePlan
    copied_entries: int
    downloaded_bytes: int
    duration_s: float

    @property
    def adopted(self) -> KeyedStateHandle | None:
        return self.plan.adopt.handle if self.plan.adopt is not None else None

    @property
    def handles_used(self) -> int:
        return self.plan.snapshots_used


@dataclass(frozen=True)
class _Fetch:
    """The downloads of one snapshot into ``directory`` under way."""

    handle: KeyedStateHandle
    directory: Path
    ssts: tuple[tuple[SnapshotFile, str, Future[int], bool], ...]  # file, cache key, download, started here
    private: tuple[tuple[SnapshotFile, Future[None]], ...]


class SnapshotDownloads:
    """The SST download cache of one database's restores; thread-safe."""

    def __init__(self, own_storage: CheckpointStorage, work_dir: Path, transfers: Executor) -> None:
        self._own_storage = own_storage
        self._cache_root = work_dir / "cache"
        self._restore_root = work_dir / "restore"
        shutil.rmtree(self._restore_root, ignore_errors=True)
        self._restore_root.mkdir(parents=True)
        self._transfers = transfers
        self._lock = threading.Lock()
        self._downloads: dict[str, Future[int]] = {}

    def start(self, handle: KeyedStateHandle, storage: CheckpointStorage) -> _Fetch:
        """Start every download of ``handle``'s snapshot (the cached SSTs not again)."""
        directory = self._restore_root / uuid.uuid4().hex
        directory.mkdir(parents=True)
        ssts = []
        for f in handle.sst_files:
            key = self._cache_key(f, storage)
            ssts.append((f, key, *self._cached(f, storage, key)))
        private = tuple(
            (f, self._transfers.submit(storage.get_file, f.key, directory / f.file_name)) for f in handle.db_files
        )
        return _Fetch(handle, directory, tuple(ssts), private)

    def finish(self, fetch: _Fetch) -> int:
        """Wait for ``fetch``'s downloads and link its SSTs into its directory; answers the bytes this
        restore downloaded (a file another restore downloaded counts there)."""
        fetched = 0
        for f, key, future, started_here in fetch.ssts:
            downloaded = future.result()
            fetched += downloaded if started_here else 0
            _link_or_copy(self._cache_path(key), fetch.directory / f.file_name)
        for f, done in fetch.private:
            done.result()
            fetched += f.size_bytes
        return fetched

    def discard(self, fetch: _Fetch) -> None:
        """Wait for ``fetch``'s downloads (even failed ones), then delete its directory."""
        for _, _, future, _ in fetch.ssts:
            future.exception()
        for _, done in fetch.private:
            done.exception()
        shutil.rmtree(fetch.directory, ignore_errors=True)

    def _cache_path(self, key: str) -> Path:
        return self._cache_root.joinpath(*key.split("/"))

    def _cache_key(self, sst: SnapshotFile, storage: CheckpointStorage) -> str:
        """Where ``sst`` is cached: its key, under a folder of the storage's own when it is not this
        TaskManager's (a savepoint's keys are relative to its folder, so two savepoints share names)."""
        if storage is self._own_storage:
            return sst.key
        return f"_foreign/{hashlib.sha256(storage.uri.encode()).hexdigest()[:16]}/{sst.key}"

    def _cached(self, sst: SnapshotFile, storage: CheckpointStorage, key: str) -> tuple[Future[int], bool]:
        """A future of the bytes downloaded to have ``sst`` in the cache (0: it already was), and whether
        this call started it."""
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

    def clear(self) -> int:
        """Drop every cached SST (when no restore runs); answers how many were cached."""
        with self._lock:
            cached = len(self._downloads)
            self._downloads.clear()
        shutil.rmtree(self._cache_root, ignore_errors=True)
        return cached

    def forget(self, prefix: str) -> int:
        """Drop the cached SSTs whose keys start with ``prefix`` (one job's); answers how many."""
        with self._lock:
            cached = [key for key in self._downloads if key.startswith(prefix)]
            for key in cached:
                del self._downloads[key]
        shutil.rmtree(self._cache_root.joinpath(*[p for p in prefix.split("/") if p]), ignore_errors=True)
        return len(cached)

    def close(self) -> None:
        shutil.rmtree(self._restore_root, ignore_errors=True)


class KeyedStateRestore:
    """Restores key ranges of one ``RocksDBStateBackend`` from snapshot handles (see the module)."""

    def __init__(self, backend: RocksDBStateBackend, downloads: SnapshotDownloads) -> None:
        self._backend = backend
        self._downloads = downloads

    def restore(
        self, handles: Iterable[KeyedStateHandle], ranges: KeyRanges, storage: CheckpointStorage
    ) -> RestoreResult:
        """Replace the state of ``ranges`` with what the handles hold for them; key groups no handle
        covers end up empty. Call it before any store of the database is opened."""
        started = time.perf_counter()
        wanted = tuple(ranges)
        pristine = self._backend.pristine
        plan = plan_keyed_restore(handles, wanted, may_adopt=pristine)
        adopt_fetch = self._downloads.start(plan.adopt.handle, storage) if plan.adopt is not None else None
        copy_fetches = [(copy.parts, self._downloads.start(copy.handle, storage)) for copy in plan.copies]
        downloaded = copied = 0
        try:
            if plan.adopt is not None and adopt_fetch is not None:
                downloaded += self._downloads.finish(adopt_fetch)
                self._adopt(adopt_fetch.handle, adopt_fetch.directory, plan.adopt.keep)
            elif not pristine:
                for uid, key_groups in wanted:
                    self._backend.delete_prefix_range(*key_group_range_bounds(uid, key_groups.start, key_groups.end))
            for parts, fetch in copy_fetches:
                downloaded += self._downloads.finish(fetch)
                copied += self._copy(fetch.handle, fetch.directory, parts)
        finally:
            fetches = [f for _, f in copy_fetches] + ([adopt_fetch] if adopt_fetch is not None else [])
            for fetch in fetches:
                self._downloads.discard(fetch)
        result = RestoreResult(plan, copied, downloaded, time.perf_counter() - started)
        log.info(
            "keyed_state_restored",
            adopted=_describe(plan.adopt.handle) if plan.adopt is not None else None,
            deleted_key_groups=[f"{uid}{r}" for uid, r in plan.adopt.deleted] if plan.adopt is not None else [],
            copied_from=[_describe(c.handle) for c in plan.copies],
            copied_entries=copied,
            downloaded_bytes=downloaded,
            duration_s=round(result.duration_s, 3),
        )
        return result

    def _adopt(self, handle: KeyedStateHandle, directory: Path, keep: Parts) -> None:
        try:
            self._backend.adopt(directory)
        except Exception as exc:
            raise SnapshotError(
                f"checkpoint {handle.checkpoint_id}: the snapshot {handle.snapshot_index} of TaskManager "
                f"{handle.taskmanager_id} (db {handle.db_incarnation}) does not open as a RocksDB database: {exc}"
            ) from exc
        self._backend.delete_outside([key_group_range_bounds(uid, r.start, r.end) for uid, r in keep])

    def _copy(self, handle: KeyedStateHandle, directory: Path, parts: Parts) -> int:
        try:
            source = ReadOnlyState(directory)
        except Exception as exc:
            raise SnapshotError(
                f"checkpoint {handle.checkpoint_id}: the snapshot {handle.snapshot_index} of TaskManager "
                f"{handle.taskmanager_id} (db {handle.db_incarnation}) does not open as a RocksDB database: {exc}"
            ) from exc
        try:
            return sum(
                self._backend.copy_range(source, *key_group_range_bounds(uid, r.start, r.end)) for uid, r in parts
            )
        finally:
            source.close()


def _describe(handle: KeyedStateHandle) -> str:
    return f"{handle.taskmanager_id}/{handle.db_incarnation}/{handle.checkpoint_id}/{handle.snapshot_index}"


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
