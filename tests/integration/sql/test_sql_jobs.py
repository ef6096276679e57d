"""A streaming SQL job (weir.sql) on the session cluster at parallelism 2: a bounded read of a Kafka
topic, one STATEMENT SET with a TUMBLE window aggregation into an exactly-once Kafka topic and an
updating GROUP BY into a PostgreSQL table (two-phase commit, upsert on the primary key). The job
finishes and both sinks hold exactly what plain Python computes over the same rows (Kafka: a multiset
of whole records; PostgreSQL: the final table), and what ``assert_sinks_exact`` checks (the reference
run, the commit proofs, no transaction left open)."""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster, assert_sinks_exact, create_topics
from weir.connectors import kafka
from weir.tools.cli import sql_job_source
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

ROWS = 3_000
BASE_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC
WINDOW_MS = 10_000


def script(source: str, sink: str, table: str, pace: str = "") -> str:
    return f"""
CREATE TABLE orders (
  id BIGINT, u STRING, amount BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json',{pace}
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


@dataclass(frozen=True)
class Case:
    source: str
    sink: str
    table: str
    expected_windows: Counter[str]
    expected_users: set[tuple[str, int, int]]


def prepare(cluster: WeirCluster, unique: str) -> Case:
    """The input topic loaded, the sink topic and table created; what plain Python computes."""
    endpoints = cluster.endpoints
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
    return Case(source, sink, table, expected_windows, expected_users)


def assert_exact(cluster: WeirCluster, case: Case) -> None:
    """The Kafka topic (read_committed) and the table hold exactly what plain Python computes."""
    committed = Counter(
        json.dumps(json.loads(value), sort_keys=True)
        for _, _, _, value in kafka.read_all(cluster.endpoints, case.sink)
        if value is not None
    )
    assert committed == case.expected_windows
    with psycopg.connect(cluster.endpoints.postgres_dsn) as conn:
        stored = set(conn.execute(f"SELECT u, n, total FROM {case.table}").fetchall())
    assert stored == case.expected_users


def test_a_sql_statement_set_writes_kafka_and_postgresql_exactly(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    case = prepare(weir_cluster, unique)
    job_file = tmp_path / f"sql_{unique}.py"
    job_file.write_text(sql_job_source(script(case.source, case.sink, case.table)))
    params = {"checkpointing.interval": "500ms"}
    job_id = weir_cluster.submit(str(job_file), params, parallelism=2)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the SQL job to finish", 180)
    assert final.summary.status == "FINISHED", final.failure
    assert_exact(weir_cluster, case)
    assert_sinks_exact(job_file, params, job_id, weir_cluster.endpoints)


MINI_BATCH = (
    "SET 'table.exec.mini-batch.enabled' = 'true';\nSET 'table.exec.mini-batch.allow-latency' = '300 ms';\n"
    "SET 'table.exec.mini-batch.size' = '40';\n"
)
"""Batches cut by their size, their latency and every checkpoint (500 ms) alike, at 60 rows a second."""


@pytest.mark.parametrize("mini_batch", [False, True], ids=["per-row", "mini-batch"])
def test_a_sql_job_through_a_taskmanager_kill_and_a_stop_with_savepoint_resumes_exactly(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path, mini_batch: bool
) -> None:
    """The same SQL, resubmitted from the savepoint its first job stopped with, has the same operator
    uids: it restores their state (Kafka positions, window and GROUP BY state, the sinks' ledgers) and
    the two jobs' committed output together is exact, after a TaskManager was killed in the first.
    In mini-batches (the GROUP BY's rows buffered per key), each snapshot applies the buffer first:
    the same exact output."""
    case = prepare(weir_cluster, unique)
    settings = MINI_BATCH if mini_batch else ""
    paced = settings + script(case.source, case.sink, case.table, pace=" 'scan.records-per-second' = '60',")
    first_file, second_file = tmp_path / f"sql_{unique}.py", tmp_path / f"sql_{unique}_again.py"
    first_file.write_text(sql_job_source(paced))
    # The resumed job reads the rest unpaced (only the first had to be caught mid-run): a table option
    # is no part of an operator's uid, so the same statements restore the same state.
    second_file.write_text(sql_job_source(settings + script(case.source, case.sink, case.table)))
    params = {"checkpointing.interval": "500ms", "restart.strategy": "fixed-delay", "restart.delay": "1s"}
    first = weir_cluster.submit(str(first_file), params, parallelism=2)
    status = wait_until(
        weir_cluster,
        first,
        lambda s: s.summary.status == "RUNNING" and (s.last_completed_checkpoint or 0) >= 2,
        "two completed checkpoints",
    )
    # a TaskManager that runs some of the job's tasks (one that runs none would test no recovery)
    victim = random.Random(unique).choice(sorted({str(t.taskmanager_id) for t in status.tasks}))
    assert process_running(weir_cluster, victim), f"{victim} runs the job's tasks but is not running"
    killed_at, killed_wall = status.last_completed_checkpoint or 0, time.time()
    kill_process(weir_cluster.directory, victim)
    wait_until(
        weir_cluster,
        first,
        lambda s: (
            s.summary.status == "RUNNING"
            and s.last_restore_at is not None
            and s.last_restore_at >= killed_wall
            and (s.last_completed_checkpoint or 0) > killed_at
        ),
        f"recovery after killing {victim} and a checkpoint after it",
    )
    savepoint = weir_cluster.client.trigger_savepoint(first, stop=True)
    path = weir_cluster.client.wait_for_savepoint(first, savepoint, 120).external_path
    wait_until(weir_cluster, first, lambda s: s.summary.status == "FINISHED", "the stop", 120)
    so_far = [v for _, _, _, v in kafka.read_all(weir_cluster.endpoints, case.sink) if v is not None]
    assert len(so_far) < sum(case.expected_windows.values()), "the first job had written everything: no resume"

    weir_cluster.wait_for_taskmanagers()
    second = weir_cluster.client.submit_job(second_file, params, 2, from_checkpoint=path)
    weir_cluster.submitted.append(second)
    final = wait_until(weir_cluster, second, lambda s: s.summary.status == "FINISHED", "the resumed job", 240)
    assert final.summary.status == "FINISHED", final.failure
    # a job that started over (other uids: nothing restored) would write the first job's results again
    assert_exact(weir_cluster, case)
    assert_sinks_exact(second_file, params, second, weir_cluster.endpoints, earlier_job_ids=(first,))
