"""A SQL statement on the columnar path (SET 'weir.columnar' = 'true') on the session cluster at
parallelism 2 with checkpoints: a bounded read of a Kafka topic, a filter and a projection evaluated
on Arrow batches, an exactly-once Kafka sink. The job finishes and the topic (read_committed) holds
exactly what plain Python computes over the same rows, as a multiset of whole records."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster, create_topics
from weir.connectors import kafka
from weir.sql import explain
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

ROWS = 3_000
BASE_MS = 1_704_067_200_000


def script(source: str, sink: str) -> str:
    return f"""
SET 'weir.columnar' = 'true';
CREATE TABLE orders (id BIGINT, u STRING, amount BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json',
        'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');
CREATE TABLE out (id BIGINT, u STRING, v BIGINT, size STRING, missing BOOLEAN)
  WITH ('connector' = 'kafka', 'topic' = '{sink}', 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once');
INSERT INTO out
SELECT id, u, amount * 3 - MOD(id, 5), CASE WHEN amount > 50 THEN 'big' ELSE 'small' END, amount IS NULL
FROM orders WHERE amount % 7 <> 3 OR amount IS NULL;
"""


def test_a_columnar_sql_statement_writes_kafka_exactly(weir_cluster: WeirCluster, unique: str, tmp_path: Path) -> None:
    source, sink = f"sql-col-orders-{unique}", f"sql-col-out-{unique}"
    text = script(source, sink)
    assert "-columnar  columnar: on Arrow batches" in explain(text)
    create_topics(weir_cluster.endpoints, {source: 3, sink: 2})
    rows = [
        {"id": i, "u": f"u{i % 17}", "amount": None if i % 11 == 0 else (i * 31) % 101, "ts": BASE_MS + 20 * i}
        for i in range(ROWS)
    ]
    producer = kafka.producer(weir_cluster.endpoints, enable_idempotence=True)
    for row in rows:
        producer.produce(source, json.dumps(row).encode(), partition=row["id"] % 3)
    assert producer.flush(60) == 0
    expected = Counter(
        json.dumps(
            {
                "id": r["id"],
                "u": r["u"],
                "v": None if r["amount"] is None else r["amount"] * 3 - r["id"] % 5,
                "size": "big" if r["amount"] is not None and r["amount"] > 50 else "small",
                "missing": r["amount"] is None,
            },
            sort_keys=True,
        )
        for r in rows
        if r["amount"] is None or r["amount"] % 7 != 3
    )
    job_file = tmp_path / f"sql_columnar_{unique}.py"
    job_file.write_text(sql_job_source(text))
    job_id = weir_cluster.submit(str(job_file), {"checkpointing.interval": "500ms"}, parallelism=2)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the SQL job to finish", 240)
    assert final.summary.status == "FINISHED", final.failure
    committed = Counter(
        json.dumps(json.loads(value), sort_keys=True)
        for _, _, _, value in kafka.read_all(weir_cluster.endpoints, sink)
        if value is not None
    )
    assert sum(expected.values()) > 2_000
    assert committed == expected


WINDOW_ROWS = 4_000


def window_script(source: str, sink: str, hop_sink: str) -> str:
    return f"""
SET 'weir.columnar' = 'true';
CREATE TABLE orders (id BIGINT, u STRING, amount BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json',
        'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');
CREATE TABLE per_user (u STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT, c BIGINT,
  total BIGINT, low BIGINT, high BIGINT, mean BIGINT)
  WITH ('connector' = 'kafka', 'topic' = '{sink}', 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once');
CREATE TABLE hopping (u STRING, window_start TIMESTAMP(3), n BIGINT, total BIGINT)
  WITH ('connector' = 'kafka', 'topic' = '{hop_sink}', 'format' = 'json',
        'sink.delivery-guarantee' = 'exactly-once');
INSERT INTO per_user
SELECT u, window_start, window_end, COUNT(*), COUNT(amount), SUM(amount), MIN(amount), MAX(amount), AVG(amount)
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY u, window_start, window_end;
INSERT INTO hopping
SELECT u, window_start, COUNT(*), SUM(amount)
FROM TABLE(HOP(TABLE orders, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '6' SECOND))
GROUP BY u, window_start, window_end;
"""


def _avg(values: list[int]) -> int | None:
    """Flink's AVG of BIGINT: truncated toward zero."""
    if not values:
        return None
    quotient = abs(sum(values)) // len(values)
    return quotient if sum(values) >= 0 else -quotient


def test_a_columnar_sql_window_aggregation_writes_kafka_exactly(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    """TUMBLE and HOP window aggregates pre-aggregated on Arrow batches at parallelism 2 with
    checkpoints every 500 ms (snapshots in the middle of gathered rows), exactly-once Kafka sinks:
    each topic (read_committed) holds what plain Python computes over the rows, NULL keys and NULL
    amounts included, as a multiset of whole records."""
    from weir.sql.types import timestamp_text

    source, sink, hop_sink = f"sql-colwin-orders-{unique}", f"sql-colwin-out-{unique}", f"sql-colwin-hop-{unique}"
    text = window_script(source, sink, hop_sink)
    plan = explain(text)
    assert plan.count("[columnar: pre-aggregated per key and") == 2, plan
    create_topics(weir_cluster.endpoints, {source: 3, sink: 2, hop_sink: 2})
    rows = [
        {
            "id": i,
            "u": None if i % 23 == 0 else f"u{i % 7}",
            "amount": None if i % 11 == 0 else (i * 31) % 101 - 20,
            "ts": BASE_MS + 10 * i + (i * 7) % 300,  # out of order within the second of delay
        }
        for i in range(WINDOW_ROWS)
    ]
    producer = kafka.producer(weir_cluster.endpoints, enable_idempotence=True)
    for row in rows:
        producer.produce(source, json.dumps(row).encode(), partition=row["id"] % 3)
    assert producer.flush(60) == 0
    tumbling: dict[tuple[str | None, int], list[int | None]] = {}
    hopping: dict[tuple[str | None, int], list[int | None]] = {}
    for r in rows:
        start = r["ts"] - r["ts"] % 5_000
        tumbling.setdefault((r["u"], start), []).append(r["amount"])
        last = r["ts"] - r["ts"] % 2_000
        for s in range(last, r["ts"] - 6_000, -2_000):
            hopping.setdefault((r["u"], s), []).append(r["amount"])
    expected = Counter(
        json.dumps(
            {
                "u": u,
                "window_start": timestamp_text(start),
                "window_end": timestamp_text(start + 5_000),
                "n": len(amounts),
                "c": len(present := [a for a in amounts if a is not None]),
                "total": sum(present) if present else None,
                "low": min(present, default=None),
                "high": max(present, default=None),
                "mean": _avg(present),
            },
            sort_keys=True,
        )
        for (u, start), amounts in tumbling.items()
    )
    expected_hop = Counter(
        json.dumps(
            {
                "u": u,
                "window_start": timestamp_text(start),
                "n": len(amounts),
                "total": sum(a for a in amounts if a is not None) if any(a is not None for a in amounts) else None,
            },
            sort_keys=True,
        )
        for (u, start), amounts in hopping.items()
    )
    job_file = tmp_path / f"sql_columnar_window_{unique}.py"
    job_file.write_text(sql_job_source(text))
    job_id = weir_cluster.submit(str(job_file), {"checkpointing.interval": "500ms"}, parallelism=2)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the SQL job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure

    def committed(topic: str) -> Counter[str]:
        return Counter(
            json.dumps(json.loads(value), sort_keys=True)
            for _, _, _, value in kafka.read_all(weir_cluster.endpoints, topic)
            if value is not None
        )

    assert sum(expected.values()) > 50 and sum(expected_hop.values()) > 150
    assert committed(sink) == expected
    assert committed(hop_sink) == expected_hop
