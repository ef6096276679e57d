"""`weir run --from-checkpoint`: the JobManager reads another job's retained checkpoint, hands each new
vertex the task states it inherits, resolves the old job's sinks first, and keeps doing so across a
restart of itself until the new job has a checkpoint of its own."""

from __future__ import annotations

import json

import pytest

from tests.unit.jobmanager.conftest import JOB, Harness, MakeHarness
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId
from weir.core.inflight_state import InflightState, OutputTarget, encode_inflight
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import external_path
from weir.core.rescale import StateAssignmentError
from weir.core.states import JobStatus
from weir.core.task_state import (
    InlineOperatorState,
    OperatorStateHandle,
    SubtaskLayout,
    TaskStateDocument,
    encode_task_state,
    pack_operator_states,
)
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.restoring import CheckpointNotFoundError, SourceJobRunningError
from weir.jobmanager.submission import SubmitRequest
from weir.wire.taskmanager_pb2 import DataMessage

OLD = JobId("old-job")


def retained_checkpoint(
    h: Harness, job_id: JobId = OLD, checkpoint_id: int = 3, operator_state: OperatorStateHandle | None = None
) -> tuple[str, bytes]:
    """A completed checkpoint of the test job (generator chained with a print sink) in storage: its
    external path and its one task-state document (``operator_state``: its operator state, else the
    generator's position)."""
    if operator_state is None:
        operator_state = InlineOperatorState({"gen": json.dumps({"format": 1, "next_k": 40}).encode()})
    document = encode_task_state(
        TaskStateDocument(
            job_id=job_id,
            vertex_uid="gen",
            subtask=0,
            attempt=1,
            checkpoint_id=CheckpointId(checkpoint_id),
            layout=SubtaskLayout(1, 128, KeyGroupRange(KeyGroup(0), KeyGroup(127)), ("gen", "out"), ()),
            operator_state=operator_state,
        )
    )
    key = h.jm.paths.metadata(job_id, CheckpointId(checkpoint_id))
    checkpoint = CompletedCheckpoint(
        CheckpointId(checkpoint_id),
        job_id,
        1.0,
        2.0,
        (TaskStateHandle(TaskId(job_id, OperatorUid("gen"), SubtaskIndex(0)), inline_payload=document),),
        key,
    )
    h.storage.put_bytes(key, encode_metadata(checkpoint))
    return external_path(h.storage.uri, key), document


def submit(h: Harness, path: str, *, allow_non_restored_state: bool = False) -> str:
    return h.jm.submit(
        SubmitRequest(
            "", "j.py", JOB, {}, parallelism=1, from_checkpoint=path, allow_non_restored_state=allow_non_restored_state
        )
    )


def test_a_job_from_a_retained_checkpoint_inherits_its_task_states(harness: Harness) -> None:
    path, document = retained_checkpoint(harness)
    assert path == f"{harness.storage.uri}/old-job/checkpoints/chk-{3:020d}/"
    job = harness.jm.jobs[submit(harness, path)]
    assert job.submission.restored_from == path
    assert job.initial_state is not None and job.initial_state.checkpoint.job_id == OLD
    assert job.inherited == {"gen": (document,)} and job.restore == {}
    assert job.restore_checkpoint_id == 3 and job.status is JobStatus.RUNNING
    record = harness.jm.records.load(harness.jm.paths.job_record(JobId(job.job_id)))
    assert record.submission.restored_from == job.submission.restored_from


@pytest.mark.parametrize("spelling", ["metadata", "directory"])
def test_the_path_may_name_the_metadata_or_be_a_plain_directory(harness: Harness, spelling: str) -> None:
    path, _ = retained_checkpoint(harness)
    given = path + "_metadata" if spelling == "metadata" else path.removeprefix("file://")
    assert harness.jm.jobs[submit(harness, given)].initial_state is not None


def test_a_relative_path_is_refused_with_what_to_pass(harness: Harness) -> None:
    path, _ = retained_checkpoint(harness)
    with pytest.raises(CheckpointNotFoundError, match="is not an external path: pass the URI"):
        submit(harness, path[len(harness.storage.uri) + 1 :])


def test_a_checkpoint_that_is_not_there_is_a_clear_error(harness: Harness) -> None:
    path, _ = retained_checkpoint(harness)
    with pytest.raises(
        CheckpointNotFoundError, match="no checkpoint or savepoint metadata at .*chk-00000000000000000004"
    ):
        submit(harness, path.replace("chk-00000000000000000003", "chk-00000000000000000004"))
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint or savepoint metadata at file:///nowhere"):
        submit(harness, "file:///nowhere/old-job/checkpoints/chk-00000000000000000003/")
    assert not harness.jm.jobs


def test_a_checkpoint_of_a_job_still_running_here_is_refused(harness: Harness) -> None:
    running = harness.job(job_id="old-job")
    assert running.status is JobStatus.RUNNING
    path, _ = retained_checkpoint(harness)
    with pytest.raises(SourceJobRunningError, match="job old-job that took it is RUNNING: cancel it first"):
        submit(harness, path)
    assert list(harness.jm.jobs) == ["old-job"]


def test_a_restarted_jobmanager_restores_the_new_job_from_the_retained_checkpoint_again(
    make_harness: MakeHarness,
) -> None:
    first = make_harness()
    path, document = retained_checkpoint(first)
    job_id = submit(first, path)
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs[job_id]
    assert recovered.initial_state is not None
    assert recovered.initial_state.by_vertex == {"gen": (document,)}


def test_checkpoints_recovered_from_storage_are_listed_with_their_external_path(make_harness: MakeHarness) -> None:
    first = make_harness()
    first.job(job_id=OLD)
    first.jm.cancel(OLD)
    first.jm.records.flush()
    path, _ = retained_checkpoint(first)
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 0 and second.jm.recover_history() == 1  # ended and resolved: history
    view = second.jm.list_checkpoints(OLD)
    assert [(c.checkpoint_id, c.status.value) for c in view.checkpoints] == [(3, "COMPLETED")]
    assert view.external_paths == {3: path}


def test_records_in_flight_for_a_consumer_the_new_job_lacks_are_refused_at_submit_unless_allowed(
    harness: Harness,
) -> None:
    """The old job's generator also sent to a "totals" vertex, and its unaligned checkpoint holds
    records queued for it, in an object in checkpoint storage; the new job's generator sends nowhere."""
    buffer = DataMessage(records=b"x", record_count=1).SerializeToString()
    inflight = encode_inflight(
        InflightState(CheckpointId(3), {}, {(0, 0): (buffer,)}, targets={0: OutputTarget("totals", 0, "gen")})
    )
    key = "old-job/checkpoints/chk-00000000000000000003/tasks/gen/00000"
    handle, blob = pack_operator_states(
        {"gen": json.dumps({"format": 1, "next_k": 40}).encode(), "__inflight__": inflight}, key
    )
    harness.storage.put_bytes(key, blob)
    path, _ = retained_checkpoint(harness, operator_state=handle)
    with pytest.raises(StateAssignmentError, match=r"subtask gen#0 queued for gen -> totals input 0.*--allow-non"):
        submit(harness, path)
    assert not harness.jm.jobs
    job = harness.jm.jobs[submit(harness, path, allow_non_restored_state=True)]
    assert job.initial_state is not None
