"""What a TaskManager acknowledges to the JobManager: a task's operator state inline or as an object
(its handle in the task-state document), the checkpoint's timeline, and an acknowledgement too large
for a control message becoming a decline with its reason. No JobManager: the reports are kept."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import ChannelBarrierTime, SubtaskCheckpointTimeline
from weir.core.codec import timeline_from_proto
from weir.core.failures import Failure
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import CheckpointPaths
from weir.core.states import TaskState
from weir.core.task_state import (
    INLINE_STATE_LIMIT_BYTES,
    InlineOperatorState,
    OperatorStateSlice,
    StoredOperatorState,
    SubtaskLayout,
    TaskStateDocument,
    decode_task_state,
    encode_task_state,
    read_operator_states,
)
from weir.core.transport import MAX_MESSAGE_BYTES
from weir.core.transport_security import TransportSecurity
from weir.taskmanager.reporter import (
    AckReport,
    CheckpointAcknowledger,
    DeclineReport,
    JobManagerReports,
    Report,
    StateReport,
    oversized_ack_reason,
)
from weir.taskmanager.snapshots import KeyedStateHandle, SnapshotFile
from weir.taskmanager.task_host import TaskHost, restore_of
from weir.taskmanager.task_types import ChainRestore, ChainSnapshot, CheckpointAck, TaskAddress
from weir.wire import jobmanager_pb2, taskmanager_pb2


def layout(start: int, end: int) -> SubtaskLayout:
    return SubtaskLayout(2, 128, KeyGroupRange(KeyGroup(start), KeyGroup(end)), ("sink", "map"), ())


def test_an_acknowledgement_fits_below_the_limit_and_is_declined_above_it() -> None:
    assert oversized_ack_reason(1_000, MAX_MESSAGE_BYTES, 7) is None
    reason = oversized_ack_reason(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, 7)
    assert reason is not None and "checkpoint 7" in reason and f"{MAX_MESSAGE_BYTES:,}" in reason


class SentReports:
    """What would go to the JobManager; ``next`` waits for one with a deadline."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Report] = queue.SimpleQueue()

    def put(self, report: Report) -> None:
        self._queue.put(report)

    def next(self) -> Report:
        return self._queue.get(timeout=10.0)

    def empty(self) -> bool:
        return self._queue.empty()


@pytest.fixture
def sent() -> SentReports:
    return SentReports()


class CountingStorage(FileCheckpointStorage):
    """A folder storage that remembers the keys it was asked to write, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: list[str] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        super().put_bytes(key, data)


@pytest.fixture
def storage(tmp_path: Path) -> CountingStorage:
    return CountingStorage(tmp_path / "checkpoints")


@pytest.fixture
def acknowledger(storage: FileCheckpointStorage, sent: SentReports) -> Iterator[CheckpointAcknowledger]:
    acknowledger = CheckpointAcknowledger(storage, CheckpointPaths(), sent)
    yield acknowledger
    acknowledger.shutdown()


def test_an_oversized_acknowledgement_is_sent_as_a_decline_with_its_reason(
    acknowledger: CheckpointAcknowledger, sent: SentReports, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to be handed to gRPC, refused as too large and dropped: the checkpoint timed out."""
    address = TaskAddress("job-1", "sink", 0, 1)
    limit = 70_000  # room for 6 KB after the headroom: below the inline limit, so the state stays inline
    monkeypatch.setattr("weir.taskmanager.reporter.MAX_MESSAGE_BYTES", limit)
    large = ChainSnapshot(address, 5, {"sink": b"x" * (INLINE_STATE_LIMIT_BYTES - 1)}, layout(0, 127))
    acknowledger.acknowledge(address, CheckpointAck(large, 0.0, 0.0, 0.0, 0.0))
    decline = sent.next()
    assert isinstance(decline, DeclineReport)
    assert decline.request.checkpoint_id == 5 and "acknowledgement of checkpoint 5" in decline.request.reason
    small = ChainSnapshot(address, 6, {"sink": b"ok"}, layout(0, 127))
    acknowledger.acknowledge(address, CheckpointAck(small, 0.0, 0.0, 0.0, 0.0))
    assert isinstance(sent.next(), AckReport)


def test_operator_state_above_the_inline_limit_goes_to_checkpoint_storage_and_the_ack_carries_its_handle(
    acknowledger: CheckpointAcknowledger, sent: SentReports, storage: FileCheckpointStorage
) -> None:
    """The acknowledgement carried a pickle of every operator's bytes: a sink's pending output
    travelled to the JobManager, into ``_metadata`` and back in every deployment."""
    address = TaskAddress("job-1", "sink", 2, 1)
    pending_output = b"row-" * 10_000
    snapshot = ChainSnapshot(address, 7, {"sink": pending_output, "map": b"m"}, layout(64, 127))
    acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))
    ack = sent.next()
    assert isinstance(ack, AckReport)
    request = ack.request
    assert b"row-row-" not in request.state_handle and len(request.state_handle) < 1_000
    key = CheckpointPaths().task_state(JobId("job-1"), CheckpointId(7), OperatorUid("sink"), SubtaskIndex(2))
    assert [(o.key, o.size_bytes, o.reused) for o in request.objects] == [(key, len(pending_output) + 1, False)]
    stored = storage.get_bytes(key)
    assert pending_output in stored
    document = decode_task_state(request.state_handle, "in the test")
    assert document.operator_state == StoredOperatorState(
        key, len(stored), (OperatorStateSlice("map", 0, 1), OperatorStateSlice("sink", 1, len(pending_output)))
    )
    assert (document.checkpoint_id, document.subtask, document.attempt) == (7, 2, 1)
    assert (document.key_group_range.start, document.key_group_range.end) == (64, 127)


def test_state_below_the_inline_limit_stays_in_the_acknowledgement(
    acknowledger: CheckpointAcknowledger, sent: SentReports
) -> None:
    address = TaskAddress("job-1", "source", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"source": b"offsets"}, layout(0, 127))
    acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))
    ack = sent.next()
    assert isinstance(ack, AckReport) and list(ack.request.objects) == []
    assert decode_task_state(ack.request.state_handle, "in the test").operator_state == InlineOperatorState(
        {"source": b"offsets"}
    )


def test_an_ack_with_inflight_records_says_it_is_unaligned_and_their_size(
    acknowledger: CheckpointAcknowledger, sent: SentReports
) -> None:
    address = TaskAddress("job-1", "sink", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"sink": b"txn", "__inflight__": b"<document>"}, layout(0, 127))
    acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0, inflight_bytes=5))
    ack = sent.next()
    assert isinstance(ack, AckReport) and ack.request.unaligned and ack.request.inflight_bytes == 5
    plain = ChainSnapshot(address, 4, {"sink": b"txn"}, layout(0, 127))
    acknowledger.acknowledge(address, CheckpointAck(plain, 0.0, 0.0, 0.0, 0.0))
    ack = sent.next()
    assert isinstance(ack, AckReport) and not ack.request.unaligned and ack.request.inflight_bytes == 0


def test_a_restore_reads_the_operator_state_back_from_its_object(
    acknowledger: CheckpointAcknowledger, sent: SentReports, storage: FileCheckpointStorage
) -> None:
    """The handle the ack carried, handed back by the JobManager, restores the same bytes."""
    address = TaskAddress("job-1", "sink", 0, 1)
    states = {"sink": bytes(range(256)) * 200, "map": b""}
    acknowledger.acknowledge(
        address, CheckpointAck(ChainSnapshot(address, 9, states, layout(0, 127)), 0.0, 0.0, 0.0, 0.0)
    )
    ack = sent.next()
    assert isinstance(ack, AckReport)
    deploy = taskmanager_pb2.DeployTaskRequest(restore_state_handle=ack.request.state_handle, restore_checkpoint_id=9)
    restore = restore_of(TaskAddress("job-1", "sink", 0, 2), deploy)
    assert restore is not None and restore.keyed_state is None
    assert isinstance(restore.operator_state, StoredOperatorState)
    assert read_operator_states(restore.operator_state, storage.get_bytes) == states


def test_a_keyed_state_handle_travels_in_the_document_and_comes_back_equal(
    acknowledger: CheckpointAcknowledger, sent: SentReports
) -> None:
    address = TaskAddress("job-1", "sum", 1, 3)
    keyed = KeyedStateHandle(
        taskmanager_id=TaskManagerId("tm-test"),
        db_incarnation="db1",
        checkpoint_id=CheckpointId(4),
        snapshot_index=2,
        sst_files=(SnapshotFile("job-1/shared/tm-test/db1/00000000000000000003-000009.sst", 900, True, "000009.sst"),),
        db_files=(SnapshotFile("job-1/checkpoints/chk-4/db/tm-test/db1/000002/CURRENT", 16, False, "CURRENT"),),
        ranges=((OperatorUid("job-1.sum"), KeyGroupRange(KeyGroup(64), KeyGroup(127))),),
    )
    snapshot = ChainSnapshot(address, 4, {"sum": b"s"}, layout(64, 127), keyed)
    acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))
    ack = sent.next()
    assert isinstance(ack, AckReport)
    assert sorted(o.key for o in ack.request.objects) == sorted(f.key for f in keyed.objects)
    deploy = taskmanager_pb2.DeployTaskRequest(restore_state_handle=ack.request.state_handle, restore_checkpoint_id=4)
    restore = restore_of(address, deploy)
    assert restore is not None and restore.keyed_state == keyed
    assert isinstance(restore, ChainRestore) and restore.layout == layout(64, 127)  # its state schemas with it


TIMELINE = SubtaskCheckpointTimeline(
    first_barrier_at=100.0,
    channels=(ChannelBarrierTime(0, "map", 0, 100.0), ChannelBarrierTime(1, "map", 1, None)),
    alignment_end_at=100.5,
    sync_end_at=100.75,
    async_end_at=101.0,
)


def test_the_ack_carries_the_tasks_timeline(acknowledger: CheckpointAcknowledger, sent: SentReports) -> None:
    address = TaskAddress("job-1", "sink", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"sink": b"txn"}, layout(0, 127))
    acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0, TIMELINE))
    ack = sent.next()
    assert isinstance(ack, AckReport)
    assert timeline_from_proto(ack.request.timeline) == TIMELINE


def test_the_async_part_ends_when_the_operator_state_is_written(
    acknowledger: CheckpointAcknowledger, sent: SentReports
) -> None:
    address = TaskAddress("job-1", "sink", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"sink": b"row-" * 10_000}, layout(0, 127))
    before = time.time()
    acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0, TIMELINE))
    ack = sent.next()
    assert isinstance(ack, AckReport) and list(ack.request.objects)  # written to the storage
    timeline = timeline_from_proto(ack.request.timeline)
    assert timeline.async_end_at >= before
    assert timeline.channels == TIMELINE.channels and timeline.sync_end_at == TIMELINE.sync_end_at


def test_subtasks_with_the_same_broadcast_state_store_it_once_and_each_restores_it(
    acknowledger: CheckpointAcknowledger, sent: SentReports, storage: CountingStorage
) -> None:
    """Every subtask's copy used to be inline in its acknowledgement (or its task object): the
    checkpoint held the broadcast state once per subtask. Now the copies that are the same are one
    content-addressed object, which each document names; a copy that differs (an unaligned barrier
    overtook a rule) is an object of its own. The other operators' state stays the task's own."""
    rules = b"rules-" * 5_000  # above the inline limit: stored either way
    copies = {0: rules, 1: rules, 2: rules + b"one-more-rule"}
    documents = []
    for subtask, copy in copies.items():
        address = TaskAddress("job-1", "enrich", subtask, 1)
        snapshot = ChainSnapshot(
            address,
            9,
            {"enrich": copy, "map": b"m"},
            layout(0, 127),
            broadcast_operator_uids=frozenset({"enrich"}),
        )
        acknowledger.acknowledge(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))
        ack = sent.next()
        assert isinstance(ack, AckReport)
        assert b"rules-rules-" not in ack.request.state_handle
        document = decode_task_state(ack.request.state_handle, "in the test")
        assert document.format == 3 and document.operator_state_uids == ("map", "enrich")
        assert [o.key for o in ack.request.objects] == [document.operator_state.broadcast["enrich"].key]
        documents.append(document)
        assert read_operator_states(document.operator_state, storage.get_bytes) == {"enrich": copy, "map": b"m"}
        assert restore_of_document_reads(document, storage) == {"enrich": copy, "map": b"m"}
    assert storage.puts == [  # the second subtask found the first one's object: one upload
        documents[0].operator_state.broadcast["enrich"].key,
        documents[2].operator_state.broadcast["enrich"].key,
    ]
    shared, own = (documents[i].operator_state.broadcast["enrich"].key for i in (0, 2))
    assert shared != own and shared.startswith("job-1/checkpoints/chk-00000000000000000009/broadcast/enrich/")
    assert dict(storage.list("job-1/")) == {shared: len(rules), own: len(copies[2])}
    assert documents[1].operator_state.broadcast == documents[0].operator_state.broadcast


def restore_of_document_reads(document: TaskStateDocument, storage: FileCheckpointStorage) -> dict[str, bytes]:
    """What a restart of the subtask reads: its restore request built from the document, then its
    operator states read as the restorer reads them."""
    request = taskmanager_pb2.DeployTaskRequest(
        restore_checkpoint_id=9, restore_state_handle=encode_task_state(document)
    )
    restore = restore_of(TaskAddress("job-1", "enrich", document.subtask, 2), request)
    assert isinstance(restore, ChainRestore)
    return read_operator_states(restore.operator_state, storage.get_bytes)


# A failed task's report before its outputs close ----------------------------------------------------


class HeldJobManager:
    """A JobManager stub whose ``ReportTaskState`` answers only once ``release`` is set (the first
    ``unavailable`` calls raise UNAVAILABLE first); it keeps the requests it took."""

    def __init__(self, unavailable: int = 0) -> None:
        self.release = threading.Event()
        self.taken: list[jobmanager_pb2.ReportTaskStateRequest] = []
        self._unavailable = unavailable

    def ReportTaskState(self, request: jobmanager_pb2.ReportTaskStateRequest, timeout: float) -> None:  # noqa: N802
        if self._unavailable:
            self._unavailable -= 1
            raise Unavailable()
        assert self.release.wait(10.0), "the test never released the JobManager"
        self.taken.append(request)


class Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("unavailable", [0, 2], ids=["at-once", "after-two-refusals"])
def test_a_state_reports_sent_event_is_set_only_once_the_jobmanager_took_it(unavailable: int) -> None:
    jobmanager = HeldJobManager(unavailable)
    stopping = threading.Event()
    reports = JobManagerReports(jobmanager, stopping)  # type: ignore[arg-type]
    try:
        sent = threading.Event()
        reports.put(StateReport(jobmanager_pb2.ReportTaskStateRequest(attempt=3), sent))
        assert not sent.wait(0.5), "set before the JobManager answered"
        jobmanager.release.set()
        assert sent.wait(10.0)
        assert [r.attempt for r in jobmanager.taken] == [3]
    finally:
        stopping.set()
        reports.stop()


def test_a_state_report_given_up_at_the_taskmanagers_stop_still_sets_its_event() -> None:
    jobmanager = HeldJobManager(unavailable=1_000)
    stopping = threading.Event()
    reports = JobManagerReports(jobmanager, stopping)  # type: ignore[arg-type]
    sent = threading.Event()
    reports.put(StateReport(jobmanager_pb2.ReportTaskStateRequest(attempt=1), sent))
    assert not sent.wait(0.3)
    stopping.set()
    assert sent.wait(10.0), "a waiter on a report the reporter gave up waits no longer"
    assert jobmanager.taken == []


def test_a_failed_tasks_state_callback_returns_only_once_its_report_was_sent(tmp_path: Path) -> None:
    """The callback runs on the task thread before its output channels close (Task._run): a consumer
    then loses its input only after the JobManager has the failure that caused it. make test saw a CDC
    source's failure lose the race to its consumer's "input channel 0 lost its producer"."""
    taken: queue.SimpleQueue[Report] = queue.SimpleQueue()

    class Sink:
        def put(self, report: Report) -> None:
            taken.put(report)

    host = TaskHost(
        "tm-test",
        "127.0.0.1:1",
        tmp_path / "tm",
        Sink(),
        storage=FileCheckpointStorage(tmp_path / "cp"),
        security=TransportSecurity(),
    )
    try:
        address = TaskAddress("job-1", "src", 0, 1)
        returned = threading.Event()

        def fail() -> None:
            host._on_task_state(address, TaskState.FAILED, Failure.internal("the slot is gone"))
            returned.set()

        threading.Thread(target=fail, daemon=True).start()
        report = taken.get(timeout=10.0)
        assert isinstance(report, StateReport) and report.sent is not None
        assert report.request.failure.message == "the slot is gone"
        assert not returned.wait(0.5), "returned before the report was sent: the outputs would close first"
        report.sent.set()
        assert returned.wait(10.0)

        host._on_task_state(address, TaskState.RUNNING, None)  # any other state: no wait, no event
        other = taken.get(timeout=10.0)
        assert isinstance(other, StateReport) and other.sent is None
    finally:
        host.stop()
