"""A streaming SQL job (weir.sql) on the session cluster at parallelism 2: a bounded read of a Kafka
topic, one STATEMENT SET with a TUMBLE window aggregation into an exactly-once Kafka topic and an
updating GROUP BY into a PostgreSQL table (two-phase commit, upsert on the primary key). The job
finishes and both sinks hold exactly what plain Python computes over the same rows (Kafka: a multiset
of whole records; PostgreSQL: the final table), and what ``assert_sinks_exact`` checks (the reference
run, the commit proofs, no transaction left open)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster, assert_sinks_exact, create_topics
from weir.connectors import kafka
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

ROWS = 3_000
BASE_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC
WINDOW_MS = 10_000


def script(source: str, sink: str, table: str) -> str:
    return f"""
CREATE TABLE orders (
  id BIGINT, u STRING, amount BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json',
        'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');

CREATE TABLE per_window (u STRING, window_start TIMESTAMP(3), n BIGINT, total BIGINT, top BIGINT)
  WITH ('connector' = 'kafka', 'topic' = '{sink}', 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once');

CREATE TABLE per_user (u STRING, n BIGINT, total BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{table}');

EXECUTE STATEMENT SET BEGIN
INSERT INTO per_window
SELECT u, window_start, COUNT(*), SUM(amount), MAX(amount)
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND))
WHERE amount % 7 <> 3
GROUP BY u, window_start, window_end;
INSERT INTO per_user SELECT UPPER(u), COUNT(*), SUM(amount) FROM orders GROUP BY UPPER(u);
END;
"""


def rows() -> list[dict[str, Any]]:
    return [{"id": i, "u": f"u{i % 17}", "amount": (i * 31) % 101, "ts": BASE_MS + 20 * i} for i in range(ROWS)]


def test_a_sql_statement_set_writes_kafka_and_postgresql_exactly(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    endpoints = weir_cluster.endpoints
    source, sink, table = f"sql-orders-{unique}", f"sql-per-window-{unique}", f"sql_per_user_{unique}"
    create_topics(endpoints, {source: 3, sink: 2})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (u text PRIMARY KEY, n bigint, total bigint)")
    producer = kafka.producer(endpoints, enable_idempotence=True)
    for row in rows():  # one partition per user: each partition in event-time order
        producer.produce(source, json.dumps(row).encode(), partition=int(row["u"][1:]) % 3)
    assert producer.flush(60) == 0

    windows: dict[tuple[str, int], list[int]] = defaultdict(list)
    users: dict[str, list[int]] = defaultdict(list)
    for row in rows():
        users[row["u"].upper()].append(row["amount"])
        if row["amount"] % 7 != 3:
            start = row["ts"] - row["ts"] % WINDOW_MS
            windows[(row["u"], start)].append(row["amount"])
    stamp = "2024-01-01 00:{:02d}:{:02d}.000"
    expected_windows = Counter(
        json.dumps(
            {
                "u": u,
                "window_start": stamp.format((start - BASE_MS) // 60_000, (start - BASE_MS) // 1000 % 60),
                "n": len(amounts),
                "total": sum(amounts),
                "top": max(amounts),
            },
            sort_keys=True,
        )
        for (u, start), amounts in windows.items()
    )
    expected_users = {(u, len(a), sum(a)) for u, a in users.items()}
    assert len(expected_windows) > 50 and len(expected_users) == 17

    job_file = tmp_path / f"sql_{unique}.py"
    job_file.write_text(sql_job_source(script(source, sink, table)))
    params = {"checkpointing.interval": "500ms"}
    job_id = weir_cluster.submit(str(job_file), params, parallelism=2)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the SQL job to finish", 180)
    assert final.summary.status == "FINISHED", final.failure

    committed = Counter(
        json.dumps(json.loads(value), sort_keys=True)
        for _, _, _, value in kafka.read_all(endpoints, sink)
        if value is not None
    )
    assert committed == expected_windows
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        stored = set(conn.execute(f"SELECT u, n, total FROM {table}").fetchall())
    assert stored == expected_users
    assert_sinks_exact(job_file, params, job_id, endpoints)
