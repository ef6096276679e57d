"""Recovery of a restarted JobManager from job records and checkpoint metadata."""

from __future__ import annotations

from jobmanager.registry import HEARTBEAT_TIMEOUT_S
from tests.unit.jobmanager.conftest import MakeHarness
from weir.core.checkpointing import CheckpointKind
from weir.core.failures import Failure
from weir.core.ids import CheckpointId
from weir.core.states import JobStatus


def test_a_running_job_restarts_once_the_old_attempt_s_tasks_were_told_to_stop(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job()
    assert first.jm.records.save(job).result()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs["job-1"]
    assert recovered.status is JobStatus.RESTARTING and recovered.attempt == job.attempt
    assert recovered.restart_at == second.clock() + HEARTBEAT_TIMEOUT_S / 2
    assert second.resolver.resolved == []


def test_a_failed_job_whose_transactions_were_not_resolved_gets_them_resolved(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job({"restart.strategy": "none"})
    job.fail_over(Failure.internal("boom"), first.clock())  # the JobManager dies before it resolves them
    assert job.status is JobStatus.FAILED and first.jm.records.save(job).result()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs["job-1"]
    assert recovered.status is JobStatus.FAILED and recovered.transactions_resolved
    assert second.resolver.resolved == [("job-1", job.attempt + 1)]


def test_a_finished_job_is_only_listed(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job()
    job.status = JobStatus.FINISHED
    assert first.jm.records.save(job).result()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    assert second.jm.jobs["job-1"].status is JobStatus.FINISHED and second.resolver.resolved == []


def test_a_record_that_cannot_be_read_is_left_alone(make_harness: MakeHarness) -> None:
    h = make_harness()
    h.storage.put_bytes("job-9/_job", b"not json")
    assert h.jm.recover_jobs() == 0
    assert h.storage.get_bytes("job-9/_job") == b"not json"
    assert h.jm.jobs == {}


def test_a_job_whose_checkpoint_metadata_cannot_be_read_is_left_alone_and_the_jobmanager_starts(
    make_harness: MakeHarness,
) -> None:
    """Metadata another Weir version wrote (a pickle naming a module that moved) made the JobManager
    exit at start, in a restart loop; restoring an older checkpoint instead could roll back what
    the sinks committed for the unreadable one."""
    first = make_harness()
    job = first.job()
    assert first.jm.records.save(job).result()
    metadata = first.jm.paths.metadata_key_fn()(job.coordinator.job_id, CheckpointId(3), CheckpointKind.CHECKPOINT)
    first.storage.put_bytes(metadata, b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x08weir.ids\x94.")
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 0
    assert "job-1" not in second.jm.jobs
    assert second.storage.get_bytes(metadata).startswith(b"\x80\x04")  # nothing deleted
