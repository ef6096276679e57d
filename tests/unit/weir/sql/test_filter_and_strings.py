"""Aggregate ``FILTER (WHERE ...)``, the string and time functions of the Nexmark suite's queries,
the SESSION window TVF and OVER aggregations over event time, run in this process (``weir_job``) and
compared, as multisets of whole records (NULLs included), with plain Python over the same rows; the
aggregations also under injected failures. Constructs still refused are refused with one line and
their position."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_run import BASE_MS, ORDERS, ms_of, multiset, orders, run, windows_of
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import plan_script, source_uid
from weir.sql.errors import SqlError

if TYPE_CHECKING:
    from pathlib import Path

    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]


def test_group_by_aggregates_with_filter_clauses(tmp_path: Path, weir_job: RunJob) -> None:
    """COUNT(*), COUNT(DISTINCT x), COUNT(x), SUM, AVG and MIN each with a FILTER: a row whose
    condition is FALSE or NULL (``amount > 3`` of a NULL amount) is not aggregated by that call; a
    group none of whose rows passed has COUNT 0 and SUM/AVG/MIN NULL."""
    script = (
        ORDERS
        + """CREATE TABLE per_user (u STRING, big BIGINT, noted_qtys BIGINT, notes BIGINT, amounts DOUBLE,
  mean_qty INT, low DOUBLE, n BIGINT, PRIMARY KEY (u) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = 'per-user', 'key.format' = 'json', 'value.format' = 'json');
INSERT INTO per_user
SELECT u,
       COUNT(*) FILTER (WHERE amount > 3),
       COUNT(DISTINCT qty) FILTER (WHERE note IS NOT NULL),
       count(note) filter (where qty > 0),
       SUM(amount) FILTER (WHERE qty >= 2 AND id > 20),
       AVG(qty) FILTER (WHERE amount > 7),
       MIN(amount) FILTER (WHERE MOD(id, 2) = 0),
       COUNT(*)
FROM orders GROUP BY u;
"""
    )
    rows = orders()
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    expected = []
    for r in rows:
        seen[r["u"]].append(r)
        group = seen[r["u"]]
        summed = [g["amount"] for g in group if g["qty"] >= 2 and g["id"] > 20 and g["amount"] is not None]
        averaged = [g["qty"] for g in group if g["amount"] is not None and g["amount"] > 7]
        lows = [g["amount"] for g in group if g["id"] % 2 == 0 and g["amount"] is not None]
        expected.append(
            {
                "u": r["u"],
                "big": sum(1 for g in group if g["amount"] is not None and g["amount"] > 3),
                "noted_qtys": len({g["qty"] for g in group if g["note"] is not None}),
                "notes": sum(1 for g in group if g["qty"] > 0 and g["note"] is not None),
                "amounts": sum(summed) if summed else None,
                "mean_qty": sum(averaged) // len(averaged) if averaged else None,
                "low": min(lows) if lows else None,
                "n": len(group),
            }
        )
    nulls = {k for row in expected for k, v in row.items() if v is None}
    assert {"amounts", "mean_qty", "low"} <= nulls  # the empty-filter results are exercised
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["per_user"]) == multiset(expected)


def test_window_aggregation_with_filter_clauses(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + """CREATE TABLE win (u STRING, window_start TIMESTAMP(3), n BIGINT, big BIGINT, qtys BIGINT,
  amounts DOUBLE) WITH ('connector' = 'kafka', 'topic' = 'win', 'format' = 'json');
INSERT INTO win
SELECT u, window_start, COUNT(*), COUNT(*) FILTER (WHERE amount >= 6),
       COUNT(DISTINCT qty) FILTER (WHERE qty > 1), SUM(amount) FILTER (WHERE note IS NULL)
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND))
GROUP BY u, window_start, window_end;
"""
    )
    rows = orders()
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        for start in windows_of(ms_of(r), 10_000, 10_000):
            groups[(r["u"], start)].append(r)
    expected = []
    for (u, start), members in groups.items():
        amounts = [m["amount"] for m in members if m["note"] is None and m["amount"] is not None]
        expected.append(
            {
                "u": u,
                "window_start": start,
                "n": len(members),
                "big": sum(1 for m in members if m["amount"] is not None and m["amount"] >= 6),
                "qtys": len({m["qty"] for m in members if m["qty"] > 1}),
                "amounts": sum(amounts) if amounts else None,
            }
        )
    assert len(expected) > 40
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["win"]) == multiset(expected)


BIDS = """CREATE TABLE orders (id BIGINT, url STRING, channel STRING, ts TIMESTAMP(3))
  WITH ('connector' = 'kafka', 'topic' = 'bids', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset');
"""
URLS = [
    "https://www.nexmark.com/abc/de_f/item.htm?query=1&channel_id=1234",
    "https://www.nexmark.com/x/y/item.htm?query=1",
    "channel_id=77&query=2",
    "https://www.nexmark.com//z",
    "a/b",
    "",
    None,
]
CHANNELS = ["Apple", "gOOgle", "channel-12", "x", "", None]


def bid_rows(n: int = 84) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        ms = 1_000 * i * 997
        rows.append(
            {
                "id": i,
                "url": URLS[i % len(URLS)],
                "channel": CHANNELS[i % len(CHANNELS)],
                "ts": None if i % 11 == 4 else f"{_timestamp(BASE_MS + ms)}",
            }
        )
    return rows


def _timestamp(ms: int) -> str:
    import datetime as dt

    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def _split_index(s: str | None, index: int) -> str | None:
    if s is None or s == "":
        return None
    pieces = s.split("/")
    return pieces[index] if index < len(pieces) else None


def _extract(s: str | None, group: int) -> str | None:
    found = None if s is None else re.search("(&|^)channel_id=([^&]*)", s)
    return None if found is None else found.group(group)


def test_string_and_time_functions_with_flinks_null_rules(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        BIDS
        + """CREATE TABLE out (id BIGINT, dir1 STRING, dir9 STRING, channel_id STRING, whole STRING,
  at_item INT, found INT, len INT, up STRING, low STRING, mid STRING, tail STRING, joined STRING, ws STRING,
  `day` STRING, `minute` STRING, h INT, m INT)
  WITH ('connector' = 'kafka', 'topic' = 'out', 'format' = 'json');
INSERT INTO out
SELECT id,
       SPLIT_INDEX(url, '/', 3),
       SPLIT_INDEX(url, '/', 9),
       REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2),
       REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 0),
       INSTR(url, 'item'),
       POSITION('nexmark' IN url),
       CHAR_LENGTH(channel),
       UPPER(channel),
       LOWER(channel),
       SUBSTRING(channel FROM 2 FOR 3),
       SUBSTR(channel, 2),
       CONCAT(channel, '/', url),
       CONCAT_WS('|', channel, CAST(NULL AS STRING), url),
       DATE_FORMAT(ts, 'yyyy-MM-dd'),
       DATE_FORMAT(ts, 'HH:mm'),
       HOUR(ts),
       MINUTE(ts)
FROM orders;
"""
    )
    rows = bid_rows()
    expected = []
    for r in rows:
        url, channel = r["url"], r["channel"]
        ms = None if r["ts"] is None else BASE_MS + 1_000 * r["id"] * 997
        clock = None if ms is None else _timestamp(ms)
        expected.append(
            {
                "id": r["id"],
                "dir1": _split_index(url, 3),
                "dir9": _split_index(url, 9),
                "channel_id": _extract(url, 2),
                "whole": _extract(url, 0),
                "at_item": None if url is None else url.find("item") + 1,
                "found": None if url is None else url.find("nexmark") + 1,
                "len": None if channel is None else len(channel),
                "up": None if channel is None else channel.upper(),
                "low": None if channel is None else channel.lower(),
                "mid": None if channel is None else channel[1:4],
                "tail": None if channel is None else channel[1:],
                "joined": None if channel is None or url is None else f"{channel}/{url}",
                "ws": "|".join(v for v in (channel, url) if v is not None),
                "day": None if clock is None else clock[:10],
                "minute": None if clock is None else clock[11:16],
                "h": None if clock is None else int(clock[11:13]),
                "m": None if clock is None else int(clock[14:16]),
            }
        )
    assert {k for row in expected for k, v in row.items() if v is None} >= {"dir1", "dir9", "channel_id", "day", "up"}
    assert {row["h"] for row in expected} > {None, 0, 1}
    job = tmp_path / "sql_job.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {script!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    result = weir_job(job, sources={source_uid("orders"): [json.dumps(r).encode() for r in rows]})
    ((uid, out),) = [(u, s) for u, s in result.sinks.items() if u.startswith("sql-")]
    assert uid.endswith("-sink")
    assert multiset(out) == multiset(expected)


OUT = "CREATE TABLE out (a STRING, b BIGINT) WITH ('connector' = 'kafka', 'topic' = 'x', 'format' = 'json');\n"

REFUSED = [
    # (the INSERT's SELECT list and FROM, the line's expected text, its column on line 9)
    ("REGEXP_EXTRACT(u, 'x'), 1 FROM orders", "REGEXP_EXTRACT takes its group index", 24),
    ("u, LOCATE('a', u, 2) FROM orders", "INSTR / LOCATE / POSITION take two arguments", 27),
    ("SPLIT_INDEX(u, '/'), 1 FROM orders", "SPLIT_INDEX(string, separator, index) takes three arguments", 24),
    ("UPPER(u) FILTER (WHERE id > 1), 1 FROM orders", "FILTER (WHERE ...) follows an aggregate call", 24),
    ("u, COUNT(*) FILTER (WHERE COUNT(*) > 1) FROM orders GROUP BY u", "an aggregate in FILTER (WHERE ...)", 50),
    ("u, SUM(id) OVER (PARTITION BY u ORDER BY id) FROM orders", "ORDER BY id: not the input's event time", 65),
    (
        "u, SUM(id) OVER (PARTITION BY u ORDER BY ts ROWS BETWEEN 2 PRECEDING AND 1 FOLLOWING) FROM orders",
        "an OVER frame other than ROWS|RANGE BETWEEN ... PRECEDING AND CURRENT ROW",
        27,
    ),
    (
        "u, SUM(id) OVER (PARTITION BY u ORDER BY ts) + COUNT(*) OVER (ORDER BY ts) FROM orders",
        "OVER aggregations over different windows in one SELECT",
        71,
    ),
    (
        "u, SUM(id) OVER (PARTITION BY u ORDER BY ts) FROM orders GROUP BY u",
        "an OVER aggregation with GROUP BY, other aggregates or a window TVF",
        27,
    ),
    ("u, SUM(id) OVER (PARTITION BY u ORDER BY ts DESC) FROM orders", "ORDER BY its input's event time, ascending", 27),
    (
        "u, SUM(id) OVER (PARTITION BY u ORDER BY ts RANGE BETWEEN INTERVAL '1' MONTH PRECEDING AND CURRENT ROW)"
        " FROM orders",
        "RANGE BETWEEN INTERVAL ... PRECEDING takes an INTERVAL literal",
        27,
    ),
    (
        "u, COUNT(*) FROM TABLE(SESSION(TABLE orders, DESCRIPTOR(ts), INTERVAL '5' SECOND))"
        " GROUP BY u, window_start, window_end",
        "SESSION takes (TABLE t PARTITION BY keys, DESCRIPTOR(time column), gap)",
        47,
    ),
    (
        "u, COUNT(*) FROM TABLE(SESSION(TABLE orders PARTITION BY u, DESCRIPTOR(ts), INTERVAL '5' SECOND))"
        " GROUP BY u, note, window_start, window_end",
        "groups by window_start, window_end and exactly its PARTITION BY columns (u)",
        131,
    ),
    (
        "u, id FROM TABLE(SESSION(TABLE orders PARTITION BY u, DESCRIPTOR(ts), INTERVAL '5' SECOND))",
        "a SESSION TVF's rows are aggregated",
        24,
    ),
    (
        "u, COUNT(*) FROM TABLE(HOP(TABLE orders PARTITION BY u, DESCRIPTOR(ts), INTERVAL '5' SECOND,"
        " INTERVAL '10' SECOND)) GROUP BY u, window_start, window_end",
        "HOP takes no PARTITION BY (SESSION does)",
        64,
    ),
    (
        "u, COUNT(*) FROM TABLE(SESSION(TABLE orders PARTITION BY u, DESCRIPTOR(ts), INTERVAL '1' MONTH))"
        " GROUP BY u, window_start, window_end",
        "SESSION takes positive INTERVAL literals",
        109,
    ),
]


@pytest.mark.parametrize(("select", "message", "column"), REFUSED)
def test_refused_with_its_position(select: str, message: str, column: int) -> None:
    text = ORDERS + OUT + f"INSERT INTO out SELECT {select};"
    line = text.count("\n") + 1
    with pytest.raises(SqlError, match=rf"^SQL {line}:{column}: ") as info:
        plan_script(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def session_rows(n: int = 150) -> list[dict[str, Any]]:
    """Orders in event-time order in bursts: a user's rows ~3 s apart within a burst, bursts 10 s apart."""
    rows = orders(n)
    for r in rows:
        i = r["id"]
        ms = 1_000 * i + (i // 12) * 10_000 + (i * 37) % 900
        r["u"] = f"u{i % 3}"
        r["ts"] = _timestamp(BASE_MS + ms)
    return rows


def sessions(times: list[int], gap: int) -> list[tuple[int, int, list[int]]]:
    """Flink's session windows of one key: a row more than ``gap`` after the previous one starts a new
    session; (start, last row's time + gap, the rows' indexes)."""
    out: list[tuple[int, int, list[int]]] = []
    for index, t in sorted(enumerate(times), key=lambda p: p[1]):
        if out and t - (out[-1][1] - gap) <= gap:
            start, _end, members = out[-1]
            out[-1] = (start, t + gap, [*members, index])
        else:
            out.append((t, t + gap, [index]))
    return out


def test_session_tvf_aggregation_per_partition_key(tmp_path: Path, weir_job: RunJob) -> None:
    script = (
        ORDERS
        + """CREATE TABLE sess (u STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT,
  amounts DOUBLE, top INT) WITH ('connector' = 'kafka', 'topic' = 'sess', 'format' = 'json');
INSERT INTO sess
SELECT u, window_start, window_end, COUNT(*), SUM(amount) FILTER (WHERE qty > 1), MAX(qty)
FROM TABLE(SESSION(TABLE orders PARTITION BY u, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY u, window_start, window_end;
"""
    )
    rows = session_rows()
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_user[r["u"]].append(r)
    expected = []
    for u, members in by_user.items():
        for start, end, indexes in sessions([_ms(m["ts"]) for m in members], 5_000):
            session = [members[i] for i in indexes]
            amounts = [m["amount"] for m in session if m["qty"] > 1 and m["amount"] is not None]
            expected.append(
                {
                    "u": u,
                    "window_start": start,
                    "window_end": end,
                    "n": len(session),
                    "amounts": sum(amounts) if amounts else None,
                    "top": max(m["qty"] for m in session),
                }
            )
    assert len(expected) >= 30
    assert any(row["n"] > 2 for row in expected)
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["sess"]) == multiset(expected)


def _ms(text: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(text + "+00:00").timestamp() * 1000)


def over_rows(n: int = 120) -> list[dict[str, Any]]:
    """Orders in event-time order in pairs of one user at the same millisecond (peers), a user's
    pairs 2.5 s apart (a 5 s RANGE reaches exactly back to a pair: the bound is inclusive)."""
    rows = orders(n)
    for r in rows:
        pair = r["id"] // 2
        r["u"] = f"u{pair % 2}"
        r["ts"] = _timestamp(BASE_MS + 1_250 * pair)
    return rows


def over_frame(frame: str, members: list[dict[str, Any]], at: int) -> list[dict[str, Any]]:
    """The rows of one partition (in event-time, then arrival, order) in the frame of ``members[at]``."""
    t = _ms(members[at]["ts"])
    match frame:
        case "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW":
            return members[max(0, at - 2) : at + 1]
        case "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW":
            return members[: at + 1]
        case "RANGE BETWEEN INTERVAL '5' SECOND PRECEDING AND CURRENT ROW":
            return [m for m in members if t - 5_000 <= _ms(m["ts"]) <= t]
        case "RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW" | "":
            return [m for m in members if _ms(m["ts"]) <= t]
    raise AssertionError(frame)


@pytest.mark.parametrize(
    "frame",
    [
        "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW",
        "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
        "RANGE BETWEEN INTERVAL '5' SECOND PRECEDING AND CURRENT ROW",
        "RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW",
        "",
    ],
)
def test_over_aggregation_over_event_time(tmp_path: Path, weir_job: RunJob, frame: str) -> None:
    over = f"OVER (PARTITION BY u ORDER BY ts {frame})"
    script = (
        ORDERS
        + f"""CREATE TABLE running (id BIGINT, u STRING, n BIGINT, amounts DOUBLE, top INT, mean DOUBLE,
  qtys BIGINT) WITH ('connector' = 'kafka', 'topic' = 'running', 'format' = 'json');
INSERT INTO running
SELECT id, u, COUNT(*) {over}, SUM(amount) {over}, MAX(qty) {over}, AVG(amount) {over},
       COUNT(DISTINCT qty) FILTER (WHERE qty > 1) {over}
FROM orders WHERE id <> 11;
"""
    )
    rows = over_rows()
    partitions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["id"] != 11:
            partitions[r["u"]].append(r)
    expected = []
    for members in partitions.values():
        for at, r in enumerate(members):
            frame_rows = over_frame(frame, members, at)
            amounts = [m["amount"] for m in frame_rows if m["amount"] is not None]
            expected.append(
                {
                    "id": r["id"],
                    "u": r["u"],
                    "n": len(frame_rows),
                    "amounts": sum(amounts) if amounts else None,
                    "top": max(m["qty"] for m in frame_rows),
                    "mean": sum(amounts) / len(amounts) if amounts else None,
                    "qtys": len({m["qty"] for m in frame_rows if m["qty"] > 1}),
                }
            )
    assert len(expected) == len(rows) - 1
    assert multiset(run(tmp_path, weir_job, script, rows, failures=True)["running"]) == multiset(expected)
