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
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.core.errors import SerializationError
from weir.operators.keyed import KeyedCoProcessOperator
from weir.sql.changelog import Change, RowKind
from weir.sql.changelog_join import (
    ChangelogJoin,
    HeldRow,
    JoinedChange,
    JoinSide,
    held_of,
    join_change,
    stored_of,
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


def test_the_state_value_is_tagged_and_another_format_is_refused_in_one_line() -> None:
    held = (HeldRow(L1, 2, 1),)
    stored = stored_of(held)
    assert stored == (1, [(L1, 2, 1)]) and held_of(stored) == held
    with pytest.raises(SerializationError, match=r"^changelog-join state has format 2; this Weir reads format 1"):
        held_of((2, [(L1, 2, 1)]))
