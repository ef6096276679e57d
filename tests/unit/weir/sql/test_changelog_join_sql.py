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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_retract import QUERIES, ROOT, UPSERT, job_file, sink_values
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import explain, plan_script, source_uid
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.changelog_join import RowsKept, SideRows, sides_kept
from weir.sql.errors import SqlError
from weir.sql.plan import Join

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

EVENTS = 1_500
# The tests run under failures (a failure at every checkpoint and crash point: each a rerun from the
# last checkpoint) checkpoint every 150 records: 10 checkpoints over the input, every kind of crash point
# at each (every 40 took 19-36 s a test, a fifth of the unit suite's time in five tests).
CHECKPOINT_EVERY_UNDER_FAILURES = 150
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
    run = weir_job(job_file(tmp_path, text), checkpoint_every=CHECKPOINT_EVERY_UNDER_FAILURES)
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


ONE_ROW_OF_A_TOP_N = """
CREATE TABLE per_seller (seller BIGINT, bids BIGINT, PRIMARY KEY (seller) NOT ENFORCED) WITH (${UPSERT_SINK});

INSERT INTO per_seller
SELECT A.seller, SUM(T.n)
FROM auction AS A
JOIN (
  SELECT auction, n FROM (
    SELECT auction, bidder, n, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY n DESC) AS r
    FROM (SELECT auction, bidder, COUNT(*) AS n FROM bid GROUP BY auction, bidder)
  ) WHERE r = 1
) AS T ON A.id = T.auction
GROUP BY A.seller;
"""


def test_a_deduplication_joined_on_its_partition_keeps_one_row_and_leaves_the_final_table_plain_python_computes(
    tmp_path: Path, weir_job: RunJob
) -> None:
    """T, each auction's most frequent bidder's count (a Top-N of N = 1 over a GROUP BY), has its
    partition as upsert key (``weir.sql.plan.upsert_keys``): joined on it, one row per join key
    (kept by whole row before the planner derived a Top-N's keys)."""
    ddl = script("join_aggregates").split("CREATE TABLE nexmark_join_aggregates")[0]
    text = ddl + ONE_ROW_OF_A_TOP_N.replace("${UPSERT_SINK}", UPSERT)
    assert _kept(_join_of(text)) == (SideRows(RowsKept.BY_ROW), SideRows(RowsKept.ONE_ROW))
    events = nexmark_events()
    sellers = {e.id: e.seller for e in events if isinstance(e, nx.Auction)}
    counts: Counter[tuple[int, int]] = Counter(
        (e.auction, e.bidder) for e in events if isinstance(e, nx.Bid) and e.auction in sellers
    )
    top: dict[int, int] = {}
    for (auction, _), n in counts.items():
        top[auction] = max(top.get(auction, 0), n)
    totals: Counter[int] = Counter()
    for auction, n in top.items():
        totals[sellers[auction]] += n
    expected = Counter(json.dumps({"seller": s, "bids": n}, sort_keys=True) for s, n in totals.items())
    assert len(expected) >= 5 and max(top.values()) > 1
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


# -- RIGHT and FULL joins of two changelogs (bench/flink's right_join_changelogs.sql, full_join_*.sql) ----------

OUTER_QUERIES = ("right_join_changelogs", "full_join_changelogs", "full_join_grouped")
NOTE_TABLES = {
    "right_join_changelogs": "note_right",
    "full_join_changelogs": "note_full",
    "full_join_grouped": "note_grouped",
}
HAVING_BOUND = 25_000_000
"""The files' HAVING: a group leaves once its highest bid reaches it (its NULL-key group stays)."""

Note = dict[str, Any]
Frozen = tuple[tuple[str, Any], ...]


def frozen_row(row: Mapping[str, Any]) -> Frozen:
    return tuple(sorted(row.items()))


def note_history(auction_ids: Sequence[int], notes: int = 240) -> tuple[list[tuple[int, Note | None]], dict[int, Note]]:
    """The notes' upsert-kafka records in order, by id (a row, or None: a tombstone), and the final
    rows: every id noted on an auction (some auctions noted twice, every ninth id on none: NULL), a
    tombstone first for ids never noted, then a third renoted (the same auction), a fifth deleted, a
    tenth noted again, a quarter written again unchanged."""
    records: list[tuple[int, Note | None]] = []
    final: dict[int, Note] = {}

    def put(i: int, note: str, weight: int) -> None:
        auction = None if i % 9 == 0 else auction_ids[(i * 7) % (len(auction_ids) // 2 + 7)]
        row: Note = {"id": i, "auction": auction, "note": note, "weight": weight}
        records.append((i, row))
        final[i] = row

    def delete(i: int) -> None:
        records.append((i, None))
        final.pop(i, None)

    for i in range(1, notes + 1):
        if i % 13 == 0:
            delete(i)  # a tombstone of a key never written: nothing downstream
        put(i, f"n{i % 5}", i % 4 + 1)
    for i in range(1, notes + 1):
        if i % 3 == 0:
            put(i, f"n{(i + 2) % 5}", 7)
        if i % 5 == 0:
            delete(i)
        if i % 10 == 0:
            put(i, "back", 2)
        if i % 4 == 0 and i in final:
            put(i, final[i]["note"], final[i]["weight"])  # the same row again
    return records, final


def note_changes(records: Sequence[tuple[int, Note | None]]) -> list[Change]:
    """The records as the upsert-kafka source decodes them: +U of a row, -D of a key."""
    return [
        Change(RowKind.UPDATE_AFTER, row)
        if row is not None
        else Change(RowKind.DELETE, {"id": i, "auction": None, "note": None, "weight": None})
        for i, row in records
    ]


def expected_outer_joins(events: Sequence[Any], notes: Mapping[int, Note]) -> dict[str, dict[Frozen, Frozen]]:
    """The three sinks' final tables in plain Python, by their sink keys."""
    prices: dict[int | None, list[int]] = defaultdict(list)
    for e in events:
        if isinstance(e, nx.Bid):
            prices[None if e.auction % 10 == 3 else e.auction].append(e.price)
    groups = {k: (len(p), max(p)) for k, p in prices.items() if max(p) < HAVING_BOUND or k is None}
    right: dict[Frozen, Frozen] = {}
    full: dict[Frozen, Frozen] = {}
    joined: list[tuple[str | None, int | None, int | None, int | None]] = []  # note, bids, id, weight
    for n in notes.values():
        a = n["auction"]
        g = groups.get(a) if a is not None else None
        bids, top = g if g is not None else (None, None)
        right[(("id", n["id"]),)] = frozen_row(
            {"id": n["id"], "note": n["note"], "auction": a if g else None, "bids": bids, "top": top}
        )
        row = {"id": n["id"], "auction": a if g else -1, "note": n["note"], "bids": bids, "top": top}
        full[frozen_row({"id": row["id"], "auction": row["auction"]})] = frozen_row(row)
        joined.append((n["note"], bids, n["id"], n["weight"]))
    noted = {n["auction"] for n in notes.values()}
    for k, (bids, top) in groups.items():
        if k is None or k not in noted:
            row = {"id": -1, "auction": -1 if k is None else k, "note": None, "bids": bids, "top": top}
            full[frozen_row({"id": -1, "auction": row["auction"]})] = frozen_row(row)
            joined.append((None, bids, None, None))
    per_note: dict[str, list[tuple[str | None, int | None, int | None, int | None]]] = defaultdict(list)
    for j in joined:
        per_note[j[0] if j[0] is not None else "unnoted"].append(j)
    grouped: dict[Frozen, Frozen] = {}
    for note, rows in per_note.items():
        bids_of = [r[1] for r in rows if r[1] is not None]
        weights = [r[3] for r in rows if r[3] is not None]
        grouped[(("note", note),)] = frozen_row(
            {
                "note": note,
                "total": len(rows),
                "grouped": len(bids_of),
                "noted": sum(1 for r in rows if r[2] is not None),
                "bids": sum(bids_of) if bids_of else None,
                "weight": sum(weights) if weights else None,
            }
        )
    return {"right_join_changelogs": right, "full_join_changelogs": full, "full_join_grouped": grouped}


def auctions_to_note(events: Sequence[Any]) -> list[int]:
    """The auctions with bids and a few past the last one (notes on them match no group)."""
    ids = sorted({e.auction for e in events if isinstance(e, nx.Bid)})
    return [*ids, *range(ids[-1] + 1, ids[-1] + 9)]


OUTER_KEYS = {
    "right_join_changelogs": ("id",),
    "full_join_changelogs": ("id", "auction"),
    "full_join_grouped": ("note",),
}


@pytest.mark.parametrize("query", OUTER_QUERIES)
def test_right_and_full_joins_of_two_changelogs_leave_python_s_final_tables(
    tmp_path: Path, weir_job: RunJob, query: str
) -> None:
    """A GROUP BY result with a NULL key and groups leaving (HAVING) joined with an upsert-kafka
    table's history (updates, tombstones, re-inserts, NULL join keys): RIGHT, FULL, and a GROUP BY
    over the FULL join; each sink's final table is Python's."""
    events = nexmark_events()
    records, notes = note_history(auctions_to_note(events), notes=120)
    text = script(query).replace("${UPSERT_SOURCE}", UPSERT.replace("'out'", "'notes'"))
    run = weir_job(
        job_file(tmp_path, text),
        checkpoint_every=CHECKPOINT_EVERY_UNDER_FAILURES,
        records={source_uid(NOTE_TABLES[query]): note_changes(records)},
    )
    want = expected_outer_joins(events, notes)[query]
    table = final_table(sink_values(run, text), OUTER_KEYS[query])
    assert table == Counter(json.dumps(dict(v), sort_keys=True) for v in want.values())
    assert_outer_cases(query, want)
    if query == "full_join_changelogs":  # both sides outer (~10 s: once)
        run.with_failures()  # a failure at every checkpoint and crash point: the committed output is the same


def assert_outer_cases(query: str, want: Mapping[Frozen, Frozen]) -> None:
    """The final table holds what the comparison is about: padded rows of each side, NULL keys."""
    rows = [dict(v) for v in want.values()]
    match query:
        case "right_join_changelogs":
            assert len(rows) >= 50 and any(r["auction"] is None for r in rows) and any(r["bids"] for r in rows)
        case "full_join_changelogs":
            assert {"id": -1, "auction": -1} in [{"id": r["id"], "auction": r["auction"]} for r in rows]  # NULL key
            assert any(r["id"] == -1 and r["auction"] != -1 for r in rows)  # a group without a note
            assert any(r["id"] != -1 and r["auction"] == -1 for r in rows)  # a note without a group
        case _:
            assert len(rows) >= 5 and any(r["note"] == "unnoted" for r in rows)


def _join_of(text: str) -> Join:
    node: Any = plan_script(text).inserts[-1].plan.sink.input
    while not isinstance(node, Join):
        node = node.input
    return node


def _kept(join: Join) -> tuple[SideRows, SideRows]:
    return sides_kept(join)


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
