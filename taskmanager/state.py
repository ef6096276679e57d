"""Keyed state in RocksDB (rocksdict), one database per task attempt with keyed operators: the
implementation of ``weir.core.state_backend.KeyedStateBackend`` (Flink's ``RocksDBKeyedStateBackend``).

The bytes of every entry are ``weir.core.state_layout``'s: an entry is addressed by operator uid +
key group + state name + state key, so a subtask's state is a set of contiguous key ranges, and a
value is a pickle. RocksDB point writes cost ~5 us here, so each operator writes through a cache
flushed as one WriteBatch when it grows and always before a snapshot. This module is the only one
that talks to RocksDB (an import-linter contract): the snapshots (``weir.taskmanager.snapshots``)
take RocksDB checkpoints, open a downloaded one as the database, clip it and copy key ranges through
:class:`RocksDBStateBackend`, and ``weir savepoint`` reads a downloaded snapshot through
:class:`ReadOnlyState`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import structlog
from rocksdict import AccessType, Checkpoint, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from weir.core.keygroups import KeyGroupRange
from weir.core.state_layout import (
    KeyedEntry,
    dump_value,
    entry_key,
    key_group_range_bounds,
    load_value,
    operator_prefix,
    parse_entry,
)

_DELETED = object()
_MISSING = object()
_COPY_BATCH: Final = 10_000  # entries per WriteBatch when a restore copies a snapshot's key range


log = structlog.get_logger("weir.taskmanager.state")

DEFERRED_COMPACTION_L0_FILES: Final = 12
"""Level-0 files at which an adopted database's deferred compactions run anyway (RocksDB slows
writes down at 20)."""


class StateBackendError(RuntimeError):
    """The database cannot do what was asked in its present state (a programming error of the caller)."""


class RocksDBStateBackend:
    """One RocksDB database: the keyed state of one task attempt (``weir.taskmanager.snapshots.TaskKeyedState``).

    A database created empty stays *pristine* until something is written, a checkpoint is taken or a
    store is handed out; only then may a restore replace it with a downloaded snapshot's files
    (:meth:`adopt`), as Flink's ``RocksDBIncrementalRestoreOperation`` opens a single state handle's
    files as the new instance instead of copying its entries.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._options = Options(raw_mode=True)
        self._options.create_if_missing(True)
        self.db = Rdict(str(path), self._options)
        self.lock = threading.Lock()  # serialises WriteBatch writes and checkpoints across threads
        self._pristine = not any(True for _ in self.db.keys())
        self.compactions_deferred = False  # an adopted snapshot's files, kept as they are until a checkpoint

    @property
    def pristine(self) -> bool:
        """Empty as created: nothing written, no checkpoint taken, no store handed out."""
        return self._pristine

    def keyed_store(
        self, uid: str, *, key_groups: KeyGroupRange | None = None, cache_limit: int = 50_000
    ) -> RocksDBKeyedStateStore:
        """The state of operator ``uid``; given its subtask's key groups, a store that finds none of
        its entries in the database can answer cache misses without reading it."""
        self._pristine = False  # a store holds the database open: it is never replaced under one
        store = RocksDBKeyedStateStore(self, uid, cache_limit)
        if key_groups is not None:
            bounds = key_group_range_bounds(uid, key_groups.start, key_groups.end)
            store.cache_is_complete = self.range_is_empty(*bounds)
        return store

    def range_is_empty(self, start: bytes, end: bytes) -> bool:
        for key in self.db.keys(from_key=start):  # the first key at or after start
            return not (isinstance(key, bytes) and key < end)  # raw mode: keys are bytes
        return True

    def write(self, batch: WriteBatch) -> None:
        with self.lock:
            self._pristine = False
            self.db.write(batch)
            if self.compactions_deferred and self._level0_files() >= DEFERRED_COMPACTION_L0_FILES:
                self._resume_compactions("level-0 files")

    def _level0_files(self) -> int:
        return int(self.db.property_int_value("rocksdb.num-files-at-level0") or 0)

    def _resume_compactions(self, why: str) -> None:
        """Compactions deferred since an adopted restore run again (call it holding the lock)."""
        self.db.set_options({"disable_auto_compactions": "false"})
        self.compactions_deferred = False
        log.info("state_compactions_resumed", path=str(self.path), reason=why)

    def delete_prefix_range(self, start: bytes, end: bytes) -> None:
        with self.lock:
            self._pristine = False
            self.db.delete_range(start, end)

    # -- snapshots and restores (``weir.taskmanager.snapshots``) ---------------------------------------

    @contextlib.contextmanager
    def quiesced(self) -> Iterator[int]:
        """Holds every write off, with the memtable flushed; yields the latest sequence number (two
        snapshots at the same number hold the same data). Take a checkpoint inside it."""
        with self.lock:
            self.db.flush()
            yield self.db.latest_sequence_number()

    def create_checkpoint(self, directory: Path) -> None:
        """A RocksDB checkpoint of the database in ``directory`` (hard links to its SST files); call it
        inside :meth:`quiesced`."""
        self._pristine = False
        Checkpoint(self.db).create_checkpoint(str(directory))
        if self.compactions_deferred:  # the first checkpoint after the restore has the restored files
            self._resume_compactions("checkpoint")

    def adopt(self, directory: Path) -> None:
        """Make the RocksDB files in ``directory`` (a downloaded checkpoint: its SSTs, MANIFEST, CURRENT,
        OPTIONS) this database; ``directory`` is moved into place. Only a pristine database is replaced.

        Compactions wait until the next checkpoint is taken (or level 0 holds
        ``DEFERRED_COMPACTION_L0_FILES`` files): opened, the database at once runs the compaction its
        files are due for (level 0 at its trigger after the memtable flushes of incremental
        checkpoints), which rewrites every SST of random keys; done before the first checkpoint after
        the restore, that checkpoint uploads the whole state again instead of reusing the restored
        files, and the exactly-once sinks' first commit after a recovery waits for that upload."""
        with self.lock:
            if not self._pristine:
                raise StateBackendError(f"{self.path}: only a pristine database can be replaced by a restored one")
            self.db.close()
            shutil.rmtree(self.path, ignore_errors=True)
            try:
                os.replace(directory, self.path)
            except OSError:  # another file system: move (copies)
                shutil.move(str(directory), str(self.path))
            deferred = Options(raw_mode=True)  # column-family options: given for "default", not the OPTIONS file's
            deferred.set_disable_auto_compactions(True)
            self.db = Rdict(str(self.path), self._options, column_families={"default": deferred})
            self.compactions_deferred = True
            self._pristine = False

    def delete_outside(self, keep: Sequence[tuple[bytes, bytes]]) -> int:
        """Range-delete every key outside the ``[start, end)`` ranges of ``keep`` (a restored snapshot's
        key groups this subtask does not own, as Flink's ``clipDBWithKeyGroupRange``); only the gaps
        that hold keys get a tombstone. Answers how many ranges were deleted."""
        with self.lock:
            cursor, gaps = b"", []
            for start, end in sorted(keep):
                if cursor < start:
                    gaps.append((cursor, start))
                cursor = max(cursor, end)
            last = self._last_key()
            if last is not None and last >= cursor:
                gaps.append((cursor, last + b"\x00"))
            deleted = 0
            for start, end in gaps:
                if not self.range_is_empty(start, end):
                    self.db.delete_range(start, end)
                    deleted += 1
            if deleted:
                self._pristine = False
            return deleted

    def _last_key(self) -> bytes | None:
        it = self.db.iter()
        it.seek_to_last()
        key = it.key() if it.valid() else None
        del it
        return key if isinstance(key, bytes) else None

    def copy_range(self, source: ReadOnlyState, start: bytes, end: bytes) -> int:
        """Copy the entries of ``source`` in ``[start, end)`` into this database (a restore's partial
        overlap, entry by entry, without the write-ahead log: a restore that fails is discarded with
        its database). Answers how many."""
        options = WriteOptions()
        options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; the stub says method
        copied = pending = 0
        batch = WriteBatch(raw_mode=True)
        for key, value in source.raw_items(start, end):
            batch.put(key, value)
            pending += 1
            if pending == _COPY_BATCH:
                self._write_unlogged(batch, options)
                copied += pending
                batch, pending = WriteBatch(raw_mode=True), 0
        if pending:
            self._write_unlogged(batch, options)
            copied += pending
        return copied

    def _write_unlogged(self, batch: WriteBatch, options: WriteOptions) -> None:
        with self.lock:
            self._pristine = False
            self.db.write(batch, options)

    def live_sst_bytes(self) -> int:
        """Total size of the database's live SST files (the state size metric; any thread: not while
        a restore replaces the database)."""
        with self.lock:
            value = self.db.property_int_value("rocksdb.live-sst-files-size")
        return int(value or 0)

    def close(self) -> None:
        self.db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


class RocksDBKeyedStateStore:
    """One operator's keyed state within one subtask, with a write-back cache (a
    ``weir.core.state_backend.KeyedStateStore``).

    The cache is addressed by ``(name, key group, key)`` tuples, so a hit costs no byte building; the
    RocksDB key (:meth:`full_key`) is only built on a miss and when a dirty entry is written. While
    ``cache_is_complete`` (the store started on an empty key range and never evicted), a miss is an
    absent entry: a new key or window costs no database read. An entry put where the database has
    none (known from the complete cache, or from the ``get`` just before) and deleted again before the
    next flush (a window that opened and fired within one checkpoint interval) never reaches the
    database at all.
    """

    def __init__(self, backend: RocksDBStateBackend, uid: str, cache_limit: int) -> None:
        self._backend = backend
        self._db = backend.db
        self._operator = operator_prefix(uid)
        self._cache: dict[tuple[str, int, bytes], Any] = {}
        self._dirty: set[tuple[str, int, bytes]] = set()
        self._fresh: set[tuple[str, int, bytes]] = set()  # put since the last flush, absent from the database
        self._absent: tuple[str, int, bytes] | None = None  # the last address get() found in no tier
        self._cache_limit = cache_limit
        self.uid = uid
        self.cache_is_complete = False

    def full_key(self, name: str, key_group: int, key: bytes) -> bytes:
        return entry_key(self._operator, key_group, name, key)

    def get(self, name: str, key_group: int, key: bytes) -> Any | None:
        address = (name, key_group, key)
        cached = self._cache.get(address, _MISSING)
        if cached is not _MISSING:  # a cached None is a value, not a miss
            return None if cached is _DELETED else cached
        if self.cache_is_complete:
            return None
        raw = self._db.get(self.full_key(name, key_group, key))
        if raw is None:
            self._absent = address
            return None
        value = load_value(raw)
        self._cache[address] = value
        if len(self._cache) > self._cache_limit:
            self._flush_and_evict()
        return value

    def put(self, name: str, key_group: int, key: bytes, value: Any) -> None:
        address = (name, key_group, key)
        if address not in self._cache and (self.cache_is_complete or address == self._absent):
            self._fresh.add(address)
        self._cache[address] = value
        self._dirty.add(address)
        if len(self._cache) > self._cache_limit:
            self._flush_and_evict()

    def delete(self, name: str, key_group: int, key: bytes) -> None:
        address = (name, key_group, key)
        if address in self._fresh:  # never written: nothing to delete in the database
            self._fresh.discard(address)
            self._dirty.discard(address)
            del self._cache[address]
            return
        self._cache[address] = _DELETED
        self._dirty.add(address)
        if len(self._cache) > self._cache_limit:
            self._flush_and_evict()

    def _flush_and_evict(self) -> None:
        self.flush()
        self._cache.clear()
        self.cache_is_complete = False

    def flush(self) -> int:
        """Write every dirty entry in one WriteBatch; returns how many were written."""
        self._fresh.clear()
        self._absent = None
        if not self._dirty:
            return 0
        batch = WriteBatch(raw_mode=True)
        cache, full_key = self._cache, self.full_key
        for address in self._dirty:
            value = cache[address]
            if value is _DELETED:
                batch.delete(full_key(*address))
                del cache[address]
            else:
                batch.put(full_key(*address), dump_value(value))
        written = len(self._dirty)
        self._dirty.clear()
        self._backend.write(batch)
        return written

    def items(self, name: str, key_group: int, prefix: bytes = b"") -> Iterator[tuple[bytes, Any]]:
        """Every (key, value) of state ``name`` in one key group whose key starts with ``prefix``,
        after flushing the cache."""
        self.flush()
        n = len(self.full_key(name, key_group, b""))
        prefix = self.full_key(name, key_group, prefix)
        stored: Iterable[tuple[Any, Any]] = self._db.items(from_key=prefix)  # raw mode: bytes
        for full, raw in stored:
            if not full.startswith(prefix):
                break
            yield full[n:], load_value(raw)

    def clear_key_groups(self, key_groups: KeyGroupRange) -> None:
        """Drop this operator's state in ``key_groups``, cached and stored; what the cache holds of
        other key groups (written or not) stays, and a complete cache stays complete."""
        for address in [a for a in self._cache if a[1] in key_groups]:
            del self._cache[address]
        self._dirty = {a for a in self._dirty if a[1] not in key_groups}
        self._fresh = {a for a in self._fresh if a[1] not in key_groups}
        if self._absent is not None and self._absent[1] in key_groups:
            self._absent = None
        self._backend.delete_prefix_range(*key_group_range_bounds(self.uid, key_groups.start, key_groups.end))


class ReadOnlyState:
    """A RocksDB snapshot (a checkpoint's files, downloaded) opened read-only: what ``weir savepoint``
    scans, entry by entry, decoded by ``weir.core.state_layout``. Close it (or use it in a ``with``)."""

    def __init__(self, directory: Path) -> None:
        self._db = Rdict(str(directory), Options(raw_mode=True), access_type=AccessType.read_only())

    def raw_items(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) in ``[start, end)`` as stored, in key order."""
        read = ReadOptions()
        read.set_iterate_upper_bound(end)
        stored: Iterable[tuple[Any, Any]] = self._db.items(from_key=start, read_opt=read)  # raw mode: bytes
        yield from stored

    def entries(self, uid: str, key_groups: KeyGroupRange, *, values: bool = True) -> Iterator[KeyedEntry]:
        """Every entry of operator ``uid`` in ``key_groups``, in key order (values empty unless
        ``values``). Raises SerializationError for a key that is not one of the operator's entries."""
        start, end = key_group_range_bounds(uid, key_groups.start, key_groups.end)
        read = ReadOptions()
        read.set_iterate_upper_bound(end)
        operator = operator_prefix(uid)
        pairs: Iterable[tuple[Any, Any]] = (  # raw mode: bytes
            self._db.items(from_key=start, read_opt=read)
            if values
            else ((k, b"") for k in self._db.keys(from_key=start, read_opt=read))
        )
        for full, raw in pairs:
            yield parse_entry(operator, full, raw)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ReadOnlyState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
