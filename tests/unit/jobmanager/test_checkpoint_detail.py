"""One checkpoint's detail: each subtask's timeline travels from its acknowledgement through the
coordinator's stats and the read API to the gRPC answer and the client, with the ack's arrival."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.jobmanager.conftest import Harness, served
from weir.core.checkpointing import ChannelBarrierTime, CheckpointStatus, SubtaskCheckpointTimeline
from weir.core.codec import timeline_from_proto, timeline_to_proto
from weir.core.errors import UnknownCheckpointError, UnknownJobError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import CheckpointAck
from weir.jobmanager.service import checkpoint_ack, checkpoint_detail_response, checkpoints_response
from weir.tools.client import JobManagerClient, _checkpoint
from weir.wire import common_pb2, jobmanager_pb2

TIMELINE = SubtaskCheckpointTimeline(
    first_barrier_at=100.25,
    channels=(
        ChannelBarrierTime(0, "map", 0, 100.25),
        ChannelBarrierTime(1, "map", 1, 100.75),
        ChannelBarrierTime(2, "map", 2, None),  # ended before its barrier
    ),
    alignment_end_at=100.75,
    sync_end_at=100.8,
    async_end_at=101.5,
)
GEN0 = TaskId(JobId("job-1"), OperatorUid("gen"), SubtaskIndex(0))


def test_a_timeline_survives_the_wire_both_ways() -> None:
    assert timeline_from_proto(timeline_to_proto(TIMELINE)) == TIMELINE
    message = timeline_to_proto(TIMELINE)
    assert not message.channels[2].HasField("barrier_at") and message.channels[0].HasField("barrier_at")


def test_the_servicer_reads_the_timeline_of_an_acknowledgement_and_none_when_unset() -> None:
    request = jobmanager_pb2.AcknowledgeCheckpointRequest(
        task=common_pb2.TaskRef(job_id="j", vertex_uid="win", subtask=1), checkpoint_id=3, attempt=1
    )
    assert checkpoint_ack(request).metrics.timeline is None
    request.timeline.CopyFrom(timeline_to_proto(TIMELINE))
    assert checkpoint_ack(request).metrics.timeline == TIMELINE


def _started(harness: Harness) -> tuple[JobMaster, CheckpointId]:
    job = harness.job({"checkpointing.interval": "1s"})
    with harness.jm.lock:
        harness.jm.executor.execute(
            job, job.lifecycle.tasks_running(harness.clock(), job.all_task_ids(), restored=False)
        )
        harness.clock.advance(1.5)
        actions = job.lifecycle.tick(harness.clock())
        (trigger,) = [a for a in actions if isinstance(a, cc.TriggerBarriers)]
        harness.jm.executor.execute(job, actions)
    return job, trigger.checkpoint_id


def _ack(job: JobMaster, checkpoint_id: int) -> CheckpointAck:
    metrics = TaskAckMetrics(alignment_duration_s=0.5, sync_duration_s=0.05, async_duration_s=0.7, timeline=TIMELINE)
    return CheckpointAck("job-1", "gen", 0, job.attempt, checkpoint_id, (), b"offsets", metrics)


def test_an_in_progress_checkpoint_names_the_subtasks_still_owing_their_ack(harness: Harness) -> None:
    job, cid = _started(harness)
    detail = harness.jm.checkpoint_detail(job.job_id, cid)
    assert detail.checkpoint.status is CheckpointStatus.IN_PROGRESS
    assert detail.checkpoint.tasks == () and detail.checkpoint.pending_tasks == (GEN0,)


def test_a_completed_checkpoint_keeps_each_subtasks_timeline_and_ack_time(harness: Harness) -> None:
    job, cid = _started(harness)
    harness.clock.advance(0.25)
    acked_at = harness.clock()
    harness.jm.acknowledge_checkpoint(_ack(job, cid))
    detail = harness.jm.checkpoint_detail(job.job_id, cid)
    assert detail.checkpoint.status is CheckpointStatus.COMPLETED and detail.checkpoint.pending_tasks == ()
    (task,) = detail.checkpoint.tasks
    assert (task.task_id, task.acked_at, task.timeline) == (GEN0, acked_at, TIMELINE)
    assert (task.sync_duration_s, task.async_duration_s) == (0.05, 0.7)
    assert detail.external_path is not None and detail.external_path.endswith("/")  # retained

    (client_task,) = _checkpoint(checkpoint_detail_response(detail).checkpoint).tasks
    assert (client_task.acked_at, client_task.timeline) == (acked_at, TIMELINE)
    assert client_task.async_duration_s == 0.7


def test_the_checkpoint_list_leaves_the_timelines_out(harness: Harness) -> None:
    job, cid = _started(harness)
    harness.jm.acknowledge_checkpoint(_ack(job, cid))
    listed = checkpoints_response(harness.jm.list_checkpoints(job.job_id))
    (task,) = next(c for c in listed.checkpoints if c.checkpoint_id == cid).tasks
    assert not task.HasField("timeline") and task.HasField("acked_at")


def test_an_unknown_checkpoint_or_job_is_named(harness: Harness) -> None:
    job, cid = _started(harness)
    with pytest.raises(UnknownCheckpointError, match=f"job {job.job_id} has no checkpoint {cid + 40}"):
        harness.jm.checkpoint_detail(job.job_id, cid + 40)
    with pytest.raises(UnknownJobError):
        harness.jm.checkpoint_detail("nope", cid)


@pytest.fixture
def client(harness: Harness) -> Iterator[JobManagerClient]:
    with served(harness.jm) as client:
        yield client


def test_the_client_gets_the_detail_and_tells_an_unknown_checkpoint_from_an_unknown_job(
    harness: Harness, client: JobManagerClient
) -> None:
    job, cid = _started(harness)
    harness.jm.acknowledge_checkpoint(_ack(job, cid))
    detail = client.checkpoint_detail(job.job_id, cid)
    assert detail.checkpoint.checkpoint_id == cid and detail.pending == ()
    (task,) = detail.checkpoint.tasks
    assert (task.vertex_uid, task.subtask, task.timeline) == ("gen", 0, TIMELINE)
    with pytest.raises(UnknownCheckpointError):
        client.checkpoint_detail(job.job_id, cid + 40)
    with pytest.raises(UnknownJobError):
        client.checkpoint_detail("nope", cid)
