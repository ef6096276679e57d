"""Changelog writes into a keyed table: an upsert or a delete by primary key (Flink's ``RowKind``).

A PostgreSQL sink's ``row`` function turns each value into what it does to the table: a tuple of the
columns' values upserts that row by its key columns; :class:`Delete` deletes the row of a key. This
module is the pure part, with no I/O:

- :class:`Delete`, the typed value a ``row`` function returns for a delete;
- :class:`KeyedChanges`, the changes of one transaction collapsed per key to the one write that has
  the same effect as applying them in order (an upsert then a delete of a key ends deleted, a delete
  then an upsert ends present and fresh), and its durable form in a sink snapshot;
- :func:`apply_changes`, the table a sequence of changes leaves (the reference ``weir verify`` uses).

A CDC ``ChangeEvent`` maps onto it directly: a read, insert or update upserts ``after``; a delete is
``Delete`` of the key columns of ``before`` (docs/postgres-cdc-source.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from weir.core.errors import SerializationError

Row = tuple[Any, ...]
Key = tuple[Any, ...]

CHANGES_FORMAT: Final = 2
"""The durable form of :class:`KeyedChanges` in a sink snapshot (``SinkSnapshot`` format 2); format 1
held upserted rows only (every entry a row)."""

_UPSERT: Final = "u"
_DELETE: Final = "d"


@dataclass(frozen=True)
class Delete:
    """Delete the row whose key columns hold ``key`` (their values, in the order of ``key_columns``).

    What a PostgreSQL sink's ``row`` function returns for a value that deletes a row; any other
    return value is the row to upsert. Deleting a key the table does not hold changes nothing."""

    key: Key

    def __post_init__(self) -> None:
        if not isinstance(self.key, tuple) or not self.key:
            raise TypeError(
                f"Delete(key) takes a non-empty tuple of the key columns' values, e.g. Delete((42,)); got {self.key!r}"
            )


@dataclass(frozen=True)
class Upsert:
    """An upsert of ``row``; ``replaces``: a delete of its key came before it in the same transaction,
    so the stored row is deleted first (columns the sink does not write get their defaults, as if
    the delete and the insert ran one after the other)."""

    row: Row
    replaces: bool = False


Change = Upsert | Delete
"""The one write per key a transaction makes."""


class KeyedChanges:
    """The changes of one transaction (a checkpoint epoch, or a batch), collapsed per key.

    Per key the last change wins, with two refinements that keep the result equal to applying every
    change in order: an upsert after a delete of its key ``replaces`` the stored row (delete, then
    insert), and with a version column an upsert replaces a kept upsert only when its version is not
    older (the table's own rule: a stored row is never replaced by an older version). A delete is not
    versioned: it deletes whatever the key holds. Keys keep the order of their first change."""

    __slots__ = ("_changes", "_key_index", "_replaces", "_version_index")

    def __init__(self, key_index: Sequence[int], version_index: int | None = None) -> None:
        self._key_index = tuple(key_index)
        self._version_index = version_index
        # Per key its last row or Delete (plain values: no object per record on the hot path), and
        # the keys whose row replaces the stored one (a delete of the key came before it).
        self._changes: dict[Key, Row | Delete] = {}
        self._replaces: set[Key] = set()

    def key_of(self, row: Row) -> Key:
        return tuple(row[i] for i in self._key_index)

    def add(self, write: Row | Delete) -> None:
        """One sink record: a row to upsert, or a delete."""
        changes = self._changes
        if isinstance(write, tuple):
            key = tuple(write[i] for i in self._key_index)
            kept = changes.get(key)
            if kept is None:
                changes[key] = write
            elif isinstance(kept, Delete):
                changes[key] = write
                self._replaces.add(key)
            else:
                version = self._version_index
                if version is None or kept[version] <= write[version]:
                    changes[key] = write
        elif isinstance(write, Delete):
            changes[write.key] = write
            self._replaces.discard(write.key)
        else:
            raise TypeError(f"a change is a row tuple or a Delete, not {type(write).__name__}")

    def __len__(self) -> int:
        """Keys changed: the writes the transaction makes (what its commit proof counts)."""
        return len(self._changes)

    def __iter__(self) -> Iterator[Change]:
        replaces = self._replaces
        for key, change in self._changes.items():
            yield change if isinstance(change, Delete) else Upsert(change, key in replaces)

    def deletes(self) -> list[Key]:
        """The keys to delete first: every delete, and every upsert that replaces its stored row."""
        replaces = self._replaces
        return [key for key, change in self._changes.items() if isinstance(change, Delete) or key in replaces]

    def upserts(self) -> list[Row]:
        """The rows to upsert after the deletes."""
        return [change for change in self._changes.values() if not isinstance(change, Delete)]

    # Durable form (sink snapshots, docs/formats.md) ---------------------------------------------

    def encode(self) -> list[tuple[Any, ...]]:
        """Plain tuples only (no class of this module): ``("u", row, replaces)`` or ``("d", key)``."""
        out: list[tuple[Any, ...]] = []
        for change in self:
            match change:
                case Upsert(row=row, replaces=replaces):
                    out.append((_UPSERT, row, replaces))
                case Delete(key=key):
                    out.append((_DELETE, key))
                case _:
                    assert_never(change)
        return out

    @classmethod
    def decode(
        cls, entries: Iterable[Any], format_: int, key_index: Sequence[int], version_index: int | None = None
    ) -> KeyedChanges:
        """The changes ``encode`` wrote (``format_`` 2), or a format 1 snapshot's rows (all upserts)."""
        changes = cls(key_index, version_index)
        for entry in entries:
            if format_ == 1:
                row = tuple(entry)
                changes._changes[changes.key_of(row)] = row
                continue
            match tuple(entry):
                case (tag, row, bool(replaces)) if tag == _UPSERT:
                    row = tuple(row)
                    key = changes.key_of(row)
                    changes._changes[key] = row
                    if replaces:
                        changes._replaces.add(key)
                case (tag, key) if tag == _DELETE:
                    changes._changes[tuple(key)] = Delete(tuple(key))
                case _:
                    raise SerializationError(
                        f"sink snapshot: a change entry {entry!r} is neither an upsert nor a delete"
                    )
        return changes


def apply_changes(
    writes: Iterable[Row | Delete],
    key_index: Sequence[int],
    version_index: int | None = None,
    start: Mapping[Key, Row] | None = None,
) -> dict[Key, Row]:
    """The table (rows by key) that applying ``writes`` in order to the table ``start`` (None: an
    empty one) leaves."""
    table: dict[Key, Row] = dict(start or {})
    for write in writes:
        match write:
            case Delete(key=key):
                table.pop(key, None)
            case tuple():
                key = tuple(write[i] for i in key_index)
                kept = table.get(key)
                if version_index is None or kept is None or kept[version_index] <= write[version_index]:
                    table[key] = write
            case _:
                raise TypeError(f"a change is a row tuple or a Delete, not {type(write).__name__}")
    return table


def keys_changed(writes: Iterable[Row | Delete], key_index: Sequence[int]) -> int:
    """How many distinct keys ``writes`` touch (upserted or deleted)."""
    return len({w.key if isinstance(w, Delete) else tuple(w[i] for i in key_index) for w in writes})


__all__ = ["CHANGES_FORMAT", "Change", "Delete", "KeyedChanges", "Upsert", "apply_changes", "keys_changed"]
