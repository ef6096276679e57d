"""A Top-N without a window over a regular join whose condition goes beyond its key (Nexmark q9's
winning bids): ``SELECT A.*, B.x, ..., ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC,
B.dateTime) ... FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND
A.expires``. ``A.*`` gives side A's columns by their own names; the OVER's expressions, written over
the join, read the inner SELECT's columns that select them. Each job runs in this process
(``weir_job``), its upsert sink's final table compared, as a multiset of whole rows, with plain
Python over the same input, with and without injected failures; the planner's pieces on their own;
a refusal per construct, one line with its line:column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_nexmark_sql import CONFIG, EVENTS, script
from tests.unit.weir.sql.test_retract import UPSERT, final_table, job_file, multiset, sink_values
from tests.unit.weir.sql.test_run import BASE_MS
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import plan_script, source_uid
from weir.sql.errors import SqlError
from weir.sql.plan import Project, TopN
from weir.tools import nexmark_reference as ref

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

TABLES = """CREATE TABLE auction (id BIGINT, itemName STRING, `dateTime` TIMESTAMP(3), expires TIMESTAMP(3),
  extra STRING, WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND)
  WITH ('connector' = 'kafka', 'topic' = 'auctions', 'format' = 'json');
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND)
  WITH ('connector' = 'kafka', 'topic' = 'bids', 'format' = 'json');
"""
WINNING = f"""CREATE TABLE winning (id BIGINT, itemName STRING, `dateTime` TIMESTAMP(3), expires TIMESTAMP(3),
  extra STRING, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP(3), PRIMARY KEY (id) NOT ENFORCED)
  WITH ({UPSERT});
INSERT INTO winning
SELECT id, itemName, `dateTime`, expires, extra, bidder, price, bid_dateTime FROM (
  SELECT A.*, B.bidder, B.price, B.`dateTime` AS bid_dateTime,
    ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum
  FROM auction A, bid B
  WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires)
WHERE rownum <= 1;
"""


def ts(ms: int) -> str:
    """Milliseconds after 2024-01-01 as Flink's JSON writes a TIMESTAMP(3)."""
    return f"2024-01-01 00:{ms // 60_000:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


AUCTIONS = [  # (id, opening ms, expiry ms)
    (1, 1_000, 5_000),
    (2, 2_000, 3_000),
    (3, 2_500, 9_000),  # no bid in its time: not in the result
]
BIDS = [  # (auction, bidder, price, ms)
    (1, 10, 900, 999),  # before its auction's opening: not counted, though the highest
    (1, 11, 70, 1_500),
    (1, 12, 70, 1_200),  # the same price earlier: the winner
    (1, 13, 800, 5_001),  # after the expiry: not counted
    (1, 14, 60, 5_000),  # at the expiry: counted (BETWEEN is inclusive), lower
    (2, 22, 10, 2_000),  # at the opening: counted, lower
    (2, 20, 30, 2_500),  # the winner
    (2, 21, 30, 3_000),  # the same price later
    (3, 30, 99, 9_001),
    (4, 40, 99, 3_000),  # no such auction
]


def winning_rows() -> list[dict[str, Any]]:
    """Plain Python: each auction's bid of the highest price in [opening, expiry], the earliest."""
    out = []
    for auction, opening, expiry in AUCTIONS:
        counted = [b for b in BIDS if b[0] == auction and opening <= b[3] <= expiry]
        if not counted:
            continue
        _a, bidder, price, ms = min(counted, key=lambda b: (-b[2], b[3]))
        out.append(
            {
                "id": auction,
                "itemName": f"item-{auction}",
                "dateTime": BASE_MS + opening,
                "expires": BASE_MS + expiry,
                "extra": f"a{auction}",
                "bidder": bidder,
                "price": price,
                "bid_dateTime": BASE_MS + ms,
            }
        )
    return out


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_the_winning_bid_of_each_auction_is_its_final_row(tmp_path: Path, weir_job: RunJob, failures: bool) -> None:
    text = TABLES + WINNING
    auctions = [
        {"id": a, "itemName": f"item-{a}", "dateTime": ts(o), "expires": ts(e), "extra": f"a{a}"}
        for a, o, e in AUCTIONS
    ]
    # bids sorted by time: each source's event time ascends; auction 2's first bid is read before it
    bids = [
        {"auction": a, "bidder": who, "price": p, "dateTime": ts(ms), "extra": f"b{who}"}
        for a, who, p, ms in sorted(BIDS, key=lambda b: b[3])
    ]
    run = weir_job(
        job_file(tmp_path, text),
        sources={
            source_uid("auction"): [json.dumps(r).encode() for r in auctions],
            source_uid("bid"): [json.dumps(r).encode() for r in bids],
        },
        checkpoint_every=3,
    )
    if failures:
        run.with_failures()
        run.with_failures(rescale=2)
    expected = multiset(winning_rows())
    assert sum(expected.values()) == 2
    assert final_table(sink_values(run, text), ("id",)) == expected


@pytest.mark.parametrize("failures", [False, True], ids=["failure-free", "injected-failures"])
def test_nexmark_q9_final_table_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob, failures: bool) -> None:
    """The benchmark's q9 file (the suite's query text, its sink upsert-kafka keyed by the auction)."""
    text = script("q9").replace("${UPSERT_SINK}", UPSERT)
    run = weir_job(job_file(tmp_path, text), checkpoint_every=400)
    if failures:
        run.with_failures()
    expected = multiset(ref.q9([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= 20
    values = sink_values(run, text)
    assert len(values) > sum(expected.values())  # a higher bid replaces an auction's row
    assert final_table(values, ("id",)) == expected


def test_a_sides_star_gives_its_columns_by_their_names_and_the_over_reads_the_selected_columns() -> None:
    (insert,) = plan_script(TABLES + WINNING).inserts
    sink = insert.plan.sink
    assert isinstance(sink.input, Project)
    top = sink.input.input
    assert isinstance(top, TopN)
    inner = top.input
    assert isinstance(inner, Project)
    assert [o.name for o in inner.outputs] == [
        *("id", "itemName", "dateTime", "expires", "extra"),  # A.*, in A's order
        *("bidder", "price", "bid_dateTime"),
    ]
    # PARTITION BY A.id, ORDER BY B.price, B.dateTime: the SELECT's id, price and bid_dateTime
    assert [p.sql for p in top.partition] == ["id"]
    assert [(o.value.sql, o.descending) for o in top.order] == [("price", True), ("bid_datetime", False)]
    row = {"id": 1, "price": 5, "bid_dateTime": 7}
    assert [o.value.evaluate(row) for o in top.order] == [5, 7]


def test_both_sides_stars_rename_a_name_given_twice_as_flink_does() -> None:
    text = TABLES + (
        "CREATE TABLE joined (id BIGINT, itemName STRING, `dateTime` TIMESTAMP(3), expires TIMESTAMP(3), extra STRING, "
        "auction BIGINT, bidder BIGINT, price BIGINT, dateTime0 TIMESTAMP(3), extra0 STRING) "
        "WITH ('connector' = 'kafka', 'topic' = 'j', 'format' = 'json');\n"
        "INSERT INTO joined SELECT * FROM (SELECT A.*, B.* FROM auction A JOIN bid B ON A.id = B.auction);\n"
    )
    (insert,) = plan_script(text).inserts
    projection = insert.plan.sink.input
    assert isinstance(projection, Project)
    inner = projection.input
    assert isinstance(inner, Project)
    names = [o.name for o in inner.outputs]
    assert names == [
        *("id", "itemName", "dateTime", "expires", "extra"),
        *("auction", "bidder", "price", "dateTime0", "extra0"),
    ]
    row = {
        **{f"A.{c}": f"a-{c}" for c in ("id", "itemName", "dateTime", "expires", "extra")},
        **{f"B.{c}": f"b-{c}" for c in ("auction", "bidder", "price", "dateTime", "extra")},
    }
    assert [o.evaluate(row) for o in inner.outputs] == [
        *("a-id", "a-itemName", "a-dateTime", "a-expires", "a-extra"),
        *("b-auction", "b-bidder", "b-price", "b-dateTime", "b-extra"),
    ]


RANKED_JOIN = (
    "SELECT id, price FROM (SELECT A.id, B.price, ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY {order}) AS r "
    "FROM auction A, bid B WHERE A.id = B.auction) WHERE r <= 1;"
)
SINKS = f"""CREATE TABLE best (id BIGINT, price BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE per_id (id BIGINT, n BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({UPSERT});
"""
REFUSED = [
    (
        "INSERT INTO best " + RANKED_JOIN.format(order="B.bidder DESC"),
        "B.bidder in a Top-N's OVER (...) is not a column of its SELECT",
        "B.bidder DESC",
    ),
    (
        "INSERT INTO best SELECT id, price FROM (SELECT C.*, ROW_NUMBER() OVER (PARTITION BY id ORDER BY price) AS r "
        "FROM auction A, bid B WHERE A.id = B.auction) WHERE r <= 1;",
        "C.*: no table or alias C in FROM",
        "C.*",
    ),
    (
        "INSERT INTO per_id SELECT A.*, COUNT(*) FROM auction A JOIN bid B ON A.id = B.auction GROUP BY A.id;",
        "SELECT A.* with GROUP BY",
        "A.*",
    ),
    (
        "INSERT INTO best SELECT id, price FROM (SELECT A.id, B.price, RANK() OVER (PARTITION BY A.id ORDER BY "
        "B.price) AS r FROM auction A, bid B WHERE A.id = B.auction) WHERE r <= 1;",
        "RANK() OVER (...) is not supported",
        "RANK()",
    ),
]


@pytest.mark.parametrize(("statement", "message", "at"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_refused_construct_is_one_line_with_its_position(statement: str, message: str, at: str) -> None:
    prefix = TABLES + SINKS
    line = prefix.count("\n") + 1
    with pytest.raises(SqlError) as raised:
        plan_script(prefix + statement)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(f"SQL {line}:{statement.index(at) + 1}: "), text
