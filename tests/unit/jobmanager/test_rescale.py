"""``weir rescale`` in the JobManager, with a fake gateway: the request is refused before the job is
touched, or it triggers a forced aligned checkpoint (once the one in flight ended), and once that
completed the tasks are cancelled, the job's plan and record say the new parallelism and the restart
is due at once, not counted; a failed checkpoint restarts the job as it was; a cancel fails it."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.unit.jobmanager.conftest import TM_A, Harness, MakeHarness, served
from weir.api import load_job_source
from weir.core.cdc import CdcState, ChunkRead, Phase, XidSnapshot, encode_cdc_state
from weir.core.errors import Fault, WeirError
from weir.core.ids import CheckpointId, SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.states import JobStatus, TaskState
from weir.core.task_state import InlineOperatorState, SubtaskLayout, TaskStateDocument, encode_task_state
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.errors import (
    CheckpointRejectedError,
    ConfigError,
    RescaleRejectedError,
    SavepointRejectedError,
)
from weir.jobmanager.execution import parse_execution_settings
from weir.jobmanager.jobs import JobMaster, JobSubmission
from weir.jobmanager.messages import CheckpointAck, CheckpointDecline, TaskStateReport
from weir.jobmanager.rescaling import RescalePhase

SCALABLE = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_generator(lambda i: i, uid="gen", count=100).print(uid="out")
    """
).encode()
PARAMETERS = {"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "5s"}


def running_job(
    h: Harness, parallelism: int = 3, source: bytes = SCALABLE, parameters: dict[str, str] = PARAMETERS
) -> JobMaster:
    loaded = load_job_source(source, "j.py", parameters, parallelism=parallelism)
    submission = JobSubmission("job-1", "j", "j.py", source, parameters, parallelism, 0.0)
    job = JobMaster.create(submission, loaded, h.jm.paths.metadata_key_fn())
    h.jm.jobs[job.job_id] = job
    offers = h.jm.registry.offers()
    _command, actions = job.schedule(offers, h.jm.registry.addresses(), h.clock())
    with h.jm.lock:
        h.jm.executor.execute(job, actions)
    for vertex, subtask in list(job.tasks):
        h.jm.report_task_state(
            TaskStateReport(job.job_id, vertex, subtask, job.attempt, TaskState.RUNNING, None, 0, 0, False)
        )
    return job


def ack(h: Harness, job: JobMaster, checkpoint_id: int) -> None:
    for vertex, subtask in list(job.tasks):
        h.jm.acknowledge_checkpoint(
            CheckpointAck(job.job_id, vertex, subtask, job.attempt, checkpoint_id, (), b"{}", TaskAckMetrics())
        )


def trigger_ids(h: Harness) -> list[int]:
    """The checkpoints triggered, in order (each at every source task)."""
    return list(dict.fromkeys(call[3] for call in h.gateway.named("trigger")))


def test_a_rescale_takes_an_aligned_checkpoint_then_redeploys_at_the_new_parallelism(harness: Harness) -> None:
    job = running_job(harness)
    trigger_id = harness.jm.rescale(job.job_id, 2)
    (checkpoint_id,) = trigger_ids(harness)
    assert set(harness.gateway.aligned_triggers) == {checkpoint_id}, "its barrier is forced aligned"
    op = harness.jm.rescale_status(job.job_id, trigger_id)
    assert (op.phase, op.checkpoint_id, op.from_parallelism, op.to_parallelism) == (
        RescalePhase.CHECKPOINTING,
        checkpoint_id,
        3,
        2,
    )
    with pytest.raises(RescaleRejectedError, match="already being rescaled"):
        harness.jm.rescale(job.job_id, 1)
    with pytest.raises(CheckpointRejectedError, match="being rescaled"):
        harness.jm.trigger_checkpoint(job.job_id, full=False)
    with pytest.raises(SavepointRejectedError, match="being rescaled"):
        harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    harness.clock.advance(1.5)
    harness.jm.tick()
    assert trigger_ids(harness) == [checkpoint_id], "no periodic checkpoint beside the rescale's"

    ack(harness, job, checkpoint_id)
    assert ("complete", TM_A, job.job_id, 1, checkpoint_id) in [
        ("complete", *c) for c in harness.gateway.named("complete")
    ]
    assert (TM_A, job.job_id, 1, False) in harness.gateway.named("cancel"), "the old attempt's tasks are cancelled"
    assert job.status is JobStatus.RESTARTING and job.lifecycle.restart_at == harness.clock()
    assert job.submission.parallelism == 2 and job.plan.max_parallelism_over_vertices == 2
    assert sorted(job.tasks) == [("gen", 0), ("gen", 1)]
    assert sorted(t.subtask for t in job.source_task_ids()) == [0, 1]
    harness.jm.records.flush()
    record = harness.jm.records.load(harness.jm.records.keys()[0])
    assert record.submission.parallelism == 2, "a later failover or a new JobManager keeps the parallelism"
    assert record.status is JobStatus.RESTARTING
    assert job.restarts == 0, "a rescale is no restart of the restart strategy's"
    assert harness.jm.rescale_status(job.job_id, trigger_id).phase is RescalePhase.REDEPLOYING


def test_a_rescale_waits_for_the_checkpoint_in_flight_then_triggers_its_own(harness: Harness) -> None:
    job = running_job(harness)
    harness.clock.advance(1.5)
    harness.jm.tick()
    (periodic,) = trigger_ids(harness)
    harness.jm.rescale(job.job_id, 2)
    assert trigger_ids(harness) == [periodic], "never beside another checkpoint"
    ack(harness, job, periodic)
    harness.jm.tick()
    (_periodic, rescale) = trigger_ids(harness)
    assert set(harness.gateway.aligned_triggers) == {rescale}


def test_a_rescale_whose_checkpoint_fails_restarts_the_job_as_it_was(harness: Harness) -> None:
    job = running_job(harness)
    trigger_id = harness.jm.rescale(job.job_id, 2)
    (checkpoint_id,) = trigger_ids(harness)
    harness.jm.decline_checkpoint(CheckpointDecline(job.job_id, "gen", 0, job.attempt, checkpoint_id, "disk full"))
    op = harness.jm.rescale_status(job.job_id, trigger_id)
    assert op.phase is RescalePhase.FAILED and "disk full" in op.failure
    assert job.status is JobStatus.RESTARTING and job.submission.parallelism == 3 and len(job.tasks) == 3
    harness.jm.tick()
    assert job.status is JobStatus.RUNNING and job.attempt == 2 and job.restarts == 0
    deployed = harness.gateway.named("deploy")
    assert sorted((vertex, subtask) for _address, vertex, subtask, _attempt in deployed) == [
        ("gen", 0),
        ("gen", 1),
        ("gen", 2),
    ]
    assert {attempt for *_, attempt in deployed} == {2}


def test_a_job_cancelled_while_it_is_rescaled_fails_the_rescale(harness: Harness) -> None:
    job = running_job(harness)
    trigger_id = harness.jm.rescale(job.job_id, 2)
    harness.jm.cancel(job.job_id)
    op = harness.jm.rescale_status(job.job_id, trigger_id)
    assert op.phase is RescalePhase.FAILED and "cancelled" in op.failure


def test_a_failover_before_the_rescale_s_checkpoint_completed_fails_the_rescale_and_keeps_the_parallelism(
    harness: Harness,
) -> None:
    job = running_job(harness)
    trigger_id = harness.jm.rescale(job.job_id, 2)
    harness.fail(job, "a task broke", retriable=True)
    assert harness.jm.rescale_status(job.job_id, trigger_id).phase is RescalePhase.FAILED
    assert job.status is JobStatus.RESTARTING and job.submission.parallelism == 3


def test_requests_the_job_cannot_take_are_refused_before_it_is_touched(make_harness: MakeHarness) -> None:
    harness = make_harness()  # one TaskManager, 4 slots
    job = running_job(harness)
    for parallelism, reason in [
        (0, "parallelism must be at least 1"),
        (129, "above the job's max parallelism 128"),
        (3, "already runs at parallelism 3"),
        (5, "parallelism 5 needs 5 slots, the cluster has 4 for it"),
    ]:
        with pytest.raises(RescaleRejectedError, match=reason):
            harness.jm.rescale(job.job_id, parallelism)
    assert trigger_ids(harness) == [] and job.status is JobStatus.RUNNING and job.attempt == 1
    harness.jm.cancel(job.job_id)
    with pytest.raises(RescaleRejectedError, match="only a RUNNING job can be rescaled"):
        harness.jm.rescale(job.job_id, 2)


def test_a_job_whose_graph_cannot_take_the_parallelism_is_refused(harness: Harness) -> None:
    """A source pinned at 1 forwards into an operator that follows the job's parallelism: at 2 the
    forward edge would join two parallelisms."""
    pinned = textwrap.dedent(
        """
        from weir.api import Environment


        def build(env: Environment) -> None:
            env.from_generator(lambda i: i, uid="gen", count=100, parallelism=1).print(uid="out")
        """
    ).encode()
    job = running_job(harness, parallelism=1, source=pinned)
    with pytest.raises(RescaleRejectedError, match="parallelism 2: forward edge 'gen' -> 'out'"):
        harness.jm.rescale(job.job_id, 2)
    assert trigger_ids(harness) == [] and job.submission.parallelism == 1


def test_a_job_whose_state_cannot_be_redistributed_is_refused_before_it_is_touched(harness: Harness) -> None:
    """The generator source's position belongs to one subtask index: its latest checkpoint shows the
    rescale's checkpoint could not be restored at 2, so the request is refused, the job untouched."""
    job = running_job(harness)
    harness.clock.advance(1.5)
    harness.jm.tick()
    (checkpoint_id,) = trigger_ids(harness)
    for vertex, subtask in list(job.tasks):
        document = encode_task_state(
            TaskStateDocument(
                job_id=job.job_id,
                vertex_uid=vertex,
                subtask=subtask,
                attempt=job.attempt,
                checkpoint_id=CheckpointId(checkpoint_id),
                layout=SubtaskLayout(
                    3, 128, key_group_range_for_subtask(128, 3, SubtaskIndex(subtask)), ("gen", "out"), ()
                ),
                operator_state=InlineOperatorState({"gen": json.dumps({"format": 1, "next_k": 40}).encode()}),
            )
        )
        harness.jm.acknowledge_checkpoint(
            CheckpointAck(job.job_id, vertex, subtask, job.attempt, checkpoint_id, (), document, TaskAckMetrics())
        )
    assert [c.checkpoint_id for c in job.coordinator.store.all()] == [checkpoint_id]
    with pytest.raises(RescaleRejectedError, match="operator\\(s\\) gen keep per-subtask state"):
        harness.jm.rescale(job.job_id, 2)
    assert trigger_ids(harness) == [checkpoint_id] and job.status is JobStatus.RUNNING
    assert job.submission.parallelism == 3 and job.attempt == 1


def test_per_subtask_state_of_a_vertex_at_its_own_parallelism_does_not_refuse_a_rescale(harness: Harness) -> None:
    """A generator source pinned at 1 (a broadcast rules stream) keeps its parallelism when the job is
    rescaled: its per-subtask position stays with its one subtask, so the rescale goes ahead."""
    pinned = textwrap.dedent(
        """
        from weir.api import Environment


        def build(env: Environment) -> None:
            env.from_generator(lambda i: i, uid="gen", count=100, parallelism=1).rebalance().print(uid="out")
        """
    ).encode()
    job = running_job(harness, source=pinned)
    harness.clock.advance(1.5)
    harness.jm.tick()
    (checkpoint_id,) = trigger_ids(harness)
    for vertex, subtask in list(job.tasks):
        parallelism = 1 if vertex == "gen" else 3
        states = {"gen": json.dumps({"format": 1, "next_k": 40}).encode()} if vertex == "gen" else {}
        document = encode_task_state(
            TaskStateDocument(
                job_id=job.job_id,
                vertex_uid=vertex,
                subtask=subtask,
                attempt=job.attempt,
                checkpoint_id=CheckpointId(checkpoint_id),
                layout=SubtaskLayout(
                    parallelism,
                    128,
                    key_group_range_for_subtask(128, parallelism, SubtaskIndex(subtask)),
                    (vertex,),
                    (),
                ),
                operator_state=InlineOperatorState(states),
            )
        )
        harness.jm.acknowledge_checkpoint(
            CheckpointAck(job.job_id, vertex, subtask, job.attempt, checkpoint_id, (), document, TaskAckMetrics())
        )
    assert [c.checkpoint_id for c in job.coordinator.store.all()] == [checkpoint_id]
    harness.jm.rescale(job.job_id, 2)
    assert job.status is JobStatus.RUNNING and len(trigger_ids(harness)) == 2  # the rescale's own checkpoint


def test_a_cdc_source_keeps_its_own_parallelism_through_a_rescale(harness: Harness) -> None:
    """A PostgreSQL CDC source at parallelism 2 (subtask 0 streaming, subtask 1's partition handed over)
    in a job at 3: the job is rescaled to 2 and to 4, the source stays at 2 and each of its subtasks
    restores its own state (``weir.core.cdc.redistribute`` at the same parallelism)."""
    cdc = textwrap.dedent(
        """
        from weir.api import Environment


        def build(env: Environment) -> None:
            env.from_postgres_cdc(["t"], uid="cdc", slot_name="s", parallelism=2).rebalance().print(uid="out")
        """
    ).encode()
    job = running_job(harness, source=cdc)
    harness.clock.advance(1.5)
    harness.jm.tick()
    (checkpoint_id,) = trigger_ids(harness)
    chunk = ChunkRead("public.t", None, XidSnapshot(5, 5), 120, 1)
    cdc_states = [
        encode_cdc_state(CdcState(Phase.STREAMING, 200, (chunk,), 2), "s"),
        encode_cdc_state(CdcState(Phase.PARTITION_READ, 100, (chunk,), 2), "s"),
    ]
    for vertex, subtask in list(job.tasks):
        parallelism = 2 if vertex == "cdc" else 3
        states = {"cdc": cdc_states[subtask]} if vertex == "cdc" else {}
        document = encode_task_state(
            TaskStateDocument(
                job_id=job.job_id,
                vertex_uid=vertex,
                subtask=subtask,
                attempt=job.attempt,
                checkpoint_id=CheckpointId(checkpoint_id),
                layout=SubtaskLayout(
                    parallelism,
                    128,
                    key_group_range_for_subtask(128, parallelism, SubtaskIndex(subtask)),
                    (vertex,),
                    (),
                ),
                operator_state=InlineOperatorState(states),
            )
        )
        harness.jm.acknowledge_checkpoint(
            CheckpointAck(job.job_id, vertex, subtask, job.attempt, checkpoint_id, (), document, TaskAckMetrics())
        )
    assert [c.checkpoint_id for c in job.coordinator.store.all()] == [checkpoint_id]
    for parallelism in (2, 4):
        _loaded, plan = job.rescaled_plan(parallelism)
        assert plan.vertices["cdc"].parallelism == 2 and plan.vertices["out"].parallelism == parallelism
    harness.jm.rescale(job.job_id, 2)
    assert job.status is JobStatus.RUNNING and len(trigger_ids(harness)) == 2  # the rescale's own checkpoint


REACTIVE = {**PARAMETERS, "scheduler-mode": "reactive"}


def test_a_reactive_job_is_rescaled_to_the_slots_it_could_use(make_harness: MakeHarness) -> None:
    """``scheduler-mode: reactive``: a job at 1 on a TaskManager of 4 slots grows to 4 through an
    aligned checkpoint; a TaskManager of 4 more registering takes it to 8 the same way."""
    harness = make_harness()
    job = running_job(harness, parallelism=1, parameters=REACTIVE)
    harness.jm.tick()
    (checkpoint_id,) = trigger_ids(harness)
    assert set(harness.gateway.aligned_triggers) == {checkpoint_id}
    op = harness.jm.executor.rescales.active(job.job_id)
    assert op is not None and (op.from_parallelism, op.to_parallelism) == (1, 4)
    harness.jm.tick()
    assert trigger_ids(harness) == [checkpoint_id], "one rescale at a time"


def test_a_job_not_in_reactive_mode_is_never_rescaled_by_the_slots(harness: Harness) -> None:
    job = running_job(harness, parallelism=1)
    for _ in range(3):
        harness.jm.tick()
    assert trigger_ids(harness) == [] and job.submission.parallelism == 1


def test_a_reactive_job_restarting_with_too_few_slots_restarts_at_what_is_left(make_harness: MakeHarness) -> None:
    harness = make_harness(taskmanagers=("tm-a", "tm-b"))
    job = running_job(harness, parallelism=6, parameters=REACTIVE)
    lost = harness.jm.registry.taskmanagers["tm-b"]
    with harness.jm.lock:
        harness.jm.failover.taskmanager_lost(lost, "heartbeat timeout")
    assert job.status is JobStatus.RESTARTING
    harness.clock.advance(6)  # past the restart delay (5 s), within the heartbeat timeout (10 s)
    harness.jm.tick()
    assert job.submission.parallelism == 4 and len(job.tasks) == 4, "the 4 slots tm-a offers"
    harness.jm.tick()
    assert job.status is JobStatus.RUNNING
    deployed = {(vertex, subtask) for _address, vertex, subtask, _attempt in harness.gateway.named("deploy")}
    assert deployed == {("gen", s) for s in range(4)}


def test_an_unknown_scheduler_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="scheduler-mode: must be one of default, reactive, got 'adaptive'"):
        parse_execution_settings({"scheduler-mode": "adaptive"})
    assert parse_execution_settings({"scheduler-mode": "Reactive"}).reactive
    assert not parse_execution_settings({}).reactive


def test_the_client_rescales_over_grpc_and_reads_the_outcome(harness: Harness) -> None:
    job = running_job(harness)
    with served(harness.jm) as client:
        trigger_id = client.rescale(job.job_id, 2)
        info = client.rescale_status(job.job_id, trigger_id)
        assert (info.phase, info.from_parallelism, info.to_parallelism, info.finished) == ("CHECKPOINTING", 3, 2, False)
        with pytest.raises(WeirError, match="already being rescaled") as refused:
            client.rescale(job.job_id, 1)
        assert refused.value.fault is Fault.USER
        with pytest.raises(WeirError, match=f"job {job.job_id} has no rescale nope"):
            client.rescale_status(job.job_id, "nope")
        ack(harness, job, info.checkpoint_id)
        assert client.rescale_status(job.job_id, trigger_id).phase == "REDEPLOYING"
