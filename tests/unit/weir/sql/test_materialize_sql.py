"""The upsert materializer in SQL (``SET 'table.exec.sink.upsert-materialize'``, weir.sql.plan's
decision, weir.sql.materialize's operator): where the planner adds it (AUTO: the sink's PRIMARY KEY
holds no upsert key of its input, as Flink's planner decides; FORCE; NONE), EXPLAIN's line and uid,
and bench/flink's ``materialize_group_by.sql`` and ``materialize_left_join.sql`` run in this process
over Nexmark events (and an upsert-kafka table of auction tags): with the materializer the sinks'
final tables are plain Python's, also through a failure at every checkpoint and crash point; written
as they come (NONE) the GROUP BY's is not."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_changelog_join_sql import nexmark_events, script
from tests.unit.weir.sql.test_retract import UPSERT, job_file, sink_values
from tests.unit.weir.sql.test_upsert import ACCOUNTS, rows, sink_table
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import explain, plan_script, source_uid
from weir.sql.changelog import Change, RowKind
from weir.sql.errors import SqlError
from weir.sql.plan import Materializer

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

TAGS = "'connector' = 'upsert-kafka', 'topic' = 'tags', 'key.format' = 'json', 'value.format' = 'json'"
SET = "SET 'table.exec.sink.upsert-materialize' = '{}';\n"

ORDERS = f"""CREATE TABLE o (id BIGINT, u STRING, amount BIGINT) WITH ('connector' = 'kafka', 'topic' = 'o',
  'format' = 'json');
CREATE TABLE by_u (u STRING, n BIGINT, PRIMARY KEY (u) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE by_u_n (u STRING, n BIGINT, PRIMARY KEY (u, n) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE by_id (id BIGINT, owner STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE by_owner (id BIGINT, owner STRING, PRIMARY KEY (owner) NOT ENFORCED) WITH ({UPSERT});
CREATE TABLE owners (owner STRING, n BIGINT, PRIMARY KEY (owner) NOT ENFORCED) WITH ({UPSERT});
"""


def sink_of(text: str) -> Any:
    (statement,) = plan_script(text).inserts
    return statement.plan.sink


# Where the planner adds it ----------------------------------------------------------------------------------

AUTO_CASES = [
    ("a GROUP BY to its keys", "INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u;", None),
    ("a GROUP BY to a key holding its keys", "INSERT INTO by_u_n SELECT u, COUNT(*) FROM o GROUP BY u;", None),
    (
        "a GROUP BY to fewer columns than its keys",
        "INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u, id;",
        Materializer(None),
    ),
    (
        "a GROUP BY to a key of an aggregate",
        "INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u, amount;",
        Materializer(None),
    ),
    ("a changelog source to its primary key", "INSERT INTO by_id SELECT id, owner FROM accounts;", None),
    (
        "a changelog source to another column",
        "INSERT INTO by_owner SELECT id, owner FROM accounts WHERE id > 3;",
        Materializer(("id",)),
    ),
    (
        "a changelog source's computed key",
        "INSERT INTO by_id SELECT id + 1, owner FROM accounts;",
        Materializer(None),
    ),
    (
        "a join of two GROUP BYs on their keys, to that key",
        "INSERT INTO owners SELECT A.owner, C.n FROM (SELECT owner, COUNT(*) AS k FROM accounts GROUP BY owner) AS A "
        "JOIN (SELECT u, COUNT(*) AS n FROM o GROUP BY u) AS C ON A.owner = C.u;",
        None,
    ),
    (
        "a LEFT JOIN of a changelog source to a GROUP BY, to the source's key",
        "INSERT INTO by_id SELECT T.id, T.owner FROM accounts AS T "
        "LEFT JOIN (SELECT u, COUNT(*) AS n FROM o GROUP BY u) AS C ON T.owner = C.u;",
        Materializer(None),  # keyed by the join key (owner), a row's -U and +U of two owners may cross
    ),
    (
        "a LEFT JOIN of a changelog source to a GROUP BY, to the join key",
        "INSERT INTO owners SELECT T.owner, C.n FROM accounts AS T "
        "LEFT JOIN (SELECT u, COUNT(*) AS n FROM o GROUP BY u) AS C ON T.owner = C.u;",
        Materializer(None),
    ),
    (
        "a join of an append table (no key) with a changelog, to the changelog's key",
        "INSERT INTO owners SELECT A.owner, o.amount FROM o JOIN accounts AS A ON o.u = A.owner;",
        Materializer(None),
    ),
]


@pytest.mark.parametrize(("what", "statement", "materializer"), AUTO_CASES, ids=[c[0] for c in AUTO_CASES])
def test_auto_adds_it_where_the_sink_key_holds_no_upsert_key_of_the_input(
    what: str, statement: str, materializer: Materializer | None
) -> None:
    text = ACCOUNTS + ORDERS + statement
    assert sink_of(text).materializer == materializer
    assert sink_of(SET.format("auto") + text).materializer == materializer
    assert sink_of(SET.format("NONE") + text).materializer is None
    forced = sink_of(SET.format("FORCE") + text)
    assert forced.materializer is not None and not forced.keeps_update_before  # it writes no -U


def test_under_none_a_narrower_key_keeps_each_minus_u_deleting_its_key() -> None:
    sink = sink_of(
        SET.format("NONE") + ACCOUNTS + ORDERS + "INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u, id;"
    )
    assert sink.materializer is None and sink.keeps_update_before


def test_an_append_result_gets_none_even_when_forced() -> None:
    text = SET.format("FORCE") + ACCOUNTS + ORDERS + "INSERT INTO by_id SELECT id, u FROM o;"
    assert sink_of(text).materializer is None


def test_a_setting_applies_to_the_inserts_after_it() -> None:
    narrower = "INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u, id;\n"
    text = ACCOUNTS + ORDERS + narrower + SET.format("NONE") + narrower
    first, second = plan_script(text).inserts
    assert first.plan.sink.materializer == Materializer(None) and second.plan.sink.materializer is None


def test_another_value_is_refused_in_one_line_with_its_position() -> None:
    with pytest.raises(SqlError) as raised:
        plan_script(ACCOUNTS + ORDERS + SET.format("ALWAYS"))
    text = str(raised.value)
    line = (ACCOUNTS + ORDERS).count("\n") + 1
    assert text == (
        f"SQL {line}:1: SET 'table.exec.sink.upsert-materialize': 'ALWAYS' is not 'NONE', 'AUTO' or 'FORCE'"
    ), text


def test_explain_shows_it_with_its_uid_and_the_other_uids_unchanged() -> None:
    text = ACCOUNTS + ORDERS + "INSERT INTO by_owner SELECT id, owner FROM accounts WHERE id > 3;"
    (statement,) = plan_script(text).inserts
    lines = explain(text).splitlines()
    line = next(line for line in lines if "upsert-materializer" in line)
    assert line == (
        f"{statement.uid_prefix}-upsert-materializer  sink-upsert-materializer: the rows of each by_owner key "
        "(owner) in order of arrival, retracted by the upsert key (id); emits [+I, +U, -D]"
    )
    without = explain(SET.format("NONE") + text).splitlines()
    assert [line for line in lines if "upsert-materializer" not in line and not line.startswith("==")] == [
        line.replace("-U delete their key", "-U dropped") for line in without if not line.startswith("==")
    ]
    ttl = explain("SET 'table.exec.state.ttl' = '1 h';\n" + text)
    assert "retracted by the upsert key (id), state TTL 3600000 ms; emits" in ttl


# The bench files in process ---------------------------------------------------------------------------------


def tag_records(auctions: Sequence[int], seed: int = 7) -> tuple[list[Change], dict[int, str]]:
    """The upsert-kafka table of auction tags as its source decodes it (+U of a row, -D of a key):
    most auctions tagged with one of a few tags, some retagged, some deleted, some tagged again; its
    final rows."""
    rng = random.Random(seed)
    records: list[Change] = []
    final: dict[int, str] = {}

    def put(auction: int, tag: str) -> None:
        records.append(Change(RowKind.UPDATE_AFTER, {"auction": auction, "tag": tag, "weight": 1}))
        final[auction] = tag

    for a in auctions:
        if rng.random() < 0.9:
            put(a, f"t{rng.randrange(8)}")
    for a in auctions:
        roll = rng.random()
        if roll < 0.3:
            put(a, f"t{rng.randrange(8)}")
        elif roll < 0.45:
            records.append(Change(RowKind.DELETE, {"auction": a, "tag": None, "weight": None}))
            final.pop(a, None)
        if roll < 0.1:
            put(a, "t-back")
    return records, final


def expected_group_by(events: Sequence[Any]) -> Counter[str]:
    counts: Counter[tuple[int, int]] = Counter((e.auction, e.bidder) for e in events if isinstance(e, nx.Bid))
    return rows({"auction": a} for a in {a for (a, _b), n in counts.items() if n == 1})


def expected_left_join(events: Sequence[Any], tags: dict[int, str]) -> Counter[str]:
    bid_on = {e.auction for e in events if isinstance(e, nx.Bid)}
    return rows({"tag": t} for t in {t for a, t in tags.items() if a not in bid_on})


def test_a_group_by_to_a_narrower_key_is_right_with_the_materializer_and_wrong_without(
    tmp_path: Path, weir_job: RunJob
) -> None:
    """bench/flink's materialize_group_by.sql: an auction stays in the sink while one of its bidders
    has bid once. Written as they come (NONE), a group leaving at a bidder's second bid deletes the
    auction though another group of it is still in the result: the final table is not Python's."""
    want = expected_group_by(nexmark_events())
    assert len(want) >= 20
    text = script("materialize_group_by")
    assert "upsert-materializer" in explain(text)
    (tmp_path / "auto").mkdir()
    run = weir_job(job_file(tmp_path / "auto", text), checkpoint_every=150)
    assert sink_table(sink_values(run, text), ("auction",), kept=False) == want
    run.with_failures()  # a failure at every checkpoint and crash point: the committed output is the same

    none = SET.format("NONE") + text
    assert "upsert-materializer" not in explain(none)
    (tmp_path / "none").mkdir()
    wrong = weir_job(job_file(tmp_path / "none", none), checkpoint_every=40)
    table = sink_table(sink_values(wrong, none), ("auction",), kept=True)
    assert table != want
    assert set(table) < set(want)  # auctions still in the result, deleted from the sink


def test_a_left_join_of_changelogs_to_a_key_of_neither_leaves_python_s_final_table(
    tmp_path: Path, weir_job: RunJob
) -> None:
    """bench/flink's materialize_left_join.sql: each tag carried by an auction without a bid."""
    events = nexmark_events()
    auctions = sorted({e.id for e in events if isinstance(e, nx.Auction)})
    records, tags = tag_records([*auctions, max(auctions) + 1])
    want = expected_left_join(events, tags)
    assert 3 <= len(want) < len(set(tags.values()))  # some tags are in the result, some are not
    text = script("materialize_left_join").replace("${UPSERT_SOURCE}", TAGS)
    assert "upsert-materializer" in explain(text)
    run = weir_job(job_file(tmp_path, text), checkpoint_every=150, records={source_uid("tagged_auction"): records})
    assert sink_table(sink_values(run, text), ("tag",), kept=False) == want
    run.with_failures()
