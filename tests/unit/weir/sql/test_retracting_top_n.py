"""A Top-N without a window over an updating input (weir.sql.ranking.retracting_changes,
RetractingRankedRows): over random valid changelogs of a few partitions (rows joining and leaving,
identical rows repeated), the emitted changes, applied to a table keyed by the partition and the row
number, are after every change the first N rows of what each partition holds then, each with its row
number; a leaving row the partition does not hold changes nothing; a restore from a snapshot in the
middle emits as an uninterrupted run."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.core.errors import SerializationError
from weir.operators.keyed import KeyedProcessOperator
from weir.sql.changelog import Change, RowKind
from weir.sql.ranking import RetractingRankedRows, retracting_changes
from weir.sql.state_format import RETRACTING_TOP_N_STATE


def order(row: dict[str, Any]) -> tuple[Any, ...]:
    return (-row["n"], row["id"])


def changelog(rng: random.Random, length: int) -> list[Change]:
    held: list[dict[str, Any]] = []
    out: list[Change] = []
    for _ in range(length):
        roll = rng.random()
        fresh = {"p": rng.randint(0, 2), "id": rng.randint(0, 5), "n": rng.randint(0, 4)}
        if not held or roll < 0.45:
            held.append(fresh)
            out.append(Change(RowKind.INSERT, fresh))
        elif roll < 0.8:
            old = held.pop(rng.randrange(len(held)))
            new = {**old, "n": rng.randint(0, 4)}
            held.append(new)
            out += [Change(RowKind.UPDATE_BEFORE, old), Change(RowKind.UPDATE_AFTER, new)]
        else:
            out.append(Change(RowKind.DELETE, held.pop(rng.randrange(len(held)))))
    return out


def apply(table: dict[tuple[int, int], dict[str, Any]], changes: Sequence[Change]) -> None:
    for change in changes:
        at = (change.row["p"], change.row["rn"])
        match change.kind:
            case RowKind.INSERT:
                assert at not in table, f"+I of a row number that holds a row: {change}"
                table[at] = dict(change.row)
            case RowKind.UPDATE_BEFORE | RowKind.DELETE:
                assert table.get(at) == dict(change.row), f"{change} retracts a row the result does not hold"
                del table[at]
            case RowKind.UPDATE_AFTER:
                assert at not in table, f"+U without its -U: {change}"
                table[at] = dict(change.row)


def expected(held: Sequence[dict[str, Any]], limit: int) -> dict[tuple[int, int], dict[str, Any]]:
    out = {}
    for p in {r["p"] for r in held}:
        first = sorted((r for r in held if r["p"] == p), key=order)[:limit]
        out.update({(p, n): {**r, "rn": n} for n, r in enumerate(first, start=1)})
    return out


@pytest.mark.parametrize("seed", range(60))
def test_the_changes_keep_the_first_n_rows_of_each_partition_with_their_row_numbers(seed: int) -> None:
    rng = random.Random(seed)
    limit = rng.randint(1, 4)
    partitions: dict[int, list[dict[str, Any]]] = {}
    held: list[dict[str, Any]] = []
    table: dict[tuple[int, int], dict[str, Any]] = {}
    for change in changelog(rng, rng.randint(5, 90)):
        if change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            held.append(dict(change.row))
        else:
            held.remove(dict(change.row))
        p = change.row["p"]
        partitions[p], out = retracting_changes(partitions.get(p, []), change, order, limit, "rn")
        apply(table, out)
        assert table == expected(held, limit), f"after {change}"
        assert partitions[p] == sorted((r for r in held if r["p"] == p), key=order)


def test_a_leaving_row_the_partition_does_not_hold_changes_nothing() -> None:
    rows = [{"p": 0, "id": 1, "n": 3}]
    after, out = retracting_changes(rows, Change(RowKind.DELETE, {"p": 0, "id": 2, "n": 3}), order, 2, "rn")
    assert after == rows and out == ()


def test_the_last_row_leaving_deletes_its_row_number_and_the_next_moves_up() -> None:
    a, b, c = {"p": 0, "id": 1, "n": 5}, {"p": 0, "id": 2, "n": 4}, {"p": 0, "id": 3, "n": 1}
    after, out = retracting_changes([a, b, c], Change(RowKind.DELETE, a), order, 2, "rn")
    assert after == [b, c]
    assert out == (
        Change(RowKind.UPDATE_BEFORE, {**a, "rn": 1}),
        Change(RowKind.UPDATE_AFTER, {**b, "rn": 1}),
        Change(RowKind.UPDATE_BEFORE, {**b, "rn": 2}),
        Change(RowKind.UPDATE_AFTER, {**c, "rn": 2}),
    )
    after, out = retracting_changes([b], Change(RowKind.DELETE, b), order, 2, "rn")
    assert after == [] and out == (Change(RowKind.DELETE, {**b, "rn": 1}),)


def partition(change: Change) -> tuple[Any, ...]:
    return (change.row["p"],)


@pytest.mark.parametrize("seed", range(20))
def test_a_restore_in_the_middle_emits_as_an_uninterrupted_run(start_operator: StartOperator, seed: int) -> None:
    rng = random.Random(seed)
    changes = changelog(rng, rng.randint(10, 90))
    cut = rng.randint(0, len(changes))
    whole = KeyedProcessOperator(RetractingRankedRows(order, 3, "rn"), partition)
    reference = start_operator(whole, uid="whole")
    for change in changes:
        whole.process(change, None)
    first = KeyedProcessOperator(RetractingRankedRows(order, 3, "rn"), partition)
    before = start_operator(first, uid="cut")
    for change in changes[:cut]:
        first.process(change, None)
    first.snapshot_state(1)
    second = KeyedProcessOperator(RetractingRankedRows(order, 3, "rn"), partition)
    after = start_operator(second, uid="cut")
    for change in changes[cut:]:
        second.process(change, None)
    assert [str(c) for c in before.values + after.values] == [str(c) for c in reference.values]


def test_the_state_is_tagged_and_another_format_is_refused_in_one_line() -> None:
    assert RETRACTING_TOP_N_STATE.tagged([{"id": 1}]) == (1, [{"id": 1}])
    with pytest.raises(SerializationError, match="^retracting-top-n state has format 2; this Weir reads format 1"):
        RETRACTING_TOP_N_STATE.body((2, []))
