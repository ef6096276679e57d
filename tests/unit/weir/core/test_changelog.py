"""The per-transaction collapse of upserts and deletes by key (pure): applying the collapsed writes,
deletes first then upserts, leaves exactly the table that applying every change in order leaves."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from weir.core.changelog import Delete, KeyedChanges, Upsert, apply_changes, keys_changed
from weir.core.errors import SerializationError

KEY = (0,)  # rows are (id, value, version)
VERSION = 2
Table = dict[tuple[Any, ...], tuple[tuple[Any, ...], str]]  # key -> (row, a column the sink does not write)


def sequential(table: Table, writes: list[tuple[Any, ...] | Delete], version: int | None) -> Table:
    """What PostgreSQL does with the statements one by one: INSERT ... ON CONFLICT DO UPDATE (keeps
    the other column; with a version column only when not older), DELETE."""
    out = dict(table)
    for write in writes:
        if isinstance(write, Delete):
            out.pop(write.key, None)
            continue
        key = (write[0],)
        if key not in out:
            out[key] = (write, "default")
        elif version is None or out[key][0][version] <= write[version]:
            out[key] = (write, out[key][1])
    return out


def collapsed(table: Table, writes: list[tuple[Any, ...] | Delete], version: int | None) -> Table:
    """What the sink's one transaction does: the collapsed deletes, then the collapsed upserts."""
    changes = KeyedChanges((0,), version)
    for write in writes:
        changes.add(write)
    out = dict(table)
    for key in changes.deletes():
        out.pop(key, None)
    for row in changes.upserts():
        key = (row[0],)
        if key not in out:
            out[key] = (row, "default")
        elif version is None or out[key][0][version] <= row[version]:
            out[key] = (row, out[key][1])
    return out


OPS = [(1, "a", 1), (1, "b", 2), (1, "c", 1), Delete((1,)), (2, "z", 5), Delete((2,))]
STARTS: list[Table] = [
    {},
    {(1,): ((1, "stored", 1), "kept")},
    {(1,): ((1, "stored", 9), "kept"), (2,): ((2, "s", 0), "k")},
]


@pytest.mark.parametrize("version", [None, VERSION])
def test_every_sequence_of_up_to_four_changes_collapses_to_the_same_table(version: int | None) -> None:
    checked = 0
    for start in STARTS:
        for n in range(5):
            for writes in itertools.product(OPS, repeat=n):
                assert collapsed(start, list(writes), version) == sequential(start, list(writes), version), (
                    start,
                    writes,
                )
                checked += 1
    assert checked == len(STARTS) * sum(len(OPS) ** n for n in range(5))


def test_an_upsert_then_a_delete_of_the_key_ends_deleted() -> None:
    changes = KeyedChanges((0,))
    changes.add((1, "a", 1))
    changes.add(Delete((1,)))
    assert (changes.deletes(), changes.upserts(), len(changes)) == ([(1,)], [], 1)


def test_a_delete_then_an_insert_of_the_key_ends_present_replacing_the_stored_row() -> None:
    changes = KeyedChanges((0,))
    changes.add(Delete((1,)))
    changes.add((1, "a", 1))
    assert list(changes) == [Upsert((1, "a", 1), replaces=True)]
    assert (changes.deletes(), changes.upserts()) == ([(1,)], [(1, "a", 1)])


def test_the_encoded_form_is_plain_tuples_and_decodes_to_the_same_changes() -> None:
    changes = KeyedChanges((0,), VERSION)
    for write in [(1, "a", 1), Delete((2,)), Delete((3,)), (3, "c", 0), (4, "d", 4)]:
        changes.add(write)
    encoded = changes.encode()
    assert encoded == [("u", (1, "a", 1), False), ("d", (2,)), ("u", (3, "c", 0), True), ("u", (4, "d", 4), False)]
    decoded = KeyedChanges.decode(encoded, 2, (0,), VERSION)
    assert list(decoded) == list(changes)


def test_a_format_1_snapshot_holds_rows_that_are_all_upserts() -> None:
    decoded = KeyedChanges.decode([(1, "a", 1), [2, "b", 2]], 1, (0,))
    assert list(decoded) == [Upsert((1, "a", 1)), Upsert((2, "b", 2))]


def test_a_broken_entry_is_one_clear_error() -> None:
    with pytest.raises(SerializationError, match="neither an upsert nor a delete"):
        KeyedChanges.decode([("x", 1)], 2, (0,))


@pytest.mark.parametrize("key", [5, (), [5], None])
def test_a_delete_key_must_be_a_non_empty_tuple(key: Any) -> None:
    with pytest.raises(TypeError, match=r"Delete\(key\) takes a non-empty tuple"):
        Delete(key)


def test_apply_changes_is_the_table_in_order_and_keys_changed_counts_deleted_keys() -> None:
    writes: list[tuple[Any, ...] | Delete] = [(1, "a", 1), (2, "b", 1), Delete((1,)), (3, "c", 1), (2, "b2", 0)]
    assert apply_changes(writes, KEY) == {(2,): (2, "b2", 0), (3,): (3, "c", 1)}
    assert apply_changes(writes, KEY, VERSION) == {(2,): (2, "b", 1), (3,): (3, "c", 1)}
    assert keys_changed(writes, KEY) == 3
    assert Counter(apply_changes([*writes, Delete((9,))], KEY).values()) == Counter([(2, "b2", 0), (3, "c", 1)])
