"""A Kafka table's record key and value (Flink's 'key.format', 'key.fields', 'key.fields-prefix' and
'value.fields-include'): which columns each holds, what a row is written as and what a record is read
as, and the combinations Flink refuses, refused with Flink's words and the option's position."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from weir.api import Environment
from weir.core.descriptors import KafkaRecord, TimestampType
from weir.sql import explain, plan_script, sql
from weir.sql.catalog import KafkaLayout, Table, kafka_layout
from weir.sql.changelog import Change, RowKind
from weir.sql.compile import KafkaRecordEncoder, KafkaRows, RowDecoder
from weir.sql.errors import SqlError
from weir.sql.upsert import UpsertKafkaRecords

COLUMNS = "k_id BIGINT, k_region STRING, amount DOUBLE, note STRING, ts TIMESTAMP(3)"


def table(options: str, columns: str = COLUMNS, key: str = "") -> Table:
    script = f"CREATE TABLE t ({columns}{key}) WITH ({options});"
    return plan_script(script).tables["t"]


KAFKA = "'connector' = 'kafka', 'topic' = 't', 'format' = 'json'"
UPSERT = "'connector' = 'upsert-kafka', 'topic' = 't', 'key.format' = 'json', 'value.format' = 'json'"
PK = ", PRIMARY KEY (k_id, k_region) NOT ENFORCED"


def record(key: bytes | None, value: bytes | None) -> KafkaRecord:
    return KafkaRecord("t", 0, 0, key, value, 0, TimestampType(0), ())


# Which columns the key and the value hold ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "key", "layout"),
    [
        (KAFKA, "", KafkaLayout((), ("k_id", "k_region", "amount", "note", "ts"))),
        (
            KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_region;k_id'",
            "",
            KafkaLayout((("k_region", "k_region"), ("k_id", "k_id")), ("k_id", "k_region", "amount", "note", "ts")),
        ),
        (
            KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_id', 'key.fields-prefix' = 'k_', "
            "'value.fields-include' = 'EXCEPT_KEY'",
            "",
            KafkaLayout((("k_id", "id"),), ("k_region", "amount", "note", "ts")),
        ),
        (
            UPSERT,
            PK,
            KafkaLayout((("k_id", "k_id"), ("k_region", "k_region")), ("k_id", "k_region", "amount", "note", "ts")),
        ),
        (
            UPSERT + ", 'value.fields-include' = 'EXCEPT_KEY'",
            PK,
            KafkaLayout((("k_id", "k_id"), ("k_region", "k_region")), ("amount", "note", "ts")),
        ),
        (
            UPSERT + ", 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY'",
            PK,
            KafkaLayout((("k_id", "id"), ("k_region", "region")), ("amount", "note", "ts")),
        ),
    ],
)
def test_the_key_holds_the_key_fields_without_the_prefix_and_the_value_all_or_the_rest(
    options: str, key: str, layout: KafkaLayout
) -> None:
    assert kafka_layout(table(options, key=key)) == layout


ROW = {"k_id": 7, "k_region": "eu", "amount": 2.5, "note": None, "ts": 1_704_067_200_123}


def test_a_row_is_written_as_flink_writes_it() -> None:
    both = KafkaRecordEncoder(
        table(UPSERT + ", 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY'", key=PK)
    )
    assert json.loads(both.key(ROW)) == {"id": 7, "region": "eu"}
    assert json.loads(both.value(ROW)) == {"amount": 2.5, "note": None, "ts": "2024-01-01 00:00:00.123"}
    plain = KafkaRecordEncoder(table(KAFKA))
    assert not plain.has_key
    assert json.loads(plain.value(ROW)) == {**ROW, "ts": "2024-01-01 00:00:00.123"}
    keyed = KafkaRecordEncoder(table(KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_region'"))
    assert keyed.has_key and json.loads(keyed.key(ROW)) == {"k_region": "eu"}
    assert json.loads(keyed.value(ROW)) == json.loads(plain.value(ROW))  # ALL: the key's columns too


def test_a_key_of_several_columns_is_written_in_key_order_as_flink_writes_its_bytes() -> None:
    """Flink's key format projects 'key.fields' in the option's order, and upsert-kafka's key in the
    PRIMARY KEY's declared order (KafkaConnectorOptionsUtil.createKeyFormatProjection): not by name,
    not by column. The same JSON object in other bytes would be another key to a compacted topic."""
    kafka = KafkaRecordEncoder(table(KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_region;note;k_id'"))
    assert kafka.key(ROW) == b'{"k_region":"eu","note":null,"k_id":7}'
    columns = "note STRING, k_id BIGINT, k_region STRING, amount DOUBLE, ts TIMESTAMP(3)"
    upsert = KafkaRecordEncoder(table(UPSERT, columns, ", PRIMARY KEY (k_region, note, k_id) NOT ENFORCED"))
    assert upsert.key(ROW) == b'{"k_region":"eu","note":null,"k_id":7}'
    prefixed = KafkaRecordEncoder(
        table(
            UPSERT + ", 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY'",
            key=", PRIMARY KEY (k_region, k_id) NOT ENFORCED",
        )
    )
    assert prefixed.key(ROW) == b'{"region":"eu","id":7}'


def test_a_keyed_sink_partitions_by_the_java_client_s_murmur2_as_flink_s_sink_does() -> None:
    """Flink's Kafka sink leaves the partition to the Java producer: murmur2 of the key's bytes.
    librdkafka's default is CRC-32, which would put a key Flink writes into partition 0 into another:
    every keyed SQL sink asks for librdkafka's Java-compatible ``murmur2_random``; one without a key keeps
    the default."""
    script = f"""CREATE TABLE src (k_id BIGINT, k_region STRING, amount DOUBLE)
  WITH ('connector' = 'datagen', 'number-of-rows' = '3');
CREATE TABLE keyed (k_id BIGINT, k_region STRING, amount DOUBLE)
  WITH ({KAFKA}, 'key.format' = 'json', 'key.fields' = 'k_region;k_id');
CREATE TABLE plain (k_id BIGINT, k_region STRING, amount DOUBLE) WITH ({KAFKA});
CREATE TABLE per_region (k_region STRING, n BIGINT, PRIMARY KEY (k_region) NOT ENFORCED) WITH ({UPSERT});
EXECUTE STATEMENT SET BEGIN
INSERT INTO keyed SELECT * FROM src;
INSERT INTO plain SELECT * FROM src;
INSERT INTO per_region SELECT k_region, COUNT(*) FROM src GROUP BY k_region;
END;"""
    env = Environment("j")
    sql(env, script)
    partitioners = {}
    for uid, transformation in env.graph.transformations.items():
        if transformation.sink_spec is not None:
            partitioners[uid] = dict(transformation.factory().properties).get("partitioner")
    assert Counter(partitioners.values()) == Counter({"murmur2_random": 2, None: 1}), partitioners


LAYOUTS = [
    KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_region;k_id'",
    KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_id', 'key.fields-prefix' = 'k_', "
    "'value.fields-include' = 'EXCEPT_KEY'",
    KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_id;k_region;amount;note;ts', "
    "'value.fields-include' = 'EXCEPT_KEY'",  # every column in the key: the value is {}
]


@pytest.mark.parametrize("options", LAYOUTS)
def test_a_kafka_row_written_with_its_key_is_read_back_whole(options: str) -> None:
    t = table(options)
    encoder, rows = KafkaRecordEncoder(t), KafkaRows(t.name, kafka_layout(t), RowDecoder(t, ""))
    rng = random.Random(3)
    for n in range(50):
        row = {
            "k_id": n,
            "k_region": rng.choice(["eu", "us", None]),
            "amount": rng.choice([None, 1.5, -3.0]),
            "note": rng.choice([None, "x", "é"]),
            "ts": 1_704_067_200_000 + rng.randrange(10**9),
        }
        assert rows(record(encoder.key(row), encoder.value(row))) == row


def test_under_all_a_column_in_both_is_the_value_s_and_missing_fields_are_null() -> None:
    t = table(KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_id'")
    rows = KafkaRows(t.name, kafka_layout(t), RowDecoder(t, ""))
    read = rows(record(b'{"k_id": 1}', b'{"k_id": 2, "amount": 1.0}'))
    assert read == {"k_id": 2, "k_region": None, "amount": 1.0, "note": None, "ts": None}  # as Flink's projection


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (None, b'{"amount": 1.0}', "kafka table t: a record without a key \\(it holds k_id\\)"),
        (b"[1]", b'{"amount": 1.0}', "kafka table t: a record key is a JSON object, not list"),
        (b'{"id": 1}', None, "kafka table t: a record without a value"),
        (b'{"id": 1}', b'"text"', "a row is a JSON object, not str"),
        (b'{"id": "one"}', b'{"amount": 1.0}', "column k_id"),
    ],
)
def test_a_record_that_does_not_fit_the_layout_is_one_line(
    key: bytes | None, value: bytes | None, message: str
) -> None:
    t = table(LAYOUTS[1])
    rows = KafkaRows(t.name, kafka_layout(t), RowDecoder(t, ""))
    with pytest.raises(ValueError, match=message) as raised:
        rows(record(key, value))
    assert "\n" not in str(raised.value)


def test_an_upsert_kafka_record_with_a_prefixed_key_and_the_value_except_the_key() -> None:
    t = table(UPSERT + ", 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY'", key=PK)
    layout = kafka_layout(t)
    decoder = RowDecoder(t, "")
    key_table = RowDecoder(
        Table("t", tuple(c for c in t.columns if c.name in t.primary_key), (), None, (), t.connector, ()), ""
    )
    records = UpsertKafkaRecords("t", layout, decoder.row, key_table.row)
    encoder = KafkaRecordEncoder(t)
    assert records(record(encoder.key(ROW), encoder.value(ROW))) == Change(RowKind.UPDATE_AFTER, ROW)
    assert records(record(b'{"id": 7, "region": "eu"}', None)) == Change(RowKind.DELETE, {"k_id": 7, "k_region": "eu"})
    with pytest.raises(ValueError, match="not a JSON object of the primary key \\(id, region\\)"):
        records(record(b'{"k_id": 7, "k_region": "eu"}', None))  # the prefixed names are the table's, not the key's


def test_explain_says_what_the_key_and_the_value_hold() -> None:
    script = (
        "CREATE TABLE s (k_id BIGINT, v STRING) WITH ("
        + KAFKA.replace("'t'", "'s'")
        + ", 'key.format' = 'json', 'key.fields' = 'k_id', 'key.fields-prefix' = 'k_', "
        "'value.fields-include' = 'EXCEPT_KEY');\n"
        "CREATE TABLE u (k_id BIGINT, n BIGINT, PRIMARY KEY (k_id) NOT ENFORCED) WITH ("
        + UPSERT.replace("'t'", "'u'")
        + ", 'key.fields-prefix' = 'k_', 'value.fields-include' = 'EXCEPT_KEY');\n"
        "INSERT INTO u SELECT k_id, COUNT(*) FROM s GROUP BY k_id;\n"
    )
    text = explain(script)
    assert "sql-source-s  source: kafka topic s (s; key k_id as id; value v; decodes k_id)" in text, text
    assert "sink: upsert-kafka topic u (u; key k_id as id; value n), exactly-once" in text, text


# The combinations Flink refuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "key", "message", "at"),
    [
        (
            KAFKA + ", 'key.fields' = 'k_id'",
            "",
            "The option 'key.fields' can only be declared if a key format is defined using 'key.format'.",
            "'key.fields'",
        ),
        (
            KAFKA + ", 'key.format' = 'json'",
            "",
            "A key format 'key.format' requires the declaration of one or more of key fields using 'key.fields'.",
            "'key.format'",
        ),
        (
            KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_id;nope'",
            "",
            "Could not find the field 'nope' in the table schema for usage in the key format. A key field must be "
            "a regular, physical column. The following columns can be selected in the 'key.fields' option: "
            "[k_id, k_region, amount, note, ts]",
            "'key.fields'",
        ),
        (
            KAFKA + ", 'key.format' = 'json', 'key.fields' = 'doubled'",
            "",
            "Could not find the field 'doubled' in the table schema",  # a computed column is no physical one
            "'key.fields'",
        ),
        (
            KAFKA + ", 'key.format' = 'json', 'key.fields' = 'amount', 'key.fields-prefix' = 'k_', "
            "'value.fields-include' = 'EXCEPT_KEY'",
            "",
            "All fields in 'key.fields' must be prefixed with 'k_' when option 'key.fields-prefix' is set but "
            "field 'amount' is not prefixed.",
            "'key.fields-prefix'",
        ),
        (
            KAFKA + ", 'key.format' = 'json', 'key.fields' = 'k_id', 'key.fields-prefix' = 'k_'",
            "",
            "A key prefix is not allowed when option 'value.fields-include' is set to 'ALL'. Set it to "
            "'EXCEPT_KEY' instead to avoid field overlaps.",
            "'key.fields-prefix'",
        ),
        (
            UPSERT + ", 'key.fields-prefix' = 'k_', 'value.fields-include' = 'ALL'",
            PK,
            "A key prefix is not allowed when option 'value.fields-include' is set to 'ALL'.",
            "'value.fields-include'",
        ),
        (
            UPSERT + ", 'key.fields-prefix' = 'k_r', 'value.fields-include' = 'EXCEPT_KEY'",
            PK,
            "All fields in 'key.fields' must be prefixed with 'k_r' when option 'key.fields-prefix' is set but "
            "field 'k_id' is not prefixed.",
            "'key.fields-prefix'",
        ),
        (UPSERT + ", 'key.fields' = 'k_id'", PK, "option 'key.fields' is not supported", "'key.fields'"),
        (
            KAFKA + ", 'value.fields-include' = 'KEY_ONLY'",
            "",
            "option 'value.fields-include' = 'KEY_ONLY' is not supported (one of: ALL, EXCEPT_KEY)",
            "'value.fields-include'",
        ),
    ],
)
def test_a_combination_flink_refuses_is_refused_in_its_words_at_the_option(
    options: str, key: str, message: str, at: str
) -> None:
    script = f"CREATE TABLE t ({COLUMNS}, doubled AS amount * 2{key}) WITH ({options});"
    with pytest.raises(SqlError) as raised:
        plan_script(script)
    text = str(raised.value)
    assert "\n" not in text
    assert f"table t: {message}" in text, text
    column = script.index(at) + 1
    assert text.startswith(f"SQL 1:{column}: "), (text, column)
