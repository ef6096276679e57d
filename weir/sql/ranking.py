"""Top-N without a window (Flink's ``AppendOnlyTopNFunction``, and deduplication as its N = 1):
``ROW_NUMBER() OVER (PARTITION BY k ORDER BY ...) AS rn ... WHERE rn <= N`` over an append input.
Each partition keeps its first N rows in order; a row that enters them changes the rows at its row
number and after, and the operator emits, per row number whose row changed, ``-U`` of the old row and
``+U`` of the new (``+I`` for a row number filled for the first time): a changelog keyed by the
partition and the row number (``weir.sql.changelog``), which an upsert sink keyed the same way
applies. A row that does not enter the first N emits nothing; the first N never shrink (the input
appends), so nothing is deleted.

Over an updating input (a GROUP BY's result: Flink's ``RetractableTopNFunction``),
:class:`RetractingRankedRows` keeps every row of the partition, since a row leaving the first N
brings the next one in: :func:`retracting_changes` applies a change to them and emits, per row
number whose row changed, ``-U``/``+U``, ``+I`` for a row number filled, ``-D`` for one emptied."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from weir.api import Collector, KeyedProcessContext, KeyedProcessFunction, StateTtlConfig
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.state_format import RETRACTING_TOP_N_STATE, TOP_N_STATE

Row = Mapping[str, Any]


def ranked_changes(before: Sequence[Row], after: Sequence[Row], rank: str) -> tuple[Change, ...]:
    """The changes from a partition's first rows ``before`` to ``after`` (each in order), each row
    with its row number (1 the first) in column ``rank``: per row number whose row changed, -U of the
    old and +U of the new, or +I when ``before`` had no row there."""
    changes: list[Change] = []
    for number, row in enumerate(after, start=1):
        if number <= len(before):
            old = before[number - 1]
            if dict(old) == dict(row):
                continue
            changes.append(Change(RowKind.UPDATE_BEFORE, {**old, rank: number}))
            changes.append(Change(RowKind.UPDATE_AFTER, {**row, rank: number}))
        else:
            changes.append(Change(RowKind.INSERT, {**row, rank: number}))
    assert len(after) >= len(before), "an append input's first rows never shrink"
    return tuple(changes)


class RankedRows(KeyedProcessFunction):
    """A partition's first ``limit`` rows in the order ``sort_key`` gives, in value state ``top`` as
    ``(1, [row dict, ...])`` (``weir.sql.state_format.TOP_N_STATE``: the untagged list an earlier Weir
    wrote is read too), pickled as SQL state is; each input row's changes as :func:`ranked_changes`
    decides."""

    def __init__(
        self, sort_key: Callable[[Row], Any], limit: int, rank: str, ttl: StateTtlConfig | None = None
    ) -> None:
        self.sort_key, self.limit, self.rank, self.ttl = sort_key, limit, rank, ttl

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        state = ctx.value_state("top", self.ttl)
        held = state.value()
        before: list[dict[str, Any]] = [] if held is None else TOP_N_STATE.body(held)
        after = sorted([*before, dict(value)], key=self.sort_key)[: self.limit]
        changes = ranked_changes(before, after, self.rank)
        if not changes:
            return
        for change in changes:
            out.collect(change)
        state.update(TOP_N_STATE.tagged(after))


def retracting_changes(
    rows: Sequence[Row], change: Change, sort_key: Callable[[Row], Any], limit: int, rank: str
) -> tuple[list[dict[str, Any]], tuple[Change, ...]]:
    """A partition's rows (in order) after ``change``, and the changes of its first ``limit`` rows:
    per row number whose row changed, -U of the old and +U of the new, +I where there was none, -D
    where there is none left. A leaving row the partition does not hold changes nothing."""
    after = [dict(r) for r in rows]
    row = dict(change.row)
    if accumulates(change.kind):
        after = sorted([*after, row], key=sort_key)
    elif row in after:
        after.remove(row)
    else:
        return after, ()
    changes: list[Change] = []
    before_top, after_top = rows[:limit], after[:limit]
    for number in range(1, max(len(before_top), len(after_top)) + 1):
        old = dict(before_top[number - 1]) if number <= len(before_top) else None
        new = after_top[number - 1] if number <= len(after_top) else None
        if old == new:
            continue
        if old is None:
            assert new is not None
            changes.append(Change(RowKind.INSERT, {**new, rank: number}))
        elif new is None:
            changes.append(Change(RowKind.DELETE, {**old, rank: number}))
        else:
            changes.append(Change(RowKind.UPDATE_BEFORE, {**old, rank: number}))
            changes.append(Change(RowKind.UPDATE_AFTER, {**new, rank: number}))
    return after, tuple(changes)


class RetractingRankedRows(KeyedProcessFunction):
    """A Top-N without a window over an updating input (its elements changes, keyed by their rows'
    partition): every row of the partition in value state ``rows`` as ``(1, [row dict, ...])`` in
    order (``weir.sql.state_format.RETRACTING_TOP_N_STATE``), each change's changes as
    :func:`retracting_changes` decides."""

    def __init__(
        self, sort_key: Callable[[Row], Any], limit: int, rank: str, ttl: StateTtlConfig | None = None
    ) -> None:
        self.sort_key, self.limit, self.rank, self.ttl = sort_key, limit, rank, ttl

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        assert isinstance(value, Change), f"retracting-top-n got {value!r}"
        state = ctx.value_state("rows", self.ttl)
        held = state.value()
        before: list[dict[str, Any]] = [] if held is None else RETRACTING_TOP_N_STATE.body(held)
        after, changes = retracting_changes(before, value, self.sort_key, self.limit, self.rank)
        for change in changes:
            out.collect(change)
        if after == before:
            return
        if after:
            state.update(RETRACTING_TOP_N_STATE.tagged(after))
        else:
            state.clear()


__all__ = ["RankedRows", "RetractingRankedRows", "ranked_changes", "retracting_changes"]
