"""Keyed state in RocksDB behind a write-back cache."""

from __future__ import annotations

from pathlib import Path

from rocksdict import WriteBatch

from tests.integration.polling import poll
from weir.core.ids import KeyGroup
from weir.core.keygroups import KeyGroupRange
from weir.taskmanager.state import DEFERRED_COMPACTION_L0_FILES, RocksDBKeyedStateStore, RocksDBStateBackend


def groups(first: int, last: int) -> KeyGroupRange:
    return KeyGroupRange(KeyGroup(first), KeyGroup(last))


def fresh_view(backend: RocksDBStateBackend, uid: str = "op") -> RocksDBKeyedStateStore:
    """A second store over the same database: it sees only what was flushed."""
    return backend.keyed_store(uid)


def test_writes_stay_in_the_cache_until_flushed(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    store.put("count", 3, b"k1", 10)
    store.put("count", 3, b"k2", {"nested": [1, 2]})
    assert store.get("count", 3, b"k1") == 10
    assert fresh_view(state_backend).get("count", 3, b"k1") is None
    assert store.flush() == 2
    assert store.flush() == 0
    view = fresh_view(state_backend)
    assert view.get("count", 3, b"k1") == 10
    assert view.get("count", 3, b"k2") == {"nested": [1, 2]}
    assert view.get("count", 4, b"k1") is None  # another key group
    assert view.get("other", 3, b"k1") is None  # another state name


def test_overwrites_flush_the_latest_value(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    for value in range(5):
        store.put("v", 0, b"k", value)
    assert store.flush() == 1
    assert fresh_view(state_backend).get("v", 0, b"k") == 4


def test_deletes_are_written_back_too(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    store.put("v", 1, b"a", "A")
    store.put("v", 1, b"b", "B")
    store.flush()
    store.delete("v", 1, b"a")
    assert store.get("v", 1, b"a") is None
    assert fresh_view(state_backend).get("v", 1, b"a") == "A"
    store.flush()
    assert fresh_view(state_backend).get("v", 1, b"a") is None
    assert fresh_view(state_backend).get("v", 1, b"b") == "B"
    assert store.get("v", 1, b"a") is None


def test_a_put_deleted_before_the_flush_never_reaches_the_database(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    store.put("v", 1, b"a", "A")
    store.delete("v", 1, b"a")
    store.flush()
    assert list(fresh_view(state_backend).items("v", 1)) == []


def test_none_is_a_value_and_does_not_resurrect_the_old_one(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    store.put("v", 2, b"k", "old")
    store.flush()
    store.put("v", 2, b"k", None)
    assert store.get("v", 2, b"k") is None
    store.flush()
    assert fresh_view(state_backend).get("v", 2, b"k") is None
    assert list(fresh_view(state_backend).items("v", 2)) == [(b"k", None)]


def test_items_are_one_key_group_sorted_by_key_after_a_flush(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    other_op = state_backend.keyed_store("op2")
    for key in (b"m", b"a", b"z", b"\x00", b"ab"):
        store.put("win", 5, key, key.decode("latin-1"))
    store.put("win", 4, b"before", 0)
    store.put("win", 6, b"after", 0)
    store.put("window", 5, b"a", "other state")
    other_op.put("win", 5, b"a", "other operator")
    other_op.flush()
    # items() flushes the store's own cache first.
    assert list(store.items("win", 5)) == [(b"\x00", "\x00"), (b"a", "a"), (b"ab", "ab"), (b"m", "m"), (b"z", "z")]
    assert list(store.items("win", 7)) == []
    assert list(store.items("window", 5)) == [(b"a", "other state")]


def test_clear_key_groups_drops_only_that_range_of_this_operator(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op")
    other_op = state_backend.keyed_store("op2")
    for kg in range(6):
        store.put("s", kg, b"k", kg)
        other_op.put("s", kg, b"k", kg)
    store.flush()
    other_op.flush()
    store.put("s", 2, b"unflushed", "gone too")
    store.clear_key_groups(groups(1, 3))
    assert [kg for kg in range(6) if list(store.items("s", kg))] == [0, 4, 5]
    assert store.get("s", 2, b"unflushed") is None
    assert [kg for kg in range(6) if list(other_op.items("s", kg))] == list(range(6))


def test_clear_key_groups_keeps_what_the_cache_holds_of_other_key_groups(state_backend: RocksDBStateBackend) -> None:
    """An unflushed write outside the cleared range survives it, and a store whose cache is complete
    still reads what it holds there (it used to drop its whole cache and answer None)."""
    store = state_backend.keyed_store("op", key_groups=groups(0, 5))
    assert store.cache_is_complete
    store.put("s", 1, b"flushed", "in the database")
    store.flush()
    store.put("s", 1, b"dirty", "in the cache only")
    store.put("s", 3, b"dirty", "cleared")
    store.clear_key_groups(groups(3, 4))
    assert store.get("s", 1, b"flushed") == "in the database"
    assert store.get("s", 1, b"dirty") == "in the cache only"
    assert store.get("s", 3, b"dirty") is None
    store.flush()
    view = fresh_view(state_backend)
    assert (view.get("s", 1, b"flushed"), view.get("s", 1, b"dirty"), view.get("s", 3, b"dirty")) == (
        "in the database",
        "in the cache only",
        None,
    )


def test_the_cache_is_flushed_when_it_outgrows_its_limit(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op", cache_limit=3)
    for i in range(3):
        store.put("s", 0, bytes([i]), i)
    assert fresh_view(state_backend).get("s", 0, b"\x00") is None
    store.put("s", 0, b"\x03", 3)  # the fourth entry: over the limit
    assert [v for _, v in fresh_view(state_backend).items("s", 0)] == [0, 1, 2, 3]
    assert [store.get("s", 0, bytes([i])) for i in range(4)] == [0, 1, 2, 3]


def test_reads_fill_the_cache_within_its_limit(state_backend: RocksDBStateBackend) -> None:
    writer = state_backend.keyed_store("op")
    for i in range(10):
        writer.put("s", 0, bytes([i]), i)
    writer.flush()
    reader = state_backend.keyed_store("op", cache_limit=4)
    reader.put("s", 0, b"\x00", "dirty")
    # Reading more entries than the cache holds flushes the dirty one on the way.
    assert [reader.get("s", 0, bytes([i])) for i in range(1, 10)] == list(range(1, 10))
    assert fresh_view(state_backend).get("s", 0, b"\x00") == "dirty"


def test_state_survives_reopening_the_database(tmp_path: Path) -> None:
    backend = RocksDBStateBackend(tmp_path / "db")
    store = backend.keyed_store("op")
    store.put("s", 9, b"k", [1, 2, 3])
    store.flush()
    backend.close()
    reopened = RocksDBStateBackend(tmp_path / "db")
    try:
        assert reopened.keyed_store("op").get("s", 9, b"k") == [1, 2, 3]
    finally:
        reopened.close()


def test_a_store_starting_on_an_empty_key_range_answers_misses_from_its_cache(
    state_backend: RocksDBStateBackend,
) -> None:
    other = state_backend.keyed_store("op")
    other.put("v", 9, b"k", "another subtask's")  # key group 9: outside the range below
    other.flush()
    store = state_backend.keyed_store("op", key_groups=groups(0, 8))
    assert store.cache_is_complete
    reads: list[bytes] = []
    real_db = state_backend.db

    class CountingDb:
        def get(self, key: bytes) -> bytes | None:
            reads.append(key)
            return real_db.get(key)

    store._db = CountingDb()  # type: ignore[assignment]
    assert store.get("v", 3, b"k") is None
    store.put("v", 3, b"k", 1)
    assert store.get("v", 3, b"k") == 1
    assert reads == []  # neither the miss nor the hit read the database


def test_a_store_over_existing_entries_reads_them(state_backend: RocksDBStateBackend) -> None:
    writer = state_backend.keyed_store("op")
    writer.put("v", 5, b"k", "restored")
    writer.flush()
    store = state_backend.keyed_store("op", key_groups=groups(0, 8))
    assert not store.cache_is_complete
    assert store.get("v", 5, b"k") == "restored"


def test_eviction_ends_cache_completeness_and_keeps_every_value(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op", cache_limit=10, key_groups=groups(0, 127))
    assert store.cache_is_complete
    for i in range(25):
        store.put("v", i % 128, str(i).encode(), i)
    assert not store.cache_is_complete  # evicted past 10 entries: misses go to the database again
    assert [store.get("v", i % 128, str(i).encode()) for i in range(25)] == list(range(25))


def test_a_put_where_the_database_has_nothing_and_its_delete_write_nothing(
    state_backend: RocksDBStateBackend,
) -> None:
    """A window opened and fired between two checkpoints: neither its entry nor its deletion is
    written, on a complete cache and after a read that found nothing."""
    for store in (state_backend.keyed_store("op", key_groups=groups(0, 3)), state_backend.keyed_store("op2")):
        assert store.get("v", 1, b"new") is None  # the complete cache, or a database read, says absent
        store.put("v", 1, b"new", "x")
        store.put("v", 1, b"new", "y")
        store.delete("v", 1, b"new")
        assert store.get("v", 1, b"new") is None
        assert store.flush() == 0


def test_an_entry_flushed_before_its_delete_is_deleted_in_the_database(state_backend: RocksDBStateBackend) -> None:
    store = state_backend.keyed_store("op", key_groups=groups(0, 3))
    store.put("v", 1, b"k", "x")
    assert store.flush() == 1
    store.delete("v", 1, b"k")
    assert store.flush() == 1
    assert fresh_view(state_backend).get("v", 1, b"k") is None
    old = state_backend.keyed_store("op3")
    old.put("v", 1, b"k", "stored")
    old.flush()
    restored = state_backend.keyed_store("op3")  # over existing entries: put without a read first
    restored.put("v", 1, b"k", "updated")
    restored.delete("v", 1, b"k")
    assert restored.flush() == 1  # the stored entry must be deleted
    assert fresh_view(state_backend, "op3").get("v", 1, b"k") is None


def _level0_files(backend: RocksDBStateBackend) -> int:
    return int(backend.db.property_int_value("rocksdb.num-files-at-level0") or 0)


def _write_level0_file(backend: RocksDBStateBackend, n: int) -> None:
    batch = WriteBatch(raw_mode=True)
    for i in range(0, 2000, 2):  # every file spans the whole key range, as random keys do
        batch.put(b"k%08d" % (i + n % 2), b"v%d" % n)
    backend.write(batch)
    with backend.quiesced():  # the memtable flushed: one more level-0 file
        pass


def _compactions_settled(backend: RocksDBStateBackend) -> bool:
    """No compaction running, and none due that may run (deferred ones may not)."""
    running = backend.db.property_int_value("rocksdb.num-running-compactions")
    pending = backend.db.property_int_value("rocksdb.compaction-pending")
    return running == 0 and (pending == 0 or backend.compactions_deferred)


def test_an_adopted_database_compacts_only_after_its_first_checkpoint(tmp_path: Path) -> None:
    """Its level 0 at RocksDB's trigger (4 files), an adopted snapshot's files stay as they are until
    the next checkpoint is taken (which then has them all): compactions are deferred until then,
    whatever the snapshot's OPTIONS file says. (The compaction a restored database ran before the fix
    is reproduced in tests/integration/checkpointing/test_snapshots.py.)"""
    writer = RocksDBStateBackend(tmp_path / "writer")
    writer.db.set_options({"disable_auto_compactions": "true"})  # a checkpoint before its compaction
    for n in range(4):
        _write_level0_file(writer, n)
    with writer.quiesced():
        writer.create_checkpoint(tmp_path / "snapshot")
    writer.close()
    for options in (tmp_path / "snapshot").glob("OPTIONS-*"):  # as a writer whose compaction was about to run
        text = options.read_text()
        assert "disable_auto_compactions=true" in text
        options.write_text(text.replace("disable_auto_compactions=true", "disable_auto_compactions=false"))

    restored = RocksDBStateBackend(tmp_path / "restored")
    restored.adopt(tmp_path / "snapshot")
    assert restored.compactions_deferred and _level0_files(restored) == 4
    files = sorted(p.name for p in restored.path.glob("*.sst"))
    poll("no compaction running or due", 30.0, lambda: _compactions_settled(restored), interval_s=0.05)
    assert sorted(p.name for p in restored.path.glob("*.sst")) == files
    with restored.quiesced():
        restored.create_checkpoint(tmp_path / "first")
    assert sorted(p.name for p in (tmp_path / "first").glob("*.sst")) == files  # the restored files, all
    assert not restored.compactions_deferred
    restored.db.compact_range(None, None)  # compactions run again (a manual one, to wait for it)
    assert _level0_files(restored) == 0
    restored.close()


def test_deferred_compactions_run_once_level_0_fills_up_without_a_checkpoint(tmp_path: Path) -> None:
    writer = RocksDBStateBackend(tmp_path / "writer")
    _write_level0_file(writer, 0)
    with writer.quiesced():
        writer.create_checkpoint(tmp_path / "snapshot")
    writer.close()
    restored = RocksDBStateBackend(tmp_path / "restored")
    restored.adopt(tmp_path / "snapshot")
    n = 1
    while restored.compactions_deferred:
        assert _level0_files(restored) <= DEFERRED_COMPACTION_L0_FILES
        _write_level0_file(restored, n)
        n += 1
    assert n == DEFERRED_COMPACTION_L0_FILES + 1  # resumed at the write that found level 0 full
    restored.close()
