"""A regular equi-join whose inputs may be changelogs (``+I``/``-U``/``+U``/``-D``), inner or outer:
Flink's ``StreamingJoinOperator`` (a join of two GROUP BY results, or of a table with an
``upsert-kafka`` table, or a ``LEFT JOIN``).

- :func:`join_change`: the pure decision. One change of one side, the rows both sides hold for its
  key in, the rows they hold afterwards and the joined changes out. A side's rows are
  :class:`HeldRow` values: a row, how many identical copies of it are held (Flink's
  ``JoinRecordStateView`` of an input without a unique key), and, on an outer side, how many rows of
  the other side it matches (Flink's ``OuterJoinRecordStateView``'s ``numOfAssociations``): a row of
  the outer side with no match is in the result padded with NULLs, and leaves it when its first match
  arrives (``-D`` of the padded row, then ``+I`` of the joined one), and comes back when its last
  match leaves.
- :class:`ChangelogJoin`: the thin keyed co-process function that applies it to its keyed state
  (value states ``left`` and ``right``, ``(1, [(row, count, associations), ...])``:
  ``weir.sql.state_format.CHANGELOG_JOIN_STATE``, docs/formats.md) and emits each joined change as a
  :class:`~weir.sql.changelog.Change` of the joined row.

Flink keeps one row per unique key for an input that has one (a GROUP BY result keyed by its join
key); Weir keeps the same rows-with-counts layout for every input: the same result, one layout to
read. Every decision on a change's kind is a ``match`` ending in ``assert_never``."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, assert_never

from weir.api import Collector, KeyedCoProcessFunction, KeyedProcessContext, StateTtlConfig
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.join import LEFT_STATE, RIGHT_STATE, JoinedRow
from weir.sql.state_format import CHANGELOG_JOIN_STATE

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
class JoinStep:
    """What one change does: the rows its side (``own``) and the other side hold afterwards, and the
    joined changes it emits, in order."""

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


def _added(held: Held, row: Row, associations: int | None) -> Held:
    """``held`` with one more copy of ``row`` (its associations set to ``associations`` when given)."""
    for i, entry in enumerate(held):
        if entry.row == row:
            kept = entry.associations if associations is None else associations
            return (*held[:i], HeldRow(entry.row, entry.count + 1, kept), *held[i + 1 :])
    return (*held, HeldRow(dict(row), 1, associations or 0))


def _retracted(held: Held, row: Row) -> Held:
    """``held`` with one copy of ``row`` less (a row not held: as it was, Flink's too)."""
    for i, entry in enumerate(held):
        if entry.row == row:
            if entry.count == 1:
                return (*held[:i], *held[i + 1 :])
            return (*held[:i], replace(entry, count=entry.count - 1), *held[i + 1 :])
    return held


def join_change(
    side: JoinSide,
    change: Change,
    own: Held,
    other: Held,
    *,
    own_outer: bool,
    other_outer: bool,
) -> JoinStep:
    """The joined changes of ``change`` arriving on ``side`` when the two sides hold ``own`` and
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
            return JoinStep(_added(own, row, 0), other, (_pair(side, row, None, RowKind.INSERT),))
        if other_outer:
            for entry in other:
                if entry.associations == 0:
                    out.extend(_pair(side, None, entry.row, RowKind.DELETE) for _ in range(entry.count))
            other = tuple(replace(entry, associations=entry.associations + 1) for entry in other)
        kind = RowKind.INSERT if own_outer or other_outer else change.kind
        out.extend(_pair(side, row, entry.row, kind) for entry in matched)
        return JoinStep(_added(own, row, len(matched) if own_outer else None), other, tuple(out))
    own = _retracted(own, row)
    if not matched:
        padded = (_pair(side, row, None, RowKind.DELETE),) if own_outer else ()
        return JoinStep(own, other, padded)
    kind = RowKind.DELETE if own_outer else change.kind
    out.extend(_pair(side, row, entry.row, kind) for entry in matched)
    if other_outer:
        for entry in other:
            if entry.associations == 1:
                out.extend(_pair(side, None, entry.row, RowKind.INSERT) for _ in range(entry.count))
        other = tuple(replace(entry, associations=entry.associations - 1) for entry in other)
    return JoinStep(own, other, tuple(out))


def held_of(stored: Any) -> Held:
    """A side's rows of a key from its state value (None: none)."""
    if stored is None:
        return ()
    return tuple(HeldRow(row, count, associations) for row, count, associations in CHANGELOG_JOIN_STATE.body(stored))


def stored_of(held: Held) -> Any:
    """The state value of a side's rows of a key (built-in values only: docs/formats.md)."""
    return CHANGELOG_JOIN_STATE.tagged([(dict(e.row), e.count, e.associations) for e in held])


_STATE_NAMES = {JoinSide.LEFT: LEFT_STATE, JoinSide.RIGHT: RIGHT_STATE}


class ChangelogJoin(KeyedCoProcessFunction):
    """A regular equi-join of two inputs, either of which may be a changelog (``changelogs``: which
    are; an append input's rows are inserts), inner or outer (``outer``: which sides are), keyed by
    the ON equalities; each key's rows of each side in value state ``left`` / ``right``
    (:func:`held_of`), each change applied by :func:`join_change` and its joined changes emitted as
    changes of the joined row (``joined``; a missing side's columns NULL: ``nulls``).

    A row whose key has a NULL matches nothing (SQL's ``=``): on an outer side it is emitted padded,
    ``+I`` as it joins and ``-D`` as it leaves, and nothing is held; on an inner side it is dropped."""

    def __init__(
        self,
        joined: JoinedRow,
        nulls: tuple[Row, Row],
        *,
        outer: tuple[bool, bool],
        changelogs: tuple[bool, bool],
        ttl: StateTtlConfig | None = None,
    ) -> None:
        self.joined, self.nulls, self.outer, self.changelogs, self.ttl = joined, nulls, outer, changelogs, ttl

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._apply(JoinSide.LEFT, value, ctx, out)

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._apply(JoinSide.RIGHT, value, ctx, out)

    def _is(self, flags: tuple[bool, bool], side: JoinSide) -> bool:
        match side:
            case JoinSide.LEFT:
                return flags[0]
            case JoinSide.RIGHT:
                return flags[1]
            case _:
                assert_never(side)

    def _apply(self, side: JoinSide, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        change = value if self._is(self.changelogs, side) else Change(RowKind.INSERT, value)
        assert isinstance(change, Change), f"changelog-join got {value!r}"
        own_outer, other_outer = self._is(self.outer, side), self._is(self.outer, side.other)
        if None in ctx.key:
            if own_outer:
                kind = RowKind.INSERT if accumulates(change.kind) else RowKind.DELETE
                self._emit((_pair(side, change.row, None, kind),), out)
            return
        own_state = ctx.value_state(_STATE_NAMES[side], self.ttl)
        other_state = ctx.value_state(_STATE_NAMES[side.other], self.ttl)
        own, other = held_of(own_state.value()), held_of(other_state.value())
        step = join_change(side, change, own, other, own_outer=own_outer, other_outer=other_outer)
        self._emit(step.out, out)
        for state, before, after in ((own_state, own, step.own), (other_state, other, step.other)):
            if after == before:
                continue
            if after:
                state.update(stored_of(after))
            else:
                state.clear()

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
    "held_of",
    "join_change",
    "stored_of",
]
