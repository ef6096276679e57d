"""Task metric series: labelled job_id, dropped when their attempt ends, kept for the attempt after it."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from weir.core.metrics import SinkMetrics, TaskMetrics
from weir.core.watermarks import MAX_WATERMARK, MIN_WATERMARK
from weir.taskmanager.task_metrics import exported_watermark

LABELS = ("job_id", "job_name", "operator_uid", "subtask", "taskmanager")


def records_in(labels: tuple[str, ...]) -> float | None:
    return REGISTRY.get_sample_value("weir_records_in_total", dict(zip(LABELS, labels, strict=True)))


def test_remove_drops_the_series_of_an_ended_attempt() -> None:
    metrics = TaskMetrics(f"job-{uuid.uuid4().hex[:8]}", "orders", "map", 0, "taskmanager-1")
    metrics.records_in.inc(3)
    assert records_in(metrics.labels) == 3
    metrics.remove()
    assert records_in(metrics.labels) is None
    metrics.remove()  # twice is harmless


def test_a_source_tasks_records_read_is_a_series_of_its_attempt() -> None:
    metrics = TaskMetrics(f"job-{uuid.uuid4().hex[:8]}", "orders", "source", 0, "taskmanager-1")
    metrics.source_records_read.inc(7)
    labels = dict(zip(LABELS, metrics.labels, strict=True))
    assert REGISTRY.get_sample_value("weir_source_records_read_total", labels) == 7
    metrics.remove()
    assert REGISTRY.get_sample_value("weir_source_records_read_total", labels) is None


def test_an_old_attempt_ending_late_keeps_the_series_of_the_new_one() -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    old = TaskMetrics(job_id, "orders", "map", 0, "taskmanager-1")
    new = TaskMetrics(job_id, "orders", "map", 0, "taskmanager-1")
    new.records_in.inc(5)
    old.remove()
    assert records_in(new.labels) == 5
    new.remove()
    assert records_in(new.labels) is None


def test_sink_metrics_of_a_replaced_attempt_stay() -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    old = SinkMetrics(job_id, "orders", "kafka-sink", 0, "taskmanager-1")
    new = SinkMetrics(job_id, "orders", "kafka-sink", 0, "taskmanager-1")
    new.committed.inc()
    old.remove()
    labels = dict(zip(LABELS, new.labels, strict=True))
    assert REGISTRY.get_sample_value("weir_sink_transactions_committed_total", labels) == 1
    new.remove()
    assert REGISTRY.get_sample_value("weir_sink_transactions_committed_total", labels) is None


def test_a_task_series_carries_the_job_name_beside_its_id() -> None:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    metrics = TaskMetrics(job_id, "orders", "map", 0, "taskmanager-1")
    metrics.records_in.inc(2)
    labels = {
        "job_id": job_id,
        "job_name": "orders",
        "operator_uid": "map",
        "subtask": "0",
        "taskmanager": "taskmanager-1",
    }
    assert REGISTRY.get_sample_value("weir_records_in_total", labels) == 2
    metrics.remove()


def test_the_watermark_gauge_is_in_seconds() -> None:
    """Prometheus' base unit is the second: ``time() - weir_current_watermark_seconds`` is the lag."""
    metrics = TaskMetrics(f"job-{uuid.uuid4().hex[:8]}", "orders", "source", 0, "taskmanager-1")
    metrics.show_watermark(1_700_000_000_250)
    labels = dict(zip(LABELS, metrics.labels, strict=True))
    assert REGISTRY.get_sample_value("weir_current_watermark_seconds", labels) == 1_700_000_000.25
    metrics.remove()


def test_the_watermark_gauge_shows_finite_watermarks_only() -> None:
    assert exported_watermark(1_700_000_000_000) == 1_700_000_000_000
    assert exported_watermark(None) is None
    assert exported_watermark(MAX_WATERMARK) is None  # the end of input: the gauge keeps the last value
    assert exported_watermark(MIN_WATERMARK) is None
