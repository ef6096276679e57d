"""An unaligned checkpoint is visible in its stats: each task's ack says whether it persisted
in-flight records and how many bytes, through the JobManager to `weir checkpoints`."""

from __future__ import annotations

from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary, TaskCheckpointStats
from weir.jobmanager.messages import CheckpointsView
from weir.jobmanager.service import checkpoint_ack, checkpoints_response
from weir.tools.client import _checkpoint
from weir.wire import common_pb2, jobmanager_pb2


def test_the_unaligned_flag_and_inflight_bytes_travel_from_the_ack_to_the_client() -> None:
    ack = checkpoint_ack(
        jobmanager_pb2.AcknowledgeCheckpointRequest(
            task=common_pb2.TaskRef(job_id="j", vertex_uid="win", subtask=1),
            checkpoint_id=3,
            attempt=1,
            unaligned=True,
            inflight_bytes=1792,
        )
    )
    assert ack.metrics.unaligned and ack.metrics.inflight_bytes == 1792
    task = TaskId(JobId("j"), OperatorUid("win"), SubtaskIndex(1))
    stats = TaskCheckpointStats(task, 1.0, 0.0, 0.0, 2000, 0.0, 0.0, unaligned=True, inflight_bytes=1792)
    aligned = TaskCheckpointStats(TaskId(JobId("j"), OperatorUid("src"), SubtaskIndex(0)), 1.0, 0.0, 0.0, 10, 0.0, 0.0)
    summary = CheckpointSummary(
        CheckpointId(3),
        CheckpointKind.CHECKPOINT,
        CheckpointStatus.COMPLETED,
        0.0,
        1.0,
        2,
        2,
        2010,
        None,
        (stats, aligned),
    )
    (info,) = checkpoints_response(CheckpointsView("j", (summary,))).checkpoints
    client_info = _checkpoint(info)
    assert client_info.unaligned and client_info.inflight_bytes == 1792
    assert [(t.vertex_uid, t.unaligned, t.inflight_bytes) for t in client_info.tasks] == [
        ("win", True, 1792),
        ("src", False, 0),
    ]
