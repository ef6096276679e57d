"""A job's lifecycle in the JobManager: deploy, track task states, fail over, finish or cancel.

``JobMaster`` decides; the ``TaskManagerGateway`` carries the decisions to the TaskManagers. All
methods are called with the JobManager's lock held, except the gateway calls, which run on a worker
thread so that a slow TaskManager never blocks the servicer.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from jobmanager.checkpointing.config import CheckpointSettings, parse_checkpoint_settings
from jobmanager.checkpointing.coordinator import CheckpointCoordinator
from jobmanager.checkpointing.store import InMemoryCompletedCheckpointStore
from jobmanager.execution import ExecutionSettings, parse_execution_settings
from jobmanager.restart import FailureCause, GiveUp, RestartStrategy, parse_restart_strategy
from jobmanager.scheduler import SlotOffer, assign_slots, place_subtasks
from weir.api import LoadedJob
from weir.ids import JobId, OperatorUid, SubtaskIndex, TaskId
from weir.plan import JobPlan, build_plan
from weir.wire import common_pb2, taskmanager_pb2

log = structlog.get_logger("weir.jobmanager")

TERMINAL_TASK_STATES = frozenset(
    {common_pb2.TASK_STATE_FINISHED, common_pb2.TASK_STATE_CANCELED, common_pb2.TASK_STATE_FAILED}
)


class JobStatus(enum.Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)


@dataclass
class TaskRecord:
    vertex_uid: str
    subtask: int
    operator_names: str
    taskmanager_id: str = ""
    state: int = common_pb2.TASK_STATE_UNSPECIFIED
    failure: str = ""
    records_in: int = 0
    records_out: int = 0
    records_in_earlier_attempts: int = 0

    @property
    def records_in_all_attempts(self) -> int:
        return self.records_in_earlier_attempts + self.records_in


@dataclass(frozen=True)
class JobSubmission:
    job_id: str
    job_name: str
    job_file_name: str
    job_source: bytes
    parameters: dict[str, str]
    parallelism: int
    submitted_at: float


@dataclass
class DeployCommand:
    """One deployment round, executed by the gateway off the lock."""

    attempt: int
    requests: list[tuple[str, taskmanager_pb2.DeployTaskRequest]]  # (TaskManager address, request)


@dataclass
class JobMaster:
    submission: JobSubmission
    loaded: LoadedJob
    plan: JobPlan
    restart_strategy: RestartStrategy
    checkpoint_settings: CheckpointSettings
    coordinator: CheckpointCoordinator
    execution_settings: ExecutionSettings = field(default_factory=ExecutionSettings)
    status: JobStatus = JobStatus.CREATED
    attempt: int = 0
    tasks: dict[tuple[str, int], TaskRecord] = field(default_factory=dict)
    slots: list[str] = field(default_factory=list)
    failure: str = ""
    restart_at: float | None = None
    restore: dict[tuple[str, int], bytes] = field(default_factory=dict)
    restore_checkpoint_id: int = 0
    last_restore_at: float = 0.0
    finished_at: float | None = None
    cancel_requested_at: float | None = None
    sources_ended: set[tuple[str, int]] = field(default_factory=set)  # bounded sources awaiting a final checkpoint
    final_checkpoint_id: int | None = None
    record_saved_at: float = 0.0

    @classmethod
    def create(cls, submission: JobSubmission, loaded: LoadedJob, metadata_key: Callable[..., str]) -> JobMaster:
        """Build the job's plan and its coordinator; invalid settings raise ConfigError (a user error)."""
        plan = build_plan(loaded.graph)
        settings = parse_checkpoint_settings(submission.parameters)
        master = cls(
            submission=submission,
            loaded=loaded,
            plan=plan,
            restart_strategy=parse_restart_strategy(submission.parameters),
            checkpoint_settings=settings,
            execution_settings=parse_execution_settings(submission.parameters),
            coordinator=CheckpointCoordinator(
                JobId(submission.job_id),
                settings.trigger,
                InMemoryCompletedCheckpointStore(max_retained=settings.retained),
                metadata_key=metadata_key,
            ),
        )
        for v in plan.vertices.values():
            names = " -> ".join(loaded.graph.transformations[u].name for u in v.operator_uids)
            for s in range(v.parallelism):
                master.tasks[(v.uid, s)] = TaskRecord(v.uid, s, names)
        return master

    @property
    def job_id(self) -> str:
        return self.submission.job_id

    @property
    def slots_needed(self) -> int:
        return self.plan.max_parallelism_over_vertices

    def slots_used_on(self, taskmanager_id: str) -> int:
        if self.status.terminal or self.status is JobStatus.RESTARTING:
            return 0
        return sum(1 for tm in self.slots if tm == taskmanager_id)

    # Deployment -----------------------------------------------------------------------------------

    def schedule(self, offers: list[SlotOffer], addresses: dict[str, str], now: float) -> DeployCommand:
        """Place every subtask and build the deploy requests of a new attempt (raises NotEnoughSlotsError)."""
        slots = assign_slots(offers, self.slots_needed)
        placement = place_subtasks({v.uid: v.parallelism for v in self.plan.vertices.values()}, slots)
        self.slots = slots
        self.attempt += 1
        self.sources_ended = set()
        self.final_checkpoint_id = None
        self.status = JobStatus.RUNNING
        self.restart_at = None
        sub = self.submission
        requests: list[tuple[str, taskmanager_pb2.DeployTaskRequest]] = []
        # Consumers first, so that their input gates exist when producers connect.
        for vertex in reversed(list(self.plan.vertices.values())):
            for s in range(vertex.parallelism):
                tm = placement[(vertex.uid, s)]
                record = self.tasks[(vertex.uid, s)]
                record.taskmanager_id = tm
                record.state = common_pb2.TASK_STATE_DEPLOYING
                record.failure = ""
                record.records_in_earlier_attempts += record.records_in
                record.records_in = record.records_out = 0
                request = taskmanager_pb2.DeployTaskRequest(
                    task=common_pb2.TaskRef(job_id=sub.job_id, vertex_uid=vertex.uid, subtask=s),
                    attempt=self.attempt,
                    job_name=sub.job_name,
                    job_source=sub.job_source,
                    job_file_name=sub.job_file_name,
                    parameters=sub.parameters,
                    parallelism=sub.parallelism,
                    restore_state_handle=self.restore.get((vertex.uid, s), b""),
                    restore_checkpoint_id=self.restore_checkpoint_id,
                    job_config={k: v for k, v in sub.parameters.items() if k.startswith("checkpointing.")},
                    buffer_timeout_ms=self.execution_settings.buffer_timeout_ms,
                )
                for ch in self.plan.input_channels(vertex.uid, s):
                    request.inputs.add(
                        gate=ch.gate,
                        channel=ch.channel,
                        producer=common_pb2.TaskRef(
                            job_id=sub.job_id, vertex_uid=ch.producer_vertex, subtask=ch.producer_subtask
                        ),
                    )
                for ch in self.plan.output_channels(vertex.uid, s):
                    request.outputs.add(
                        output=ch.edge_index,
                        channel=ch.channel,
                        consumer=common_pb2.TaskRef(
                            job_id=sub.job_id, vertex_uid=ch.consumer_vertex, subtask=ch.consumer_subtask
                        ),
                        consumer_address=addresses[placement[(ch.consumer_vertex, ch.consumer_subtask)]],
                        consumer_channel=ch.consumer_channel,
                    )
                requests.append((addresses[tm], request))
        log.info(
            "job_scheduled",
            job_id=sub.job_id,
            attempt=self.attempt,
            slots=slots,
            restore_checkpoint_id=self.restore_checkpoint_id or None,
        )
        return DeployCommand(self.attempt, requests)

    def task_id(self, vertex_uid: str, subtask: int) -> TaskId:
        return TaskId(JobId(self.job_id), OperatorUid(vertex_uid), SubtaskIndex(subtask))

    def all_task_ids(self) -> list[TaskId]:
        return [self.task_id(uid, s) for uid, s in self.tasks]

    def source_task_ids(self) -> list[TaskId]:
        return [self.task_id(uid, s) for uid, s in self.tasks if self.plan.vertices[uid].is_source]

    def needs_final_checkpoint(self) -> bool:
        """Every source read all its bounded input and no final checkpoint is under way."""
        sources = {(t.operator_uid, t.subtask) for t in self.source_task_ids()}
        return bool(sources) and sources <= self.sources_ended and self.final_checkpoint_id is None

    def all_running(self) -> bool:
        return all(t.state == common_pb2.TASK_STATE_RUNNING for t in self.tasks.values())

    def taskmanager_of(self, task: TaskId) -> str:
        return self.tasks[(task.operator_uid, task.subtask)].taskmanager_id

    def taskmanagers_in_use(self) -> set[str]:
        return {t.taskmanager_id for t in self.tasks.values() if t.taskmanager_id}

    # Task events ----------------------------------------------------------------------------------

    def on_task_state(
        self,
        vertex_uid: str,
        subtask: int,
        attempt: int,
        state: int,
        failure: str,
        records_in: int,
        records_out: int,
        now: float,
    ) -> str | None:
        """Apply a task's report; returns a failure reason when the job must fail over."""
        if attempt != self.attempt or self.status.terminal:
            return None
        record = self.tasks.get((vertex_uid, subtask))
        if record is None:
            return None
        record.state = state
        record.records_in = max(record.records_in, records_in)
        record.records_out = max(record.records_out, records_out)
        if state == common_pb2.TASK_STATE_FAILED:
            record.failure = failure
        if (
            state in TERMINAL_TASK_STATES  # a task may finish or fail before the cancel reaches it
            and self.status is JobStatus.CANCELLING
            and all(t.state in TERMINAL_TASK_STATES for t in self.tasks.values())
        ):
            self.status = JobStatus.CANCELED
            self.finished_at = now
            return None
        if state == common_pb2.TASK_STATE_FAILED:
            return f"task {vertex_uid}#{subtask} failed: {failure}"
        if (
            state == common_pb2.TASK_STATE_FINISHED
            and self.status is JobStatus.RUNNING
            and all(t.state == common_pb2.TASK_STATE_FINISHED for t in self.tasks.values())
        ):
            self.status = JobStatus.FINISHED
            self.finished_at = now
            log.info("job_finished", job_id=self.job_id, attempt=self.attempt)
        return None

    def on_progress(self, vertex_uid: str, subtask: int, attempt: int, records_in: int, records_out: int) -> None:
        record = self.tasks.get((vertex_uid, subtask))
        if record is not None and attempt == self.attempt:
            record.records_in = max(record.records_in, records_in)
            record.records_out = max(record.records_out, records_out)

    def fail_over(self, reason: str, now: float, cause: FailureCause | None = None) -> None:
        """A task or TaskManager failed: restart after the strategy's delay, or fail the job."""
        if self.status not in (JobStatus.RUNNING, JobStatus.CREATED):
            return
        decision = self.restart_strategy.on_failure(now, cause or FailureCause(reason))
        self.failure = reason
        for t in self.tasks.values():
            if t.state not in TERMINAL_TASK_STATES:
                t.state = common_pb2.TASK_STATE_CANCELED
        if isinstance(decision, GiveUp):
            self.status = JobStatus.FAILED
            self.finished_at = now
            log.error("job_failed", job_id=self.job_id, attempt=self.attempt, reason=reason, gave_up=decision.reason)
            return
        self.status = JobStatus.RESTARTING
        self.restart_at = now + decision.delay_s
        log.warning(
            "job_restarting",
            job_id=self.job_id,
            attempt=self.attempt,
            reason=reason,
            delay_s=round(decision.delay_s, 3),
            restart=decision.attempt,
        )

    def replace(self, reason: str, now: float) -> None:
        """Place the attempt again at once, without counting a restart: it never ran (a TaskManager
        it was placed on turned out to be gone before anything was deployed)."""
        self.status = JobStatus.RESTARTING
        self.restart_at = now
        for t in self.tasks.values():
            if t.state not in TERMINAL_TASK_STATES:
                t.state = common_pb2.TASK_STATE_CANCELED
        log.info("job_replaced", job_id=self.job_id, attempt=self.attempt, reason=reason)

    def cancel(self, now: float) -> None:
        if self.status.terminal:
            return
        if self.status in (JobStatus.RESTARTING, JobStatus.CREATED):
            self.status = JobStatus.CANCELED
            self.finished_at = now
            return
        self.status = JobStatus.CANCELLING
        self.cancel_requested_at = now

    @property
    def restarts(self) -> int:
        return self.restart_strategy.restart_count


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]
