"""Incremental RocksDB snapshots against the real S3 server, cleaned up by the real checkpoint coordinator.

Two TaskManagers each hold one subtask of a vertex chaining two keyed operators (``counts`` and
``sums``) over 128 key groups. A small JobManager loop below drives ``CheckpointCoordinator`` and
executes its actions against the bucket: metadata written last, objects deleted when released.
"""

from __future__ import annotations

import pickle
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.polling import poll
from weir.connectors.object_storage import CheckpointStorage, S3CheckpointStorage
from weir.core.config import Endpoints
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId, TaskManagerId
from weir.core.keygroups import KeyGroupRange, key_group_for_key, key_group_range_for_subtask, key_to_bytes
from weir.core.paths import CheckpointPaths
from weir.jobmanager.checkpointing.coordinator import (
    Action,
    CheckpointCoordinator,
    DeleteObjects,
    NotifyAborted,
    NotifyComplete,
    PersistCheckpoint,
    TriggerBarriers,
)
from weir.jobmanager.checkpointing.pending import AckResult, StateObject, TaskAckMetrics, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.taskmanager.snapshots import KeyedStateHandle, RestoreResult, RocksDBSnapshotter, SnapshotResult
from weir.taskmanager.state import RocksDBKeyedStateStore, RocksDBStateBackend

pytestmark = pytest.mark.integration

JOB = JobId("job-snapshots")
MAX_PARALLELISM = 128
COUNTS = OperatorUid("counts")
SUMS = OperatorUid("sums")
WAIT_S = 60.0
PRIVATE_FILES_MAX_BYTES = 64 * 1024  # MANIFEST, CURRENT, OPTIONS, WAL of one snapshot


def kgr(start: int, end: int) -> KeyGroupRange:
    return KeyGroupRange(KeyGroup(start), KeyGroup(end))


@pytest.fixture
def storage(services: Endpoints) -> Iterator[CheckpointStorage]:
    store = S3CheckpointStorage(services, services.s3_bucket, f"it-snapshots/{uuid.uuid4().hex[:12]}")
    yield store
    store.delete(key for key, _ in store.list(""))


@dataclass
class TaskManagerDouble:
    """One TaskManager's database and snapshotter running subtask ``subtask`` of the keyed vertex."""

    task: TaskId
    backend: RocksDBStateBackend
    snapshotter: RocksDBSnapshotter
    ranges: list[tuple[OperatorUid, KeyGroupRange]]
    stores: dict[OperatorUid, RocksDBKeyedStateStore] = field(default_factory=dict)

    def owns(self, key_group: int) -> bool:
        return key_group in self.ranges[0][1]

    def snapshot(self, checkpoint_id: CheckpointId) -> SnapshotResult:
        for store in self.stores.values():
            store.flush()
        return self.snapshotter.begin(JOB, checkpoint_id, self.ranges).result(WAIT_S)


def start_taskmanager(
    root: Path, storage: CheckpointStorage, subtask: int, parallelism: int, *, open_stores: bool = True
) -> TaskManagerDouble:
    name = TaskManagerId(f"tm-{subtask}")
    backend = RocksDBStateBackend(root / name / "db")
    snapshotter = RocksDBSnapshotter(backend, storage, CheckpointPaths(), name)
    key_groups = key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(subtask))
    tm = TaskManagerDouble(
        TaskId(JOB, OperatorUid("keyed"), SubtaskIndex(subtask)),
        backend,
        snapshotter,
        [(COUNTS, key_groups), (SUMS, key_groups)],
    )
    if open_stores:  # else after a restore, as the operators open after it
        tm.stores = {uid: backend.keyed_store(uid) for uid in (COUNTS, SUMS)}
    return tm


@pytest.fixture
def taskmanagers(tmp_path: Path, storage: CheckpointStorage) -> Iterator[list[TaskManagerDouble]]:
    tms = [start_taskmanager(tmp_path, storage, subtask, 2) for subtask in range(2)]
    yield tms
    for tm in tms:
        tm.snapshotter.close()
        tm.backend.close()


class Model:
    """The expected content of the databases, as full RocksDB keys and pickled values."""

    def __init__(self) -> None:
        self.entries: dict[bytes, bytes] = {}

    def put(self, tms: list[TaskManagerDouble], uid: OperatorUid, name: str, key: str, value: object) -> None:
        kg = key_group_for_key(key, MAX_PARALLELISM)
        tm = next(t for t in tms if t.owns(kg))
        tm.stores[uid].put(name, kg, key_to_bytes(key), value)
        self.entries[tm.stores[uid].full_key(name, kg, key_to_bytes(key))] = pickle.dumps(value, 5)

    def delete(self, tms: list[TaskManagerDouble], uid: OperatorUid, name: str, key: str) -> None:
        kg = key_group_for_key(key, MAX_PARALLELISM)
        tm = next(t for t in tms if t.owns(kg))
        tm.stores[uid].delete(name, kg, key_to_bytes(key))
        self.entries.pop(tm.stores[uid].full_key(name, kg, key_to_bytes(key)))

    def within(self, ranges: list[tuple[OperatorUid, KeyGroupRange]]) -> dict[bytes, bytes]:
        return entries_within(self.entries, ranges)


def write_users(model: Model, tms: list[TaskManagerDouble], users: range, version: int) -> None:
    for i in users:
        model.put(tms, COUNTS, "count", f"user-{i}", i * version)
        model.put(tms, SUMS, "total", f"user-{i}", {"sum": i * 1.5 * version, "n": version})


def database_content(backend: RocksDBStateBackend) -> dict[bytes, bytes]:
    content: dict[bytes, bytes] = {}
    for key, value in backend.db.items():
        assert isinstance(key, bytes) and isinstance(value, bytes)
        content[key] = value
    return content


class JobManagerLoop:
    """Executes the coordinator's actions against the storage, as the JobManager's I/O layer does."""

    def __init__(self, storage: CheckpointStorage, tms: list[TaskManagerDouble], retained: int) -> None:
        self.storage = storage
        self.paths = CheckpointPaths()
        self.tms = {tm.task: tm for tm in tms}
        self.coordinator = CheckpointCoordinator(
            JOB,
            CheckpointConfig(interval_s=1.0),
            InMemoryCompletedCheckpointStore(retained),
            metadata_key=self.paths.metadata_key_fn(),
        )
        self.coordinator.start(0.0, self.tms, self.tms)
        self.now = 0.0
        self.deleted: set[str] = set()

    def trigger(self) -> CheckpointId:
        self.now += 1.0
        barriers = [a for a in self.coordinator.tick(self.now) if isinstance(a, TriggerBarriers)]
        assert len(barriers) == 1
        return barriers[0].checkpoint_id

    def acknowledge(self, tm: TaskManagerDouble, checkpoint_id: CheckpointId, result: SnapshotResult) -> AckResult:
        handle = result.handle
        state = TaskStateHandle(
            tm.task,
            tuple(StateObject(f.key, f.size_bytes, f.reused) for f in handle.objects),
            inline_payload=pickle.dumps(handle),
        )
        metrics = TaskAckMetrics(
            state_size_bytes=handle.size_bytes,
            sync_duration_s=result.sync_duration_s,
            async_duration_s=result.async_duration_s,
        )
        outcome = self.coordinator.receive_ack(self.now, checkpoint_id, tm.task, state, metrics)
        self.run(outcome.actions)
        return outcome.result

    def checkpoint(self) -> tuple[CheckpointId, dict[TaskId, SnapshotResult]]:
        """Trigger, snapshot every TaskManager, acknowledge; the checkpoint completes."""
        checkpoint_id = self.trigger()
        results = {task: tm.snapshot(checkpoint_id) for task, tm in self.tms.items()}
        for task, result in results.items():
            assert self.acknowledge(self.tms[task], checkpoint_id, result) is AckResult.SUCCESS
        latest = self.coordinator.store.latest()
        assert latest is not None and latest.checkpoint_id == checkpoint_id
        return checkpoint_id, results

    def run(self, actions: tuple[Action, ...]) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, PersistCheckpoint):
                completed = action.completed
                self.storage.put_bytes(completed.metadata_key, pickle.dumps(completed))
                queue.extend(self.coordinator.checkpoint_persisted(self.now, completed.checkpoint_id))
            elif isinstance(action, NotifyComplete):
                for task in action.tasks:
                    self.tms[task].snapshotter.notify_checkpoint_complete(JOB, action.checkpoint_id)
            elif isinstance(action, NotifyAborted):
                for task in action.tasks:
                    self.tms[task].snapshotter.notify_checkpoint_aborted(JOB, action.checkpoint_id)
            elif isinstance(action, DeleteObjects):
                self.storage.delete(action.metadata_keys)
                self.storage.delete(action.object_keys)
                self.deleted |= {*action.metadata_keys, *action.object_keys}

    def handles_of(self, checkpoint_id: CheckpointId) -> list[KeyedStateHandle]:
        """The keyed state handles as a recovering JobManager reads them: from the metadata object."""
        completed = pickle.loads(self.storage.get_bytes(self.paths.metadata(JOB, checkpoint_id)))
        assert isinstance(completed, CompletedCheckpoint)
        return [pickle.loads(state.inline_payload) for state in completed.task_states]


def restore_fresh(
    root: Path,
    storage: CheckpointStorage,
    handles: list[KeyedStateHandle],
    ranges: list[tuple[OperatorUid, KeyGroupRange]],
) -> tuple[dict[bytes, bytes], RestoreResult]:
    """Restore into a new TaskManager's empty database: its content and what the restore did. The
    entries copied one by one are exactly those of the copied snapshots' overlapping key groups."""
    name = TaskManagerId(f"restored-{uuid.uuid4().hex[:8]}")
    backend = RocksDBStateBackend(root / name / "db")
    snapshotter = RocksDBSnapshotter(backend, storage, CheckpointPaths(), name)
    try:
        result = snapshotter.restore(handles, ranges)
        content = database_content(backend)
        copied_parts = [part for copy in result.plan.copies for part in copy.parts]
        assert result.copied_entries == len(entries_within(content, copied_parts))
        return content, result
    finally:
        snapshotter.close()
        backend.close()


def entries_within(
    entries: dict[bytes, bytes], ranges: Iterable[tuple[OperatorUid, KeyGroupRange]]
) -> dict[bytes, bytes]:
    wanted_ranges = list(ranges)

    def wanted(full: bytes) -> bool:
        uid, _, rest = full.partition(b"\x00")
        kg = int.from_bytes(rest[:2], "big")
        return any(uid == r_uid.encode() and kg in r for r_uid, r in wanted_ranges)

    return {k: v for k, v in entries.items() if wanted(k)}


def sst_names(result: SnapshotResult) -> set[str]:
    return {f.file_name for f in result.handle.sst_files}


def test_incremental_checkpoints_upload_only_new_files_and_restore_exactly_the_requested_ranges(
    tmp_path: Path, storage: CheckpointStorage, taskmanagers: list[TaskManagerDouble]
) -> None:
    tms = taskmanagers
    model = Model()
    write_users(model, tms, range(20_000), version=1)
    jm = JobManagerLoop(storage, tms, retained=2)

    # Checkpoint 1: everything is new and lands in the bucket.
    c1, first = jm.checkpoint()
    listed = dict(storage.list(""))
    for result in first.values():
        assert result.handle.sst_files and not any(f.reused for f in result.handle.objects)
        assert result.uploaded_bytes == result.handle.size_bytes > 0
        assert all(listed[f.key] == f.size_bytes for f in result.handle.objects)
    assert set(jm.handles_of(c1)) == {r.handle for r in first.values()}

    # Checkpoint 2, nothing changed: every SST is reused, only the small private files are uploaded.
    c2, second = jm.checkpoint()
    for task, result in second.items():
        assert all(f.reused for f in result.handle.sst_files)
        assert {f.key for f in result.handle.sst_files} == {f.key for f in first[task].handle.sst_files}
        assert result.handle.new_bytes == result.uploaded_bytes < PRIVATE_FILES_MAX_BYTES
        assert not any(f.file_name.endswith(".sst") for f in result.handle.db_files)

    # Checkpoint 3 after some changes: only the new SSTs are uploaded, under checkpoint 3's keys.
    write_users(model, tms, range(0, 600), version=2)
    for i in range(600, 700):
        model.delete(tms, COUNTS, "count", f"user-{i}")
    c3, third = jm.checkpoint()
    for task, result in third.items():
        new = [f for f in result.handle.sst_files if not f.reused]
        reused = [f for f in result.handle.sst_files if f.reused]
        assert new and reused
        assert {f.file_name for f in new}.isdisjoint(sst_names(second[task]))
        assert {f.key for f in reused} <= {f.key for f in second[task].handle.sst_files}
        assert all(jm.paths.parse_shared_sst(f.key).checkpoint_id == c3 for f in new)  # type: ignore[union-attr]
        assert result.uploaded_bytes == result.handle.new_bytes < result.handle.size_bytes / 4

    # Retaining 2 checkpoints, adding 3 released only checkpoint 1's private files.
    first_private = {f.key for r in first.values() for f in r.handle.db_files}
    assert jm.deleted == first_private | {jm.paths.metadata(JOB, c1)}
    assert not any(storage.exists(key) for key in jm.deleted)

    # Restore a subset of key groups into fresh databases: exactly those entries, nothing else.
    handles = jm.handles_of(c3)
    subset = [(COUNTS, kgr(10, 40)), (SUMS, kgr(30, 70))]  # sums 30..70 spans both TaskManagers
    content, restored = restore_fresh(tmp_path, storage, handles, subset)
    assert content == model.within(subset) and len(content) > 1000
    assert restored.handles_used == 2
    tm0_handle = next(h for h in handles if h.taskmanager_id == "tm-0")
    # tm-0 holds 65 of the 128 key groups wanted of its 128: opened as the database, the rest deleted;
    # only sums 64..70 are copied from tm-1.
    assert restored.adopted == tm0_handle
    assert [c.parts for c in restored.plan.copies] == [((SUMS, kgr(64, 70)),)]

    only_tm0 = [(COUNTS, kgr(5, 9))]
    content, restored = restore_fresh(tmp_path, storage, handles, only_tm0)
    assert content == model.within(only_tm0) and content
    assert restored.handles_used == 1 and restored.downloaded_bytes == tm0_handle.size_bytes
    assert restored.adopted is None and restored.copied_entries == len(content)

    # Compaction rewrites every SST: checkpoint 4 uploads them all; 5 reuses 4's. Adding 5 subsumes 3,
    # which releases the SSTs of checkpoints 1 and 3 that neither 4 nor 5 reference.
    for tm in tms:
        tm.backend.db.compact_range(None, None)
    c4, fourth = jm.checkpoint()
    for task, result in fourth.items():
        assert not (sst_names(result) & sst_names(third[task]))
        assert not any(f.reused for f in result.handle.sst_files)
    c5, fifth = jm.checkpoint()
    assert all(f.reused for r in fifth.values() for f in r.handle.sst_files)
    retained = {jm.paths.metadata(JOB, c4), jm.paths.metadata(JOB, c5)}
    for result in (*fourth.values(), *fifth.values()):
        retained |= {f.key for f in result.handle.objects}
    assert set(dict(storage.list(""))) == retained  # nothing referenced is gone, nothing else is left
    assert {f.key for r in first.values() for f in r.handle.sst_files} <= jm.deleted

    everything = [(uid, kgr(0, MAX_PARALLELISM - 1)) for uid in (COUNTS, SUMS)]
    content, restored = restore_fresh(tmp_path, storage, jm.handles_of(c5), everything)
    assert content == model.entries and restored.handles_used == 2


class GatedStorage(CheckpointStorage):
    """The real storage, with uploads held until ``gate`` opens."""

    def __init__(self, inner: CheckpointStorage) -> None:
        self.inner = inner
        self.gate = threading.Event()

    @property
    def uri(self) -> str:
        return self.inner.uri

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(key, data)

    def put_file(self, key: str, path: Path) -> None:
        assert self.gate.wait(WAIT_S), "the test never opened the upload gate"
        self.inner.put_file(key, path)

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(key)

    def get_file(self, key: str, path: Path) -> None:
        self.inner.get_file(key, path)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        return self.inner.list(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)


def test_subtasks_of_one_taskmanager_share_a_local_snapshot_only_when_nothing_was_written_in_between(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    gated = GatedStorage(storage)
    backend = RocksDBStateBackend(tmp_path / "tm" / "db")
    snapshotter = RocksDBSnapshotter(backend, gated, CheckpointPaths(), TaskManagerId("tm"))
    store = backend.keyed_store(COUNTS)
    left, right = [(COUNTS, kgr(0, 63))], [(COUNTS, kgr(64, 127))]
    try:
        for i in range(5_000):
            store.put("n", i % MAX_PARALLELISM, f"k{i}".encode(), i)
        store.flush()

        # Both subtasks reach the barrier of checkpoint 1 while the first one's upload is still held.
        a1 = snapshotter.begin(JOB, CheckpointId(1), left)
        b1 = snapshotter.begin(JOB, CheckpointId(1), right)
        gated.gate.set()
        a, b = a1.result(WAIT_S), b1.result(WAIT_S)
        assert a.handle.snapshot_index == b.handle.snapshot_index
        assert a.handle.objects == b.handle.objects  # one local snapshot, every file uploaded once
        assert a.uploaded_bytes + b.uploaded_bytes == a.handle.size_bytes
        assert not list((snapshotter.work_dir / "local").iterdir())  # released once both finished

        # The right subtask writes before its own barrier: its snapshot must contain that write.
        a2 = snapshotter.begin(JOB, CheckpointId(2), left)
        store.put("n", 100, b"late", "written before the right subtask's barrier")
        store.flush()
        b2 = snapshotter.begin(JOB, CheckpointId(2), right)
        a, b = a2.result(WAIT_S), b2.result(WAIT_S)
        assert a.handle.snapshot_index != b.handle.snapshot_index
        content, _ = restore_fresh(tmp_path, storage, [a.handle, b.handle], right)
        assert content[store.full_key("n", 100, b"late")] == pickle.dumps(
            "written before the right subtask's barrier", 5
        )
        assert len(content) == sum(1 for i in range(5_000) if i % MAX_PARALLELISM >= 64) + 1
        content, _ = restore_fresh(tmp_path, storage, [a.handle], [(COUNTS, kgr(100, 100))])
        assert content == {}  # the left subtask's snapshot never covers key group 100
    finally:
        snapshotter.close()
        backend.close()


def test_an_aborted_checkpoints_uploads_are_never_reused(
    tmp_path: Path, storage: CheckpointStorage, taskmanagers: list[TaskManagerDouble]
) -> None:
    tms = taskmanagers
    model = Model()
    write_users(model, tms, range(3_000), version=1)
    jm = JobManagerLoop(storage, tms, retained=1)
    c1, _ = jm.checkpoint()

    # Checkpoint 2 uploads a new SST, then a task declines it: the JobManager deletes its objects.
    write_users(model, tms, range(100), version=2)
    c2 = jm.trigger()
    aborted = tms[0].snapshot(c2)
    jm.acknowledge(tms[0], c2, aborted)
    jm.run(jm.coordinator.receive_decline(jm.now, c2, tms[1].task, "test: declined"))
    aborted_new = {f.key for f in aborted.handle.sst_files if not f.reused}
    assert aborted_new and aborted_new <= jm.deleted
    assert not any(storage.exists(key) for key in aborted_new)

    # Checkpoint 3 needs the same SST file: it uploads it again under its own key.
    c3, third = jm.checkpoint()
    again = {f.file_name: f for f in third[tms[0].task].handle.sst_files}
    for f in aborted.handle.sst_files:
        if not f.reused:
            assert not again[f.file_name].reused
            assert again[f.file_name].key != f.key and storage.exists(again[f.file_name].key)
    everything = [(uid, kgr(0, MAX_PARALLELISM - 1)) for uid in (COUNTS, SUMS)]
    content, _ = restore_fresh(tmp_path, storage, jm.handles_of(c3), everything)
    assert content == model.entries


def redeploy(
    root: Path, storage: CheckpointStorage, jm: JobManagerLoop, handles: list[KeyedStateHandle], attempt: int
) -> tuple[list[TaskManagerDouble], dict[TaskId, RestoreResult]]:
    """A failover at the same parallelism: the coordinator restores its latest checkpoint, each subtask
    is deployed on a new TaskManager with a fresh database and restores its key groups from
    ``handles`` as the product's restorer does (``start_attempt``, then ``restore`` as the job's own)."""
    jm.run(jm.coordinator.task_failed(jm.now, next(iter(jm.tms)), "test: a TaskManager was lost"))
    jm.coordinator.restore_latest(jm.now)
    tms = [
        start_taskmanager(root / f"attempt-{attempt}", storage, subtask, 2, open_stores=False) for subtask in range(2)
    ]
    results = {}
    for tm in tms:
        tm.snapshotter.start_attempt(JOB, attempt, handles)
        results[tm.task] = tm.snapshotter.restore(handles, tm.ranges, job_id=JOB, attempt=attempt)
        tm.stores = {uid: tm.backend.keyed_store(uid) for uid in (COUNTS, SUMS)}  # the operators open
    jm.tms = {tm.task: tm for tm in tms}
    jm.run(jm.coordinator.start(jm.now, jm.tms, jm.tms, restored=True))
    return tms, results


def test_a_restore_at_the_same_parallelism_opens_the_snapshot_and_the_next_checkpoint_reuses_its_files(
    tmp_path: Path, storage: CheckpointStorage, taskmanagers: list[TaskManagerDouble]
) -> None:
    model = Model()
    write_users(model, taskmanagers, range(20_000), version=1)
    jm = JobManagerLoop(storage, taskmanagers, retained=1)
    restored_id, before = jm.checkpoint()
    handles = jm.handles_of(restored_id)

    tms, results = redeploy(tmp_path, storage, jm, handles, attempt=2)
    try:
        for tm in tms:
            result, own = results[tm.task], before[tm.task].handle
            # Opened as the database: no entry copied, nothing deleted, only its own files downloaded.
            assert result.adopted == own and result.plan.copies == () and result.copied_entries == 0
            assert result.plan.adopt is not None and result.plan.adopt.deleted == ()
            assert result.downloaded_bytes == own.size_bytes
            assert database_content(tm.backend) == model.within(tm.ranges)

        # The first checkpoint of the new attempt, after a few changes: the restored SSTs' keys are
        # reused (the JobManager accepts them: the restored checkpoint is retained), only new files go up.
        write_users(model, tms, range(0, 300), version=2)
        after_id, after = jm.checkpoint()
        for tm in tms:
            own, result = before[tm.task].handle, after[tm.task]
            reused = {f.key for f in result.handle.sst_files if f.reused}
            assert reused == {f.key for f in own.sst_files}
            assert result.uploaded_bytes == result.handle.new_bytes < own.size_bytes / 4
        assert not {f.key for r in after.values() for f in r.handle.sst_files} & jm.deleted
        everything = [(uid, kgr(0, MAX_PARALLELISM - 1)) for uid in (COUNTS, SUMS)]
        content, _ = restore_fresh(tmp_path, storage, jm.handles_of(after_id), everything)
        assert content == model.entries
    finally:
        for tm in tms:
            tm.snapshotter.close()
            tm.backend.close()


def compactions_settled(backend: RocksDBStateBackend) -> bool:
    """No compaction running, and none due that may run (deferred ones may not)."""
    running = backend.db.property_int_value("rocksdb.num-running-compactions")
    pending = backend.db.property_int_value("rocksdb.compaction-pending")
    return running == 0 and (pending == 0 or backend.compactions_deferred)


def test_a_restored_database_due_for_a_compaction_still_reuses_every_restored_file_at_its_next_checkpoint(
    tmp_path: Path, storage: CheckpointStorage, taskmanagers: list[TaskManagerDouble]
) -> None:
    """A checkpoint taken before the compaction its level-0 files are due for: each incremental
    checkpoint flushes one more level-0 file, the fourth reaches RocksDB's trigger and the checkpoint
    links the files before the compaction it started is done (a compaction takes far longer than
    the links). Restored, the database would run that compaction at once, rewriting every SST, and
    its first checkpoint would upload the whole state again. The restored files are kept until that
    checkpoint is taken."""
    model = Model()
    jm = JobManagerLoop(storage, taskmanagers, retained=1)
    write_users(model, taskmanagers, range(20_000), version=1)
    restored_id, before = jm.checkpoint()
    for version in range(2, 5):  # a level-0 file per checkpoint: the fourth checkpoint has 4
        write_users(model, taskmanagers, range(0, 20_000, 3), version=version)
        restored_id, before = jm.checkpoint()
    handles = jm.handles_of(restored_id)
    assert all(len(result.handle.sst_files) >= 4 for result in before.values())  # level 0 at the trigger

    tms, results = redeploy(tmp_path, storage, jm, handles, attempt=2)
    try:
        for tm in tms:
            assert results[tm.task].adopted == before[tm.task].handle
            assert tm.backend.compactions_deferred
            assert database_content(tm.backend) == model.within(tm.ranges)
        for tm in tms:  # the seconds until the next checkpoint: whatever compaction would run has run
            poll("no compaction running or due", WAIT_S, lambda tm=tm: compactions_settled(tm.backend))

        write_users(model, tms, range(0, 200), version=9)
        after_id, after = jm.checkpoint()
        for tm in tms:
            own, result = before[tm.task].handle, after[tm.task]
            reused = {f.key for f in result.handle.sst_files if f.reused}
            assert reused == {f.key for f in own.sst_files}  # every restored SST, none uploaded again
            assert result.uploaded_bytes == result.handle.new_bytes < own.size_bytes / 10
            assert not tm.backend.compactions_deferred  # the checkpoint has the files: compactions run again
        everything = [(uid, kgr(0, MAX_PARALLELISM - 1)) for uid in (COUNTS, SUMS)]
        content, _ = restore_fresh(tmp_path, storage, jm.handles_of(after_id), everything)
        assert content == model.entries
    finally:
        for tm in tms:
            tm.snapshotter.close()
            tm.backend.close()


def test_a_rescale_restore_opens_the_snapshot_it_owns_most_of_and_copies_only_the_overlap(
    tmp_path: Path, storage: CheckpointStorage, taskmanagers: list[TaskManagerDouble]
) -> None:
    model = Model()
    write_users(model, taskmanagers, range(20_000), version=1)
    jm = JobManagerLoop(storage, taskmanagers, retained=1)
    checkpoint_id, results = jm.checkpoint()
    handles = jm.handles_of(checkpoint_id)
    left, right = (results[tm.task].handle for tm in taskmanagers)

    # 2 -> 3, subtask 0 (0..42): the left snapshot is opened, its key groups 43..63 range-deleted.
    first = [(uid, key_group_range_for_subtask(MAX_PARALLELISM, 3, SubtaskIndex(0))) for uid in (COUNTS, SUMS)]
    content, restored = restore_fresh(tmp_path, storage, handles, first)
    assert content == model.within(first)
    assert restored.adopted == left and restored.copied_entries == 0 and restored.handles_used == 1
    assert restored.plan.adopt is not None and restored.plan.adopt.deleted == (
        (COUNTS, kgr(43, 63)),
        (SUMS, kgr(43, 63)),
    )

    # 2 -> 3, subtask 1 (43..85): a third of each snapshot, both copied, each only its overlap.
    middle = [(uid, key_group_range_for_subtask(MAX_PARALLELISM, 3, SubtaskIndex(1))) for uid in (COUNTS, SUMS)]
    content, restored = restore_fresh(tmp_path, storage, handles, middle)
    assert content == model.within(middle) and content
    assert restored.adopted is None and restored.copied_entries == len(content)
    assert [(c.handle, c.parts) for c in restored.plan.copies] == [
        (left, ((COUNTS, kgr(43, 63)), (SUMS, kgr(43, 63)))),
        (right, ((COUNTS, kgr(64, 85)), (SUMS, kgr(64, 85)))),
    ]

    # 2 -> 1: one snapshot opened whole, the other's entries copied.
    everything = [(uid, kgr(0, MAX_PARALLELISM - 1)) for uid in (COUNTS, SUMS)]
    content, restored = restore_fresh(tmp_path, storage, handles, everything)
    assert content == model.entries
    assert restored.adopted in (left, right) and restored.plan.adopt is not None and restored.plan.adopt.deleted == ()
    copied = [c.handle for c in restored.plan.copies]
    assert copied == [h for h in (left, right) if h != restored.adopted]
    assert restored.copied_entries == len(entries_within(model.entries, copied[0].ranges))
