"""Flink's SinkUpsertMaterializer (weir.sql.materialize): each change kind into each shape of a sink
key's rows (none, one, several; the row changed first, last or absent; by whole row and by upsert
key) against Flink's emissions; over random changelogs of rows sharing sink keys, the sink's table
after every change is what the result holds (a key's last row while it has one, no key otherwise),
where writing each change as it comes (``'table.exec.sink.upsert-materialize' = 'NONE'``) is not;
and the operator's keyed state through a snapshot and restore, in its versioned format."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, StartOperator
from tests.unit.weir.sql.test_state_format import _rewrite_keys, _run
from weir.core.errors import SerializationError
from weir.operators.keyed import KeyedProcessOperator
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.materialize import ROWS_STATE, MaterializeStep, SinkUpsertMaterializer, materialized, rows_of, stored_of
from weir.sql.state_format import SINK_UPSERT_MATERIALIZER_STATE
from weir.sql.upsert import SinkWrite, sink_write

INS, UB, UA, D = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
A = {"k": 1, "id": 10, "v": "a"}
B = {"k": 1, "id": 20, "v": "b"}
C = {"k": 1, "id": 30, "v": "c"}
A2 = {"k": 1, "id": 10, "v": "a2"}  # A's upsert key (id), another value
ID = ("id",)


def step(rows: Sequence[dict[str, Any]], kind: RowKind, row: dict[str, Any], key: tuple[str, ...] | None = None) -> Any:
    return materialized(tuple(rows), Change(kind, row), key)


# Each decision ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [INS, UA])
@pytest.mark.parametrize("key", [None, ID], ids=["whole-row", "upsert-key"])
def test_a_row_joining_an_empty_key_is_written_as_an_insert(kind: RowKind, key: tuple[str, ...] | None) -> None:
    assert step([], kind, A, key) == MaterializeStep((A,), Change(INS, A))


@pytest.mark.parametrize("kind", [INS, UA])
@pytest.mark.parametrize("key", [None, ID], ids=["whole-row", "upsert-key"])
def test_a_row_joining_a_key_that_holds_rows_is_appended_and_written_as_an_update(
    kind: RowKind, key: tuple[str, ...] | None
) -> None:
    assert step([A, B], kind, C, key) == MaterializeStep((A, B, C), Change(UA, C))


@pytest.mark.parametrize("kind", [INS, UA])
def test_without_an_upsert_key_an_equal_row_is_one_more_copy(kind: RowKind) -> None:
    assert step([A, B], kind, A) == MaterializeStep((A, B, A), Change(UA, A))


@pytest.mark.parametrize("kind", [INS, UA])
def test_with_an_upsert_key_a_row_replaces_the_row_of_its_key_where_it_stands(kind: RowKind) -> None:
    """Flink's: written (+U) even when another row of the sink key came later."""
    assert step([A, B], kind, A2, ID) == MaterializeStep((A2, B), Change(UA, A2))
    assert step([A], kind, A2, ID) == MaterializeStep((A2,), Change(UA, A2))


@pytest.mark.parametrize("kind", [UB, D])
@pytest.mark.parametrize("key", [None, ID], ids=["whole-row", "upsert-key"])
def test_the_last_row_leaving_writes_the_row_before_it(kind: RowKind, key: tuple[str, ...] | None) -> None:
    assert step([A, B, C], kind, C, key) == MaterializeStep((A, B), Change(UA, B))


@pytest.mark.parametrize("kind", [UB, D])
@pytest.mark.parametrize("key", [None, ID], ids=["whole-row", "upsert-key"])
@pytest.mark.parametrize("leaving", [0, 1])
def test_a_row_other_than_the_last_leaving_writes_nothing(
    kind: RowKind, key: tuple[str, ...] | None, leaving: int
) -> None:
    rows = [A, B, C]
    after = tuple(r for i, r in enumerate(rows) if i != leaving)
    assert step(rows, kind, rows[leaving], key) == MaterializeStep(after, None)


@pytest.mark.parametrize("kind", [UB, D])
@pytest.mark.parametrize("key", [None, ID], ids=["whole-row", "upsert-key"])
def test_the_only_row_leaving_deletes_the_key(kind: RowKind, key: tuple[str, ...] | None) -> None:
    assert step([A], kind, A, key) == MaterializeStep((), Change(D, A))


@pytest.mark.parametrize("kind", [UB, D])
@pytest.mark.parametrize("rows", [[], [A], [A, B]], ids=["empty", "one", "two"])
def test_a_row_the_key_does_not_hold_leaving_writes_nothing(kind: RowKind, rows: list[dict[str, Any]]) -> None:
    """Its state expired (table.exec.state.ttl): Flink logs it and writes nothing."""
    assert step(rows, kind, C) == MaterializeStep(tuple(rows), None, missing=True)
    assert step(rows, kind, C, ID) == MaterializeStep(tuple(rows), None, missing=True)


def test_by_upsert_key_a_retraction_removes_the_row_of_its_key_whatever_its_other_values() -> None:
    assert step([A, B], D, A2, ID) == MaterializeStep((B,), None)
    assert step([B, A], UB, A2, ID) == MaterializeStep((B,), Change(UA, B))
    assert step([B, A], UB, A2) == MaterializeStep((B, A), None, missing=True)  # whole rows: A2 is not A


def test_of_equal_rows_a_retraction_removes_the_first_copy() -> None:
    assert step([A, B, A], D, A) == MaterializeStep((B, A), None)
    assert step([A, A], D, A) == MaterializeStep((A,), None)  # the sink holds A still


# Random changelogs ------------------------------------------------------------------------------------------


def history(seed: int, n: int, keyed: bool) -> list[Change]:
    """A valid changelog of rows at three sink keys (``k``): inserts, -U/+U pairs and deletes of rows
    present; ``keyed``: each row has its own ``id`` (an upsert key) and an update keeps it; otherwise
    rows repeat (identical copies) and an update may give any row."""
    rng = random.Random(seed)
    present: list[dict[str, Any]] = []
    out: list[Change] = []
    ids = iter(range(10**6))
    for _ in range(n):
        roll = rng.random()
        if present and roll < 0.35:
            old = present.pop(rng.randrange(len(present)))
            new = {
                "k": old["k"] if keyed else rng.randint(0, 2),
                "id": old["id"] if keyed else 0,
                "v": rng.randint(0, 3),
            }
            out += [Change(UB, old), Change(UA, new)]
            present.append(new)
        elif present and roll < 0.55:
            out.append(Change(D, present.pop(rng.randrange(len(present)))))
        else:
            row = {"k": rng.randint(0, 2), "id": next(ids) if keyed else 0, "v": rng.randint(0, 3)}
            out.append(Change(rng.choice([INS, UA]), row))
            present.append(row)
    return out


def applied(table: dict[Any, dict[str, Any]], change: Change, *, kept: bool) -> None:
    """An upsert sink's write of ``change`` at its key ``k`` (weir.sql.upsert.sink_write)."""
    match sink_write(change.kind, keeps_update_before=kept):
        case SinkWrite.UPSERT:
            table[change.row["k"]] = dict(change.row)
        case SinkWrite.DELETE:
            table.pop(change.row["k"], None)
        case SinkWrite.NOTHING:
            pass


def live_rows(changes: Sequence[Change]) -> list[dict[str, Any]]:
    """The rows in the result after ``changes``, in order of arrival (a retraction takes the first copy)."""
    rows: list[dict[str, Any]] = []
    for change in changes:
        if accumulates(change.kind):
            rows.append(dict(change.row))
        else:
            rows.remove(dict(change.row))
    return rows


def live_last(changes: Sequence[Change]) -> dict[Any, dict[str, Any]]:
    """What the sink must hold: per key, the last row (in order of arrival) still in the result."""
    return {row["k"]: row for row in live_rows(changes)}


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("keyed", [False, True], ids=["whole-row", "upsert-key"])
def test_after_every_change_the_sink_holds_each_key_s_last_row_of_the_result(seed: int, keyed: bool) -> None:
    changes = history(seed, 80, keyed)
    held: dict[Any, tuple[Mapping[str, Any], ...]] = {}
    table: dict[Any, dict[str, Any]] = {}
    for i, change in enumerate(changes):
        k = change.row["k"]
        done = materialized(held.get(k, ()), change, ID if keyed else None)
        assert not done.missing
        held[k] = done.rows
        if done.written is not None:
            assert done.written.kind in (INS, UA, D)
            applied(table, done.written, kept=False)
        assert table == live_last(changes[: i + 1]), f"after {change}"
        live = live_rows(changes[: i + 1])
        assert all(list(rows) == [r for r in live if r["k"] == k] for k, rows in held.items()), f"after {change}"


def test_writing_each_change_as_it_comes_leaves_rows_of_the_result_out_of_the_sink() -> None:
    """Without the materializer (NONE) a row leaving deletes its sink key although another row of the
    key is still in the result: on these histories the sink's final table is wrong, the
    materializer's is right."""
    wrong = 0
    for seed in range(30):
        changes = history(seed, 80, keyed=False)
        naive: dict[Any, dict[str, Any]] = {}
        for change in changes:
            applied(naive, change, kept=True)
        held: dict[Any, tuple[Mapping[str, Any], ...]] = {}
        table: dict[Any, dict[str, Any]] = {}
        for change in changes:
            done = materialized(held.get(change.row["k"], ()), change, None)
            held[change.row["k"]] = done.rows
            if done.written is not None:
                applied(table, done.written, kept=False)
        want = live_last(changes)
        assert table == want
        wrong += naive != want
    assert wrong >= 10, wrong


# The operator and its state ---------------------------------------------------------------------------------

UID = "sql-0123456789-upsert-materializer"


def _key(change: Change) -> tuple[Any, ...]:
    return (change.row["k"],)


def _operator(keyed: bool) -> KeyedProcessOperator:
    return KeyedProcessOperator(SinkUpsertMaterializer(ID if keyed else None), _key)


def test_the_state_is_the_tagged_list_of_rows() -> None:
    assert stored_of((A, B)) == (1, [A, B])
    assert rows_of((1, [A, B])) == (A, B)
    assert rows_of(None) == ()
    with pytest.raises(SerializationError, match="^sink-upsert-materializer state has format 2; this Weir reads"):
        rows_of((2, [A]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("keyed", [False, True], ids=["whole-row", "upsert-key"])
def test_the_operator_restores_its_rows_from_a_snapshot(start_operator: StartOperator, seed: int, keyed: bool) -> None:
    """Half the changes, a snapshot, a new operator of the same uid restored from it, the rest: its
    output is an uninterrupted run's, and each key's stored value is ``(1, [row, ...])``."""
    changes = history(seed, 60, keyed)
    half = len(changes) // 2
    whole = _operator(keyed)
    out = start_operator(whole, uid="reference")
    _run(whole, out, changes[:half], 1)
    reference = _run(whole, out, changes[half:], 3)

    first = _operator(keyed)
    before = _run(first, start_operator(first, uid=UID), changes[:half], 1)
    stored = _rewrite_keys(start_operator, UID, ROWS_STATE, [(k,) for k in range(3)], lambda held: held)
    assert any(s is not None for s in stored)
    assert all(s[0] == 1 and isinstance(s[1], list) and s[1] for s in stored if s is not None)
    second = _operator(keyed)
    after = _run(second, start_operator(second, uid=UID), changes[half:], 3)
    assert before + after == reference
    table: dict[Any, dict[str, Any]] = {}
    for change in reference:
        applied(table, change, kept=False)
    assert Counter(map(repr, table.values())) == Counter(map(repr, live_last(changes).values()))


def test_a_state_of_a_newer_format_fails_the_job(start_operator: StartOperator) -> None:
    first = _operator(False)
    _run(first, start_operator(first, uid=UID), [Change(INS, A)], 1)
    _rewrite_keys(start_operator, UID, ROWS_STATE, [(1,)], lambda held: (2, held[1]))
    second = _operator(False)
    start_operator(second, uid=UID)
    with pytest.raises(SerializationError, match="^sink-upsert-materializer state has format 2"):
        _run(second, CollectingOutput(), [Change(INS, B)], 3)
    assert SINK_UPSERT_MATERIALIZER_STATE.current == 1
