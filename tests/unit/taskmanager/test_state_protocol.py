"""The RocksDB store against the protocol operators code to (``weir.core.state_backend``): random
operations through ``KeyedStateBackend`` / ``KeyedStateStore`` only, on two operators whose uids
share a prefix, with a cache small enough to evict, compared at every read with a dictionary model
of what the protocol promises; and what was flushed is what a fresh store over the database reads."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from weir.core.ids import KeyGroup
from weir.core.keygroups import KeyGroupRange
from weir.core.state_backend import KeyedStateBackend, KeyedStateStore
from weir.taskmanager.state import RocksDBStateBackend

Address = tuple[str, int, bytes]


class ModelStore:
    """What the protocol promises of one operator's store, as a dictionary."""

    def __init__(self) -> None:
        self.entries: dict[Address, Any] = {}

    def get(self, name: str, key_group: int, key: bytes) -> Any | None:
        return self.entries.get((name, key_group, key))

    def put(self, name: str, key_group: int, key: bytes, value: Any) -> None:
        self.entries[(name, key_group, key)] = value

    def delete(self, name: str, key_group: int, key: bytes) -> None:
        self.entries.pop((name, key_group, key), None)

    def items(self, name: str, key_group: int, prefix: bytes = b"") -> Iterator[tuple[bytes, Any]]:
        found = [(k, v) for (n, kg, k), v in self.entries.items() if n == name and kg == key_group]
        return iter(sorted((k, v) for k, v in found if k.startswith(prefix)))

    def clear_key_groups(self, key_groups: KeyGroupRange) -> None:
        self.entries = {a: v for a, v in self.entries.items() if a[1] not in key_groups}


NAMES = ("win", "count", "c", "timers.event_time")
KEYS = (b"", b"a", b"ab", b"b", b"\x00", b"\x00\x01", b"\xff", b"a\x00b")
UIDS = ("op", "op2")
KEY_GROUPS = KeyGroupRange(KeyGroup(0), KeyGroup(5))


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[RocksDBStateBackend]:
    db = RocksDBStateBackend(tmp_path / "db")
    yield db
    db.close()


def open_store(backend: KeyedStateBackend, uid: str, rng: random.Random) -> KeyedStateStore:
    """A store through the protocol: sometimes told its key groups (it may then trust its cache)."""
    return backend.keyed_store(uid, key_groups=KEY_GROUPS if rng.random() < 0.5 else None)


def assert_same(store: KeyedStateStore, model: ModelStore, where: str) -> None:
    for name in NAMES:
        for kg in KEY_GROUPS:
            for key in KEYS:
                assert store.get(name, kg, key) == model.get(name, kg, key), (where, name, kg, key)
            for prefix in (b"", b"a", b"\x00"):
                assert list(store.items(name, kg, prefix)) == list(model.items(name, kg, prefix)), (where, name, kg)


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_read_as_the_model_says(backend: RocksDBStateBackend, seed: int) -> None:
    rng = random.Random(seed)
    protocol: KeyedStateBackend = backend
    models = {uid: ModelStore() for uid in UIDS}
    stores = {uid: open_store(protocol, uid, rng) for uid in UIDS}
    for step in range(400):
        uid = rng.choice(UIDS)
        store, model = stores[uid], models[uid]
        address = (rng.choice(NAMES), rng.randrange(len(KEY_GROUPS)), rng.choice(KEYS))
        match rng.choices(("put", "get", "delete", "items", "flush", "clear", "reopen"), (8, 6, 4, 1, 1, 0.3, 0.5))[0]:
            case "put":
                value = rng.choice([None, step, f"v{step}", [step], {"n": step}])
                store.put(*address, value)
                model.put(*address, value)
            case "get":
                assert store.get(*address) == model.get(*address), (seed, step, uid, address)
            case "delete":
                store.delete(*address)
                model.delete(*address)
            case "items":
                name, kg, key = address
                assert list(store.items(name, kg, key[:1])) == list(model.items(name, kg, key[:1])), (seed, step)
            case "flush":
                store.flush()
            case "clear":
                first = rng.randrange(len(KEY_GROUPS))
                cleared = KeyGroupRange(KeyGroup(first), KeyGroup(rng.randrange(first, len(KEY_GROUPS))))
                store.clear_key_groups(cleared)
                model.clear_key_groups(cleared)
            case "reopen":  # what was flushed is all a fresh store over the database reads
                store.flush()
                stores[uid] = open_store(protocol, uid, rng)
    for uid in UIDS:
        stores[uid].flush()
        assert_same(protocol.keyed_store(uid), models[uid], f"seed {seed}: a fresh store of {uid}")


def test_evicting_the_cache_loses_nothing(tmp_path: Path) -> None:
    backend = RocksDBStateBackend(tmp_path / "db")
    try:
        store, model = backend.keyed_store("op", key_groups=KEY_GROUPS, cache_limit=3), ModelStore()
        rng = random.Random(5)
        for step in range(300):
            address = (rng.choice(NAMES), rng.randrange(len(KEY_GROUPS)), rng.choice(KEYS))
            if rng.random() < 0.3:
                store.delete(*address)
                model.delete(*address)
            else:
                store.put(*address, step)
                model.put(*address, step)
            assert store.get(*address) == model.get(*address)
        assert_same(store, model, "the evicting store")
        assert_same(backend.keyed_store("op"), model, "a fresh store")
    finally:
        backend.close()
