"""The epoch spill: a sink subtask's pending records in bounded memory, the rest one file per epoch."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import structlog
import structlog.testing

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.operators.epoch_spill import (
    FRAME,
    RECORD_OVERHEAD_BYTES,
    SPILL_FILE_MAGIC,
    EpochSpill,
    EpochSpillError,
    Record,
    SpillDirectory,
    StreamedList,
    dumps_streaming,
    record_memory_bytes,
    subtask_digest,
)
from weir.operators.transactional_sinks import SinkSnapshot
from weir.operators.twophase import LedgerSnapshot, PendingTransaction, TransactionId

TASK = TaskId(JobId("job-1"), OperatorUid("sink"), SubtaskIndex(0))
LOG = structlog.get_logger("test")


def cp(n: int) -> CheckpointId:
    return CheckpointId(n)


def record(i: int, size: int = 100) -> Record:
    key = None if i % 3 == 0 else f"k{i}".encode()
    timestamp = None if i % 5 == 0 else 1_700_000_000_000 + i
    return key, f"v{i}:".encode().ljust(size, b"."), timestamp


def spill(tmp_path: Path, memory_bytes: int, task: TaskId = TASK) -> EpochSpill:
    return EpochSpill(task, tmp_path / "spill", memory_bytes, LOG)


def files(tmp_path: Path) -> list[Path]:
    root = tmp_path / "spill"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_an_epoch_within_the_bound_stays_in_memory_and_iterates_in_order(tmp_path: Path) -> None:
    store = spill(tmp_path, 1024 * 1024)
    epoch = store.epoch(cp(1))
    expected = [record(i) for i in range(100)]
    for r in expected:
        epoch.append(r)
    assert not epoch.spilled and len(epoch) == 100
    assert list(epoch) == expected
    assert store.held_bytes == sum(record_memory_bytes(r) for r in expected)
    assert files(tmp_path) == []  # no directory until something spills


def test_past_the_bound_an_epoch_goes_to_its_file_and_reads_back_in_order(tmp_path: Path) -> None:
    store = spill(tmp_path, 10 * (RECORD_OVERHEAD_BYTES + 200))
    epoch = store.epoch(cp(7))
    expected = [record(i) for i in range(1000)]
    for r in expected[:500]:
        epoch.append(r)
    assert epoch.spilled and store.held_bytes == 0
    assert list(epoch) == expected[:500]  # readable while still being appended to
    for r in expected[500:]:
        epoch.append(r)
    assert list(epoch) == expected and list(epoch) == expected  # iterable again
    assert epoch.path is not None and epoch.path.name == "epoch-00000000000000000007.records"
    assert epoch.path.read_bytes().startswith(SPILL_FILE_MAGIC)
    frames = sum(FRAME.size + len(k or b"") + len(v) for k, v, _ts in expected)
    assert epoch.path.stat().st_size == len(SPILL_FILE_MAGIC) + frames


def test_the_bound_is_shared_by_all_epochs_of_the_subtask(tmp_path: Path) -> None:
    size = record_memory_bytes(record(1))
    store = spill(tmp_path, 25 * size)
    first, second = store.epoch(cp(1)), store.epoch(cp(2))
    for _ in range(20):
        first.append(record(1))
    for _ in range(20):
        second.append(record(1))
        assert store.held_bytes <= 25 * size
    assert not first.spilled and second.spilled  # the epoch that would pass the bound moves
    assert store.held_bytes == 20 * size
    first.discard()
    assert store.held_bytes == 0
    third = store.epoch(cp(3))
    third.append(record(1))
    assert not third.spilled  # memory freed by the commit is used again


def test_a_zero_bound_puts_every_record_on_disk(tmp_path: Path) -> None:
    store = spill(tmp_path, 0)
    epoch = store.epoch(cp(1))
    epoch.append(record(1))
    assert epoch.spilled and list(epoch) == [record(1)] and store.held_bytes == 0


def test_memory_stays_bounded_however_large_the_epoch(tmp_path: Path) -> None:
    bound = 256 * 1024
    store = spill(tmp_path, bound)
    epoch = store.epoch(cp(1))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(40_000):  # 40,000 records of 256 bytes: about 16 MiB held as objects
            epoch.append(record(i, 256))
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(epoch) == 40_000
    assert grown < bound + 1024 * 1024, grown


def test_commit_and_close_remove_the_files(tmp_path: Path) -> None:
    store = spill(tmp_path, 0)
    committed, pending = store.epoch(cp(1)), store.epoch(cp(2))
    for i in range(10):
        committed.append(record(i))
        pending.append(record(i))
    assert len(files(tmp_path)) == 2
    committed.discard()
    assert [p.name for p in files(tmp_path)] == ["epoch-00000000000000000002.records"]
    with pytest.raises(ValueError, match="discarded"):
        committed.append(record(1))
    directory = store.directory
    assert directory is not None
    store.close()
    assert not directory.exists() and files(tmp_path) == []


def test_the_spill_says_which_epochs_it_still_holds(tmp_path: Path) -> None:
    """What a sink checks at its end of input: every epoch it opened was committed (discarded)."""
    store = spill(tmp_path, 2 * (RECORD_OVERHEAD_BYTES + 100))
    in_memory, on_disk = store.epoch(cp(3)), store.epoch(cp(4))
    in_memory.append(record(0))
    for i in range(5):
        on_disk.append(record(i))
    assert on_disk.spilled and not in_memory.spilled
    assert store.held_epochs() == {cp(3): 1, cp(4): 5}
    on_disk.discard()
    assert store.held_epochs() == {cp(3): 1}
    in_memory.discard()
    assert store.held_epochs() == {}


def test_an_epoch_is_never_opened_twice(tmp_path: Path) -> None:
    store = spill(tmp_path, 0)
    store.epoch(cp(1))
    with pytest.raises(ValueError, match="already has records"):
        store.epoch(cp(1))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_crashed_instance_leaves_nothing_a_later_one_reads(tmp_path: Path) -> None:
    """An instance that never closed (a crash) left files of the same epoch number: a later instance
    of the same subtask writes and reads its own, and removes those of an exited process."""
    crashed = spill(tmp_path, 0)
    left = crashed.epoch(cp(1))
    for i in range(5):
        left.append(record(i))
    assert crashed.directory is not None
    stale = tmp_path / "spill" / SpillDirectory(subtask_digest(TASK), dead_pid(), "0123456789abcdef").name
    stale.mkdir()
    (stale / "epoch-00000000000000000001.records").write_bytes(SPILL_FILE_MAGIC + b"garbage")
    another_subtask = subtask_digest(TaskId(TASK.job_id, TASK.operator_uid, SubtaskIndex(1)))
    other = tmp_path / "spill" / SpillDirectory(another_subtask, dead_pid(), "fedcba9876543210").name
    other.mkdir()

    later = spill(tmp_path, 0)
    epoch = later.epoch(cp(1))
    epoch.append(record(100))
    assert list(epoch) == [record(100)]
    assert later.directory is not None and later.directory != crashed.directory
    assert not stale.exists()  # its process exited
    assert crashed.directory.exists()  # a live process's (here: this one's) is left alone
    assert other.exists()  # another subtask's is left alone
    later.close()


def test_a_successor_that_never_spills_still_removes_what_a_crashed_instance_left(tmp_path: Path) -> None:
    """A recovered sink re-produces its restored epochs from the snapshot and may never spill: opening
    (``remove_abandoned``) is enough to remove the crashed instance's directory, whole epochs in it."""
    spill(tmp_path, 0).remove_abandoned()  # no root yet: nothing to do
    assert not (tmp_path / "spill").exists()
    stale = tmp_path / "spill" / SpillDirectory(subtask_digest(TASK), dead_pid(), "0123456789abcdef").name
    stale.mkdir(parents=True)
    (stale / "epoch-00000000000000000001.records").write_bytes(SPILL_FILE_MAGIC + b"x" * 4096)
    live = tmp_path / "spill" / SpillDirectory(subtask_digest(TASK), os.getpid(), "fedcba9876543210").name
    live.mkdir()

    successor = spill(tmp_path, 1 << 20)
    successor.remove_abandoned()
    assert not stale.exists()
    assert live.exists()  # a live process's (a stale attempt still running) is left alone
    assert successor.directory is None  # it made none of its own
    successor.close()


def test_an_unreadable_spill_root_does_not_fail_a_sink_that_opens(tmp_path: Path) -> None:
    (tmp_path / "spill").write_bytes(b"not a directory")
    with structlog.testing.capture_logs() as logs:
        spill(tmp_path, 1 << 20).remove_abandoned()
    assert [entry["event"] for entry in logs] == ["epoch_spill_root_unreadable"]


def test_a_spill_file_changed_under_the_sink_is_refused(tmp_path: Path) -> None:
    store = spill(tmp_path, 0)
    epoch = store.epoch(cp(1))
    for i in range(3):
        epoch.append(record(i))
    list(epoch)  # flushed
    assert epoch.path is not None
    data = epoch.path.read_bytes()
    epoch.path.write_bytes(data[: len(data) - 10])
    with pytest.raises(EpochSpillError, match="ends at record 2 of the 3"):
        list(epoch)
    epoch.path.write_bytes(b"NOTSPILL" + data[8:])
    with pytest.raises(EpochSpillError, match="does not start with"):
        list(epoch)


def test_a_streamed_list_unpickles_as_a_list() -> None:
    records = [record(i) for i in range(2500)]
    data = dumps_streaming({"epochs": [(4, StreamedList(iter(records)))]})
    assert pickle.loads(data) == {"epochs": [(4, records)]}


def test_a_snapshot_of_a_spilled_epoch_reads_as_before(tmp_path: Path) -> None:
    """The bytes read back with SinkSnapshot.from_bytes (and plain pickle) as a list of records, as
    snapshots of epochs held in a list always did."""
    store = spill(tmp_path, 0)
    epoch = store.epoch(cp(4))
    expected = [record(i) for i in range(3000)]
    for r in expected:
        epoch.append(r)
    txn = TransactionId.for_task(TASK, cp(4))
    ledger = LedgerSnapshot(TASK, cp(4), (PendingTransaction(cp(4), txn),))
    data = SinkSnapshot(ledger, {cp(4): epoch}, 17, "markers", 0).to_bytes()
    restored = SinkSnapshot.from_bytes(data)
    assert restored.epochs == {cp(4): expected}
    assert restored.marker_floor == 17 and restored.ledger == ledger
    in_a_list = SinkSnapshot(ledger, {cp(4): expected}, 17, "markers", 0).to_bytes()
    assert pickle.loads(in_a_list) == pickle.loads(data)


def test_building_a_snapshot_streams_the_spilled_records(tmp_path: Path) -> None:
    """Beyond the snapshot's own bytes, pickling a spilled epoch holds little: records are read from
    the file and freed once written (no list, no pickler memo holding them)."""
    store = spill(tmp_path, 0)
    epoch = store.epoch(cp(4))
    for i in range(40_000):
        epoch.append(record(i, 256))
    txn = TransactionId.for_task(TASK, cp(4))
    ledger = LedgerSnapshot(TASK, cp(4), (PendingTransaction(cp(4), txn),))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        data = SinkSnapshot(ledger, {cp(4): epoch}, 17, "markers", 0).to_bytes()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(data) > 40_000 * 256
    assert peak - len(data) < 2 * 1024 * 1024, (peak, len(data))


def test_a_tombstone_reads_back_as_a_null_value_not_an_empty_one(tmp_path: Path) -> None:
    """A null-value record (an upsert-kafka delete) and an empty value are two records: both come back
    as they went in, from memory and from the spill file."""
    records: list[Record] = [(b"k1", None, 1), (b"k2", b"", 2), (b"k3", None, None), (b"k4", b"v", 4)]
    for memory_bytes in (1024 * 1024, 0):
        store = spill(tmp_path / str(memory_bytes), memory_bytes)
        epoch = store.epoch(cp(3))
        for r in records:
            epoch.append(r)
        assert epoch.spilled == (memory_bytes == 0)
        assert list(epoch) == records
        store.close()
    assert record_memory_bytes((b"k", None, None)) == RECORD_OVERHEAD_BYTES + 1
