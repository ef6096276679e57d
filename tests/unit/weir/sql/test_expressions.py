"""weir.sql.expressions: each supported expression over rows, SQL's NULL rules (an operator over NULL
is NULL, AND/OR three-valued), and the refusal of what it does not evaluate (no network)."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest
import sqlglot

from weir.sql.errors import SqlError
from weir.sql.expressions import DateFormat, Locate, Scope, compile_expression, date_format
from weir.sql.types import Kind, SqlType

COLUMNS = {name: SqlType(Kind.STRING, "STRING") for name in ("a", "b", "s", "n", "x", "t", "p", "q")}
ROW = {"a": 7, "b": 2, "s": "Hello", "n": None, "x": -1.5, "t": 1_700_000_000_123, "p": True, "q": None}


def evaluate(text: str, row: dict[str, Any] | None = None) -> Any:
    node = sqlglot.parse_one(text, read="spark")
    return compile_expression(node, Scope(COLUMNS, frozenset({"r"}), {}), Locate(text, 0))(row or ROW)


CASES = [
    ("a + b", 9),
    ("a - b * 3", 1),
    ("a / b", 3),  # integer division truncates
    ("-a / b", -3),  # toward zero
    ("a / 2.0", Decimal("3.5")),
    ("x * 2", -3.0),
    ("x + 0.5", -1.0),  # a DECIMAL literal with a DOUBLE is a DOUBLE
    ("MOD(a, b)", 1),
    ("MOD(-a, b)", -1),
    ("a % 4", 3),
    ("a > b", True),
    ("a <> 7", False),
    ("a >= 7 AND b <= 2", True),
    ("n = 1", None),
    ("n + 1", None),
    ("n = 1 AND FALSE", False),
    ("n = 1 AND TRUE", None),
    ("n = 1 OR TRUE", True),
    ("n = 1 OR FALSE", None),
    ("NOT (n = 1)", None),
    ("NOT p", False),
    ("n IS NULL", True),
    ("a IS NOT NULL", True),
    ("a BETWEEN 1 AND 7", True),
    ("a BETWEEN 8 AND 9", False),
    ("n BETWEEN 1 AND 2", None),
    ("a IN (1, 7)", True),
    ("a IN (1, 2)", False),
    ("a IN (1, NULL)", None),
    ("s LIKE 'He%'", True),
    ("s LIKE 'h_llo'", False),
    ("s LIKE '_ello'", True),
    ("CASE WHEN a > 5 THEN 'big' WHEN a > 1 THEN 'mid' END", "big"),
    ("CASE WHEN a > 50 THEN 'big' END", None),
    ("CASE b WHEN 1 THEN 'one' WHEN 2 THEN 'two' ELSE 'many' END", "two"),
    ("CASE n WHEN 1 THEN 'one' ELSE 'other' END", "other"),
    ("IF(a > 5, 'y', 'n')", "y"),
    ("IF(n > 5, 'y', 'n')", "n"),
    ("CAST(a AS STRING)", "7"),
    ("CAST('12' AS BIGINT)", 12),
    ("CAST('1.5' AS DOUBLE)", 1.5),
    ("CAST(x AS INT)", -1),
    ("CAST(p AS STRING)", "TRUE"),
    ("CAST('2024-01-01 00:00:01.500' AS TIMESTAMP(3))", 1_704_067_201_500),
    ("CAST(n AS STRING)", None),
    ("s || '!'", "Hello!"),
    ("s || n", None),
    ("CONCAT(s, '-', CAST(a AS STRING))", "Hello-7"),
    ("CONCAT(s, n)", None),
    ("UPPER(s)", "HELLO"),
    ("LOWER(s)", "hello"),
    ("UPPER(n)", None),
    ("SUBSTRING(s, 2, 3)", "ell"),
    ("SUBSTRING(s, 3)", "llo"),
    ("TRIM('  x  ')", "x"),
    ("CHAR_LENGTH(s)", 5),
    ("COALESCE(n, q, a)", 7),
    ("COALESCE(n, q)", None),
    ("ABS(x)", 1.5),
    ("FLOOR(x)", -2),
    ("CEIL(x)", -1),
    ("ROUND(2.5)", Decimal("3")),
    ("ROUND(a)", 7),
    ("ROUND(2.345, 2)", Decimal("2.35")),
    ("ROUND(x)", -2.0),
    ("DATE_FORMAT(t, 'yyyy-MM-dd HH:mm:ss')", "2023-11-14 22:13:20"),
    ("TO_TIMESTAMP_LTZ(1700000000, 0)", 1_700_000_000_000),
    ("t - INTERVAL '2' SECOND", 1_700_000_000_123 - 2_000),
    ("t + INTERVAL '1' MINUTE", 1_700_000_060_123),
    ("t > TIMESTAMP '2023-11-14 22:13:20'", True),
    ("r.a + 1", 8),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_expression(text: str, expected: Any) -> None:
    value = evaluate(text)
    assert value == expected and type(value) is type(expected), (value, expected)


def test_division_by_zero_fails_the_row() -> None:
    with pytest.raises(ValueError, match="division by zero"):
        evaluate("a / (b - 2)")


REFUSED = [
    ("REVERSE(s)", "function REVERSE is not supported", "1:1"),
    ("a + nope", "column nope is not in the input", "1:5"),
    ("z.a", "no table or alias z in FROM", "1:1"),
    ("COUNT(a)", "aggregate COUNT is not allowed here", "1:1"),
    ("a IN (SELECT 1)", "IN (subquery) is not supported", "1:1"),
    ("CAST(a AS ARRAY<INT>)", "CAST to ARRAY<INT> is not supported", "1:6"),
    ("t + INTERVAL '1' MONTH", "only MILLISECOND to DAY units", "1:14"),
    ("s LIKE b", "LIKE takes a string literal pattern", "1:1"),
]


@pytest.mark.parametrize(("text", "message", "where"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_expression(text: str, message: str, where: str) -> None:
    with pytest.raises(SqlError) as raised:
        evaluate(text)
    assert message in str(raised.value) and str(raised.value).startswith(f"SQL {where}"), str(raised.value)


@pytest.mark.parametrize(
    "pattern", ["yyyy-MM-dd", "yyyy-MM", "HH:mm", "yyyy-MM-dd HH:mm:ss", "ss.SSS", "dd/MM/yyyy HH", "'day' 100%"]
)
def test_date_format_remembered_per_unit_equals_each_row_formatted(pattern: str) -> None:
    rng = random.Random(pattern)
    formatted = DateFormat(pattern)
    formatted.LIMIT = 50  # type: ignore[misc]  # cleared often too
    base = 1_700_000_000_000
    moments = [base + rng.randint(-3 * 86_400_000, 3 * 86_400_000) for _ in range(2_000)]
    moments += [m + rng.randint(0, 999) for m in moments[:200]] + [-1, 0, 1, -86_400_001]  # the epoch, before it
    assert [formatted(ms) for ms in moments] == [date_format(ms, pattern) for ms in moments]
    assert len(formatted.formatted) <= 50


@pytest.mark.parametrize("parts", [0, 1, 2, 3])
def test_a_row_key_is_the_tuple_of_its_parts_values(parts: int) -> None:
    from weir.sql.compile import row_key

    columns = ("a", "b", "c")[:parts]
    key = row_key(tuple((lambda row, c=c: row[c]) for c in columns))
    row = {"a": 1, "b": None, "c": "x"}
    assert key(row) == tuple(row[c] for c in columns)
    assert key({"a": 2, "b": 3, "c": None}) == tuple({"a": 2, "b": 3, "c": None}[c] for c in columns)


@pytest.mark.parametrize(
    "outputs",
    [("a", "b"), ("b", "a", "x"), ("a", "a + 1"), ("a",), ("r.a", "b")],
    ids=["columns", "reordered", "an-expression", "one-column", "qualified"],
)
def test_a_projection_gives_each_outputs_value_by_its_name_in_order(outputs: tuple[str, ...]) -> None:
    """``projection`` reads bare columns with one itemgetter: the row is the one each output's own
    evaluation gives (names, values, order), and a column missing from the row raises as it did."""
    from weir.sql.compile import projection

    compiled = tuple(
        (
            f"out{i}",
            compile_expression(sqlglot.parse_one(t, read="spark"), Scope(COLUMNS, frozenset({"r"}), {}), Locate(t, 0)),
        )
        for i, t in enumerate(outputs)
    )
    project = projection(compiled)
    for row in (ROW, {**ROW, "a": None, "b": -3}, {**ROW, "r.a": 11}):
        got = project(row)
        assert list(got.items()) == [(n, f(row)) for n, f in compiled]
    with pytest.raises(KeyError):
        project({"x": 1.0})
