"""Savepoints on request in the JobManager: trigger, copy to the asked directory, stop the job at it
(FINISHED, its sinks resolved as of it), and a failed savepoint leaves the job running."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.jobmanager.conftest import Harness
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.ids import CheckpointId, TaskManagerId
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.pending import StateObject, TaskAckMetrics
from weir.jobmanager.errors import CheckpointRejectedError, SavepointRejectedError
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import CheckpointAck


def running_job(h: Harness) -> JobMaster:
    job = h.job({"checkpointing.interval": "1h", "restart.strategy": "none"})
    with h.jm.lock:
        h.jm.executor.execute(job, job.lifecycle.tasks_running(h.clock(), job.all_task_ids(), restored=False))
    return job


def acknowledge_savepoint(h: Harness, job: JobMaster, savepoint_id: int) -> StateObject:
    """The one task uploads a file into the savepoint's folder and acknowledges."""
    cid = CheckpointId(savepoint_id)
    key = h.jm.paths.db_file(
        job.coordinator.job_id, cid, TaskManagerId("tm-a"), "db1", 0, "000007.sst", CheckpointKind.SAVEPOINT
    )
    h.storage.put_bytes(key, b"s" * 64)
    obj = StateObject(key, 64)
    h.jm.acknowledge_checkpoint(CheckpointAck(job.job_id, "gen", 0, job.attempt, cid, (obj,), b"{}", TaskAckMetrics()))
    return obj


def test_a_savepoint_is_copied_to_the_asked_directory_and_listed_with_that_path(
    harness: Harness, tmp_path: Path
) -> None:
    job = running_job(harness)
    target = (tmp_path / "user-savepoints").as_uri()
    savepoint_id = harness.jm.trigger_savepoint(job.job_id, target, stop=False, drain=False)
    triggers = harness.gateway.named("trigger")
    assert triggers[-1][3] == savepoint_id and triggers[-1][4] is CheckpointKind.SAVEPOINT
    acknowledge_savepoint(harness, job, savepoint_id)
    folder = tmp_path / "user-savepoints" / f"savepoint-{job.job_id}-{savepoint_id}"
    assert (folder / "_metadata").is_file()
    assert (folder / "db" / "tm-a" / "db1" / "000000" / "000007.sst").read_bytes() == b"s" * 64
    view = harness.jm.list_checkpoints(job.job_id)
    assert view.external_paths[CheckpointId(savepoint_id)] == f"{folder.as_uri()}/"
    assert job.status is JobStatus.RUNNING, "a savepoint alone does not stop the job"


def test_stop_with_savepoint_ends_the_job_finished_with_its_sinks_resolved(harness: Harness) -> None:
    job = running_job(harness)
    savepoint_id = harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=True)
    assert harness.gateway.named("trigger")[-1][3] == savepoint_id
    with pytest.raises(SavepointRejectedError, match="already stopping with savepoint"):
        harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    acknowledge_savepoint(harness, job, savepoint_id)
    assert job.status is JobStatus.FINISHED
    assert harness.resolver.resolved == [(job.job_id, job.attempt)], "the sinks were resolved as of the savepoint"
    assert harness.resolver.outcomes == [JobStatus.FINISHED], "resolved as a stop at a savepoint (a CDC slot kept)"
    latest = job.coordinator.store.latest()
    assert latest is not None and latest.checkpoint_id == savepoint_id and latest.is_savepoint
    path = harness.jm.list_checkpoints(job.job_id).external_paths[CheckpointId(savepoint_id)]
    assert path.endswith(f"/{job.job_id}/savepoints/sp-{savepoint_id:020d}/")


def test_a_savepoint_that_cannot_be_copied_fails_and_the_job_keeps_running(harness: Harness, tmp_path: Path) -> None:
    job = running_job(harness)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    savepoint_id = harness.jm.trigger_savepoint(job.job_id, blocker.as_uri(), stop=True, drain=False)
    acknowledge_savepoint(harness, job, savepoint_id)
    assert job.status is JobStatus.RUNNING and job.lifecycle.stop_request is None
    (summary,) = [c for c in harness.jm.list_checkpoints(job.job_id).checkpoints if c.checkpoint_id == savepoint_id]
    assert summary.status is CheckpointStatus.FAILED and summary.failure is not None
    assert harness.resolver.resolved == []


def test_a_savepoint_of_a_job_that_is_not_running_is_refused(harness: Harness) -> None:
    job = running_job(harness)
    harness.jm.cancel(job.job_id)
    with pytest.raises(SavepointRejectedError, match="a savepoint needs a RUNNING job"):
        harness.jm.trigger_savepoint(job.job_id, "", stop=False, drain=False)


def test_an_unexpected_error_while_persisting_fails_the_savepoint_instead_of_leaving_it_persisting(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = running_job(harness)
    real_put = harness.storage.put_bytes

    def put_bytes(key: str, data: bytes) -> None:
        if key.endswith("_metadata") and "/savepoints/" in key:
            raise RuntimeError("a client error the adapter did not expect")
        real_put(key, data)

    monkeypatch.setattr(harness.storage, "put_bytes", put_bytes)
    savepoint_id = harness.jm.trigger_savepoint(job.job_id, "", stop=False, drain=False)
    acknowledge_savepoint(harness, job, savepoint_id)
    assert job.coordinator.persisting_ids == (), "the savepoint stayed persisting: no checkpoint could follow"
    (summary,) = [c for c in harness.jm.list_checkpoints(job.job_id).checkpoints if c.checkpoint_id == savepoint_id]
    assert summary.status is CheckpointStatus.FAILED
    assert harness.jm.trigger_savepoint(job.job_id, "", stop=False, drain=False) > savepoint_id


def test_a_checkpoint_on_request_is_triggered_now_outside_the_interval(harness: Harness) -> None:
    """`weir checkpoint JOB_ID` (Flink's `flink checkpoint`): the interval is an hour, yet the barrier
    goes out at once, as a checkpoint; a second one while it is in flight is refused, retriable."""
    job = running_job(harness)
    checkpoint_id = harness.jm.trigger_checkpoint(job.job_id, full=False)
    trigger = harness.gateway.named("trigger")[-1]
    assert trigger[3] == checkpoint_id and trigger[4] is CheckpointKind.CHECKPOINT
    assert harness.gateway.full_triggers == []
    with pytest.raises(CheckpointRejectedError, match=f"checkpoint {checkpoint_id} is still in progress"):
        harness.jm.trigger_checkpoint(job.job_id, full=False)


def test_a_full_checkpoint_tells_every_source_its_barrier_is_full(harness: Harness) -> None:
    """`weir checkpoint --full`: the trigger sent to every source task says full (the sources put it
    on the barrier); a periodic checkpoint after it is incremental again."""
    job = running_job(harness)
    checkpoint_id = harness.jm.trigger_checkpoint(job.job_id, full=True)
    sources = {t[1] for t in harness.gateway.named("trigger") if t[3] == checkpoint_id}
    assert sources and harness.gateway.full_triggers == [checkpoint_id] * len(sources)
    (summary,) = [c for c in harness.jm.list_checkpoints(job.job_id).checkpoints if c.checkpoint_id == checkpoint_id]
    assert summary.full


def test_a_checkpoint_of_a_job_that_is_not_running_is_refused(harness: Harness) -> None:
    job = harness.job({"checkpointing.interval": "1h", "restart.strategy": "none"})
    with pytest.raises(CheckpointRejectedError, match="is not running"):
        harness.jm.trigger_checkpoint(job.job_id, full=False)
