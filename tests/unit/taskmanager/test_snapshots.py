"""The snapshotter's upload bookkeeping against the real checkpoint coordinator and a local storage.

Each test drives ``CheckpointCoordinator`` the way the JobManager's I/O layer does (metadata persisted,
notifications sent, released objects deleted from a ``FileCheckpointStorage``) with real RocksDB
databases in ``tmp_path``: a reused key the coordinator already deleted shows as a discarded
acknowledgement (a ``released_state`` abort), and a missing object as a failed restore.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId, TaskManagerId
from weir.core.keygroups import KeyGroupRange
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
from weir.jobmanager.checkpointing.pending import AckResult, FailureKind, StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.taskmanager.snapshots import KeyedStateHandle, RocksDBSnapshotter
from weir.taskmanager.state import RocksDBStateBackend


def job_namespace(job: JobId, uid: str) -> str:
    """A namespace per job, so that two jobs can share one database in these tests (a task's own
    database names its operators' state by uid alone)."""
    return f"{job}/{uid}"


JOB = JobId("job-a")
OTHER_JOB = JobId("job-b")
WAIT_S = 30.0


def ranges_of(job: JobId) -> list[tuple[OperatorUid, KeyGroupRange]]:
    return [(OperatorUid(job_namespace(job, "win")), KeyGroupRange(KeyGroup(0), KeyGroup(127)))]


KEYED = TaskId(JOB, OperatorUid("win"), SubtaskIndex(0))
STATELESS = TaskId(JOB, OperatorUid("source"), SubtaskIndex(0))  # acknowledges, or declines, without state


class GatedStorage(FileCheckpointStorage):
    """Uploads wait for ``gate`` (set from the start: no waiting)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.gate.set()

    def put_file(self, key: str, path: Path) -> None:
        assert self.gate.wait(WAIT_S), "the test never opened the upload gate"
        super().put_file(key, path)


@dataclass
class TaskManagerDouble:
    name: str
    backend: RocksDBStateBackend
    snapshotter: RocksDBSnapshotter

    def write(self, first: int, count: int, job: JobId = JOB) -> None:
        store = self.backend.keyed_store(job_namespace(job, "win"))
        for i in range(first, first + count):
            store.put("v", i % 128, b"k%d" % i, i)
        store.flush()

    def content(self, job: JobId = JOB) -> dict[bytes, bytes]:
        prefix = job_namespace(job, "win").encode() + b"\x00"
        content: dict[bytes, bytes] = {}
        for key, value in self.backend.db.items(from_key=prefix):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
            if key.startswith(prefix):
                content[key] = value
        return content


MakeTaskManager = Callable[[str], TaskManagerDouble]


@pytest.fixture
def storage(tmp_path: Path) -> GatedStorage:
    return GatedStorage(tmp_path / "storage")


@pytest.fixture
def make_tm(tmp_path: Path, storage: GatedStorage) -> Iterator[MakeTaskManager]:
    made: list[TaskManagerDouble] = []

    def make(name: str) -> TaskManagerDouble:
        backend = RocksDBStateBackend(tmp_path / name / "state.db")
        snapshotter = RocksDBSnapshotter(
            backend, storage, CheckpointPaths(), TaskManagerId(name), work_dir=tmp_path / name / "snapshots"
        )
        made.append(TaskManagerDouble(name, backend, snapshotter))
        return made[-1]

    yield make
    storage.gate.set()
    for tm in made:
        tm.snapshotter.close()
        tm.backend.close()


@dataclass
class JobManagerLoop:
    """The JobManager's I/O layer around a coordinator retaining one checkpoint.

    ``hold_completions`` queues completion notices (``deliver_held`` sends them); ``lose_completions``
    drops them, as a failed notification RPC does. ``report_attempts=False``: the TaskManager is told
    nothing of attempts (no ``start_attempt``, no ``attempt`` arguments).
    """

    storage: FileCheckpointStorage
    coordinator: CheckpointCoordinator = field(init=False)
    now: float = 0.0
    attempt: int = 0
    placement: dict[TaskId, TaskManagerDouble | None] = field(default_factory=dict)
    hold_completions: bool = False
    lose_completions: bool = False
    held: list[NotifyComplete] = field(default_factory=list)
    report_attempts: bool = True
    aborts: list[tuple[CheckpointId, FailureKind]] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.coordinator = CheckpointCoordinator(
            JOB,
            CheckpointConfig(interval_s=1.0),
            InMemoryCompletedCheckpointStore(max_retained=1),
            metadata_key=CheckpointPaths().metadata_key_fn(),
        )

    def deploy(self, keyed_on: TaskManagerDouble, restored: list[KeyedStateHandle] | None = None) -> None:
        """A new attempt: the keyed task on ``keyed_on`` (restoring ``restored``), the stateless one."""
        if self.attempt:
            self.run(self.coordinator.task_failed(self.now, KEYED, "test: fail-over"))
        self.attempt += 1
        self.placement = {KEYED: keyed_on, STATELESS: None}
        if self.report_attempts:
            keyed_on.snapshotter.start_attempt(JOB, self.attempt, restored or ())
        if restored:
            keyed_on.snapshotter.restore(restored, ranges_of(JOB))
        self.run(self.coordinator.start(self.now, self.placement, [STATELESS]))

    def trigger(self) -> CheckpointId:
        self.now += 10.0
        barriers = [a for a in self.coordinator.tick(self.now) if isinstance(a, TriggerBarriers)]
        assert len(barriers) == 1
        return barriers[0].checkpoint_id

    def trigger_full(self) -> CheckpointId:
        """`weir checkpoint --full`: a checkpoint on request whose barrier says full."""
        self.now += 10.0
        barriers = self.coordinator.trigger_checkpoint(self.now, full=True)
        assert barriers.full
        return barriers.checkpoint_id

    def snapshot(self, checkpoint_id: CheckpointId, *, full: bool = False) -> KeyedStateHandle:
        tm = self.placement[KEYED]
        assert tm is not None
        future = tm.snapshotter.begin(
            JOB, checkpoint_id, ranges_of(JOB), CheckpointKind.CHECKPOINT, full=full, **self._attempt()
        )
        return future.result(WAIT_S).handle

    def _attempt(self) -> dict[str, int]:
        return {"attempt": self.attempt} if self.report_attempts else {}

    def ack(self, checkpoint_id: CheckpointId, handle: KeyedStateHandle) -> AckResult:
        state = TaskStateHandle(KEYED, tuple(StateObject(f.key, f.size_bytes, f.reused) for f in handle.objects))
        outcome = self.coordinator.receive_ack(self.now, checkpoint_id, KEYED, state)
        self.run(outcome.actions)
        return outcome.result

    def ack_stateless(self, checkpoint_id: CheckpointId) -> AckResult:
        outcome = self.coordinator.receive_ack(self.now, checkpoint_id, STATELESS, TaskStateHandle(STATELESS))
        self.run(outcome.actions)
        return outcome.result

    def decline_stateless(self, checkpoint_id: CheckpointId) -> None:
        self.run(self.coordinator.receive_decline(self.now, checkpoint_id, STATELESS, "test: declined"))

    def checkpoint(self, *, full: bool = False) -> tuple[CheckpointId, KeyedStateHandle, AckResult]:
        """Trigger (``full``: as `weir checkpoint --full`); the stateless task acknowledges, then the
        keyed one (which completes it, or not)."""
        checkpoint_id = self.trigger_full() if full else self.trigger()
        assert self.ack_stateless(checkpoint_id) is AckResult.SUCCESS
        handle = self.snapshot(checkpoint_id, full=full)
        return checkpoint_id, handle, self.ack(checkpoint_id, handle)

    def latest_completed(self) -> CheckpointId | None:
        latest = self.coordinator.store.latest()
        return latest.checkpoint_id if latest is not None else None

    def deliver_held(self) -> None:
        held, self.held = self.held, []
        for notice in held:
            self._notify_complete(notice)

    def _snapshotters(self) -> list[RocksDBSnapshotter]:
        return [tm.snapshotter for tm in self.placement.values() if tm is not None]

    def _notify_complete(self, notice: NotifyComplete) -> None:
        for snapshotter in self._snapshotters():
            snapshotter.notify_checkpoint_complete(JOB, notice.checkpoint_id, **self._attempt())

    def run(self, actions: tuple[Action, ...]) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, PersistCheckpoint):
                queue.extend(self.coordinator.checkpoint_persisted(self.now, action.completed.checkpoint_id))
            elif isinstance(action, NotifyComplete):
                if self.hold_completions:
                    self.held.append(action)
                elif not self.lose_completions:
                    self._notify_complete(action)
            elif isinstance(action, NotifyAborted):
                self.aborts.append((action.checkpoint_id, action.reason.kind))
                for snapshotter in self._snapshotters():
                    snapshotter.notify_checkpoint_aborted(JOB, action.checkpoint_id, **self._attempt())
            elif isinstance(action, DeleteObjects):
                self.storage.delete(action.metadata_keys)
                self.storage.delete(action.object_keys)
                self.deleted |= {*action.metadata_keys, *action.object_keys}


def reused_keys(handle: KeyedStateHandle) -> set[str]:
    return {f.key for f in handle.sst_files if f.reused}


def restore_into_fresh(make_tm: MakeTaskManager, name: str, handle: KeyedStateHandle) -> dict[bytes, bytes]:
    tm = make_tm(name)
    tm.snapshotter.restore([handle], ranges_of(JOB))
    return tm.content()


# -- full checkpoints ---------------------------------------------------------------------------------


def test_a_full_checkpoint_uploads_every_file_anew_and_later_ones_reuse_its_files(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    """Flink's FULL checkpoint type (files shared forward only): an incremental checkpoint reuses the
    SSTs of the one before; a full one references no object of an earlier checkpoint; the incremental
    one after it reuses the full one's files; and the full one restores on its own once every earlier
    checkpoint's files are deleted."""
    tm = make_tm("tm-x")
    # Compaction is not what this test is about: the fourth checkpoint's flush makes a fourth level-0
    # file, which starts one, and a snapshot taken after it merged them reuses no file (make test saw
    # this test fail under load once). Without it, which files each checkpoint reuses is certain.
    tm.backend.db.set_options({"disable_auto_compactions": "true"})
    jm = JobManagerLoop(storage)
    jm.deploy(tm)
    tm.write(0, 3000)
    _, first, result = jm.checkpoint()
    assert result is AckResult.SUCCESS
    tm.write(3000, 100)
    _, incremental, result = jm.checkpoint()
    assert result is AckResult.SUCCESS
    earlier_keys = {f.key for f in (*first.objects, *incremental.objects)}
    assert reused_keys(incremental), "the incremental checkpoint reused nothing: the test proves nothing"

    tm.write(3100, 100)
    full_id, full, result = jm.checkpoint(full=True)
    assert result is AckResult.SUCCESS and jm.latest_completed() == full_id
    assert not reused_keys(full)
    assert not {f.key for f in full.objects} & earlier_keys
    assert full.sst_files
    assert earlier_keys <= jm.deleted, "the full checkpoint subsumed the earlier ones: their files go"
    assert restore_into_fresh(make_tm, "tm-check", full) == tm.content()

    tm.write(3200, 100)
    _, after, result = jm.checkpoint()
    assert result is AckResult.SUCCESS
    assert reused_keys(after) and reused_keys(after) <= {f.key for f in full.sst_files}


# -- attempts -----------------------------------------------------------------------------------------


def test_a_job_back_on_a_taskmanager_after_an_attempt_elsewhere_completes_every_checkpoint(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    """The probe's interleaving: attempt 1 on tm-x, attempt 2 on tm-y, attempt 3 on tm-x again."""
    tm_x, tm_y = make_tm("tm-x"), make_tm("tm-y")
    jm = JobManagerLoop(storage)

    jm.deploy(tm_x)
    tm_x.write(0, 5000)
    first, handle, result = jm.checkpoint()
    assert result is AckResult.SUCCESS and jm.latest_completed() == first

    jm.deploy(tm_y, restored=[handle])
    for k in range(2):
        tm_y.write(5000 + 100 * k, 100)
        _, handle, result = jm.checkpoint()
        assert result is AckResult.SUCCESS
    assert {f.key for f in handle.sst_files} - jm.deleted, "attempt 2 completed with its own uploads"
    assert any("/shared/tm-x/" in key for key in jm.deleted), "attempt 2 subsumed what tm-x uploaded"

    jm.deploy(tm_x, restored=[handle])
    for k in range(8):
        tm_x.write(6000 + 100 * k, 100)
        checkpoint_id, handle, result = jm.checkpoint()
        assert result is AckResult.SUCCESS, f"checkpoint {checkpoint_id} aborted: {jm.aborts}"
        assert jm.latest_completed() == checkpoint_id
        assert not reused_keys(handle) & jm.deleted
        assert all(storage.exists(f.key) for f in handle.objects)
        if k == 0:
            assert not reused_keys(handle), "the first snapshot of attempt 3 reused a file of attempt 1"
    assert not [cid for cid, kind in jm.aborts if kind is FailureKind.RELEASED_STATE]
    assert restore_into_fresh(make_tm, "tm-check", handle) == tm_x.content()


def test_a_new_attempt_on_the_same_taskmanager_reuses_only_the_restored_checkpoints_own_files(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    tm = make_tm("tm-x")
    jm = JobManagerLoop(storage)
    jm.deploy(tm)
    tm.write(0, 3000)
    jm.checkpoint()
    tm.write(3000, 100)
    restored_id, restored, result = jm.checkpoint()
    assert result is AckResult.SUCCESS

    jm.deploy(tm, restored=[restored])
    book = tm.snapshotter.bookkeeping(JOB)
    assert book is not None and book.attempt == 2 and book.confirmed_checkpoint_id == restored_id
    assert {f.key for f in book.reusable} == {f.key for f in restored.sst_files}

    tm.write(3100, 100)
    _, handle, result = jm.checkpoint()
    assert result is AckResult.SUCCESS
    # The live database still holds the restored snapshot's files: they are reused, not uploaded again.
    assert reused_keys(handle) == {f.key for f in restored.sst_files}
    assert restore_into_fresh(make_tm, "tm-check", handle) == tm.content()


def test_a_snapshot_of_an_earlier_attempt_still_uploading_records_nothing_in_the_new_one(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    tm = make_tm("tm-x")
    snapshotter = tm.snapshotter
    snapshotter.start_attempt(JOB, 1)
    tm.write(0, 1000)
    storage.gate.clear()
    old = snapshotter.begin(JOB, CheckpointId(5), ranges_of(JOB), attempt=1)

    snapshotter.start_attempt(JOB, 2)
    snapshotter.start_attempt(JOB, 1)  # a late deployment of the old attempt changes nothing
    storage.gate.set()
    old.result(WAIT_S)
    snapshotter.notify_checkpoint_complete(JOB, CheckpointId(5), attempt=1)

    book = snapshotter.bookkeeping(JOB)
    assert book is not None
    assert (book.attempt, book.confirmed_checkpoint_id, book.reusable, book.open_checkpoints) == (2, None, (), ())
    fresh = snapshotter.begin(JOB, CheckpointId(7), ranges_of(JOB), attempt=2).result(WAIT_S)
    assert not reused_keys(fresh.handle)


# -- notifications and aborts -------------------------------------------------------------------------


def test_late_and_lost_completion_notices_never_make_a_snapshot_reuse_a_deleted_key(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    tm = make_tm("tm-x")
    jm = JobManagerLoop(storage)
    jm.deploy(tm)
    tm.write(0, 3000)

    # Checkpoint 1 completes; its notice is late: checkpoint 2 is snapshotted before it arrives.
    jm.hold_completions = True
    first, first_handle, _ = jm.checkpoint()
    tm.write(3000, 100)
    second = jm.trigger()
    assert jm.ack_stateless(second) is AckResult.SUCCESS
    second_handle = jm.snapshot(second)
    assert not reused_keys(second_handle)
    jm.hold_completions = False
    jm.deliver_held()

    # Checkpoint 2 completes and subsumes 1, whose keys are deleted; its notice is lost.
    jm.lose_completions = True
    assert jm.ack(second, second_handle) is AckResult.SUCCESS
    first_keys = {f.key for f in first_handle.sst_files}
    assert first_keys <= jm.deleted

    # The live database still holds checkpoint 1's file: it must be uploaded again, not reused.
    for k in range(3):
        tm.write(3100 + 100 * k, 100)
        checkpoint_id, handle, result = jm.checkpoint()
        assert result is AckResult.SUCCESS, f"checkpoint {checkpoint_id} aborted: {jm.aborts}"
        assert not reused_keys(handle) & jm.deleted
    assert restore_into_fresh(make_tm, "tm-check", handle) == tm.content()


def test_an_abort_of_a_checkpoint_that_reused_files_resets_what_may_be_reused(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    tm = make_tm("tm-x")
    jm = JobManagerLoop(storage)
    jm.deploy(tm)
    tm.write(0, 3000)
    first, first_handle, _ = jm.checkpoint()

    # Declined after the keyed snapshot reused checkpoint 1's file: the abort may have released it.
    tm.write(3000, 100)
    aborted = jm.trigger()
    aborted_handle = jm.snapshot(aborted)
    assert reused_keys(aborted_handle) == {f.key for f in first_handle.sst_files}
    jm.ack(aborted, aborted_handle)
    jm.decline_stateless(aborted)
    book = tm.snapshotter.bookkeeping(JOB)
    assert book is not None and book.reusable == () and book.confirmed_checkpoint_id == first

    _, handle, result = jm.checkpoint()
    assert result is AckResult.SUCCESS
    assert not reused_keys(handle), "the snapshot after the abort reused a possibly released key"
    book = tm.snapshotter.bookkeeping(JOB)
    assert book is not None and {f.key for f in book.reusable} == {f.key for f in handle.sst_files}


def test_an_abort_of_a_checkpoint_that_reused_nothing_here_keeps_what_may_be_reused(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    tm = make_tm("tm-x")
    jm = JobManagerLoop(storage)
    jm.deploy(tm)
    tm.write(0, 3000)
    _, first_handle, _ = jm.checkpoint()

    declined = jm.trigger()
    jm.decline_stateless(declined)  # before the keyed task took its snapshot
    tm.snapshotter.notify_checkpoint_aborted(JOB, declined, attempt=jm.attempt)  # a duplicate notice

    tm.write(3000, 100)
    _, handle, result = jm.checkpoint()
    assert result is AckResult.SUCCESS
    assert reused_keys(handle) == {f.key for f in first_handle.sst_files}


def test_a_released_state_abort_ends_reuse_even_when_no_new_attempt_was_reported(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    """Defence in depth: the probe's interleaving, tm-x told nothing of attempts; the first snapshot of
    attempt 3 reuses a key attempt 2 deleted, and that abort is the last."""
    tm_x, tm_y = make_tm("tm-x"), make_tm("tm-y")
    jm = JobManagerLoop(storage, report_attempts=False)
    jm.deploy(tm_x)
    tm_x.write(0, 5000)
    _, handle, _ = jm.checkpoint()
    jm.deploy(tm_y, restored=[handle])
    for k in range(2):
        tm_y.write(5000 + 100 * k, 100)
        _, handle, _ = jm.checkpoint()

    jm.deploy(tm_x, restored=[handle])
    results = []
    for k in range(4):
        tm_x.write(6000 + 100 * k, 100)
        checkpoint_id, handle, result = jm.checkpoint()
        results.append(result)
    assert [kind for _, kind in jm.aborts] == [FailureKind.RELEASED_STATE]
    assert results == [AckResult.DISCARDED] + [AckResult.SUCCESS] * 3
    assert restore_into_fresh(make_tm, "tm-check", handle) == tm_x.content()


# -- forgetting a job and the restore cache -----------------------------------------------------------


def test_forget_job_drops_its_bookkeeping_local_snapshots_and_restore_cache_entries(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    source, tm = make_tm("tm-source"), make_tm("tm-x")
    source.write(0, 2000, job=JOB)
    source.write(0, 2000, job=OTHER_JOB)
    job_handle = source.snapshotter.snapshot(JOB, CheckpointId(1), ranges_of(JOB))
    other_handle = source.snapshotter.snapshot(OTHER_JOB, CheckpointId(1), ranges_of(OTHER_JOB))
    tm.snapshotter.restore([job_handle], ranges_of(JOB))
    tm.snapshotter.restore([other_handle], ranges_of(OTHER_JOB))
    cache = tm.snapshotter.work_dir / "cache"
    assert (cache / JOB).is_dir() and (cache / OTHER_JOB).is_dir()

    # A snapshot of the job is still uploading when the job is forgotten.
    tm.snapshotter.start_attempt(JOB, 1)
    tm.snapshotter.start_attempt(OTHER_JOB, 1)
    storage.gate.clear()
    in_flight = tm.snapshotter.begin(JOB, CheckpointId(2), ranges_of(JOB), attempt=1)
    book = tm.snapshotter.bookkeeping(JOB)
    assert book is not None and book.local_snapshots == 1 and book.open_checkpoints == (2,)

    tm.snapshotter.forget_job(JOB)
    tm.snapshotter.forget_job(JOB)
    assert tm.snapshotter.bookkeeping(JOB) is None
    assert not (cache / JOB).exists() and (cache / OTHER_JOB).is_dir()
    storage.gate.set()
    in_flight.result(WAIT_S)
    assert tm.snapshotter.bookkeeping(JOB) is None, "the finished upload brought the job's bookkeeping back"
    assert list((tm.snapshotter.work_dir / "local").iterdir()) == []
    assert tm.snapshotter.bookkeeping(OTHER_JOB) is not None

    # Restoring again downloads the forgotten job's SSTs again; the other job's are still cached.
    sst_bytes = sum(f.size_bytes for f in job_handle.sst_files)
    assert tm.snapshotter.restore([job_handle], ranges_of(JOB)).downloaded_bytes >= sst_bytes
    other_private = sum(f.size_bytes for f in other_handle.db_files)
    assert tm.snapshotter.restore([other_handle], ranges_of(OTHER_JOB)).downloaded_bytes == other_private


def test_clear_restore_cache_drops_every_downloaded_file(storage: GatedStorage, make_tm: MakeTaskManager) -> None:
    source, tm = make_tm("tm-source"), make_tm("tm-x")
    source.write(0, 2000)
    handle = source.snapshotter.snapshot(JOB, CheckpointId(1), ranges_of(JOB))
    first = tm.snapshotter.restore([handle], ranges_of(JOB))
    assert tm.snapshotter.restore([handle], ranges_of(JOB)).downloaded_bytes < first.downloaded_bytes

    tm.snapshotter.clear_restore_cache()
    tm.snapshotter.clear_restore_cache()
    assert not (tm.snapshotter.work_dir / "cache").exists()
    assert tm.snapshotter.restore([handle], ranges_of(JOB)).downloaded_bytes == first.downloaded_bytes
    assert tm.content() == source.content()


def test_concurrent_notifications_and_forgets_leave_consistent_bookkeeping(
    storage: GatedStorage, make_tm: MakeTaskManager
) -> None:
    tm = make_tm("tm-x")
    snapshotter = tm.snapshotter
    jobs = [JobId(f"job-{i}") for i in range(4)]
    for job in jobs:
        tm.write(0, 500, job=job)
        snapshotter.start_attempt(job, 1)
    futures = [
        snapshotter.begin(job, CheckpointId(cid), ranges_of(job), attempt=1) for cid in (1, 2, 3) for job in jobs
    ]
    start = threading.Barrier(len(jobs) * 2)

    def notify(job: JobId) -> None:
        start.wait(WAIT_S)
        snapshotter.notify_checkpoint_aborted(job, CheckpointId(2), attempt=1)
        snapshotter.notify_checkpoint_complete(job, CheckpointId(3), attempt=1)

    def forget(job: JobId) -> None:
        start.wait(WAIT_S)
        snapshotter.forget_job(job)

    threads = [threading.Thread(target=notify, args=(job,)) for job in jobs]
    threads += [threading.Thread(target=forget, args=(job,)) for job in jobs[:2]]
    threads += [threading.Thread(target=start.wait, args=(WAIT_S,)) for _ in jobs[2:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    for future in futures:
        future.result(WAIT_S)
    assert [snapshotter.bookkeeping(job) for job in jobs[:2]] == [None, None]
    for job in jobs[2:]:
        book = snapshotter.bookkeeping(job)
        assert book is not None and book.confirmed_checkpoint_id == 3 and book.open_checkpoints == ()
    assert list((snapshotter.work_dir / "local").iterdir()) == []
