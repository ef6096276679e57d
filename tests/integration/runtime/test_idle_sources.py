"""Source idleness on JobManager + 3 TaskManagers: an empty Kafka partition must not hold back the
watermark, so every event-time window of the data fires while the unbounded job keeps running."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster, create_topics
from weir.connectors import kafka
from weir.core.config import Endpoints

pytestmark = pytest.mark.integration

JOB = "tests/integration/runtime/jobs/idle_partition_windows.py"
WINDOW_MS = 1000
PARTITIONS = 4
EMPTY_PARTITION = 3  # with -p 4, source subtask 3 reads only this partition, which stays empty
DATA_PARTITIONS = (0, 1, 2)
WINDOWS = 5
RESULTS_DEADLINE_S = 120.0


def produce(endpoints: Endpoints, topic: str, records: list[tuple[int, dict[str, Any]]]) -> None:
    producer = kafka.producer(endpoints, linger_ms=5)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for partition, event in records:
        producer.produce(
            topic,
            partition=partition,
            key=event["key"].encode(),
            value=json.dumps(event).encode(),
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0 and not errors, errors


def test_an_empty_partition_does_not_hold_back_event_time_windows(weir_cluster: WeirCluster, unique: str) -> None:
    endpoints = weir_cluster.endpoints
    source, sink = f"idle-events-{unique}", f"idle-counts-{unique}"
    create_topics(endpoints, {source: PARTITIONS, sink: 2})
    # Event time from the current second (the broker's time retention must not delete the records).
    start = int(time.time()) * 1000
    data: list[tuple[int, dict[str, Any]]] = []
    for i in range(WINDOWS * 100):  # 10 ms apart: windows 0..4, every key in each, spread over 3 partitions
        data.append((DATA_PARTITIONS[i % 3], {"key": f"k{i % 4}", "ts": start + 10 * i}))
    # One later record per data partition moves its watermark past the last data window (its own
    # window, at WINDOWS, stays open: nothing reaches that far).
    closing = [(p, {"key": "closing", "ts": start + WINDOWS * WINDOW_MS + 500}) for p in DATA_PARTITIONS]
    produce(endpoints, source, data + closing)
    windows = Counter((e["key"], e["ts"] - (e["ts"] - start) % WINDOW_MS) for _p, e in data)
    assert len(windows) == 4 * WINDOWS
    expected = Counter(  # whole records: a window fired twice is two of them
        json.dumps({"key": k, "window_start": s, "window_end": s + WINDOW_MS, "count": n}, sort_keys=True)
        for (k, s), n in windows.items()
    )

    job_id = weir_cluster.submit(
        JOB,
        {"source.topic": source, "sink.topic": sink, "source.idle_timeout_ms": "1000"},
        parallelism=PARTITIONS,
    )
    try:

        def committed_while_running() -> list[dict[str, Any]]:
            status = weir_cluster.client.job_status(job_id)
            assert status.summary.status in ("CREATED", "RUNNING"), status
            return [json.loads(v) for _, _, _, v in kafka.read_all(endpoints, sink, "read_committed")]

        found = polling.settle(
            RESULTS_DEADLINE_S, committed_while_running, lambda records: len(records) >= len(expected), 0.5
        )
        fired = Counter(json.dumps(r, sort_keys=True) for r in found)
        assert fired == expected, (
            f"{len(found)} of {len(expected)} windows fired in {RESULTS_DEADLINE_S}s",
            sorted((fired - expected).elements())[:5],
            sorted((expected - fired).elements())[:5],
        )
        assert weir_cluster.client.job_status(job_id).summary.status == "RUNNING"  # unbounded: still running
    finally:
        weir_cluster.client.cancel_job(job_id)
    assert weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=60).summary.status == "CANCELED"
