"""A job's lifecycle in the JobManager: deploy, track task states, fail over, finish or cancel.

``JobMaster`` decides; the ``TaskManagerGateway`` carries the decisions to the TaskManagers. All
methods are called with the JobManager's lock held, except the gateway calls, which run on a worker
thread so that a slow TaskManager never blocks the servicer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import assert_never

import structlog

from weir.api import LoadedJob
from weir.core.checkpointing import CheckpointingMode
from weir.core.failures import Failure
from weir.core.ids import JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.states import JobStatus, TaskState
from weir.core.task_time import TimeRatios, TimeTotals
from weir.jobmanager.checkpointing.config import CheckpointSettings, parse_checkpoint_settings
from weir.jobmanager.checkpointing.coordinator import CheckpointCoordinator
from weir.jobmanager.checkpointing.store import InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.term_fences import TermFence
from weir.jobmanager.exception_history import ExceptionEntry, ExceptionHistory
from weir.jobmanager.execution import ExecutionSettings, parse_execution_settings
from weir.jobmanager.lifecycle import Action, Created, Ended, Ending, JobLifecycle, Restarting, Running
from weir.jobmanager.messages import RecordRates, TaskProgress
from weir.jobmanager.records import JobSubmission
from weir.jobmanager.restart import RestartStrategy, parse_restart_strategy
from weir.jobmanager.restoring import InitialState
from weir.jobmanager.scheduler import SlotOffer, assign_slots, place_subtasks
from weir.plan import JobPlan, build_plan

log = structlog.get_logger("weir.jobmanager")

__all__ = [
    "DeployCommand",
    "InputChannelSpec",
    "JobMaster",
    "JobStatus",
    "JobSubmission",
    "OutputChannelSpec",
    "TaskDeployment",
    "TaskRecord",
    "new_job_id",
]


def _still_running(state: TaskState | None) -> bool:
    return state is None or not state.terminal


@dataclass
class TaskRecord:
    vertex_uid: str
    subtask: int
    operator_names: str
    taskmanager_id: str = ""
    state: TaskState | None = None  # None: never reported (the wire's UNSPECIFIED)
    failure: Failure | None = None
    records_in: int = 0
    records_out: int = 0
    records_in_earlier_attempts: int = 0
    attempt: int = 0  # the attempt it was last deployed with (0: never)
    # The current attempt's load, from its latest heartbeat (at ``progress_at``): None until one came.
    ratios: TimeRatios | None = None
    watermark: int | None = None  # ms
    totals: TimeTotals | None = None  # busy/backpressured/idle seconds of the attempt so far
    progress_at: float | None = None
    # Records per second between its latest two heartbeats (Flink's numRecordsInPerSecond); None until two came.
    rates: RecordRates | None = None
    counted_at: float | None = None  # when the latest heartbeat's counters came

    @property
    def records_in_all_attempts(self) -> int:
        return self.records_in_earlier_attempts + self.records_in


@dataclass(frozen=True)
class InputChannelSpec:
    """One input channel of a task: which gate and channel, fed by which producer subtask."""

    gate: int
    channel: int
    producer_vertex: str
    producer_subtask: int


@dataclass(frozen=True)
class OutputChannelSpec:
    """One output channel of a task: to which consumer subtask, at which address and channel."""

    output: int
    channel: int
    consumer_vertex: str
    consumer_subtask: int
    consumer_address: str
    consumer_channel: int


@dataclass(frozen=True)
class TaskDeployment:
    """Everything a TaskManager needs to run one subtask of one attempt (the gateway puts it on the wire)."""

    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    job_name: str
    job_source: bytes
    job_file_name: str
    parameters: Mapping[str, str]
    parallelism: int
    restore_state_handle: bytes
    restore_checkpoint_id: int
    inherited_task_states: tuple[bytes, ...]
    restore_storage_uri: str
    checkpointing_mode: CheckpointingMode
    buffer_timeout_ms: int
    aligned_checkpoint_timeout_ms: int
    inputs: tuple[InputChannelSpec, ...]
    outputs: tuple[OutputChannelSpec, ...]
    artifact_id: str = ""  # the job's artifact in checkpoint storage (empty: job_source)


@dataclass(frozen=True)
class InheritedResolution:
    """Before an attempt restored at another parallelism than its checkpoint's is deployed: resolve
    the checkpoint's sink subtasks' transactions as of it, as ``attempt`` (``weir.jobmanager.deployment``)."""

    initial: InitialState
    attempt: int


@dataclass(frozen=True)
class DeployCommand:
    """One deployment round, executed by the deployer off the lock."""

    attempt: int
    requests: tuple[tuple[str, TaskDeployment], ...]  # (TaskManager address, deployment)
    resolution: InheritedResolution | None = None


@dataclass
class JobMaster:
    """A job in the JobManager: its plan, its tasks' records, and its lifecycle (which decides; see
    ``weir.jobmanager.lifecycle``). The methods here keep the books the lifecycle's decisions are about
    (placement, task states and counters, failures) and never decide a transition themselves."""

    submission: JobSubmission
    loaded: LoadedJob
    plan: JobPlan
    checkpoint_settings: CheckpointSettings
    lifecycle: JobLifecycle
    execution_settings: ExecutionSettings = field(default_factory=ExecutionSettings)
    tasks: dict[tuple[str, int], TaskRecord] = field(default_factory=dict)
    slots: list[str] = field(default_factory=list)
    failure: Failure | None = None
    restore: dict[tuple[str, int], bytes] = field(default_factory=dict)  # task-state documents by task
    initial_state: InitialState | None = None  # another job's retained checkpoint it starts from
    inherited: dict[str, tuple[bytes, ...]] = field(default_factory=dict)  # its documents by vertex, when used
    restore_storage_uri: str = ""  # where the restored state's keys are ("": the cluster's checkpoint storage)
    savepoint_targets: dict[int, str] = field(default_factory=dict)  # savepoint id -> folder URI to copy it to
    savepoint_paths: dict[int, str] = field(default_factory=dict)  # completed savepoint id -> its external path
    restore_checkpoint_id: int = 0
    last_restore_at: float = 0.0
    record_saved_at: float = 0.0
    exceptions: ExceptionHistory = field(default_factory=ExceptionHistory)  # the failures that failed it over
    # Restarts before this JobManager took the job over (its job record). The restart strategy itself
    # starts over with a new JobManager, as Flink's does: its budget (restart.max-attempts, ...) is per
    # JobManager; the count reported is the job's since it was submitted.
    restarts_under_earlier_jobmanagers: int = 0
    # One per high-availability takeover (its job record's): which checkpoints a restore must ignore.
    term_fences: tuple[TermFence, ...] = ()

    @classmethod
    def create(cls, submission: JobSubmission, loaded: LoadedJob, metadata_key: Callable[..., str]) -> JobMaster:
        """Build the job's plan, its coordinator and lifecycle; invalid settings raise ConfigError (a
        user error)."""
        plan = build_plan(loaded.graph)
        settings = parse_checkpoint_settings(submission.parameters)
        job_id = JobId(submission.job_id)
        coordinator = CheckpointCoordinator(
            job_id,
            settings.trigger,
            InMemoryCompletedCheckpointStore(max_retained=settings.retained),
            metadata_key=metadata_key,
        )
        sources = [
            TaskId(job_id, OperatorUid(v.uid), SubtaskIndex(s))
            for v in plan.vertices.values()
            if v.is_source
            for s in range(v.parallelism)
        ]
        master = cls(
            submission=submission,
            loaded=loaded,
            plan=plan,
            checkpoint_settings=settings,
            lifecycle=JobLifecycle(job_id, coordinator, parse_restart_strategy(submission.parameters), sources),
            execution_settings=parse_execution_settings(submission.parameters),
        )
        master.tasks = _task_records(loaded, plan)
        return master

    def rescaled_plan(self, parallelism: int) -> tuple[LoadedJob, JobPlan]:
        """The job and its plan at another default parallelism (operators that set their own keep it);
        raises JobDefinitionError when the graph cannot take it (a forward edge between operators of
        different parallelisms)."""
        graph = replace(self.loaded.graph, default_parallelism=parallelism)
        graph.validate()
        return replace(self.loaded, graph=graph), build_plan(graph)

    def rescale(self, parallelism: int) -> None:
        """A rescale's checkpoint completed and the job restarts: from now on it runs at ``parallelism``
        (its submission, and so its record, says so: a later failover or a JobManager taking over keeps
        it). The TaskManagers build the same graph from the job's code at that parallelism."""
        loaded, plan = self.rescaled_plan(parallelism)
        earlier = {key: t.records_in_all_attempts for key, t in self.tasks.items()}
        self.submission = replace(self.submission, parallelism=parallelism)
        self.loaded, self.plan = loaded, plan
        self.tasks = _task_records(loaded, plan)
        for key, total in earlier.items():
            if key in self.tasks:
                self.tasks[key].records_in_earlier_attempts = total
        self.lifecycle.set_sources(self.source_task_ids())

    @property
    def job_id(self) -> str:
        return self.submission.job_id

    @property
    def status(self) -> JobStatus:
        return self.lifecycle.status

    @property
    def attempt(self) -> int:
        """The highest attempt used: by a deployment, or by the end's resolution (which fences them all)."""
        return self.lifecycle.attempt

    @property
    def coordinator(self) -> CheckpointCoordinator:
        """The checkpoint coordinator, for reads; every change goes through ``lifecycle``."""
        return self.lifecycle.coordinator

    @property
    def restart_strategy(self) -> RestartStrategy:
        return self.lifecycle.restart_strategy

    @property
    def finished_at(self) -> float | None:
        """When the job ended (FINISHED, CANCELED, FAILED); None while it has not."""
        match self.lifecycle.state:
            case Ended(at=at):
                return at
            case Ending(outcome=JobStatus.FAILED, since=since):
                return since
            case Created() | Running() | Restarting() | Ending():
                return None
            case state:
                assert_never(state)

    @property
    def slots_needed(self) -> int:
        return self.plan.max_parallelism_over_vertices

    def slots_used_on(self, taskmanager_id: str) -> int:
        if self.status.terminal or self.status is JobStatus.RESTARTING:
            return 0
        return sum(1 for tm in self.slots if tm == taskmanager_id)

    # Deployment -----------------------------------------------------------------------------------

    def schedule(
        self, offers: list[SlotOffer], addresses: dict[str, str], now: float
    ) -> tuple[DeployCommand, tuple[Action, ...]]:
        """Place every subtask and build the deploy requests of a new attempt (raises
        NotEnoughSlotsError); answers them with the lifecycle's actions for the new attempt."""
        slots = assign_slots(offers, self.slots_needed)
        placement = place_subtasks({v.uid: v.parallelism for v in self.plan.vertices.values()}, slots)
        self.slots = slots
        attempt, actions = self.lifecycle.deploying(now)
        sub = self.submission
        requests: list[tuple[str, TaskDeployment]] = []
        # Consumers first, so that their input gates exist when producers connect.
        for vertex in reversed(list(self.plan.vertices.values())):
            for s in range(vertex.parallelism):
                tm = placement[(vertex.uid, s)]
                record = self.tasks[(vertex.uid, s)]
                record.taskmanager_id = tm
                record.attempt = attempt
                record.state = TaskState.DEPLOYING
                record.failure = None
                record.records_in_earlier_attempts += record.records_in
                record.records_in = record.records_out = 0
                record.ratios = record.watermark = record.progress_at = record.totals = None
                record.rates = record.counted_at = None
                deployment = TaskDeployment(
                    job_id=sub.job_id,
                    vertex_uid=vertex.uid,
                    subtask=s,
                    attempt=attempt,
                    job_name=sub.job_name,
                    job_source=sub.job_source,
                    job_file_name=sub.job_file_name,
                    artifact_id=sub.artifact_id,
                    parameters=sub.parameters,
                    parallelism=sub.parallelism,
                    restore_state_handle=self.restore.get((vertex.uid, s), b""),
                    restore_checkpoint_id=self.restore_checkpoint_id,
                    inherited_task_states=self.inherited.get(vertex.uid, ()),
                    restore_storage_uri=self.restore_storage_uri,
                    checkpointing_mode=self.checkpoint_settings.mode,
                    buffer_timeout_ms=self.execution_settings.buffer_timeout_ms,
                    aligned_checkpoint_timeout_ms=round(self.checkpoint_settings.aligned_checkpoint_timeout_s * 1000),
                    inputs=tuple(
                        InputChannelSpec(ch.gate, ch.channel, ch.producer_vertex, ch.producer_subtask)
                        for ch in self.plan.input_channels(vertex.uid, s)
                    ),
                    outputs=tuple(
                        OutputChannelSpec(
                            output=ch.edge_index,
                            channel=ch.channel,
                            consumer_vertex=ch.consumer_vertex,
                            consumer_subtask=ch.consumer_subtask,
                            consumer_address=addresses[placement[(ch.consumer_vertex, ch.consumer_subtask)]],
                            consumer_channel=ch.consumer_channel,
                        )
                        for ch in self.plan.output_channels(vertex.uid, s)
                    ),
                )
                requests.append((addresses[tm], deployment))
        log.info(
            "job_scheduled",
            job_id=sub.job_id,
            attempt=attempt,
            slots=slots,
            restore_checkpoint_id=self.restore_checkpoint_id or None,
        )
        return DeployCommand(attempt, tuple(requests)), actions

    def task_id(self, vertex_uid: str, subtask: int) -> TaskId:
        return TaskId(JobId(self.job_id), OperatorUid(vertex_uid), SubtaskIndex(subtask))

    def all_task_ids(self) -> list[TaskId]:
        return [self.task_id(uid, s) for uid, s in self.tasks]

    def source_task_ids(self) -> list[TaskId]:
        return [self.task_id(uid, s) for uid, s in self.tasks if self.plan.vertices[uid].is_source]

    def all_running(self) -> bool:
        return all(t.state is TaskState.RUNNING for t in self.tasks.values())

    def all_finished(self) -> bool:
        return all(t.state is TaskState.FINISHED for t in self.tasks.values())

    def taskmanager_of(self, task: TaskId) -> str:
        return self.tasks[(task.operator_uid, task.subtask)].taskmanager_id

    def taskmanagers_in_use(self) -> set[str]:
        return {t.taskmanager_id for t in self.tasks.values() if t.taskmanager_id}

    # Task events ----------------------------------------------------------------------------------

    def record_task_state(
        self,
        vertex_uid: str,
        subtask: int,
        attempt: int,
        state: TaskState,
        failure: Failure | None,
        records_in: int,
        records_out: int,
    ) -> TaskRecord | None:
        """Keep a task's report of the current attempt (None: of another attempt, or of a task the job
        does not have, or the job ended; the lifecycle then hears nothing of it)."""
        if attempt != self.attempt or self.status.terminal:
            return None
        record = self.tasks.get((vertex_uid, subtask))
        if record is None:
            return None
        record.state = state
        record.records_in = max(record.records_in, records_in)
        record.records_out = max(record.records_out, records_out)
        if state is TaskState.FAILED:
            record.failure = failure or Failure.internal("the task reported FAILED without a failure")
        elif state is TaskState.CANCELED and self.status is JobStatus.RUNNING:
            record.failure = Failure.internal("cancelled while the job was running")
        return record

    def on_progress(self, progress: TaskProgress, now: float) -> None:
        """A heartbeat's news of a running task of the current attempt: its counters (which never go
        back), its time shares and input watermark (the latest win; kept while a heartbeat has none)."""
        record = self.tasks.get((progress.vertex_uid, progress.subtask))
        if record is None or progress.attempt != self.attempt:
            return
        counted = (record.records_in, record.records_out)
        record.records_in = max(record.records_in, progress.records_in)
        record.records_out = max(record.records_out, progress.records_out)
        if record.counted_at is not None and now > record.counted_at:
            counts = (record.records_in, record.records_out)
            record.rates = RecordRates.between(counted, counts, now - record.counted_at)
        record.counted_at = now
        if progress.ratios is not None:
            record.ratios = progress.ratios
            record.progress_at = now
        if progress.watermark is not None:
            record.watermark = progress.watermark
        if progress.totals is not None:
            record.totals = progress.totals

    def record_failure(self, failure: Failure, now: float, *, cause: ExceptionEntry | None = None) -> None:
        """A failure that fails the job over: keep it in the exception history as ``cause`` (the task,
        TaskManager and failure it came from), else as the job's failure alone."""
        self.exceptions = self.exceptions.add(cause or ExceptionEntry(failure, now, self.attempt))
        self.failure = failure

    def tasks_stopped(self) -> None:
        """The tasks of the attempt are being stopped (a failover, cancel or the end): none still runs."""
        for t in self.tasks.values():
            if _still_running(t.state):
                t.state = TaskState.CANCELED

    @property
    def restarts(self) -> int:
        """Restarts since submission, under every JobManager that ran the job."""
        return self.restarts_under_earlier_jobmanagers + self.restart_strategy.restart_count


def _task_records(loaded: LoadedJob, plan: JobPlan) -> dict[tuple[str, int], TaskRecord]:
    records: dict[tuple[str, int], TaskRecord] = {}
    for v in plan.vertices.values():
        names = " -> ".join(loaded.graph.transformations[u].name for u in v.operator_uids)
        for s in range(v.parallelism):
            records[(v.uid, s)] = TaskRecord(v.uid, s, names)
    return records


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]
