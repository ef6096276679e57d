"""One RocksDB per task attempt (``TaskKeyedState``): snapshots and restores touch only its own files."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rocksdict import AccessType, Options, Rdict

from tests.unit.taskmanager.fakes import make_task
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import CheckpointingMode, CheckpointKind
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, TaskManagerId
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import CheckpointPaths
from weir.core.states import TaskState
from weir.taskmanager.inflight import INFLIGHT_STATE_NAME, decode_inflight, parse_message
from weir.taskmanager.network.codec import barrier_message, encode_records, end_of_stream_message, read_buffer
from weir.taskmanager.snapshots import KeyedStateHandle, TaskKeyedState
from weir.wire import taskmanager_pb2


def job_namespace(job: JobId, uid: str) -> str:
    """A namespace per job, so that two jobs can share one database in these tests (a task's own
    database names its operators' state by uid alone)."""
    return f"{job}/{uid}"


JOB = JobId("job-a")
OTHER_JOB = JobId("job-b")
TM = TaskManagerId("tm-1")
ALL = KeyGroupRange(KeyGroup(0), KeyGroup(127))
FIRST_HALF = KeyGroupRange(KeyGroup(0), KeyGroup(63))
SECOND_HALF = KeyGroupRange(KeyGroup(64), KeyGroup(127))


class RecordingStorage(FileCheckpointStorage):
    """Remembers every key read with ``get_file``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.downloaded: list[str] = []

    def get_file(self, key: str, path: Path) -> None:
        self.downloaded.append(key)
        super().get_file(key, path)


OpenState = Callable[[str], TaskKeyedState]


@pytest.fixture
def storage(tmp_path: Path) -> RecordingStorage:
    return RecordingStorage(tmp_path / "storage")


@pytest.fixture
def open_state(tmp_path: Path, storage: RecordingStorage) -> Iterator[OpenState]:
    opened: list[TaskKeyedState] = []

    def open_(name: str) -> TaskKeyedState:
        opened.append(TaskKeyedState(tmp_path / "tm" / "jobs" / name, storage, CheckpointPaths(), TM))
        return opened[-1]

    yield open_
    for state in opened:
        state.discard()


def namespace(job: JobId) -> OperatorUid:
    return OperatorUid(job_namespace(job, "win"))


def write(state: TaskKeyedState, job: JobId, key_groups: KeyGroupRange, count: int = 500) -> None:
    store = state.backend.keyed_store(namespace(job))
    for i in range(count):
        store.put("v", key_groups.start + i % (key_groups.end - key_groups.start + 1), b"k%d" % i, i)
    store.flush()


def key_groups_in(db: Rdict) -> set[tuple[str, int]]:
    """(namespace, key group) of every entry of a database."""
    found = set()
    for key in db.keys():
        assert isinstance(key, bytes)
        uid, rest = key.split(b"\x00", 1)
        found.add((uid.decode(), int.from_bytes(rest[:2], "big")))
    return found


def uploaded_database(storage: FileCheckpointStorage, handle: KeyedStateHandle, directory: Path) -> Rdict:
    """The snapshot as uploaded: every object of the handle, opened read-only."""
    directory.mkdir(parents=True)
    for f in handle.objects:
        storage.get_file(f.key, directory / f.file_name)
    return Rdict(str(directory), Options(raw_mode=True), access_type=AccessType.read_only())


def test_each_subtasks_snapshot_holds_only_its_own_key_groups(
    open_state: OpenState, storage: RecordingStorage, tmp_path: Path
) -> None:
    first, second, other_job = open_state("job-a/win-0-1"), open_state("job-a/win-1-1"), open_state("job-b/win-0-1")
    write(first, JOB, FIRST_HALF)
    write(second, JOB, SECOND_HALF)
    write(other_job, OTHER_JOB, ALL)

    h1 = first.snapshotter.snapshot(JOB, CheckpointId(1), [(namespace(JOB), FIRST_HALF)], attempt=1)
    h2 = second.snapshotter.snapshot(JOB, CheckpointId(1), [(namespace(JOB), SECOND_HALF)], attempt=1)

    assert h1.sst_files and h2.sst_files
    assert not {f.key for f in h1.objects} & {f.key for f in h2.objects}
    for n, (handle, owned) in enumerate(((h1, FIRST_HALF), (h2, SECOND_HALF))):
        db = uploaded_database(storage, handle, tmp_path / f"read-{n}")
        try:
            groups = key_groups_in(db)
        finally:
            db.close()
        assert groups == {(namespace(JOB), g) for g in range(owned.start, owned.end + 1)}


def test_a_restore_downloads_only_the_files_of_the_handle_it_restores(
    open_state: OpenState, storage: RecordingStorage
) -> None:
    first, second = open_state("job-a/win-0-1"), open_state("job-a/win-1-1")
    write(first, JOB, FIRST_HALF)
    write(second, JOB, SECOND_HALF)
    h1 = first.snapshotter.snapshot(JOB, CheckpointId(1), [(namespace(JOB), FIRST_HALF)], attempt=1)
    second.snapshotter.snapshot(JOB, CheckpointId(1), [(namespace(JOB), SECOND_HALF)], attempt=1)
    storage.downloaded.clear()

    restored = open_state("job-a/win-0-2")
    result = restored.snapshotter.restore([h1], [(namespace(JOB), FIRST_HALF)])

    assert sorted(storage.downloaded) == sorted(f.key for f in h1.objects)
    assert result.adopted == h1 and result.copied_entries == 0  # opened as the database, nothing copied
    assert sum(1 for _ in restored.backend.db.keys()) == 500
    assert key_groups_in(restored.backend.db) == {(namespace(JOB), g) for g in range(64)}


def test_a_discarded_task_state_leaves_nothing_on_disk(open_state: OpenState) -> None:
    state = open_state("job-a/win-0-1")
    write(state, JOB, ALL)
    state.snapshotter.snapshot(JOB, CheckpointId(1), [(namespace(JOB), ALL)], attempt=1)
    assert state.directory.is_dir()
    state.discard()
    state.discard()  # idempotent
    assert not state.directory.exists()
    assert state.live_sst_bytes() == 0


def data(*values: int) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(
        records=encode_records(list(values), [None] * len(values)), record_count=len(values)
    )


def test_a_keyed_task_snapshots_its_own_database_and_deletes_it_when_it_finishes(open_state: OpenState) -> None:
    h = make_task("op", channels=1, open_keyed_state=lambda: open_state("job-a/op-0-1"))
    state = h.task.keyed_state
    assert state is not None and state.directory.is_dir()
    h.gate.push(0, data(1, 2, 1))  # type: ignore[union-attr]
    h.gate.push(0, barrier_message(1, time.time(), CheckpointKind.CHECKPOINT))  # type: ignore[union-attr]
    h.gate.push(0, end_of_stream_message())  # type: ignore[union-attr]
    h.task.start()
    h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
    handle = h.acks[0].snapshot.keyed_state
    assert handle is not None and handle.db_incarnation == state.snapshotter.db_incarnation
    assert [r for _, r in handle.ranges] == [h.task.key_group_range]
    h.task.notify_checkpoint_complete(1)
    h.wait_for_state(TaskState.FINISHED)
    h.task.join(10)
    assert not state.directory.exists()


def test_a_keyed_unaligned_checkpoint_acknowledges_once_both_its_upload_and_its_capture_are_done(
    open_state: OpenState,
) -> None:
    h = make_task(
        "op", channels=2, open_keyed_state=lambda: open_state("job-a/op-0-1"), mode=CheckpointingMode.UNALIGNED
    )
    gate = h.gate
    assert gate is not None
    try:
        gate.push(0, data(1, 2))
        gate.push(0, barrier_message(1, time.time(), CheckpointKind.CHECKPOINT))
        h.task.start()
        h.journal.wait_for(lambda: any(e.startswith("Barrier:1:") for e in h.out.stream()))
        time.sleep(0.3)  # the keyed upload is done by now; channel 1 still owes its barrier
        assert not h.acks
        gate.push(1, data(3))
        gate.push(1, barrier_message(1, time.time(), CheckpointKind.CHECKPOINT))
        h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
        snapshot = h.acks[0].snapshot
        assert snapshot.keyed_state is not None
        inflight = decode_inflight(snapshot.operator_states[INFLIGHT_STATE_NAME], "test")
        assert [read_buffer(parse_message(b, "test")).values for _, b in inflight.replay()] == [[3]]
        gate.push(0, end_of_stream_message())
        gate.push(1, end_of_stream_message())
        h.task.notify_checkpoint_complete(1)
        h.wait_for_state(TaskState.FINISHED)
    finally:
        h.task.cancel()
        h.task.join(10)
