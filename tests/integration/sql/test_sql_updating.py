"""Updating SQL results end to end on the session cluster, against the real Kafka and PostgreSQL
(weir.sql.upsert): a ``postgres-cdc`` table that a writer inserts into, updates and deletes from while
the job runs (a TaskManager running the CDC source killed mid-run), read by one STATEMENT SET:

- a WHERE over the changelog into an exactly-once ``upsert-kafka`` topic and into a ``jdbc`` table (a
  row deleted, or updated so that it stops passing, is deleted: a tombstone in the topic);
- a GROUP BY ... HAVING into ``upsert-kafka`` (a group that stops passing or empties is a tombstone);
- a GROUP BY over a WHERE into a ``jdbc`` table keyed by (bucket, n), wider than the GROUP BY key
  (each update moves the group's row: its -U deletes the old key in the same transaction);
- FILTER (WHERE ...) aggregates over the changelog into ``jdbc``.

Each ends equal to plain Python's over the final source table, as a multiset of whole rows; the
topics read read_committed and compacted by key in offset order (a tombstone deletes its key), and
they must hold tombstones. Then a second, bounded job reads the first topic as an ``upsert-kafka``
table (ChangelogNormalize) into ``jdbc``: the table equals the compacted topic."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster, create_topics
from tests.integration.polling import poll
from tests.integration.sources.test_postgres_cdc import Writer, settled, write_through_a_source_kill
from weir.connectors import kafka, postgres
from weir.core.config import Endpoints
from weir.sql import source_uid
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

INITIAL = 150
JDBC = "'connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{}'"
UPSERT = "'connector' = 'upsert-kafka', 'topic' = '{}', 'key.format' = 'json', 'value.format' = 'json'"


def script(source: str, slot: str, names: dict[str, str]) -> str:
    return f"""
CREATE TABLE src (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'postgres-cdc', 'hostname' = '127.0.0.1', 'port' = '15432', 'username' = 'weir',
        'password' = 'weir', 'database-name' = 'weir', 'schema-name' = 'public', 'table-name' = '{source}',
        'slot.name' = '{slot}', 'decoding.plugin.name' = 'pgoutput',
        'scan.incremental.snapshot.chunk.size' = '64');
CREATE TABLE live_topic (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({UPSERT.format(names["live_topic"])}, 'sink.delivery-guarantee' = 'exactly-once');
CREATE TABLE live_table (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({JDBC.format(names["live_table"])});
CREATE TABLE buckets_topic (bucket BIGINT, n BIGINT, total BIGINT, PRIMARY KEY (bucket) NOT ENFORCED)
  WITH ({UPSERT.format(names["buckets_topic"])});
CREATE TABLE by_n (bucket BIGINT, n BIGINT, total BIGINT, PRIMARY KEY (bucket, n) NOT ENFORCED)
  WITH ({JDBC.format(names["by_n"])});
CREATE TABLE filtered (bucket BIGINT, n BIGINT, rich BIGINT, top BIGINT, PRIMARY KEY (bucket) NOT ENFORCED)
  WITH ({JDBC.format(names["filtered"])});

EXECUTE STATEMENT SET BEGIN
INSERT INTO live_topic SELECT id, name, amount FROM src WHERE amount % 5 <> 0;
INSERT INTO live_table SELECT id, name, amount FROM src WHERE amount % 5 <> 0;
INSERT INTO buckets_topic SELECT amount % 50, COUNT(*), SUM(amount) FROM src GROUP BY amount % 50 HAVING COUNT(*) > 2;
INSERT INTO by_n SELECT amount % 7, COUNT(*), SUM(amount) FROM src WHERE amount > 100 GROUP BY amount % 7;
INSERT INTO filtered SELECT amount % 7, COUNT(*), COUNT(*) FILTER (WHERE amount >= 500),
  MAX(amount) FILTER (WHERE amount < 800) FROM src GROUP BY amount % 7;
END;
"""


def read_back_script(topic: str, table: str) -> str:
    return f"""
CREATE TABLE live (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({UPSERT.format(topic)}, 'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');
CREATE TABLE back (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({JDBC.format(table)});
INSERT INTO back SELECT id, name, amount FROM live;
"""


def _execute(endpoints: Endpoints, statement: sql.Composable, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with postgres.connect(endpoints, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


def rows_of(endpoints: Endpoints, table: str) -> Counter[tuple[Any, ...]]:
    return Counter(_execute(endpoints, sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))))


def compacted(endpoints: Endpoints, topic: str, columns: tuple[str, ...]) -> tuple[Counter[tuple[Any, ...]], int]:
    """The committed records of an upsert topic applied in partition-offset order (a value upserts its
    key's row, a tombstone deletes it), as a multiset of whole rows; and how many tombstones it holds."""
    table: dict[bytes, tuple[Any, ...]] = {}
    tombstones = 0
    for _partition, _offset, key, value, _ts in sorted(kafka.read_committed_records(endpoints, topic)):
        assert key is not None, f"a record without a key in {topic}"
        if value is None:
            tombstones += 1
            table.pop(key, None)
        else:
            row = json.loads(value)
            assert json.loads(key) == {k: row[k] for k in json.loads(key)}, "the key is the row's primary key"
            table[key] = tuple(row[c] for c in columns)
    return Counter(table.values()), tombstones


def expected(final: Iterable[tuple[int, str, int]]) -> dict[str, Counter[tuple[Any, ...]]]:
    """What each sink holds once the job has read the final source table ``final`` (id, name, amount)."""
    live = list(final)
    passing = Counter(r for r in live if r[2] % 5 != 0)
    by50: dict[int, list[int]] = defaultdict(list)
    by7: dict[int, list[int]] = defaultdict(list)
    above: dict[int, list[int]] = defaultdict(list)
    for _id, _name, amount in live:
        by50[amount % 50].append(amount)
        by7[amount % 7].append(amount)
        if amount > 100:
            above[amount % 7].append(amount)
    return {
        "live_topic": passing,
        "live_table": passing,
        "buckets_topic": Counter((b, len(a), sum(a)) for b, a in by50.items() if len(a) > 2),
        "by_n": Counter((b, len(a), sum(a)) for b, a in above.items()),
        "filtered": Counter(
            (b, len(a), sum(1 for x in a if x >= 500), max((x for x in a if x < 800), default=None))
            for b, a in by7.items()
        ),
    }


def test_updating_sql_results_over_a_cdc_table_end_equal_to_python_s_with_tombstones_and_deletes(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    endpoints = weir_cluster.endpoints
    suffix = uuid.uuid4().hex[:10]
    source, slot = f"sqlupd_src_{suffix}", f"weir_sqlupd_{suffix}"
    names = {
        "live_topic": f"sqlupd-live-{unique}",
        "buckets_topic": f"sqlupd-buckets-{unique}",
        "live_table": f"sqlupd_live_{suffix}",
        "by_n": f"sqlupd_by_n_{suffix}",
        "filtered": f"sqlupd_filtered_{suffix}",
        "back": f"sqlupd_back_{suffix}",
    }
    tables = {
        "live_table": "id int PRIMARY KEY, name text, amount int",
        "back": "id int PRIMARY KEY, name text, amount int",
        "by_n": "bucket int, n bigint, total bigint, PRIMARY KEY (bucket, n)",
        "filtered": "bucket int PRIMARY KEY, n bigint, rich bigint, top int",
    }
    src = sql.Identifier(source)
    _execute(endpoints, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(src))
    _execute(endpoints, sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(src))
    for name, columns in tables.items():
        _execute(endpoints, sql.SQL("CREATE TABLE {} (" + columns + ")").format(sql.Identifier(names[name])))
    create_topics(endpoints, {names["live_topic"]: 2, names["buckets_topic"]: 2})
    initial = [(i, f"n{i}", (i * 37) % 1000) for i in range(1, INITIAL + 1)]
    with postgres.connect(endpoints, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(src), initial)
    writer = Writer(endpoints, source, unique, first_id=INITIAL + 1)
    job_file = tmp_path / f"sqlupd_{unique}.py"
    job_file.write_text(sql_job_source(script(source, slot, names)))
    params = {"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "1s"}

    columns = {"buckets_topic": ("bucket", "n", "total"), "live_topic": ("id", "name", "amount")}

    def actual(name: str) -> Counter[tuple[Any, ...]]:
        if name.endswith("_topic"):
            return compacted(endpoints, names[name], columns[name])[0]
        return rows_of(endpoints, names[name])

    job_id = None
    try:
        job_id = weir_cluster.submit(str(job_file), params, parallelism=2)
        first = expected(initial)
        got = settled("the snapshot in the sinks", 240, first["live_table"], lambda: actual("live_table"))
        assert got == first["live_table"]
        write_through_a_source_kill(weir_cluster, job_id, writer, source_uid("src"), more_after=150)
        final = rows_of(endpoints, source)
        want = expected(final.elements())
        for name in ("live_table", "by_n", "filtered", "live_topic", "buckets_topic"):
            assert settled(f"{name} equal to Python's", 240, want[name], lambda n=name: actual(n)) == want[name], name
        for name in ("live_topic", "buckets_topic"):
            assert compacted(endpoints, names[name], columns[name])[1] > 0, f"{name} holds no tombstone"
        weir_cluster.client.cancel_job(job_id)
        wait_until(weir_cluster, job_id, lambda s: s.summary.status == "CANCELED", "the job to cancel", 120)

        # the topic read back as an upsert-kafka table: ChangelogNormalize of its upserts and tombstones
        back_file = tmp_path / f"sqlupd_back_{unique}.py"
        back_file.write_text(sql_job_source(read_back_script(names["live_topic"], names["back"])))
        back_id = weir_cluster.submit(str(back_file), {"checkpointing.interval": "500ms"}, parallelism=2)
        done = wait_until(weir_cluster, back_id, lambda s: s.summary.status == "FINISHED", "the read-back job", 180)
        assert done.summary.status == "FINISHED", done.failure
        assert rows_of(endpoints, names["back"]) == want["live_topic"]
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
        for table in [source] + [names[n] for n in tables]:
            _execute(endpoints, sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def _slot_inactive(endpoints: Endpoints, slot: str) -> bool:
    rows = _execute(endpoints, sql.SQL("SELECT active FROM pg_replication_slots WHERE slot_name = %s"), (slot,))
    return not rows or not rows[0][0]


def upsert_mode_script(source: str, slot: str, copy: str, totals: str) -> str:
    return f"""
CREATE TABLE src (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'postgres-cdc', 'table-name' = '{source}', 'slot.name' = '{slot}',
        'changelog-mode' = 'upsert', 'scan.incremental.snapshot.chunk.size' = '64');
CREATE TABLE copy (id BIGINT, name STRING, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({JDBC.format(copy)});
CREATE TABLE totals (bucket BIGINT, n BIGINT, total BIGINT, PRIMARY KEY (bucket) NOT ENFORCED)
  WITH ({JDBC.format(totals)});
EXECUTE STATEMENT SET BEGIN
INSERT INTO copy SELECT id, name, amount FROM src WHERE amount % 5 <> 0;
INSERT INTO totals SELECT amount % 50, COUNT(*), SUM(amount) FROM src GROUP BY amount % 50 HAVING COUNT(*) > 2;
END;
"""


def test_a_cdc_table_in_upsert_mode_needs_no_old_rows_and_ends_equal_to_python_s(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    """'changelog-mode' = 'upsert' over a table with the default replica identity (old rows absent:
    only a delete's key): the upserts and deleted keys normalized per key (changelog-normalize's
    state restored after the CDC source's TaskManager is killed) give the same results as the old
    rows would: a WHERE's copy and a GROUP BY ... HAVING end equal to Python's over the final table."""
    endpoints = weir_cluster.endpoints
    suffix = uuid.uuid4().hex[:10]
    source, slot = f"sqlups_src_{suffix}", f"weir_sqlups_{suffix}"
    copy, totals = f"sqlups_copy_{suffix}", f"sqlups_totals_{suffix}"
    src = sql.Identifier(source)
    _execute(endpoints, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(src))
    identity = _execute(endpoints, sql.SQL("SELECT relreplident FROM pg_class WHERE relname = %s"), (source,))
    assert identity == [("d",)], "the default replica identity: no old rows"
    _execute(
        endpoints, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(copy))
    )
    _execute(
        endpoints,
        sql.SQL("CREATE TABLE {} (bucket int PRIMARY KEY, n bigint, total bigint)").format(sql.Identifier(totals)),
    )
    initial = [(i, f"n{i}", (i * 37) % 1000) for i in range(1, INITIAL + 1)]
    with postgres.connect(endpoints, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(src), initial)
    writer = Writer(endpoints, source, unique, first_id=INITIAL + 1)
    job_file = tmp_path / f"sqlups_{unique}.py"
    job_file.write_text(sql_job_source(upsert_mode_script(source, slot, copy, totals)))
    params = {"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "1s"}
    job_id = None
    try:
        job_id = weir_cluster.submit(str(job_file), params, parallelism=2)
        first = expected(initial)["live_table"]
        assert settled("the snapshot in the copy", 240, first, lambda: rows_of(endpoints, copy)) == first
        write_through_a_source_kill(weir_cluster, job_id, writer, source_uid("src"), more_after=150)
        final = rows_of(endpoints, source)
        want = expected(final.elements())
        got = settled("the copy equal to Python's", 240, want["live_table"], lambda: rows_of(endpoints, copy))
        assert got == want["live_table"]
        got = settled("the totals equal to Python's", 240, want["buckets_topic"], lambda: rows_of(endpoints, totals))
        assert got == want["buckets_topic"]
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
