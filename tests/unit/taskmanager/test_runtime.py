"""TaskManager runtime decisions that need no JobManager: the alignment a checkpointing mode means,
and an acknowledgement too large for a control message becoming a decline with its reason."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import ChannelBarrierTime, CheckpointingMode, SubtaskCheckpointTimeline
from weir.core.codec import checkpointing_mode_from_proto, checkpointing_mode_to_proto, timeline_from_proto
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import CheckpointPaths
from weir.core.task_state import (
    INLINE_STATE_LIMIT_BYTES,
    InlineOperatorState,
    OperatorStateSlice,
    StoredOperatorState,
    SubtaskLayout,
    decode_task_state,
    read_operator_states,
)
from weir.core.transport import MAX_MESSAGE_BYTES
from weir.taskmanager.barrier_aligner import AlignmentMode
from weir.taskmanager.network import (
    ChannelClosedError,
    InputGate,
    LocalOutputChannel,
    end_of_stream_message,
    message_of,
)
from weir.taskmanager.runtime import (
    AckReport,
    DeclineReport,
    Report,
    TaskManagerRuntime,
    alignment_for,
    oversized_ack_reason,
)
from weir.taskmanager.snapshots import KeyedStateHandle, SnapshotFile
from weir.taskmanager.task import ChainRestore, ChainSnapshot, CheckpointAck, TaskAddress
from weir.wire import taskmanager_pb2


def layout(start: int, end: int) -> SubtaskLayout:
    return SubtaskLayout(2, 128, KeyGroupRange(KeyGroup(start), KeyGroup(end)), ("sink", "map"), ())


@pytest.mark.parametrize("text", ["exactly_once", "EXACTLY_ONCE", "exactly-once", " exactly_once"])
def test_every_spelling_of_exactly_once_aligns_barriers_on_the_taskmanager(text: str) -> None:
    """The JobManager accepted these spellings while the TaskManager compared the raw text and ran
    them unaligned: post-barrier records landed in the snapshot."""
    mode = CheckpointingMode.parse(text)
    assert mode is not None
    assert alignment_for(checkpointing_mode_from_proto(checkpointing_mode_to_proto(mode))) is AlignmentMode.EXACTLY_ONCE


def test_at_least_once_does_not_align() -> None:
    assert alignment_for(CheckpointingMode.AT_LEAST_ONCE) is AlignmentMode.AT_LEAST_ONCE


def test_unaligned_checkpointing_runs_the_unaligned_aligner() -> None:
    assert alignment_for(CheckpointingMode.UNALIGNED) is AlignmentMode.UNALIGNED


def test_an_acknowledgement_fits_below_the_limit_and_is_declined_above_it() -> None:
    assert oversized_ack_reason(1_000, MAX_MESSAGE_BYTES, 7) is None
    reason = oversized_ack_reason(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, 7)
    assert reason is not None and "checkpoint 7" in reason and f"{MAX_MESSAGE_BYTES:,}" in reason


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskManagerRuntime]:
    monkeypatch.setenv("WEIR_CHECKPOINT_DIR", f"file://{tmp_path / 'checkpoints'}")
    rt = TaskManagerRuntime("tm-test", "127.0.0.1:1", "127.0.0.1:1", 2, tmp_path / "run")
    yield rt
    rt.stop()


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
def sent(runtime: TaskManagerRuntime) -> SentReports:
    reports = SentReports()
    runtime._reports = reports  # type: ignore[assignment]  # noqa: SLF001
    return reports


def test_an_oversized_acknowledgement_is_sent_as_a_decline_with_its_reason(
    runtime: TaskManagerRuntime, sent: SentReports, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to be handed to gRPC, refused as too large and dropped: the checkpoint timed out."""
    address = TaskAddress("job-1", "sink", 0, 1)
    limit = 70_000  # room for 6 KB after the headroom: below the inline limit, so the state stays inline
    monkeypatch.setattr("weir.taskmanager.runtime.MAX_MESSAGE_BYTES", limit)
    large = ChainSnapshot(address, 5, {"sink": b"x" * (INLINE_STATE_LIMIT_BYTES - 1)}, layout(0, 127))
    runtime._on_checkpoint(address, CheckpointAck(large, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    decline = sent.next()
    assert isinstance(decline, DeclineReport)
    assert decline.request.checkpoint_id == 5 and "acknowledgement of checkpoint 5" in decline.request.reason
    small = ChainSnapshot(address, 6, {"sink": b"ok"}, layout(0, 127))
    runtime._on_checkpoint(address, CheckpointAck(small, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    assert isinstance(sent.next(), AckReport)


def test_operator_state_above_the_inline_limit_goes_to_checkpoint_storage_and_the_ack_carries_its_handle(
    runtime: TaskManagerRuntime, sent: SentReports, tmp_path: Path
) -> None:
    """The acknowledgement carried a pickle of every operator's bytes: a sink's pending output
    travelled to the JobManager, into ``_metadata`` and back in every deployment."""
    address = TaskAddress("job-1", "sink", 2, 1)
    pending_output = b"row-" * 10_000
    snapshot = ChainSnapshot(address, 7, {"sink": pending_output, "map": b"m"}, layout(64, 127))
    runtime._on_checkpoint(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport)
    request = ack.request
    assert b"row-row-" not in request.state_handle and len(request.state_handle) < 1_000
    key = CheckpointPaths().task_state(JobId("job-1"), CheckpointId(7), OperatorUid("sink"), SubtaskIndex(2))
    assert [(o.key, o.size_bytes, o.reused) for o in request.objects] == [(key, len(pending_output) + 1, False)]
    stored = FileCheckpointStorage(tmp_path / "checkpoints").get_bytes(key)
    assert pending_output in stored
    document = decode_task_state(request.state_handle, "in the test")
    assert document.operator_state == StoredOperatorState(
        key, len(stored), (OperatorStateSlice("map", 0, 1), OperatorStateSlice("sink", 1, len(pending_output)))
    )
    assert (document.checkpoint_id, document.subtask, document.attempt) == (7, 2, 1)
    assert (document.key_group_range.start, document.key_group_range.end) == (64, 127)


def test_state_below_the_inline_limit_stays_in_the_acknowledgement(
    runtime: TaskManagerRuntime, sent: SentReports
) -> None:
    address = TaskAddress("job-1", "source", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"source": b"offsets"}, layout(0, 127))
    runtime._on_checkpoint(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport) and list(ack.request.objects) == []
    assert decode_task_state(ack.request.state_handle, "in the test").operator_state == InlineOperatorState(
        {"source": b"offsets"}
    )


def test_an_ack_with_inflight_records_says_it_is_unaligned_and_their_size(
    runtime: TaskManagerRuntime, sent: SentReports
) -> None:
    address = TaskAddress("job-1", "sink", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"sink": b"txn", "__inflight__": b"<document>"}, layout(0, 127))
    runtime._on_checkpoint(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0, inflight_bytes=5))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport) and ack.request.unaligned and ack.request.inflight_bytes == 5
    plain = ChainSnapshot(address, 4, {"sink": b"txn"}, layout(0, 127))
    runtime._on_checkpoint(address, CheckpointAck(plain, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport) and not ack.request.unaligned and ack.request.inflight_bytes == 0


def test_a_restore_reads_the_operator_state_back_from_its_object(
    runtime: TaskManagerRuntime, sent: SentReports
) -> None:
    """The handle the ack carried, handed back by the JobManager, restores the same bytes."""
    address = TaskAddress("job-1", "sink", 0, 1)
    states = {"sink": bytes(range(256)) * 200, "map": b""}
    runtime._on_checkpoint(
        address, CheckpointAck(ChainSnapshot(address, 9, states, layout(0, 127)), 0.0, 0.0, 0.0, 0.0)
    )  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport)
    deploy = taskmanager_pb2.DeployTaskRequest(restore_state_handle=ack.request.state_handle, restore_checkpoint_id=9)
    restore = runtime._restore_of(TaskAddress("job-1", "sink", 0, 2), deploy)  # noqa: SLF001
    assert restore is not None and restore.keyed_state is None
    assert isinstance(restore.operator_state, StoredOperatorState)
    assert read_operator_states(restore.operator_state, runtime._storage.get_bytes) == states  # noqa: SLF001


def test_a_keyed_state_handle_travels_in_the_document_and_comes_back_equal(
    runtime: TaskManagerRuntime, sent: SentReports
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
    runtime._on_checkpoint(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport)
    assert sorted(o.key for o in ack.request.objects) == sorted(f.key for f in keyed.objects)
    deploy = taskmanager_pb2.DeployTaskRequest(restore_state_handle=ack.request.state_handle, restore_checkpoint_id=4)
    restore = runtime._restore_of(address, deploy)  # noqa: SLF001
    assert restore is not None and restore.keyed_state == keyed
    assert isinstance(restore, ChainRestore) and restore.layout == layout(64, 127)  # its state schemas with it


# Local channels -------------------------------------------------------------------------------------


def _local_channel(runtime: TaskManagerRuntime, consumer: TaskAddress) -> LocalOutputChannel:
    header = taskmanager_pb2.ChannelHeader(consumer_channel=0, attempt=consumer.attempt)
    header.consumer.job_id, header.consumer.vertex_uid = consumer.job_id, consumer.vertex_uid
    header.consumer.subtask = consumer.subtask
    return LocalOutputChannel(header, threading.Event(), runtime._attach_local)


def test_a_local_producer_opened_before_its_consumer_is_connected_once_the_consumer_registers(
    runtime: TaskManagerRuntime,
) -> None:
    consumer = TaskAddress("job", "sink", 0, 1)
    channel = _local_channel(runtime, consumer)
    channel.open()
    channel.send(end_of_stream_message())
    assert channel.queued == 1 and channel.credits == 0, "it had no gate to go to"
    gate = InputGate([0])
    runtime._register_gate(consumer, gate)
    taken = gate.take()
    assert taken is not None and message_of(taken.message).event == taskmanager_pb2.EVENT_KIND_END_OF_STREAM
    later = _local_channel(runtime, TaskAddress("job", "sink", 0, 1))
    later.open()  # the gate is there: connected at once (a second producer of channel 0 is refused)
    with pytest.raises(ChannelClosedError, match="already connected"):
        later.send(end_of_stream_message())


def test_cancelling_an_attempt_forgets_its_local_producers_waiting_for_a_consumer(
    runtime: TaskManagerRuntime,
) -> None:
    _local_channel(runtime, TaskAddress("job", "sink", 0, 1)).open()
    _local_channel(runtime, TaskAddress("job", "sink", 0, 2)).open()
    runtime.cancel_attempt("job", 1, wait_s=0.0)
    assert list(runtime._awaiting_gates) == [TaskAddress("job", "sink", 0, 2)]


TIMELINE = SubtaskCheckpointTimeline(
    first_barrier_at=100.0,
    channels=(ChannelBarrierTime(0, "map", 0, 100.0), ChannelBarrierTime(1, "map", 1, None)),
    alignment_end_at=100.5,
    sync_end_at=100.75,
    async_end_at=101.0,
)


def test_the_ack_carries_the_tasks_timeline(runtime: TaskManagerRuntime, sent: SentReports) -> None:
    address = TaskAddress("job-1", "sink", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"sink": b"txn"}, layout(0, 127))
    runtime._on_checkpoint(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0, TIMELINE))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport)
    assert timeline_from_proto(ack.request.timeline) == TIMELINE


def test_the_async_part_ends_when_the_operator_state_is_written(runtime: TaskManagerRuntime, sent: SentReports) -> None:
    address = TaskAddress("job-1", "sink", 0, 1)
    snapshot = ChainSnapshot(address, 3, {"sink": b"row-" * 10_000}, layout(0, 127))
    before = time.time()
    runtime._on_checkpoint(address, CheckpointAck(snapshot, 0.0, 0.0, 0.0, 0.0, TIMELINE))  # noqa: SLF001
    ack = sent.next()
    assert isinstance(ack, AckReport) and list(ack.request.objects)  # written to the storage
    timeline = timeline_from_proto(ack.request.timeline)
    assert timeline.async_end_at >= before
    assert timeline.channels == TIMELINE.channels and timeline.sync_end_at == TIMELINE.sync_end_at
