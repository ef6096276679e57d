"""Python scalar and aggregate functions called by name from SQL (``sql(env, script, functions=...)``
and ``CREATE FUNCTION ... LANGUAGE PYTHON``), run in this process, each sink's committed rows
compared, as a multiset of whole records, with plain Python over the same rows."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import ORDERS, ms_of, multiset, orders, windows_of
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import SqlError, plan_script, source_uid

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

JDBC = "'connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir'"


def tag(user: str | None, qty: int | None) -> str:
    """A scalar function: NULL arguments arrive as None."""
    return f"{user}#{'?' if qty is None else qty * 10}"


class Spread:
    """An aggregate function: max - min of its first argument over rows whose second is true."""

    def create(self) -> tuple[Any, Any]:
        return (None, None)

    def add(self, acc: tuple[Any, Any], value: Any, keep: Any) -> tuple[Any, Any]:
        if value is None or keep is not True:
            return acc
        low, high = acc
        return (value if low is None else min(low, value), value if high is None else max(high, value))

    def merge(self, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
        lows = [v for v in (a[0], b[0]) if v is not None]
        highs = [v for v in (a[1], b[1]) if v is not None]
        return (min(lows) if lows else None, max(highs) if highs else None)

    def result(self, acc: tuple[Any, Any]) -> Any:
        return None if acc[0] is None else acc[1] - acc[0]


FUNCTIONS = {"tag": tag, "spread": Spread}


def run_with(tmp_path: Path, weir_job: RunJob, script: str, rows: list[dict[str, Any]], registered: bool) -> Any:
    """The sink's committed rows, the job built by ``sql(env, SCRIPT[, functions=FUNCTIONS])``."""
    job = tmp_path / "sql_functions_job.py"
    functions = ", functions=FUNCTIONS" if registered else ""
    job.write_text(
        "from tests.unit.weir.sql.test_functions import FUNCTIONS\nfrom weir.sql import sql\n\n"
        f"SCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT{functions})\n"
    )
    result = weir_job(job, sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]}, checkpoint_every=25)
    result.with_failures()
    (statement,) = plan_script(script, FUNCTIONS if registered else None).inserts
    (uid,) = [u for u in result.sinks if u.startswith(statement.uid_prefix + "-")]
    return result.sinks[uid]


WINDOWED = f"""CREATE TABLE spreads (u STRING, window_start TIMESTAMP(3), label STRING, spread DOUBLE, n BIGINT,
  PRIMARY KEY (u, window_start) NOT ENFORCED) WITH ({JDBC}, 'table-name' = 'spreads');
INSERT INTO spreads
SELECT u, window_start, TAG(u, MAX(qty)), Spread(amount, qty > 1), COUNT(*)
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND))
WHERE tag(note, qty) <> 'None#0'
GROUP BY u, window_start, window_end;
"""


def expected_spreads(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if f"{r['note']}#{r['qty'] * 10}" != "None#0":
            (start,) = windows_of(ms_of(r), 10_000, 10_000)
            groups[(r["u"], start)].append(r)
    out = []
    for (u, start), members in groups.items():
        kept = [m["amount"] for m in members if m["amount"] is not None and m["qty"] > 1]
        out.append(
            {
                "u": u,
                "window_start": start,
                "label": f"{u}#{max(m['qty'] for m in members) * 10}",
                "spread": max(kept) - min(kept) if kept else None,
                "n": len(members),
            }
        )
    return out


def test_functions_passed_to_sql(tmp_path: Path, weir_job: RunJob) -> None:
    rows = orders()
    expected = expected_spreads(rows)
    assert len(expected) >= 40 and any(e["spread"] for e in expected) and any(e["spread"] is None for e in expected)
    assert multiset(run_with(tmp_path, weir_job, ORDERS + WINDOWED, rows, True)) == multiset(expected)


def test_functions_created_in_the_script(tmp_path: Path, weir_job: RunJob) -> None:
    """Flink's CREATE FUNCTION ... LANGUAGE PYTHON, the updating GROUP BY (reduce: merge) too."""
    script = (
        ORDERS
        + """CREATE TEMPORARY SYSTEM FUNCTION tag AS 'tests.unit.weir.sql.test_functions.tag' LANGUAGE PYTHON;
CREATE FUNCTION IF NOT EXISTS spread AS 'tests.unit.weir.sql.test_functions.Spread' LANGUAGE PYTHON;
CREATE TABLE per_user (u STRING, spread DOUBLE, last_tag STRING, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'per-user', 'key.format' = 'json', 'value.format' = 'json');
INSERT INTO per_user SELECT u, spread(amount, TRUE), tag(u, COUNT(*)) FROM orders GROUP BY u;
"""
    )
    rows = orders(60)
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    expected = []
    for r in rows:
        seen[r["u"]].append(r)
        amounts = [m["amount"] for m in seen[r["u"]] if m["amount"] is not None]
        spread = max(amounts) - min(amounts) if amounts else None
        expected.append({"u": r["u"], "spread": spread, "last_tag": f"{r['u']}#{len(seen[r['u']]) * 10}"})
    records = run_with(tmp_path, weir_job, script, rows, False)
    assert multiset(json.loads(r) if isinstance(r, bytes | str) else r for r in records) == multiset(expected)


OUT = "CREATE TABLE out (u STRING, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'out', 'format' = 'json');\n"


@pytest.mark.parametrize(
    ("statements", "message"),
    [
        ("INSERT INTO out SELECT u, nope(qty) FROM orders;", "function NOPE is not supported"),
        (
            "INSERT INTO out SELECT u, spread(qty, TRUE) FROM orders WHERE spread(qty, TRUE) > 1 GROUP BY u;",
            "an aggregate in WHERE",
        ),
        (
            "INSERT INTO out SELECT tag(u, 1), spread(DISTINCT qty) FROM orders GROUP BY tag(u, 1);",
            "spread(DISTINCT ...)",
        ),
        (
            "INSERT INTO out SELECT u, COUNT(*) FROM orders GROUP BY u, spread(qty, TRUE);",
            "aggregate function SPREAD is not allowed",
        ),
        ("CREATE FUNCTION f AS 'my.Fn' LANGUAGE JAVA;", "JAVA classes do not run on Weir"),
        ("CREATE FUNCTION f AS 'weir_no_such_module.f' LANGUAGE PYTHON;", "cannot import weir_no_such_module"),
        ("CREATE FUNCTION f AS 'json.no_such' LANGUAGE PYTHON;", "module json has no no_such"),
        ("CREATE FUNCTION tag AS 'json.dumps' LANGUAGE PYTHON;", "function tag is created twice"),
        ("CREATE FUNCTION f AS 'json.decoder' LANGUAGE PYTHON;", "neither callable nor an aggregate"),
    ],
)
def test_refused_functions(statements: str, message: str) -> None:
    with pytest.raises(SqlError, match=r"^SQL 7:\d+: ") as info:
        plan_script(ORDERS + OUT + statements, FUNCTIONS)
    assert message in str(info.value)
