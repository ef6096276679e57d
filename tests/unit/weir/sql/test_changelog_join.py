"""The join of changelogs (weir.sql.changelog_join): the pure decision (join_change) over every change
kind on either side, inner and outer (LEFT, RIGHT, FULL), as Flink's StreamingJoinOperator emits it,
and, over random valid changelogs of both sides (repeated rows, NULL keys), the result the emitted
changelog materializes to: after every change, as a multiset of whole rows, the join of what each
side holds then (with each outer side's rows without a match padded with NULLs). Then the keyed
ChangelogJoin through a snapshot and a restore in the middle, equal to an uninterrupted run."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.api import StateTtlConfig
from weir.core.errors import SerializationError
from weir.core.keygroups import key_to_bytes
from weir.operators.keyed import KeyedCoProcessOperator
from weir.sql.changelog import Change, RowKind
from weir.sql.changelog_join import (
    ChangelogJoin,
    HeldRow,
    JoinedChange,
    JoinSide,
    RowsKept,
    SideRows,
    entry_of,
    held_of,
    join_change,
    join_row,
    row_identity,
    rows_kept,
    stored_entry,
)
from weir.sql.join import JoinedRow

INS, UB, UA, D = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
L1 = {"k": 1, "a": "x"}
L2 = {"k": 1, "a": "y"}
R1 = {"k": 1, "b": 10}
R2 = {"k": 1, "b": 20}
LEFT, RIGHT = JoinSide.LEFT, JoinSide.RIGHT
KINDS = {"INNER": (False, False), "LEFT": (True, False), "RIGHT": (False, True), "FULL": (True, True)}


def step(side: JoinSide, kind: RowKind, row: Mapping[str, Any], own: Any, other: Any, outer: str) -> Any:
    left_outer, right_outer = KINDS[outer]
    own_outer, other_outer = (left_outer, right_outer) if side is LEFT else (right_outer, left_outer)
    return join_change(side, Change(kind, row), own, other, own_outer=own_outer, other_outer=other_outer)


# -- each change kind, as Flink's operator emits it -----------------------------------------------------------


@pytest.mark.parametrize("kind", [INS, UA])
def test_an_inner_join_emits_a_joining_row_with_each_match_of_its_own_kind_and_holds_it(kind: RowKind) -> None:
    got = step(LEFT, kind, L1, (), (HeldRow(R1, 1), HeldRow(R2, 2)), "INNER")
    assert got.out == (JoinedChange(kind, L1, R1), JoinedChange(kind, L1, R2), JoinedChange(kind, L1, R2))
    assert got.own == (HeldRow(L1, 1),)
    assert got.other == (HeldRow(R1, 1), HeldRow(R2, 2))
    again = step(LEFT, kind, L1, got.own, (), "INNER")  # an identical row: one more copy, no match
    assert again.out == () and again.own == (HeldRow(L1, 2),)


@pytest.mark.parametrize("kind", [UB, D])
def test_an_inner_join_retracts_a_leaving_row_s_joined_rows_with_its_kind_and_one_copy_of_it(kind: RowKind) -> None:
    got = step(RIGHT, kind, R1, (HeldRow(R1, 2),), (HeldRow(L1, 1), HeldRow(L2, 1)), "INNER")
    assert got.out == (JoinedChange(kind, L1, R1), JoinedChange(kind, L2, R1))
    assert got.own == (HeldRow(R1, 1),)
    last = step(RIGHT, kind, R1, got.own, (), "INNER")
    assert last.out == () and last.own == ()
    unknown = step(RIGHT, kind, R2, (HeldRow(R1, 1),), (), "INNER")  # a row not held: nothing held changes
    assert unknown.own == (HeldRow(R1, 1),) and unknown.out == ()


@pytest.mark.parametrize("kind", [INS, UA])
def test_an_outer_row_without_a_match_is_inserted_padded_and_held_with_no_association(kind: RowKind) -> None:
    got = step(LEFT, kind, L1, (), (), "LEFT")
    assert got.out == (JoinedChange(INS, L1, None),) and got.own == (HeldRow(L1, 1, 0),)


@pytest.mark.parametrize("kind", [INS, UA])
def test_an_outer_row_with_matches_is_inserted_joined_and_counts_them(kind: RowKind) -> None:
    got = step(LEFT, kind, L1, (), (HeldRow(R1, 1), HeldRow(R2, 1)), "LEFT")
    assert got.out == (JoinedChange(INS, L1, R1), JoinedChange(INS, L1, R2))
    assert got.own == (HeldRow(L1, 1, 2),)


@pytest.mark.parametrize("kind", [INS, UA])
def test_the_first_match_of_an_outer_row_retracts_its_padded_rows_then_inserts_the_joined(kind: RowKind) -> None:
    held = (HeldRow(L1, 2, 0), HeldRow(L2, 1, 1))
    got = step(RIGHT, kind, R1, (), held, "LEFT")
    assert got.out == (
        JoinedChange(D, L1, None),
        JoinedChange(D, L1, None),  # two copies of L1, each padded in the result
        JoinedChange(INS, L1, R1),
        JoinedChange(INS, L1, R1),
        JoinedChange(INS, L2, R1),
    )
    assert got.other == (HeldRow(L1, 2, 1), HeldRow(L2, 1, 2))
    assert got.own == (HeldRow(R1, 1, 0),)


@pytest.mark.parametrize("kind", [UB, D])
def test_the_last_match_of_an_outer_row_leaving_brings_its_padded_row_back(kind: RowKind) -> None:
    held = (HeldRow(L1, 1, 1), HeldRow(L2, 1, 2))
    got = step(RIGHT, kind, R1, (HeldRow(R1, 1),), held, "LEFT")
    assert got.out == (JoinedChange(kind, L1, R1), JoinedChange(kind, L2, R1), JoinedChange(INS, L1, None))
    assert got.other == (HeldRow(L1, 1, 0), HeldRow(L2, 1, 1)) and got.own == ()


@pytest.mark.parametrize("kind", [UB, D])
def test_an_outer_row_leaving_deletes_its_padded_or_joined_rows(kind: RowKind) -> None:
    alone = step(LEFT, kind, L1, (HeldRow(L1, 1, 0),), (), "LEFT")
    assert alone.out == (JoinedChange(D, L1, None),) and alone.own == ()
    matched = step(LEFT, kind, L1, (HeldRow(L1, 1, 1),), (HeldRow(R1, 1),), "LEFT")
    assert matched.out == (JoinedChange(D, L1, R1),) and matched.own == ()


def test_a_full_join_pads_each_side_and_moves_rows_between_padded_and_joined() -> None:
    a = step(LEFT, INS, L1, (), (), "FULL")
    assert a.out == (JoinedChange(INS, L1, None),)
    b = step(RIGHT, INS, R1, (), a.own, "FULL")  # L1's padded row leaves; R1 matched, so not padded
    assert b.out == (JoinedChange(D, L1, None), JoinedChange(INS, L1, R1))
    assert b.own == (HeldRow(R1, 1, 1),) and b.other == (HeldRow(L1, 1, 1),)
    c = step(LEFT, D, L1, b.other, b.own, "FULL")  # R1 loses its match: padded again
    assert c.out == (JoinedChange(D, L1, R1), JoinedChange(INS, None, R1))
    assert c.own == () and c.other == (HeldRow(R1, 1, 0),)


# -- random changelogs: the materialized result is the join of what the sides hold ---------------------------


def random_changes(rng: random.Random, n: int) -> list[tuple[JoinSide, Change]]:
    """Valid changelogs of both sides: a -U or -D retracts a row its side holds, a -U is followed by
    its +U; rows repeat whole, keys 0-2 and NULL."""
    held: dict[JoinSide, list[dict[str, Any]]] = {LEFT: [], RIGHT: []}
    out: list[tuple[JoinSide, Change]] = []
    for _ in range(n):
        side = rng.choice([LEFT, RIGHT])
        rows = held[side]
        column = "a" if side is LEFT else "b"
        fresh = {"k": rng.choice([None, 0, 1, 2]), column: rng.randint(0, 2)}
        roll = rng.random()
        if not rows or roll < 0.45:
            rows.append(fresh)
            out.append((side, Change(INS, fresh)))
        elif roll < 0.75:
            old = rows.pop(rng.randrange(len(rows)))
            rows.append(fresh)
            out.extend([(side, Change(UB, old)), (side, Change(UA, fresh))])
        else:
            old = rows.pop(rng.randrange(len(rows)))
            out.append((side, Change(D, old)))
    return out


def frozen(row: Mapping[str, Any]) -> str:
    return json.dumps(dict(row), sort_keys=True)


def joined(left: Mapping[str, Any] | None, right: Mapping[str, Any] | None) -> str:
    return frozen({"l": None if left is None else dict(left), "r": None if right is None else dict(right)})


def expected(lefts: list[dict[str, Any]], rights: list[dict[str, Any]], outer: str) -> Counter[str]:
    left_outer, right_outer = KINDS[outer]
    result: Counter[str] = Counter()
    for a in lefts:
        matches = [b for b in rights if a["k"] is not None and a["k"] == b["k"]]
        result.update(joined(a, b) for b in matches)
        if left_outer and not matches:
            result[joined(a, None)] += 1
    if right_outer:
        for b in rights:
            if not any(a["k"] is not None and a["k"] == b["k"] for a in lefts):
                result[joined(None, b)] += 1
    return result


def materialize(table: Counter[str], change: Change) -> None:
    row = frozen(change.row)
    match change.kind:
        case RowKind.INSERT | RowKind.UPDATE_AFTER:
            table[row] += 1
        case RowKind.UPDATE_BEFORE | RowKind.DELETE:
            assert table[row] > 0, f"{change.kind.value} of a row not in the result: {row}"
            table[row] -= 1
            if not table[row]:
                del table[row]


class Pairs(JoinedRow):
    """The joined row as the pair of its sides (None: padded), to compare with ``joined``."""

    def __init__(self) -> None:
        super().__init__("L", "R", ("k", "a"), ("k", "b"))

    def __call__(self, left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "l": None if all(v is None for v in left.values()) else dict(left),
            "r": None if all(v is None for v in right.values()) else dict(right),
        }


NULLS = ({"k": None, "a": None}, {"k": None, "b": None})


def join_function(outer: str) -> ChangelogJoin:
    return ChangelogJoin(Pairs(), NULLS, outer=KINDS[outer], changelogs=(True, True))


def key(change: Change) -> tuple[Any, ...]:
    return (change.row["k"],)


def feed(op: KeyedCoProcessOperator, changes: Iterable[tuple[JoinSide, Change]]) -> None:
    for side, change in changes:
        op.process_input(0 if side is LEFT else 1, change, None)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("outer", list(KINDS))
def test_the_emitted_changelog_materializes_to_the_join_of_what_the_sides_hold_after_each_change(
    seed: int, outer: str
) -> None:
    rng = random.Random(seed)
    changes = random_changes(rng, rng.randint(5, 80))
    state: dict[Any, dict[JoinSide, tuple[HeldRow, ...]]] = {}
    held: dict[JoinSide, list[dict[str, Any]]] = {LEFT: [], RIGHT: []}
    table: Counter[str] = Counter()
    left_outer, right_outer = KINDS[outer]
    for side, change in changes:
        if accumulates := change.kind in (INS, UA):
            held[side].append(dict(change.row))
        else:
            held[side].remove(dict(change.row))
        own_outer = left_outer if side is LEFT else right_outer
        k = change.row["k"]
        if k is None:  # as ChangelogJoin: matches nothing, padded on an outer side, never held
            if own_outer:
                padded = (change.row, None) if side is LEFT else (None, change.row)
                materialize(table, Change(INS if accumulates else D, json.loads(joined(*padded))))
        else:
            sides = state.setdefault(k, {LEFT: (), RIGHT: ()})
            result = join_change(
                side, change, sides[side], sides[side.other],
                own_outer=own_outer, other_outer=right_outer if side is LEFT else left_outer,
            )  # fmt: skip
            sides[side], sides[side.other] = result.own, result.other
            for out in result.out:
                materialize(table, Change(out.kind, json.loads(joined(out.left, out.right))))
        assert table == expected(held[LEFT], held[RIGHT], outer), f"after {side.value} {change}"


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("outer", list(KINDS))
def test_a_restore_from_a_snapshot_in_the_middle_emits_as_an_uninterrupted_run(
    start_operator: StartOperator, seed: int, outer: str
) -> None:
    rng = random.Random(seed)
    changes = random_changes(rng, rng.randint(5, 80))
    cut = rng.randint(0, len(changes))
    whole_run = KeyedCoProcessOperator(join_function(outer), (key, key))
    uninterrupted = start_operator(whole_run, uid="whole")
    feed(whole_run, changes)

    before = KeyedCoProcessOperator(join_function(outer), (key, key))
    out_before = start_operator(before, uid="cut")
    feed(before, changes[:cut])
    before.snapshot_state(3)
    after = KeyedCoProcessOperator(join_function(outer), (key, key))
    out_after = start_operator(after, uid="cut")
    feed(after, changes[cut:])
    got = [str(c) for c in out_before.values + out_after.values]
    assert got == [str(c) for c in uninterrupted.values]
    table: Counter[str] = Counter()
    for change in out_before.values + out_after.values:
        materialize(table, Change(change.kind, json.loads(joined(change.row["l"], change.row["r"]))))
    lefts = [dict(c.row) for s, c in changes if s is LEFT]
    rights = [dict(c.row) for s, c in changes if s is RIGHT]
    final: dict[JoinSide, list[dict[str, Any]]] = {LEFT: [], RIGHT: []}
    for s, c in changes:
        if c.kind in (INS, UA):
            final[s].append(dict(c.row))
        else:
            final[s].remove(dict(c.row))
    assert lefts or rights
    assert table == expected(final[LEFT], final[RIGHT], outer)


def test_an_append_input_s_rows_are_inserts(start_operator: StartOperator) -> None:
    op = KeyedCoProcessOperator(
        ChangelogJoin(Pairs(), NULLS, outer=(True, False), changelogs=(False, True)),
        (lambda row: (row["k"],), key),
    )
    out = start_operator(op)
    op.process_input(0, L1, None)
    op.process_input(1, Change(INS, R1), None)
    op.process_input(1, Change(D, R1), None)
    assert [(c.kind, c.row["l"], c.row["r"]) for c in out.values] == [
        (INS, L1, None), (D, L1, None), (INS, L1, R1), (D, L1, R1), (INS, L1, None)
    ]  # fmt: skip


# -- one row's entry (join_row): what the keyed state reads and writes -----------------------------------------


def test_join_row_reads_and_writes_only_the_change_s_own_entry() -> None:
    other = (HeldRow(R1, 1), HeldRow(R2, 2))
    got = join_row(LEFT, Change(INS, L1), HeldRow(L1, 1), other, own_outer=False, other_outer=False)
    assert got.own == HeldRow(L1, 2) and got.other is None  # an inner other side: nothing of it changes
    assert got.out == (JoinedChange(INS, L1, R1), JoinedChange(INS, L1, R2), JoinedChange(INS, L1, R2))
    gone = join_row(LEFT, Change(D, L1), HeldRow(L1, 1), other, own_outer=False, other_outer=False)
    assert gone.own is None and gone.other is None


def test_join_row_updates_each_row_of_an_outer_other_side_in_the_order_given() -> None:
    other = (HeldRow(L1, 1, 0), HeldRow(L2, 1, 3))
    got = join_row(RIGHT, Change(INS, R1), None, other, own_outer=False, other_outer=True)
    assert got.other == (HeldRow(L1, 1, 1), HeldRow(L2, 1, 4))
    back = join_row(RIGHT, Change(D, R1), HeldRow(R1, 1), got.other, own_outer=False, other_outer=True)
    assert back.other == other and back.own is None


def test_a_unique_key_s_entry_of_another_row_is_replaced_on_insert_and_removed_on_retract_as_flink() -> None:
    earlier = HeldRow({"k": 1, "a": "old"}, 1, 2)
    got = join_row(LEFT, Change(UA, L1), earlier, (HeldRow(R1, 1),), own_outer=True, other_outer=False)
    assert got.own == HeldRow(L1, 1, 1)
    removed = join_row(LEFT, Change(UB, L1), earlier, (), own_outer=False, other_outer=False)
    assert removed.own is None


# -- how a side keeps its rows, and the entry keys ----------------------------------------------------------


def test_a_side_keeps_one_row_when_its_unique_key_is_within_the_join_key_else_a_map_by_unique_key_or_row() -> None:
    assert rows_kept([("seller",)], ["seller"]) == SideRows(RowsKept.ONE_ROW)
    assert rows_kept([("seller",)], ["seller", "day"]) == SideRows(RowsKept.ONE_ROW)
    assert rows_kept([("auction", "bidder")], ["auction"]) == SideRows(RowsKept.BY_UNIQUE_KEY, ("auction", "bidder"))
    assert rows_kept([], ["auction"]) == SideRows(RowsKept.BY_ROW)


def test_one_row_when_any_key_is_within_the_join_key_else_the_first_smallest_key() -> None:
    """As Flink's ``JoinInputSideSpec``: a join key holding any of the keys keeps one row; else the
    smallest key (the first of equal size) names the entries; names compare as SQL's, in any case."""
    assert rows_kept([("a", "b"), ("c",)], ["a", "b"]) == SideRows(RowsKept.ONE_ROW)
    assert rows_kept([("a", "b"), ("c",)], ["a"]) == SideRows(RowsKept.BY_UNIQUE_KEY, ("c",))
    assert rows_kept([("a", "b"), ("c", "d")], ["x"]) == SideRows(RowsKept.BY_UNIQUE_KEY, ("a", "b"))
    assert rows_kept([("ID",)], ["id"]) == SideRows(RowsKept.ONE_ROW)
    assert rows_kept([()], ["x"]) == SideRows(RowsKept.ONE_ROW)  # the empty key: one row in all (a global GROUP BY)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (None, "null"), (None, "N"), (1, "1"), (1, 1.0), (True, 1), ("", b""), (("a",), "a"), (1, 10), ("ab", "a"),
    ],
)  # fmt: skip
def test_the_entry_key_of_values_of_different_types_or_values_differs(a: Any, b: Any) -> None:
    assert row_identity([a]) != row_identity([b])
    assert row_identity([a, b]) != row_identity([b, a])


def test_equal_values_have_one_entry_key() -> None:
    assert row_identity([Decimal("1.0")]) == row_identity([Decimal("1.00")])
    assert row_identity([-0.0]) == row_identity([0.0])
    assert SideRows(RowsKept.BY_ROW).entry_key({"a": 1, "b": "x"}) == SideRows(RowsKept.BY_ROW).entry_key(
        {"b": "x", "a": 1}
    )  # by column name, not dict order
    by_id = SideRows(RowsKept.BY_UNIQUE_KEY, ("id",))
    assert by_id.entry_key({"id": 7, "a": 1}) == by_id.entry_key({"id": 7, "a": 2})


def test_an_entry_is_tagged_with_format_2_and_another_format_is_refused_in_one_line() -> None:
    stored = stored_entry(HeldRow(L1, 2, 1))
    assert stored == (2, (L1, 2, 1)) and entry_of(stored) == HeldRow(L1, 2, 1)
    with pytest.raises(SerializationError, match=r"^changelog-join state has format 3; this Weir reads format 2"):
        entry_of((3, (L1, 2, 1)))
    assert held_of((1, [(L1, 2, 1)])) == (HeldRow(L1, 2, 1),)  # the previous layout, read to rewrite it
    with pytest.raises(SerializationError, match=r"^changelog-join state has format 2; this Weir reads format 1"):
        held_of((2, [(L1, 2, 1)]))


# -- each way of keeping rows, through the keyed state, a snapshot and a restore -----------------------------

SHAPES = {
    "by-row": SideRows(RowsKept.BY_ROW),
    "by-unique-key": SideRows(RowsKept.BY_UNIQUE_KEY, ("id",)),
    "one-row": SideRows(RowsKept.ONE_ROW),
}


def random_keyed_changes(rng: random.Random, n: int, shapes: tuple[str, str]) -> list[tuple[JoinSide, Change]]:
    """Valid changelogs of both sides, each as its shape allows: ``by-row`` rows repeat whole;
    ``by-unique-key`` holds one row per ``id`` at a time (an update may move it to another key);
    ``one-row`` one row per key ``k`` at a time. Keys 0-2 and NULL."""
    held: dict[JoinSide, dict[Any, dict[str, Any]] | list[dict[str, Any]]] = {}
    out: list[tuple[JoinSide, Change]] = []
    for side, shape in zip((LEFT, RIGHT), shapes, strict=True):
        held[side] = [] if shape == "by-row" else {}
    for _ in range(n):
        side = rng.choice([LEFT, RIGHT])
        shape = shapes[0] if side is LEFT else shapes[1]
        column = "a" if side is LEFT else "b"
        rows = held[side]
        fresh: dict[str, Any] = {"k": rng.choice([None, 0, 1, 2]), column: rng.randint(0, 2)}
        if shape != "by-row":
            fresh["id"] = fresh["k"] if shape == "one-row" else rng.randint(0, 5)
        roll = rng.random()
        if isinstance(rows, list):
            if not rows or roll < 0.45:
                rows.append(fresh)
                out.append((side, Change(INS, fresh)))
            elif roll < 0.75:
                old = rows.pop(rng.randrange(len(rows)))
                rows.append(fresh)
                out.extend([(side, Change(UB, old)), (side, Change(UA, fresh))])
            else:
                out.append((side, Change(D, rows.pop(rng.randrange(len(rows))))))
            continue
        uid = fresh["id"]
        if uid not in rows:
            rows[uid] = fresh
            out.append((side, Change(INS, fresh)))
        elif roll < 0.6:
            out.extend([(side, Change(UB, rows[uid])), (side, Change(UA, fresh))])
            rows[uid] = fresh
        else:
            out.append((side, Change(D, rows.pop(uid))))
    return out


def final_rows(changes: Iterable[tuple[JoinSide, Change]]) -> dict[JoinSide, list[dict[str, Any]]]:
    final: dict[JoinSide, list[dict[str, Any]]] = {LEFT: [], RIGHT: []}
    for s, c in changes:
        if c.kind in (INS, UA):
            final[s].append(dict(c.row))
        else:
            final[s].remove(dict(c.row))
    return final


def materialized(values: Iterable[Change]) -> Counter[str]:
    table: Counter[str] = Counter()
    for change in values:
        materialize(table, Change(change.kind, json.loads(joined(change.row["l"], change.row["r"]))))
    return table


class IdPairs(Pairs):
    def __init__(self) -> None:
        JoinedRow.__init__(self, "L", "R", ("k", "a", "id"), ("k", "b", "id"))


def shaped_join(outer: str, shapes: tuple[str, str], kind: type[ChangelogJoin] = ChangelogJoin) -> ChangelogJoin:
    nulls = [{"k": None, c: None, **({"id": None} if s != "by-row" else {})} for c, s in zip("ab", shapes, strict=True)]
    return kind(
        IdPairs(), (nulls[0], nulls[1]), outer=KINDS[outer], changelogs=(True, True),
        kept=(SHAPES[shapes[0]], SHAPES[shapes[1]]),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("outer", list(KINDS))
@pytest.mark.parametrize("shapes", [("by-row", "one-row"), ("by-unique-key", "by-row"), ("one-row", "by-unique-key")])
def test_each_way_of_keeping_rows_materializes_the_join_after_each_change_and_through_a_restore(
    start_operator: StartOperator, seed: int, outer: str, shapes: tuple[str, str]
) -> None:
    rng = random.Random(seed)
    changes = random_keyed_changes(rng, rng.randint(5, 80), shapes)
    cut = rng.randint(0, len(changes))
    whole_run = KeyedCoProcessOperator(shaped_join(outer, shapes), (key, key))
    uninterrupted = start_operator(whole_run, uid="whole")
    seen: list[tuple[JoinSide, Change]] = []
    for side, change in changes:  # after every change, the emitted changelog is the join of what is held
        feed(whole_run, [(side, change)])
        seen.append((side, change))
        held = final_rows(seen)
        assert materialized(uninterrupted.values) == expected(held[LEFT], held[RIGHT], outer), f"after {change}"

    before = KeyedCoProcessOperator(shaped_join(outer, shapes), (key, key))
    out_before = start_operator(before, uid="cut")
    feed(before, changes[:cut])
    before.snapshot_state(3)
    after = KeyedCoProcessOperator(shaped_join(outer, shapes), (key, key))
    out_after = start_operator(after, uid="cut")
    feed(after, changes[cut:])
    assert [str(c) for c in out_before.values + out_after.values] == [str(c) for c in uninterrupted.values]


# -- the previous layout (format 1: value states left and right, a side's whole list) -----------------------


class PreviousLayoutJoin(ChangelogJoin):
    """The join as Weir wrote its state before format 2: each side's rows of the key in one value
    state (``left``, ``right``), ``(1, [(row, count, associations), ...])``, through join_change."""

    def _apply(self, side: JoinSide, value: Any, ctx: Any, out: Any) -> None:
        change = value
        own_outer, other_outer = self._of(self.outer, side), self._of(self.outer, side.other)
        if None in ctx.key:
            if own_outer:
                kind = INS if change.kind in (INS, UA) else D
                self._emit((JoinedChange(kind, *((change.row, None) if side is LEFT else (None, change.row))),), out)
            return
        states = {s: ctx.value_state(s.value, self.ttl) for s in JoinSide}
        own, other = held_of(states[side].value()), held_of(states[side.other].value())
        step = join_change(side, change, own, other, own_outer=own_outer, other_outer=other_outer)
        self._emit(step.out, out)
        for s, held in ((side, step.own), (side.other, step.other)):
            if held:
                states[s].update((1, [(dict(e.row), e.count, e.associations) for e in held]))
            else:
                states[s].clear()


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("outer", list(KINDS))
@pytest.mark.parametrize("shapes", [("by-row", "by-row"), ("by-row", "one-row"), ("by-unique-key", "one-row")])
def test_state_of_the_previous_layout_restores_and_emits_as_an_uninterrupted_run(
    start_operator: StartOperator, seed: int, outer: str, shapes: tuple[str, str]
) -> None:
    rng = random.Random(seed)
    changes = random_keyed_changes(rng, rng.randint(5, 80), shapes)
    cut = rng.randint(0, len(changes))
    whole_run = KeyedCoProcessOperator(shaped_join(outer, shapes), (key, key))
    uninterrupted = start_operator(whole_run, uid="whole")
    feed(whole_run, changes[:cut])
    emitted_before = len(uninterrupted.values)
    feed(whole_run, changes[cut:])

    previous = KeyedCoProcessOperator(shaped_join(outer, shapes, PreviousLayoutJoin), (key, key))
    out_before = start_operator(previous, uid="cut")
    feed(previous, changes[:cut])
    previous.snapshot_state(3)
    assert all(name in ("left", "right") for name in _state_names(previous)), "the old layout was written"
    after = KeyedCoProcessOperator(shaped_join(outer, shapes), (key, key))
    out_after = start_operator(after, uid="cut")
    feed(after, changes[cut:])
    # the previous layout emitted a change's joined rows in arrival order, this one in entry key order
    assert materialized(out_before.values) == materialized(uninterrupted.values[:emitted_before])
    assert [str(c) for c in out_after.values] == [str(c) for c in uninterrupted.values[emitted_before:]]
    final = final_rows(changes)
    assert materialized(out_before.values + out_after.values) == expected(final[LEFT], final[RIGHT], outer)
    after.snapshot_state(4)
    changed_after = {key(c) for _, c in changes[cut:]}
    assert not (_previous_keys(after) & changed_after), "a key changed after the restore is rewritten"


def _state_names(op: KeyedCoProcessOperator) -> set[str]:
    names: set[str] = set()
    for kg in op.ctx.key_group_range:
        for name in ("left", "right", "left-row", "right-row", "left-rows", "right-rows"):
            if any(True for _ in op.store.items(name, kg)):
                names.add(name)
    return names


def _previous_keys(op: KeyedCoProcessOperator) -> set[tuple[Any, ...]]:
    """The keys (of 0-2) still holding state of the previous layout."""
    stored = {k for kg in op.ctx.key_group_range for name in ("left", "right") for k, _ in op.store.items(name, kg)}
    return {(k,) for k in (0, 1, 2) if key_to_bytes((k,)) in stored}


def test_a_previous_layout_holding_two_rows_of_one_unique_key_is_refused_in_one_line(
    start_operator: StartOperator,
) -> None:
    previous = KeyedCoProcessOperator(shaped_join("INNER", ("by-row", "by-row"), PreviousLayoutJoin), (key, key))
    start_operator(previous, uid="cut")
    feed(previous, [(LEFT, Change(INS, {"k": 1, "a": 1, "id": 1})), (LEFT, Change(INS, {"k": 1, "a": 2, "id": 1}))])
    previous.snapshot_state(3)
    after = KeyedCoProcessOperator(shaped_join("INNER", ("one-row", "by-row")), (key, key))
    start_operator(after, uid="cut")
    with pytest.raises(
        SerializationError, match=r"^changelog-join state of key \(1,\) \(left side, format 1\) holds 2 rows"
    ):
        feed(after, [(RIGHT, Change(INS, {"k": 1, "b": 1}))])


def test_under_a_state_ttl_each_row_expires_on_its_own_as_flink_s_map_entries(start_operator: StartOperator) -> None:
    """A side's rows of a key are entries of their own: a row written 50 ms after another outlives it
    (the whole list, rewritten by each change, expired as one before format 2)."""
    now = [0]
    function = ChangelogJoin(Pairs(), NULLS, outer=(False, False), changelogs=(True, True), ttl=StateTtlConfig(100))
    op = KeyedCoProcessOperator(function, (key, key), clock=lambda: now[0])
    out = start_operator(op)
    op.process_input(0, Change(INS, L1), None)
    now[0] = 50
    op.process_input(0, Change(INS, L2), None)
    now[0] = 120  # L1 written at 0 has expired, L2 written at 50 has not
    op.process_input(1, Change(INS, R1), None)
    assert [(c.kind, c.row["l"], c.row["r"]) for c in out.values] == [(INS, L2, R1)]


def test_a_previous_layout_without_the_unique_key_s_columns_is_refused_in_one_line(
    start_operator: StartOperator,
) -> None:
    """Format 1 stored a side's rows as pruned above the join: a unique key nothing read is not there."""
    previous = KeyedCoProcessOperator(shaped_join("INNER", ("by-row", "by-row"), PreviousLayoutJoin), (key, key))
    start_operator(previous, uid="cut")
    feed(previous, [(LEFT, Change(INS, {"k": 1, "a": 1}))])
    previous.snapshot_state(3)
    after = KeyedCoProcessOperator(shaped_join("INNER", ("by-unique-key", "by-row")), (key, key))
    start_operator(after, uid="cut")
    refused = r"^changelog-join state of key \(1,\) \(left side, format 1\) holds rows without id, the unique key"
    with pytest.raises(SerializationError, match=refused):
        feed(after, [(RIGHT, Change(INS, {"k": 1, "b": 1}))])
