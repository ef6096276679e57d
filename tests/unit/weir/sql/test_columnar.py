"""weir.sql.columnar: a scan -> filter/projection chain evaluated on Arrow batches gives the per-record
path's rows exactly (multisets of whole records, NULLs included), for Nexmark q0-q2 and for each
expression it vectorizes; what it does not evaluate exactly is a Fallback naming the construct, and a
batch Arrow would compute differently (an int64 overflow, a zero MOD divisor) is evaluated per record."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import SqlError, explain, operators_of, plan_script
from weir.sql.columnar import BATCH_ROWS, ColumnarChain, ColumnarChainOperator, Fallback, columnar_chain, per_record
from weir.sql.compile import RowDecoder

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

ROOT = Path(__file__).resolve().parents[4]
SINK = "'connector' = 'kafka', 'topic' = 'nexmark-out', 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once'"
EVENTS = 6_000


def multiset(rows: list[dict[str, Any]]) -> Counter[tuple[tuple[str, Any], ...]]:
    return Counter(tuple(sorted(row.items())) for row in rows)


def chain_of(text: str) -> ColumnarChain | Fallback:
    (statement,) = plan_script(text).inserts
    sink = statement.plan.sink
    return columnar_chain(sink.input, sink)


def both(chain: ColumnarChain, rows: list[dict[str, Any]], batch: int = 1_000) -> tuple[Counter[Any], Counter[Any]]:
    columnar: list[dict[str, Any]] = []
    for i in range(0, len(rows), batch):
        columnar.extend(chain.apply(chain.batch(rows[i : i + batch])))
    return multiset(columnar), multiset(list(per_record(chain._nodes, rows)))


def nexmark_script(query: str) -> str:
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    return (
        ddl + "\n" + (ROOT / f"bench/flink/src/main/resources/nexmark/{query}.sql").read_text().replace("${SINK}", SINK)
    )


@pytest.mark.parametrize(("query", "least"), [("q0", 5_000), ("q1", 5_000), ("q2", 5)])
def test_nexmark_query_columnar_equals_per_record(query: str, least: int) -> None:
    text = nexmark_script(query)
    chain = chain_of(text)
    assert isinstance(chain, ColumnarChain), chain
    decoder = RowDecoder(chain.scan.table, text)
    rows = [decoder.row(nx.to_dict(nx.event(n, nx.NexmarkConfig()))) for n in range(EVENTS)]
    assert any(row["auction"] is None for row in rows)  # person and auction events: NULL bid columns
    columnar, expected = both(chain, rows)
    assert sum(expected.values()) >= least
    assert columnar == expected
    assert chain.batches_per_record == 0


@pytest.mark.parametrize("query", ["q5", "q7"])
def test_nexmark_window_queries_stay_per_record(query: str) -> None:
    chain = chain_of(nexmark_script(query))
    assert isinstance(chain, Fallback)


TABLE = """CREATE TABLE t (a BIGINT, b BIGINT, x DOUBLE, y DOUBLE, s STRING, p BOOLEAN, q BOOLEAN)
WITH ('connector' = 'datagen');
"""


def script(select: str, kind: str, where: str = "") -> str:
    return (
        TABLE
        + f"CREATE TABLE out (v {kind}) WITH ('connector' = 'print');\n"
        + f"INSERT INTO out SELECT {select} FROM t {where};"
    )


VALUES_A = [None, 0, 1, -1, 7, -7, 123, -246, 2**40, 2**62]
ROWS = [
    {
        "a": a,
        "b": VALUES_A[(i * 3 + 1) % len(VALUES_A)],
        "x": None if i % 4 == 0 else i * 0.5 - 3,
        "y": None if i % 5 == 0 else 1.25 * i,
        "s": None if i % 3 == 0 else f"s{i % 4}é",
        "p": None if i % 3 == 1 else i % 2 == 0,
        "q": None if i % 4 == 2 else i % 3 == 0,
    }
    for i, a in enumerate(VALUES_A * 4)
]

CASES = [
    ("a", "BIGINT", ""),
    ("a + b", "BIGINT", "WHERE a < 2147483647 AND b < 2147483647"),
    ("a - b * 3", "BIGINT", "WHERE a < 100000 AND b < 100000"),
    ("-a", "BIGINT", ""),
    ("x * 2 + y", "DOUBLE", ""),
    ("x + a", "DOUBLE", ""),
    ("MOD(a, 123)", "BIGINT", "WHERE a < 4096"),
    ("a % 4", "BIGINT", "WHERE a > -1000 AND a < 1000"),
    ("a > b", "BOOLEAN", ""),
    ("a = 7 OR b = 7", "BOOLEAN", ""),
    ("p AND q", "BOOLEAN", ""),
    ("p OR q", "BOOLEAN", ""),
    ("NOT p", "BOOLEAN", ""),
    ("a IS NULL", "BOOLEAN", ""),
    ("s IS NOT NULL", "BOOLEAN", ""),
    ("s = 's1é'", "BOOLEAN", ""),
    ("s < 's2'", "BOOLEAN", ""),
    ("x >= y", "BOOLEAN", ""),
    ("x < a", "BOOLEAN", "WHERE a < 1000000"),
    ("CASE WHEN a > 5 THEN 'big' WHEN a < 0 THEN 'negative' ELSE 'small' END", "STRING", ""),
    ("CASE WHEN p THEN a END", "BIGINT", ""),
    ("CASE WHEN x > 0 THEN x ELSE y END", "DOUBLE", ""),
    ("CAST(a AS DOUBLE)", "DOUBLE", ""),
    ("CAST(a AS STRING)", "STRING", ""),
    ("COALESCE(a, b, 0)", "BIGINT", ""),
    ("ABS(b)", "BIGINT", ""),
    ("CHAR_LENGTH(s)", "BIGINT", ""),
    ("0.908 * a", "DOUBLE", "WHERE a < 1000000000"),
    ("a * 1.5", "DECIMAL(23, 3)", "WHERE a < 1000000000"),
    ("a", "BIGINT", "WHERE p"),  # a NULL condition drops the row, as FALSE does
    ("s", "STRING", "WHERE NOT (a > 0 AND p)"),
    ("a", "DOUBLE", "WHERE a IS NOT NULL AND (x > 0 OR q)"),
]


@pytest.mark.parametrize(("select", "kind", "where"), CASES)
def test_expression_columnar_equals_per_record(select: str, kind: str, where: str) -> None:
    chain = chain_of(script(select, kind, where))
    assert isinstance(chain, ColumnarChain), chain
    columnar, expected = both(chain, ROWS, batch=7)
    assert sum(expected.values()) > 0
    assert columnar == expected


@pytest.mark.parametrize(
    ("select", "kind", "why"),
    [
        ("a / b", "BIGINT", "DIV"),
        ("UPPER(s)", "STRING", "UPPER"),
        ("CAST(x AS BIGINT)", "BIGINT", "CAST"),
        ("CASE WHEN p THEN a ELSE x END", "DOUBLE", "CASE"),
        ("a * 0.5 + 1", "DOUBLE", "decimal"),
        ("CAST(x AS STRING)", "STRING", "CAST"),
    ],
)
def test_what_arrow_computes_otherwise_falls_back(select: str, kind: str, why: str) -> None:
    chain = chain_of(script(select, kind))
    assert isinstance(chain, Fallback)
    assert why.lower() in chain.reason.lower()


@pytest.mark.parametrize(
    ("select", "where"),
    [
        ("a * b", ""),  # 2**62 * 2**62 overflows int64: Python's integers do not
        ("a + a", "WHERE a > 2147483647"),
        ("a * 2", ""),
        ("x > a", ""),  # 2**62 as a double is not exact: Python compares int and float exactly
        ("MOD(a, b)", "WHERE b IS NOT NULL AND b <> 0"),  # 2**62: beyond the exact float quotient
    ],
)
def test_a_batch_arrow_would_get_wrong_is_evaluated_per_record(select: str, where: str) -> None:
    chain = chain_of(script(select, {"a * b": "DOUBLE", "x > a": "BOOLEAN"}.get(select, "BIGINT"), where))
    assert isinstance(chain, ColumnarChain), chain
    rows = [{**row, "b": 2**62} if select == "a * b" and row["a"] == 2**62 else row for row in ROWS]
    columnar, expected = both(chain, rows, batch=len(rows))
    assert columnar == expected
    assert chain.batches_per_record == 1


def test_a_zero_mod_divisor_fails_as_on_the_per_record_path() -> None:
    chain = chain_of(script("MOD(a, b)", "BIGINT"))
    assert isinstance(chain, ColumnarChain)
    rows = [{**ROWS[0], "a": 5, "b": 0}]
    with pytest.raises(ValueError, match="MOD by zero"):
        chain.apply(chain.batch(rows))


JOB_EVENTS = 3_000


@pytest.mark.parametrize("query", ["q0", "q1", "q2"])
def test_columnar_job_sink_equals_per_record_job_sink(tmp_path: Path, weir_job: RunJob, query: str) -> None:
    """The whole job (in-process runner): SET 'weir.columnar' = 'true' changes the operators, not the
    sink's records."""
    text = nexmark_script(query).replace("'events.num' = '100000'", f"'events.num' = '{JOB_EVENTS}'")
    sinks = []
    for columnar in (False, True):
        script_text = ("SET 'weir.columnar' = 'true';\n" if columnar else "") + text
        job = tmp_path / f"{query}_{columnar}.py"
        job.write_text(
            f"from weir.sql import sql\n\nSCRIPT = {script_text!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n"
        )
        run = weir_job(job)
        (statement,) = plan_script(script_text).inserts
        assert any(op.kind == "columnar" for op in operators_of(statement, script_text)) is columnar
        (sink,) = [uid for uid in run.sinks if uid.startswith(statement.uid_prefix + "-")]
        sinks.append(multiset(run.sinks[sink]))
    per_record_sink, columnar_sink = sinks
    assert sum(per_record_sink.values()) >= (3 if query == "q2" else 2_000)
    assert columnar_sink == per_record_sink


class Recorded:
    """An operator's output, in order: ("row", value, timestamp) and ("watermark", w)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.events.append(("row", value, timestamp))

    def emit_watermark(self, watermark: int) -> None:
        self.events.append(("watermark", watermark))


def chain_operator(select: str, kind: str, where: str = "") -> tuple[ColumnarChainOperator, Recorded]:
    (statement,) = plan_script(script(select, kind, where)).inserts
    operator = ColumnarChainOperator(statement.plan.sink.input, statement.plan.sink)
    out = Recorded()
    operator.setup(None, out)  # type: ignore[arg-type]  # it reads no context
    operator.open()
    return operator, out


def test_the_operator_holds_a_watermark_behind_its_gathered_rows_and_flushes_at_a_snapshot() -> None:
    operator, out = chain_operator("a + 1", "BIGINT", "WHERE p")
    operator.process_watermark(5)  # nothing gathered: passes at once
    operator.process({**ROWS[2], "a": 1, "p": True}, 10)
    operator.process({**ROWS[2], "a": 2, "p": None}, 11)  # dropped: NULL condition
    operator.process_watermark(11)
    assert out.events == [("watermark", 5)]  # held: the gathered rows are not out yet
    assert operator.snapshot_state(1) is None
    assert out.events == [("watermark", 5), ("row", {"v": 2}, 10), ("watermark", 11)]
    operator.process({**ROWS[2], "a": 3, "p": True}, 12)
    operator.end_input()
    assert out.events[-1] == ("row", {"v": 4}, 12)


def test_the_operator_evaluates_a_full_batch_at_once_with_each_rows_timestamp() -> None:
    operator, out = chain_operator("a", "BIGINT")
    rows = [{**ROWS[1], "a": n} for n in range(BATCH_ROWS)]
    for n, row in enumerate(rows):
        operator.process(row, 1_000 + n)
    assert out.events == [("row", {"v": n}, 1_000 + n) for n in range(BATCH_ROWS)]
    assert operator.next_processing_time() is None


def test_set_weir_columnar_takes_true_or_false_with_the_position() -> None:
    with pytest.raises(SqlError, match=r"SET 'weir.columnar': 'yes' is not 'true' or 'false'") as refused:
        plan_script("SET 'weir.columnar' = 'yes';\n" + script("a", "BIGINT"))
    assert str(refused.value).startswith("SQL 1:1: ")


def test_explain_names_the_columnar_operator_or_why_not() -> None:
    on = "SET 'weir.columnar' = 'true';\n"
    assert "-columnar  columnar: on Arrow batches: WHERE p; SELECT a + 1 AS v" in explain(
        on + script("a + 1", "BIGINT", "WHERE p")
    )
    refused = explain(on + script("a / b", "BIGINT"))
    assert "project: a / b AS v [per record; not columnar: DIV (a / b)]" in refused
    assert "columnar" not in explain(script("a + 1", "BIGINT"))
