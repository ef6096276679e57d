"""Updating results into and out of keyed tables (weir.sql.upsert): the pure decisions (what an upsert
sink writes for each change, Flink's ChangelogNormalize, an upsert-kafka record as a change), each
over every case; then SQL jobs in this process (``weir_job``: the job's own operators and checkpoints,
no services) whose sinks' final tables (each sink's writes applied in order: an upsert writes its
key's row, a delete or tombstone removes it) equal, as multisets of whole rows, what plain Python
computes over the same input. The same SQL on the cluster against the real Kafka and PostgreSQL:
tests/integration/sql/test_sql_updating.py."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_retract import JDBC, UPSERT, job_file
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.core.descriptors import KafkaRecord, TimestampType
from weir.sql import explain, plan_script, source_uid
from weir.sql.catalog import KafkaLayout
from weir.sql.changelog import Change, RowKind
from weir.sql.errors import SqlError
from weir.sql.upsert import NormalizeStep, SinkWrite, UpsertKafkaRecords, normalized, sink_write

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

# -- sink_write: every kind, with and without -U kept ---------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "kept", "write"),
    [
        (RowKind.INSERT, False, SinkWrite.UPSERT),
        (RowKind.INSERT, True, SinkWrite.UPSERT),
        (RowKind.UPDATE_AFTER, False, SinkWrite.UPSERT),
        (RowKind.UPDATE_AFTER, True, SinkWrite.UPSERT),
        (RowKind.DELETE, False, SinkWrite.DELETE),
        (RowKind.DELETE, True, SinkWrite.DELETE),
        (RowKind.UPDATE_BEFORE, False, SinkWrite.NOTHING),
        (RowKind.UPDATE_BEFORE, True, SinkWrite.DELETE),
    ],
)
def test_an_upsert_sink_writes_each_kind_as_flink_s_upsert_sinks_do(
    kind: RowKind, kept: bool, write: SinkWrite
) -> None:
    assert sink_write(kind, keeps_update_before=kept) is write


def test_every_kind_and_setting_has_a_case() -> None:
    cases = {(k, kept) for k in RowKind for kept in (False, True)}
    assert len(cases) == 8  # the table above lists each once


# -- normalized: Flink's ChangelogNormalize --------------------------------------------------------------

A = {"id": 1, "v": "a"}
B = {"id": 1, "v": "b"}
KEY_ONLY = {"id": 1, "v": None}


@pytest.mark.parametrize(
    ("last", "change", "step"),
    [
        (None, Change(RowKind.UPDATE_AFTER, A), NormalizeStep((Change(RowKind.INSERT, A),), A)),
        (None, Change(RowKind.INSERT, A), NormalizeStep((Change(RowKind.INSERT, A),), A)),
        (A, Change(RowKind.UPDATE_AFTER, A), NormalizeStep((), A)),
        (A, Change(RowKind.INSERT, A), NormalizeStep((), A)),
        (
            A,
            Change(RowKind.UPDATE_AFTER, B),
            NormalizeStep((Change(RowKind.UPDATE_BEFORE, A), Change(RowKind.UPDATE_AFTER, B)), B),
        ),
        (
            A,
            Change(RowKind.INSERT, B),
            NormalizeStep((Change(RowKind.UPDATE_BEFORE, A), Change(RowKind.UPDATE_AFTER, B)), B),
        ),
        (A, Change(RowKind.DELETE, KEY_ONLY), NormalizeStep((Change(RowKind.DELETE, A),), None)),
        (None, Change(RowKind.DELETE, KEY_ONLY), NormalizeStep((), None)),
        (A, Change(RowKind.UPDATE_BEFORE, B), NormalizeStep((), A)),
        (None, Change(RowKind.UPDATE_BEFORE, B), NormalizeStep((), None)),
    ],
)
def test_an_upsert_record_becomes_whole_row_changes_from_the_key_s_last_row(
    last: dict[str, Any] | None, change: Change, step: NormalizeStep
) -> None:
    assert normalized(last, change) == step


def test_normalizing_a_random_upsert_history_retracts_exactly_what_it_inserted() -> None:
    """Over any sequence of upserts and deletes of a few keys, the normalized changelog's +I/+U minus
    its -U/-D is the final table, each -U/-D retracting the row the key held (whole)."""
    rng = random.Random(7)
    table: dict[int, dict[str, Any]] = {}
    last: dict[int, Any] = {}
    live: Counter[str] = Counter()
    for _ in range(2_000):
        key = rng.randrange(6)
        if rng.random() < 0.3:
            change = Change(RowKind.DELETE, {"id": key, "v": None})
            table.pop(key, None)
        else:
            row = {"id": key, "v": rng.choice("abc")}
            change = Change(RowKind.UPDATE_AFTER, row)
            table[key] = row
        step = normalized(last.get(key), change)
        last[key] = step.last
        for out in step.changes:
            text = json.dumps(dict(out.row), sort_keys=True)
            if out.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                live[text] += 1
            else:
                assert live[text] > 0, f"{out} retracts a row not in the result"
                live[text] -= 1
    assert +live == Counter(json.dumps(r, sort_keys=True) for r in table.values())


# -- UpsertKafkaRecords ----------------------------------------------------------------------------------


def record(key: bytes | None, value: bytes | None) -> KafkaRecord:
    return KafkaRecord("t", 0, 0, key, value, 0, TimestampType(0), ())


def decode(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": row.get("id"), "v": row.get("v")}


def decode_key(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": row.get("id"), "v": None}


RECORDS = UpsertKafkaRecords("t", KafkaLayout((("id", "id"),), ("id", "v")), decode, decode_key)


def test_a_value_is_an_upsert_and_a_tombstone_the_delete_of_its_key() -> None:
    assert RECORDS(record(b'{"id": 1}', b'{"id": 1, "v": "a"}')) == Change(RowKind.UPDATE_AFTER, A)
    assert RECORDS(record(b'{"id": 1}', None)) == Change(RowKind.DELETE, KEY_ONLY)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (None, b'{"id": 1, "v": "a"}', "a record without a key"),
        (b'{"other": 1}', b'{"id": 1, "v": "a"}', r"not a JSON object of the primary key \(id\)"),
        (b"[1]", None, r"not a JSON object of the primary key \(id\)"),
        (b'{"id": 2}', b'{"id": 1, "v": "a"}', "the value's primary key columns are not the record key's"),
        (b'{"id": 1}', b"[1, 2]", "a row is a JSON object, not list"),
    ],
)
def test_a_record_that_is_no_upsert_of_its_key_is_one_line(
    key: bytes | None, value: bytes | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        RECORDS(record(key, value))
    assert "\n" not in str(raised.value)


# -- SQL jobs in this process --------------------------------------------------------------------------------

ORDERS = """CREATE TABLE orders (id BIGINT, u STRING, amount BIGINT)
  WITH ('connector' = 'kafka', 'topic' = 'orders', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset');
"""
ACCOUNTS = """CREATE TABLE accounts (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'accounts', 'key.format' = 'json', 'value.format' = 'json');
"""


def sink_table(values: Iterable[Any], key: Sequence[str], kept: bool) -> Counter[str]:
    """The table an upsert sink's changes leave, each written as the sink writes it (``kept``: the
    plan keeps -U, which delete their key), as a multiset of whole rows."""
    table: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for change in values:
        assert isinstance(change, Change), change
        at = tuple(change.row[k] for k in key)
        write = sink_write(change.kind, keeps_update_before=kept)
        if write is SinkWrite.UPSERT:
            table[at] = change.row
        elif write is SinkWrite.DELETE:
            table.pop(at, None)  # Kafka's compaction and PostgreSQL's DELETE: a missing key is no error
        else:
            assert write is SinkWrite.NOTHING and not kept
    return Counter(json.dumps(dict(r), sort_keys=True) for r in table.values())


def rows(table: Iterable[Mapping[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(dict(r), sort_keys=True) for r in table)


def sinks_of(run: Any, script: str) -> dict[str, list[Any]]:
    """Each INSERT's sink values, by its sink table's name, and the sink's keeps_update_before."""
    out: dict[str, list[Any]] = {}
    for statement in plan_script(script).inserts:
        (uid,) = [u for u in run.sinks if u.startswith(statement.uid_prefix + "-") and u.endswith("-sink")]
        out[statement.plan.sink.table.name] = run.sinks[uid]
    return out


def kept_of(script: str) -> dict[str, bool]:
    return {s.plan.sink.table.name: s.plan.sink.keeps_update_before for s in plan_script(script).inserts}


def order_rows(n: int = 400) -> list[dict[str, Any]]:
    rng = random.Random(11)
    return [{"id": i, "u": f"u{rng.randrange(9)}", "amount": rng.randrange(100)} for i in range(n)]


HAVING = (
    ORDERS
    + f"""CREATE TABLE small (u STRING, n BIGINT, top BIGINT, PRIMARY KEY (u) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE small_pg (u STRING, n BIGINT, top BIGINT, PRIMARY KEY (u) NOT ENFORCED) WITH ({JDBC});
EXECUTE STATEMENT SET BEGIN
INSERT INTO small SELECT u, COUNT(*), MAX(amount) FROM orders GROUP BY u HAVING MAX(amount) < 97;
INSERT INTO small_pg SELECT u, COUNT(*), MAX(amount) FROM orders GROUP BY u HAVING MAX(amount) < 97;
END;
"""
)


def test_a_group_by_having_deletes_a_group_that_stops_passing_in_both_upsert_sinks(
    tmp_path: Path, weir_job: RunJob
) -> None:
    """A group whose MAX reaches 97 leaves the result: its -U passes HAVING and its +U does not, so the
    sinks delete it (upsert-kafka: a tombstone); the final tables equal plain Python's."""
    data = order_rows()
    run = weir_job(job_file(tmp_path, HAVING), sources={source_uid("orders"): [json.dumps(r) for r in data]})
    groups: dict[str, list[int]] = defaultdict(list)
    for r in data:
        groups[r["u"]].append(r["amount"])
    want = rows({"u": u, "n": len(a), "top": max(a)} for u, a in groups.items() if max(a) < 97)
    left = {u for u, a in groups.items() if max(a) >= 97}
    assert want and left, "some groups stay, some leave"
    sinks, kept = sinks_of(run, HAVING), kept_of(HAVING)
    assert kept == {"small": True, "small_pg": True}
    for name in ("small", "small_pg"):
        assert sink_table(sinks[name], ("u",), kept[name]) == want
        written = [sink_write(c.kind, keeps_update_before=True) for c in sinks[name]]
        assert SinkWrite.DELETE in written  # the groups that left were deleted, not left behind
    assert "-U delete their key" in explain(HAVING)
    run.with_failures()


def account_history(seed: int, steps: int = 600) -> tuple[list[Change], dict[int, dict[str, Any]]]:
    """An upsert-kafka topic's records (as the source decodes them: +U of a row, -D of a key) over
    inserts, updates (an owner changed, a balance changed, the same row again) and deletes; the final
    table."""
    rng = random.Random(seed)
    table: dict[int, dict[str, Any]] = {}
    out = []
    for _ in range(steps):
        key = rng.randrange(40)
        if key in table and rng.random() < 0.25:
            out.append(Change(RowKind.DELETE, {"id": key, "owner": None, "balance": None}))
            del table[key]
            continue
        old = table.get(key)
        row = {"id": key, "owner": f"o{rng.randrange(5)}", "balance": rng.randrange(-50, 200)}
        if old is not None and rng.random() < 0.1:
            row = dict(old)  # the same row again: no change downstream
        table[key] = row
        out.append(Change(RowKind.UPDATE_AFTER, row))
    return out, table


CHANGELOG = (
    ACCOUNTS
    + f"""CREATE TABLE positive (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({JDBC});
CREATE TABLE per_owner (owner STRING, n BIGINT, total BIGINT, rich BIGINT, top BIGINT, PRIMARY KEY (owner) NOT ENFORCED)
  WITH ({UPSERT});
CREATE TABLE by_n (owner STRING, n BIGINT, total BIGINT, PRIMARY KEY (owner, n) NOT ENFORCED) WITH ({JDBC});
EXECUTE STATEMENT SET BEGIN
INSERT INTO positive SELECT id, owner, balance FROM accounts WHERE balance > 0 AND owner <> 'o4';
INSERT INTO per_owner SELECT owner, COUNT(*), SUM(balance), COUNT(*) FILTER (WHERE balance >= 100),
  MAX(balance) FILTER (WHERE balance < 150) FROM accounts GROUP BY owner;
INSERT INTO by_n SELECT owner, COUNT(*), SUM(balance) FROM accounts WHERE balance % 3 <> 0 GROUP BY owner;
END;
"""
)


def expected_changelog_tables(final: Mapping[int, Mapping[str, Any]]) -> dict[str, Counter[str]]:
    live = list(final.values())
    positive = rows(r for r in live if r["balance"] > 0 and r["owner"] != "o4")
    owners: dict[str, list[int]] = defaultdict(list)
    for r in live:
        owners[r["owner"]].append(r["balance"])
    per_owner = rows(
        {
            "owner": o,
            "n": len(b),
            "total": sum(b),
            "rich": sum(1 for x in b if x >= 100),
            "top": max((x for x in b if x < 150), default=None),
        }
        for o, b in owners.items()
    )
    kept: dict[str, list[int]] = defaultdict(list)
    for r in live:
        if r["balance"] % 3 != 0:
            kept[r["owner"]].append(r["balance"])
    by_n = rows({"owner": o, "n": len(b), "total": sum(b)} for o, b in kept.items())
    return {"positive": positive, "per_owner": per_owner, "by_n": by_n}


@pytest.mark.parametrize("seed", [1, 2])
def test_an_upsert_kafka_table_s_changelog_filtered_and_aggregated_ends_as_python_s(
    tmp_path: Path, weir_job: RunJob, seed: int
) -> None:
    """The upsert-kafka source normalized (ChangelogNormalize), then a WHERE over it into jdbc (a row
    whose update stops passing is deleted), FILTER aggregates over it into upsert-kafka, and a GROUP
    BY into a jdbc table keyed by (owner, n), wider than the GROUP BY key (each update moves the
    group's row: its -U deletes the old key); each final table equals Python's over the final source
    table."""
    history, final = account_history(seed)
    run = weir_job(job_file(tmp_path, CHANGELOG), records={source_uid("accounts"): history})
    sinks, kept = sinks_of(run, CHANGELOG), kept_of(CHANGELOG)
    assert kept == {"positive": True, "per_owner": False, "by_n": True}
    keys = {"positive": ("id",), "per_owner": ("owner",), "by_n": ("owner", "n")}
    want = expected_changelog_tables(final)
    for name, values in sinks.items():
        assert sink_table(values, keys[name], kept[name]) == want[name], name
    kinds = Counter(c.kind for c in sinks["per_owner"])
    assert kinds[RowKind.UPDATE_AFTER] and not kinds[RowKind.UPDATE_BEFORE], kinds  # -U dropped before the sink
    run.with_failures()


def test_explain_names_the_normalizer_and_what_each_sink_does_with_a_minus_u() -> None:
    text = explain(CHANGELOG)
    assert "sql-source-accounts  source: upsert-kafka topic accounts (accounts)" in text
    assert "sql-source-accounts-normalize  changelog-normalize: the last row per key of accounts" in text
    assert "the changelog's +I/+U/-D (-U delete their key)" in text
    assert "the changelog's +I/+U rows and -D tombstones (-U dropped)" in text


@pytest.mark.parametrize(
    ("body", "message", "at"),
    [
        (
            "CREATE TABLE out (id BIGINT, owner STRING)\n"
            "  WITH ('connector' = 'kafka', 'topic' = 'o', 'format' = 'json');\n"
            "INSERT INTO out SELECT id, owner FROM accounts;",
            "needs a 'jdbc' or 'upsert-kafka' sink",
            "id, owner FROM",
        ),
    ],
)
def test_what_an_upsert_source_s_changelog_cannot_do_is_one_line_with_its_position(
    body: str, message: str, at: str
) -> None:
    text = ACCOUNTS + body.replace("{UPSERT}", UPSERT)
    statement = text.splitlines()[-1]
    line = text.count("\n") + 1
    with pytest.raises(SqlError, match=message) as raised:
        plan_script(text)
    assert str(raised.value).startswith(f"SQL {line}:{statement.index(at) + 1}: "), str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_upsert_kafka_table_with_a_watermark_is_refused_where_it_is_read() -> None:
    upsert_t = UPSERT.replace("'out'", "'t'")
    text = (
        "CREATE TABLE t (id BIGINT, ts TIMESTAMP(3), PRIMARY KEY (id) NOT ENFORCED, WATERMARK FOR ts AS ts)\n"
        f"  WITH ({upsert_t});\n"
        f"CREATE TABLE o (id BIGINT, ts TIMESTAMP(3), PRIMARY KEY (id) NOT ENFORCED) WITH ({JDBC});\n"
        "INSERT INTO o SELECT id, ts FROM t;"
    )
    with pytest.raises(SqlError, match="reading table t with a WATERMARK is not supported") as raised:
        explain(text)
    assert str(raised.value).startswith("SQL 4:34: "), str(raised.value)  # the t of FROM t


# -- the jdbc sink's transaction: -U/+U of one key, and of a row moving to another key ---------------------


def test_a_jdbc_transaction_ends_as_the_plus_u_of_its_key_and_a_moved_row_leaves_its_old_key() -> None:
    """What the PostgreSQL sink's transaction does with the writes of a kept -U and its +U
    (``weir.core.changelog.KeyedChanges``, the sink's per-key collapse of one checkpoint): the same key
    ends as the +U's row (the stored row deleted, then inserted), and a +U of another key (a sink key
    wider than the GROUP BY's) leaves the old key deleted; applied in order to a table holding the
    old rows, both give the table the changes describe."""
    from weir.core.changelog import Delete, KeyedChanges, Upsert, apply_changes
    from weir.sql.compile import RowEncoder, _written

    (statement,) = [s for s in plan_script(CHANGELOG).inserts if s.plan.sink.table.name == "by_n"]
    table = statement.plan.sink.table
    assert table.primary_key == ("owner", "n") and statement.plan.sink.keeps_update_before
    write = _written(table, RowEncoder(table), keeps_update_before=True)
    before = {("o1", 2): ("o1", 2, 10), ("o2", 1): ("o2", 1, 7)}
    changes = [
        Change(RowKind.UPDATE_BEFORE, {"owner": "o1", "n": 2, "total": 10}),  # o1 moves from n=2 to n=3
        Change(RowKind.UPDATE_AFTER, {"owner": "o1", "n": 3, "total": 16}),
        Change(RowKind.UPDATE_BEFORE, {"owner": "o2", "n": 1, "total": 7}),  # o2 stays at n=1
        Change(RowKind.UPDATE_AFTER, {"owner": "o2", "n": 1, "total": 9}),
    ]
    writes = [write(c) for c in changes]
    assert writes == [Delete(("o1", 2)), ("o1", 3, 16), Delete(("o2", 1)), ("o2", 1, 9)]
    transaction = KeyedChanges((0, 1))
    for w in writes:
        transaction.add(w)
    assert list(transaction) == [Delete(("o1", 2)), Upsert(("o1", 3, 16)), Upsert(("o2", 1, 9), replaces=True)]
    after = {("o1", 3): ("o1", 3, 16), ("o2", 1): ("o2", 1, 9)}
    assert apply_changes(writes, (0, 1), start=before) == after
    deleted = apply_changes([Delete(k) for k in transaction.deletes()], (0, 1), start=before)
    assert deleted == {}  # the sink's DELETEs run first...
    assert apply_changes(transaction.upserts(), (0, 1), start=deleted) == after  # ...then its upserts
