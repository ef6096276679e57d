"""TaskManager runtime decisions that need no JobManager: the checkpointing mode a deployment
carries is the one the barrier aligner runs, and a cancelled attempt's local producers are forgotten."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.core.checkpointing import CheckpointingMode, CheckpointKind
from weir.core.codec import checkpointing_mode_from_proto, checkpointing_mode_to_proto
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.taskmanager.barrier_aligner import BarrierAligner, BlockChannel, TriggerSnapshot
from weir.taskmanager.network.output_channels import LocalOutputChannel
from weir.taskmanager.runtime import TaskManagerRuntime
from weir.taskmanager.task_types import TaskAddress
from weir.wire import taskmanager_pb2

TASK = TaskId(JobId("job"), OperatorUid("op"), SubtaskIndex(0))


def deployed(mode: CheckpointingMode) -> CheckpointingMode:
    """The mode as a TaskManager reads it from the deploy request the JobManager built."""
    return checkpointing_mode_from_proto(checkpointing_mode_to_proto(mode))


@pytest.mark.parametrize("text", ["exactly_once", "EXACTLY_ONCE", "exactly-once", " exactly_once"])
def test_every_spelling_of_exactly_once_aligns_barriers_on_the_taskmanager(text: str) -> None:
    """The JobManager accepted these spellings while the TaskManager compared the raw text and ran
    them unaligned: post-barrier records landed in the snapshot."""
    mode = CheckpointingMode.parse(text)
    assert mode is not None
    aligner = BarrierAligner(TASK, 2, deployed(mode))
    first = aligner.on_barrier(ChannelIndex(0), CheckpointId(1), CheckpointKind.CHECKPOINT, now=0.0)
    assert first == (BlockChannel(ChannelIndex(0)),)


def test_at_least_once_does_not_align() -> None:
    aligner = BarrierAligner(TASK, 2, deployed(CheckpointingMode.AT_LEAST_ONCE))
    assert aligner.on_barrier(ChannelIndex(0), CheckpointId(1), CheckpointKind.CHECKPOINT, now=0.0) == ()


def test_unaligned_checkpointing_runs_the_unaligned_aligner() -> None:
    aligner = BarrierAligner(TASK, 2, deployed(CheckpointingMode.UNALIGNED))
    (trigger, *_) = aligner.on_barrier(ChannelIndex(0), CheckpointId(1), CheckpointKind.CHECKPOINT, now=0.0)
    assert isinstance(trigger, TriggerSnapshot) and trigger.capture_inflight


@pytest.mark.parametrize("mode", list(CheckpointingMode))
def test_one_enum_from_the_jobmanagers_settings_to_the_aligner(mode: CheckpointingMode) -> None:
    assert deployed(mode) is mode and BarrierAligner(TASK, 1, deployed(mode)).mode is mode


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskManagerRuntime]:
    monkeypatch.setenv("WEIR_CHECKPOINT_DIR", f"file://{tmp_path / 'checkpoints'}")
    rt = TaskManagerRuntime("tm-test", "127.0.0.1:1", "127.0.0.1:1", 2, tmp_path / "run")
    yield rt
    rt.stop()


# Local channels -------------------------------------------------------------------------------------


def _local_channel(runtime: TaskManagerRuntime, consumer: TaskAddress) -> LocalOutputChannel:
    header = taskmanager_pb2.ChannelHeader(consumer_channel=0, attempt=consumer.attempt)
    header.consumer.job_id, header.consumer.vertex_uid = consumer.job_id, consumer.vertex_uid
    header.consumer.subtask = consumer.subtask
    return LocalOutputChannel(header, threading.Event(), runtime.channels.attach_local)


def test_cancelling_an_attempt_forgets_its_local_producers_waiting_for_a_consumer(
    runtime: TaskManagerRuntime,
) -> None:
    _local_channel(runtime, TaskAddress("job", "sink", 0, 1)).open()
    _local_channel(runtime, TaskAddress("job", "sink", 0, 2)).open()
    runtime.cancel_attempt("job", 1, wait_s=0.0)
    assert runtime.channels.awaiting_consumers() == [TaskAddress("job", "sink", 0, 2)]
