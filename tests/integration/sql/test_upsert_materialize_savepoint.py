"""The upsert materializer's state (docs/formats.md, "SQL operator state": ``sink-upsert-materializer``,
value state ``rows`` as ``(1, [row, ...])``) through a real savepoint: ``GROUP BY u, b HAVING COUNT(*)
= 1`` written to a PostgreSQL table keyed by ``u`` alone, stopped with a savepoint mid-input and
resubmitted from it on the session cluster. The table ends equal to plain Python's over the whole
input, which it cannot unless the materializer restored its rows: a group whose only row arrived
before the savepoint and whose second arrives after is retracted from rows the materializer must
still hold, or its user stays in the table."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.integration.conftest import WeirCluster, create_topics
from tests.integration.sql.resume import stop_and_resume
from weir.connectors import kafka
from weir.sql import explain
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

ROWS = 1_500


def script(source: str, table: str) -> str:
    return f"""
CREATE TABLE orders (id BIGINT, u STRING, b BIGINT)
  WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
        'scan.bounded.mode' = 'latest-offset', 'scan.records-per-second' = '60');
CREATE TABLE once_users (u STRING, name STRING, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{table}');
INSERT INTO once_users
SELECT u, UPPER(u) FROM orders GROUP BY u, b HAVING COUNT(*) = 1;
"""


def orders() -> list[tuple[str, int]]:
    """Each user's rows over a few values of ``b`` (repeated), and now and then a ``b`` of its own."""
    rng = random.Random(35)
    rows = []
    for i in range(ROWS):
        u = rng.randrange(60)
        rows.append((f"u{u}", 100 + i if rng.random() < 0.03 else rng.randrange(1 + u % 4)))
    return rows


def test_the_materializer_s_rows_restore_from_a_savepoint(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    endpoints = weir_cluster.endpoints
    source, table = f"sql-materialize-orders-{unique}", f"sql_materialize_once_{unique}"
    create_topics(endpoints, {source: 2})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (u text PRIMARY KEY, name text)")
    producer = kafka.producer(endpoints, enable_idempotence=True)
    rows = orders()
    for i, (u, b) in enumerate(rows):
        producer.produce(source, json.dumps({"id": i, "u": u, "b": b}).encode(), partition=i % 2)
    assert producer.flush(60) == 0
    counts = Counter(rows)
    expected = {(u, u.upper()) for (u, _b), n in counts.items() if n == 1}
    assert 10 <= len(expected) < len({u for u, _b in rows})

    text = script(source, table)
    assert "sink-upsert-materializer: the rows of each once_users key (u)" in explain(text)
    resumed = stop_and_resume(
        weir_cluster,
        sql_job_source(text),
        sql_job_source(text),
        tmp_path,
        f"materialize_{unique}",
        f"SELECT u, name FROM {table}",
        endpoints.postgres_dsn,
    )
    assert resumed.at_stop and set(resumed.at_stop) != expected, "the first job had read everything: nothing to restore"
    assert resumed.at_end == Counter(expected)
