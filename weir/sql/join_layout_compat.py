"""The layout an earlier Weir chose for each side of a changelog join (state format 2, before the
upsert keys were one derivation), frozen: used only to tell a statement whose layout changed.

Then a side's layout came from ``unique_key`` (``weir.sql.plan`` then), which knew fewer
keys than :func:`weir.sql.plan.upsert_keys` does now (none for a deduplication or Top-N, a regular
join's result or a global aggregate; a key only where a projection named it as the table did, in
the same case, and an ON naming it in that case). A savepoint of a statement whose side is now kept
otherwise holds entries keyed one way (or under another state name) that the new layout would read
another: the SQL planner gives such a join another uid (``weir.sql.compile``), so the savepoint is
refused at restore instead of read wrong. Nothing here decides how a join runs; do not change it
(a change would move the uid of statements whose savepoints restore correctly)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, assert_never

from weir.sql.cdc import is_changelog_source
from weir.sql.changelog_join import RowsKept, SideRows
from weir.sql.plan import Aggregate, Filter, Join, LookupJoin, Node, OverAggregate, Project, Scan, TopN, WindowTvf


def format2_unique_key(node: Node) -> tuple[str, ...] | None:
    """``weir.sql.plan.unique_key`` as it was earlier (state format 2) (None: none known): an 'upsert-kafka'
    or 'postgres-cdc' table's primary key, a GROUP BY's keys by their SQL (not a window's), kept
    through a WHERE and by a projection whose outputs' SQL is each key column's name as it is."""
    match node:
        case Scan():
            return (node.table.primary_key or None) if is_changelog_source(node.table) else None
        case Aggregate():
            return (tuple(k.sql for k in node.keys) or None) if node.window is None else None
        case Filter():
            return format2_unique_key(node.input)
        case Project():
            inner = format2_unique_key(node.input)
            if inner is None:
                return None
            passed = [next((o.name for o in node.outputs if o.sql == column), None) for column in inner]
            return None if None in passed else tuple(name for name in passed if name is not None)
        case Join() | WindowTvf() | LookupJoin() | TopN() | OverAggregate():
            return None
        case _:
            assert_never(node)


def format2_rows_kept(unique_key: Sequence[str] | None, join_columns: Iterable[str]) -> SideRows:
    """``weir.sql.changelog_join.rows_kept`` as it was earlier (state format 2): one row per join key when the
    join's columns hold the unique key (compared as spelt), else by the unique key, else by row."""
    if not unique_key:
        return SideRows(RowsKept.BY_ROW)
    if set(unique_key) <= set(join_columns):
        return SideRows(RowsKept.ONE_ROW)
    return SideRows(RowsKept.BY_UNIQUE_KEY, tuple(unique_key))


def format2_sides_kept(join: Join) -> tuple[SideRows, SideRows]:
    """How Weir earlier (state format 2) kept each side's rows (left, right) of ``join``'s changelog operator."""
    return (
        format2_rows_kept(format2_unique_key(join.left), (k.sql for k in join.left_keys)),
        format2_rows_kept(format2_unique_key(join.right), (k.sql for k in join.right_keys)),
    )


def layout_changed(join: Join, kept: tuple[SideRows, SideRows]) -> bool:
    """Whether ``kept`` (how this Weir keeps ``join``'s sides) differs from what Weir earlier (state format 2)
    chose: the layout's kind or, kept by a key, the key's columns or their order (an entry's key is
    the columns' values in that order)."""
    return kept != format2_sides_kept(join)


def layout_uid_suffix(kept: tuple[SideRows, SideRows]) -> str:
    """What follows a relaid changelog join's kind in its uid: its two layouts, ``-<left>-<right>``
    (``-by-unique-key-one-row``)."""
    left, right = kept
    return f"-{left.kept.value}-{right.kept.value}"


_JOIN_KIND: Final = "-changelog-join"
_SUFFIXES: Final = frozenset(f"-{a.value}-{b.value}" for a in RowsKept for b in RowsKept)


def is_relaid_join(old_uid: str, new_uid: str) -> bool:
    """Whether ``new_uid`` is the changelog join ``old_uid`` of the same statement, its sides now kept
    another way (:func:`layout_uid_suffix` after its kind): its state cannot be carried over."""
    return old_uid.endswith(_JOIN_KIND) and new_uid.startswith(old_uid) and new_uid[len(old_uid) :] in _SUFFIXES


__all__ = [
    "is_relaid_join",
    "layout_uid_suffix",
    "layout_changed",
    "format2_rows_kept",
    "format2_sides_kept",
    "format2_unique_key",
]
