"""The REST API's response models (pydantic: they are the OpenAPI schema) and the one conversion of
the JobManager's read views (``weir.jobmanager.messages``) into them.

Field names are Flink's where Flink has the concept (kebab-case or camelCase as Flink spells them),
snake_case for Weir's own. Times are epoch milliseconds, durations milliseconds, sizes bytes. Enums
go out by their names (``USER``, ``HASH``, ``SAVEPOINT``).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Final, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema, model_validator

from weir import __version__
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.errors import Fault
from weir.core.failures import Failure
from weir.core.hardware import Hardware
from weir.core.ids import CheckpointId
from weir.core.states import JobStatus, TaskState
from weir.graph import Partitioning
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary, TaskCheckpointStats
from weir.jobmanager.exception_history import ExceptionHistory
from weir.jobmanager.leader_election import LeaseRecord
from weir.jobmanager.messages import (
    CheckpointDetailView,
    CheckpointsView,
    ClusterView,
    JobEndView,
    JobPlanView,
    JobStatusView,
    JobSummaryView,
    TaskManagerView,
    TaskView,
    VertexView,
)
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id, slot_sharing_group_id


def _names(enum_type: type[enum.Enum]) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "enum": [m.name for m in enum_type]})


_BY_NAME = PlainSerializer(lambda member: member.name, return_type=str)

FaultName = Annotated[Fault, _BY_NAME, _names(Fault)]
CheckpointKindName = Annotated[CheckpointKind, _BY_NAME, _names(CheckpointKind)]
PartitioningName = Annotated[Partitioning, _BY_NAME, _names(Partitioning)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]


class Model(BaseModel):
    """Frozen; built in Python by field name, written out by alias (the API's spelling)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True)


def _api(name: str) -> Any:
    """A field the API spells ``name`` (kebab-case or camelCase), built in Python by its own name."""
    return Field(validation_alias=name, serialization_alias=name)


def ms(seconds: float) -> int:
    """Epoch seconds (or a duration in seconds) as the API's milliseconds."""
    return round(seconds * 1000)


def _optional_ms(seconds: float | None) -> int | None:
    return None if seconds is None else ms(seconds)


# Errors and health ---------------------------------------------------------------------------------


class ErrorBody(Model):
    errors: list[str]


class HealthStatus(enum.StrEnum):
    OK = "ok"
    STARTING = "starting"  # the JobManager is still taking over its jobs from checkpoint storage
    STOPPING = "stopping"


class KnownLeader(Model):
    """The leader JobManager as a standby last read the lease (high availability)."""

    address: str  # where it serves gRPC (WEIR_HA_ADVERTISED_ADDRESS)
    term: int  # the lease term it leads in


class Health(Model):
    status: HealthStatus
    taskmanagers: int | None = None  # alive ones
    jobs_running: int | None = None
    leader: KnownLeader | None = None  # a standby's (503): the leader it knows; absent: none known


def known_leader(record: LeaseRecord | None) -> KnownLeader | None:
    """The leader a lease names, as a standby's ``/healthz`` shows it."""
    return None if record is None else KnownLeader(address=record.address, term=record.term)


def health(
    status: HealthStatus,
    cluster: ClusterView | None,
    jobs: Sequence[JobSummaryView],
    leader: KnownLeader | None = None,
) -> Health:
    if status is not HealthStatus.OK or cluster is None:
        return Health(status=status, leader=leader)
    return Health(
        status=status,
        taskmanagers=sum(1 for tm in cluster.taskmanagers if tm.alive),
        jobs_running=sum(1 for j in jobs if j.status is JobStatus.RUNNING),
    )


# Jobs overview (Flink's MultipleJobsDetails) ------------------------------------------------------

FLINK_EXECUTION_STATES: tuple[str, ...] = (
    "CREATED",
    "SCHEDULED",
    "DEPLOYING",
    "RUNNING",
    "FINISHED",
    "CANCELING",
    "CANCELED",
    "FAILED",
    "RECONCILING",
    "INITIALIZING",
)
FLINK_JOB_STATUSES: tuple[str, ...] = (
    "INITIALIZING",
    "CREATED",
    "RUNNING",
    "FAILING",
    "FAILED",
    "CANCELLING",
    "CANCELED",
    "FINISHED",
    "RESTARTING",
    "SUSPENDED",
    "RECONCILING",
)


def task_counts(states: Iterable[TaskState | None]) -> dict[str, int]:
    """Flink's ``tasks`` of a job in the jobs overview (``MultipleJobsDetails``): ``total`` and one count
    per ExecutionState (lower case), every one present as Flink's client reads them all; a task not
    reported yet counts as CREATED."""
    seen = Counter("CREATED" if state is None else state.value for state in states)
    return {"total": sum(seen.values()), **{name.lower(): seen[name] for name in FLINK_EXECUTION_STATES}}


def execution_state(state: TaskState | None) -> str:
    """A task's or vertex's state as Flink's ExecutionState: Weir's are a subset; not reported yet is CREATED."""
    return "CREATED" if state is None else state.value


def execution_state_counts(states: Iterable[TaskState | None]) -> dict[str, int]:
    """Flink's counts per ExecutionState in ``JobDetailsInfo`` (a vertex's ``tasks``, the job's vertices
    in ``status-counts``): by its name (upper case, every one present, no total: Flink reads the keys as
    ExecutionStates); a task not reported yet, or a vertex whose tasks have not all reported, counts as
    CREATED."""
    seen = Counter(execution_state(state) for state in states)
    return {name: seen[name] for name in FLINK_EXECUTION_STATES}


UNKNOWN_REVISION: Final = "unknown"  # a Weir build records no source revision (Flink's commit id)
JOB_TYPE: Final = "STREAMING"  # Flink's JobType: Weir runs every job as a stream, bounded input too


class JobOverviewEntry(Model):
    jid: str
    name: str
    state: JobStatus
    start_time: int = _api("start-time")
    end_time: int = _api("end-time")  # -1: not ended
    duration: int
    last_modification: int = _api("last-modification")
    tasks: dict[str, int]
    pending_operators: int = _api("pending-operators")


class JobsOverview(Model):
    jobs: list[JobOverviewEntry]  # newest first


def jobs_overview(statuses: Iterable[JobStatusView]) -> JobsOverview:
    entries = []
    for status in sorted(statuses, key=lambda s: (s.summary.submitted_at, s.summary.job_id), reverse=True):
        summary = status.summary
        start = ms(summary.submitted_at)
        end = _optional_ms(status.finished_at)
        now_ms = ms(status.now)
        entries.append(
            JobOverviewEntry(
                jid=flink_job_id(summary.job_id),
                name=summary.job_name,
                state=summary.status,
                start_time=start,
                end_time=end if end is not None else -1,
                duration=max(0, (end if end is not None else now_ms) - start),
                last_modification=end if end is not None else max(start, ms(status.last_restore_at)),
                tasks=task_counts(t.state for t in status.tasks),
                pending_operators=0,
            )
        )
    return JobsOverview(jobs=entries)


# Overview and TaskManagers -------------------------------------------------------------------------


class Overview(Model):
    taskmanagers: int
    slots_total: int = _api("slots-total")
    slots_available: int = _api("slots-available")
    jobs_running: int = _api("jobs-running")  # every job that has not ended (Flink counts so)
    jobs_finished: int = _api("jobs-finished")
    jobs_cancelled: int = _api("jobs-cancelled")
    jobs_failed: int = _api("jobs-failed")
    taskmanagers_blocked: int = _api("taskmanagers-blocked")  # 0: Weir blocks no TaskManager
    slots_free_and_blocked: int = _api("slots-free-and-blocked")
    flink_version: str = _api("flink-version")  # Weir's version, as /config's
    flink_commit: str = _api("flink-commit")  # a Weir build records no revision: "unknown"
    weir_version: str = _api("weir-version")


def overview(cluster: ClusterView, jobs: Sequence[JobSummaryView]) -> Overview:
    alive = [tm for tm in cluster.taskmanagers if tm.alive]
    statuses = Counter(j.status for j in jobs)
    return Overview(
        taskmanagers=len(alive),
        slots_total=sum(tm.slots_total for tm in alive),
        slots_available=sum(tm.slots_free for tm in alive),
        jobs_running=sum(n for status, n in statuses.items() if not status.terminal),
        jobs_finished=statuses[JobStatus.FINISHED],
        jobs_cancelled=statuses[JobStatus.CANCELED],
        jobs_failed=statuses[JobStatus.FAILED],
        taskmanagers_blocked=0,
        slots_free_and_blocked=0,
        flink_version=__version__,
        flink_commit=UNKNOWN_REVISION,
        weir_version=__version__,
    )


class PlacedTask(Model):
    job_id: str
    vertex_id: str
    subtask: int
    attempt: int
    status: TaskState | None  # None: deployed, not reported yet


class ResourceProfileInfo(Model):
    """Flink's ``ResourceProfileInfo``. A Weir TaskManager offers slots, not sized CPU and memory
    resources: Flink's unknown profile (``ResourceProfile.UNKNOWN``: -1 everywhere, no extended ones)."""

    cpu_cores: float = _api("cpuCores")
    task_heap_memory: int = _api("taskHeapMemory")  # MB
    task_off_heap_memory: int = _api("taskOffHeapMemory")
    managed_memory: int = _api("managedMemory")
    network_memory: int = _api("networkMemory")
    extended_resources: dict[str, float] = _api("extendedResources")


UNKNOWN_RESOURCES: Final = ResourceProfileInfo(
    cpu_cores=-1.0,
    task_heap_memory=-1,
    task_off_heap_memory=-1,
    managed_memory=-1,
    network_memory=-1,
    extended_resources={},
)


class HardwareDescription(Model):
    """Flink's ``HardwareDescription``: the CPU cores and physical memory the TaskManager reported at
    registration (``weir.core.hardware``; -1: not reported, by a TaskManager older than the field); a
    Python process has no JVM heap (``freeMemory``) and Weir no managed memory: 0 bytes."""

    cpu_cores: int = _api("cpuCores")
    physical_memory: int = _api("physicalMemory")
    free_memory: int = _api("freeMemory")
    managed_memory: int = _api("managedMemory")


NOT_REPORTED: Final = -1


def hardware_description(hardware: Hardware | None) -> HardwareDescription:
    return HardwareDescription(
        cpu_cores=hardware.cpu_cores if hardware is not None else NOT_REPORTED,
        physical_memory=hardware.physical_memory_bytes
        if hardware is not None and hardware.physical_memory_bytes
        else NOT_REPORTED,
        free_memory=0,
        managed_memory=0,
    )


class MemoryConfiguration(Model):
    """Flink's ``TaskExecutorMemoryConfiguration``: the sizes of a JVM TaskManager's memory pools. Weir
    sizes none of them (no JVM heap, metaspace, network buffers or managed memory): 0 bytes each."""

    framework_heap: int = _api("frameworkHeap")
    task_heap: int = _api("taskHeap")
    framework_off_heap: int = _api("frameworkOffHeap")
    task_off_heap: int = _api("taskOffHeap")
    network_memory: int = _api("networkMemory")
    managed_memory: int = _api("managedMemory")
    jvm_metaspace: int = _api("jvmMetaspace")
    jvm_overhead: int = _api("jvmOverhead")
    total_flink_memory: int = _api("totalFlinkMemory")
    total_process_memory: int = _api("totalProcessMemory")


NO_JVM_MEMORY: Final = MemoryConfiguration(
    framework_heap=0,
    task_heap=0,
    framework_off_heap=0,
    task_off_heap=0,
    network_memory=0,
    managed_memory=0,
    jvm_metaspace=0,
    jvm_overhead=0,
    total_flink_memory=0,
    total_process_memory=0,
)


class TaskManagerInfo(Model):
    """Flink's ``TaskManagerInfo`` of what the JobManager knows of a TaskManager, with Weir's
    ``alive`` and ``tasks``."""

    id: str
    path: str  # the address of its gRPC service
    data_port: int = _api("dataPort")  # the port of ``path``: one gRPC service carries control and data
    jmx_port: int = _api("jmxPort")  # -1: none (Flink's value without JMX)
    slots_number: int = _api("slotsNumber")
    free_slots: int = _api("freeSlots")
    time_since_last_heartbeat: int = _api("timeSinceLastHeartbeat")  # ms
    total_resource: ResourceProfileInfo = _api("totalResource")
    free_resource: ResourceProfileInfo = _api("freeResource")
    hardware: HardwareDescription
    memory_configuration: MemoryConfiguration = _api("memoryConfiguration")
    blocked: bool  # Weir blocks no TaskManager
    alive: bool
    tasks: list[PlacedTask]


class TaskManagers(Model):
    taskmanagers: list[TaskManagerInfo]


class GarbageCollector(Model):
    name: str
    count: int
    time: int


class TaskManagerMetricsInfo(Model):
    """Flink's ``TaskManagerMetricsInfo``: a JVM's heap, non-heap, direct and mapped buffers, Netty's
    shuffle memory and garbage collectors. A Weir TaskManager has none of them: 0 each, no collector
    (its process's memory and CPU are on its Prometheus endpoint, ``metricsPort``)."""

    heap_used: int = _api("heapUsed")
    heap_committed: int = _api("heapCommitted")
    heap_max: int = _api("heapMax")
    non_heap_used: int = _api("nonHeapUsed")
    non_heap_committed: int = _api("nonHeapCommitted")
    non_heap_max: int = _api("nonHeapMax")
    direct_count: int = _api("directCount")
    direct_used: int = _api("directUsed")
    direct_max: int = _api("directMax")
    mapped_count: int = _api("mappedCount")
    mapped_used: int = _api("mappedUsed")
    mapped_max: int = _api("mappedMax")
    shuffle_segments_available: int = _api("nettyShuffleMemorySegmentsAvailable")
    shuffle_segments_used: int = _api("nettyShuffleMemorySegmentsUsed")
    shuffle_segments_total: int = _api("nettyShuffleMemorySegmentsTotal")
    shuffle_memory_available: int = _api("nettyShuffleMemoryAvailable")
    shuffle_memory_used: int = _api("nettyShuffleMemoryUsed")
    shuffle_memory_total: int = _api("nettyShuffleMemoryTotal")
    garbage_collectors: list[GarbageCollector] = _api("garbageCollectors")


NO_JVM_METRICS: Final = TaskManagerMetricsInfo.model_validate(
    {name: 0 for name in TaskManagerMetricsInfo.model_fields if name != "garbage_collectors"}
    | {"garbage_collectors": []}
)


class SlotInfo(Model):
    """Flink's ``SlotInfo``: an allocated slot, the job whose tasks it runs."""

    job_id: str = _api("jobId")
    resource: ResourceProfileInfo


class TaskManagerDetails(TaskManagerInfo):
    """Flink's ``TaskManagerDetailsInfo``: the list's entry, its allocated slots and Flink's JVM
    ``metrics`` (none: 0), with Weir's ``metricsPort`` (its Prometheus metrics; 0: none)."""

    allocated_slots: list[SlotInfo] = _api("allocatedSlots")
    metrics: TaskManagerMetricsInfo
    metrics_port: int = _api("metricsPort")


def _data_port(address: str) -> int:
    port = address.rsplit(":", 1)[-1]
    return int(port) if port.isdigit() else -1


def _taskmanager_fields(tm: TaskManagerView) -> dict[str, Any]:
    return {
        "id": tm.taskmanager_id,
        "path": tm.address,
        "data_port": _data_port(tm.address),
        "jmx_port": -1,
        "slots_number": tm.slots_total,
        "free_slots": tm.slots_free,
        "time_since_last_heartbeat": ms(tm.last_heartbeat_age_s),
        "total_resource": UNKNOWN_RESOURCES,
        "free_resource": UNKNOWN_RESOURCES,
        "hardware": hardware_description(tm.hardware),
        "memory_configuration": NO_JVM_MEMORY,
        "blocked": False,
        "alive": tm.alive,
        "tasks": [
            PlacedTask(
                job_id=flink_job_id(t.job_id),
                vertex_id=t.vertex_uid,
                subtask=t.subtask,
                attempt=t.attempt,
                status=t.state,
            )
            for t in tm.tasks
        ],
    }


def allocated_slots(tm: TaskManagerView) -> list[SlotInfo]:
    """The TaskManager's slots its jobs' tasks run in: slot sharing puts subtask ``i`` of every vertex
    of a job in one slot, so one slot per job and subtask index placed here."""
    slots = sorted({(flink_job_id(t.job_id), t.subtask) for t in tm.tasks})
    return [SlotInfo(job_id=job_id, resource=UNKNOWN_RESOURCES) for job_id, _subtask in slots]


def taskmanagers(cluster: ClusterView) -> TaskManagers:
    return TaskManagers(taskmanagers=[TaskManagerInfo(**_taskmanager_fields(tm)) for tm in cluster.taskmanagers])


def taskmanager_details(cluster: ClusterView, taskmanager_id: str) -> TaskManagerDetails | None:
    """One TaskManager's details; None when the JobManager does not know it."""
    tm = next((t for t in cluster.taskmanagers if t.taskmanager_id == taskmanager_id), None)
    if tm is None:
        return None
    return TaskManagerDetails(
        **_taskmanager_fields(tm),
        allocated_slots=allocated_slots(tm),
        metrics=NO_JVM_METRICS,
        metrics_port=tm.metrics_port,
    )


# Jobs ----------------------------------------------------------------------------------------------


class FailureInfo(Model):
    type: str
    message: str
    fault: FaultName
    retriable: bool


def failure_info(failure: Failure | None) -> FailureInfo | None:
    if failure is None:
        return None
    return FailureInfo(type=failure.type, message=failure.message, fault=failure.fault, retriable=failure.retriable)


class JobListEntry(Model):
    id: str
    name: str
    status: JobStatus
    start_time: int = _api("start-time")
    parallelism: int
    restarts: int


class Jobs(Model):
    jobs: list[JobListEntry]  # newest first


def jobs(summaries: Iterable[JobSummaryView]) -> Jobs:
    return Jobs(
        jobs=[
            JobListEntry(
                id=flink_job_id(j.job_id),
                name=j.job_name,
                status=j.status,
                start_time=ms(j.submitted_at),
                parallelism=j.parallelism,
                restarts=j.restarts,
            )
            for j in sorted(summaries, key=lambda j: (j.submitted_at, j.job_id), reverse=True)
        ]
    )


class IOMetrics(Model):
    """Flink's ``IOMetricsInfo`` of a subtask, or summed over a vertex's: a ``-complete`` flag says
    the figure is known (every subtask reported it). Weir counts records, not bytes: the byte figures
    are 0 and never complete. The accumulated times are the ms the task thread spent busy,
    backpressured (waiting for output credit) and idle in its current attempt, as its TaskManager
    accounted them at its latest heartbeat (0 before the first; ``weir_busy_seconds_total`` and its
    siblings count the same)."""

    read_bytes: int = _api("read-bytes")
    read_bytes_complete: bool = _api("read-bytes-complete")
    write_bytes: int = _api("write-bytes")
    write_bytes_complete: bool = _api("write-bytes-complete")
    read_records: int = _api("read-records")
    read_records_complete: bool = _api("read-records-complete")
    write_records: int = _api("write-records")
    write_records_complete: bool = _api("write-records-complete")
    accumulated_backpressured_time: int = _api("accumulated-backpressured-time")
    accumulated_idle_time: int = _api("accumulated-idle-time")
    accumulated_busy_time: float = _api("accumulated-busy-time")


def io_metrics(tasks: Sequence[TaskView]) -> IOMetrics:
    """The IO metrics of these tasks (one subtask's, or a vertex's), summed as Flink sums them."""
    reported = bool(tasks) and all(t.state is not None for t in tasks)
    totals = [t.time_totals for t in tasks if t.time_totals is not None]
    return IOMetrics(
        read_bytes=0,
        read_bytes_complete=False,
        write_bytes=0,
        write_bytes_complete=False,
        read_records=sum(t.records_in for t in tasks),
        read_records_complete=reported,
        write_records=sum(t.records_out for t in tasks),
        write_records_complete=reported,
        accumulated_backpressured_time=ms(sum(t.backpressured_s for t in totals)),
        accumulated_idle_time=ms(sum(t.idle_s for t in totals)),
        accumulated_busy_time=float(ms(sum(t.busy_s for t in totals))),
    )


class SubtaskInfo(Model):
    subtask: int
    status: TaskState | None  # None: not reported yet
    taskmanager_id: str | None
    attempt: int
    read_records: int = _api("read-records")
    write_records: int = _api("write-records")
    busy_ratio: Ratio | None = _api("busyRatio")  # over its last heartbeat interval; None: not measured
    back_pressured_ratio: Ratio | None = _api("backPressuredRatio")
    idle_ratio: Ratio | None = _api("idleRatio")
    watermark: int | None  # its current input watermark, ms
    watermark_lag: int | None  # now - watermark, ms


class VertexInfo(Model):
    id: str  # Flink's JobVertexID form (weir.jobmanager.rest.ids.flink_vertex_id)
    uid: str  # Weir's: the head operator's uid, as exceptions and checkpoints name the vertex
    slot_sharing_group_id: str = _api("slotSharingGroupId")  # the job's one group (ids.slot_sharing_group_id)
    name: str
    parallelism: int
    max_parallelism: int = _api("maxParallelism")
    status: str  # a Flink ExecutionState: its subtasks' aggregated (vertex_status), CREATED until all reported
    start_time: int = _api("start-time")  # when its current tasks were deployed; -1: not known
    end_time: int = _api("end-time")  # -1: not ended
    duration: int  # -1: not known
    tasks: dict[str, int]  # Flink's: a count per ExecutionState, every one
    metrics: IOMetrics  # summed over its subtasks
    subtasks: list[SubtaskInfo]


class JobEndInfo(Model):
    """Weir's own: an ending or ended job and the resolution of its sinks' transactions."""

    outcome: JobStatus
    ended: bool  # false: still ending (its tasks stopping, its sinks being resolved)
    at: int  # ms: since when it is ending, or when it ended
    nothing_to_resolve: bool  # every task FINISHED: the sinks committed through the final checkpoint
    resolution_decided: bool  # false: waits for a checkpoint being persisted
    as_of_checkpoint: int | None
    attempts: int
    resolved: bool
    error: str
    retry_at: int | None  # ms: when the resolution is tried again


class JobStatusInfo(Model):
    """Flink's ``JobStatusInfo``: the job's status alone (Flink's client polls it)."""

    status: JobStatus


class ParallelismBounds(Model):
    """Flink's ``JobVertexResourceRequirements.Parallelism``."""

    lower_bound: int = _api("lowerBound")
    upper_bound: int = _api("upperBound")


class VertexResourceRequirements(Model):
    """Flink's ``JobVertexResourceRequirements``."""

    parallelism: ParallelismBounds


def resource_requirements(plan: JobPlanView) -> dict[str, VertexResourceRequirements]:
    """Flink's ``JobResourceRequirementsBody``, by Flink vertex id: Weir runs each vertex at exactly its
    parallelism (``PUT`` bounds become a rescale to one parallelism, not kept as bounds), so both
    bounds are it."""
    return {
        flink_vertex_id(v.uid): VertexResourceRequirements(
            parallelism=ParallelismBounds(lower_bound=v.parallelism, upper_bound=v.parallelism)
        )
        for v in plan.vertices
    }


class JobDetails(Model):
    jid: str
    name: str
    state: JobStatus
    job_type: str = _api("job-type")  # Flink's JobType: STREAMING
    start_time: int = _api("start-time")
    end_time: int = _api("end-time")  # -1: not ended (Flink's spelling)
    duration: int
    now: int
    parallelism: int
    restarts: int
    last_completed_checkpoint: int | None
    failure: FailureInfo | None
    vertices: list[VertexInfo]
    # Flink's: how many of its vertices are in each ExecutionState (every one); the tasks are each vertex's
    status_counts: dict[str, int] = _api("status-counts")
    max_parallelism: int = _api("maxParallelism")  # its key groups
    is_stoppable: bool = _api("isStoppable")  # Flink's stop without savepoint: never in Weir
    timestamps: dict[str, int]  # Flink's: when the job reached each JobStatus, 0 for one it has not
    plan: Plan  # as GET /jobs/{id}/plan answers it
    pending_operators: int = _api("pending-operators")  # Flink's operators not yet in the plan: none
    end: JobEndInfo | None = None  # None: neither ending nor ended


def vertex_status(states: Iterable[TaskState | None]) -> TaskState | None:
    """One status for a vertex's subtasks, as Flink aggregates them: any FAILED, else any CANCELED,
    else any RUNNING, else any DEPLOYING, else FINISHED when all are; else None (not all reported)."""
    seen = list(states)
    for state in (TaskState.FAILED, TaskState.CANCELED, TaskState.RUNNING, TaskState.DEPLOYING):
        if state in seen:
            return state
    if seen and all(s is TaskState.FINISHED for s in seen):
        return TaskState.FINISHED
    return None


def _subtask(task: TaskView, now_ms: int) -> SubtaskInfo:
    ratios = task.ratios
    return SubtaskInfo(
        subtask=task.subtask,
        status=task.state,
        taskmanager_id=task.taskmanager_id or None,
        attempt=task.attempt,
        read_records=task.records_in,
        write_records=task.records_out,
        busy_ratio=ratios.busy if ratios is not None else None,
        back_pressured_ratio=ratios.backpressured if ratios is not None else None,
        idle_ratio=ratios.idle if ratios is not None else None,
        watermark=task.watermark,
        watermark_lag=now_ms - task.watermark if task.watermark is not None else None,
    )


def job_details(status: JobStatusView, plan: JobPlanView) -> JobDetails:
    summary = status.summary
    now_ms = ms(status.now)
    start = ms(summary.submitted_at)
    end = _optional_ms(status.finished_at)
    by_vertex: dict[str, list[TaskView]] = {}
    for task in status.tasks:
        by_vertex.setdefault(task.vertex_uid, []).append(task)
    vertices = []
    for vertex in plan.vertices:
        tasks = sorted(by_vertex.get(vertex.uid, ()), key=lambda t: t.subtask)
        vertex_end = end if end is not None and tasks and all(t.state and t.state.terminal for t in tasks) else None
        vertex_start = ms(status.last_restore_at) if status.last_restore_at else start
        vertices.append(
            VertexInfo(
                id=flink_vertex_id(vertex.uid),
                uid=vertex.uid,
                slot_sharing_group_id=slot_sharing_group_id(summary.job_id),
                name=vertex.name,
                parallelism=vertex.parallelism,
                max_parallelism=plan.max_parallelism,
                status=execution_state(vertex_status(t.state for t in tasks)),
                start_time=vertex_start,
                end_time=vertex_end if vertex_end is not None else -1,
                duration=max(0, (vertex_end if vertex_end is not None else now_ms) - vertex_start),
                tasks=execution_state_counts(t.state for t in tasks),
                metrics=io_metrics(tasks),
                subtasks=[_subtask(t, now_ms) for t in tasks],
            )
        )
    reached = {JobStatus.CREATED.value: start}
    if status.last_restore_at:
        reached[JobStatus.RUNNING.value] = ms(status.last_restore_at)
    if end is not None:
        reached[summary.status.value] = end
    return JobDetails(
        jid=flink_job_id(summary.job_id),
        name=summary.job_name,
        state=summary.status,
        job_type=JOB_TYPE,
        start_time=start,
        end_time=end if end is not None else -1,
        duration=max(0, (end if end is not None else now_ms) - start),
        now=now_ms,
        parallelism=summary.parallelism,
        restarts=summary.restarts,
        last_completed_checkpoint=status.last_completed_checkpoint or None,
        failure=failure_info(status.failure),
        vertices=vertices,
        status_counts=vertices_per_state(vertices),
        max_parallelism=plan.max_parallelism,
        is_stoppable=False,
        timestamps={name: reached.get(name, 0) for name in FLINK_JOB_STATUSES},
        plan=job_plan(plan).plan,
        pending_operators=0,
        end=_end_info(status.end) if status.end is not None else None,
    )


def vertices_per_state(vertices: Iterable[VertexInfo]) -> dict[str, int]:
    """Flink's ``status-counts``: how many vertices are in each ExecutionState, every state present."""
    seen = Counter(v.status for v in vertices)
    return {name: seen[name] for name in FLINK_EXECUTION_STATES}


def _end_info(end: JobEndView) -> JobEndInfo:
    return JobEndInfo(
        outcome=end.outcome,
        ended=end.ended,
        at=ms(end.at),
        nothing_to_resolve=end.nothing_to_resolve,
        resolution_decided=end.resolution_decided,
        as_of_checkpoint=end.as_of_checkpoint,
        attempts=end.attempts,
        resolved=end.resolved,
        error=end.error,
        retry_at=_optional_ms(end.retry_at),
    )


# Plan ----------------------------------------------------------------------------------------------


class PlanOperator(Model):
    uid: str
    name: str


EXCHANGE: Final = "pipelined_bounded"  # Flink's ResultPartitionType: records stream through bounded, credited buffers


class PlanInput(Model):
    num: int
    id: str  # the producer vertex, in Flink's form
    ship_strategy: PartitioningName
    exchange: str  # Flink's: how records cross the edge (always pipelined_bounded in Weir)
    side_output: str | None  # the side output's tag name; None: the producer's main output


class PlanNode(Model):
    id: str  # Flink's JobVertexID form
    uid: str  # Weir's: the head operator's uid
    parallelism: int
    operator: str  # the head operator's name
    operator_strategy: str  # Flink's: empty for a streaming job's vertex, as Flink's
    description: str  # the chain's operator names, joined by ' -> '
    optimizer_properties: dict[str, Any]  # Flink's: empty for a streaming job's vertex, as Flink's
    operators: list[PlanOperator]  # the chain, head first
    inputs: list[PlanInput]


class Plan(Model):
    jid: str
    name: str
    type: str  # Flink's JobType: STREAMING
    nodes: list[PlanNode]  # in topological order


class JobPlan(Model):
    plan: Plan


def _node(vertex: VertexView) -> PlanNode:
    return PlanNode(
        id=flink_vertex_id(vertex.uid),
        uid=vertex.uid,
        parallelism=vertex.parallelism,
        operator=vertex.operators[0].name if vertex.operators else "",
        operator_strategy="",
        description=vertex.name,
        optimizer_properties={},
        operators=[PlanOperator(uid=o.uid, name=o.name) for o in vertex.operators],
        inputs=[
            PlanInput(
                num=n,
                id=flink_vertex_id(e.producer_vertex),
                ship_strategy=e.partitioning,
                exchange=EXCHANGE,
                side_output=e.side_output,
            )
            for n, e in enumerate(vertex.inputs)
        ],
    )


def job_plan(plan: JobPlanView) -> JobPlan:
    return JobPlan(
        plan=Plan(
            jid=flink_job_id(plan.job_id), name=plan.job_name, type=JOB_TYPE, nodes=[_node(v) for v in plan.vertices]
        )
    )


# Exceptions ----------------------------------------------------------------------------------------


class ExceptionInfo(Model):
    exception_name: str = _api("exceptionName")  # the failure's type
    message: str
    fault: FaultName
    retriable: bool
    timestamp: int
    task_name: str | None = _api("taskName")  # the vertex's operator names
    vertex_id: str | None
    subtask: int | None
    attempt: int
    taskmanager_id: str | None
    # Flink's: the traceback as the task formatted it, or "Type: message" for a failure with none (one
    # the JobManager decided on: a lost TaskManager has no frames)
    stacktrace: str


class ExceptionHistoryInfo(Model):
    entries: list[ExceptionInfo]  # newest first
    truncated: bool  # older entries were left out (maxExceptions)


class JobExceptions(Model):
    """Flink's ``JobExceptionsInfoWithHistory``: ``root-exception`` and ``timestamp`` are the newest
    failure's stack trace and time (null before the first), as Flink's deprecated top-level fields."""

    root_exception: str | None = _api("root-exception")
    timestamp: int | None
    exception_history: ExceptionHistoryInfo = _api("exceptionHistory")


def stacktrace_of(failure: Failure) -> str:
    return failure.stacktrace or str(failure)


def job_exceptions(history: ExceptionHistory, plan: JobPlanView, max_exceptions: int) -> JobExceptions:
    names = {v.uid: v.name for v in plan.vertices}
    entries, truncated = history.latest(max_exceptions)
    newest = history.entries[0] if history.entries else None
    return JobExceptions(
        root_exception=None if newest is None else stacktrace_of(newest.failure),
        timestamp=None if newest is None else ms(newest.timestamp),
        exception_history=ExceptionHistoryInfo(
            entries=[
                ExceptionInfo(
                    exception_name=e.failure.type,
                    message=e.failure.message,
                    fault=e.failure.fault,
                    retriable=e.failure.retriable,
                    timestamp=ms(e.timestamp),
                    task_name=names.get(e.vertex_uid) if e.vertex_uid is not None else None,
                    vertex_id=e.vertex_uid,
                    subtask=e.subtask,
                    attempt=e.attempt,
                    taskmanager_id=e.taskmanager_id,
                    stacktrace=stacktrace_of(e.failure),
                )
                for e in entries
            ],
            truncated=truncated,
        ),
    )


# Checkpoints ---------------------------------------------------------------------------------------


class CheckpointClass(enum.StrEnum):
    """Flink's type property of a ``CheckpointStatistics`` (``className``), by its status."""

    COMPLETED = "completed"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"


def checkpoint_class(status: CheckpointStatus) -> CheckpointClass:
    match status:
        case CheckpointStatus.COMPLETED:
            return CheckpointClass.COMPLETED
        case CheckpointStatus.FAILED:
            return CheckpointClass.FAILED
        case CheckpointStatus.IN_PROGRESS:
            return CheckpointClass.IN_PROGRESS
        case _:
            assert_never(status)


NOT_MEASURED: Final = 0  # Flink's alignment_buffered (deprecated, 0 in Flink too) and processed_data: not measured


class VertexCheckpoint(Model):
    """Flink's ``TaskCheckpointStatistics``: one vertex's part of a checkpoint, over its subtasks."""

    id: int  # the checkpoint's
    status: CheckpointStatus
    latest_ack_timestamp: int  # -1: no subtask acknowledged yet
    checkpointed_size: int
    state_size: int
    end_to_end_duration: int  # trigger to its latest acknowledgement; -1: none yet
    alignment_buffered: int  # 0: not measured
    processed_data: int  # 0: not measured
    persisted_data: int
    num_subtasks: int
    num_acknowledged_subtasks: int


class Checkpoint(Model):
    class_name: CheckpointClass = _api("className")
    id: int
    status: CheckpointStatus
    is_savepoint: bool
    checkpoint_type: CheckpointKindName
    full: bool  # a full checkpoint (weir checkpoint --full, FULL): it references no file of an earlier one
    unaligned: bool  # a task persisted in-flight records
    trigger_timestamp: int
    latest_ack_timestamp: int  # -1: no subtask acknowledged yet (Flink's)
    # trigger to completion or failure; in progress (Flink's): to its latest acknowledgement, -1 before one
    end_to_end_duration: int
    state_size: int
    checkpointed_size: int  # uploaded for it: its state without the files it reuses from earlier ones
    alignment_buffered: int  # Flink's (deprecated): 0, not measured
    processed_data: int  # Flink's bytes processed while aligning: 0, not measured
    persisted_data: int  # in-flight bytes its unaligned subtasks persisted (Flink's persisted_data)
    num_subtasks: int
    num_acknowledged_subtasks: int
    tasks: dict[str, VertexCheckpoint]  # by vertex id (Flink's form); empty for one read back from storage
    discarded: bool | None  # completed: no longer retained (subsumed, its files released); None otherwise
    failure_timestamp: int | None  # a failed one's: when it failed
    failure_message: str | None
    external_path: str | None  # while retained (or a savepoint's copy): weir run --from-checkpoint takes it


class CheckpointCountsInfo(Model):
    restored: int  # how many times the job restored a checkpoint (since this JobManager took it)
    total: int  # triggered
    in_progress: int
    completed: int
    failed: int


class RestoredInfo(Model):
    id: int
    restore_timestamp: int
    is_savepoint: bool
    external_path: str | None  # where it is, while retained (or a savepoint's)


class LatestCheckpoints(Model):
    completed: Checkpoint | None  # the newest completed checkpoint (not a savepoint)
    savepoint: Checkpoint | None  # the newest completed savepoint
    failed: Checkpoint | None
    restored: RestoredInfo | None  # what the job's current attempt restored


class StatsSummary(Model):
    """Flink's ``StatsSummaryDto`` of one figure over the completed checkpoints."""

    min: int
    max: int
    avg: int
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float


class CheckpointsSummary(Model):
    """Flink's ``CheckpointingStatistics.Summary``, of the figures Weir records (Flink's
    ``processed_data`` and ``alignment_buffered`` it does not: left out, as Flink leaves out one it
    has no statistics of)."""

    checkpointed_size: StatsSummary
    state_size: StatsSummary
    end_to_end_duration: StatsSummary
    persisted_data: StatsSummary


class Checkpoints(Model):
    counts: CheckpointCountsInfo
    summary: CheckpointsSummary  # over the completed checkpoints of ``history``
    latest: LatestCheckpoints
    history: list[Checkpoint]  # newest first


def _latest_ack_ms(tasks: Iterable[TaskCheckpointStats]) -> int:
    acks = [t.acked_at for t in tasks if t.acked_at is not None]
    return ms(max(acks)) if acks else -1


def _vertex_checkpoints(summary: CheckpointSummary) -> dict[str, VertexCheckpoint]:
    """Each vertex's part of the checkpoint, from its subtasks' acknowledgements and those pending."""
    acked: dict[str, list[TaskCheckpointStats]] = {}
    for t in summary.tasks:
        acked.setdefault(t.task_id.operator_uid, []).append(t)
    pending = Counter(str(t.operator_uid) for t in summary.pending_tasks)
    trigger = ms(summary.trigger_timestamp)
    parts = {}
    for uid in sorted(set(acked) | set(pending)):
        tasks = acked.get(uid, [])
        latest = _latest_ack_ms(tasks)
        parts[flink_vertex_id(uid)] = VertexCheckpoint(
            id=summary.checkpoint_id,
            status=summary.status,
            latest_ack_timestamp=latest,
            checkpointed_size=sum(t.checkpointed_size_bytes for t in tasks),
            state_size=sum(t.state_size_bytes for t in tasks),
            end_to_end_duration=latest - trigger if latest >= 0 else -1,
            alignment_buffered=NOT_MEASURED,
            processed_data=NOT_MEASURED,
            persisted_data=sum(t.inflight_bytes for t in tasks),
            num_subtasks=len(tasks) + pending[uid],
            num_acknowledged_subtasks=len(tasks),
        )
    return parts


def _checkpoint_fields(summary: CheckpointSummary, external_paths: Mapping[CheckpointId, str]) -> dict[str, Any]:
    latest = _latest_ack_ms(summary.tasks)
    if summary.duration_s is not None:
        duration = ms(summary.duration_s)
    else:
        duration = latest - ms(summary.trigger_timestamp) if latest >= 0 else -1
    completed = summary.status is CheckpointStatus.COMPLETED
    failed = summary.status is CheckpointStatus.FAILED
    return {
        "class_name": checkpoint_class(summary.status),
        "id": summary.checkpoint_id,
        "status": summary.status,
        "is_savepoint": summary.kind is CheckpointKind.SAVEPOINT,
        "checkpoint_type": summary.kind,
        "full": summary.full,
        "unaligned": any(t.unaligned for t in summary.tasks),
        "trigger_timestamp": ms(summary.trigger_timestamp),
        "latest_ack_timestamp": latest,
        "end_to_end_duration": duration,
        "state_size": summary.state_size_bytes,
        "checkpointed_size": summary.checkpointed_size_bytes,
        "alignment_buffered": NOT_MEASURED,
        "processed_data": NOT_MEASURED,
        "persisted_data": persisted_data(summary),
        "num_subtasks": summary.total_tasks,
        "num_acknowledged_subtasks": summary.acknowledged,
        "tasks": _vertex_checkpoints(summary),
        # A savepoint stays where it was put until disposed of (weir savepoint --dispose); a checkpoint's
        # files are released once it is no longer retained.
        "discarded": (summary.kind is CheckpointKind.CHECKPOINT and summary.checkpoint_id not in external_paths)
        if completed
        else None,
        "failure_timestamp": _optional_ms(summary.end_timestamp) if failed else None,
        "failure_message": str(summary.failure) if summary.failure is not None else None,
        "external_path": external_paths.get(summary.checkpoint_id),
    }


def persisted_data(summary: CheckpointSummary) -> int:
    return sum(t.inflight_bytes for t in summary.tasks)


def percentile(ordered: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0 < p <= 100) of sorted values, estimated as Apache Commons Math's
    ``Percentile`` (which Flink's checkpoint statistics histogram uses): position ``p(n+1)/100``,
    interpolated between its neighbours, clamped to the smallest and largest value."""
    n = len(ordered)
    if n == 0:
        return 0.0
    position = p * (n + 1) / 100
    if position < 1:
        return float(ordered[0])
    if position >= n:
        return float(ordered[-1])
    lower = int(position)
    fraction = position - lower
    return float(ordered[lower - 1] + fraction * (ordered[lower] - ordered[lower - 1]))


def stats_summary(values: Iterable[int]) -> StatsSummary:
    """Min, max, average (an integer, as Flink's) and percentiles; all 0 without a value."""
    ordered = sorted(values)
    return StatsSummary(
        min=ordered[0] if ordered else 0,
        max=ordered[-1] if ordered else 0,
        avg=sum(ordered) // len(ordered) if ordered else 0,
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p95=percentile(ordered, 95),
        p99=percentile(ordered, 99),
        p999=percentile(ordered, 99.9),
    )


def checkpoints_summary(history: Iterable[CheckpointSummary]) -> CheckpointsSummary:
    """Flink's summary is over the completed checkpoints (and savepoints) the JobManager saw; Weir's
    over those its history holds (its recent statistics and every retained one)."""
    completed = [c for c in history if c.status is CheckpointStatus.COMPLETED]
    return CheckpointsSummary(
        checkpointed_size=stats_summary(c.checkpointed_size_bytes for c in completed),
        state_size=stats_summary(c.state_size_bytes for c in completed),
        end_to_end_duration=stats_summary(ms(c.duration_s) for c in completed if c.duration_s is not None),
        persisted_data=stats_summary(persisted_data(c) for c in completed),
    )


def checkpoint(summary: CheckpointSummary, external_paths: Mapping[CheckpointId, str]) -> Checkpoint:
    return Checkpoint(**_checkpoint_fields(summary, external_paths))


def _first(
    history: Sequence[CheckpointSummary], status: CheckpointStatus, kind: CheckpointKind | None = None
) -> CheckpointSummary | None:
    return next((c for c in history if c.status is status and (kind is None or c.kind is kind)), None)


def checkpoints(view: CheckpointsView) -> Checkpoints:
    history = view.checkpoints
    paths = view.external_paths

    def latest(summary: CheckpointSummary | None) -> Checkpoint | None:
        return checkpoint(summary, paths) if summary is not None else None

    restored = view.restored
    counts = view.counts
    return Checkpoints(
        counts=CheckpointCountsInfo(
            restored=counts.restores,
            total=counts.triggered,
            in_progress=counts.in_progress,
            completed=counts.completed,
            failed=counts.failed,
        ),
        summary=checkpoints_summary(history),
        latest=LatestCheckpoints(
            completed=latest(_first(history, CheckpointStatus.COMPLETED, CheckpointKind.CHECKPOINT)),
            savepoint=latest(_first(history, CheckpointStatus.COMPLETED, CheckpointKind.SAVEPOINT)),
            failed=latest(_first(history, CheckpointStatus.FAILED)),
            restored=RestoredInfo(
                id=restored.checkpoint_id,
                restore_timestamp=ms(restored.restored_at),
                is_savepoint=restored.kind is CheckpointKind.SAVEPOINT,
                external_path=paths.get(restored.checkpoint_id),
            )
            if restored is not None
            else None,
        ),
        history=[checkpoint(c, paths) for c in history],
    )


class SubtaskCheckpointStatus(enum.StrEnum):
    COMPLETED = "COMPLETED"  # acknowledged
    PENDING = "PENDING"


class TimelineChannel(Model):
    channel: int
    upstream_vertex: str
    upstream_subtask: int
    barrier_timestamp: int | None  # when the barrier arrived on this input channel


class Timeline(Model):
    """Where one subtask's part of a checkpoint spent its time (all epoch ms)."""

    trigger_timestamp: int  # the coordinator triggered the checkpoint
    first_barrier_timestamp: int | None  # the first barrier (or the trigger, at a source) reached the task
    channels: list[TimelineChannel]  # none at a source
    alignment_end_timestamp: int | None  # barrier on every channel (aligned) / snapshot started (unaligned)
    sync_end_timestamp: int | None  # the synchronous part of the snapshot done
    async_end_timestamp: int | None  # the upload done
    ack_timestamp: int | None  # the acknowledgement reached the JobManager


class SubtaskCheckpoint(Model):
    vertex_id: str
    subtask: int
    status: SubtaskCheckpointStatus
    ack_timestamp: int | None
    alignment_duration: int
    start_delay: int
    sync_duration: int
    async_duration: int
    state_size: int
    unaligned: bool
    inflight_size: int
    timeline: Timeline | None


class CheckpointDetails(Checkpoint):
    subtasks: list[SubtaskCheckpoint]


def timeline(stats: TaskCheckpointStats, trigger_timestamp: float) -> Timeline | None:
    """A subtask's checkpoint timeline in epoch ms: its TaskManager's times, framed by the
    JobManager's trigger and the acknowledgement's arrival."""
    recorded = stats.timeline
    if recorded is None:
        return None
    return Timeline(
        trigger_timestamp=ms(trigger_timestamp),
        first_barrier_timestamp=ms(recorded.first_barrier_at),
        channels=[
            TimelineChannel(
                channel=c.channel,
                upstream_vertex=c.upstream_vertex,
                upstream_subtask=c.upstream_subtask,
                barrier_timestamp=_optional_ms(c.barrier_at),
            )
            for c in recorded.channels
        ],
        alignment_end_timestamp=ms(recorded.alignment_end_at),
        sync_end_timestamp=ms(recorded.sync_end_at),
        async_end_timestamp=ms(recorded.async_end_at),
        ack_timestamp=_optional_ms(stats.acked_at),
    )


def _acknowledged(stats: TaskCheckpointStats, trigger_timestamp: float) -> SubtaskCheckpoint:
    return SubtaskCheckpoint(
        vertex_id=stats.task_id.operator_uid,
        subtask=stats.task_id.subtask,
        status=SubtaskCheckpointStatus.COMPLETED,
        ack_timestamp=_optional_ms(stats.acked_at),
        alignment_duration=ms(stats.alignment_duration_s),
        start_delay=ms(stats.start_delay_s),
        sync_duration=ms(stats.sync_duration_s),
        async_duration=ms(stats.async_duration_s),
        state_size=stats.state_size_bytes,
        unaligned=stats.unaligned,
        inflight_size=stats.inflight_bytes,
        timeline=timeline(stats, trigger_timestamp),
    )


def checkpoint_details(detail: CheckpointDetailView, tasks: Iterable[tuple[str, int]]) -> CheckpointDetails:
    """One checkpoint with a line per subtask of the job (``tasks``) and of the checkpoint: the
    acknowledged ones with their statistics and timelines, the others PENDING (COMPLETED without
    statistics for a checkpoint this JobManager only read back from storage)."""
    summary = detail.checkpoint
    external_paths = {} if detail.external_path is None else {summary.checkpoint_id: detail.external_path}
    acked: dict[tuple[str, int], SubtaskCheckpoint] = {
        (t.task_id.operator_uid, t.task_id.subtask): _acknowledged(t, summary.trigger_timestamp) for t in summary.tasks
    }
    tasks = [*tasks, *((t.operator_uid, t.subtask) for t in summary.pending_tasks)]
    missing = SubtaskCheckpointStatus.COMPLETED if summary.status is CheckpointStatus.COMPLETED else None
    subtasks = [
        acked.get(task)
        or SubtaskCheckpoint(
            vertex_id=task[0],
            subtask=task[1],
            status=missing or SubtaskCheckpointStatus.PENDING,
            ack_timestamp=None,
            alignment_duration=0,
            start_delay=0,
            sync_duration=0,
            async_duration=0,
            state_size=0,
            unaligned=False,
            inflight_size=0,
            timeline=None,
        )
        for task in sorted(set(tasks) | set(acked))
    ]
    return CheckpointDetails(**_checkpoint_fields(summary, external_paths), subtasks=subtasks)


# One vertex's subtasks in a checkpoint (Flink's TaskCheckpointStatisticsWithSubtaskDetails) -------------


class SubtaskDurations(Model):
    sync: int
    async_: int = _api("async")


class SubtaskAlignment(Model):
    buffered: int  # 0: not measured (deprecated in Flink)
    processed: int  # 0: not measured
    persisted: int  # the in-flight data an unaligned checkpoint stored
    duration: int


class CompletedSubtaskCheckpoint(Model):
    """Flink's ``CompletedSubtaskCheckpointStatistics``: a subtask that acknowledged the checkpoint."""

    class_name: Literal["completed"] = Field(
        default="completed", validation_alias="className", serialization_alias="className"
    )
    index: int
    status: Literal["completed"] = "completed"
    ack_timestamp: int
    end_to_end_duration: int  # trigger to the acknowledgement's arrival
    state_size: int
    checkpointed_size: int
    checkpoint: SubtaskDurations
    alignment: SubtaskAlignment
    start_delay: int
    unaligned_checkpoint: bool
    aborted: bool  # Weir acknowledges no checkpoint it aborted: false


class PendingSubtaskCheckpoint(Model):
    """Flink's ``PendingSubtaskCheckpointStatistics``: no acknowledgement (yet, or before it failed)."""

    class_name: Literal["pending"] = Field(
        default="pending", validation_alias="className", serialization_alias="className"
    )
    index: int
    status: Literal["pending_or_failed"] = "pending_or_failed"


class DurationsSummary(Model):
    sync: StatsSummary
    async_: StatsSummary = _api("async")


class AlignmentSummary(Model):
    buffered: StatsSummary
    processed: StatsSummary
    persisted: StatsSummary
    duration: StatsSummary


class SubtasksSummary(Model):
    """Flink's ``TaskCheckpointStatisticsWithSubtaskDetails.Summary``, over the acknowledged subtasks."""

    checkpointed_size: StatsSummary
    state_size: StatsSummary
    end_to_end_duration: StatsSummary
    checkpoint_duration: DurationsSummary
    alignment: AlignmentSummary
    start_delay: StatsSummary


class VertexCheckpointDetails(VertexCheckpoint):
    """Flink's ``TaskCheckpointStatisticsWithSubtaskDetails``: the vertex's part of a checkpoint and
    each of its subtasks, by index."""

    summary: SubtasksSummary
    subtasks: list[CompletedSubtaskCheckpoint | PendingSubtaskCheckpoint]


def _completed_subtask(stats: TaskCheckpointStats, trigger_ms: int) -> CompletedSubtaskCheckpoint:
    ack = _latest_ack_ms((stats,))
    return CompletedSubtaskCheckpoint(
        index=stats.task_id.subtask,
        ack_timestamp=ack,
        end_to_end_duration=ack - trigger_ms if ack >= 0 else -1,
        state_size=stats.state_size_bytes,
        checkpointed_size=stats.checkpointed_size_bytes,
        checkpoint=SubtaskDurations(sync=ms(stats.sync_duration_s), async_=ms(stats.async_duration_s)),
        alignment=SubtaskAlignment(
            buffered=NOT_MEASURED,
            processed=NOT_MEASURED,
            persisted=stats.inflight_bytes,
            duration=ms(stats.alignment_duration_s),
        ),
        start_delay=ms(stats.start_delay_s),
        unaligned_checkpoint=stats.unaligned,
        aborted=False,
    )


def vertex_checkpoint_details(
    detail: CheckpointDetailView, vertex_uid: str, subtasks: Iterable[int]
) -> VertexCheckpointDetails | None:
    """The vertex's part of the checkpoint with a line per subtask: the job's current subtasks of the
    vertex (``subtasks``) and those the checkpoint names; None when the checkpoint has no statistics of
    the vertex (a checkpoint a restarted JobManager read back from storage, or a vertex it does not
    cover), which Flink answers 404 as well."""
    summary = detail.checkpoint
    part = _vertex_checkpoints(summary).get(flink_vertex_id(vertex_uid))
    if part is None:
        return None
    trigger = ms(summary.trigger_timestamp)
    acked = {t.task_id.subtask: t for t in summary.tasks if t.task_id.operator_uid == vertex_uid}
    pending = {t.subtask for t in summary.pending_tasks if t.operator_uid == vertex_uid}
    completed = [_completed_subtask(acked[i], trigger) for i in sorted(acked)]
    lines: list[CompletedSubtaskCheckpoint | PendingSubtaskCheckpoint] = [
        *completed,
        *(PendingSubtaskCheckpoint(index=i) for i in sorted((set(subtasks) | pending) - set(acked))),
    ]
    lines.sort(key=lambda line: line.index)
    return VertexCheckpointDetails(
        **part.model_dump(),
        summary=SubtasksSummary(
            checkpointed_size=stats_summary(c.checkpointed_size for c in completed),
            state_size=stats_summary(c.state_size for c in completed),
            end_to_end_duration=stats_summary(c.end_to_end_duration for c in completed if c.end_to_end_duration >= 0),
            checkpoint_duration=DurationsSummary(
                sync=stats_summary(c.checkpoint.sync for c in completed),
                async_=stats_summary(c.checkpoint.async_ for c in completed),
            ),
            alignment=AlignmentSummary(
                buffered=stats_summary(c.alignment.buffered for c in completed),
                processed=stats_summary(c.alignment.processed for c in completed),
                persisted=stats_summary(c.alignment.persisted for c in completed),
                duration=stats_summary(c.alignment.duration for c in completed),
            ),
            start_delay=stats_summary(c.start_delay for c in completed),
        ),
        subtasks=lines,
    )


# Backpressure --------------------------------------------------------------------------------------


class BackpressureLevel(enum.StrEnum):
    OK = "ok"
    LOW = "low"
    HIGH = "high"


def backpressure_level(ratio: float) -> BackpressureLevel:
    """Flink's thresholds: up to 10% of the time backpressured is ok, up to 50% low, above high."""
    if ratio <= 0.10:
        return BackpressureLevel.OK
    if ratio <= 0.5:
        return BackpressureLevel.LOW
    return BackpressureLevel.HIGH


class SubtaskBackpressure(Model):
    subtask: int
    backpressure_level: BackpressureLevel = _api("backpressureLevel")
    ratio: Ratio | None  # backpressured share of its last heartbeat interval; None: not measured yet
    busy_ratio: Ratio | None = _api("busyRatio")
    idle_ratio: Ratio | None = _api("idleRatio")


class VertexBackpressure(Model):
    status: Literal["ok"]
    backpressure_level: BackpressureLevel = _api("backpressureLevel")  # the worst subtask's
    end_timestamp: int = _api("end-timestamp")  # when the newest measurement reached the JobManager
    subtasks: list[SubtaskBackpressure]


def vertex_backpressure(status: JobStatusView, vertex_uid: str) -> VertexBackpressure:
    tasks = sorted((t for t in status.tasks if t.vertex_uid == vertex_uid), key=lambda t: t.subtask)
    subtasks = []
    for t in tasks:
        r = t.ratios
        subtasks.append(
            SubtaskBackpressure(
                subtask=t.subtask,
                backpressure_level=backpressure_level(r.backpressured if r is not None else 0.0),
                ratio=r.backpressured if r is not None else None,
                busy_ratio=r.busy if r is not None else None,
                idle_ratio=r.idle if r is not None else None,
            )
        )
    worst = max((s.ratio for s in subtasks if s.ratio is not None), default=0.0)
    measured = [t.progress_at for t in tasks if t.progress_at is not None]
    return VertexBackpressure(
        status="ok",
        backpressure_level=backpressure_level(worst),
        end_timestamp=ms(max(measured)) if measured else ms(status.now),
        subtasks=subtasks,
    )


# Requests ------------------------------------------------------------------------------------------


class SavepointRequest(Model):
    """``POST /jobs/{id}/savepoints``; strict: a string is no boolean."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, validate_by_name=True, validate_by_alias=True)

    target_directory: str | None = Field(default=None, alias="target-directory", min_length=1)
    cancel_job: bool = Field(default=False, alias="cancel-job")  # stop the job once the savepoint completed
    drain: bool = False  # with cancel-job: advance event time to the end first
    format_type: Literal["CANONICAL", "NATIVE"] | None = Field(default=None, alias="formatType")  # Weir has one
    trigger_id: str | None = Field(default=None, alias="triggerId")  # Flink's client's; Weir answers its own

    @model_validator(mode="after")
    def _drain_only_when_stopping(self) -> SavepointRequest:
        if self.drain and not self.cancel_job:
            raise ValueError("drain needs cancel-job: only a job that stops is drained")
        return self


class SavepointTriggered(Model):
    request_id: str = _api("request-id")  # the savepoint's checkpoint id


class CancelMode(enum.StrEnum):
    CANCEL = "cancel"


class Accepted(Model):
    pass
