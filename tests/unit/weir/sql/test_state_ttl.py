"""SET 'table.exec.state.ttl' on a regular join's and a GROUP BY without a window's state, run in
this process (virtual processing time: 1 ms per source record), each sink's committed rows
compared, as a multiset of whole records, with plain Python that forgets a key idle for the TTL.
The rows come in runs of 10 of one key and 10 of the other: within a run a key's state is written
every millisecond, between runs it is idle 11 ms, longer than the TTL of 5 ms and shorter than 20."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import ORDERS, multiset, orders
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import explain, plan_script, source_uid

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

KEY = "CASE WHEN MOD(id, 20) < 10 THEN 'x' ELSE 'y' END"


def run(tmp_path: Path, weir_job: RunJob, script: str, rows: list[dict[str, Any]]) -> list[Any]:
    job = tmp_path / "sql_ttl_job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    result = weir_job(job, sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]}, ms_per_record=1)
    (statement,) = plan_script(script).inserts
    (uid,) = [u for u in result.sinks if u.startswith(statement.uid_prefix + "-")]
    return [json.loads(r) if isinstance(r, bytes | str) else r for r in result.sinks[uid]]


def key(row: dict[str, Any]) -> str:
    return "x" if row["id"] % 20 < 10 else "y"


@pytest.mark.parametrize(("ttl", "forgets"), [("5 ms", True), ("20ms", False), (None, False)])
def test_group_by_state_ttl(tmp_path: Path, weir_job: RunJob, ttl: str | None, forgets: bool) -> None:
    setting = "" if ttl is None else f"SET 'table.exec.state.ttl' = '{ttl}';\n"
    script = (
        ORDERS
        + setting
        + f"""CREATE TABLE per_key (k STRING, n BIGINT, qtys BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'per-key', 'key.format' = 'json', 'value.format' = 'json');
INSERT INTO per_key SELECT {KEY} AS k, COUNT(*), SUM(qty) FROM orders GROUP BY {KEY};
"""
    )
    rows = orders(80)
    held: dict[str, tuple[int, int]] = {}
    last: dict[str, int] = {}
    expected = []
    for i, r in enumerate(rows):
        k = key(r)
        if forgets and k in last and i - last[k] > 5:
            del held[k]
        n, qtys = held.get(k, (0, 0))
        held[k], last[k] = (n + 1, qtys + r["qty"]), i
        expected.append({"k": k, "n": n + 1, "qtys": qtys + r["qty"]})
    assert ("group-aggregate-ttl" in explain(script)) == (ttl is not None)
    assert multiset(run(tmp_path, weir_job, script, rows)) == multiset(expected)


@pytest.mark.parametrize(("ttl", "forgets"), [("5 ms", True), (None, False)])
def test_regular_join_state_ttl(tmp_path: Path, weir_job: RunJob, ttl: str | None, forgets: bool) -> None:
    setting = "" if ttl is None else f"SET 'table.exec.state.ttl' = '{ttl}';\n"
    script = (
        ORDERS
        + setting
        + f"""CREATE TABLE pairs (a BIGINT, b BIGINT)
  WITH ('connector' = 'kafka', 'topic' = 'pairs', 'format' = 'json');
INSERT INTO pairs SELECT o.id AS a, p.id AS b FROM orders o, orders p
WHERE {KEY.replace("id", "o.id")} = {KEY.replace("id", "p.id")} AND o.id <> p.id;
"""
    )
    rows = orders(60)
    expected = [
        {"a": o["id"], "b": p["id"]}
        for o in rows
        for p in rows
        if o["id"] != p["id"] and key(o) == key(p) and (not forgets or o["id"] // 10 == p["id"] // 10)
    ]
    assert len(expected) > 100
    assert multiset(run(tmp_path, weir_job, script, rows)) == multiset(expected)
