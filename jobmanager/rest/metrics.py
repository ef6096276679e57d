"""Flink's metrics REST endpoints (``docs/rest-api.md``, "Metrics"): the metrics of the JobManager, the
TaskManagers, the jobs, their vertices and subtasks, under Flink's names where a Flink metric means the
same, and Weir's own otherwise.

Flink answers two shapes. A scope's own metrics (``/jobmanager/metrics``, ``/jobs/{id}/metrics``,
``/taskmanagers/{id}/metrics``, a vertex's, a subtask's): without ``get`` the ids it has,
``[{"id": "numRestarts"}]``; with ``get=a,b`` their values as strings, ``[{"id": "numRestarts", "value":
"2"}]`` (Flink's ``MetricStore`` keeps every value as its string). Across several scopes
(``/jobs/metrics?jobs=``, ``/taskmanagers/metrics?taskmanagers=``, ``.../subtasks/metrics?subtasks=``):
without ``get`` the ids any of them has; with ``get`` each numeric metric aggregated over the scopes that
have it, ``[{"id", "min", "max", "avg", "sum", "skew"}]`` (``agg=`` picks some; all by default). An id
no scope has is left out, as Flink leaves it out.

The values come from where the JobManager keeps them: its job records (the TaskManagers' heartbeats:
counters, time shares, watermarks; the checkpoint coordinator's statistics), its TaskManager registry,
and its own Prometheus registry (its process's series). Nothing is scraped.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Final

from fastapi import Query
from prometheus_client import REGISTRY
from prometheus_client.registry import Collector
from pydantic import RootModel

from weir.core.checkpointing import CheckpointStatus
from weir.core.states import JobStatus
from weir.jobmanager.errors import MetricsQueryError
from weir.jobmanager.messages import (
    CheckpointsView,
    ClusterView,
    JobStatusView,
    JobSummaryView,
    TaskManagerView,
    TaskView,
)
from weir.jobmanager.rest.views import Model, ms

MetricValue = int | float | str
Metrics = Mapping[str, MetricValue]

NO_WATERMARK: Final = -(2**63)
"""Flink's ``currentInputWatermark`` before the first watermark: Java's ``Long.MIN_VALUE``."""
NO_LONGER_RUNNING: Final = -1
"""Flink's ``uptime`` of a job that ended (its ``UpTimeGauge``)."""
NO_EXTERNAL_PATH: Final = "n/a"
"""Flink's ``lastCheckpointExternalPath`` before the first completed checkpoint."""

FLINK_NAMES: Final[Mapping[str, str]] = {
    # Flink's metric id: where Weir has it (docs/rest-api.md, "Metrics", keeps this list for operators)
    "numRecordsIn": "a task's records in (weir_records_in_total), per attempt",
    "numRecordsOut": "a task's records out (weir_records_out_total), per attempt",
    "numRecordsInPerSecond": "records in per second between the task's latest two heartbeats",
    "numRecordsOutPerSecond": "records out per second between the task's latest two heartbeats",
    "currentInputWatermark": "the task's input watermark, ms (weir_watermark_seconds x 1000)",
    "busyTimeMsPerSecond": "busy share of the last heartbeat interval x 1000 (weir_busy_seconds_total)",
    "backPressuredTimeMsPerSecond": "backpressured share x 1000 (weir_backpressured_seconds_total)",
    "idleTimeMsPerSecond": "idle share x 1000 (weir_idle_seconds_total)",
    "uptime": "ms the job's current attempt has run (-1 once the job ended, 0 when not running)",
    "numRestarts": "the job's restarts (weir_job_restarts)",
    "lastCheckpointDuration": "ms (weir_last_checkpoint_duration_seconds x 1000)",
    "lastCheckpointSize": "bytes (weir_last_checkpoint_size_bytes)",
    "lastCompletedCheckpointId": "weir_last_completed_checkpoint_id",
    "lastCheckpointExternalPath": "where the latest completed checkpoint is",
    "lastCheckpointRestoreTimestamp": "epoch ms of the current attempt's restore (-1: none)",
    "numberOfCompletedCheckpoints": "weir_checkpoints_completed_total",
    "numberOfFailedCheckpoints": "weir_checkpoints_failed_total",
    "numberOfInProgressCheckpoints": "weir_checkpoints_in_progress",
    "totalNumberOfCheckpoints": "weir_checkpoints_triggered_total",
    "numRegisteredTaskManagers": "weir_taskmanagers_registered",
    "taskSlotsTotal": "weir_taskmanager_slots",
    "taskSlotsAvailable": "weir_taskmanager_slots_available",
    "numRunningJobs": "jobs not ended",
}


class Aggregation(enum.StrEnum):
    """Flink's ``MetricsAggregationParameter.AggregationMode``."""

    MIN = "min"
    MAX = "max"
    AVG = "avg"
    SUM = "sum"
    SKEW = "skew"


# Answers -------------------------------------------------------------------------------------------


class Metric(Model):
    """Flink's ``Metric``: an id, with its value (a string) when it was asked for with ``get``."""

    id: str
    value: str | None = None


class MetricList(RootModel[list[Metric]]):
    """Flink's ``MetricCollectionResponseBody``: a JSON array."""


class AggregatedMetric(Model):
    """Flink's ``AggregatedMetric``: the aggregations asked for (``agg``), as numbers."""

    id: str
    min: float | None = None
    max: float | None = None
    avg: float | None = None
    sum: float | None = None
    skew: float | None = None


class AggregatedMetricList(RootModel[list[AggregatedMetric]]):
    """Flink's ``AggregatedMetricsResponseBody``: a JSON array."""


# Query parameters ----------------------------------------------------------------------------------

GetQuery = Annotated[str | None, Query(description="Comma-separated metric ids; without it, the ids available")]
AggQuery = Annotated[
    str | None, Query(description="Comma-separated aggregations: min, max, avg, sum, skew (without it: all)")
]


def names(get: str | None) -> tuple[str, ...] | None:
    """``get=a,b`` as ids in the order given (duplicates once); None: no ``get``, list the ids."""
    if get is None:
        return None
    wanted = [n.strip() for n in get.split(",") if n.strip()]
    return tuple(dict.fromkeys(wanted)) or None


def aggregations(agg: str | None) -> tuple[Aggregation, ...]:
    """``agg=min,max``; every aggregation without it, as Flink."""
    if agg is None or not agg.strip():
        return tuple(Aggregation)
    chosen: list[Aggregation] = []
    for part in (p.strip().lower() for p in agg.split(",") if p.strip()):
        try:
            chosen.append(Aggregation(part))
        except ValueError:
            known = ", ".join(a.value for a in Aggregation)
            raise MetricsQueryError(f"not a valid aggregation: {part!r} (one of {known})") from None
    return tuple(dict.fromkeys(chosen))


def selection(given: str | None) -> frozenset[str] | None:
    """``jobs=`` / ``taskmanagers=``: the ids listed; None: all."""
    if given is None:
        return None
    chosen = frozenset(p.strip() for p in given.split(",") if p.strip())
    return chosen or None


_RANGE: Final = re.compile(r"(\d+)(?:-(\d+))?")


def subtask_selection(given: str | None) -> frozenset[int] | None:
    """``subtasks=0,2-4`` (Flink's ``SubtasksFilterQueryParameter``: indexes and inclusive ranges); None: all."""
    if given is None or not given.strip():
        return None
    chosen: set[int] = set()
    for part in (p.strip() for p in given.split(",") if p.strip()):
        found = _RANGE.fullmatch(part)
        if found is None:
            raise MetricsQueryError(f"not a subtask index or range: {part!r} (e.g. subtasks=0,2-4)")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if high < low:
            raise MetricsQueryError(f"an empty subtask range: {part!r}")
        chosen.update(range(low, high + 1))
    return frozenset(chosen)


# Shapes --------------------------------------------------------------------------------------------


def as_string(value: MetricValue) -> str:
    """A value as Flink's ``MetricStore`` keeps it: a long's digits, a double as Java prints it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    return value


def metric_list(metrics: Metrics, get: tuple[str, ...] | None) -> MetricList:
    """One scope's answer: its ids (sorted) without ``get``, else the values of those it has."""
    if get is None:
        return MetricList([Metric(id=name) for name in sorted(metrics)])
    return MetricList([Metric(id=name, value=as_string(metrics[name])) for name in get if name in metrics])


def aggregated_list(
    scopes: Sequence[Metrics], get: tuple[str, ...] | None, chosen: Sequence[Aggregation]
) -> AggregatedMetricList:
    """Several scopes' answer: the ids any has (sorted) without ``get``; else each asked-for id with
    a numeric value in some scope, aggregated over those scopes."""
    if get is None:
        every = sorted({name for scope in scopes for name in scope})
        return AggregatedMetricList([AggregatedMetric(id=name) for name in every])
    answers = []
    for name in get:
        values = [float(v) for scope in scopes if isinstance(v := scope.get(name), int | float)]
        if values:
            answers.append(aggregate(name, values, chosen))
    return AggregatedMetricList(answers)


def aggregate(name: str, values: Sequence[float], chosen: Sequence[Aggregation]) -> AggregatedMetric:
    """``values`` (at least one) aggregated as Flink's ``DoubleAccumulator`` s do."""
    found: dict[str, float] = {}
    for aggregation in chosen:
        match aggregation:
            case Aggregation.MIN:
                found["min"] = min(values)
            case Aggregation.MAX:
                found["max"] = max(values)
            case Aggregation.AVG:
                found["avg"] = sum(values) / len(values)
            case Aggregation.SUM:
                found["sum"] = sum(values)
            case Aggregation.SKEW:
                found["skew"] = skew(values)
    return AggregatedMetric(id=name, **found)


def skew(values: Sequence[float]) -> float:
    """Flink's data skew in percent: the mean absolute deviation over the mean (a coefficient of
    variation), at most 100; 0 for a mean of 0."""
    mean = sum(values) / len(values)
    if mean == 0.0:
        return 0.0
    deviation = sum(abs(mean - v) for v in values) / len(values)
    return min(deviation / mean * 100.0, 100.0)


# Scopes --------------------------------------------------------------------------------------------


def task_metrics(task: TaskView) -> dict[str, MetricValue]:
    """A subtask's metrics (Flink's task scope), from its latest heartbeats; those not measured yet
    (time shares, rates) are left out."""
    found: dict[str, MetricValue] = {
        "numRecordsIn": task.records_in,
        "numRecordsOut": task.records_out,
        "numRecordsInAllAttempts": task.records_in_all_attempts,
        "currentInputWatermark": task.watermark if task.watermark is not None else NO_WATERMARK,
    }
    if task.rates is not None:
        found["numRecordsInPerSecond"] = task.rates.in_per_second
        found["numRecordsOutPerSecond"] = task.rates.out_per_second
    if task.ratios is not None:
        found["busyTimeMsPerSecond"] = task.ratios.busy * 1000.0
        found["backPressuredTimeMsPerSecond"] = task.ratios.backpressured * 1000.0
        found["idleTimeMsPerSecond"] = task.ratios.idle * 1000.0
    return found


def vertex_metrics(status: JobStatusView, vertex_uid: str) -> dict[str, MetricValue]:
    """A vertex's metrics as Flink's ``JobVertexMetricsHandler`` names them: each subtask's, prefixed
    with its index (``0.numRecordsIn``)."""
    return {
        f"{task.subtask}.{name}": value
        for task in status.tasks
        if task.vertex_uid == vertex_uid
        for name, value in task_metrics(task).items()
    }


def vertex_watermarks(status: JobStatusView, vertex_uid: str) -> MetricList:
    """Flink's ``/jobs/{id}/vertices/{vid}/watermarks``: each subtask's ``currentInputWatermark``,
    ``[{"id": "0.currentInputWatermark", "value": "..."}]``, by subtask."""
    tasks = sorted((t for t in status.tasks if t.vertex_uid == vertex_uid), key=lambda t: t.subtask)
    return MetricList(
        [
            Metric(
                id=f"{t.subtask}.currentInputWatermark",
                value=as_string(task_metrics(t)["currentInputWatermark"]),
            )
            for t in tasks
        ]
    )


def subtask_metrics(status: JobStatusView, vertex_uid: str, subtasks: frozenset[int] | None) -> list[Metrics]:
    """The chosen subtasks' metrics (all without a choice), each one scope of an aggregation."""
    return [
        task_metrics(task)
        for task in status.tasks
        if task.vertex_uid == vertex_uid and (subtasks is None or task.subtask in subtasks)
    ]


def job_metrics(status: JobStatusView, checkpoints: CheckpointsView) -> dict[str, MetricValue]:
    """A job's metrics (Flink's job scope): its uptime and restarts, and its checkpoint statistics."""
    summary = status.summary
    running_since = status.last_restore_at or summary.submitted_at
    if summary.status.terminal:
        uptime = NO_LONGER_RUNNING
    elif summary.status is JobStatus.RUNNING:
        uptime = max(0, ms(status.now) - ms(running_since))
    else:
        uptime = 0
    latest = next((c for c in checkpoints.checkpoints if c.status is CheckpointStatus.COMPLETED), None)
    counts = checkpoints.counts
    found: dict[str, MetricValue] = {
        "uptime": uptime,
        "numRestarts": summary.restarts,
        "numberOfCompletedCheckpoints": counts.completed,
        "numberOfFailedCheckpoints": counts.failed,
        "numberOfInProgressCheckpoints": counts.in_progress,
        "totalNumberOfCheckpoints": counts.triggered,
        "lastCheckpointDuration": -1,
        "lastCheckpointSize": -1,
        "lastCompletedCheckpointId": -1,
        "lastCheckpointExternalPath": NO_EXTERNAL_PATH,
        "lastCheckpointRestoreTimestamp": -1,
        "parallelism": summary.parallelism,
    }
    if latest is not None:
        found["lastCheckpointDuration"] = ms(latest.duration_s or 0.0)
        found["lastCheckpointSize"] = latest.state_size_bytes
        found["lastCompletedCheckpointId"] = int(latest.checkpoint_id)
        found["lastCheckpointExternalPath"] = checkpoints.external_paths.get(latest.checkpoint_id, NO_EXTERNAL_PATH)
    if checkpoints.restored is not None:
        found["lastCheckpointRestoreTimestamp"] = ms(checkpoints.restored.restored_at)
    return found


def taskmanager_metrics(taskmanager: TaskManagerView, statuses: Iterable[JobStatusView]) -> dict[str, MetricValue]:
    """A TaskManager's metrics, as far as the JobManager knows them: its slots, its last heartbeat and
    the records of the tasks placed there (Weir's own names beside Flink's slot names; its process's
    CPU and memory are on its Prometheus endpoint)."""
    placed = {(t.job_id, t.vertex_uid, t.subtask) for t in taskmanager.tasks}
    tasks = [
        task
        for status in statuses
        for task in status.tasks
        if (status.summary.job_id, task.vertex_uid, task.subtask) in placed
        and task.taskmanager_id == taskmanager.taskmanager_id
    ]
    return {
        "taskSlotsTotal": taskmanager.slots_total,
        "taskSlotsAvailable": taskmanager.slots_free,
        "timeSinceLastHeartbeat": ms(taskmanager.last_heartbeat_age_s),
        "alive": int(taskmanager.alive),
        "numRunningTasks": len(taskmanager.tasks),
        "numRecordsIn": sum(t.records_in for t in tasks),
        "numRecordsOut": sum(t.records_out for t in tasks),
    }


def jobmanager_metrics(
    cluster: ClusterView, jobs: Sequence[JobSummaryView], registry: Collector = REGISTRY
) -> dict[str, MetricValue]:
    """The JobManager's metrics: Flink's cluster gauges from its TaskManager registry and job table,
    and every series of its own Prometheus registry that has no labels (its process's CPU and memory,
    its leadership) under its Prometheus name."""
    live = [tm for tm in cluster.taskmanagers if tm.alive]
    found: dict[str, MetricValue] = {}
    for family in registry.collect():
        for sample in family.samples:
            if not sample.labels and not sample.name.endswith("_created"):
                value = sample.value
                found[sample.name] = int(value) if float(value).is_integer() else float(value)
    found.update(
        {
            "numRegisteredTaskManagers": len(live),
            "taskSlotsTotal": sum(tm.slots_total for tm in live),
            "taskSlotsAvailable": sum(tm.slots_free for tm in live),
            "numRunningJobs": sum(1 for j in jobs if not j.status.terminal),
        }
    )
    return found
