"""SQL jobs run in this process by the ``weir_job`` runner (weir.testing: the job's own operators,
checkpoints, no services), each sink's committed records compared, as a multiset of whole records,
with what plain Python computes over the same input."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import plan_script, source_uid

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

ORDERS = """CREATE TABLE orders (
  id BIGINT, u STRING, amount DOUBLE, qty INT, note STRING, ts TIMESTAMP(3),
  total AS amount * qty,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH ('connector' = 'kafka', 'topic' = 'orders', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset');
"""


def orders(n: int = 120) -> list[dict[str, Any]]:
    """Orders in event-time order, a few fields NULL; ts as Flink's JSON writes a TIMESTAMP(3)."""
    rows = []
    for i in range(n):
        ms = 1_000 * i + (i * 37) % 900
        rows.append(
            {
                "id": i,
                "u": f"u{i % 4}",
                "amount": None if i % 13 == 5 else float(i % 9),
                "qty": i % 5,
                "note": None if i % 3 else f"n{i}",
                "ts": f"2024-01-01 00:{ms // 60_000:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}",
            }
        )
    return rows


BASE_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC


def ms_of(row: Mapping[str, Any]) -> int:
    minutes, rest = row["ts"].split(" ")[1].split(":")[1:]
    seconds, millis = rest.split(".")
    return BASE_MS + int(minutes) * 60_000 + int(seconds) * 1_000 + int(millis)


def run(
    tmp_path: Path, weir_job: RunJob, script: str, rows: Iterable[Mapping[str, Any]], *, failures: bool = False
) -> dict[str, list[Any]]:
    """Each sink table's committed rows; with ``failures``, also ``weir test --failures`` over the same
    input (a failure at every checkpoint and crash point: the committed output must not change)."""
    job = tmp_path / "sql_job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    result = weir_job(job, sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]}, checkpoint_every=25)
    if failures:
        result.with_failures()
    by_table = {}
    for statement in plan_script(script).inserts:
        uids = [uid for uid in result.sinks if uid.startswith(statement.uid_prefix + "-")]
        assert len(uids) == 1, uids
        by_table[statement.insert.sink] = result.sinks[uids[0]]
    return by_table


def multiset(records: Iterable[Mapping[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True) for r in records)


def test_projection_where_and_scalar_functions(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + """CREATE TABLE out (id BIGINT, tag STRING, size STRING, note STRING, off DOUBLE, initial STRING,
  total DOUBLE, half BIGINT, late BOOLEAN)
  WITH ('connector' = 'kafka', 'topic' = 'out', 'format' = 'json');
INSERT INTO out
SELECT id,
       UPPER(u) || '-' || CAST(id AS STRING),
       CASE WHEN amount >= 6 THEN 'big' WHEN amount >= 3 THEN 'mid' ELSE 'small' END,
       COALESCE(note, 'none'),
       ABS(amount - 4.5),
       SUBSTRING(u, 2, 1),
       total,
       id / 2,
       ts > TIMESTAMP '2024-01-01 00:01:00'
FROM orders
WHERE (amount > 1 AND NOT u = 'u2') OR MOD(id, 10) = 0;
"""
    )
    rows = orders()
    expected = []
    for r in rows:
        amount = r["amount"]
        keep = (amount is not None and amount > 1 and r["u"] != "u2") or r["id"] % 10 == 0
        if not keep:
            continue
        size = None if amount is None else "big" if amount >= 6 else "mid" if amount >= 3 else "small"
        expected.append(
            {
                "id": r["id"],
                "tag": f"{r['u'].upper()}-{r['id']}",
                "size": "small" if amount is None else size,
                "note": r["note"] if r["note"] is not None else "none",
                "off": None if amount is None else abs(amount - 4.5),
                "initial": r["u"][1],
                "total": None if amount is None else amount * r["qty"],
                "half": r["id"] // 2,
                "late": ms_of(r) > BASE_MS + 60_000,
            }
        )
    assert len(expected) > 40
    assert multiset(run(tmp_path, weir_job, script, rows)["out"]) == multiset(expected)


def test_group_by_emits_each_keys_updated_row_to_an_upsert_sink(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + """CREATE TABLE per_user (u STRING, n BIGINT, amounts DOUBLE, low DOUBLE, high DOUBLE, mean DOUBLE,
  qtys BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'per-user', 'key.format' = 'json', 'value.format' = 'json');
INSERT INTO per_user
SELECT u, COUNT(*), SUM(amount), MIN(amount), MAX(amount), AVG(amount), COUNT(DISTINCT qty)
FROM orders WHERE id <> 7 GROUP BY u;
"""
    )
    rows = orders()
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    expected = []
    for r in rows:
        if r["id"] == 7:
            continue
        seen[r["u"]].append(r)
        group = seen[r["u"]]
        amounts = [g["amount"] for g in group if g["amount"] is not None]
        expected.append(
            {
                "u": r["u"],
                "n": len(group),
                "amounts": sum(amounts) if amounts else None,
                "low": min(amounts) if amounts else None,
                "high": max(amounts) if amounts else None,
                "mean": sum(amounts) / len(amounts) if amounts else None,
                "qtys": len({g["qty"] for g in group}),
            }
        )
    assert len(expected) == len(rows) - 1
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["per_user"]) == multiset(expected)


def windows_of(ms: int, size: int, slide: int) -> list[int]:
    last = ms - ms % slide
    return [start for start in range(last, ms - size, -slide)]


@pytest.mark.parametrize(("tvf", "size", "slide"), [("TUMBLE", 10_000, 10_000), ("HOP", 10_000, 5_000)])
def test_window_tvf_aggregation(tmp_path: Path, weir_job: RunJob, tvf: str, size: int, slide: int) -> None:
    intervals = f"INTERVAL '{size // 1000}' SECOND" if tvf == "TUMBLE" else (
        f"INTERVAL '{slide // 1000}' SECOND, INTERVAL '{size // 1000}' SECOND"
    )
    script = (
        ORDERS
        + f"""CREATE TABLE win (u STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT,
  amounts DOUBLE, top DOUBLE, PRIMARY KEY (u, window_start) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://localhost:5432/weir', 'table-name' = 'win');
INSERT INTO win
SELECT u, window_start, window_end, COUNT(*), SUM(amount), MAX(total)
FROM TABLE({tvf}(TABLE orders, DESCRIPTOR(ts), {intervals}))
WHERE qty > 0
GROUP BY u, window_start, window_end
HAVING COUNT(*) > 1;
"""
    )
    rows = orders()
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["qty"] > 0:
            for start in windows_of(ms_of(r), size, slide):
                groups[(r["u"], start)].append(r)
    expected = []
    for (u, start), members in groups.items():
        if len(members) <= 1:  # HAVING COUNT(*) > 1
            continue
        amounts = [m["amount"] for m in members if m["amount"] is not None]
        totals = [m["amount"] * m["qty"] for m in members if m["amount"] is not None]
        expected.append(
            {
                "u": u,
                "window_start": start,
                "window_end": start + size,
                "n": len(members),
                "amounts": sum(amounts) if amounts else None,
                "top": max(totals) if totals else None,
            }
        )
    assert len(expected) > 40
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["win"]) == multiset(expected)


def test_datagen_rows_are_deterministic_and_a_statement_set_reads_the_table_once(
    tmp_path: Path, weir_job: RunJob
) -> None:
    script = """
CREATE TABLE gen (id BIGINT, v INT, name STRING)
  WITH ('connector' = 'datagen', 'number-of-rows' = '50', 'fields.id.kind' = 'sequence', 'fields.id.start' = '10',
        'fields.v.min' = '0', 'fields.v.max' = '9', 'fields.name.length' = '6');
CREATE TABLE every_row (id BIGINT, v INT, name STRING) WITH ('connector' = 'kafka', 'topic' = 'all');
CREATE TABLE big (id BIGINT, doubled INT) WITH ('connector' = 'kafka', 'topic' = 'big');
EXECUTE STATEMENT SET BEGIN
INSERT INTO every_row SELECT * FROM gen;
INSERT INTO big SELECT id, v * 2 FROM gen WHERE v > 4;
END;
"""
    job = tmp_path / "datagen_job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    first, again = weir_job(job), weir_job(job)
    every, big = plan_script(script).inserts
    (every_uid,) = [u for u in first.sinks if u.startswith(every.uid_prefix + "-")]
    (big_uid,) = [u for u in first.sinks if u.startswith(big.uid_prefix + "-")]
    rows = first.sinks[every_uid]
    assert sorted(r["id"] for r in rows) == list(range(10, 60))
    assert all(0 <= r["v"] <= 9 and len(r["name"]) == 6 for r in rows) and len({r["v"] for r in rows}) > 3
    expected = [{"id": r["id"], "doubled": 2 * r["v"]} for r in rows if r["v"] > 4]
    assert multiset(first.sinks[big_uid]) == multiset(expected) and expected
    assert multiset(again.sinks[every_uid]) == multiset(rows)  # a replay generates the same rows
    assert [u for u in first.output.order if "source" in u] == ["sql-source-gen"]


MIXED_JOB = '''
import json

from weir.sql import sql

SCRIPT = {script!r}


def build(env):
    job = sql(env, SCRIPT)
    rows = job.query("SELECT u, amount * 2 AS twice FROM orders WHERE amount > 5")
    rows.map(lambda r: {{"who": r["u"].upper(), "twice": r["twice"]}}, uid="py-map").sink_to_kafka(
        "py-out", uid="py-sink", serializer=lambda r: json.dumps(r).encode()
    )
'''


def test_a_python_job_reads_a_selects_rows_as_a_stream_beside_the_scripts_inserts(
    tmp_path: Path, weir_job: RunJob
) -> None:
    script = ORDERS + (
        "CREATE TABLE ids (id BIGINT) WITH ('connector' = 'kafka', 'topic' = 'ids');\n"
        "INSERT INTO ids SELECT id FROM orders WHERE qty = 0;\n"
    )
    job = tmp_path / "mixed_job.py"
    job.write_text(MIXED_JOB.format(script=script))
    rows = orders()
    run = weir_job(job, sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]})
    expected = [{"who": r["u"].upper(), "twice": r["amount"] * 2} for r in rows if (r["amount"] or 0) > 5]
    assert expected and multiset(run.sinks["py-sink"]) == multiset(expected)
    (insert,) = plan_script(script).inserts
    (ids_uid,) = [u for u in run.sinks if u.startswith(insert.uid_prefix + "-")]
    assert multiset(run.sinks[ids_uid]) == multiset({"id": r["id"]} for r in rows if r["qty"] == 0)
    assert [u for u in run.output.order if "source" in u] == ["sql-source-orders"]  # one source for both


def test_a_row_that_does_not_decode_goes_to_the_dead_letter_topic_and_the_others_run(
    tmp_path: Path, weir_job: RunJob
) -> None:
    script = ORDERS.replace("'format' = 'json',", "'format' = 'json', 'scan.dead-letter-topic' = 'orders-dlq',") + (
        "CREATE TABLE ids (id BIGINT) WITH ('connector' = 'kafka', 'topic' = 'ids');\n"
        "INSERT INTO ids SELECT id FROM orders;\n"
    )
    job = tmp_path / "dlq_job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    rows = orders(20)
    values = [json.dumps(r).encode() for r in rows]
    values[3] = b"not json"
    values[7] = json.dumps({**rows[7], "qty": "many"}).encode()
    run = weir_job(job, sources={source_uid("orders"): values})
    (insert,) = plan_script(script).inserts
    (sink,) = [u for u in run.sinks if u.startswith(insert.uid_prefix + "-")]
    assert multiset(run.sinks[sink]) == multiset({"id": r["id"]} for r in rows if r["id"] not in (3, 7))


def test_a_row_that_does_not_decode_without_a_dead_letter_topic_fails_naming_the_column() -> None:
    from weir.sql.compile import RowDecoder

    (table,) = plan_script(ORDERS).tables.values()
    decode = RowDecoder(table, ORDERS)
    good = orders(1)[0]
    assert decode(json.dumps(good).encode())["total"] == good["amount"] * good["qty"]
    with pytest.raises(ValueError, match="^column qty: not an integer: 'many'$"):
        decode(json.dumps({**good, "qty": "many"}).encode())
    with pytest.raises(ValueError, match="a row is a JSON object, not list"):
        decode(b"[1, 2]")
