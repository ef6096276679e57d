"""The deployer: restore, placement, the record before the deployment, probes and failed deploys."""

from __future__ import annotations

import textwrap
import threading
from concurrent.futures import Future

import pytest

from tests.unit.jobmanager.conftest import TM_A, Harness
from weir.api import load_job_source
from weir.core.failures import Failure
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.failover import Failover
from weir.jobmanager.jobs import JobMaster, JobSubmission, TaskDeployment
from weir.jobmanager.monitor import TICK_INTERVAL_S


def written(value: bool) -> Future[bool]:
    future: Future[bool] = Future()
    future.set_result(value)
    return future


def placed_again(harness: Harness, job: JobMaster) -> None:
    """The harness's attempt never ran: the job waits to be placed again (as after a lost TaskManager)."""
    with harness.jm.lock:
        harness.jm.executor.execute(job, job.lifecycle.replace(harness.clock(), harness.clock(), "test"))


def test_an_attempt_is_deployed_once_its_record_is_written(harness: Harness) -> None:
    job = harness.job()
    placed_again(harness, job)
    with harness.jm.lock:
        command, saved = harness.jm.deployer.schedule(job, harness.clock())
    assert command.attempt == 2 and saved.result()
    harness.jm.deployer.deploy(job, command, saved)
    assert [(a, attempt) for a, _, _, attempt in harness.gateway.named("deploy")] == [(TM_A, 2)] * len(job.tasks)


def test_an_attempt_whose_record_was_not_written_is_placed_again_later(harness: Harness) -> None:
    job = harness.job()
    placed_again(harness, job)
    command, _actions = job.schedule(harness.jm.registry.offers(), harness.jm.registry.addresses(), harness.clock())
    harness.jm.deployer.deploy(job, command, written(False))
    assert harness.gateway.named("deploy") == []
    assert job.status is JobStatus.RESTARTING and job.lifecycle.restart_at == harness.clock() + 1.0


def test_an_unreachable_taskmanager_is_lost_and_the_attempt_placed_again_at_once(harness: Harness) -> None:
    job = harness.job()
    harness.gateway.unreachable.add(TM_A)
    placed_again(harness, job)
    command, _actions = job.schedule(harness.jm.registry.offers(), harness.jm.registry.addresses(), harness.clock())
    harness.jm.deployer.deploy(job, command, written(True))
    assert harness.gateway.named("deploy") == []
    assert not harness.jm.taskmanagers["tm-a"].alive
    assert job.status is JobStatus.RESTARTING and job.lifecycle.restart_at == harness.clock()
    assert job.restarts == 0  # never ran: no restart counted
    assert all(t.state is TaskState.CANCELED for t in job.tasks.values())


def test_a_deploy_the_taskmanager_refuses_as_unavailable_fails_the_job_over(harness: Harness) -> None:
    job = harness.job()
    harness.gateway.failing[TM_A] = "UNAVAILABLE"
    placed_again(harness, job)
    command, _actions = job.schedule(harness.jm.registry.offers(), harness.jm.registry.addresses(), harness.clock())
    harness.jm.deployer.deploy(job, command, written(True))
    assert not harness.jm.taskmanagers["tm-a"].alive
    assert job.status is JobStatus.RESTARTING
    # The TaskManager is declared lost first: its loss is the reason the job restarts elsewhere.
    assert job.failure is not None and job.failure.message == "TaskManager tm-a lost (unreachable at deployment)"


def test_a_deploy_that_fails_otherwise_fails_the_job_over_with_the_call_s_error(harness: Harness) -> None:
    job = harness.job()
    harness.gateway.failing[TM_A] = "INTERNAL"
    placed_again(harness, job)
    command, _actions = job.schedule(harness.jm.registry.offers(), harness.jm.registry.addresses(), harness.clock())
    harness.jm.deployer.deploy(job, command, written(True))
    assert harness.jm.taskmanagers["tm-a"].alive
    assert job.status is JobStatus.RESTARTING
    assert job.failure is not None and "to tm-a:6124 failed: INTERNAL: injected" in job.failure.message


def test_a_deploy_of_a_superseded_attempt_stops(harness: Harness) -> None:
    job = harness.job()
    placed_again(harness, job)
    command, _actions = job.schedule(harness.jm.registry.offers(), harness.jm.registry.addresses(), harness.clock())
    failover: Failover = harness.jm.failover
    with harness.jm.lock:
        failover.cancel(job.job_id)
    harness.gateway.calls.clear()
    harness.jm.deployer.deploy(job, command, written(True))
    assert harness.gateway.named("deploy") == []


PARALLEL_JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_generator(lambda i: i, uid="gen", count=100, parallelism=2).rebalance().map(
            lambda i: i, uid="out", parallelism=2
        ).print(uid="print")
    """
).encode()


def test_the_subtasks_of_a_vertex_are_deployed_at_once_consumers_before_producers(harness: Harness) -> None:
    params = {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
    loaded = load_job_source(PARALLEL_JOB, "p.py", params, parallelism=2)
    job = JobMaster.create(
        JobSubmission("job-p", "p", "p.py", PARALLEL_JOB, params, 2, 0.0), loaded, harness.jm.paths.metadata_key_fn()
    )
    harness.jm.jobs["job-p"] = job
    with harness.jm.lock:
        command, saved = harness.jm.deployer.schedule(job, harness.clock())
    assert [d.vertex_uid for _, d in command.requests] == ["out", "out", "gen", "gen"]
    # Each deploy call returns only once its vertex's other subtask's call arrived too: deployed one
    # after the other, the first would wait for ever (the barrier breaks after 5 s).
    arrived: dict[str, threading.Barrier] = {
        "out": threading.Barrier(2, timeout=5),
        "gen": threading.Barrier(2, timeout=5),
    }
    order: list[str] = []
    record_deploy = harness.gateway.deploy_task

    def deploy_task(address: str, deployment: TaskDeployment) -> None:
        arrived[deployment.vertex_uid].wait()
        order.append(deployment.vertex_uid)
        record_deploy(address, deployment)

    harness.gateway.deploy_task = deploy_task  # type: ignore[method-assign]
    harness.jm.deployer.deploy(job, command, saved)
    assert order == ["out", "out", "gen", "gen"]
    assert job.status is JobStatus.RUNNING and len(harness.gateway.named("deploy")) == 4


def test_the_monitor_ticks_when_a_restart_falls_due_before_the_next_tick(harness: Harness) -> None:
    job = harness.job({"restart.strategy": "fixed-delay", "restart.delay": "50ms"})
    assert harness.jm.monitor.next_tick_in() == TICK_INTERVAL_S
    with harness.jm.lock:
        harness.jm.failover.fail_over(job, Failure.internal("boom"), harness.clock())
    assert harness.jm.monitor.next_tick_in() == pytest.approx(0.05)
    harness.clock.advance(0.05)
    assert harness.jm.monitor.next_tick_in() == 0.0
    harness.jm.tick()
    assert job.status is JobStatus.RUNNING and job.attempt == 2
