"""The versioned SQL operator state (docs/formats.md, "SQL operator state") through a real savepoint:
an aggregation of an updating aggregation (two ``changelog-aggregate`` operators, value state
``group`` as ``(1, (rows, accumulators, emitted))``) stopped with a savepoint mid-input and
resubmitted from it on the session cluster; the PostgreSQL table ends equal to plain Python's over
the whole input, which it cannot unless both operators restored their keys' state."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster, create_topics
from weir.connectors import kafka
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

ROWS = 1_500


def script(source: str, table: str) -> str:
    return f"""
CREATE TABLE orders (id BIGINT, u STRING)
  WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
        'scan.bounded.mode' = 'latest-offset', 'scan.records-per-second' = '60');
CREATE TABLE per_count (n BIGINT, users BIGINT, PRIMARY KEY (n) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{table}');
INSERT INTO per_count
SELECT n, COUNT(*) FROM (SELECT u, COUNT(*) AS n FROM orders GROUP BY u) AS q GROUP BY n;
"""


def test_a_changelog_aggregates_state_restores_from_a_savepoint(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    endpoints = weir_cluster.endpoints
    source, table = f"sql-state-orders-{unique}", f"sql_state_per_count_{unique}"
    create_topics(endpoints, {source: 2})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n bigint PRIMARY KEY, users bigint)")
    producer = kafka.producer(endpoints, enable_idempotence=True)
    users = [f"u{(i * 7919) % 97 % (1 + i % 31)}" for i in range(ROWS)]
    for i, user in enumerate(users):
        producer.produce(source, json.dumps({"id": i, "u": user}).encode(), partition=i % 2)
    assert producer.flush(60) == 0
    per_user = Counter(users)
    expected = set(Counter(per_user.values()).items())
    assert len(expected) > 5

    text = script(source, table)
    first_file, second_file = tmp_path / f"state_{unique}.py", tmp_path / f"state_{unique}_again.py"
    first_file.write_text(sql_job_source(text))
    second_file.write_text(sql_job_source(text))
    params = {"checkpointing.interval": "500ms"}
    first = weir_cluster.submit(str(first_file), params, parallelism=2)
    wait_until(
        weir_cluster,
        first,
        lambda s: s.summary.status == "RUNNING" and (s.last_completed_checkpoint or 0) >= 3,
        "three completed checkpoints",
    )
    savepoint = weir_cluster.client.trigger_savepoint(first, stop=True)
    path = weir_cluster.client.wait_for_savepoint(first, savepoint, 120).external_path
    wait_until(weir_cluster, first, lambda s: s.summary.status == "FINISHED", "the stop", 120)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        so_far = set(conn.execute(f"SELECT n, users FROM {table}").fetchall())
    assert so_far and so_far != expected, "the first job had read everything: nothing to restore"

    weir_cluster.wait_for_taskmanagers()
    second = weir_cluster.client.submit_job(second_file, params, 2, from_checkpoint=path)
    weir_cluster.submitted.append(second)
    final = wait_until(weir_cluster, second, lambda s: s.summary.status == "FINISHED", "the resumed job", 300)
    assert final.summary.status == "FINISHED", final.failure
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        stored = set(conn.execute(f"SELECT n, users FROM {table}").fetchall())
    assert stored == expected  # a job that started over (no state) would count only the rows after the savepoint
