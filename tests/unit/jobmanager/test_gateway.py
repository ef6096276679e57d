"""The gRPC gateway to TaskManagers: deployments on the wire, failed calls as TaskManagerCallError."""

from __future__ import annotations

import pytest

from weir.core.checkpointing import CheckpointingMode
from weir.jobmanager.errors import TaskManagerCallError
from weir.jobmanager.gateway import GrpcTaskManagerGateway, deploy_request
from weir.jobmanager.jobs import InputChannelSpec, OutputChannelSpec, TaskDeployment
from weir.wire import common_pb2

DEPLOYMENT = TaskDeployment(
    job_id="job-1",
    vertex_uid="sum",
    subtask=1,
    attempt=3,
    job_name="sums",
    job_source=b"src",
    job_file_name="sums.py",
    parameters={"a": "b"},
    parallelism=2,
    restore_state_handle=b"state",
    restore_checkpoint_id=7,
    inherited_task_states=(b"doc-a", b"doc-b"),
    restore_storage_uri="s3://elsewhere/savepoints/upgrade-1",
    checkpointing_mode=CheckpointingMode.AT_LEAST_ONCE,
    buffer_timeout_ms=0,
    aligned_checkpoint_timeout_ms=5000,
    inputs=(InputChannelSpec(gate=0, channel=2, producer_vertex="gen", producer_subtask=2),),
    outputs=(OutputChannelSpec(0, 1, "out", 1, "host-b:6124", 0),),
)


def test_a_deployment_goes_on_the_wire_field_by_field() -> None:
    r = deploy_request(DEPLOYMENT)
    assert (r.task.job_id, r.task.vertex_uid, r.task.subtask, r.attempt) == ("job-1", "sum", 1, 3)
    assert (r.job_name, r.job_source, r.job_file_name, dict(r.parameters), r.parallelism) == (
        "sums",
        b"src",
        "sums.py",
        {"a": "b"},
        2,
    )
    assert (r.restore_state_handle, r.restore_checkpoint_id) == (b"state", 7)
    assert list(r.inherited_task_states) == [b"doc-a", b"doc-b"]
    assert r.restore_storage_uri == "s3://elsewhere/savepoints/upgrade-1"
    assert r.checkpointing_mode == common_pb2.CHECKPOINTING_MODE_AT_LEAST_ONCE
    assert r.aligned_checkpoint_timeout_ms == 5000
    assert r.HasField("buffer_timeout_ms") and r.buffer_timeout_ms == 0
    (i,) = r.inputs
    assert (i.gate, i.channel, i.producer.job_id, i.producer.vertex_uid, i.producer.subtask) == (
        0,
        2,
        "job-1",
        "gen",
        2,
    )
    (o,) = r.outputs
    assert (o.output, o.channel, o.consumer.vertex_uid, o.consumer.subtask, o.consumer_address, o.consumer_channel) == (
        0,
        1,
        "out",
        1,
        "host-b:6124",
        0,
    )


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_call_to_an_address_nobody_listens_on_is_unavailable() -> None:
    gateway = GrpcTaskManagerGateway()
    gateway.connect("127.0.0.1:1")
    with pytest.raises(TaskManagerCallError) as failed:
        gateway.cancel_job_tasks("127.0.0.1:1", "job-1", 1, job_ended=False)
    assert failed.value.unavailable and failed.value.address == "127.0.0.1:1"
