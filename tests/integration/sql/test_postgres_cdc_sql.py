"""A SQL job reading a ``'connector' = 'postgres-cdc'`` table (weir.sql.cdc) on the session cluster,
against the real PostgreSQL: a writer inserts, updates and deletes rows of the source table while the
job runs, the CDC source's TaskManager is killed mid-run, and one STATEMENT SET writes a projection of
the changelog (into a 'jdbc' copy keyed as the source) and a retracting GROUP BY over it (into a
'jdbc' table of totals). Both end exact: the copy equals the source table as a multiset of whole rows,
the totals equal plain Python's over the final source table. Once with aligned checkpoints, once
with unaligned ones (``checkpointing.unaligned``), once with the table read by two subtasks
(``'scan.parallelism' = '2'``: a parallel snapshot, then subtask 0 streams). Each run has its own
tables and slot, dropped after."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster
from tests.integration.polling import poll
from tests.integration.sources.test_postgres_cdc import Writer, settled, write_through_a_source_kill
from weir.connectors import postgres
from weir.core.config import Endpoints
from weir.sql import source_uid
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

INITIAL = 200
BUCKETS = 7


def script(source: str, slot: str, copy: str, totals: str, scan_parallelism: int = 1) -> str:
    return f"""
CREATE TABLE src (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'postgres-cdc', 'hostname' = '127.0.0.1', 'port' = '15432', 'username' = 'weir',
        'password' = 'weir', 'database-name' = 'weir', 'schema-name' = 'public', 'table-name' = '{source}',
        'slot.name' = '{slot}', 'decoding.plugin.name' = 'pgoutput',
        'scan.incremental.snapshot.chunk.size' = '64', 'scan.parallelism' = '{scan_parallelism}');

CREATE TABLE copy (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{copy}');

CREATE TABLE totals (bucket BIGINT, n BIGINT, total BIGINT, top BIGINT, PRIMARY KEY (bucket) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{totals}');

EXECUTE STATEMENT SET BEGIN
INSERT INTO copy SELECT id, name, amount FROM src;
INSERT INTO totals SELECT amount % {BUCKETS}, COUNT(*), SUM(amount), MAX(amount) FROM src GROUP BY amount % {BUCKETS};
END;
"""


def _execute(endpoints: Endpoints, statement: sql.Composable, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with postgres.connect(endpoints, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


def _slot_inactive(endpoints: Endpoints, slot: str) -> bool:
    rows = _execute(endpoints, sql.SQL("SELECT active FROM pg_replication_slots WHERE slot_name = %s"), (slot,))
    return not rows or not rows[0][0]


def expected_totals(source: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    groups: dict[int, list[int]] = defaultdict(list)
    for (_id, _name, amount), times in source.items():
        groups[amount % BUCKETS].extend([amount] * times)
    return Counter((b, len(a), sum(a), max(a)) for b, a in groups.items())


@pytest.mark.parametrize(
    ("unaligned", "scan_parallelism"),
    [(False, 1), (True, 1), (False, 2)],
    ids=["aligned", "unaligned", "scan-parallelism-2"],  # a parallel snapshot needs aligned checkpoints
)
def test_a_sql_job_over_a_cdc_table_through_a_taskmanager_kill_ends_equal_to_the_source(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path, unaligned: bool, scan_parallelism: int
) -> None:
    endpoints = weir_cluster.endpoints
    suffix = uuid.uuid4().hex[:10]
    source, copy, totals = f"sqlcdc_src_{suffix}", f"sqlcdc_copy_{suffix}", f"sqlcdc_totals_{suffix}"
    slot = f"weir_sqlcdc_{suffix}"
    src = sql.Identifier(source)
    _execute(endpoints, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(src))
    _execute(endpoints, sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(src))  # the old row of -U / -D
    _execute(
        endpoints, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(copy))
    )
    _execute(
        endpoints,
        sql.SQL("CREATE TABLE {} (bucket int PRIMARY KEY, n bigint, total bigint, top int)").format(
            sql.Identifier(totals)
        ),
    )
    initial = [(i, f"n{i}", i * 10) for i in range(1, INITIAL + 1)]
    with postgres.connect(endpoints, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(src), initial)
    writer = Writer(endpoints, source, unique, first_id=INITIAL + 1)
    job_file = tmp_path / f"sqlcdc_{unique}.py"
    job_file.write_text(sql_job_source(script(source, slot, copy, totals, scan_parallelism)))
    params = {
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        "checkpointing.unaligned": "true" if unaligned else "false",
    }

    def rows_of(table: str) -> Counter[tuple[Any, ...]]:
        return Counter(_execute(endpoints, sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))))

    job_id = None
    try:
        job_id = weir_cluster.submit(str(job_file), params, parallelism=2)
        assert settled("the snapshot in the copy", 180, Counter(initial), lambda: rows_of(copy)) == Counter(initial)
        tasks = weir_cluster.client.job_status(job_id).tasks
        assert sum(1 for task in tasks if task.vertex_uid == source_uid("src")) == scan_parallelism
        write_through_a_source_kill(weir_cluster, job_id, writer, source_uid("src"), more_after=100)
        final = rows_of(source)
        assert {r[0] for r in final} == writer.live, "the writer's view is the table's"
        assert settled("the copy equal to the source table", 240, final, lambda: rows_of(copy)) == final
        want = expected_totals(final)
        assert settled("the totals equal Python's", 240, want, lambda: rows_of(totals)) == want
        weir_cluster.client.cancel_job(job_id)
        wait_until(weir_cluster, job_id, lambda s: s.summary.status == "CANCELED", "the job to cancel", 120)
    finally:
        writer.stop.set()
        if job_id is not None:
            poll("the slot released by the job", 120, lambda: _slot_inactive(endpoints, slot) or None)
        _execute(
            endpoints,
            sql.SQL("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s"),
            (slot,),
        )
        _execute(endpoints, sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))
        for table in (source, copy, totals):
            _execute(endpoints, sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
