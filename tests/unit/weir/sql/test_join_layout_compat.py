"""A changelog join whose side layout differs from the one Weir chose before the upsert keys were one derivation
(``weir.sql.join_layout_compat``) has another uid than that Weir gave it, so that Weir's savepoint of
the statement is refused at restore instead of read by another key; every other statement keeps the
uids it had. The uids pinned here were computed once with main's Weir (before upsert_keys)."""

from __future__ import annotations

import pytest

from tests.unit.weir.core.test_rescale import MAX_PARALLELISM, document
from tests.unit.weir.sql.test_changelog_join_sql import BY_UNIQUE_KEY, ONE_ROW_OF_A_TOP_N, script
from tests.unit.weir.sql.test_retract import UPSERT
from tests.unit.weir.sql.test_upsert_keys import DDL, GROUPS, TOP, below
from weir.core.rescale import StateAssignmentError, check_state_assignment
from weir.core.task_state import TaskStateDocument
from weir.graph import OperatorKind, Transformation
from weir.sql import explain, plan_script
from weir.sql.changelog_join import RowsKept, SideRows, sides_kept
from weir.sql.join_layout_compat import format2_sides_kept, is_relaid_join, layout_changed, layout_uid_suffix
from weir.sql.plan import Join
from weir.tools.upgrade_check import FindingKind, Severity, _map_uids, _OldOperator

ONE = SideRows(RowsKept.ONE_ROW)
BY_ROW = SideRows(RowsKept.BY_ROW)


def by_key(*columns: str) -> SideRows:
    return SideRows(RowsKept.BY_UNIQUE_KEY, columns)


def nexmark(query: str) -> str:
    """A bench/flink Nexmark statement with its sink (and a changelog source's table) filled in."""
    return script(query).replace("${UPSERT_SOURCE}", UPSERT.replace("'out'", "'notes'"))


def nexmark_ddl() -> str:
    return script("join_aggregates").split("CREATE TABLE nexmark_join_aggregates")[0]


SAVEPOINT_JOIN = """
CREATE TABLE orders (id BIGINT, u STRING)
  WITH ('connector' = 'kafka', 'topic' = 'src', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
        'scan.bounded.mode' = 'latest-offset', 'scan.records-per-second' = '60');
CREATE TABLE per_order (id BIGINT, u STRING, n BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = 'tbl');
INSERT INTO per_order
SELECT O.id, O.u, C.n FROM orders AS O
LEFT JOIN (SELECT u, COUNT(*) AS n FROM orders GROUP BY u) AS C ON O.u = C.u;
"""  # tests/integration/sql/test_sql_state_savepoint.py's join_script("src", "tbl")


def last_join(text: str) -> Join:
    """The statement's regular join nearest its sink."""
    (insert,) = plan_script(text).inserts
    return next(n for n in below(insert.plan.sink.input) if isinstance(n, Join) and n.interval is None)


def operator_uids(text: str) -> list[str]:
    """The uids EXPLAIN names for the script's one INSERT, in order, each once (a table read twice
    has one source)."""
    return list(dict.fromkeys(line.split("  ")[0] for line in explain(text).splitlines() if not line.startswith("== ")))


def join_uids(text: str) -> list[str]:
    return [line.split("  ")[0] for line in explain(text).splitlines() if "  changelog-join: " in line]


# name -> (script, main's layout of the last join's sides, this Weir's, main's uid of that join)
CHANGED: dict[str, tuple[str, tuple[SideRows, SideRows], tuple[SideRows, SideRows], str]] = {
    "qualified-projection": (
        DDL + f"INSERT INTO by_id SELECT T.id, C.n FROM (SELECT x.id, x.owner FROM accounts AS x) AS T "
        f"JOIN {GROUPS} ON T.owner = C.u;",
        (BY_ROW, ONE),
        (by_key("id"), ONE),
        "sql-88457dd6da-3-changelog-join",
    ),
    "projection-of-a-key-not-in-lower-case": (
        DDL + f"INSERT INTO by_id SELECT T.ID, C.n FROM (SELECT ID, Owner FROM Mixed) AS T "
        f"JOIN {GROUPS} ON T.Owner = C.u;",
        (BY_ROW, ONE),
        (by_key("ID"), ONE),
        "sql-8083e6bb16-3-changelog-join",
    ),
    "key-joined-in-another-case": (
        DDL + f"INSERT INTO by_id SELECT M.ID, C.n FROM Mixed AS M JOIN {GROUPS} ON M.ID = C.n;",
        (by_key("ID"), by_key("u")),
        (ONE, by_key("u")),
        "sql-868890ab1b-2-changelog-join",
    ),
    "deduplication": (
        DDL + f"INSERT INTO by_id SELECT T.id, T.owner FROM (SELECT id, owner FROM ({TOP}) WHERE r = 1) AS T "
        f"JOIN {GROUPS} ON T.owner = C.u;",
        (BY_ROW, ONE),
        (ONE, ONE),
        "sql-31d22b9115-5-changelog-join",
    ),
    "top-n": (
        DDL + f"INSERT INTO by_id SELECT T.id, C.n FROM (SELECT id, owner, r FROM ({TOP}) WHERE r <= 3) AS T "
        f"JOIN {GROUPS} ON T.owner = C.u;",
        (BY_ROW, ONE),
        (by_key("owner", "r"), ONE),
        "sql-e339018a0f-5-changelog-join",
    ),
    "deduplication-of-bids": (
        nexmark_ddl() + ONE_ROW_OF_A_TOP_N.replace("${UPSERT_SINK}", UPSERT),
        (BY_ROW, BY_ROW),
        (BY_ROW, ONE),
        "sql-e2a9685aaf-9-changelog-join",
    ),
    "global-aggregate": (
        DDL
        + "INSERT INTO by_u SELECT o.u, G.n FROM o JOIN (SELECT COUNT(*) AS n FROM accounts) AS G ON o.amount = G.n;",
        (BY_ROW, BY_ROW),
        (BY_ROW, ONE),
        "sql-e8c67585e8-2-changelog-join",
    ),
    "join-result": (
        DDL + "INSERT INTO by_id SELECT J.id, C.n FROM (SELECT A.id, A.owner FROM accounts AS A JOIN wide AS W "
        f"ON A.id = W.a) AS J JOIN {GROUPS} ON J.owner = C.u;",
        (BY_ROW, ONE),
        (by_key("id"), ONE),
        "sql-4b1e8ed0e5-4-changelog-join",
    ),
}

# name -> (script, main's uids of its changelog joins): the layouts of every bench/flink statement and
# test statement with a changelog join are main's, and so are their uids
UNCHANGED: dict[str, tuple[str, list[str]]] = {
    "full_join_changelogs": (nexmark("full_join_changelogs"), ["sql-a5d7e30680-6-changelog-join"]),
    "full_join_grouped": (nexmark("full_join_grouped"), ["sql-d637ec76c5-6-changelog-join"]),
    "join_aggregates": (nexmark("join_aggregates"), ["sql-5b14c51684-8-changelog-join"]),
    "join_upsert_table": (nexmark("join_upsert_table"), ["sql-f80bebf2a7-2-changelog-join"]),
    "left_join_bids": (nexmark("left_join_bids"), ["sql-98741483ed-6-changelog-join"]),
    "materialize_left_join": (nexmark("materialize_left_join"), ["sql-73316b0e39-4-changelog-join"]),
    "right_join_changelogs": (nexmark("right_join_changelogs"), ["sql-4443617501-6-changelog-join"]),
    "by-unique-key": (
        nexmark_ddl() + BY_UNIQUE_KEY.replace("${UPSERT_SINK}", UPSERT),
        ["sql-15b8c17012-6-changelog-join"],
    ),
    "savepoint-join": (SAVEPOINT_JOIN, ["sql-09632fec1d-2-changelog-join"]),
}


@pytest.mark.parametrize("name", list(CHANGED))
def test_a_changed_shape_keeps_main_s_layout_in_the_oracle_and_its_join_gets_another_uid(name: str) -> None:
    text, before, now, main_uid = CHANGED[name]
    join = last_join(text)
    assert format2_sides_kept(join) == before
    assert sides_kept(join) == now != before
    assert layout_changed(join, now)
    uid = join_uids(text)[-1]
    assert uid != main_uid
    left, right = now
    assert uid == f"{main_uid}-{left.kept.value}-{right.kept.value}"  # its place in the plan is main's


def test_a_join_below_a_changed_one_keeps_its_uid() -> None:
    text = CHANGED["join-result"][0]
    assert join_uids(text) == [
        "sql-4b1e8ed0e5-0-changelog-join",
        "sql-4b1e8ed0e5-4-changelog-join-by-unique-key-one-row",
    ]


@pytest.mark.parametrize("name", list(UNCHANGED))
def test_an_unchanged_statement_keeps_main_s_layout_and_uids(name: str) -> None:
    text, main_uids = UNCHANGED[name]
    join = last_join(text)
    assert sides_kept(join) == format2_sides_kept(join)
    assert join_uids(text) == main_uids


def test_changed_and_unchanged_shapes_differ_only_in_the_join_s_uid() -> None:
    """The other operators' uids are as they were: the changed join's uid without its suffix gives
    the uids of the same plan numbered as main numbers it."""
    text, _, now, main_uid = CHANGED["deduplication"]
    suffix = f"-{now[0].kept.value}-{now[1].kept.value}"
    uids = operator_uids(text)
    assert [u.removesuffix(suffix) for u in uids].count(main_uid) == 1
    assert sum(u.endswith(suffix) for u in uids) == 1


def old_savepoint(uids: list[str], join_uid: str) -> list[TaskStateDocument]:
    """A savepoint of a job of ``uids`` (one subtask each, each holding state), its join's keyed
    state under ``join_uid``."""
    docs: list[TaskStateDocument] = []
    for uid in uids:
        if "changelog-join" in uid:
            docs.append(document(join_uid, 0, 1, (join_uid,), keyed=(join_uid,), states={}))
        else:
            docs.append(document(uid, 0, 1, (uid,), states={uid: b"state"}))
    return docs


def test_main_s_savepoint_of_a_changed_shape_is_refused_unless_its_state_may_be_dropped() -> None:
    """The JobManager's restore rule (``weir.core.rescale.check_state_assignment``, run by
    ``weir.jobmanager.restoring.plan_initial_state`` and ``weir upgrade check``): keyed state of a
    uid the new job lacks is refused in one line, or dropped with --allow-non-restored-state (the
    join, under its new uid, starts empty)."""
    text, _, _, main_uid = CHANGED["qualified-projection"]
    new = operator_uids(text)
    (join,) = join_uids(text)
    docs = old_savepoint(new, main_uid)
    with pytest.raises(
        StateAssignmentError, match=rf"state of operator\(s\) {main_uid} that the new job does not have"
    ):
        check_state_assignment(docs, new, [join], MAX_PARALLELISM, allow_non_restored_state=False, where="savepoint 7")
    check_state_assignment(docs, new, [join], MAX_PARALLELISM, allow_non_restored_state=True, where="savepoint 7")


def test_main_s_savepoint_of_an_unchanged_statement_restores() -> None:
    text, (main_uid,) = UNCHANGED["savepoint-join"]
    new = operator_uids(text)
    docs = old_savepoint(new, main_uid)
    check_state_assignment(docs, new, [main_uid], MAX_PARALLELISM, allow_non_restored_state=False, where="savepoint 7")


def test_a_relaid_join_is_told_from_a_rename_by_its_uid() -> None:
    old = "sql-88457dd6da-3-changelog-join"
    sides = (SideRows(RowsKept.ONE_ROW), SideRows(RowsKept.BY_UNIQUE_KEY, ("id",)), SideRows(RowsKept.BY_ROW))
    for left in sides:
        for right in sides:
            assert is_relaid_join(old, old + layout_uid_suffix((left, right)))
    assert not is_relaid_join(old, old)
    assert not is_relaid_join(old, old + "-by-row")  # one layout is no suffix of a relaid join
    assert not is_relaid_join(old, "sql-88457dd6da-4-changelog-join-by-row-one-row")  # another operator
    assert not is_relaid_join("window-sum", "window-sum-by-row-one-row")  # not a changelog join


def test_upgrade_check_says_a_relaid_join_cannot_keep_its_state_instead_of_suggesting_its_uid() -> None:
    """The rename hint ("give the new operator uid ... to keep its state") is wrong advice here: SQL
    users do not set uids, and the old entries are kept another way than the new join reads them."""
    old = "sql-88457dd6da-3-changelog-join"
    new = old + "-by-unique-key-one-row"
    keyed = Transformation(new, "join", OperatorKind.TWO_INPUT, lambda: None, key_selector=lambda v: v)
    for allowed, severity in ((False, Severity.FATAL), (True, Severity.WARNING)):
        findings = _map_uids({old: _OldOperator(old, keyed=True)}, {new: keyed}, {}, allowed)
        by_kind = {f.kind: f for f in findings}
        assert set(by_kind) == {FindingKind.MISSING_UID, FindingKind.JOIN_LAYOUT_CHANGED, FindingKind.NEW_UID}
        relaid = by_kind[FindingKind.JOIN_LAYOUT_CHANGED]
        assert relaid.severity is severity and relaid.uid == old
        assert repr(new) in relaid.reason and "--allow-non-restored-state starts the join empty" in relaid.reason
