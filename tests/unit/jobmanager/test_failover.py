"""Fail-over and ending a job through the JobManager: restart or fail for good, cancel, stop the
tasks, resolve transactions, and an end whose resolution fails (retried, recorded, taken over)."""

from __future__ import annotations

from tests.unit.jobmanager.conftest import TM_A, Harness
from weir.core.errors import ServiceUnavailableError
from weir.core.failures import Failure
from weir.core.states import JobStatus
from weir.jobmanager.lifecycle import RESOLUTION_DEADLINE_S
from weir.jobmanager.recovery import needs_takeover


def test_a_retriable_failure_restarts_the_job_and_cancels_the_failed_attempt(harness: Harness) -> None:
    job = harness.job()
    with harness.jm.lock:
        harness.jm.failover.fail_over(job, Failure.internal("boom"), harness.clock())
    assert job.status is JobStatus.RESTARTING and job.lifecycle.restart_at == harness.clock() + 1.0
    assert harness.gateway.named("cancel") == [(TM_A, "job-1", 1, False)]
    assert harness.resolver.resolved == []


def test_a_job_the_strategy_gives_up_on_fails_and_gets_its_transactions_resolved(harness: Harness) -> None:
    job = harness.job({"restart.strategy": "none"})
    with harness.jm.lock:
        harness.jm.failover.fail_over(job, Failure.internal("boom"), harness.clock())
    assert job.status is JobStatus.FAILED
    # As a newer attempt than every one that ran, which also stops whatever of them still runs.
    assert harness.gateway.named("cancel") == [(TM_A, "job-1", 2, True)]
    assert harness.resolver.resolved == [("job-1", 2)]
    resolution = job.lifecycle.resolution
    assert resolution is not None and resolution.resolved and not job.lifecycle.unresolved_end
    harness.jm.records.flush()
    record = harness.jm.records.load(harness.jm.paths.job_record(job.coordinator.job_id))
    assert record.status is JobStatus.FAILED and record.transactions_resolved and not needs_takeover(record)


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


def test_a_failed_task_s_taskmanagers_are_probed_and_a_gone_one_is_lost_before_the_restart_is_placed(
    make_harness,  # type: ignore[no-untyped-def]
) -> None:
    """A killed TaskManager's data streams break at once: the first report is another task's failure,
    seconds before the heartbeat timeout. The failover probes the attempt's TaskManagers, so the
    restart is placed on the live ones only, at its due time, once."""
    h: Harness = make_harness(taskmanagers=("tm-a", "tm-b"))
    job = h.job()  # on tm-a
    h.gateway.unreachable.add(TM_A)  # killed: connections refused
    with h.jm.lock:
        h.jm.failover.fail_over(job, Failure.internal("input channel 0 lost its producer"), h.clock())
    assert not h.jm.taskmanagers["tm-a"].alive and h.jm.taskmanagers["tm-b"].alive
    assert job.status is JobStatus.RESTARTING and job.failure is not None
    assert job.failure.message == "input channel 0 lost its producer"  # the task's failure, not the loss's
    h.clock.advance(1.0)  # the restart delay
    h.jm.tick()
    assert job.status is JobStatus.RUNNING and job.attempt == 2
    assert {address for address, *_ in h.gateway.named("deploy")} == {"tm-b:6124"}


def test_a_failover_leaves_reachable_taskmanagers_alive(harness: Harness) -> None:
    job = harness.job()
    with harness.jm.lock:
        harness.jm.failover.fail_over(job, Failure.internal("boom"), harness.clock())
    assert harness.jm.taskmanagers["tm-a"].alive


def test_cancel_stops_the_tasks_resolves_the_transactions_then_the_job_is_canceled(harness: Harness) -> None:
    job = harness.job()
    assert harness.jm.cancel("job-1") is JobStatus.CANCELED  # the resolution ran inline (the tests' I/O)
    assert job.status is JobStatus.CANCELED
    assert harness.gateway.named("cancel") == [(TM_A, "job-1", 2, True)]
    assert harness.resolver.resolved == [("job-1", 2)]
    assert harness.resolver.outcomes == [JobStatus.CANCELED], "the end is resolved as a cancel (a CDC slot dropped)"
    assert harness.jm.cancel("job-1") is JobStatus.CANCELED  # already ended: nothing more happens
    assert harness.resolver.resolved == [("job-1", 2)]


def test_an_end_whose_resolution_fails_is_retried_shown_recorded_and_resolved_later(harness: Harness) -> None:
    """A stop-with-savepoint's or a cancel's resolution that fails once ended the job for good with its
    transactions prepared (row locks held for ever). It is retried with back-off, also once the job
    is reported ended, it shows in the status, and the record tells a JobManager taking over."""
    job = harness.job()
    harness.resolver.error = ServiceUnavailableError("postgres is down")
    harness.jm.cancel("job-1")
    assert job.status is JobStatus.CANCELLING and job.lifecycle.unresolved_end
    view = harness.jm.job_status("job-1").end
    assert view is not None and not view.ended and not view.resolved and view.error == "postgres is down"
    assert view.retry_at == harness.clock() + 1.0
    harness.clock.advance(0.5)
    harness.jm.tick()
    assert harness.resolver.resolved == [] and job.lifecycle.resolution.attempts == 1  # type: ignore[union-attr]
    harness.clock.advance(0.6)
    harness.jm.tick()
    assert job.lifecycle.resolution.attempts == 2  # type: ignore[union-attr]
    # Past the deadline the job is reported ended, its end still unresolved and retried.
    harness.clock.advance(RESOLUTION_DEADLINE_S)
    harness.jm.tick()
    assert job.status is JobStatus.CANCELED and job.lifecycle.unresolved_end
    harness.jm.records.flush()
    record = harness.jm.records.load(harness.jm.paths.job_record(job.coordinator.job_id))
    assert record.status is JobStatus.CANCELED and not record.transactions_resolved and needs_takeover(record)
    harness.resolver.error = None
    harness.clock.advance(60.0)
    harness.jm.tick()
    assert harness.resolver.resolved and not job.lifecycle.unresolved_end
    end = harness.jm.job_status("job-1").end
    assert end is not None and end.ended and end.resolved
    harness.jm.records.flush()
    record = harness.jm.records.load(harness.jm.paths.job_record(job.coordinator.job_id))
    assert record.transactions_resolved and not needs_takeover(record)
