"""Keyed state in RocksDB (rocksdict), one database per task attempt with keyed operators.

A state entry is addressed by operator uid + key group + state name + key (+ a namespace such as a
window), so a subtask's state is a set of contiguous key ranges: ``uid\\0 | key group (2 bytes)``.
RocksDB point writes cost ~5 us here, so each operator writes through a cache flushed as one
WriteBatch when it grows and always before a snapshot.
"""

from __future__ import annotations

import pickle
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from weir.core.serde import unpickle

_DELETED = object()
_MISSING = object()
_PICKLE = pickle.HIGHEST_PROTOCOL


class StateBackend:
    """One RocksDB database: the keyed state of one task attempt (``weir.taskmanager.snapshots.TaskKeyedState``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(str(path), options)
        self.lock = threading.Lock()  # serialises WriteBatch writes and checkpoints across threads

    def keyed_store(
        self, uid: str, cache_limit: int = 50_000, key_groups: tuple[int, int] | None = None
    ) -> KeyedStateStore:
        """The state of operator ``uid``; given its subtask's key groups (first, last), a store that
        finds none of its entries in the database can answer cache misses without reading it."""
        store = KeyedStateStore(self, uid, cache_limit)
        if key_groups is not None and self.range_is_empty(*key_group_range_bounds(uid, *key_groups)):
            store.cache_is_complete = True
        return store

    def range_is_empty(self, start: bytes, end: bytes) -> bool:
        for key in self.db.keys(from_key=start):  # the first key at or after start
            return not (isinstance(key, bytes) and key < end)  # raw mode: keys are bytes
        return True

    def write(self, batch: WriteBatch) -> None:
        with self.lock:
            self.db.write(batch)

    def delete_prefix_range(self, start: bytes, end: bytes) -> None:
        with self.lock:
            self.db.delete_range(start, end)

    def close(self) -> None:
        self.db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def key_group_range_bounds(namespace: str, first: int, last: int) -> tuple[bytes, bytes]:
    """The RocksDB key range [start, end) of one operator's state in key groups first..last."""
    prefix = namespace.encode("utf-8") + b"\x00"
    return prefix + first.to_bytes(2, "big"), prefix + (last + 1).to_bytes(2, "big")


class KeyedStateStore:
    """One operator's keyed state within one subtask, with a write-back cache.

    The cache is addressed by ``(name, key group, key)`` tuples, so a hit costs no byte building; the
    RocksDB key (:meth:`full_key`) is only built on a miss and when a dirty entry is written. While
    ``cache_is_complete`` (the store started on an empty key range and never evicted), a miss is an
    absent entry: a new key or window costs no database read. An entry put where the database has
    none (known from the complete cache, or from the ``get`` just before) and deleted again before the
    next flush (a window that opened and fired within one checkpoint interval) never reaches the
    database at all.
    """

    def __init__(self, backend: StateBackend, uid: str, cache_limit: int) -> None:
        self._backend = backend
        self._db = backend.db
        self._uid_prefix = uid.encode("utf-8") + b"\x00"
        self._cache: dict[tuple[str, int, bytes], Any] = {}
        self._dirty: set[tuple[str, int, bytes]] = set()
        self._fresh: set[tuple[str, int, bytes]] = set()  # put since the last flush, absent from the database
        self._absent: tuple[str, int, bytes] | None = None  # the last address get() found in no tier
        self._cache_limit = cache_limit
        self.uid = uid
        self.cache_is_complete = False

    def full_key(self, name: str, key_group: int, key: bytes) -> bytes:
        return b"".join((self._uid_prefix, key_group.to_bytes(2, "big"), name.encode("utf-8"), b"\x00", key))

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
        value = unpickle(raw)
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
                batch.put(full_key(*address), pickle.dumps(value, _PICKLE))
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
        for full, raw in self._db.items(from_key=prefix):
            if not full.startswith(prefix):
                break
            yield full[n:], unpickle(raw)

    def clear_key_groups(self, first: int, last: int) -> None:
        """Drop this operator's state for key groups first..last (before a restore)."""
        self._cache.clear()
        self._dirty.clear()
        self._fresh.clear()
        self._backend.delete_prefix_range(*key_group_range_bounds(self.uid, first, last))
