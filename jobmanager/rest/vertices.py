"""A job vertex and its subtasks in Flink's shapes: ``JobVertexDetailsInfo`` (``GET
/jobs/{id}/vertices/{vid}``), ``SubtaskExecutionAttemptDetailsInfo`` (``.../subtasks/{index}``) and
``SubtasksTimesInfo`` (``.../subtasktimes``) and ``JobVertexTaskManagersInfo`` (``.../taskmanagers``: the
vertex's subtasks grouped by the TaskManager they run on), from the JobManager's read views.

Weir records, per subtask, its state, its TaskManager, its job attempt and its record counters; when
the job's current attempt was deployed (its restore, or the submission for the first) and when the
job ended. So a subtask's ``start-time`` (Flink: when it reached DEPLOYING) is its attempt's
deployment, its ``end-time`` the job's end once the job ended (-1 before, as Flink's for a subtask not
ended, also for a subtask that finished in a job still running: Weir does not record that moment), and
``timestamps`` carries those two states, 0 for every other (Flink's value for a state not reached).
A subtask's ``metrics`` are ``weir.jobmanager.rest.views.IOMetrics``: its records, its busy,
backpressured and idle ms; byte counters Weir does not keep (0, ``-complete`` false, Flink's flag for
a metric not known)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from weir.jobmanager.messages import ClusterView, JobStatusView, TaskView, VertexView
from weir.jobmanager.rest.ids import flink_vertex_id, names_vertex
from weir.jobmanager.rest.views import (
    FLINK_EXECUTION_STATES,
    IOMetrics,
    Model,
    _api,
    execution_state,
    execution_state_counts,
    io_metrics,
    ms,
    percentile,
    vertex_status,
)

UNASSIGNED: Final = "(unassigned)"  # Flink's host and TaskManager of a subtask not deployed
TIMED_STATES: Final = ("CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING")  # Flink's status-duration
NOT_RECORDED: Final = -1  # Flink's duration of a state whose start or end is not known


class SubtaskAttemptDetails(Model):
    """Flink's ``SubtaskExecutionAttemptDetailsInfo``; ``attempt`` is the job attempt (Weir restarts the
    whole job), ``host``/``endpoint`` the TaskManager's address."""

    subtask: int
    status: str  # a Flink ExecutionState: Weir's task states, CREATED for one not reported yet
    attempt: int
    host: str
    endpoint: str
    started: int = _api("start-time")  # deployed at; 0: never
    ended: int = _api("end-time")  # -1: not ended, or not recorded
    duration: int  # -1: not started
    metrics: IOMetrics
    taskmanager_id: str = _api("taskmanager-id")
    started_deprecated: int = _api("start_time")  # Flink writes both spellings
    # Flink's ms spent in each early state: Weir records no state's entry but the deployment, so -1 each
    status_duration: dict[str, int] = _api("status-duration")


class VertexDetails(Model):
    """Flink's ``JobVertexDetailsInfo``."""

    id: str  # Flink's JobVertexID form
    uid: str  # Weir's: the head operator's uid
    name: str
    parallelism: int
    max_parallelism: int = _api("maxParallelism")
    now: int
    subtasks: list[SubtaskAttemptDetails]


class SubtaskTimes(Model):
    """Flink's ``SubtaskTimeInfo``: when the subtask reached each ExecutionState (0: not reached, or
    not recorded by Weir)."""

    subtask: int
    host: str
    endpoint: str  # Flink's name of the same: the TaskManager's address
    duration: int
    timestamps: dict[str, int]


class VertexSubtaskTimes(Model):
    """Flink's ``SubtasksTimesInfo``."""

    id: str  # Flink's JobVertexID form
    uid: str  # Weir's: the head operator's uid
    name: str
    now: int
    subtasks: list[SubtaskTimes]


def _deployed_at(status: JobStatusView, task: TaskView) -> int:
    """When the task's attempt was deployed, ms; 0 for a task never deployed."""
    if task.attempt == 0:
        return 0
    return ms(status.last_restore_at or status.summary.submitted_at)


def _ended_at(status: JobStatusView, task: TaskView) -> int:
    if task.state is not None and task.state.terminal and status.finished_at is not None:
        return ms(status.finished_at)
    return -1


def _duration(start: int, end: int, now: int) -> int:
    return ((end if end > 0 else now) - start) if start > 0 else -1


def _addresses(cluster: ClusterView) -> dict[str, str]:
    return {tm.taskmanager_id: tm.address for tm in cluster.taskmanagers}


def subtask_details(status: JobStatusView, task: TaskView, addresses: Mapping[str, str]) -> SubtaskAttemptDetails:
    now = ms(status.now)
    start, end = _deployed_at(status, task), _ended_at(status, task)
    host = addresses.get(task.taskmanager_id, UNASSIGNED) if task.taskmanager_id else UNASSIGNED
    return SubtaskAttemptDetails(
        subtask=task.subtask,
        status=execution_state(task.state),
        attempt=task.attempt,
        host=host,
        endpoint=host,
        started=start,
        ended=end,
        duration=_duration(start, end, now),
        metrics=io_metrics([task]),
        taskmanager_id=task.taskmanager_id or UNASSIGNED,
        started_deprecated=start,
        status_duration=dict.fromkeys(TIMED_STATES, NOT_RECORDED),
    )


def vertex_tasks(status: JobStatusView, vertex_uid: str) -> list[TaskView]:
    return sorted((t for t in status.tasks if t.vertex_uid == vertex_uid), key=lambda t: t.subtask)


def vertex_details(
    status: JobStatusView, vertex: VertexView, max_parallelism: int, cluster: ClusterView
) -> VertexDetails:
    addresses = _addresses(cluster)
    return VertexDetails(
        id=flink_vertex_id(vertex.uid),
        uid=vertex.uid,
        name=vertex.name,
        parallelism=vertex.parallelism,
        max_parallelism=max_parallelism,
        now=ms(status.now),
        subtasks=[subtask_details(status, t, addresses) for t in vertex_tasks(status, vertex.uid)],
    )


def subtask_of(
    status: JobStatusView, vertex_uid: str, index: int, cluster: ClusterView
) -> SubtaskAttemptDetails | None:
    """One subtask's details; None when the vertex has no such subtask."""
    task = next((t for t in vertex_tasks(status, vertex_uid) if t.subtask == index), None)
    return None if task is None else subtask_details(status, task, _addresses(cluster))


def subtask_times(status: JobStatusView, vertex: VertexView, cluster: ClusterView) -> VertexSubtaskTimes:
    addresses = _addresses(cluster)
    now = ms(status.now)
    subtasks = []
    for task in vertex_tasks(status, vertex.uid):
        start, end = _deployed_at(status, task), _ended_at(status, task)
        reached = {name: 0 for name in FLINK_EXECUTION_STATES}
        if start:
            reached["DEPLOYING"] = start
        if end > 0 and task.state is not None:
            reached[task.state.value] = end
        host = addresses.get(task.taskmanager_id, UNASSIGNED) if task.taskmanager_id else UNASSIGNED
        subtasks.append(
            SubtaskTimes(
                subtask=task.subtask,
                host=host,
                endpoint=host,
                duration=_duration(start, end, now),
                timestamps=reached,
            )
        )
    return VertexSubtaskTimes(
        id=flink_vertex_id(vertex.uid), uid=vertex.uid, name=vertex.name, now=now, subtasks=subtasks
    )


def find_vertex(vertices: Sequence[VertexView], vertex_id: str) -> VertexView | None:
    """The vertex a path names, by its uid or its id in Flink's form."""
    return next((v for v in vertices if names_vertex(vertex_id, v.uid)), None)


# A vertex's TaskManagers (Flink's JobVertexTaskManagersInfo) ----------------------------------------

AGGREGATED_METRICS: Final = (
    "read-bytes",
    "write-bytes",
    "read-records",
    "write-records",
    "accumulated-backpressured-time",
    "accumulated-busy-time",
    "accumulated-idle-time",
)  # Flink's AggregatedTaskDetailsInfo aggregates these IOMetricsInfo figures
AGGREGATED_STATUSES: Final = ("CREATED", "SCHEDULED", "INITIALIZING", "DEPLOYING", "RUNNING")


class AggregatedTaskDetails(Model):
    """Flink's ``AggregatedTaskDetailsInfo``: each figure over the subtasks as ``min``, ``max``, ``avg``
    (integer), ``sum``, ``median``, ``p25``, ``p75``, ``p95`` (Commons Math's estimate, truncated).
    ``status-duration`` aggregates the subtasks' ms per early state, which Weir does not record (-1
    each, ``SubtaskAttemptDetails.status_duration``)."""

    metrics: dict[str, dict[str, int]]
    status_duration: dict[str, dict[str, int]] = _api("status-duration")


class VertexTaskManager(Model):
    """Flink's ``JobVertexTaskManagersInfo.TaskManagersInfo``: the vertex's subtasks on one TaskManager."""

    host: str
    endpoint: str
    status: str  # the subtasks' aggregated ExecutionState (as a vertex's), CREATED until all reported
    started: int = _api("start-time")  # the earliest subtask's deployment; -1: none deployed
    ended: int = _api("end-time")  # the latest subtask's end once all ended; -1 before
    duration: int  # -1: none deployed
    metrics: IOMetrics  # summed over the subtasks
    status_counts: dict[str, int] = _api("status-counts")
    taskmanager_id: str = _api("taskmanager-id")
    aggregated: AggregatedTaskDetails


class VertexTaskManagers(Model):
    """Flink's ``JobVertexTaskManagersInfo``."""

    id: str  # Flink's JobVertexID form
    uid: str  # Weir's: the head operator's uid
    name: str
    now: int
    taskmanagers: list[VertexTaskManager]


def figure_statistics(values: Sequence[int]) -> dict[str, int]:
    """One figure over a TaskManager's subtasks, as Flink's ``AggregatedTaskDetailsInfo`` gives it."""
    ordered = sorted(values)
    return {
        "min": ordered[0] if ordered else 0,
        "max": ordered[-1] if ordered else 0,
        "avg": sum(ordered) // len(ordered) if ordered else 0,
        "sum": sum(ordered),
        "median": int(percentile(ordered, 50)),
        "p25": int(percentile(ordered, 25)),
        "p75": int(percentile(ordered, 75)),
        "p95": int(percentile(ordered, 95)),
    }


def aggregated_details(subtasks: Sequence[SubtaskAttemptDetails]) -> AggregatedTaskDetails:
    figures = [s.metrics.model_dump(by_alias=True) for s in subtasks]
    return AggregatedTaskDetails(
        metrics={name: figure_statistics([int(f[name]) for f in figures]) for name in AGGREGATED_METRICS},
        status_duration={
            name: figure_statistics([s.status_duration[name] for s in subtasks]) for name in AGGREGATED_STATUSES
        },
    )


def vertex_taskmanagers(status: JobStatusView, vertex: VertexView, cluster: ClusterView) -> VertexTaskManagers:
    """The vertex's subtasks by TaskManager (those not deployed under Flink's ``(unassigned)``), in the
    order of their first subtask."""
    addresses = _addresses(cluster)
    now = ms(status.now)
    groups: dict[str, list[TaskView]] = {}
    for task in vertex_tasks(status, vertex.uid):
        groups.setdefault(task.taskmanager_id or UNASSIGNED, []).append(task)
    infos = []
    for taskmanager_id, tasks in groups.items():
        subtasks = [subtask_details(status, t, addresses) for t in tasks]
        starts = [s.started for s in subtasks if s.started > 0]
        start = min(starts) if starts else -1
        all_ended = all(s.ended > 0 for s in subtasks)
        end = max(s.ended for s in subtasks) if all_ended else -1
        infos.append(
            VertexTaskManager(
                host=subtasks[0].host,
                endpoint=subtasks[0].endpoint,
                status=execution_state(vertex_status(t.state for t in tasks)),
                started=start,
                ended=end,
                duration=_duration(start, end, now) if start > 0 else -1,
                metrics=io_metrics(tasks),
                status_counts=execution_state_counts(t.state for t in tasks),
                taskmanager_id=taskmanager_id,
                aggregated=aggregated_details(subtasks),
            )
        )
    return VertexTaskManagers(
        id=flink_vertex_id(vertex.uid), uid=vertex.uid, name=vertex.name, now=now, taskmanagers=infos
    )
