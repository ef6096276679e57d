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
