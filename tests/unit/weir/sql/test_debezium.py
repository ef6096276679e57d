"""A 'kafka' table of ``'format' = 'debezium-json'`` (weir.sql.debezium), as Flink 2.2.1's
debezium-json format: each op of a Debezium envelope as its changes, with and without the schema
wrapper, tombstones, messages that do not decode (one line; skipped with ignore-parse-errors, a bad
field NULL), each change written as Flink's serializer writes it (bytes), the options accepted and
refused with their position; then SQL jobs in this process over a random Debezium history (a
GROUP BY and a projection of the changelog, and a GROUP BY into a debezium-json sink) whose final
tables equal plain Python's, also through the failure matrix. Against Flink itself:
tests/integration/sql/test_debezium_vs_flink.py."""

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
from weir.sql.catalog import DebeziumJson, KafkaTable
from weir.sql.changelog import Change, RowKind
from weir.sql.compile import RowDecoder, RowEncoder
from weir.sql.debezium import DebeziumEncoder, DebeziumRecords
from weir.sql.errors import SqlError

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

DEBEZIUM = "'connector' = 'kafka', 'topic' = 'accounts', 'format' = 'debezium-json'"
ACCOUNTS = f"""CREATE TABLE accounts (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ({DEBEZIUM}, 'scan.startup.mode' = 'earliest-offset');
"""


def decoder(options: str = DEBEZIUM) -> RowDecoder:
    return RowDecoder(plan_script(ACCOUNTS.replace(DEBEZIUM, options)).tables["accounts"], "")


def records(*, schema_include: bool = False, ignore_parse_errors: bool = False) -> DebeziumRecords:
    rows = decoder()
    return DebeziumRecords(
        "accounts",
        rows.row,
        rows.lenient_row,
        schema_include=schema_include,
        ignore_parse_errors=ignore_parse_errors,
    )


def record(value: bytes | None) -> KafkaRecord:
    return KafkaRecord("accounts", 0, 0, b'{"id":1}', value, 0, TimestampType(0), ())


def envelope(op: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> bytes:
    """As Debezium writes one: the rows, the op, and the source and times Weir does not read."""
    source = {"version": "2.7.0.Final", "connector": "postgresql", "db": "weir", "schema": "public", "table": "t"}
    return json.dumps(
        {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1_700_000_000_000}
    ).encode()


OLD = {"id": 1, "owner": "ann", "balance": 10}
NEW = {"id": 1, "owner": "bob", "balance": 25}

# -- reading: every op, schema-include, tombstones ---------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "before", "after", "changes"),
    [
        ("r", None, OLD, (Change(RowKind.INSERT, OLD),)),
        ("c", None, OLD, (Change(RowKind.INSERT, OLD),)),
        ("u", OLD, NEW, (Change(RowKind.UPDATE_BEFORE, OLD), Change(RowKind.UPDATE_AFTER, NEW))),
        ("d", OLD, None, (Change(RowKind.DELETE, OLD),)),
    ],
)
@pytest.mark.parametrize("schema_include", [False, True])
def test_each_op_is_the_changes_flink_emits(
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    changes: tuple[Change, ...],
    schema_include: bool,
) -> None:
    value = envelope(op, before, after)
    if schema_include:  # Kafka Connect's value.converter.schemas.enable: the envelope is the payload
        value = (
            b'{"schema":{"type":"struct","fields":[],"optional":false,"name":"t.Envelope"},"payload":' + value + b"}"
        )
    assert records(schema_include=schema_include)(record(value)) == changes


@pytest.mark.parametrize("value", [None, b""])
def test_a_tombstone_is_no_change(value: bytes | None) -> None:
    assert records()(record(value)) == ()
    assert records(ignore_parse_errors=True)(record(value)) == ()


def test_a_row_s_fields_are_decoded_to_the_column_types_and_a_missing_one_is_null() -> None:
    value = json.dumps({"before": None, "after": {"id": "7", "balance": 3.0, "extra": 1}, "op": "c"}).encode()
    assert records()(record(value)) == (Change(RowKind.INSERT, {"id": 7, "owner": None, "balance": 3}),)


# -- messages that do not decode --------------------------------------------------------------------------

BAD = [
    (envelope("u", None, NEW), 'The "before" field of UPDATE message is null, if you are using Debezium Postgres'),
    (envelope("d", None, None), 'The "before" field of DELETE message is null'),
    (envelope("c", None, None), 'the "after" row is a JSON object, not null'),
    (envelope("x", None, OLD), 'Unknown "op" value "x"'),
    (json.dumps({"before": None, "after": OLD}).encode(), 'Unknown "op" value "None"'),
    (b"[1, 2]", "a Debezium envelope is a JSON object, not list"),
    (b"{not json", "Expecting property name"),
    (envelope("c", None, {"id": "one", "owner": "a", "balance": 1}), "column id"),
    (envelope("u", OLD, [1]), 'the "after" row is a JSON object, not list'),
]


@pytest.mark.parametrize(("value", "message"), BAD)
def test_a_message_that_does_not_decode_is_one_line_with_flink_s_words(value: bytes, message: str) -> None:
    with pytest.raises(ValueError, match="^Corrupt Debezium JSON message of table accounts: ") as raised:
        records()(record(value))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_schema_include_needs_the_payload_wrapper() -> None:
    with pytest.raises(ValueError, match="a Debezium envelope is a JSON object, not NoneType"):
        records(schema_include=True)(record(envelope("c", None, OLD)))  # no "payload": Flink's NPE


@pytest.mark.parametrize(("value", "message"), BAD[:7])
def test_ignore_parse_errors_skips_a_message_that_does_not_decode(value: bytes, message: str) -> None:
    assert records(ignore_parse_errors=True)(record(value)) == ()


def test_ignore_parse_errors_makes_a_field_of_the_wrong_type_null_as_flink_s_converter() -> None:
    value = envelope("u", {"id": 1, "owner": "a", "balance": "ten"}, {"id": 1, "owner": "a", "balance": 11})
    assert records(ignore_parse_errors=True)(record(value)) == (
        Change(RowKind.UPDATE_BEFORE, {"id": 1, "owner": "a", "balance": None}),
        Change(RowKind.UPDATE_AFTER, {"id": 1, "owner": "a", "balance": 11}),
    )


# -- writing: Flink's DebeziumJsonSerializationSchema, byte for byte ----------------------------------------

SINK = """CREATE TABLE t (b BIGINT, a STRING, ts TIMESTAMP(3), d DOUBLE)
  WITH ('connector' = 'kafka', 'topic' = 't', 'format' = 'debezium-json');"""
ROW = {"b": 2, "a": "x", "ts": 1_700_000_000_123, "d": None}
ROW_JSON = b'{"b":2,"a":"x","ts":"2023-11-14 22:13:20.123","d":null}'  # the columns in order, as Flink's


@pytest.mark.parametrize(
    ("kind", "written"),
    [
        (RowKind.INSERT, b'{"before":null,"after":' + ROW_JSON + b',"op":"c"}'),
        (RowKind.UPDATE_AFTER, b'{"before":null,"after":' + ROW_JSON + b',"op":"c"}'),
        (RowKind.UPDATE_BEFORE, b'{"before":' + ROW_JSON + b',"after":null,"op":"d"}'),
        (RowKind.DELETE, b'{"before":' + ROW_JSON + b',"after":null,"op":"d"}'),
    ],
)
def test_each_change_is_written_as_flink_s_serializer_writes_it(kind: RowKind, written: bytes) -> None:
    from weir.sql.compile import _debezium_encoder

    encoder = _debezium_encoder(RowEncoder(plan_script(SINK).tables["t"]))
    assert isinstance(encoder, DebeziumEncoder)
    assert encoder.change(Change(kind, ROW)) == written
    if kind is RowKind.INSERT:
        assert encoder.appended(ROW) == written


# -- options: accepted, refused with their position -----------------------------------------------------------


def connector(options: str) -> KafkaTable:
    table = plan_script(ACCOUNTS.replace(DEBEZIUM, options)).tables["accounts"]
    assert isinstance(table.connector, KafkaTable)
    return table.connector


def test_flink_s_options_are_read() -> None:
    assert connector(DEBEZIUM).debezium == DebeziumJson()
    both = connector(
        DEBEZIUM + ", 'debezium-json.schema-include' = 'true', 'debezium-json.ignore-parse-errors' = 'true'"
    )
    assert both.debezium == DebeziumJson(schema_include=True, ignore_parse_errors=True)
    accepted = connector(
        DEBEZIUM
        + ", 'debezium-json.timestamp-format.standard' = 'SQL', 'debezium-json.map-null-key.mode' = 'LITERAL', "
        "'debezium-json.map-null-key.literal' = 'null', 'debezium-json.encode.decimal-as-plain-number' = 'false', "
        "'debezium-json.encode.ignore-null-fields' = 'false'"
    )
    assert accepted.debezium == DebeziumJson()
    value_format = connector("'connector' = 'kafka', 'topic' = 'accounts', 'value.format' = 'debezium-json', "
                             "'value.debezium-json.schema-include' = 'true'")  # fmt: skip
    assert value_format.debezium == DebeziumJson(schema_include=True)
    assert connector("'connector' = 'kafka', 'topic' = 'accounts', 'format' = 'json'").debezium is None


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("'debezium-json.timestamp-format.standard' = 'ISO-8601'",
         "option 'debezium-json.timestamp-format.standard' = 'ISO-8601' is not supported (one of: SQL)"),
        ("'debezium-json.encode.decimal-as-plain-number' = 'true'",
         "'debezium-json.encode.decimal-as-plain-number' = 'true' is not supported"),
        ("'debezium-json.encode.ignore-null-fields' = 'true'",
         "'debezium-json.encode.ignore-null-fields' = 'true' is not supported"),
        ("'debezium-json.schema-include' = 'yes'",
         "'debezium-json.schema-include' = 'yes' is not supported (one of: false, true)"),
        ("'debezium-json.map-null-key.mode' = 'KEEP'", "'debezium-json.map-null-key.mode' = 'KEEP' is not supported"),
        ("'debezium-json.source.timestamp' = 'x'", "option 'debezium-json.source.timestamp' is not supported"),
        ("'key.format' = 'json'", "'key.format' with 'debezium-json' is not supported"),
    ],
)  # fmt: skip
def test_an_option_weir_does_not_do_is_refused_at_its_line_and_column(option: str, message: str) -> None:
    script = ACCOUNTS.replace(DEBEZIUM, DEBEZIUM + ",\n  " + option)
    with pytest.raises(SqlError) as raised:
        plan_script(script)
    assert message in raised.value.message
    assert raised.value.position is not None and raised.value.position.line == 3
    assert raised.value.position.column == 3
    assert "\n" not in str(raised.value)


def test_json_options_are_not_debezium_s() -> None:
    with pytest.raises(SqlError, match="option 'debezium-json.schema-include' is not supported"):
        plan_script(ACCOUNTS.replace("'debezium-json'", "'json', 'debezium-json.schema-include' = 'true'"))


def test_a_metadata_column_is_refused_at_its_position() -> None:
    script = ACCOUNTS.replace(
        "balance BIGINT,", "balance BIGINT,\n  ts TIMESTAMP_LTZ(3) METADATA FROM 'value.source.timestamp' VIRTUAL,"
    )
    with pytest.raises(SqlError, match="METADATA columns are not supported") as raised:
        plan_script(script)
    assert str(raised.value.position) == "2:3"


def test_a_sink_with_schema_include_is_refused_with_flink_s_words() -> None:
    script = (
        ACCOUNTS + f"CREATE TABLE out (owner STRING, n BIGINT) WITH ({DEBEZIUM.replace('accounts', 'out')}, "
        "'debezium-json.schema-include' = 'true');\n"
        "INSERT INTO out SELECT owner, COUNT(*) FROM accounts GROUP BY owner;"
    )
    with pytest.raises(SqlError) as raised:
        plan_script(script)
    assert raised.value.message == (
        "INSERT INTO out: Debezium JSON serialization doesn't support 'debezium-json.schema-include' option been set "
        "to true."
    )
    assert str(raised.value.position) == "4:1"


# -- SQL jobs in this process ------------------------------------------------------------------------------------

DEBEZIUM_OUT = "'connector' = 'kafka', 'topic' = 'changes', 'format' = 'debezium-json'"
SCRIPT = (
    ACCOUNTS
    + f"""CREATE TABLE per_owner (owner STRING, n BIGINT, total BIGINT, PRIMARY KEY (owner) NOT ENFORCED)
  WITH ({UPSERT});
CREATE TABLE rich (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({JDBC});
CREATE TABLE owner_changes (owner STRING, n BIGINT, top BIGINT) WITH ({DEBEZIUM_OUT});
EXECUTE STATEMENT SET BEGIN
INSERT INTO per_owner SELECT owner, COUNT(*), SUM(balance) FROM accounts GROUP BY owner;
INSERT INTO rich SELECT id, owner, balance FROM accounts WHERE balance >= 100;
INSERT INTO owner_changes SELECT owner, COUNT(*), MAX(balance) FROM accounts GROUP BY owner;
END;
"""
)


def history(seed: int, steps: int = 500) -> tuple[list[bytes], dict[int, dict[str, Any]]]:
    """A Debezium topic's values: a snapshot (``r``), then inserts, updates (before and after), deletes
    each followed by a tombstone, keys deleted and inserted again; and the final table."""
    rng = random.Random(seed)
    table: dict[int, dict[str, Any]] = {}
    out: list[bytes] = []

    def row(key: int) -> dict[str, Any]:
        return {"id": key, "owner": f"o{rng.randrange(5)}", "balance": rng.randrange(-50, 200)}

    for key in range(10):
        table[key] = row(key)
        out.append(envelope("r", None, table[key]))
    for _ in range(steps):
        key = rng.randrange(30)
        old = table.get(key)
        if old is None:
            table[key] = row(key)
            out.append(envelope("c", None, table[key]))
        elif rng.random() < 0.25:
            out.append(envelope("d", old, None))
            out.append(b"")  # Debezium's tombstone after a delete
            del table[key]
        else:
            table[key] = row(key)
            out.append(envelope("u", old, table[key]))
    return out, table


def folded(changes: Iterable[Any], key: Sequence[str] | None, kept: bool = False) -> Counter[str]:
    """The table a changelog leaves: by ``key`` (an upsert sink: +I/+U write the key's row, -D deletes
    it, a -U too when the plan keeps it, ``kept``) or, None, as a retract changelog (+I/+U add the
    row, -U/-D remove one equal row)."""
    by_key: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    bag: Counter[str] = Counter()
    for change in changes:
        assert isinstance(change, Change), change
        text = json.dumps(dict(change.row), sort_keys=True)
        adds = change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER)
        if key is None:
            if adds:
                bag[text] += 1
            else:
                assert bag[text] > 0, f"{change} retracts a row the changelog does not hold"
                bag[text] -= 1
        elif adds:
            by_key[tuple(change.row[k] for k in key)] = change.row
        elif change.kind is RowKind.DELETE or kept:
            by_key.pop(tuple(change.row[k] for k in key), None)
    if key is None:
        return +bag
    return Counter(json.dumps(dict(r), sort_keys=True) for r in by_key.values())


def expected(final: Mapping[int, Mapping[str, Any]]) -> dict[str, Counter[str]]:
    owners: dict[str, list[int]] = defaultdict(list)
    for r in final.values():
        owners[r["owner"]].append(r["balance"])

    def rows(table: Iterable[Mapping[str, Any]]) -> Counter[str]:
        return Counter(json.dumps(dict(r), sort_keys=True) for r in table)

    return {
        "per_owner": rows({"owner": o, "n": len(b), "total": sum(b)} for o, b in owners.items()),
        "rich": rows(r for r in final.values() if r["balance"] >= 100),
        "owner_changes": rows({"owner": o, "n": len(b), "top": max(b)} for o, b in owners.items()),
    }


@pytest.mark.parametrize("seed", [1, 2])
def test_a_debezium_changelog_grouped_filtered_and_written_as_debezium_ends_as_python_s(
    tmp_path: Path, weir_job: RunJob, seed: int
) -> None:
    """The envelopes read as a changelog into a GROUP BY (upsert-kafka), a WHERE (jdbc: an update out
    of the WHERE deletes its row) and a GROUP BY written as Debezium changes (every -U written, as a
    delete): each sink's final table equals Python's over the final source table."""
    values, final = history(seed)
    run = weir_job(job_file(tmp_path, SCRIPT), sources={source_uid("accounts"): values}, checkpoint_every=100)
    sinks: dict[str, list[Any]] = {}
    kept: dict[str, bool] = {}
    for statement in plan_script(SCRIPT).inserts:
        (uid,) = [u for u in run.sinks if u.startswith(statement.uid_prefix + "-") and u.endswith("-sink")]
        sinks[statement.plan.sink.table.name] = run.sinks[uid]
        kept[statement.plan.sink.table.name] = statement.plan.sink.keeps_update_before
    assert kept == {"per_owner": False, "rich": True, "owner_changes": True}
    want = expected(final)
    assert folded(sinks["per_owner"], ("owner",)) == want["per_owner"]
    assert folded(sinks["rich"], ("id",), kept=True) == want["rich"]
    assert folded(sinks["owner_changes"], None) == want["owner_changes"]
    kinds = Counter(c.kind for c in sinks["owner_changes"])
    assert kinds[RowKind.UPDATE_BEFORE] and kinds[RowKind.DELETE], kinds  # every change reaches the sink
    run.with_failures()


def test_explain_names_the_changes_and_the_debezium_sink() -> None:
    text = explain(SCRIPT)
    assert "sql-source-accounts  source: kafka topic accounts (accounts), debezium-json" in text
    assert "sql-source-accounts-changes  changes: the Debezium envelopes of accounts as +I/-U/+U/-D" in text
    assert "sink: kafka topic changes (owner_changes), debezium-json: each change, exactly-once" in text
    assert "upsert-materializer" not in text
    plans = {s.plan.sink.table.name: s.plan.sink for s in plan_script(SCRIPT).inserts}
    assert plans["owner_changes"].keeps_update_before and plans["owner_changes"].materializer is None


TOP_N = f"""CREATE TABLE orders (id BIGINT, u STRING, amount BIGINT)
  WITH ('connector' = 'kafka', 'topic' = 'orders', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset');
CREATE TABLE top2 (u STRING, id BIGINT, amount BIGINT, rn BIGINT) WITH ({DEBEZIUM_OUT});
INSERT INTO top2 SELECT u, id, amount, rn
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY u ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 2;
"""


def test_a_top_n_without_a_window_is_written_as_its_changes(tmp_path: Path, weir_job: RunJob) -> None:
    """A Top-N's updating rows (each row number's row replaced) into a debezium-json sink: the
    changelog, folded as a retract changelog, holds each user's two largest orders with their rank."""
    rng = random.Random(5)
    amounts = rng.sample(range(10_000), 300)
    orders = [{"id": i, "u": f"u{rng.randrange(6)}", "amount": a} for i, a in enumerate(amounts)]
    run = weir_job(job_file(tmp_path, TOP_N), sources={source_uid("orders"): [json.dumps(o) for o in orders]})
    (uid,) = [u for u in run.sinks if u.endswith("-sink")]
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for order in orders:
        by_user[order["u"]].append(order)
    want = Counter(
        json.dumps({**o, "rn": n}, sort_keys=True)
        for rows in by_user.values()
        for n, o in enumerate(sorted(rows, key=lambda o: -o["amount"])[:2], start=1)
    )
    assert folded(run.sinks[uid], None) == want
    assert any(c.kind is RowKind.UPDATE_BEFORE for c in run.sinks[uid])
