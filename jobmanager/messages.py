"""The JobManager's control-plane values, free of protobuf: what the TaskManagers report (heartbeats,
task states, checkpoint acknowledgements and declines) and what the read API answers. The servicer
converts between them and ``weir.wire.jobmanager_pb2``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from weir.core.checkpointing import CheckpointKind
from weir.core.failures import Failure
from weir.core.hardware import Hardware
from weir.core.ids import CheckpointId
from weir.core.states import JobStatus, TaskState
from weir.core.task_time import TimeRatios, TimeTotals
from weir.graph import Partitioning
from weir.jobmanager.checkpointing.config import CheckpointSettings
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary
from weir.jobmanager.checkpointing.pending import StateObject, TaskAckMetrics

# What TaskManagers report --------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskProgress:
    """A running task's counters, carried by a heartbeat, with the shares of its time since the
    previous heartbeat and its input watermark (ms), None while unknown."""

    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    records_in: int
    records_out: int
    ratios: TimeRatios | None = None
    watermark: int | None = None
    totals: TimeTotals | None = None  # the attempt's busy, backpressured and idle seconds so far


@dataclass(frozen=True)
class RecordRates:
    """A task's records per second over the interval between two heartbeats (Flink's
    ``numRecordsInPerSecond`` / ``numRecordsOutPerSecond``, which Flink averages over a minute)."""

    in_per_second: float
    out_per_second: float

    @classmethod
    def between(cls, earlier: tuple[int, int], later: tuple[int, int], elapsed_s: float) -> RecordRates:
        """From the (records in, records out) counted ``elapsed_s`` apart (> 0)."""
        return cls((later[0] - earlier[0]) / elapsed_s, (later[1] - earlier[1]) / elapsed_s)


@dataclass(frozen=True)
class Heartbeat:
    taskmanager_id: str
    running_tasks: tuple[TaskProgress, ...]


@dataclass(frozen=True)
class JobAttempt:
    job_id: str
    attempt: int


@dataclass(frozen=True)
class HeartbeatAnswer:
    """``reregister``: the JobManager does not know this TaskManager (it restarted, or declared the
    TaskManager lost); ``cancel``: the attempts whose tasks must stop there."""

    reregister: bool
    cancel: tuple[JobAttempt, ...] = ()


@dataclass(frozen=True)
class TaskStateReport:
    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    state: TaskState
    failure: Failure | None
    records_in: int
    records_out: int
    input_ended: bool  # a source read all its bounded input and waits for a final checkpoint


@dataclass(frozen=True)
class CheckpointAck:
    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    checkpoint_id: int
    objects: tuple[StateObject, ...]  # durable objects the snapshot references
    inline_payload: bytes  # the task's own snapshot, opaque to the JobManager, returned on restore
    metrics: TaskAckMetrics


@dataclass(frozen=True)
class CheckpointDecline:
    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    checkpoint_id: int
    reason: str


# What the read API answers -------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSummaryView:
    job_id: str
    job_name: str
    status: JobStatus
    submitted_at: float
    parallelism: int
    restarts: int


@dataclass(frozen=True)
class TaskView:
    vertex_uid: str
    subtask: int
    operator_names: str
    state: TaskState | None  # None: not reported yet
    taskmanager_id: str
    failure: Failure | None
    records_in: int
    records_out: int
    records_in_all_attempts: int
    attempt: int = 0  # the job attempt the task belongs to (0: never deployed)
    ratios: TimeRatios | None = None  # shares of its time over its last heartbeat interval; None: not measured
    watermark: int | None = None  # its current input watermark, ms; None: none yet
    progress_at: float | None = None  # when the heartbeat carrying ``ratios`` came
    rates: RecordRates | None = None  # records per second between its latest two heartbeats; None: not yet
    time_totals: TimeTotals | None = None  # its attempt's busy/backpressured/idle seconds; None: not reported


@dataclass(frozen=True)
class JobEndView:
    """An ending or ended job and its sinks' resolution (``weir.jobmanager.lifecycle.RecordedEnd``)."""

    outcome: JobStatus
    ended: bool
    at: float
    nothing_to_resolve: bool  # every task FINISHED
    resolution_decided: bool  # False: waits for a checkpoint being persisted
    as_of_checkpoint: int | None
    attempts: int
    resolved: bool
    error: str
    retry_at: float | None


@dataclass(frozen=True)
class JobStatusView:
    summary: JobSummaryView
    tasks: tuple[TaskView, ...]
    failure: Failure | None
    last_completed_checkpoint: int  # 0: none yet
    last_restore_at: float
    finished_at: float | None = None  # when it ended (FINISHED, CANCELED, FAILED); None: not ended
    now: float = 0.0  # the JobManager's clock when the view was taken
    end: JobEndView | None = None  # None: neither ending nor ended


@dataclass(frozen=True)
class OperatorView:
    uid: str
    name: str


@dataclass(frozen=True)
class InputEdgeView:
    """A network edge into a vertex: from which vertex, partitioned how, from which side output."""

    producer_vertex: str
    partitioning: Partitioning
    side_output: str | None  # the tag's name; None: the producer's main output


@dataclass(frozen=True)
class VertexView:
    uid: str  # its head operator's
    parallelism: int
    operators: tuple[OperatorView, ...]  # the chain, head first
    inputs: tuple[InputEdgeView, ...]

    @property
    def name(self) -> str:
        return " -> ".join(o.name for o in self.operators)


@dataclass(frozen=True)
class JobPlanView:
    job_id: str
    job_name: str
    vertices: tuple[VertexView, ...]  # in topological order
    max_parallelism: int = 0  # its key groups (Flink's maxParallelism); 0: not known


@dataclass(frozen=True)
class JobConfigView:
    """A job's settings as submitted (``-D`` parameters, literal secrets refused at submit, so a secret
    shows as the reference it was given as) and as the JobManager parsed them."""

    job_id: str
    job_name: str
    parallelism: int
    max_parallelism: int
    parameters: Mapping[str, str]
    checkpointing: CheckpointSettings
    restart_strategy: str  # its name (restart.strategy)
    buffer_timeout_s: float  # execution.buffer-timeout
    checkpoint_storage: str  # the cluster's checkpoint storage URI


@dataclass(frozen=True)
class CheckpointCounts:
    triggered: int = 0
    completed: int = 0
    failed: int = 0
    in_progress: int = 0
    restores: int = 0  # deployments that restored a checkpoint


@dataclass(frozen=True)
class RestoredCheckpointView:
    """The checkpoint the job's current attempt restored."""

    checkpoint_id: CheckpointId
    restored_at: float
    kind: CheckpointKind


@dataclass(frozen=True)
class CheckpointsView:
    job_id: str
    checkpoints: tuple[CheckpointSummary, ...]  # newest first
    external_paths: Mapping[CheckpointId, str] = field(default_factory=dict)  # of the retained ones
    counts: CheckpointCounts = CheckpointCounts()  # since this JobManager took the job
    restored: RestoredCheckpointView | None = None


@dataclass(frozen=True)
class PlacedTaskView:
    """A task of a job's current attempt placed on a TaskManager."""

    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int
    state: TaskState | None  # None: not reported yet


@dataclass(frozen=True)
class CheckpointDetailView:
    """One checkpoint with every subtask's stats and timeline (``weir checkpoints JOB --detail CID``):
    ``checkpoint.tasks`` acknowledged it, ``checkpoint.pending_tasks`` did not (yet). A retained
    checkpoint that a restarted JobManager read from storage has no per-subtask stats."""

    job_id: str
    checkpoint: CheckpointSummary
    external_path: str | None  # while retained, or a savepoint's


@dataclass(frozen=True)
class TaskManagerView:
    taskmanager_id: str
    address: str
    slots_total: int
    slots_free: int
    last_heartbeat_age_s: float
    alive: bool
    tasks: tuple[PlacedTaskView, ...] = ()  # of the jobs that have not ended
    metrics_port: int = 0  # its Prometheus metrics; 0: none
    hardware: Hardware | None = None  # its cores and memory as it reported them; None: not reported


@dataclass(frozen=True)
class ClusterView:
    taskmanagers: tuple[TaskManagerView, ...]
