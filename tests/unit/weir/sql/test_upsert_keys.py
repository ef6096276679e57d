"""The planner's one derivation of a node's upsert keys (``weir.sql.plan.upsert_keys``, Flink's
``FlinkRelMdUpsertKeys``) over each node kind, planned from SQL: each key names the columns as the
node's rows hold them, in the key's own order; and the two things it decides, how a changelog join
keeps each side's rows (``sides_kept``, shown by EXPLAIN) and where an upsert sink gets the
materializer, agree on every shape."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_changelog_join_sql import script
from tests.unit.weir.sql.test_materialize_sql import ORDERS
from tests.unit.weir.sql.test_retract import UPSERT, job_file
from tests.unit.weir.sql.test_upsert import ACCOUNTS, account_history, rows, sink_table, sinks_of
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.sql import explain, plan_script, source_uid
from weir.sql.changelog_join import RowsKept, SideRows, sides_kept
from weir.sql.errors import SqlError
from weir.sql.plan import Aggregate, Filter, Join, Key, Materializer, Node, Project, Scan, TopN, upsert_keys

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

DDL = (
    ACCOUNTS
    + ORDERS
    + """CREATE TABLE wide (a BIGINT, b BIGINT, c BIGINT, PRIMARY KEY (a) NOT ENFORCED) WITH ('connector' =
  'upsert-kafka', 'topic' = 'w', 'key.format' = 'json', 'value.format' = 'json');
CREATE TABLE Mixed (ID BIGINT, Owner STRING, PRIMARY KEY (ID) NOT ENFORCED) WITH ('connector' = 'upsert-kafka',
  'topic' = 'mx', 'key.format' = 'json', 'value.format' = 'json');
CREATE TABLE ab (a BIGINT, b BIGINT, PRIMARY KEY (a, b) NOT ENFORCED) WITH ('connector' = 'upsert-kafka',
  'topic' = 'ab', 'key.format' = 'json', 'value.format' = 'json');
"""
)
GROUPS = "(SELECT u, COUNT(*) AS n FROM o GROUP BY u) AS C"  # a GROUP BY result keyed by u


def nodes(statement: str) -> list[Node]:
    """The statement's nodes from the sink's input down, each node's left input first."""
    (insert,) = plan_script(DDL + statement).inserts
    return below(insert.plan.sink.input)


def below(node: Node) -> list[Node]:
    """``node`` and every node under it, each node's left input first."""
    out: list[Node] = []
    stack: list[Any] = [node]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(getattr(node, f) for f in ("right", "left", "input") if hasattr(node, f))
    return out


def keys_of(statement: str, kind: type[Any], at: int = 0) -> tuple[Key, ...]:
    """The upsert keys of the ``at``-th node of ``kind`` from the sink down."""
    return upsert_keys([n for n in nodes(statement) if isinstance(n, kind)][at])


def join_of(statement: str) -> Join:
    return next(n for n in nodes(statement) if isinstance(n, Join))


# -- scans, projections, filters ---------------------------------------------------------------------------------


def test_a_changelog_scan_has_its_primary_key_an_append_scan_none() -> None:
    assert keys_of("INSERT INTO by_id SELECT id, owner FROM accounts;", Scan) == (("id",),)
    assert keys_of("INSERT INTO by_id SELECT a, CAST(b AS STRING) FROM ab;", Scan) == (("a", "b"),)  # declared order
    assert keys_of("INSERT INTO by_id SELECT ID, Owner FROM Mixed;", Scan) == (("ID",),)  # the rows' own case
    assert keys_of("INSERT INTO by_id SELECT id, u FROM o;", Scan) == ()  # an append table: rows may repeat


@pytest.mark.parametrize(
    ("side", "on", "keys"),
    [
        ("SELECT id, owner FROM accounts", "owner", (("id",),)),  # keeps its key column
        ("SELECT id AS k, owner FROM accounts", "owner", (("k",),)),  # renames it: the output's name
        ("SELECT a.id AS k, a.owner FROM accounts AS a", "owner", (("k",),)),  # qualified
        ("SELECT ID AS k, Owner FROM Mixed", "Owner", (("k",),)),  # another case than the table's
        ("SELECT owner, id, id AS again FROM accounts", "owner", (("id",),)),  # passed twice: the first output
        ("SELECT owner, balance FROM accounts", "owner", ()),  # drops it
        ("SELECT id + 1 AS k, owner FROM accounts", "owner", ()),  # computes from it: not the key
        ("SELECT b AS y, a AS x FROM ab", "x", (("x", "y"),)),  # in the key's order, not the outputs'
        ("SELECT a AS x, b + 1 AS y FROM ab", "x", ()),  # one column of a key computed
        ("SELECT id, owner FROM accounts WHERE balance > 10", "owner", (("id",),)),  # through a WHERE
    ],
)
def test_a_projection_keeps_each_key_whose_every_column_it_passes_through(
    side: str, on: str, keys: tuple[Key, ...]
) -> None:
    other = f"{GROUPS} ON T.{on} = C.u" if on != "x" else "wide AS W ON T.x = W.a"
    join = join_of(f"INSERT INTO by_id SELECT 1, 'x' FROM ({side}) AS T JOIN {other};")
    assert isinstance(join.left, Project | Filter)
    assert upsert_keys(join.left) == keys


def test_a_filter_keeps_its_input_s_keys() -> None:
    assert keys_of("INSERT INTO by_id SELECT id, owner FROM accounts WHERE balance > 10;", Filter) == (("id",),)
    assert keys_of("INSERT INTO by_id SELECT id, u FROM o WHERE amount > 10;", Filter) == ()


# -- aggregates, Top-N ---------------------------------------------------------------------------------------------


def test_a_group_by_has_its_keys_in_their_order_a_global_one_the_empty_key() -> None:
    assert keys_of("INSERT INTO by_u_n SELECT u, id FROM o GROUP BY id, u;", Aggregate) == (("id", "u"),)
    assert keys_of("INSERT INTO by_u_n SELECT u, COUNT(*) FROM o GROUP BY u;", Project) == (("u",),)
    assert keys_of("INSERT INTO by_u SELECT 'all', COUNT(*) FROM o;", Aggregate) == ((),)  # one row in all
    assert keys_of("INSERT INTO by_u SELECT 'all', COUNT(*) FROM o;", Project) == ((),)
    # a HAVING filters the result, its keys stand; a key not selected is lost above it
    assert keys_of("INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u HAVING COUNT(*) > 1;", Project) == (("u",),)
    assert keys_of("INSERT INTO by_u SELECT u, COUNT(*) FROM o GROUP BY u, id;", Project) == ()


def test_a_window_aggregate_s_result_appends_and_has_none() -> None:
    statement = (
        "CREATE TABLE counts (a BIGINT, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'c', 'format' = 'json');\n"
        "INSERT INTO counts SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), "
        "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end;"
    )
    node: Any = plan_script(script("join_aggregates") + "\n" + statement).inserts[-1].plan.sink.input
    while not isinstance(node, Aggregate):
        node = node.input
    assert node.window is not None and upsert_keys(node) == ()


TOP = "SELECT id, owner, balance, ROW_NUMBER() OVER (PARTITION BY owner ORDER BY balance DESC) AS r FROM accounts"


def test_a_deduplication_has_its_partition_and_its_partition_with_the_row_number() -> None:
    statement = f"INSERT INTO owners SELECT owner, balance FROM ({TOP}) WHERE r = 1;"
    assert keys_of(statement, TopN) == (("owner",), ("owner", "r"))
    # the SELECT above it, as the sink's columns (owner, n): the row number not selected, the partition
    assert keys_of(statement, Project) == (("owner",),)


def test_a_top_n_has_its_partition_with_the_row_number_not_its_input_s_keys() -> None:
    statement = f"INSERT INTO by_u_n SELECT owner, r FROM ({TOP}) WHERE r <= 3;"
    assert keys_of(statement, TopN) == (("owner", "r"),)  # not (id): a row moving is retracted after
    assert keys_of(statement, Project) == (("u", "n"),)  # the SELECT above it, as the sink's columns (u, n)
    # as a join's side, its row number dropped: the rows of a partition share their key
    dropped = f"INSERT INTO by_id SELECT 1, 'x' FROM (SELECT owner, balance FROM ({TOP}) WHERE r <= 3) AS T "
    side = join_of(dropped + f"JOIN {GROUPS} ON T.owner = C.u;").left
    assert isinstance(side, Project) and isinstance(side.input, TopN) and upsert_keys(side) == ()


def test_a_top_n_partitioned_by_an_expression_has_none() -> None:
    top = TOP.replace("PARTITION BY owner", "PARTITION BY UPPER(owner)")
    assert keys_of(f"INSERT INTO by_u_n SELECT UPPER(owner), r FROM ({top}) WHERE r <= 3;", TopN) == ()


# -- joins ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "keys"),
    [  # both sides joined on their keys: a pair; a side alone where the other matches once and pads none
        ("", (("A.id", "W.a"), ("A.id",), ("W.a",))),
        ("LEFT", (("A.id", "W.a"), ("A.id",))),
        ("RIGHT", (("A.id", "W.a"), ("W.a",))),
        ("FULL", (("A.id", "W.a"),)),
    ],
)
def test_a_join_of_two_keyed_sides_on_their_keys(kind: str, keys: tuple[Key, ...]) -> None:
    statement = f"INSERT INTO by_id SELECT A.id, A.owner FROM accounts AS A {kind} JOIN wide AS W ON A.id = W.a;"
    assert upsert_keys(join_of(statement)) == keys


@pytest.mark.parametrize(
    ("kind", "keys"),
    [  # C's key holds the join key; A's (id) does not: A's row may move between join keys, so it has none
        ("", ()),
        ("LEFT", ()),
        ("RIGHT", ()),
        ("FULL", ()),
    ],
)
def test_a_side_whose_key_does_not_hold_its_join_key_gives_none(kind: str, keys: tuple[Key, ...]) -> None:
    statement = f"INSERT INTO by_id SELECT A.id, A.owner FROM accounts AS A {kind} JOIN {GROUPS} ON A.owner = C.u;"
    assert upsert_keys(join_of(statement)) == keys


@pytest.mark.parametrize(
    ("kind", "keys"),
    [  # G's key (u, id) holds its join key u but is not within it (many rows of G per u): A's key
        # stands only paired; A has one row per u, so G's stands alone where G is not padded
        ("", (("A.owner", "G.u", "G.id"), ("G.u", "G.id"))),
        ("LEFT", (("A.owner", "G.u", "G.id"),)),
        ("RIGHT", (("A.owner", "G.u", "G.id"), ("G.u", "G.id"))),
        ("FULL", (("A.owner", "G.u", "G.id"),)),
    ],
)
def test_a_side_with_a_key_beyond_its_join_key_pairs_with_the_other_s(kind: str, keys: tuple[Key, ...]) -> None:
    statement = (
        "INSERT INTO by_id SELECT 1, 'x' FROM (SELECT owner, COUNT(*) AS k FROM accounts GROUP BY owner) AS A "
        f"{kind} JOIN (SELECT u, id, COUNT(*) AS n FROM o GROUP BY u, id) AS G ON A.owner = G.u;"
    )
    assert upsert_keys(join_of(statement)) == keys


@pytest.mark.parametrize(
    ("kind", "keys"),
    [  # o appends (no key): only W's key alone could stand, and only where o's join key held a key of o's
        ("", ()),
        ("LEFT", ()),
        ("RIGHT", ()),
        ("FULL", ()),
    ],
)
def test_a_join_with_an_append_side_has_none(kind: str, keys: tuple[Key, ...]) -> None:
    statement = f"INSERT INTO by_id SELECT o.id, o.u FROM o {kind} JOIN wide AS W ON o.id = W.a;"
    assert upsert_keys(join_of(statement)) == keys


def test_a_projection_over_a_join_names_its_keys_by_its_outputs() -> None:
    statement = (
        "INSERT INTO by_id SELECT 1, 'x' FROM (SELECT A.id AS left_id, W.a, A.owner FROM accounts AS A "
        f"LEFT JOIN wide AS W ON A.id = W.a) AS J JOIN {GROUPS} ON J.owner = C.u;"
    )
    assert upsert_keys(join_of(statement).left) == (("left_id", "a"), ("left_id",))


def test_an_interval_join_appends_and_has_none() -> None:
    text = script("join_aggregates") + (
        "\nCREATE TABLE pairs (a BIGINT, b BIGINT) WITH ('connector' = 'kafka', 'topic' = 'p', 'format' = 'json');\n"
        "INSERT INTO pairs SELECT A.id, B.auction FROM auction AS A JOIN bid AS B ON A.id = B.auction "
        "AND B.dateTime BETWEEN A.dateTime AND A.dateTime + INTERVAL '10' SECOND;"
    )
    node: Any = plan_script(text).inserts[-1].plan.sink.input
    while not isinstance(node, Join):
        node = node.input
    assert node.interval is not None and upsert_keys(node) == ()


def test_union_is_refused_so_no_union_needs_a_derivation() -> None:
    """Flink's union has no upsert keys; Weir plans no UNION at all (a derivation must come with it)."""
    with pytest.raises(SqlError, match="UNION is not supported"):
        plan_script(DDL + "INSERT INTO by_id SELECT id, owner FROM accounts UNION ALL SELECT id, owner FROM accounts;")


# -- what the keys decide ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "left", "right"),
    [
        (  # a qualified projection of a changelog source passes its key
            f"INSERT INTO by_id SELECT T.id, C.n FROM (SELECT x.id, x.owner FROM accounts AS x) AS T JOIN {GROUPS} "
            "ON T.owner = C.u;",
            SideRows(RowsKept.BY_UNIQUE_KEY, ("id",)),
            SideRows(RowsKept.ONE_ROW),
        ),
        (  # a key spelt in another case than the ON's column: the ON holds it
            f"INSERT INTO by_id SELECT M.ID, C.n FROM Mixed AS M JOIN {GROUPS} ON M.ID = C.n;",
            SideRows(RowsKept.ONE_ROW),
            SideRows(RowsKept.BY_UNIQUE_KEY, ("u",)),
        ),
        (  # a deduplication joined on its partition: one row
            f"INSERT INTO by_id SELECT T.id, T.owner FROM (SELECT id, owner FROM ({TOP}) WHERE r = 1) AS T "
            f"JOIN {GROUPS} ON T.owner = C.u;",
            SideRows(RowsKept.ONE_ROW),
            SideRows(RowsKept.ONE_ROW),
        ),
        (  # a global aggregate: one row in all
            "INSERT INTO by_u SELECT o.u, G.n FROM o JOIN (SELECT COUNT(*) AS n FROM accounts) AS G ON o.amount = G.n;",
            SideRows(RowsKept.BY_ROW),
            SideRows(RowsKept.ONE_ROW),
        ),
        (  # a join's result as a side, by its keys (A's by W's: W's join key within W's key)
            "INSERT INTO by_id SELECT J.id, C.n FROM (SELECT A.id, A.owner FROM accounts AS A JOIN wide AS W "
            f"ON A.id = W.a) AS J JOIN {GROUPS} ON J.owner = C.u;",
            SideRows(RowsKept.BY_UNIQUE_KEY, ("id",)),
            SideRows(RowsKept.ONE_ROW),
        ),
    ],
    ids=["qualified-projection", "key-in-another-case", "deduplication", "global-aggregate", "join-result"],
)
def test_a_changelog_join_keeps_each_side_by_the_side_s_upsert_keys(
    statement: str, left: SideRows, right: SideRows
) -> None:
    assert sides_kept(join_of(statement)) == (left, right)


def test_the_materializer_takes_the_smallest_upsert_key_of_the_result() -> None:
    """The dedup side makes T.owner a key of the join's result: a sink keyed by id gets the
    materializer, by the owner's column; written to a key of owner, none."""
    statement = (
        f"INSERT INTO by_id SELECT T.id, T.owner FROM (SELECT id, owner FROM ({TOP}) WHERE r = 1) AS T "
        f"JOIN {GROUPS} ON T.owner = C.u;"
    )
    (insert,) = plan_script(DDL + statement).inserts
    assert insert.plan.sink.materializer == Materializer(("owner",))
    owners = statement.replace("INSERT INTO by_id SELECT T.id, T.owner", "INSERT INTO owners SELECT T.owner, T.id")
    (insert,) = plan_script(DDL + owners).inserts
    assert insert.plan.sink.materializer is None


def test_explain_shows_each_changelog_join_side_s_state_layout() -> None:
    lines = [line for line in explain(script("left_join_bids")).splitlines() if "changelog-join" in line]
    assert len(lines) == 1
    assert lines[0].endswith(
        "; state: A rows by whole row, counted (NoUniqueKey), B one row per join key (JoinKeyContainsUniqueKey)"
    )
    statement = (
        f"INSERT INTO by_id SELECT T.id, C.n FROM (SELECT x.id, x.owner FROM accounts AS x) AS T JOIN {GROUPS} "
        "ON T.owner = C.u;"
    )
    (line,) = [line for line in explain(DDL + statement).splitlines() if "changelog-join" in line]
    assert line.endswith(
        "; state: T rows by unique key (id) (HasUniqueKey), C one row per join key (JoinKeyContainsUniqueKey)"
    )


PER_ACCOUNT = (
    ACCOUNTS
    + f"""CREATE TABLE per_account (id BIGINT, owner STRING, n BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({UPSERT});
INSERT INTO per_account
SELECT T.id, T.owner, C.n FROM (SELECT x.id, x.owner FROM accounts AS x) AS T
JOIN (SELECT owner AS o, COUNT(*) AS n FROM accounts GROUP BY owner) AS C ON T.owner = C.o;
"""
)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_side_kept_by_a_key_it_selects_qualified_ends_as_python_s(
    tmp_path: Path, weir_job: RunJob, seed: int
) -> None:
    """T selects the upsert-kafka table's key as ``x.id`` (kept by whole row before the derivation
    was shared): its rows are kept by id, and over a history of inserts, owner changes, repeated
    rows and deletes each account ends with its owner's final count of accounts, as Python's."""
    (insert,) = plan_script(PER_ACCOUNT).inserts
    join = next(n for n in below(insert.plan.sink.input) if isinstance(n, Join))
    assert sides_kept(join) == (SideRows(RowsKept.BY_UNIQUE_KEY, ("id",)), SideRows(RowsKept.ONE_ROW))
    assert insert.plan.sink.materializer == Materializer(None)  # T's id does not hold the join key: no key
    history, final = account_history(seed)
    run = weir_job(job_file(tmp_path, PER_ACCOUNT), records={source_uid("accounts"): history})
    owners = Counter(r["owner"] for r in final.values())
    expected = rows({"id": r["id"], "owner": r["owner"], "n": owners[r["owner"]]} for r in final.values())
    assert len(expected) >= 10
    values = sinks_of(run, PER_ACCOUNT)["per_account"]
    assert sink_table(values, ("id",), insert.plan.sink.keeps_update_before) == expected
