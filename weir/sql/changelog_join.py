"""A regular equi-join whose inputs may be changelogs (``+I``/``-U``/``+U``/``-D``), inner or outer:
Flink's ``StreamingJoinOperator`` (a join of two GROUP BY results, or of a table with an
``upsert-kafka`` table, or a ``LEFT JOIN``).

- :func:`join_row`: the pure decision. One change of one side, the entry its side holds for the
  change's row (or unique key) and the rows the other side holds for its key in; that entry and the
  other side's rows afterwards and the joined changes out. A side's rows are :class:`HeldRow`
  values: a row, how many identical copies of it are held (Flink's ``JoinRecordStateView`` of an
  input without a unique key), and, on an outer side, how many rows of the other side it matches
  (Flink's ``OuterJoinRecordStateView``'s ``numOfAssociations``): a row of the outer side with no
  match is in the result padded with NULLs, and leaves it when its first match arrives (``-D`` of the
  padded row, then ``+I`` of the joined one), and comes back when its last match leaves.
  :func:`join_change` is the same decision over all the rows a side holds for the key.
- :class:`ChangelogJoin`: the thin keyed co-process function that applies it to its keyed state,
  each side's rows of a key as Flink's ``JoinRecordStateViews`` keep them (:class:`RowsKept`, chosen
  by the planner from what it knows of the input's unique key): one value per join key when the
  input's unique key is within the join key; otherwise a map state, one entry per unique key, or per
  distinct row with its count. A change reads and writes its own row's entry only, and reads the
  other side's rows of the key (and writes those whose associations change, an outer other side).
  Every value ``(2, (row, count, associations))``: ``weir.sql.state_format.CHANGELOG_JOIN_STATE``,
  docs/formats.md. A key still in the previous layout (value states ``left`` and ``right``, each the
  side's whole list, a savepoint of an earlier Weir) is rewritten into this one at its first change.

Every decision on a change's kind is a ``match`` ending in ``assert_never``."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final, assert_never

from weir.api import Collector, KeyedCoProcessFunction, KeyedProcessContext, MapState, StateTtlConfig, ValueState
from weir.core.errors import SerializationError
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.join import LEFT_STATE, RIGHT_STATE, JoinedRow
from weir.sql.plan import Join, upsert_keys
from weir.sql.state_format import CHANGELOG_JOIN_PREVIOUS_STATE, CHANGELOG_JOIN_STATE

Row = Mapping[str, Any]


@enum.unique
class JoinSide(enum.Enum):
    LEFT = "left"
    RIGHT = "right"

    @property
    def other(self) -> JoinSide:
        match self:
            case JoinSide.LEFT:
                return JoinSide.RIGHT
            case JoinSide.RIGHT:
                return JoinSide.LEFT
            case _:
                assert_never(self)


@dataclass(frozen=True)
class HeldRow:
    """A row one side holds for a key: ``count`` identical copies of it, and (an outer side only)
    ``associations``, the rows of the other side it matches."""

    row: Row
    count: int
    associations: int = 0


Held = tuple[HeldRow, ...]


@dataclass(frozen=True)
class JoinedChange:
    """One change of the join's result: ``kind`` of the row of ``left`` and ``right`` (None: padded
    with NULLs, the other side of an outer join's row without a match)."""

    kind: RowKind
    left: Row | None
    right: Row | None


@dataclass(frozen=True)
class RowStep:
    """What one change does to the state: the entry of its row afterwards (``own``, None: none held),
    the other side's rows afterwards, in the order given (``other``, None: unchanged), and the joined
    changes it emits, in order."""

    own: HeldRow | None
    other: Held | None
    out: tuple[JoinedChange, ...]


@dataclass(frozen=True)
class JoinStep:
    """What one change does to all the rows of its key: the rows its side (``own``) and the other side
    hold afterwards, and the joined changes it emits, in order."""

    own: Held
    other: Held
    out: tuple[JoinedChange, ...]


def _pair(side: JoinSide, row: Row | None, other: Row | None, kind: RowKind) -> JoinedChange:
    match side:
        case JoinSide.LEFT:
            return JoinedChange(kind, row, other)
        case JoinSide.RIGHT:
            return JoinedChange(kind, other, row)
        case _:
            assert_never(side)


def _added(entry: HeldRow | None, row: Row, associations: int | None) -> HeldRow:
    """``entry`` with one more copy of ``row`` (its associations set to ``associations`` when given);
    an entry of another row (a unique key's earlier row) is replaced, as Flink's state view does."""
    if entry is not None and entry.row == row:
        kept = entry.associations if associations is None else associations
        return HeldRow(entry.row, entry.count + 1, kept)
    return HeldRow(dict(row), 1, associations or 0)


def _retracted(entry: HeldRow | None, row: Row) -> HeldRow | None:
    """``entry`` with one copy of ``row`` less; an entry of another row (a unique key's) is removed,
    as Flink's state view removes a unique key's row."""
    if entry is not None and entry.row == row and entry.count > 1:
        return replace(entry, count=entry.count - 1)
    return None


def join_row(
    side: JoinSide,
    change: Change,
    own: HeldRow | None,
    other: Held,
    *,
    own_outer: bool,
    other_outer: bool,
) -> RowStep:
    """The joined changes of ``change`` arriving on ``side`` when its side holds ``own`` at the
    change's row (its copies of the row; or the row of its unique key) and the other side holds
    ``other`` for its key (every row of ``other`` matches: they share the key), as Flink's
    StreamingJoinOperator decides them:

    - a row joining (``+I``/``+U``): joined with each row of the other side; an inner join keeps its
      kind, an outer one emits ``+I``. On the outer side, a row without a match is emitted padded
      with NULLs (``+I``) and held with 0 associations. When the other side is outer, each of its
      rows that had no match leaves as its padded row (``-D``) first, and each counts one match more.
    - a row leaving (``-U``/``-D``): its joined rows leave with its kind (``-D`` when its side is
      outer), or its padded row (``-D``) when it had no match on the outer side; each row of an outer
      other side that loses its last match comes back padded (``+I``) and counts one match less."""
    row = change.row
    matched = tuple(entry for entry in other for _ in range(entry.count))
    out: list[JoinedChange] = []
    if accumulates(change.kind):
        if own_outer and not matched:
            return RowStep(_added(own, row, 0), None, (_pair(side, row, None, RowKind.INSERT),))
        counted: Held | None = None
        if other_outer:
            for entry in other:
                if entry.associations == 0:
                    out.extend(_pair(side, None, entry.row, RowKind.DELETE) for _ in range(entry.count))
            counted = tuple(replace(entry, associations=entry.associations + 1) for entry in other)
        kind = RowKind.INSERT if own_outer or other_outer else change.kind
        out.extend(_pair(side, row, entry.row, kind) for entry in matched)
        return RowStep(_added(own, row, len(matched) if own_outer else None), counted, tuple(out))
    remaining = _retracted(own, row)
    if not matched:
        padded = (_pair(side, row, None, RowKind.DELETE),) if own_outer else ()
        return RowStep(remaining, None, padded)
    kind = RowKind.DELETE if own_outer else change.kind
    out.extend(_pair(side, row, entry.row, kind) for entry in matched)
    uncounted: Held | None = None
    if other_outer:
        for entry in other:
            if entry.associations == 1:
                out.extend(_pair(side, None, entry.row, RowKind.INSERT) for _ in range(entry.count))
        uncounted = tuple(replace(entry, associations=entry.associations - 1) for entry in other)
    return RowStep(remaining, uncounted, tuple(out))


def join_change(
    side: JoinSide,
    change: Change,
    own: Held,
    other: Held,
    *,
    own_outer: bool,
    other_outer: bool,
) -> JoinStep:
    """:func:`join_row` over every row ``side`` holds for the key (``own``, each row once, with its
    copies): the change's row is found among them by equality, and a row new to them is added last."""
    at = next((i for i, entry in enumerate(own) if entry.row == change.row), None)
    step = join_row(side, change, None if at is None else own[at], other, own_outer=own_outer, other_outer=other_outer)
    kept = () if step.own is None else (step.own,)
    held = (*own, *kept) if at is None else (*own[:at], *kept, *own[at + 1 :])
    return JoinStep(held, other if step.other is None else step.other, step.out)


# -- how a side keeps its rows (Flink's JoinRecordStateViews) ------------------------------------------------


@enum.unique
class RowsKept(enum.Enum):
    """How one side keeps its rows of a join key, by what the planner knows of the input's unique key
    (Flink's ``JoinInputSideSpec``): ``ONE_ROW`` when the join key holds a unique key (a GROUP BY
    result joined on its keys: at most one row per join key, a value state); ``BY_UNIQUE_KEY`` when
    the input has a unique key outside the join key (a map state, one entry per unique key);
    ``BY_ROW`` otherwise (a map state, one entry per distinct row, with its count)."""

    ONE_ROW = "one-row"
    BY_UNIQUE_KEY = "by-unique-key"
    BY_ROW = "by-row"


@dataclass(frozen=True)
class SideRows:
    """How one side keeps its rows: ``kept``, and ``unique_key`` the input's unique key columns
    (``BY_UNIQUE_KEY`` only)."""

    kept: RowsKept
    unique_key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert bool(self.unique_key) == (self.kept is RowsKept.BY_UNIQUE_KEY), self

    def entry_key(self, row: Row) -> bytes:
        """The map entry key of ``row`` (:func:`row_identity`): its unique key's values, or all its
        values by column name; a ``ONE_ROW`` side has one entry, no entry key."""
        match self.kept:
            case RowsKept.ONE_ROW:
                return b""
            case RowsKept.BY_UNIQUE_KEY:
                return row_identity(row[c] for c in self.unique_key)
            case RowsKept.BY_ROW:
                return row_identity(row[c] for c in sorted(row))
            case _:
                assert_never(self.kept)


def rows_kept(keys: Iterable[Sequence[str]], join_columns: Iterable[str]) -> SideRows:
    """How a side keeps its rows (Flink's ``JoinInputSideSpec``), from its input's upsert keys
    (``weir.sql.plan.upsert_keys``; none: none known) and the columns its join key equates (a key
    that is an expression, not a column, holds no unique key), compared case-insensitively as SQL's
    names are: one row per join key when the join columns hold one of the keys
    (``JoinKeyContainsUniqueKey``), else one entry per value of the smallest key (the first of the
    smallest, ``HasUniqueKey``), else one entry per distinct row (``NoUniqueKey``)."""
    known = [tuple(key) for key in keys]
    joined = {c.casefold() for c in join_columns}
    if not known:
        return SideRows(RowsKept.BY_ROW)
    if any({c.casefold() for c in key} <= joined for key in known):
        return SideRows(RowsKept.ONE_ROW)
    return SideRows(RowsKept.BY_UNIQUE_KEY, min(known, key=len))


def sides_kept(join: Join) -> tuple[SideRows, SideRows]:
    """How a regular join's changelog operator keeps each side's rows (left, right): by
    :func:`rows_kept` of the side's upsert keys and its ON's columns."""
    return (
        rows_kept(upsert_keys(join.left), (k.sql for k in join.left_keys)),
        rows_kept(upsert_keys(join.right), (k.sql for k in join.right_keys)),
    )


_LENGTH: Final = struct.Struct(">I")


def _identity_part(value: Any) -> bytes:
    """One value's canonical, typed bytes: equal values (as a row compares them) give equal bytes and
    values of different types different bytes (NULL is not the string ``'null'``)."""
    match value:
        case None:
            return b"N"
        case bool():
            return b"T" if value else b"F"
        case int():
            return b"I" + str(value).encode()
        case float():
            return b"R" + repr(value + 0.0).encode()  # -0.0 + 0.0 is 0.0: equal zeros, one entry
        case Decimal():
            return b"D" + str(value.normalize()).encode()  # 1.0 and 1.00 are equal
        case str():
            return b"S" + value.encode("utf-8", "surrogatepass")
        case bytes():
            return b"B" + value
        case _:
            return b"O" + repr(value).encode("utf-8", "backslashreplace")


def row_identity(values: Iterable[Any]) -> bytes:
    """The map entry key of a row (or of its unique key): each value's :func:`_identity_part`,
    length-prefixed. A durable format (docs/formats.md, "SQL operator state")."""
    return b"".join(_LENGTH.pack(len(part)) + part for part in map(_identity_part, values))


def entry_of(stored: Any) -> HeldRow | None:
    """A held row from its state value (None: none)."""
    if stored is None:
        return None
    row, count, associations = CHANGELOG_JOIN_STATE.body(stored)
    return HeldRow(row, count, associations)


def stored_entry(entry: HeldRow) -> Any:
    """The state value of a held row (built-in values only: docs/formats.md)."""
    return CHANGELOG_JOIN_STATE.tagged((dict(entry.row), entry.count, entry.associations))


def held_of(stored: Any) -> Held:
    """A side's rows of a key from a value of the previous layout (value state ``left`` or ``right``,
    ``(1, [(row, count, associations), ...])``; None: none), to rewrite it into this one."""
    if stored is None:
        return ()
    return tuple(
        HeldRow(row, count, associations) for row, count, associations in CHANGELOG_JOIN_PREVIOUS_STATE.body(stored)
    )


_ROW_STATES: Final = {JoinSide.LEFT: "left-row", JoinSide.RIGHT: "right-row"}
"""A ``ONE_ROW`` side's value state: the key's one row."""
_ROWS_STATES: Final = {JoinSide.LEFT: "left-rows", JoinSide.RIGHT: "right-rows"}
"""A ``BY_UNIQUE_KEY`` or ``BY_ROW`` side's map state: entry key -> row."""
_PREVIOUS_STATES: Final = {JoinSide.LEFT: LEFT_STATE, JoinSide.RIGHT: RIGHT_STATE}
"""The previous layout's value states: each the side's whole list of rows of the key."""


class _KeyRows:
    """One side's rows of the current key in the keyed state, as its :class:`SideRows` keeps them."""

    __slots__ = ("_state",)

    def __init__(self, rows: SideRows, side: JoinSide, ctx: KeyedProcessContext, ttl: StateTtlConfig | None) -> None:
        self._state: ValueState | MapState = (
            ctx.value_state(_ROW_STATES[side], ttl)
            if rows.kept is RowsKept.ONE_ROW
            else ctx.map_state(_ROWS_STATES[side], ttl)
        )

    def get(self, entry_key: bytes) -> HeldRow | None:
        """The entry at ``entry_key`` (a ``ONE_ROW`` side: its one entry)."""
        state = self._state
        return entry_of(state.get(entry_key) if isinstance(state, MapState) else state.value())

    def entries(self) -> list[tuple[bytes, HeldRow]]:
        """Every entry of the key, with its entry key."""
        state = self._state
        if isinstance(state, MapState):
            return [(key, HeldRow(*CHANGELOG_JOIN_STATE.body(value))) for key, value in state.items()]
        entry = entry_of(state.value())
        return [] if entry is None else [(b"", entry)]

    def put(self, entry_key: bytes, entry: HeldRow | None) -> None:
        """Write (None: remove) the entry at ``entry_key``."""
        state = self._state
        if isinstance(state, MapState):
            if entry is None:
                state.remove(entry_key)
            else:
                state.put(entry_key, stored_entry(entry))
        elif entry is None:
            state.clear()
        else:
            state.update(stored_entry(entry))


class ChangelogJoin(KeyedCoProcessFunction):
    """A regular equi-join of two inputs, either of which may be a changelog (``changelogs``: which
    are; an append input's rows are inserts), inner or outer (``outer``: which sides are), keyed by
    the ON equalities; each side's rows of a key kept as ``kept`` says (:class:`SideRows`), each change
    applied by :func:`join_row` to its own row's entry and the other side's rows of the key, and its
    joined changes emitted as changes of the joined row (``joined``; a missing side's columns NULL:
    ``nulls``).

    A row whose key has a NULL matches nothing (SQL's ``=``): on an outer side it is emitted padded,
    ``+I`` as it joins and ``-D`` as it leaves, and nothing is held; on an inner side it is dropped."""

    def __init__(
        self,
        joined: JoinedRow,
        nulls: tuple[Row, Row],
        *,
        outer: tuple[bool, bool],
        changelogs: tuple[bool, bool],
        kept: tuple[SideRows, SideRows] = (SideRows(RowsKept.BY_ROW), SideRows(RowsKept.BY_ROW)),
        ttl: StateTtlConfig | None = None,
    ) -> None:
        self.joined, self.nulls, self.outer, self.changelogs, self.ttl = joined, nulls, outer, changelogs, ttl
        self.kept = kept

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._apply(JoinSide.LEFT, value, ctx, out)

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._apply(JoinSide.RIGHT, value, ctx, out)

    def _of(self, pair: tuple[Any, Any], side: JoinSide) -> Any:
        match side:
            case JoinSide.LEFT:
                return pair[0]
            case JoinSide.RIGHT:
                return pair[1]
            case _:
                assert_never(side)

    def _apply(self, side: JoinSide, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        change = value if self._of(self.changelogs, side) else Change(RowKind.INSERT, value)
        assert isinstance(change, Change), f"changelog-join got {value!r}"
        own_outer, other_outer = self._of(self.outer, side), self._of(self.outer, side.other)
        if None in ctx.key:
            if own_outer:
                kind = RowKind.INSERT if accumulates(change.kind) else RowKind.DELETE
                self._emit((_pair(side, change.row, None, kind),), out)
            return
        own_kept: SideRows = self._of(self.kept, side)
        own_rows = _KeyRows(own_kept, side, ctx, self.ttl)
        other_rows = _KeyRows(self._of(self.kept, side.other), side.other, ctx, self.ttl)
        entry_key = own_kept.entry_key(change.row)
        own, others = own_rows.get(entry_key), other_rows.entries()
        if own is None and not others and self._rewrite_previous(ctx):
            own, others = own_rows.get(entry_key), other_rows.entries()
        step = join_row(side, change, own, tuple(e for _, e in others), own_outer=own_outer, other_outer=other_outer)
        self._emit(step.out, out)
        if step.own != own:
            own_rows.put(entry_key, step.own)
        if step.other is not None:
            for (key, before), after in zip(others, step.other, strict=True):
                if after != before:
                    other_rows.put(key, after)

    def _rewrite_previous(self, ctx: KeyedProcessContext) -> bool:
        """Rewrite the current key's rows from the previous layout (value states ``left`` and
        ``right``, each a side's whole list: a savepoint of an earlier Weir) into this one, and drop
        them; whether there were any. A key with an entry in this layout has none left (its first
        change rewrote them), so only a change finding nothing of its key on either side asks."""
        found = False
        for side in JoinSide:
            previous = ctx.value_state(_PREVIOUS_STATES[side], self.ttl)
            held = held_of(previous.value())
            if not held:
                continue
            found = True
            kept: SideRows = self._of(self.kept, side)
            rows = _KeyRows(kept, side, ctx, self.ttl)
            missing = [c for c in kept.unique_key if any(c not in entry.row for entry in held)]
            if missing:  # format 1 stored a side's rows without the columns nothing above the join read
                raise SerializationError(
                    f"changelog-join state of key {ctx.key!r} ({side.value} side, format 1) holds rows without "
                    f"{', '.join(missing)}, the unique key this Weir keeps them by: "
                    "restore the savepoint with the Weir version that wrote it"
                )
            keys = [kept.entry_key(entry.row) for entry in held]
            if len(set(keys)) != len(keys) or (kept.kept is not RowsKept.BY_ROW and any(e.count > 1 for e in held)):
                raise SerializationError(
                    f"changelog-join state of key {ctx.key!r} ({side.value} side, format 1) holds "
                    f"{sum(e.count for e in held)} rows where its input's unique key allows one per "
                    f"{'join key' if kept.kept is RowsKept.ONE_ROW else 'unique key'}: "
                    "restore the savepoint with the Weir version that wrote it"
                )
            for key, entry in zip(keys, held, strict=True):
                rows.put(key, entry)
            previous.clear()
        return found

    def _emit(self, changes: Sequence[JoinedChange], out: Collector) -> None:
        left_nulls, right_nulls = self.nulls
        for joined in changes:
            left = left_nulls if joined.left is None else joined.left
            right = right_nulls if joined.right is None else joined.right
            out.collect(Change(joined.kind, self.joined(left, right)))


__all__ = [
    "ChangelogJoin",
    "Held",
    "HeldRow",
    "JoinSide",
    "JoinStep",
    "JoinedChange",
    "RowStep",
    "RowsKept",
    "SideRows",
    "entry_of",
    "held_of",
    "join_change",
    "join_row",
    "row_identity",
    "rows_kept",
    "sides_kept",
    "stored_entry",
]
