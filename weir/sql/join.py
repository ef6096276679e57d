"""A regular inner equi-join of two append inputs (Flink's ``StreamingJoinOperator``), row by row
(:class:`RegularJoin`, a KeyedCoProcessFunction) or in mini-batches (:class:`MiniBatchRegularJoin`,
Flink's ``MiniBatchStreamingJoinOperator``, under ``SET 'table.exec.mini-batch.enabled' = 'true'``).

Both keep each side's rows of a key in the list state ``left`` / ``right`` (each element ``(1, row)``,
``weir.sql.state_format.JOIN_STATE``; a bare row dict as written before the tag; in a ``TtlValue``
under a state TTL) and emit, for each row, its joined row with every row the other side
holds, once the row is stored: each pair of rows of a key is joined exactly once, by the later of
the two. The two operators' states are the same, so their savepoints restore into each other.

:class:`JoinedRow` builds the joined row, only of the columns read above the join when the plan
says which (``weir.sql.decode.read_above``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from operator import itemgetter
from typing import Any

from weir.api import Collector, KeyedCoProcessFunction, KeyedProcessContext, StateTtlConfig
from weir.core.process_functions import Clock, wall_clock_ms
from weir.core.rejections import FAIL, OnRecordError
from weir.operators.keyed import KeyedOperator
from weir.operators.process_state import ListState, Ttl, drop_expired
from weir.sql.minibatch import MiniBatchBuffer, MiniBatchConfig
from weir.sql.plan import Join, LookupJoin
from weir.sql.state_format import JOIN_STATE

LEFT_STATE = "left"
RIGHT_STATE = "right"


class JoinedRow:
    """A join's row of a left and a right row: every column as ``qualifier.column``, and as
    ``column`` where only one side has it; given ``read`` (the case-folded names read above the
    join), only the columns of those names."""

    def __init__(
        self,
        left_qualifier: str,
        right_qualifier: str,
        left_columns: Sequence[str],
        right_columns: Sequence[str],
        read: Collection[str] | None = None,
    ) -> None:
        self.left_qualifier, self.right_qualifier = left_qualifier, right_qualifier
        self.left_only = tuple(c for c in left_columns if c not in right_columns)
        self.right_only = tuple(c for c in right_columns if c not in left_columns)
        self.read = read
        if read is not None:
            kept_left = tuple(c for c in left_columns if c.casefold() in read)
            kept_right = tuple(c for c in right_columns if c.casefold() in read)
            from_left = tuple((f"{left_qualifier}.{c}", c) for c in kept_left) + tuple(
                (c, c) for c in kept_left if c in self.left_only
            )
            from_right = tuple((f"{right_qualifier}.{c}", c) for c in kept_right) + tuple(
                (c, c) for c in kept_right if c in self.right_only
            )
            self.names = tuple(name for name, _ in from_left + from_right)
            self.left_values = _values_of(tuple(c for _, c in from_left))
            self.right_values = _values_of(tuple(c for _, c in from_right))

    def __call__(self, left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
        if self.read is not None:
            return dict(zip(self.names, self.left_values(left) + self.right_values(right), strict=True))
        row = {f"{self.left_qualifier}.{k}": v for k, v in left.items()}
        row.update({f"{self.right_qualifier}.{k}": v for k, v in right.items()})
        row.update({k: left[k] for k in self.left_only})
        row.update({k: right[k] for k in self.right_only})
        return row


def _values_of(columns: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The tuple of a row's values of ``columns`` (one C call for two or more)."""
    match columns:
        case ():
            return lambda row: ()
        case (only,):
            return lambda row: (row[only],)
        case _:
            return itemgetter(*columns)


def joined_row(join: Join | LookupJoin, read: Collection[str] | None = None) -> JoinedRow:
    return JoinedRow(join.left_qualifier, join.right_qualifier, join.left_columns, join.right_columns, read)


class RegularJoin(KeyedCoProcessFunction):
    """An inner equi-join's two sides per key, row by row: each row is kept in its side's list state
    and joined with every row the other side holds (a NULL key never matches, as SQL's ``=``)."""

    def __init__(self, joined: JoinedRow, ttl: StateTtlConfig | None = None) -> None:
        self.ttl = ttl  # a side's rows of a key dropped when that side has had no row of the key for ttl
        self.joined = joined
        self._ctx: KeyedProcessContext | None = None  # the context the two states below were asked of
        self._sides: tuple[ListState, ListState] | None = None

    def _states(self, ctx: KeyedProcessContext) -> tuple[ListState, ListState]:
        """The two sides' list states, asked of ``ctx`` once (they read its current key)."""
        sides = self._sides
        if sides is None or ctx is not self._ctx:
            sides = self._sides = (ctx.list_state(LEFT_STATE, self.ttl), ctx.list_state(RIGHT_STATE, self.ttl))
            self._ctx = ctx
        return sides

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        if None in ctx.key:
            return
        left, right = self._states(ctx)
        left.add(JOIN_STATE.tagged(value))
        others = right.get()
        if others:
            body, joined, collect = JOIN_STATE.body, self.joined, out.collect
            for other in others:
                collect(joined(value, body(other)))

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        if None in ctx.key:
            return
        left, right = self._states(ctx)
        right.add(JOIN_STATE.tagged(value))
        others = left.get()
        if others:
            body, joined, collect = JOIN_STATE.body, self.joined, out.collect
            for other in others:
                collect(joined(body(other), value))


_LEFT, _RIGHT = 0, 1  # input indexes: the join's first (left) and second (right) input


class MiniBatchRegularJoin(KeyedOperator):
    """A regular join under ``SET 'table.exec.mini-batch.enabled' = 'true'`` (Flink's
    ``MiniBatchStreamingJoinOperator`` for an inner join): the rows of both inputs wait in one
    :class:`~weir.sql.minibatch.MiniBatchBuffer` by side and key; a flush applies the right side's
    keys first, then the left side's (Flink's order), each key's rows at once: its side's list state
    read and written once, the other side's read once, each row joined with the other side's rows as
    stored then, its joined rows stamped with its own timestamp. A pair of rows of one batch is so
    joined once, when its left row is applied; the joined rows are those of :class:`RegularJoin`,
    in another order.

    The buffer is applied when it holds ``size`` rows (of both inputs), ``allow_latency_ms`` after
    its first row, before every snapshot (no buffered row is ever in a checkpoint: the state alone
    restores exactly) and at the end of input; a watermark waits behind a non-empty buffer. A row
    whose key has a NULL is dropped as it arrives (it never matches)."""

    def __init__(
        self,
        key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]],
        joined: JoinedRow,
        config: MiniBatchConfig,
        ttl: StateTtlConfig | None = None,
        clock: Clock = wall_clock_ms,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(key_selectors[0])
        self._key_selectors = key_selectors
        self.joined, self.config, self.ttl_config, self.clock = joined, config, ttl, clock
        self.on_error = on_error
        self.batches = 0

    def key_selector_of(self, input_index: int) -> Callable[[Any], Any]:
        return self._key_selectors[input_index]

    def open(self) -> None:
        super().open()
        self.buffer: MiniBatchBuffer[tuple[int, Any], tuple[Any, int | None]] = MiniBatchBuffer(self.config)
        self.ttl = None if self.ttl_config is None else Ttl(self.ttl_config, self.clock)
        self.sides = (ListState(self, LEFT_STATE, self.ttl), ListState(self, RIGHT_STATE, self.ttl))

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        if input_index not in (_LEFT, _RIGHT):
            raise ValueError(f"a two-input operator has inputs 0 and 1, not {input_index}")
        key_selector = self._key_selectors[input_index]
        try:
            key = key_selector(value)
            self.switch_to_key(key)  # a key that does not encode is rejected here, as row by row
        except Exception as exc:
            self.reject(key_selector, exc, value, timestamp)
            return
        if self.samples_left:
            self.sample_key(input_index, value)
        if None in key:
            return
        if self.buffer.add((input_index, key), (value, timestamp), self.clock):
            self.flush()

    def process(self, value: Any, timestamp: int | None) -> None:
        self.process_input(_LEFT, value, timestamp)

    def flush(self) -> None:
        """Apply the buffered rows (the right side's keys, then the left side's), emit the joined rows,
        then the watermark held meanwhile."""
        drained = self.buffer.drain()
        for side in (_RIGHT, _LEFT):
            for (input_index, key), entries in drained.groups:
                if input_index == side:
                    self._apply(side, key, entries)
        self.batches += 1
        if drained.watermark is not None:
            self.output.emit_watermark(drained.watermark)

    def _apply(self, side: int, key: Any, entries: Sequence[tuple[Any, int | None]]) -> None:
        self.switch_to_key(key)
        own, other = self.sides[side], self.sides[1 - side]
        own.add_all([JOIN_STATE.tagged(row) for row, _ in entries])
        others = [JOIN_STATE.body(held) for held in other.get()]
        if not others:
            return
        emit, joined = self.output.emit, self.joined
        if side == _LEFT:
            for row, timestamp in entries:
                for right in others:
                    emit(joined(row, right), timestamp)
        else:
            for row, timestamp in entries:
                for left in others:
                    emit(joined(left, row), timestamp)

    def process_watermark(self, watermark: int) -> None:
        forward = self.buffer.watermark(watermark)
        if forward is not None:
            self.output.emit_watermark(forward)

    def next_processing_time(self) -> int | None:
        return self.buffer.due_at()

    def on_processing_time(self, now_ms: int) -> None:
        self.flush()

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        """The buffer applied first (its joined rows go out before the barrier), then the expired rows
        dropped (under a state TTL) and the store flushed."""
        self.flush()
        if self.ttl is not None:
            for name in (LEFT_STATE, RIGHT_STATE):
                drop_expired(self.store, name, self.ctx.key_group_range, self.ttl)
        return super().snapshot_state(checkpoint_id)

    def end_input(self) -> None:
        self.flush()
        super().end_input()


__all__ = ["LEFT_STATE", "RIGHT_STATE", "JoinedRow", "MiniBatchRegularJoin", "RegularJoin", "joined_row"]
