"""weir.sql's front: a script's statements, CREATE TABLE into the typed catalog, and one line with
``line:column`` for every construct Weir refuses (no network: nothing is compiled to a job here)."""

from __future__ import annotations

import pytest

from weir.sql import explain, plan_script
from weir.sql.catalog import DatagenTable, JdbcTable, KafkaTable, NexmarkTable, Watermark
from weir.sql.errors import SqlError
from weir.sql.script import CreateTable, Explain, Insert, SetOption, StatementSet, parse_script
from weir.sql.types import Kind

ORDERS = """CREATE TABLE orders (
  id BIGINT,
  `user` STRING,
  amount DOUBLE,
  ts TIMESTAMP(3),
  doubled AS amount * 2,
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND,
  PRIMARY KEY (id) NOT ENFORCED
) WITH (
  'connector' = 'kafka',
  'topic' = 'orders',
  'properties.bootstrap.servers' = 'localhost:9092',
  'properties.group.id' = 'g1',
  'scan.startup.mode' = 'earliest-offset',
  'format' = 'json'
);
"""
SINKS = """
CREATE TABLE out (id BIGINT, u STRING) WITH ('connector' = 'kafka', 'topic' = 'out', 'format' = 'json');
CREATE TABLE totals (u STRING, n BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'totals', 'key.format' = 'json', 'value.format' = 'json');
CREATE TABLE pg (u STRING, n BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'totals');
"""


def test_create_table_reads_types_computed_columns_watermark_key_and_flink_options() -> None:
    (statement,) = parse_script(ORDERS)
    assert isinstance(statement, CreateTable)
    table = statement.table
    assert [(c.name, c.type.kind) for c in table.columns] == [
        ("id", Kind.INTEGER),
        ("user", Kind.STRING),
        ("amount", Kind.DOUBLE),
        ("ts", Kind.TIMESTAMP),
    ]
    assert [(c.name, c.text) for c in table.computed] == [("doubled", "amount * 2")]
    assert table.watermark == Watermark("ts", 5_000)
    assert table.primary_key == ("id",)
    assert table.connector == KafkaTable("orders", False, False, "earliest-offset", "g1", "exactly-once")


def test_each_connector_is_typed_from_its_options() -> None:
    script = plan_script(
        SINKS + "CREATE TABLE gen (n BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '10', "
        "'fields.n.kind' = 'sequence', 'fields.n.start' = '5');\n"
        "CREATE TABLE nx (event_type INT) WITH ('connector' = 'nexmark', "
        "'events.num' = '100', 'first-event.rate' = '500');"
    )
    assert script.tables["totals"].connector == KafkaTable(
        "totals", True, False, "earliest-offset", None, "exactly-once"
    )
    assert script.tables["pg"].connector == JdbcTable("totals", "jdbc:postgresql://localhost:5432/weir")
    assert script.tables["gen"].connector == DatagenTable(10, None, (("n", (("kind", "sequence"), ("start", "5"))),))
    assert script.tables["nx"].connector == NexmarkTable(100, 500, 0)


def test_statements_set_explain_and_statement_set_are_read() -> None:
    statements = parse_script(
        ORDERS
        + SINKS
        + "SET 'pipeline.name' = 'orders';\n"
        + "INSERT INTO out SELECT id, `user` FROM orders;\n"
        + "EXPLAIN INSERT INTO out SELECT id, `user` FROM orders;\n"
        + "EXECUTE STATEMENT SET BEGIN\n  INSERT INTO out SELECT id, `user` FROM orders;\n"
        + "  INSERT INTO totals SELECT `user`, COUNT(*) FROM orders GROUP BY `user`;\nEND;\n"
    )
    kinds = [type(s) for s in statements]
    assert kinds == [CreateTable] * 4 + [SetOption, Insert, Explain, StatementSet]
    assert statements[4] == SetOption("pipeline.name", "orders", statements[4].position)
    statement_set = statements[7]
    assert isinstance(statement_set, StatementSet)
    assert [i.sink for i in statement_set.inserts] == ["out", "totals"]


def test_uids_derive_from_the_normalized_statement_so_resubmitting_keeps_them() -> None:
    one = explain(ORDERS + SINKS + "INSERT INTO out SELECT id, `user` FROM orders WHERE amount > 1;")
    reformatted = explain(
        ORDERS + SINKS + "-- same statement\ninsert into out\n  select id, `user`\n  from orders where amount > 1;"
    )
    uids = [line.split()[0] for line in one.splitlines() if not line.startswith("==")]
    assert uids == [line.split()[0] for line in reformatted.splitlines() if not line.startswith("==")]
    assert uids[0] == "sql-source-orders" and len(set(uids)) == len(uids) == 4
    other = explain(ORDERS + SINKS + "INSERT INTO out SELECT id, `user` FROM orders WHERE amount > 2;")
    assert set(uids[1:]).isdisjoint(line.split()[0] for line in other.splitlines())


def test_the_same_statement_twice_gets_distinct_uids() -> None:
    text = ORDERS + SINKS + "INSERT INTO out SELECT id, `user` FROM orders;\n" * 2
    script = plan_script(text)
    assert [s.uid_prefix for s in script.inserts][1] == script.inserts[0].uid_prefix + "-2"


def test_explain_prints_each_operator_with_its_uid() -> None:
    text = (
        ORDERS
        + SINKS
        + "EXPLAIN INSERT INTO totals SELECT `user`, COUNT(*) FROM orders WHERE amount > 1 GROUP BY `user`;"
    )
    lines = explain(text).splitlines()
    assert lines[0].startswith("== INSERT INTO totals SELECT `user`, COUNT(*) FROM orders")
    assert [line.split()[1] for line in lines[1:]] == [
        "source:",
        "filter:",
        "accumulate:",
        "group-aggregate:",
        "aggregate-result:",
        "project:",
        "sink:",
    ]


REFUSED = [
    # (script, the line's expected text, line:column)
    ("DROP TABLE orders;", "statement DROP is not supported", "1:1"),
    ("CREATE FUNCTION f AS 'my.Fn';", "JAVA classes do not run on Weir", "1:1"),
    (
        "CREATE VIEW v AS SELECT id FROM orders GROUP BY id;\nINSERT INTO out SELECT id, 'x' FROM v;",
        "view v: GROUP BY",
        "22:1",
    ),
    ("CREATE VIEW v AS SELECT o.id FROM orders o LEFT ANTI JOIN orders p ON o.id = p.id;\n"
     "INSERT INTO out SELECT * FROM v;",
     "LEFT ANTI JOIN is not supported (INNER, LEFT, RIGHT and FULL [OUTER] JOIN are)", "22:"),
    (
        "CREATE TABLE t (a MAP<STRING, INT>) WITH ('connector' = 'kafka', 'topic' = 't');",
        "type MAP<STRING, INT> is not supported",
        "1:19",
    ),
    (
        "CREATE TABLE t (a INT) WITH ('connector' = 'kafka',\n 'topic' = 't', 'scan.foo' = '1');",
        "option 'scan.foo' is not supported",
        "2:17",
    ),
    (
        "CREATE TABLE t (a INT) WITH ('connector' = 'elasticsearch-7');",
        "'connector' = 'elasticsearch-7' is not supported",
        "1:30",
    ),
    (
        "CREATE TABLE t (a INT) WITH ('connector' = 'filesystem');",
        "option 'path' is required for 'connector' = 'filesystem'",
        "1:30",
    ),
    (
        "CREATE TABLE t (a INT) WITH ('connector' = 'kafka', 'topic' = 't', 'format' = 'avro');",
        "'format' = 'avro' is not supported",
        "1:68",
    ),
    ("CREATE TABLE t (a INT) WITH ('connector' = 'kafka');", "option 'topic' is required", "1:30"),
    ("CREATE TABLE t (a INT);", "WITH ('connector' = ...) is required", "1:22"),
    (
        "CREATE TABLE t (a INT, m INT METADATA FROM 'offset') WITH ('connector' = 'kafka', 'topic' = 't');",
        "METADATA columns are not supported",
        "1:24",
    ),
    (
        "CREATE TABLE t (a INT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts + INTERVAL '1' SECOND)"
        " WITH ('connector' = 'kafka', 'topic' = 't');",
        "only ts or ts - INTERVAL 'n' unit",
        "1:61",
    ),
    (
        "CREATE TABLE t (a INT, WATERMARK FOR a AS a) WITH ('connector' = 'kafka', 'topic' = 't');",
        "not a TIMESTAMP",
        "1:1",
    ),
    (
        "CREATE TABLE t (a INT, PRIMARY KEY (a)) WITH ('connector' = 'kafka', 'topic' = 't');",
        "must be NOT ENFORCED",
        "1:24",
    ),
    ("CREATE TABLE t (a INT) WITH ('connector' = 'upsert-kafka', 'topic' = 't');", "needs a PRIMARY KEY", "1:1"),
    (
        "CREATE TABLE t (a INT) WITH ('connector' = 'jdbc', 'url' = 'jdbc:mysql://x/y', 'table-name' = 't');",
        "writes PostgreSQL",
        "1:52",
    ),
    ("SET 'table.exec.state.ttl' = 'forever';", "'forever' is not a duration", "1:1"),
    ("SET 'table.exec.mini-batch.enabled' = 'yes';", "'yes' is not 'true' or 'false'", "1:1"),
    ("SET 'table.exec.mini-batch.allow-latency' = 'soon';", "'soon' is not a duration", "1:1"),
    ("SET 'table.exec.mini-batch.size' = 'many';", "'many' is not a whole number", "1:1"),
    (
        "SET 'table.exec.mini-batch.enabled' = 'true';\nINSERT INTO out SELECT id, `user` FROM orders;",
        "'table.exec.mini-batch.enabled' = 'true' needs 'table.exec.mini-batch.allow-latency' above 0",
        "23:1",
    ),
    (
        "SET 'table.exec.mini-batch.enabled' = 'true';\nSET 'table.exec.mini-batch.allow-latency' = '2 s';\n"
        "SET 'table.exec.mini-batch.size' = '0';\nINSERT INTO out SELECT id, `user` FROM orders;",
        "(now 2000 ms and 0)",
        "25:1",
    ),
    ("SET 'table.exec.mini-batch.wait' = '1';", "SET 'table.exec.mini-batch.wait' is not supported", "1:1"),
    ("SET 'table.local-time-zone' = 'Europe/Paris';", "only 'UTC'", "1:1"),
    ("EXECUTE STATEMENT SET BEGIN\nSET 'a' = 'b';\nEND;", "holds INSERT statements, not SET", "2:1"),
    ("INSERT INTO nowhere SELECT id FROM orders;", "INSERT INTO nowhere: no such table", "22:1"),
    ("INSERT INTO out SELECT id FROM nothing;", "no table nothing", "22:32"),
    (
        "INSERT INTO out SELECT o.id, p.`user`\n"
        "FROM orders o JOIN orders p ON o.id = p.id JOIN orders q ON q.id = o.id;",
        "a second JOIN is not supported",
        "23:",
    ),
    ("INSERT INTO out SELECT o.id, p.`user` FROM orders o JOIN orders p ON o.id > p.id;", "needs an equality", "22:"),
    ("INSERT INTO out SELECT * FROM orders o JOIN orders p ON o.id = p.id;", "SELECT * over a JOIN", "22:24"),
    (
        "INSERT INTO out SELECT o.id, p.`user` FROM orders o, orders p;",
        "CROSS JOIN is not supported",
        "22:54",
    ),
    ("INSERT INTO out SELECT id, p.`user` FROM orders o JOIN orders p ON o.id = p.id;", "id is ambiguous", "22:24"),
    (
        "INSERT INTO out SELECT o.id, o.`user` FROM orders o FULL OUTER JOIN orders p ON o.id = p.id;",
        "INSERT INTO out: an outer join, or a join of an updating result, gives updating results; the sink must be",
        "22:24",
    ),
    ("INSERT INTO out SELECT id, `user` FROM orders ORDER BY id;", "ORDER BY is not supported", "22:"),
    ("INSERT INTO out SELECT id, `user` FROM orders LIMIT 3;", "LIMIT is not supported", "22:"),
    ("INSERT INTO out SELECT DISTINCT id, `user` FROM orders;", "SELECT DISTINCT is not supported", "22:"),
    (
        "INSERT INTO out SELECT u, n FROM (SELECT `user` AS u, COUNT(*) AS n FROM orders GROUP BY `user`) AS t;",
        "a SELECT of an updating result (a GROUP BY without a window) without GROUP BY is not supported",
        "22:24",
    ),
    (
        "INSERT INTO out SELECT id, `user` FROM orders WHERE id IN (SELECT id FROM orders);",
        "a subquery is not supported",
        "22:",
    ),
    (
        "INSERT INTO out SELECT id,\n  ROW_NUMBER() OVER (PARTITION BY `user` ORDER BY ts) FROM orders;",
        "OVER (...) is not supported",
        "23:3",
    ),
    (
        "INSERT INTO out SELECT id, `user` FROM orders UNION ALL SELECT id, `user` FROM orders;",
        "UNION is not supported",
        "22:",
    ),
    ("INSERT INTO out SELECT id, REVERSE(`user`) FROM orders;", "function REVERSE is not supported", "22:28"),
    ("INSERT INTO out SELECT id FROM orders;", "the SELECT gives 1 columns, the table has 2", "22:"),
    ("INSERT INTO out SELECT id, nope FROM orders;", "column nope is not in the input", "22:28"),
    ("INSERT INTO out SELECT id, x.`user` FROM orders;", "no table or alias x in FROM", "22:"),
    (
        "INSERT INTO totals SELECT `user`, COUNT(*) FROM orders;",
        "column user is neither grouped nor aggregated",
        "22:27",
    ),
    (
        "INSERT INTO out SELECT id, `user` FROM orders GROUP BY id, `user`;",
        "the sink must be 'upsert-kafka' or 'jdbc'",
        "22:",
    ),
    (
        "INSERT INTO totals SELECT `user`, STDDEV(amount) FROM orders GROUP BY `user`;",
        "aggregate STDDEV is not supported",
        "22:35",
    ),
    ("INSERT INTO out SELECT id, `user` FROM orders WHERE COUNT(*) > 1;", "an aggregate in WHERE", "22:"),
    (
        "INSERT INTO out SELECT COUNT(*), `user` FROM orders GROUP BY `user`, SESSION(id, INTERVAL '1' SECOND);",
        "SESSION(id, ...): not the input's event time (ts is)",
        "22:",
    ),
    (
        "INSERT INTO out SELECT COUNT(*), SESSION_END(ts, INTERVAL '2' SECOND) FROM orders\n"
        "GROUP BY SESSION(ts, INTERVAL '1' SECOND);",
        "SESSION_END takes the arguments of the GROUP BY's SESSION(...)",
        "22:",
    ),
    (
        "INSERT INTO out SELECT COUNT(*), `user` FROM orders GROUP BY `user`, TUMBLE(ts, INTERVAL '1' MONTH);",
        "TUMBLE takes positive INTERVAL literals",
        "22:",
    ),
    (
        "INSERT INTO out SELECT window_start, `user`\n"
        "FROM TABLE(SESSION(TABLE orders, DESCRIPTOR(ts), INTERVAL '1' SECOND))\n"
        "GROUP BY window_start, window_end, `user`;",
        "SESSION takes (TABLE t PARTITION BY keys, DESCRIPTOR(time column), gap)",
        "23:12",
    ),
    (
        "INSERT INTO out SELECT COUNT(*), `user` "
        "FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '1' SECOND))\n"
        "GROUP BY window_start, `user`;",
        "groups by window_start, window_end (both)",
        "23:",
    ),
    (
        "INSERT INTO out SELECT COUNT(*), `user` "
        "FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(id), INTERVAL '1' SECOND))\n"
        "GROUP BY window_start, window_end, `user`;",
        "not its event time (ts is)",
        "22:73",
    ),
    (
        "INSERT INTO out SELECT COUNT(*), `user` FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '1' MONTH))\n"
        "GROUP BY window_start, window_end, `user`;",
        "positive INTERVAL literals",
        "22:",
    ),
    (
        "INSERT INTO out SELECT COUNT(*), `user` "
        "FROM TABLE(HOP(TABLE orders, DESCRIPTOR(ts), INTERVAL '3' SECOND, INTERVAL '10' SECOND))\n"
        "GROUP BY window_start, window_end, `user`;",
        "must be a multiple of its slide",
        "22:",
    ),
    ("INSERT OVERWRITE out SELECT id, `user` FROM orders;", "INSERT OVERWRITE is not supported", "22:1"),
    ("INSERT INTO out (id, u) SELECT id, `user` FROM orders;", "INSERT INTO sink (columns) is not supported", "22:1"),
    ("INSERT INTO out SELECT id, `user` FROM orders WHERE;", "does not parse", "22:"),
]


@pytest.mark.parametrize(("statement", "message", "where"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_refused_construct_is_one_line_naming_it_and_its_position(statement: str, message: str, where: str) -> None:
    prefix = ORDERS + SINKS.strip() + "\n" if "INSERT" in statement else ""  # 21 lines: the INSERT is at line 22
    with pytest.raises(SqlError) as raised:
        plan_script(prefix + statement)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(f"SQL {where}"), text
