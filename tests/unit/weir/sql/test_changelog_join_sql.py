"""Regular joins of changelogs in SQL (weir.sql.changelog_join) and a Top-N of an updating result
(weir.sql.ranking.RetractingRankedRows): the benchmark's join_aggregates.sql (an inner join of two
GROUP BY results), left_join_bids.sql (a LEFT JOIN of auctions and their bids' GROUP BY) and
top_n_updating.sql (each auction's three most frequent bidders) run in this process over Nexmark
events (``weir_job``: the job's own operators and checkpoints, then again with a failure at every
checkpoint and crash point), their upsert sinks' final tables (the upserts and deletes applied in
order) equal to plain Python's, as multisets of whole rows; EXPLAIN names the operator and its
changelog; the planner's refusals are one line with their position."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_retract import QUERIES, ROOT, UPSERT, job_file, sink_values
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import explain, plan_script
from weir.sql.changelog import Change, accumulates
from weir.sql.changelog_join import RowsKept, SideRows, rows_kept
from weir.sql.errors import SqlError
from weir.sql.plan import Join, unique_key

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

EVENTS = 1_500
CONFIG = nx.NexmarkConfig(events_per_second=100)


def script(query: str, events: int = EVENTS) -> str:
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    ddl = ddl.replace("'events.num' = '100000'", f"'events.num' = '{events}'")
    ddl = ddl.replace("'first-event.rate' = '10000'", f"'first-event.rate' = '{CONFIG.events_per_second}'")
    return ddl + "\n" + (QUERIES / f"{query}.sql").read_text().replace("${UPSERT_SINK}", UPSERT)


def final_table(values: Iterable[Any], key: Sequence[str]) -> Counter[str]:
    """An upsert sink's changes applied in order: +I/+U write the key's row, -U/-D delete the key
    (which must hold a row)."""
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for value in values:
        assert isinstance(value, Change), value
        at = tuple(value.row[k] for k in key)
        if accumulates(value.kind):
            table[at] = dict(value.row)
        else:
            assert at in table, f"{value} deletes a key the sink does not hold"
            del table[at]
    return Counter(json.dumps(r, sort_keys=True) for r in table.values())


def nexmark_events() -> list[Any]:
    return [nx.event(n, CONFIG) for n in range(EVENTS)]


def expected_join_aggregates(events: Sequence[Any]) -> Counter[str]:
    auctions: Counter[int] = Counter(e.seller for e in events if isinstance(e, nx.Auction))
    prices: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if isinstance(e, nx.Bid):
            prices[e.bidder].append(e.price)
    rows = [
        {"seller": seller, "auctions": n, "bids": len(prices[seller]), "top": max(prices[seller])}
        for seller, n in auctions.items()
        if seller in prices
    ]
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


def expected_left_join_bids(events: Sequence[Any]) -> Counter[str]:
    prices: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if isinstance(e, nx.Bid):
            prices[e.auction].append(e.price)
    rows = [
        {
            "id": a.id,
            "seller": a.seller,
            "bids": len(prices[a.id]) if a.id in prices else None,
            "top": max(prices[a.id]) if a.id in prices else None,
        }
        for a in events
        if isinstance(a, nx.Auction)
    ]
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


def expected_top_n_updating(events: Sequence[Any]) -> Counter[str]:
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for e in events:
        if isinstance(e, nx.Bid):
            counts[e.auction][e.bidder] += 1
    rows = [
        {"auction": auction, "bidder": bidder, "bids": n, "rownum": rownum}
        for auction, per_bidder in counts.items()
        for rownum, (bidder, n) in enumerate(sorted(per_bidder.items(), key=lambda b: (-b[1], b[0]))[:3], start=1)
    ]
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


@pytest.mark.parametrize(
    ("query", "key", "reference"),
    [
        ("join_aggregates", ("seller",), expected_join_aggregates),
        ("left_join_bids", ("id",), expected_left_join_bids),
        ("top_n_updating", ("auction", "rownum"), expected_top_n_updating),
    ],
)
def test_a_join_of_changelogs_leaves_the_final_table_plain_python_computes(
    tmp_path: Path, weir_job: RunJob, query: str, key: tuple[str, ...], reference: Any
) -> None:
    text = script(query)
    expected = reference(nexmark_events())
    run = weir_job(job_file(tmp_path, text), checkpoint_every=40)
    values = sink_values(run, text)
    assert len(values) > sum(expected.values())  # rows were retracted and replaced on the way
    assert final_table(values, key) == expected
    assert sum(expected.values()) >= 20
    if query == "left_join_bids":  # some auctions have no bid: their rows padded with NULLs remain
        assert any(json.loads(r)["bids"] is None for r in expected)
    run.with_failures()  # a failure at every checkpoint and crash point: the committed output is the same


BY_UNIQUE_KEY = """
CREATE TABLE per_seller (seller BIGINT, bids BIGINT, PRIMARY KEY (seller) NOT ENFORCED) WITH (${UPSERT_SINK});

INSERT INTO per_seller
SELECT A.seller, SUM(B.n)
FROM auction AS A
JOIN (SELECT auction, bidder, COUNT(*) AS n FROM bid GROUP BY auction, bidder) AS B ON A.id = B.auction
GROUP BY A.seller;
"""


def test_a_side_kept_by_a_unique_key_no_one_reads_above_the_join_leaves_the_final_table_plain_python_computes(
    tmp_path: Path, weir_job: RunJob
) -> None:
    """B's rows are kept by (auction, bidder), the GROUP BY's keys: its projection builds ``bidder``
    though nothing above the join reads it (a pruned key would fold a key's rows into one)."""
    ddl = script("join_aggregates").split("CREATE TABLE nexmark_join_aggregates")[0]
    text = ddl + BY_UNIQUE_KEY.replace("${UPSERT_SINK}", UPSERT)
    assert _kept(_join_of(text))[1] == SideRows(RowsKept.BY_UNIQUE_KEY, ("auction", "bidder"))
    events = nexmark_events()
    sellers = {e.id: e.seller for e in events if isinstance(e, nx.Auction)}
    bids: Counter[int] = Counter(sellers[e.auction] for e in events if isinstance(e, nx.Bid) and e.auction in sellers)
    expected = Counter(json.dumps({"seller": s, "bids": n}, sort_keys=True) for s, n in bids.items())
    assert len(expected) >= 5 and max(bids.values()) > 1
    run = weir_job(job_file(tmp_path, text), checkpoint_every=40)
    assert final_table(sink_values(run, text), ("seller",)) == expected


def test_explain_names_the_changelog_join_and_what_it_emits() -> None:
    text = explain(script("left_join_bids"))
    line = next(line for line in text.splitlines() if "changelog-join" in line)
    assert "A LEFT JOIN B ON id = auction (regular join of A append, B changelog), emits [+I, -U, +U, -D]" in line


ORDERS = """CREATE TABLE o (id BIGINT, u STRING, amount DOUBLE) WITH ('connector' = 'kafka', 'topic' = 'o',
  'format' = 'json');
CREATE TABLE p (u STRING, n BIGINT, PRIMARY KEY (u) NOT ENFORCED) WITH ('connector' = 'upsert-kafka', 'topic' = 'p',
  'key.format' = 'json', 'value.format' = 'json');
CREATE TABLE out (u STRING, n BIGINT, PRIMARY KEY (u) NOT ENFORCED) WITH ('connector' = 'upsert-kafka',
  'topic' = 'out', 'key.format' = 'json', 'value.format' = 'json');
CREATE TABLE appended (u STRING, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'a', 'format' = 'json');
"""

REFUSED = [
    (
        "INSERT INTO appended SELECT o.u, p.n FROM o JOIN p ON o.u = p.u;",
        "an outer join, or a join of an updating result, gives updating results; the sink must be",
        "o.u,",
    ),
    (
        "INSERT INTO out SELECT o.u, p.n FROM o LEFT JOIN p ON o.u = p.u AND o.amount > 2;",
        "a LEFT JOIN's ON is equalities of a column of each side only",
        "o.amount > 2",
    ),
    (
        "INSERT INTO out SELECT o.u, p.n FROM o LEFT SEMI JOIN p ON o.u = p.u;",
        "LEFT SEMI JOIN is not supported (INNER, LEFT, RIGHT and FULL [OUTER] JOIN are)",
        "p ON",
    ),
]


@pytest.mark.parametrize(("statement", "message", "at"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_refused_join_is_one_line_with_its_position(statement: str, message: str, at: str) -> None:
    line = ORDERS.count("\n") + 1
    with pytest.raises(SqlError) as raised:
        plan_script(ORDERS + statement)
    text = str(raised.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(f"SQL {line}:{statement.index(at) + 1}: "), text


@pytest.mark.parametrize(
    ("query", "key", "reference"),
    [
        ("join_aggregates", ("seller",), expected_join_aggregates),
        ("top_n_updating", ("auction", "rownum"), expected_top_n_updating),
    ],
)
def test_under_mini_batch_the_final_table_is_the_same(
    tmp_path: Path, weir_job: RunJob, query: str, key: tuple[str, ...], reference: Any
) -> None:
    """The GROUP BYs batched (their changelogs shorter), the join and the Top-N applied row by row."""
    from bench.nexmark_bench import MINI_BATCH_SETTINGS

    text = MINI_BATCH_SETTINGS + script(query)
    assert "mini-batch" in explain(text)
    run = weir_job(job_file(tmp_path, text), checkpoint_every=40)
    assert final_table(sink_values(run, text), key) == reference(nexmark_events())


def _join_of(text: str) -> Join:
    node: Any = plan_script(text).inserts[-1].plan.sink.input
    while not isinstance(node, Join):
        node = node.input
    return node


def _kept(join: Join) -> tuple[SideRows, SideRows]:
    return (
        rows_kept(unique_key(join.left), [k.sql for k in join.left_keys]),
        rows_kept(unique_key(join.right), [k.sql for k in join.right_keys]),
    )


@pytest.mark.parametrize(
    ("text", "left", "right"),
    [
        (script("join_aggregates"), SideRows(RowsKept.ONE_ROW), SideRows(RowsKept.ONE_ROW)),  # GROUP BYs on their keys
        (script("left_join_bids"), SideRows(RowsKept.BY_ROW), SideRows(RowsKept.ONE_ROW)),  # an append side: by row
        (  # an upsert-kafka table joined on its primary key
            ORDERS + "INSERT INTO out SELECT o.u, p.n FROM o JOIN p ON o.u = p.u;",
            SideRows(RowsKept.BY_ROW),
            SideRows(RowsKept.ONE_ROW),
        ),
        (  # a GROUP BY's keys beyond the join key, through a WHERE and a projection renaming them
            ORDERS + "INSERT INTO out SELECT p.u, g.total FROM p JOIN (SELECT u AS who, id AS i, COUNT(*) AS total "
            "FROM o GROUP BY u, id) AS g ON p.u = g.who WHERE g.total > 1;",
            SideRows(RowsKept.ONE_ROW),
            SideRows(RowsKept.BY_UNIQUE_KEY, ("who", "i")),
        ),
        (  # a projection that drops a key column: no unique key known
            ORDERS + "INSERT INTO out SELECT p.u, g.total FROM p JOIN (SELECT u, COUNT(*) AS total "
            "FROM o GROUP BY u, id) AS g ON p.u = g.u;",
            SideRows(RowsKept.ONE_ROW),
            SideRows(RowsKept.BY_ROW),
        ),
    ],
    ids=["join_aggregates", "left_join_bids", "upsert-table", "unique-key", "key-dropped"],
)
def test_each_side_keeps_its_rows_by_what_the_planner_knows_of_its_unique_key(
    text: str, left: SideRows, right: SideRows
) -> None:
    assert _kept(_join_of(text)) == (left, right)
