"""A processing-time lookup join of a 'filesystem' table (Flink's lookup join; Nexmark q13's bounded
side input): ``FROM (SELECT *, PROCTIME() AS p_time FROM t) B JOIN side FOR SYSTEM_TIME AS OF
B.p_time AS S ON expr = S.column``. The side input's decoding (weir.sql.lookup) on its own; jobs in
this process (``weir_job``), each sink compared, as a multiset of whole records, with plain Python
over the same input and file, with and without injected failures; a refusal per construct, one line
with its line:column."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_nexmark_sql import CONFIG, EVENTS, script
from tests.unit.weir.sql.test_retract import job_file, sink_values
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import plan_script, source_uid
from weir.sql.catalog import Column, FilesystemTable, Table
from weir.sql.errors import SqlError
from weir.sql.lookup import LookupRows, SideInputError, index_rows, side_rows
from weir.sql.types import Kind, SqlType
from weir.tools import nexmark_reference as ref

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

SIDE = Table(
    "side",
    (
        Column("k", SqlType(Kind.INTEGER, "BIGINT")),
        Column("v", SqlType(Kind.STRING, "STRING")),
        Column("w", SqlType(Kind.DOUBLE, "DOUBLE")),
    ),
    (),
    None,
    (),
    FilesystemTable("/nowhere/side.csv"),
    (),
)


def test_a_csv_side_input_is_its_tables_typed_rows() -> None:
    text = '1,one,1.5\n2,"t,w""o",\n\n3,,2\n'
    assert side_rows(text, SIDE, "side.csv") == [
        {"k": 1, "v": "one", "w": 1.5},
        {"k": 2, "v": 't,w"o', "w": None},  # a quoted field keeps its comma and quote; an empty DOUBLE is NULL
        {"k": 3, "v": "", "w": 2.0},  # an empty STRING is the empty string
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,one,1.5\n2,two\n", "side.csv line 2: 2 fields, table side has 3 columns"),
        ("1,one,1.5\nx,two,2\n", "side.csv line 2: column k: not an integer: 'x'"),
        ('1,"one,1.5\n', "side.csv line 1: unexpected end of data"),
    ],
)
def test_a_malformed_side_input_line_is_one_line_naming_the_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(SideInputError) as raised:
        side_rows(text, SIDE, "side.csv")
    assert str(raised.value) == message
    assert "\n" not in str(raised.value)


def test_rows_are_indexed_by_the_join_columns_and_a_null_key_matches_nothing() -> None:
    rows = [{"k": 1, "v": "a"}, {"k": None, "v": "b"}, {"k": 1, "v": "c"}]
    assert index_rows(rows, ("k",)) == {(1,): [{"k": 1, "v": "a"}, {"k": 1, "v": "c"}]}


def last_digit(row: Any) -> Any:
    return row["a"] % 10


def merged(left: Any, right: Any) -> dict[str, Any]:
    return {**left, **right}


def test_the_lookup_reads_the_file_at_its_first_call_and_ships_without_it(tmp_path: Path) -> None:
    path = tmp_path / "side.csv"
    path.write_text("1,one,1\n1,uno,2\n2,two,3\n")
    table = Table("side", SIDE.columns, (), None, (), FilesystemTable(str(path)), ())
    lookup = LookupRows(table, (last_digit,), ("k",), merged)
    assert lookup({"a": 11}) == [{"a": 11, "k": 1, "v": "one", "w": 1.0}, {"a": 11, "k": 1, "v": "uno", "w": 2.0}]
    assert lookup({"a": 5}) == []
    path.write_text("5,five,5\n")  # read once: a later change is not seen
    assert lookup({"a": 5}) == []
    shipped = pickle.loads(pickle.dumps(lookup))
    assert shipped({"a": 5}) == [{"a": 5, "k": 5, "v": "five", "w": 5.0}]  # each copy reads the file itself


def test_an_unreadable_side_input_is_one_line_naming_it() -> None:
    lookup = LookupRows(SIDE, (last_digit,), ("k",), merged)
    with pytest.raises(SideInputError, match=r"^table side: cannot read /nowhere/side.csv: .*No such file"):
        lookup({"a": 1})


ORDERS = """CREATE TABLE orders (id BIGINT, item BIGINT, qty INT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
  WITH ('connector' = 'kafka', 'topic' = 'orders', 'format' = 'json');
"""


def side_table(path: Path) -> str:
    return (
        "CREATE TABLE items (item BIGINT, name STRING, max_qty INT) "
        f"WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'csv');\n"
    )


ENRICHED = """CREATE TABLE enriched (id BIGINT, qty INT, name STRING, ts TIMESTAMP(3))
  WITH ('connector' = 'kafka', 'topic' = 'enriched', 'format' = 'json');
INSERT INTO enriched
SELECT O.id, O.qty, I.name, O.ts
FROM (SELECT *, PROCTIME() AS p_time FROM orders) O
JOIN items FOR SYSTEM_TIME AS OF O.p_time AS I
ON O.item + 1 = I.item AND O.qty <= I.max_qty;
"""
ITEMS = [(1, "one", 5), (2, "two", 2), (2, "deux", 9), (4, "four", 9)]  # item 3 has no row; item 2 two


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_each_row_is_joined_with_the_side_rows_of_its_key_that_pass_the_on(
    tmp_path: Path, weir_job: RunJob, failures: bool
) -> None:
    path = tmp_path / "items.csv"
    path.write_text("".join(f"{i},{n},{m}\n" for i, n, m in ITEMS))
    text = ORDERS + side_table(path) + ENRICHED
    orders = [
        {"id": i, "item": None if i % 11 == 0 else i % 4, "qty": i % 7, "ts": f"2024-01-01 00:00:{i % 60:02d}.000"}
        for i in range(60)
    ]
    run = weir_job(
        job_file(tmp_path, text),
        sources={source_uid("orders"): [json.dumps(o).encode() for o in orders]},
        checkpoint_every=7,
    )
    if failures:
        run.with_failures()
        run.with_failures(rescale=2)
    expected: Counter[str] = Counter()
    base = 1_704_067_200_000
    for o in orders:
        for item, name, max_qty in ITEMS:
            if o["item"] is not None and o["item"] + 1 == item and o["qty"] <= max_qty:
                row = {"id": o["id"], "qty": o["qty"], "name": name, "ts": base + 1_000 * (o["id"] % 60)}
                expected[json.dumps(row, sort_keys=True)] += 1
    assert sum(expected.values()) >= 30
    found = Counter(json.dumps(dict(r), sort_keys=True) for r in sink_values(run, text))
    assert found == expected


def test_nexmark_q13_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob) -> None:
    """The benchmark's q13 file (the suite's text, its side input table's options the 'filesystem'
    connector's) over the suite's side input file."""
    side_input = tmp_path / "side_input.txt"
    side_input.write_text(ref.side_input_text())
    text = script("q13").replace("${SIDE_INPUT}", str(side_input))
    run = weir_job(job_file(tmp_path, text), checkpoint_every=400)
    expected = ref.multiset(ref.q13([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= 2_000
    assert ref.multiset(sink_values(run, text)) == expected


def refused_cases(path: Path) -> list[tuple[str, str, str]]:
    sink = "CREATE TABLE out (id BIGINT, name STRING) WITH ('connector' = 'kafka', 'topic' = 'o', 'format' = 'json');\n"
    proc = "(SELECT *, PROCTIME() AS p_time FROM orders) O"
    return [
        (
            sink + f"INSERT INTO out SELECT O.id, I.name FROM {proc} JOIN items FOR SYSTEM_TIME AS OF O.ts AS I "
            "ON O.item = I.item;",
            "an event-time temporal join (a versioned table) is not supported",
            "O.ts AS I",
        ),
        (
            sink + f"INSERT INTO out SELECT O.id, I.name FROM {proc} JOIN items FOR SYSTEM_TIME AS OF O.id AS I "
            "ON O.item = I.item;",
            "a lookup join reads at the left side's processing time",
            "O.id AS I",
        ),
        (
            sink + f"INSERT INTO out SELECT O.id, I.id FROM {proc} JOIN orders FOR SYSTEM_TIME AS OF O.p_time AS I "
            "ON O.item = I.item;",
            "a lookup join's table is a 'filesystem' table (Weir's lookup source); orders is 'kafka'",
            "orders FOR",
        ),
        (
            sink + f"INSERT INTO out SELECT O.id, I.name FROM {proc} LEFT JOIN items FOR SYSTEM_TIME AS OF O.p_time "
            "AS I ON O.item = I.item;",
            "a LEFT JOIN ... FOR SYSTEM_TIME AS OF (a lookup join) is not supported",
            "items FOR",
        ),
        (
            sink + f"INSERT INTO out SELECT O.id, I.name FROM {proc} JOIN items FOR SYSTEM_TIME AS OF O.p_time AS I "
            "ON O.qty <= I.max_qty;",
            "a lookup join needs an equality of an expression of the left side and a column of I in ON",
            "O.qty <=",
        ),
        (
            sink + "INSERT INTO out SELECT item, name FROM items;",
            "table items ('filesystem') is read only as a lookup join's side input",
            "items;",
        ),
        (
            sink + "INSERT INTO out SELECT id, item FROM orders FOR SYSTEM_TIME AS OF ts;",
            "FOR SYSTEM_TIME AS OF is supported only on a lookup join's right side",
            "orders FOR",
        ),
        (
            sink + "INSERT INTO out SELECT O.id, I.name FROM orders O JOIN items FOR SYSTEM_TIME AS OF O.ts AS I "
            "ON O.item = I.item;",
            "an event-time temporal join (a versioned table) is not supported",
            "O.ts AS I",
        ),
        (
            "CREATE TABLE rel (a BIGINT) WITH ('connector' = 'filesystem', 'path' = 'side.csv', 'format' = 'csv');",
            "table rel: 'path' = 'side.csv': Weir's filesystem connector takes a local path (an absolute path or "
            "file:///...), or s3://bucket/prefix for a table that is only written",
            "'path'",
        ),
        (
            "CREATE TABLE lake (item BIGINT, name STRING, max_qty INT) "
            "WITH ('connector' = 'filesystem', 'path' = 's3://lake/items/', 'format' = 'csv');\n"
            + sink
            + f"INSERT INTO out SELECT O.id, I.name FROM {proc} JOIN lake FOR SYSTEM_TIME AS OF O.p_time AS I "
            "ON O.item = I.item;",
            "a lookup join reads a local file; lake's 'path' = 's3://lake/items/' is in S3, where a 'filesystem' "
            "table can only be written",
            "lake FOR",
        ),
        (
            f"CREATE TABLE js (a BIGINT) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json');",
            "table js: option 'format' = 'json' is not supported (one of: csv)",
            "'format'",
        ),
    ]


@pytest.mark.parametrize("case", range(11))
def test_a_refused_construct_is_one_line_with_its_position(tmp_path: Path, case: int) -> None:
    path = tmp_path / "items.csv"
    statement, message, at = refused_cases(path)[case]
    prefix = ORDERS + side_table(path)
    with pytest.raises(SqlError) as raised:
        plan_script(prefix + statement)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    where = prefix + statement
    offset = where.index(at, len(prefix))
    line = where[:offset].count("\n") + 1
    column = offset - (where.rfind("\n", 0, offset) + 1) + 1
    assert text.startswith(f"SQL {line}:{column}: "), text


def test_proctime_is_the_wall_clock_in_epoch_milliseconds() -> None:
    import time

    from sqlglot import exp

    from weir.sql.expressions import Locate, Scope, compile_expression

    before = time.time_ns() // 1_000_000
    value: Any = compile_expression(exp.Anonymous(this="PROCTIME"), Scope({}, frozenset(), {}), Locate("", 0))({})
    assert before <= value <= time.time_ns() // 1_000_000
