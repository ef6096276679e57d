"""The Kafka source lag gauges: values, throttling, unknown high watermarks, removal."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from weir.operators.source_metrics import KafkaSourceLag, partition_lag, record_lag

TOPIC = "events"


def task_labels() -> tuple[str, str, str, str, str]:
    return (f"job-{uuid.uuid4().hex[:8]}", "events-job", "events-source", "0", "taskmanager-1")


def lag_of(labels: tuple[str, ...], partition: int) -> float | None:
    job, name, uid, subtask, tm = labels
    return REGISTRY.get_sample_value(
        "weir_kafka_source_lag_records",
        {
            "job_id": job,
            "job_name": name,
            "operator_uid": uid,
            "subtask": subtask,
            "taskmanager": tm,
            "topic": TOPIC,
            "partition": str(partition),
        },
    )


def test_partition_lag_is_high_watermark_minus_next_offset_never_negative() -> None:
    assert partition_lag(100, 40) == 60
    assert partition_lag(100, 100) == 0
    assert partition_lag(100, 120) == 0  # the cached high watermark may trail the position
    assert partition_lag(5, -1001) == 5  # a logical offset (OFFSET_BEGINNING) counts as 0
    assert partition_lag(-1001, 0) is None  # librdkafka's OFFSET_INVALID: no fetch answered yet


def test_record_lag_sets_one_series_per_partition() -> None:
    labels = task_labels()
    assert record_lag(labels, TOPIC, 0, 1000, 250) == 750
    assert record_lag(labels, TOPIC, 3, 10, 10) == 0
    assert record_lag(labels, TOPIC, 4, -1001, 0) is None
    assert lag_of(labels, 0) == 750
    assert lag_of(labels, 3) == 0
    assert lag_of(labels, 4) is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tracker_refreshes_at_most_once_per_interval_and_removes_its_series() -> None:
    labels = task_labels()
    highs = {0: 500, 1: 80}
    clock = FakeClock()
    lag = KafkaSourceLag(labels, TOPIC, highs.__getitem__, min_interval_s=1.0, clock=clock)

    assert lag.maybe_update([0, 1], {0: 100})
    assert (lag_of(labels, 0), lag_of(labels, 1)) == (400, 80)  # partition 1 not read yet: from 0

    highs[0] = 900
    clock.now += 0.5
    assert not lag.maybe_update([0, 1], {0: 100, 1: 80})
    assert lag_of(labels, 0) == 400

    clock.now += 0.5
    assert lag.maybe_update([0, 1], {0: 300, 1: 80})
    assert (lag_of(labels, 0), lag_of(labels, 1)) == (600, 0)

    lag.finished(0)
    assert lag_of(labels, 0) == 0

    lag.remove()
    assert (lag_of(labels, 0), lag_of(labels, 1)) == (None, None)
