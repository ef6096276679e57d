"""Window Top-N (``ROW_NUMBER() OVER (PARTITION BY window_start, window_end ...)`` filtered by the row
number) run in this process, each sink's committed rows compared, as a multiset of whole records,
with plain Python's ranking of the same windows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import ORDERS, ms_of, multiset, orders, run, windows_of
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import SqlError, plan_script

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

JDBC = "'connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir'"


def per_user(rows: list[dict[str, Any]], size: int, slide: int) -> dict[tuple[int, str], list[dict[str, Any]]]:
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        for start in windows_of(ms_of(r), size, slide):
            groups[(start, r["u"])].append(r)
    return groups


def test_top_two_users_of_each_tumbling_window(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + f"""CREATE TABLE top_users (window_start TIMESTAMP(3), window_end TIMESTAMP(3), u STRING, qtys BIGINT,
  n BIGINT, rownum BIGINT, PRIMARY KEY (window_start, rownum) NOT ENFORCED)
  WITH ({JDBC}, 'table-name' = 'top_users');
INSERT INTO top_users
SELECT window_start, window_end, u, qtys, n, rownum FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY qtys DESC, u) AS rownum
  FROM (
    SELECT window_start, window_end, u, SUM(qty) AS qtys, COUNT(*) AS n
    FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND))
    GROUP BY window_start, window_end, u
  )
) WHERE rownum <= 2;
"""
    )
    rows = orders()
    by_window: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for (start, u), members in per_user(rows, 10_000, 10_000).items():
        by_window[start].append((u, sum(m["qty"] for m in members), len(members)))
    expected = []
    for start, users in by_window.items():
        ranked = sorted(users, key=lambda t: (-t[1], t[0]))[:2]
        for number, (u, qtys, n) in enumerate(ranked, start=1):
            expected.append(
                {"window_start": start, "window_end": start + 10_000, "u": u, "qtys": qtys, "n": n, "rownum": number}
            )
    assert len(expected) >= 20
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["top_users"]) == multiset(expected)


def test_top_one_of_each_hopping_window_and_key_through_a_view(tmp_path: Path, weir_job: RunJob) -> None:
    """PARTITION BY the window and a key, the rank dropped, ``rownum = 1``, a further WHERE condition
    on the ranked rows, over a view of a HOP aggregation (with its window columns renamed)."""
    script = (
        ORDERS
        + f"""CREATE VIEW sized AS
SELECT window_start AS ws, window_end AS we, u, MOD(CHAR_LENGTH(u) + qty, 2) AS parity, MAX(id) AS last_id
FROM TABLE(HOP(TABLE orders, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '15' SECOND))
GROUP BY window_start, window_end, u, MOD(CHAR_LENGTH(u) + qty, 2);
CREATE TABLE best (ws TIMESTAMP(3), parity INT, u STRING, last_id BIGINT,
  PRIMARY KEY (ws, parity) NOT ENFORCED)
  WITH ({JDBC}, 'table-name' = 'best');
INSERT INTO best
SELECT ws, parity, u, last_id FROM (
  SELECT ws, we, parity, u, last_id,
         ROW_NUMBER() OVER (PARTITION BY parity, ws, we ORDER BY last_id DESC) AS r
  FROM sized
) WHERE r = 1 AND u <> 'u3';
"""
    )
    rows = orders()
    groups: dict[tuple[int, int, str], int] = {}
    for r in rows:
        parity = (len(r["u"]) + r["qty"]) % 2
        for start in windows_of(ms_of(r), 15_000, 5_000):
            key = (start, parity, r["u"])
            groups[key] = max(groups.get(key, -1), r["id"])
    best: dict[tuple[int, int], tuple[int, str]] = {}
    for (start, parity, u), last in groups.items():
        best[(start, parity)] = max(best.get((start, parity), (-1, "")), (last, u))
    expected = [
        {"ws": start, "parity": parity, "u": u, "last_id": last}
        for (start, parity), (last, u) in best.items()
        if u != "u3"
    ]
    assert len(expected) >= 20
    assert multiset(run(tmp_path, weir_job, script, rows)["best"]) == multiset(expected)


AGG = """(SELECT window_start, window_end, u, COUNT(*) AS n
  FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY window_start, window_end, u)"""
OUT = "CREATE TABLE out (u STRING, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'out', 'format' = 'json');\n"


@pytest.mark.parametrize(
    ("query", "message", "at"),
    [
        (
            f"SELECT u, n FROM (SELECT u, n, RANK() OVER (PARTITION BY window_start, window_end ORDER BY n) AS r "
            f"FROM {AGG}) WHERE r <= 3",
            "RANK() OVER (...) is not supported (ROW_NUMBER() is)",
            "7:",
        ),
        (
            f"SELECT u, n FROM (SELECT u, n, ROW_NUMBER() OVER (PARTITION BY u ORDER BY n) AS r FROM {AGG}) "
            "WHERE r <= 3",
            "a Top-N without a window gives updating results; the sink must be 'upsert-kafka' or 'jdbc'",
            "7:",
        ),
        (
            f"SELECT u, n FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY u, window_start ORDER BY n) AS r "
            f"FROM {AGG}) WHERE r <= 3",
            "window Top-N: PARTITION BY window_start, window_end",
            "7:",
        ),
        (
            "SELECT u, n FROM (SELECT u, qty AS n, ROW_NUMBER() OVER (PARTITION BY u ORDER BY id) AS r FROM orders) "
            "WHERE r <= 3",
            # PARTITION BY / ORDER BY read the SELECT's columns (id AS n would be read as n)
            "id in a Top-N's OVER (...) is not a column of its SELECT",
            "7:",
        ),
        (
            f"SELECT u, n FROM (SELECT u, n, window_start, window_end, ROW_NUMBER() OVER "
            f"(PARTITION BY window_start, window_end ORDER BY n) AS r FROM {AGG})",
            "window Top-N needs WHERE r <= N",
            "7:",
        ),
        (
            f"SELECT u, n FROM (SELECT u, n, window_start, window_end, ROW_NUMBER() OVER "
            f"(PARTITION BY window_start, window_end ORDER BY n) AS r FROM {AGG}) WHERE r > 3",
            "window Top-N needs WHERE r <= N",
            "8:",
        ),
        (
            f"SELECT u, n FROM (SELECT u, n, window_start, window_end, ROW_NUMBER() OVER "
            f"(PARTITION BY window_start, window_end) AS r FROM {AGG}) WHERE r <= 3",
            "window Top-N needs ORDER BY",
            "7:",
        ),
        (
            "SELECT u, id FROM orders WHERE ROW_NUMBER() OVER (ORDER BY id) <= 3",
            "OVER (...) is not supported (except window Top-N",
            "7:",
        ),
    ],
)
def test_refused_rankings(query: str, message: str, at: str) -> None:
    with pytest.raises(SqlError) as info:
        plan_script(ORDERS + OUT + f"INSERT INTO out {query};")
    assert message in str(info.value)
    assert str(info.value).startswith(f"SQL {at}")
