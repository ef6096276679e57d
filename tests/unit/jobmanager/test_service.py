"""The composed JobManager's decisions about attempts, TaskManagers and recovery, driven without a
network: TaskManagers are registered at addresses nothing listens on, storage is a local directory."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.api import load_job_source
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.failures import Failure
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.jobs import JobMaster, JobSubmission
from weir.jobmanager.manager import JobManager
from weir.jobmanager.messages import Heartbeat, TaskProgress
from weir.jobmanager.records import JobRecord
from weir.jobmanager.scheduler import SlotOffer

JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_generator(lambda i: i, uid="gen", count=100, parallelism=1).print(uid="out")
    """
).encode()
TM_ADDRESS = "127.0.0.1:1"  # nothing connects: gRPC channels are only created


@pytest.fixture
def storage(tmp_path: Path) -> FileCheckpointStorage:
    return FileCheckpointStorage(tmp_path / "storage")


@pytest.fixture
def jm(storage: FileCheckpointStorage) -> Iterator[JobManager]:
    manager = JobManager(storage)
    manager.register_taskmanager("tm-a", TM_ADDRESS, 4, 0, incarnation="first")
    yield manager
    manager.stop()


def running_job(jm: JobManager, parameters: dict[str, str] | None = None) -> JobMaster:
    params = parameters or {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
    loaded = load_job_source(JOB, "j.py", params, parallelism=1)
    job = JobMaster.create(JobSubmission("job-1", "j", "j.py", JOB, params, 1, 0.0), loaded, jm.paths.metadata_key_fn())
    jm.jobs["job-1"] = job
    job.schedule([SlotOffer("tm-a", 4)], {"tm-a": TM_ADDRESS}, 1.0)
    return job


def progress(attempt: int) -> TaskProgress:
    return TaskProgress("job-1", "gen", 0, attempt, records_in=0, records_out=0)


def wait_for(condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_heartbeat_cancels_only_the_stale_attempt(jm: JobManager) -> None:
    job = running_job(jm)
    with jm.lock:
        jm.failover.fail_over(job, Failure.internal("lost"), 2.0)
    job.schedule([SlotOffer("tm-a", 4)], {"tm-a": TM_ADDRESS}, 3.0)
    assert job.attempt == 2
    response = jm.heartbeat(Heartbeat("tm-a", (progress(1), progress(2))))
    assert [(c.job_id, c.attempt) for c in response.cancel] == [("job-1", 1)]


def test_a_heartbeat_cancels_tasks_of_unknown_and_ended_jobs(jm: JobManager) -> None:
    job = running_job(jm)
    job.lifecycle.cancel(5.0)  # ending: its tasks are to stop
    stranger = TaskProgress("ghost", "x", 0, 3, records_in=0, records_out=0)
    response = jm.heartbeat(Heartbeat("tm-a", (progress(1), stranger)))
    assert sorted((c.job_id, c.attempt) for c in response.cancel) == [("ghost", 3), ("job-1", 1)]


def test_the_same_taskmanager_process_registering_again_keeps_its_tasks(jm: JobManager) -> None:
    job = running_job(jm)
    jm.register_taskmanager("tm-a", TM_ADDRESS, 4, 0, incarnation="first")
    assert job.status is JobStatus.RUNNING


def test_a_restarted_taskmanager_at_the_same_address_fails_its_jobs_over(jm: JobManager) -> None:
    job = running_job(jm)
    jm.register_taskmanager("tm-a", TM_ADDRESS, 4, 0, incarnation="second")
    assert job.status is JobStatus.RESTARTING
    assert job.failure is not None and "TaskManager tm-a lost" in job.failure.message
    assert jm.taskmanagers["tm-a"].alive and jm.taskmanagers["tm-a"].incarnation == "second"


def test_checkpoint_ids_are_not_reused_by_a_jobmanager_that_takes_over(storage: FileCheckpointStorage) -> None:
    first = JobManager(storage)
    first.register_taskmanager("tm-a", TM_ADDRESS, 4, 0, incarnation="first")
    job = running_job(first, {"checkpointing.interval": "1s"})
    job.lifecycle.tasks_running(10.0, job.all_task_ids(), restored=False)
    handed: list[int] = []
    with first.lock:  # the servicer holds it when it executes actions
        for now in (11.0, 12.0, 13.0):
            actions = job.lifecycle.tick(now)
            triggers = [a for a in actions if isinstance(a, cc.TriggerBarriers)]
            handed += [t.checkpoint_id for t in triggers]
            first.executor.execute(job, actions)
            for t in triggers:  # never acknowledged: no metadata is ever written
                first.executor.execute(
                    job, job.lifecycle.receive_decline(now, t.checkpoint_id, job.source_task_ids()[0], "x")
                )
    first.stop()
    assert handed == [1, 2, 3]
    record = JobRecord.from_json(storage.get_bytes(first.paths.job_record(job.coordinator.job_id)))
    assert record.checkpoint_ids_reserved_through >= 3
    second = JobManager(storage)
    try:
        assert second.recover_jobs() == 1
        recovered = second.jobs["job-1"]
        second.register_taskmanager("tm-a", TM_ADDRESS, 4, 0, incarnation="first")
        recovered.schedule([SlotOffer("tm-a", 4)], {"tm-a": TM_ADDRESS}, 20.0)
        recovered.lifecycle.tasks_running(20.0, recovered.all_task_ids(), restored=False)
        (trigger,) = [a for a in recovered.lifecycle.tick(21.5) if isinstance(a, cc.TriggerBarriers)]
        assert trigger.checkpoint_id > max(handed)
    finally:
        second.stop()


def test_a_recovered_jobmanager_finishes_cancelling_instead_of_restarting(storage: FileCheckpointStorage) -> None:
    first = JobManager(storage)
    first.register_taskmanager("tm-a", TM_ADDRESS, 4, 0, incarnation="first")
    job = running_job(first)
    with first.lock:
        job.lifecycle.cancel(5.0)  # decided; the JobManager dies before it carries anything out
        assert first.records.save(job).result()
    first.stop()
    second = JobManager(storage)
    try:
        assert second.recover_jobs() == 1
        recovered = second.jobs["job-1"]
        assert recovered.status in (JobStatus.CANCELLING, JobStatus.CANCELED)
        wait_for(lambda: recovered.status is JobStatus.CANCELED)
        assert not recovered.lifecycle.unresolved_end
        assert recovered.attempt > 1  # the resolution ran as a newer attempt than every one deployed
        key = second.paths.job_record(recovered.coordinator.job_id)
        wait_for(lambda: JobRecord.from_json(storage.get_bytes(key)).status is JobStatus.CANCELED)
        assert JobRecord.from_json(storage.get_bytes(key)).transactions_resolved
    finally:
        second.stop()


def test_the_attempt_is_in_the_job_record_before_its_deployment(jm: JobManager, storage: FileCheckpointStorage) -> None:
    job = running_job(jm)
    with jm.lock:
        jm.failover.fail_over(job, Failure.internal("lost"), 2.0)
        command, saved = jm.deployer.schedule(job, 4.0)
    assert saved.result()
    record = JobRecord.from_json(storage.get_bytes(jm.paths.job_record(job.coordinator.job_id)))
    assert record.attempt == command.attempt == 2
