"""A ``'connector' = 'postgres-cdc'`` table in SQL (weir.sql.cdc): its options, the changelog each
change event gives, what the planner refuses (one line, line:col), and a history's changelog applied by key as the
'jdbc' sink does, which must leave the source's final table as a multiset of whole rows. The jobs,
on the cluster against the real PostgreSQL with a TaskManager killed:
tests/integration/sql/test_postgres_cdc_sql.py."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.unit.weir.sql.test_retract import final_table
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.api.environment import Environment
from weir.core.cdc import ChangeEvent, ChangeOp
from weir.sql import plan_script, sql
from weir.sql.catalog import PostgresCdcTable
from weir.sql.cdc import CdcChanges, CdcUpserts
from weir.sql.changelog import Change, RowKind
from weir.sql.compile import source_uid
from weir.sql.errors import SqlError

CDC = """CREATE TABLE accounts (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'postgres-cdc', 'hostname' = '127.0.0.1', 'port' = '15432', 'username' = 'weir',
        'password' = 'weir', 'database-name' = 'weir', 'schema-name' = 'public', 'table-name' = 'accounts',
        'slot.name' = 'accounts_sql', 'decoding.plugin.name' = 'pgoutput'{extra});
"""
JDBC = "'connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = '{name}'"
COPY = (
    "CREATE TABLE copy (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED)\n"
    f"  WITH ({JDBC.format(name='copy')});\n"
)
TOTALS = (
    "CREATE TABLE totals (owner STRING, n BIGINT, total BIGINT, top BIGINT, PRIMARY KEY (owner) NOT ENFORCED)\n"
    f"  WITH ({JDBC.format(name='totals')});\n"
)


def script(body: str, extra: str = "") -> str:
    return CDC.format(extra=extra) + body


def test_the_options_are_flink_cdcs_and_typed() -> None:
    table = plan_script(script(COPY + "INSERT INTO copy SELECT id, owner, balance FROM accounts;")).tables["accounts"]
    assert table.connector == PostgresCdcTable("public", "accounts", "accounts_sql", 8096)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (", 'decoding.plugin.name' = 'decoderbufs'", "option 'decoding.plugin.name' = 'decoderbufs' is not supported"),
        (", 'changelog-mode' = 'retract'", "option 'changelog-mode' = 'retract' is not supported"),
        (", 'scan.startup.mode' = 'latest-offset'", "option 'scan.startup.mode' = 'latest-offset' is not supported"),
        (", 'slot.drop' = 'true'", "option 'slot.drop' is not supported"),
    ],
)
def test_an_option_weir_cannot_honour_is_refused_with_its_position(extra: str, message: str) -> None:
    text = CDC.replace(", 'decoding.plugin.name' = 'pgoutput'", "").format(extra=extra)
    with pytest.raises(SqlError, match=message) as caught:
        plan_script(text)
    assert str(caught.value).startswith("SQL 4:39: table accounts: option"), str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("upsert", [False, True], ids=["all", "upsert"])
def test_scan_parallelism_reads_the_table_with_that_many_subtasks(upsert: bool) -> None:
    """FLIP-367's option: the CDC source and its changes' decoding (chained to it) at 3, the rest at the job's."""
    mode = ", 'changelog-mode' = 'upsert'" if upsert else ""
    text = script(
        COPY + "INSERT INTO copy SELECT id, owner, balance FROM accounts;", ", 'scan.parallelism' = '3'" + mode
    )
    connector = plan_script(text).tables["accounts"].connector
    assert isinstance(connector, PostgresCdcTable) and connector.parallelism == 3
    env = Environment("cdc", parallelism=2)
    sql(env, text)
    graph = env.graph
    uid = source_uid("accounts")
    assert graph.parallelism_of(uid) == 3
    assert graph.parallelism_of(f"{uid}-changes") == 3
    assert 2 in {graph.parallelism_of(u) for u in graph.transformations}, "the sink at the job's"
    default = Environment("cdc", parallelism=2)
    sql(default, script(COPY + "INSERT INTO copy SELECT id, owner, balance FROM accounts;"))
    assert default.graph.parallelism_of(uid) == 1, "one reader unless asked"
    assert default.graph.parallelism_of(f"{uid}-changes") == 1


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_scan_parallelism_below_1_or_not_a_number_is_refused_with_its_position(value: str) -> None:
    with pytest.raises(SqlError, match=f"option 'scan.parallelism' = '{value}' is not") as caught:
        plan_script(script("", f", 'scan.parallelism' = '{value}'"))
    assert "\n" not in str(caught.value)


def test_a_table_without_slot_or_primary_key_is_refused() -> None:
    with pytest.raises(SqlError, match="option 'slot.name' is required"):
        plan_script(CDC.replace("'slot.name' = 'accounts_sql', ", "").format(extra=""))
    with pytest.raises(SqlError, match="'postgres-cdc' table is a changelog by its PRIMARY KEY"):
        plan_script(CDC.replace(", PRIMARY KEY (id) NOT ENFORCED", "").format(extra=""))


def event(op: ChangeOp, before: dict[str, Any] | None, after: dict[str, Any] | None) -> ChangeEvent:
    return ChangeEvent(op, "public.accounts", before, after, lsn=1, xid=None if op is ChangeOp.READ else 7)


def changes_of(e: ChangeEvent) -> list[Change]:
    table = plan_script(script("")).tables["accounts"]
    return CdcChanges(table, dict)(e)


def test_each_change_event_is_its_changelog() -> None:
    a = {"id": 1, "owner": "ada", "balance": 5}
    b = {"id": 1, "owner": "ada", "balance": 9}
    moved = {"id": 2, "owner": "ada", "balance": 9}
    assert changes_of(event(ChangeOp.READ, None, a)) == [Change(RowKind.INSERT, a)]
    assert changes_of(event(ChangeOp.INSERT, None, a)) == [Change(RowKind.INSERT, a)]
    assert changes_of(event(ChangeOp.UPDATE, a, b)) == [
        Change(RowKind.UPDATE_BEFORE, a),
        Change(RowKind.UPDATE_AFTER, b),
    ]
    assert changes_of(event(ChangeOp.UPDATE, a, moved)) == [Change(RowKind.DELETE, a), Change(RowKind.INSERT, moved)]
    assert changes_of(event(ChangeOp.DELETE, a, None)) == [Change(RowKind.DELETE, a)]
    # an unchanged TOASTed value is absent from `after`: the old row gives it
    assert changes_of(event(ChangeOp.UPDATE, a, {"id": 1, "balance": 9})) == [
        Change(RowKind.UPDATE_BEFORE, a),
        Change(RowKind.UPDATE_AFTER, b),
    ]


@pytest.mark.parametrize(
    "e",
    [event(ChangeOp.UPDATE, None, {"id": 1, "owner": "x", "balance": 1}), event(ChangeOp.DELETE, {"id": 1}, None)],
)
def test_a_change_without_the_whole_old_row_names_replica_identity_full(e: ChangeEvent) -> None:
    with pytest.raises(ValueError, match="REPLICA IDENTITY FULL") as caught:
        changes_of(e)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("body", "message", "where"),
    [
        (
            "CREATE TABLE copy (id BIGINT, owner STRING, balance BIGINT)\n"
            "  WITH ('connector' = 'kafka', 'topic' = 'c', 'format' = 'json');\n"
            "INSERT INTO copy SELECT id, owner, balance FROM accounts;",
            "needs a 'jdbc' or 'upsert-kafka' sink",
            "7:",
        ),
    ],
)
def test_what_a_changelog_cannot_do_is_refused_with_its_position(body: str, message: str, where: str) -> None:
    with pytest.raises(SqlError, match=message) as caught:
        plan_script(script(body))
    assert str(caught.value).startswith(f"SQL {where}"), str(caught.value)
    assert "\n" not in str(caught.value)


def history() -> tuple[list[ChangeEvent], dict[int, dict[str, Any]]]:
    """A snapshot of 30 rows, then inserts, updates (a key moved too) and deletes; the final table."""
    table: dict[int, dict[str, Any]] = {}
    events = []
    for i in range(30):
        table[i] = {"id": i, "owner": f"o{i % 4}", "balance": i * 3}
        events.append(event(ChangeOp.READ, None, table[i]))
    for step in range(120):
        i = (step * 7) % 45
        if i not in table:
            table[i] = {"id": i, "owner": f"o{step % 5}", "balance": step}
            events.append(event(ChangeOp.INSERT, None, table[i]))
        elif step % 3 == 0:
            events.append(event(ChangeOp.DELETE, table.pop(i), None))
        elif step % 11 == 0 and i + 100 not in table:
            old = table.pop(i)
            table[i + 100] = {**old, "id": i + 100}
            events.append(event(ChangeOp.UPDATE, old, table[i + 100]))
        else:
            old = table[i]
            table[i] = {**old, "owner": f"o{step % 6}", "balance": old["balance"] + step}
            events.append(event(ChangeOp.UPDATE, old, table[i]))
    return events, table


def rows(table: dict[int, dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True) for r in table.values())


def test_the_changelog_of_a_history_applied_by_key_is_the_final_table() -> None:
    """What the 'jdbc' sink does with a projection's changelog (-U dropped, +I/+U upsert, -D delete)
    leaves the source's final table; the job on the cluster: tests/integration/sql/test_postgres_cdc_sql.py."""
    events, final = history()
    changes = [c for e in events for c in changes_of(e) if c.kind is not RowKind.UPDATE_BEFORE]
    assert {c.kind for c in changes} == {RowKind.INSERT, RowKind.UPDATE_AFTER, RowKind.DELETE}
    assert final_table(changes, ("id",)) == rows(final)


# -- 'changelog-mode' = 'upsert': no old row needed, normalized (weir.sql.upsert) ----------------------------


def upserts_of(e: ChangeEvent) -> list[Change]:
    table = plan_script(script("", extra=", 'changelog-mode' = 'upsert'")).tables["accounts"]
    assert isinstance(table.connector, PostgresCdcTable) and table.connector.upsert
    return CdcUpserts(table, lambda r: {c: r.get(c) for c in ("id", "owner", "balance")})(e)


def test_in_upsert_mode_each_change_event_is_an_upsert_or_a_deleted_key() -> None:
    a = {"id": 1, "owner": "ada", "balance": 5}
    b = {"id": 1, "owner": "ada", "balance": 9}
    moved = {"id": 2, "owner": "ada", "balance": 9}
    key1 = {"id": 1, "owner": None, "balance": None}
    assert upserts_of(event(ChangeOp.READ, None, a)) == [Change(RowKind.UPDATE_AFTER, a)]
    assert upserts_of(event(ChangeOp.INSERT, None, a)) == [Change(RowKind.UPDATE_AFTER, a)]
    assert upserts_of(event(ChangeOp.UPDATE, None, b)) == [Change(RowKind.UPDATE_AFTER, b)]  # REPLICA IDENTITY DEFAULT
    assert upserts_of(event(ChangeOp.UPDATE, a, b)) == [Change(RowKind.UPDATE_AFTER, b)]  # FULL: the key is the same
    assert upserts_of(event(ChangeOp.UPDATE, {"id": 1}, moved)) == [
        Change(RowKind.DELETE, key1),
        Change(RowKind.UPDATE_AFTER, moved),
    ]
    assert upserts_of(event(ChangeOp.DELETE, {"id": 1}, None)) == [Change(RowKind.DELETE, key1)]


@pytest.mark.parametrize(
    ("e", "message"),
    [
        (event(ChangeOp.DELETE, None, None), r"without the old row's primary key \(id\)"),
        (event(ChangeOp.UPDATE, None, {"id": 1, "balance": 9}), r"without column\(s\) owner \(unchanged TOASTed"),
    ],
)
def test_in_upsert_mode_a_change_it_cannot_place_is_one_line(e: ChangeEvent, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        upserts_of(e)
    assert "\n" not in str(caught.value)


def test_in_upsert_mode_a_history_without_old_rows_normalized_and_applied_by_key_is_the_final_table() -> None:
    """The history's events as REPLICA IDENTITY DEFAULT gives them (no old row but a delete's key, and
    an update's when it changes the key), through CdcUpserts and ChangelogNormalize per key, then the
    'jdbc' sink's writes: the source's final table; the normalized changelog retracts only rows it
    inserted (whole)."""
    from weir.sql.upsert import normalized

    events, final = history()
    last: dict[Any, Any] = {}
    changes = []
    for e in events:
        before = e.before
        if e.op is ChangeOp.UPDATE and before is not None:
            before = {"id": before["id"]} if before["id"] != (e.after or {})["id"] else None
        elif e.op is ChangeOp.DELETE and before is not None:
            before = {"id": before["id"]}
        for change in upserts_of(ChangeEvent(e.op, e.table, before, e.after, e.lsn, e.xid)):
            step = normalized(last.get(change.row["id"]), change)
            last[change.row["id"]] = step.last
            changes.extend(step.changes)
    live: Counter[str] = Counter()
    for c in changes:
        text = json.dumps(dict(c.row), sort_keys=True)
        if c.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            live[text] += 1
        else:
            assert live[text] > 0, f"{c} retracts a row never inserted"
            live[text] -= 1
    assert +live == rows(final)
    writes = [c for c in changes if c.kind is not RowKind.UPDATE_BEFORE]
    assert final_table(writes, ("id",)) == rows(final)


def test_explain_shows_the_upsert_mode_s_normalizer() -> None:
    from weir.sql import explain

    text = explain(
        script(COPY + "INSERT INTO copy SELECT id, owner, balance FROM accounts;", ", 'changelog-mode' = 'upsert'")
    )
    assert "sql-source-accounts-changes  changes: the changes of public.accounts as upserts +U/-D" in text
    assert "sql-source-accounts-normalize  changelog-normalize: the last row per key of accounts" in text
