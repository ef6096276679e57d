"""Fail-over and ending a job: restart or fail for good, cancel, stop the tasks, resolve transactions."""

from __future__ import annotations

from tests.unit.jobmanager.conftest import TM_A, Harness
from weir.core.errors import ServiceUnavailableError
from weir.core.failures import Failure
from weir.core.states import JobStatus


def test_a_retriable_failure_restarts_the_job_and_cancels_the_failed_attempt(harness: Harness) -> None:
    job = harness.job()
    with harness.jm.lock:
        harness.jm.failover.fail_over(job, Failure.internal("boom"), harness.clock())
    assert job.status is JobStatus.RESTARTING and job.restart_at == harness.clock() + 1.0
    assert harness.gateway.named("cancel") == [(TM_A, "job-1", 1, False)]
    assert harness.resolver.resolved == []


def test_a_job_the_strategy_gives_up_on_fails_and_gets_its_transactions_resolved(harness: Harness) -> None:
    job = harness.job({"restart.strategy": "none"})
    with harness.jm.lock:
        harness.jm.failover.fail_over(job, Failure.internal("boom"), harness.clock())
    assert job.status is JobStatus.FAILED
    assert harness.gateway.named("cancel") == [(TM_A, "job-1", 1, True)]
    assert harness.resolver.resolved == [("job-1", 2)]  # as a newer attempt than every one that ran
    assert job.transactions_resolved
    harness.jm.records.flush()
    record = harness.jm.records.load(harness.jm.paths.job_record(job.coordinator.job_id))
    assert record.status is JobStatus.FAILED and record.transactions_resolved


def test_a_lost_taskmanager_fails_over_only_the_jobs_running_on_it(make_harness) -> None:  # type: ignore[no-untyped-def]
    h: Harness = make_harness(taskmanagers=("tm-a", "tm-b"))
    job = h.job()
    with h.jm.lock:
        h.jm.failover.taskmanager_lost(h.jm.taskmanagers["tm-b"], "test")
    assert job.status is JobStatus.RUNNING
    with h.jm.lock:
        h.jm.failover.taskmanager_lost(h.jm.taskmanagers["tm-a"], "test")
    assert job.status is JobStatus.RESTARTING
    assert job.failure is not None and job.failure.message == "TaskManager tm-a lost (test)"


def test_cancel_stops_the_tasks_resolves_the_transactions_then_the_job_is_canceled(harness: Harness) -> None:
    job = harness.job()
    assert harness.jm.cancel("job-1") is JobStatus.CANCELLING  # the status when the request was taken
    assert job.status is JobStatus.CANCELED
    assert harness.gateway.named("cancel") == [(TM_A, "job-1", 1, True)]
    assert harness.resolver.resolved == [("job-1", 2)]
    assert harness.jm.cancel("job-1") is JobStatus.CANCELED  # already ended: nothing more happens
    assert harness.resolver.resolved == [("job-1", 2)]


def test_a_resolution_that_fails_when_the_jobmanager_stops_is_recorded_and_the_job_ends(harness: Harness) -> None:
    job = harness.job()
    harness.resolver.error = ServiceUnavailableError("postgres is down")
    harness.jm.stop()  # no retries after stop
    harness.jm.cancel("job-1")
    assert job.status is JobStatus.CANCELED
    assert not job.transactions_resolved and job.resolution_error == "postgres is down"
