"""The CUMULATE window TVF run in this process, each sink's committed rows compared, as a multiset of
whole records, with plain Python's aggregation of the same cumulating windows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import ORDERS, ms_of, multiset, orders, run
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import SqlError, plan_script

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

JDBC = "'connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir'"


def cumulating(ms: int, step: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of every cumulating window holding ``ms``: by the definition, one end at a time."""
    start = ms - ms % size
    return [(start, end) for end in range(start + step, start + size + 1, step) if ms < end]


def test_cumulate_window_aggregation(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + f"""CREATE TABLE running (u STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
  window_time TIMESTAMP(3), n BIGINT, qtys BIGINT, top DOUBLE, PRIMARY KEY (u, window_start, window_end) NOT ENFORCED)
  WITH ({JDBC}, 'table-name' = 'running');
INSERT INTO running
SELECT u, window_start, window_end, window_time, COUNT(*), SUM(qty), MAX(amount)
FROM TABLE(CUMULATE(TABLE orders, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '20' SECOND))
WHERE id <> 11
GROUP BY u, window_start, window_end;
"""
    )
    rows = orders()
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["id"] != 11:
            for start, end in cumulating(ms_of(r), 5_000, 20_000):
                groups[(r["u"], start, end)].append(r)
    expected = []
    for (u, start, end), members in groups.items():
        amounts = [m["amount"] for m in members if m["amount"] is not None]
        expected.append(
            {
                "u": u,
                "window_start": start,
                "window_end": end,
                "window_time": end - 1,
                "n": len(members),
                "qtys": sum(m["qty"] for m in members),
                "top": max(amounts) if amounts else None,
            }
        )
    assert len(expected) > 80
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["running"]) == multiset(expected)


def test_top_n_of_cumulating_windows(tmp_path: Path, weir_job: RunJob) -> None:
    """The user with the most orders so far in each cumulating window (ties to the smaller name)."""
    script = (
        ORDERS
        + f"""CREATE TABLE leader (window_start TIMESTAMP(3), window_end TIMESTAMP(3), u STRING, n BIGINT,
  PRIMARY KEY (window_start, window_end) NOT ENFORCED)
  WITH ({JDBC}, 'table-name' = 'leader');
INSERT INTO leader
SELECT window_start, window_end, u, n FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY n DESC, u ASC) AS rownum
  FROM (
    SELECT window_start, window_end, u, COUNT(*) AS n
    FROM TABLE(CUMULATE(TABLE orders, DESCRIPTOR(ts), INTERVAL '4' SECOND, INTERVAL '12' SECOND))
    WHERE qty > 1
    GROUP BY window_start, window_end, u
  )
) WHERE rownum <= 1;
"""
    )
    rows = orders()
    counts: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        if r["qty"] > 1:
            for start, end in cumulating(ms_of(r), 4_000, 12_000):
                counts[(start, end)][r["u"]] += 1
    expected = []
    for (start, end), per_user in counts.items():
        u, n = min(per_user.items(), key=lambda item: (-item[1], item[0]))
        expected.append({"window_start": start, "window_end": end, "u": u, "n": n})
    assert len(expected) >= 30
    assert multiset(run(tmp_path, weir_job, script, rows)["leader"]) == multiset(expected)


OUT = "CREATE TABLE out (u STRING, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'out', 'format' = 'json');\n"


@pytest.mark.parametrize(
    ("tvf", "message"),
    [
        ("CUMULATE(TABLE orders, DESCRIPTOR(ts), INTERVAL '3' SECOND, INTERVAL '10' SECOND)", "CUMULATE's size"),
        ("CUMULATE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND)", "CUMULATE takes (TABLE t, DESCRIPTOR"),
        ("CUMULATE(TABLE orders, DESCRIPTOR(id), INTERVAL '1' SECOND, INTERVAL '10' SECOND)", "not its event time"),
        ("SESSION(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND)", "SESSION takes (TABLE t PARTITION BY keys"),
    ],
)
def test_refused_cumulate(tvf: str, message: str) -> None:
    with pytest.raises(SqlError, match=r"^SQL 7:\d+: ") as info:
        plan_script(
            ORDERS + OUT + f"INSERT INTO out SELECT u, COUNT(*) FROM TABLE({tvf}) GROUP BY u, window_start, window_end;"
        )
    assert message in str(info.value)
