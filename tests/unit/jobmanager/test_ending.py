"""An ended job's sink finds its state through the task-state document, inline or stored, and is
resolved as of the latest completed checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import Environment
from weir.core.cdc import JobEnd
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId
from weir.core.keygroups import KeyGroupRange
from weir.core.states import JobStatus
from weir.core.task_state import (
    InlineOperatorState,
    OperatorStateHandle,
    SubtaskLayout,
    TaskStateDocument,
    encode_task_state,
    pack_operator_states,
)
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.ending import job_end_of, release_source_slots, resolve_sink_transactions, sink_state
from weir.jobmanager.records import JobSubmission
from weir.plan import build_plan

JOB = JobId("job-1")


def checkpoint_with(operator_state: OperatorStateHandle) -> CompletedCheckpoint:
    document = TaskStateDocument(
        "job-1",
        "sink",
        1,
        1,
        CheckpointId(3),
        SubtaskLayout(2, 128, KeyGroupRange(KeyGroup(64), KeyGroup(127)), ("sink",), ()),
        operator_state,
    )
    handle = TaskStateHandle(
        TaskId(JOB, OperatorUid("sink"), SubtaskIndex(1)), inline_payload=encode_task_state(document)
    )
    return CompletedCheckpoint(CheckpointId(3), JOB, 1.0, 2.0, (handle,), "job-1/checkpoints/chk-3/_metadata")


def test_a_sink_state_stored_as_an_object_is_read_through_its_handle() -> None:
    pending = b"pending-output" * 5_000
    stored, blob = pack_operator_states({"sink": pending, "map": b"m"}, "job-1/checkpoints/chk-3/tasks/sink/00001")
    checkpoint = checkpoint_with(stored)
    assert sink_state(checkpoint, "sink", 1, "sink", {stored.key: blob}.__getitem__) == pending
    assert sink_state(checkpoint, "sink", 0, "sink", {stored.key: blob}.__getitem__) is None


def test_an_inline_sink_state_needs_no_storage() -> None:
    def no_storage(key: str) -> bytes:
        raise AssertionError(f"read {key}")

    checkpoint = checkpoint_with(InlineOperatorState({"sink": b"txn-7"}))
    assert sink_state(checkpoint, "sink", 1, "sink", no_storage) == b"txn-7"
    assert sink_state(None, "sink", 1, "sink", no_storage) is None


def test_an_ended_jobs_file_sink_is_resolved_like_the_other_transactional_sinks(
    make_context: MakeContext, tmp_path: Path
) -> None:
    """Cancelled with no completed checkpoint: the JobManager discards every unfinished part file of
    the job's file sink; a finished one (of another job at the same path) stays."""
    root = tmp_path / "files"
    env = Environment("j", parallelism=2)
    env.from_collection([1], uid="src").sink_to_files(str(root), uid="files", format="jsonl")
    factory = env.graph.transformations["files"].factory
    for subtask in (0, 1):
        writer = factory()
        writer.setup(make_context("files", subtask=subtask, parallelism=2, job_id="job-1"), CollectingOutput())
        writer.open()
        writer.process({"n": subtask}, 0)  # in progress, never checkpointed; the task dies (no close)
    other_job = root / "dt=1970-01-01/hour=00/part-files-job%2D2-0-1-0.jsonl"
    other_job.write_text('{"n": 9}\n')
    assert len(list(root.rglob(".part-*.inprogress"))) == 2
    submission = JobSubmission("job-1", "j", "j.py", b"", {}, 2, 0.0)
    report = resolve_sink_transactions(env.graph, build_plan(env.graph), submission, 2, None)
    assert report.sink_subtasks == 2
    assert list(root.rglob(".part-*")) == []
    assert [p for p in root.rglob("*") if p.is_file()] == [other_job]


def test_every_end_a_resolution_sees_is_one_job_end_and_no_other_status_is() -> None:
    ends = {status: job_end_of(status) for status in JobStatus if status.terminal}
    assert ends == {
        JobStatus.CANCELED: JobEnd.CANCELED,
        JobStatus.FAILED: JobEnd.FAILED,
        JobStatus.FINISHED: JobEnd.STOPPED_AT_SAVEPOINT,  # a job whose tasks all finished resolves nothing
    }
    for status in JobStatus:
        if not status.terminal:
            with pytest.raises(ValueError, match="a job's end is not"):
                job_end_of(status)


def test_a_job_without_a_cdc_source_releases_nothing() -> None:
    env = Environment("j")
    env.from_collection([1, 2], uid="numbers").print(uid="out")
    release_source_slots(env.graph, "job-1", JobStatus.CANCELED)  # no PostgreSQL needed: nothing to do
