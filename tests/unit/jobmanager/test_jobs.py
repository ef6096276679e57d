"""JobMaster: deployment requests and the books of task reports and failures, driven as a plain object
(the decisions about them are the lifecycle's: test_lifecycle.py)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from weir.api import load_job_source
from weir.core.errors import Fault, NotEnoughSlotsError
from weir.core.failures import Failure
from weir.core.states import JobStatus, TaskState
from weir.core.task_time import TimeRatios
from weir.jobmanager.checkpointing.coordinator import default_metadata_key
from weir.jobmanager.errors import ConfigError
from weir.jobmanager.gateway import deploy_request
from weir.jobmanager.jobs import DeployCommand, JobMaster, JobSubmission, TaskRecord
from weir.jobmanager.lifecycle import Action
from weir.jobmanager.messages import RecordRates, TaskProgress
from weir.jobmanager.scheduler import SlotOffer
from weir.wire import common_pb2, taskmanager_pb2

FINISHED = TaskState.FINISHED
FAILED = TaskState.FAILED
CANCELED = TaskState.CANCELED
RUNNING = TaskState.RUNNING
DEPLOYING = TaskState.DEPLOYING

# gen (3 subtasks) -hash-> sum -> out (2 subtasks, chained): three shared slots.
JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        src = env.from_generator(lambda i: (i % 4, i), uid="gen", count=100, parallelism=3)
        src.key_by(lambda e: e[0]).reduce(lambda a, b: (a[0], a[1] + b[1]), uid="sum").print(uid="out")
    """
).encode()

OFFERS = [SlotOffer("tm-a", 2), SlotOffer("tm-b", 2)]
ADDRESSES = {"tm-a": "host-a:6124", "tm-b": "host-b:6124"}

MakeMaster = Callable[..., JobMaster]


def boom(message: str = "boom", *, retriable: bool = True, fault: Fault = Fault.INTERNAL) -> Failure:
    return Failure("RuntimeError", message, fault, retriable)


@pytest.fixture
def make_master() -> MakeMaster:
    def make(parameters: dict[str, str] | None = None) -> JobMaster:
        params = {"restart.strategy": "fixed-delay", "restart.delay": "5s"} if parameters is None else parameters
        loaded = load_job_source(JOB, "sums.py", params, parallelism=2)
        submission = JobSubmission(
            job_id="job-1",
            job_name="sums",
            job_file_name="sums.py",
            job_source=JOB,
            parameters=params,
            parallelism=2,
            submitted_at=100.0,
        )
        return JobMaster.create(submission, loaded, default_metadata_key)

    return make


def wire(command: DeployCommand) -> list[tuple[str, taskmanager_pb2.DeployTaskRequest]]:
    """The deployments as the gateway puts them on the wire."""
    return [(address, deploy_request(d)) for address, d in command.requests]


def schedule(master: JobMaster, now: float = 0.0, offers: list[SlotOffer] = OFFERS) -> DeployCommand:
    """Place a new attempt (its lifecycle actions are the executor's business, not these tests')."""
    command, _actions = master.schedule(offers, ADDRESSES, now)
    return command


def report(master: JobMaster, vertex: str, subtask: int, state: TaskState, **kwargs: object) -> TaskRecord | None:
    fields: dict[str, object] = {"failure": None, "records_in": 0, "records_out": 0, **kwargs}
    attempt = fields.pop("attempt", master.attempt)
    return master.record_task_state(vertex, subtask, attempt, state, **fields)  # type: ignore[arg-type]


def report_all(master: JobMaster, state: TaskState) -> None:
    for vertex, subtask in list(master.tasks):
        report(master, vertex, subtask, state)


def fail_over(master: JobMaster, failure: Failure, now: float) -> tuple[Action, ...]:
    """As ``Failover.fail_over`` does it: keep the failure, let the lifecycle decide."""
    master.record_failure(failure, now)
    return master.lifecycle.task_failed(now, None, failure)


def test_create_builds_one_task_record_per_subtask(make_master: MakeMaster) -> None:
    master = make_master()
    assert master.status is JobStatus.CREATED and master.attempt == 0
    assert sorted(master.tasks) == [("gen", 0), ("gen", 1), ("gen", 2), ("sum", 0), ("sum", 1)]
    assert master.tasks[("sum", 1)].operator_names == "reduce -> print"
    assert master.slots_needed == 3
    assert [str(t) for t in master.source_task_ids()] == ["job-1/gen#0", "job-1/gen#1", "job-1/gen#2"]


def test_create_rejects_bad_settings(make_master: MakeMaster) -> None:
    with pytest.raises(ConfigError, match="checkpointing.intreval"):
        make_master({"checkpointing.intreval": "1s"})
    with pytest.raises(ConfigError, match="restart.strategy"):
        make_master({"restart.strategy": "sometimes"})
    with pytest.raises(ConfigError, match="execution.buffer-timeout: must be between 0 and 60s"):
        make_master({"execution.buffer-timeout": "2min"})
    with pytest.raises(ConfigError, match="execution.buffer-timout: unknown setting"):
        make_master({"execution.buffer-timout": "10ms"})
    with pytest.raises(ConfigError, match="execution.buffer-timeout: expected a duration"):
        make_master({"execution.buffer-timeout": "soon"})


@pytest.mark.parametrize(("given", "expected_ms"), [(None, 100), ("5ms", 5), ("0", 0), ("1.5s", 1500)])
def test_every_deploy_request_carries_the_buffer_timeout(
    make_master: MakeMaster, given: str | None, expected_ms: int
) -> None:
    master = make_master({} if given is None else {"execution.buffer-timeout": given})
    requests = [r for _, r in wire(schedule(master, 150.0))]
    assert len(requests) == 5
    assert all(r.HasField("buffer_timeout_ms") and r.buffer_timeout_ms == expected_ms for r in requests)


def test_schedule_places_subtasks_and_deploys_consumers_first(make_master: MakeMaster) -> None:
    master = make_master({"checkpointing.interval": "1s", "restart.strategy": "none"})
    command = schedule(master, 150.0)
    assert command.attempt == master.attempt == 1
    assert master.status is JobStatus.RUNNING
    assert master.slots == ["tm-a", "tm-b", "tm-a"]
    order = [(r.task.vertex_uid, r.task.subtask) for _, r in wire(command)]
    assert order == [("sum", 0), ("sum", 1), ("gen", 0), ("gen", 1), ("gen", 2)]
    assert [address for address, _ in wire(command)] == [
        "host-a:6124",
        "host-b:6124",
        "host-a:6124",
        "host-b:6124",
        "host-a:6124",
    ]
    for _, request in wire(command):
        assert request.task.job_id == "job-1"
        assert request.attempt == 1
        assert request.job_source == JOB and request.job_file_name == "sums.py" and request.job_name == "sums"
        assert request.parallelism == 2
        assert dict(request.parameters) == {"checkpointing.interval": "1s", "restart.strategy": "none"}
        assert request.checkpointing_mode == common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE
        assert request.restore_state_handle == b"" and request.restore_checkpoint_id == 0
    assert {key: t.taskmanager_id for key, t in master.tasks.items()} == {
        ("gen", 0): "tm-a",
        ("gen", 1): "tm-b",
        ("gen", 2): "tm-a",
        ("sum", 0): "tm-a",
        ("sum", 1): "tm-b",
    }
    assert all(t.state == DEPLOYING for t in master.tasks.values())
    assert master.slots_used_on("tm-a") == 2 and master.slots_used_on("tm-b") == 1
    assert master.taskmanagers_in_use() == {"tm-a", "tm-b"}


def test_deploy_requests_carry_matching_channel_specs(make_master: MakeMaster) -> None:
    master = make_master()
    requests = {(r.task.vertex_uid, r.task.subtask): r for _, r in wire(schedule(master))}
    sum1 = requests[("sum", 1)]
    assert [(i.gate, i.channel, i.producer.vertex_uid, i.producer.subtask) for i in sum1.inputs] == [
        (0, 0, "gen", 0),
        (0, 1, "gen", 1),
        (0, 2, "gen", 2),
    ]
    assert all(i.producer.job_id == "job-1" for i in sum1.inputs)
    assert not sum1.outputs
    gen2 = requests[("gen", 2)]
    assert not gen2.inputs
    assert [
        (o.output, o.channel, o.consumer.vertex_uid, o.consumer.subtask, o.consumer_address, o.consumer_channel)
        for o in gen2.outputs
    ] == [
        (0, 0, "sum", 0, "host-a:6124", 2),
        (0, 1, "sum", 1, "host-b:6124", 2),
    ]
    # Every output spec names an input spec of its consumer with the producer's identity.
    for key, request in requests.items():
        for o in request.outputs:
            consumer = requests[(o.consumer.vertex_uid, o.consumer.subtask)]
            (target,) = [i for i in consumer.inputs if i.channel == o.consumer_channel]
            assert (target.producer.vertex_uid, target.producer.subtask) == key


def test_schedule_passes_the_restore_handles(make_master: MakeMaster) -> None:
    master = make_master()
    master.restore = {("sum", 1): b"handle-sum-1"}
    master.restore_checkpoint_id = 7
    requests = {(r.task.vertex_uid, r.task.subtask): r for _, r in wire(schedule(master))}
    assert requests[("sum", 1)].restore_state_handle == b"handle-sum-1"
    assert requests[("sum", 0)].restore_state_handle == b""
    assert {r.restore_checkpoint_id for r in requests.values()} == {7}


def test_not_enough_slots_leaves_the_job_unscheduled(make_master: MakeMaster) -> None:
    master = make_master()
    with pytest.raises(NotEnoughSlotsError, match="needs 3"):
        schedule(master, offers=[SlotOffer("tm-a", 2)])
    assert master.status is JobStatus.CREATED and master.attempt == 0


def test_task_reports_are_kept_and_the_last_finished_one_is_the_all_finished_one(make_master: MakeMaster) -> None:
    master = make_master()
    schedule(master)
    report_all(master, RUNNING)
    assert master.all_running()
    keys = list(master.tasks)
    for vertex, subtask in keys[:-1]:
        assert report(master, vertex, subtask, FINISHED) is not None
        assert not master.all_finished()
    report(master, *keys[-1], FINISHED, records_in=7)
    assert master.all_finished() and master.tasks[keys[-1]].records_in == 7


def test_a_failed_task_keeps_its_failure_and_one_cancelled_while_running_gets_one(make_master: MakeMaster) -> None:
    master = make_master()
    schedule(master)
    cause = Failure("ValueError", "boom", Fault.USER, retriable=False)
    record = report(master, "sum", 1, FAILED, failure=cause)
    assert record is not None and record.failure == cause
    assert master.status is JobStatus.RUNNING  # the lifecycle decides, not the report
    cancelled = report(master, "sum", 0, CANCELED)
    assert cancelled is not None and cancelled.failure == Failure.internal("cancelled while the job was running")


def test_reports_of_an_older_attempt_are_ignored(make_master: MakeMaster) -> None:
    master = make_master()
    schedule(master)
    fail_over(master, boom("tm lost"), now=10.0)
    schedule(master, 20.0)
    assert master.attempt == 2
    assert report(master, "sum", 0, FAILED, failure=boom("old"), attempt=1) is None
    assert report(master, "gen", 0, FINISHED, attempt=1, records_in=99) is None
    assert report(master, "gen", 1, CANCELED, attempt=1) is None
    assert master.tasks[("sum", 0)].state == DEPLOYING and master.tasks[("sum", 0)].failure is None
    assert master.tasks[("gen", 0)].records_in == 0
    assert report(master, "nope", 0, RUNNING) is None  # an unknown task is ignored too


def test_a_failure_is_kept_in_the_history_and_a_restart_places_a_fresh_attempt(make_master: MakeMaster) -> None:
    master = make_master()
    schedule(master)
    report(master, "gen", 0, FINISHED)
    report(master, "sum", 0, RUNNING)
    fail_over(master, boom("task sum#1 failed: boom"), now=50.0)
    master.tasks_stopped()
    assert master.status is JobStatus.RESTARTING and master.lifecycle.restart_at == pytest.approx(55.0)
    assert master.failure == boom("task sum#1 failed: boom")
    assert [e.failure for e in master.exceptions.entries] == [boom("task sum#1 failed: boom")]
    assert master.restarts == 1
    assert master.tasks[("gen", 0)].state == FINISHED
    assert master.tasks[("sum", 0)].state == CANCELED
    assert master.slots_used_on("tm-a") == 0
    schedule(master, 55.0)
    assert master.status is JobStatus.RUNNING and master.attempt == 2 and master.lifecycle.restart_at is None
    assert all(t.state == DEPLOYING and t.failure is None for t in master.tasks.values())


def test_a_job_the_strategy_gives_up_on_is_failed_from_then_on(make_master: MakeMaster) -> None:
    master = make_master({"restart.strategy": "none"})
    schedule(master)
    fail_over(master, boom("task gen#0 failed: kafka down"), now=60.0)
    assert master.status is JobStatus.FAILED and master.finished_at == 60.0
    assert report(master, "sum", 0, RUNNING) is None  # a terminal job ignores reports


def progress(
    master: JobMaster,
    *,
    attempt: int | None = None,
    records_in: int = 0,
    records_out: int = 0,
    ratios: TimeRatios | None = None,
    watermark: int | None = None,
) -> TaskProgress:
    """A heartbeat's entry for subtask sum#0 (of the current attempt unless ``attempt``)."""
    return TaskProgress(
        master.job_id,
        "sum",
        0,
        master.attempt if attempt is None else attempt,
        records_in,
        records_out,
        ratios=ratios,
        watermark=watermark,
    )


def test_a_heartbeat_s_load_is_kept_until_a_newer_one_and_forgotten_by_a_new_attempt(make_master: MakeMaster) -> None:
    master = make_master()
    schedule(master)
    record = master.tasks[("sum", 0)]
    assert (record.ratios, record.watermark, record.progress_at) == (None, None, None)
    first = TimeRatios(busy=0.25, backpressured=0.5, idle=0.25)
    master.on_progress(progress(master, ratios=first, watermark=1_000), now=1.0)
    master.on_progress(progress(master), now=2.0)  # nothing measured in that interval: the last stay
    assert (record.ratios, record.watermark, record.progress_at) == (first, 1_000, 1.0)
    second = TimeRatios(busy=1.0, backpressured=0.0, idle=0.0)
    master.on_progress(progress(master, ratios=second, watermark=2_000), now=3.0)
    assert (record.ratios, record.watermark, record.progress_at) == (second, 2_000, 3.0)
    master.on_progress(progress(master, attempt=master.attempt - 1, ratios=first, watermark=5), now=4.0)
    assert record.ratios == second  # an older attempt's heartbeat does not count
    fail_over(master, boom(), now=5.0)
    schedule(master, 10.0)
    assert (record.ratios, record.watermark, record.progress_at, record.attempt) == (None, None, None, 2)


def test_records_in_accumulate_over_attempts(make_master: MakeMaster) -> None:
    master = make_master()
    schedule(master)
    report(master, "sum", 0, RUNNING, records_in=10, records_out=10)
    master.on_progress(progress(master, records_in=40, records_out=35), now=0.5)
    master.on_progress(progress(master, records_in=30, records_out=30), now=0.6)  # counters never go back
    record = master.tasks[("sum", 0)]
    assert (record.records_in, record.records_out, record.records_in_all_attempts) == (40, 35, 40)
    fail_over(master, boom(), now=1.0)
    schedule(master, 10.0)
    assert (record.records_in, record.records_out, record.records_in_all_attempts) == (0, 0, 40)
    master.on_progress(progress(master, attempt=1, records_in=1000), now=11.0)  # the old attempt no longer counts
    report(master, "sum", 0, RUNNING, records_in=15)
    assert record.records_in_all_attempts == 55
    fail_over(master, boom(), now=20.0)
    schedule(master, 30.0)
    report(master, "sum", 0, FINISHED, records_in=5)
    assert record.records_in_all_attempts == 60


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE),
        ("EXACTLY_ONCE", common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE),
        ("exactly-once", common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE),
        (" exactly_once", common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE),
        ("At-Least-Once", common_pb2.CHECKPOINTING_MODE_AT_LEAST_ONCE),
    ],
)
def test_every_deploy_request_carries_the_parsed_checkpointing_mode(
    make_master: MakeMaster, given: str | None, expected: int
) -> None:
    """The TaskManagers once compared the raw -D text: 'EXACTLY_ONCE' ran without alignment."""
    master = make_master({} if given is None else {"checkpointing.mode": given})
    requests = [r for _, r in wire(schedule(master, 150.0))]
    assert {r.checkpointing_mode for r in requests} == {expected}


def test_checkpointing_unaligned_reaches_every_deploy_request(make_master: MakeMaster) -> None:
    master = make_master({"checkpointing.unaligned": "true"})
    requests = [r for _, r in wire(schedule(master, 150.0))]
    assert {r.checkpointing_mode for r in requests} == {common_pb2.CHECKPOINTING_MODE_UNALIGNED}


def test_a_tasks_record_rates_are_between_its_latest_two_heartbeats_and_start_over_per_attempt(
    make_master: MakeMaster,
) -> None:
    master = make_master()
    schedule(master)
    record = master.tasks[("sum", 0)]
    master.on_progress(progress(master, records_in=100, records_out=50), now=1.0)
    assert record.rates is None  # one heartbeat: no interval yet
    master.on_progress(progress(master, records_in=400, records_out=50), now=3.0)
    assert record.rates == RecordRates(150.0, 0.0)
    master.on_progress(progress(master, records_in=450, records_out=90), now=3.5)
    assert record.rates == RecordRates(100.0, 80.0)
    fail_over(master, boom(), now=5.0)
    schedule(master, 10.0)
    assert (record.rates, record.counted_at) == (None, None)
    master.on_progress(progress(master, records_in=20, records_out=20), now=11.0)
    assert record.rates is None, "the new attempt's first heartbeat is no interval"
