"""Interval joins (``a.ts BETWEEN b.ts - INTERVAL ... AND b.ts + INTERVAL ...`` with an equality of
each side) run in this process, the sink's committed rows compared, as a multiset of whole records,
with plain Python's pairs of the same rows; and comma joins (``FROM a, b WHERE``) as joins."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import ORDERS, ms_of, multiset, orders, run
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import SqlError, explain, plan_script

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

PAIRS = """CREATE TABLE pairs (a BIGINT, b BIGINT, note STRING)
  WITH ('connector' = 'kafka', 'topic' = 'pairs', 'format' = 'json');
"""


def pairs(rows: list[dict[str, Any]], key: Any, within: Any) -> list[dict[str, Any]]:
    """Every (o, p) with equal keys and ``within(p's ms - o's ms)``, by brute force."""
    return [
        {"a": o["id"], "b": p["id"], "note": o["note"] or p["u"]}
        for o in rows
        for p in rows
        if key(o) is not None and key(o) == key(p) and within(ms_of(p) - ms_of(o))
    ]


@pytest.mark.parametrize(
    ("condition", "within"),
    [
        (
            "p.ts BETWEEN o.ts - INTERVAL '2' SECOND AND o.ts + INTERVAL '5' SECOND",
            lambda d: -2_000 <= d <= 5_000,
        ),
        (  # the other side first, the bounds as two comparisons, exclusive
            "o.ts > p.ts - INTERVAL '6' SECOND AND p.ts + INTERVAL '1' SECOND > o.ts",
            lambda d: -1_000 < d < 6_000,
        ),
        ("o.ts BETWEEN p.ts AND p.ts + INTERVAL '4' SECOND", lambda d: -4_000 <= d <= 0),
    ],
)
@pytest.mark.parametrize("whole_seconds", [False, True])
def test_interval_join_of_two_event_time_inputs(
    tmp_path: Path, weir_job: RunJob, condition: str, within: Any, whole_seconds: bool
) -> None:
    """``whole_seconds``: every row at a whole second, so rows lie exactly on the bounds."""
    script = (
        ORDERS
        + PAIRS
        + f"""INSERT INTO pairs
SELECT o.id AS a, p.id AS b, COALESCE(o.note, p.u)
FROM orders o JOIN orders p ON MOD(o.id, 2) = MOD(p.id, 2) AND {condition} WHERE o.id <> p.id;
"""
    )
    rows = orders()
    if whole_seconds:
        rows = [{**r, "ts": f"2024-01-01 00:{r['id'] // 60:02d}:{r['id'] % 60:02d}.000"} for r in rows]
    expected = [r for r in pairs(rows, lambda r: r["id"] % 2, within) if r["a"] != r["b"]]
    assert len(expected) > 100
    assert "interval-join" in explain(script)
    assert multiset(run(tmp_path, weir_job, script, rows)["pairs"]) == multiset(expected)


def test_comma_join_with_an_interval_in_where(tmp_path: Path, weir_job: RunJob) -> None:
    """Flink's ``FROM a, b WHERE a.k = b.k AND a.ts BETWEEN ...`` (the shape Nexmark writes), a NULL
    key matching nothing."""
    script = (
        ORDERS
        + PAIRS
        + """INSERT INTO pairs
SELECT o.id AS a, p.id AS b, COALESCE(o.note, p.u)
FROM orders AS o, orders AS p
WHERE o.amount = p.amount AND o.ts BETWEEN p.ts - INTERVAL '30' SECOND AND p.ts - INTERVAL '1' SECOND
  AND p.qty > 1;
"""
    )
    rows = orders()
    expected = [
        r for r in pairs(rows, lambda r: r["amount"], lambda d: 1_000 <= d <= 30_000) if rows[r["b"]]["qty"] > 1
    ]
    assert len(expected) > 100
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["pairs"]) == multiset(expected)


def test_comma_join_without_time_bounds_is_a_regular_join(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + PAIRS
        + (
            "INSERT INTO pairs SELECT o.id AS a, p.id AS b, COALESCE(o.note, p.u) FROM orders o, orders p "
            "WHERE o.qty = p.qty AND o.id < p.id AND p.id - o.id < 12;\n"
        )
    )
    rows = orders()
    expected = [r for r in pairs(rows, lambda r: r["qty"], lambda d: True) if 0 < r["b"] - r["a"] < 12]
    assert len(expected) > 100
    assert "regular join" in explain(script)
    assert multiset(run(tmp_path, weir_job, script, rows)["pairs"]) == multiset(expected)


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("o.ts >= p.ts - INTERVAL '1' SECOND", "an interval join takes one lower and one upper bound"),
        (
            "o.ts >= p.ts - INTERVAL '1' SECOND AND o.ts <= p.ts AND o.ts > p.ts - INTERVAL '9' SECOND",
            "an interval join takes one lower and one upper bound",
        ),
        ("o.ts BETWEEN p.ts + INTERVAL '2' SECOND AND p.ts", "an interval join's bounds are empty"),
    ],
)
def test_refused_interval_joins(condition: str, message: str) -> None:
    with pytest.raises(SqlError, match=r"^SQL 9:\d+: ") as info:
        plan_script(
            ORDERS + PAIRS + "INSERT INTO pairs SELECT o.id AS a, p.id AS b, o.note\n"
            f"FROM orders o JOIN orders p ON o.u = p.u AND {condition};"
        )
    assert message in str(info.value)
