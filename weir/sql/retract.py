"""A GROUP BY without a window as a changelog operator (Flink's ``GroupAggFunction``): each key's
accumulators and the row it last emitted, an input :class:`~weir.sql.changelog.Change` added or
retracted, the key's changed result emitted as ``+I`` / ``-U`` ``+U`` / ``-D``.

- :class:`RetractingAccumulators`: the built-in aggregates with a ``retract`` (Flink's ``*WithRetract``
  aggregate functions): COUNT an int, SUM and AVG ``(total, rows)``, MIN and MAX (and every DISTINCT
  call) the multiset of the values as ``{value: times}`` (a retracted minimum is replaced by the next
  one: the values must be kept, as Flink's ``MinWithRetractAggFunction`` keeps them in a map view).
- :func:`group_changes`: the pure decision of what a key's new result emits, given what it emitted.
- :class:`ChangelogAggregate`: the thin keyed operator that applies both to its state.

A key's state is ``(1, (rows, accumulators, emitted))`` (``weir.sql.state_format``'s
``CHANGELOG_AGGREGATE_STATE``): the format, then how many input rows the key holds, the accumulators
(tuples, ints, dicts of values), and the row last emitted (a dict, or None); pickled as every SQL
aggregate's accumulators are. The untagged triple a savepoint of an earlier Weir holds is read as
format 1."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, assert_never, runtime_checkable

from weir.api import Collector, KeyedProcessContext, KeyedProcessFunction, StateTtlConfig
from weir.core.process_functions import Clock, wall_clock_ms
from weir.core.rejections import FAIL, OnRecordError
from weir.core.state_schema import StateSchema
from weir.operators.keyed import KeyedOperator
from weir.operators.process_state import Ttl, ValueState, drop_expired
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.minibatch import MiniBatchBuffer, MiniBatchConfig
from weir.sql.plan import AggregateCall, AggregateName
from weir.sql.state_format import CHANGELOG_AGGREGATE_STATE, GROUP_AGGREGATE_STATE

Row = Mapping[str, Any]


def average(total: Any, count: int) -> Any:
    """Flink's AVG keeps the argument's type: an integer average is truncated toward zero."""
    if isinstance(total, int):
        quotient = abs(total) // count
        return quotient if total >= 0 else -quotient
    return total / count


def over_values(function: AggregateName, values: Collection[Any]) -> Any:
    """A built-in aggregate over a collection of values (a DISTINCT call's set, read in place: no copy
    per row; MIN/MAX's live values): NULL over none, except COUNT's 0."""
    match function:
        case "COUNT":
            return len(values)
        case "SUM":
            return sum(values) if values else None
        case "MIN":
            return min(values) if values else None
        case "MAX":
            return max(values) if values else None
        case "AVG":
            return average(sum(values), len(values)) if values else None
        case "PYTHON":
            raise AssertionError("a Python aggregate has its own result")
        case _:
            assert_never(function)


@runtime_checkable
class Accumulating(Protocol):
    """The accumulators of a GROUP BY's calls, as plain values."""

    def create(self) -> tuple[Any, ...]: ...

    def add(self, accs: tuple[Any, ...], row: Row) -> tuple[Any, ...]: ...

    def add_all(self, accs: tuple[Any, ...], rows: Sequence[Row]) -> tuple[Any, ...]:
        """``add`` of each row in turn (a mini-batch); ``accs`` itself is left as it is."""
        ...

    def results(self, accs: tuple[Any, ...]) -> dict[str, Any]: ...


@runtime_checkable
class Retracting(Accumulating, Protocol):
    """Accumulators that also take a row back (an input's -U or -D)."""

    def retract(self, accs: tuple[Any, ...], row: Row) -> tuple[Any, ...]: ...

    def fold(self, accs: tuple[Any, ...], changes: Sequence[tuple[int, Row]]) -> tuple[Any, ...]:
        """Each ``(sign, row)`` added (1) or taken back (-1) in turn (a mini-batch); ``accs`` itself
        is left as it is."""
        ...


def _counted(acc: Mapping[Any, int], value: Any, sign: int) -> dict[Any, int]:
    """The multiset ``acc`` with ``value`` added (``sign`` 1) or taken back (-1); a new dict."""
    out = dict(acc)
    times = out.get(value, 0) + sign
    if times:
        out[value] = times
    else:
        out.pop(value, None)
    return out


class RetractingAccumulators:
    """The built-in aggregates over an updating input (a changelog): each call's accumulator adds a
    row and takes one back. A call's ``FILTER (WHERE ...)`` leaves its accumulator as it is for a row
    whose condition is not TRUE, added or taken back alike: a -U or -D carries the whole row its +I or
    +U added, so the condition decides the same both times (Flink's filtered retracting aggregates).
    A Python aggregate has no retract: the planner refuses it there."""

    def __init__(self, calls: tuple[AggregateCall, ...]) -> None:
        self.calls = calls
        self.arguments = tuple(c.argument.evaluate if c.argument is not None else None for c in calls)
        self.conditions = tuple(c.condition.evaluate if c.condition is not None else None for c in calls)

    def create(self) -> tuple[Any, ...]:
        return tuple(self._empty(c) for c in self.calls)

    def add(self, accs: tuple[Any, ...], row: Row) -> tuple[Any, ...]:
        return self._apply(accs, row, 1)

    def retract(self, accs: tuple[Any, ...], row: Row) -> tuple[Any, ...]:
        return self._apply(accs, row, -1)

    def add_all(self, accs: tuple[Any, ...], rows: Sequence[Row]) -> tuple[Any, ...]:
        return self.fold(accs, [(1, row) for row in rows])

    def fold(self, accs: tuple[Any, ...], changes: Sequence[tuple[int, Row]]) -> tuple[Any, ...]:
        """As ``add``/``retract`` of each change in turn, but each multiset accumulator (a DISTINCT
        call's, MIN's, MAX's) is copied once for the whole batch, then counted in place."""
        out = []
        for call, acc, f in zip(self.calls, accs, self.arguments, strict=True):
            if f is not None and (call.distinct or call.function in ("MIN", "MAX")):
                counted = dict(acc)
                for sign, row in changes:
                    value = f(row)
                    if value is not None:
                        times = counted.get(value, 0) + sign
                        if times:
                            counted[value] = times
                        else:
                            del counted[value]
                out.append(counted)
                continue
            for sign, row in changes:
                acc = self._step(call, acc, None if f is None else f(row), sign)
            out.append(acc)
        return tuple(out)

    def _apply(self, accs: tuple[Any, ...], row: Row, sign: int) -> tuple[Any, ...]:
        return tuple(
            a if w is not None and w(row) is not True else self._step(c, a, None if f is None else f(row), sign)
            for c, a, f, w in zip(self.calls, accs, self.arguments, self.conditions, strict=True)
        )

    @staticmethod
    def _empty(call: AggregateCall) -> Any:
        if call.distinct:
            return {}
        match call.function:
            case "COUNT":
                return 0
            case "SUM" | "AVG":
                return (None, 0)
            case "MIN" | "MAX":
                return {}
            case "PYTHON":
                raise AssertionError("a Python aggregate over an updating input is refused by the planner")
            case _:
                assert_never(call.function)

    @staticmethod
    def _step(call: AggregateCall, acc: Any, value: Any, sign: int) -> Any:
        if call.argument is None:  # COUNT(*)
            return acc + sign
        if value is None:  # NULLs are not aggregated
            return acc
        if call.distinct:
            return _counted(acc, value, sign)
        match call.function:
            case "COUNT":
                return acc + sign
            case "SUM" | "AVG":
                total, rows = acc
                rows += sign
                if rows == 0:
                    return (None, 0)
                signed = value if sign > 0 else -value
                return (signed if total is None else total + signed, rows)
            case "MIN" | "MAX":
                return _counted(acc, value, sign)
            case "PYTHON":
                raise AssertionError("a Python aggregate over an updating input is refused by the planner")
            case _:
                assert_never(call.function)

    def results(self, accs: tuple[Any, ...]) -> dict[str, Any]:
        return {c.name: self._result(c, a) for c, a in zip(self.calls, accs, strict=True)}

    @staticmethod
    def _result(call: AggregateCall, acc: Any) -> Any:
        if call.argument is None:
            return acc
        if call.distinct or call.function in ("MIN", "MAX"):
            if call.function == "PYTHON":
                raise AssertionError("a Python aggregate over an updating input is refused by the planner")
            return over_values(call.function, [v for v, times in acc.items() if times > 0])
        match call.function:
            case "COUNT":
                return acc
            case "SUM":
                return acc[0] if acc[1] > 0 else None
            case "AVG":
                return average(acc[0], acc[1]) if acc[1] > 0 else None
            case "MIN" | "MAX" | "PYTHON":
                raise AssertionError(call.function)  # handled above / refused by the planner
            case _:
                assert_never(call.function)


@dataclass(frozen=True)
class GroupStep:
    """What one input change of a key emits, and the key's row in the result afterwards."""

    changes: tuple[Change, ...]
    emitted: Row | None


def group_changes(emitted: Row | None, result: Row | None, kind: RowKind, *, paired: bool) -> GroupStep:
    """The changes a key emits when an input change of ``kind`` leaves it with ``result`` (None: no
    input row left), having emitted ``emitted`` before (None: the key is not in the result).

    An unchanged result emits nothing (Flink's GroupAggFunction without a state TTL). A key whose
    last row leaves is deleted (-D), except, when ``paired`` (the input -U's +U reaches this same key:
    ``weir.sql.plan.Aggregate.holds_input_key``), by a ``-U``: its ``+U`` follows from the same
    upstream operator, and the key's row is then updated (-U, +U) instead of deleted and inserted
    again, which ends in the same table (Flink emits -D, +I there) without a transient delete."""
    match kind:
        case RowKind.INSERT | RowKind.UPDATE_AFTER:
            assert result is not None, "an added row leaves its key with a result"
            return _updated(emitted, result)
        case RowKind.UPDATE_BEFORE | RowKind.DELETE:
            if result is not None:
                return _updated(emitted, result)
            if paired and kind is RowKind.UPDATE_BEFORE:
                return GroupStep((), emitted)  # its +U follows: the key's row stays until then
            return GroupStep(() if emitted is None else (Change(RowKind.DELETE, emitted),), None)
        case _:
            assert_never(kind)


def _updated(emitted: Row | None, result: Row) -> GroupStep:
    if emitted is None:
        return GroupStep((Change(RowKind.INSERT, result),), result)
    if dict(emitted) == dict(result):
        return GroupStep((), emitted)
    return GroupStep((Change(RowKind.UPDATE_BEFORE, emitted), Change(RowKind.UPDATE_AFTER, result)), result)


class ChangelogAggregate(KeyedProcessFunction):
    """A GROUP BY without a window whose result is a changelog (read by another operator, or an
    aggregation of an updating input): each input row (a :class:`Change`, or a plain row of an
    append input: an insert) added to or retracted from its key's accumulators, the key's changes
    emitted as :func:`group_changes` decides (``paired``: its rule for a -U emptying a key). A
    retraction of a key holding no row is dropped, as Flink drops it (its row was never counted: a
    state TTL expired it)."""

    def __init__(
        self,
        key_names: tuple[str, ...],
        accumulators: Accumulating,
        input_changelog: bool,
        paired: bool,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        self.key_names, self.accumulators, self.ttl = key_names, accumulators, ttl
        self.input_changelog, self.paired = input_changelog, paired

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        change = value if self.input_changelog else Change(RowKind.INSERT, value)
        assert isinstance(change, Change), f"a changelog operator got {value!r}"
        state = ctx.value_state("group", self.ttl)
        held = state.value()
        rows, accs, emitted = (
            (0, self.accumulators.create(), None) if held is None else CHANGELOG_AGGREGATE_STATE.body(held)
        )
        if accumulates(change.kind):
            rows, accs = rows + 1, self.accumulators.add(accs, change.row)
        elif rows == 0:
            return
        else:
            assert isinstance(self.accumulators, Retracting), "an append input is never retracted"
            rows, accs = rows - 1, self.accumulators.retract(accs, change.row)
        if rows == 0:
            accs = self.accumulators.create()
        result = None
        if rows > 0:
            result = dict(zip(self.key_names, ctx.key, strict=True))
            result.update(self.accumulators.results(accs))
        step = group_changes(emitted, result, change.kind, paired=self.paired)
        for emitted_change in step.changes:
            out.collect(emitted_change)
        if rows == 0 and step.emitted is None:
            state.clear()
        else:
            state.update(
                CHANGELOG_AGGREGATE_STATE.tagged((rows, accs, None if step.emitted is None else dict(step.emitted)))
            )


# Mini-batch (SET 'table.exec.mini-batch.enabled') ------------------------------------------------------------


class BatchGroup(Protocol):
    """What a mini-batch does to one key: its held state and its buffered inputs in arrival order
    in, its new state (None: the key holds nothing) and what it emits out. ``held`` is left as it is."""

    def apply(self, key: tuple[Any, ...], held: Any, inputs: Sequence[Any]) -> tuple[Any, list[Any]]: ...


class ChangelogBatch:
    """:class:`ChangelogAggregate` over a key's batch: its state the same ``(1, (rows, accumulators,
    emitted))``, every input change applied in turn (a retraction of a key holding no row dropped),
    then one step of :func:`group_changes` from the row the key emitted before to its result after
    the batch, with the kind of the last change applied: the intermediate updates of the batch are
    not emitted (the final table is the same; Flink's mini-batch emits one change per key too)."""

    def __init__(
        self, key_names: tuple[str, ...], accumulators: Accumulating, input_changelog: bool, paired: bool
    ) -> None:
        self.key_names, self.accumulators = key_names, accumulators
        self.input_changelog, self.paired = input_changelog, paired
        # decided once: an isinstance of a runtime-checkable protocol inspects its members each time
        self.retracting = accumulators if isinstance(accumulators, Retracting) else None

    def apply(self, key: tuple[Any, ...], held: Any, inputs: Sequence[Any]) -> tuple[Any, list[Any]]:
        rows, accs, emitted = (
            (0, self.accumulators.create(), None) if held is None else CHANGELOG_AGGREGATE_STATE.body(held)
        )
        if not self.input_changelog:  # an append input: every row added, in one pass
            if not inputs:
                return held, []
            accs = self.accumulators.add_all(accs, inputs)
            return self._emitted(key, rows + len(inputs), accs, emitted, RowKind.INSERT)
        changes: list[tuple[int, Row]] = []
        last: RowKind | None = None
        for change in inputs:
            assert isinstance(change, Change), f"a changelog operator got {change!r}"
            if accumulates(change.kind):
                rows += 1
                changes.append((1, change.row))
            elif rows == 0:
                continue
            else:
                rows -= 1
                changes.append((-1, change.row))
            last = change.kind
        if last is None:  # every input a retraction of nothing
            return held, []
        if self.retracting is not None:
            accs = self.retracting.fold(accs, changes)
        else:
            accs = self.accumulators.add_all(accs, [row for _sign, row in changes])
        return self._emitted(key, rows, accs, emitted, last)

    def _emitted(
        self, key: tuple[Any, ...], rows: int, accs: tuple[Any, ...], emitted: Row | None, last: RowKind
    ) -> tuple[Any, list[Any]]:
        """The key's new state and changes, its batch applied (``last``: the kind of its last change)."""
        if rows == 0:
            accs = self.accumulators.create()
        result = None
        if rows > 0:
            result = dict(zip(self.key_names, key, strict=True))
            result.update(self.accumulators.results(accs))
        step = group_changes(emitted, result, last, paired=self.paired)
        if rows == 0 and step.emitted is None:
            return None, list(step.changes)
        emitted = None if step.emitted is None else dict(step.emitted)
        return CHANGELOG_AGGREGATE_STATE.tagged((rows, accs, emitted)), list(step.changes)


class UpsertBatch:
    """A GROUP BY of an append input written straight to an upsert sink, over a key's batch: its
    state the accumulators, every row added, the key's updated row emitted once (not when the
    batch left the result as it was)."""

    def __init__(self, key_names: tuple[str, ...], accumulators: Accumulating) -> None:
        self.key_names, self.accumulators = key_names, accumulators

    def apply(self, key: tuple[Any, ...], held: Any, inputs: Sequence[Any]) -> tuple[Any, list[Any]]:
        """``held`` and the new state: ``[1, accumulators]`` (``GROUP_AGGREGATE_STATE``)."""
        stored = None if held is None else GROUP_AGGREGATE_STATE.body(held)
        before = None if stored is None else self.accumulators.results(stored)
        accs = self.accumulators.add_all(self.accumulators.create() if stored is None else stored, inputs)
        after = self.accumulators.results(accs)
        if after == before:
            return GROUP_AGGREGATE_STATE.tagged(accs), []
        row = dict(zip(self.key_names, key, strict=True))
        row.update(after)
        return GROUP_AGGREGATE_STATE.tagged(accs), [row]


class MiniBatchGroupAggregate(KeyedOperator):
    """A GROUP BY without a window under ``SET 'table.exec.mini-batch.enabled' = 'true'`` (Flink's
    ``MiniBatchGroupAggFunction`` behind its bundle operator): the input rows wait in a
    :class:`~weir.sql.minibatch.MiniBatchBuffer` by key, then each key's rows are applied at once
    (``group``: :class:`ChangelogBatch` or :class:`UpsertBatch`) and its change emitted, stamped with
    the timestamp of the key's last row. The buffer is applied when it holds ``size`` rows, when
    ``allow_latency_ms`` passed since its first row (a processing-time deadline), before every
    snapshot (so that a checkpoint holds no buffered row: the state alone restores exactly) and at
    the end of input. Each key's state is the value state ``state_name`` (with the state TTL when
    there is one: the per-record operator's layout)."""

    def __init__(
        self,
        key_selector: Callable[[Any], Any],
        group: BatchGroup,
        config: MiniBatchConfig,
        state_name: str,
        ttl: StateTtlConfig | None = None,
        clock: Clock = wall_clock_ms,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(key_selector, [StateSchema(state_name)])
        self.group, self.config, self.state_name, self.ttl_config, self.clock = group, config, state_name, ttl, clock
        self.on_error = on_error
        self.batches = 0

    def open(self) -> None:
        super().open()
        self.buffer: MiniBatchBuffer[Any, tuple[Any, int | None]] = MiniBatchBuffer(self.config)
        self.ttl = None if self.ttl_config is None else Ttl(self.ttl_config, self.clock)
        self.state = ValueState(self, self.state_name, self.ttl)

    def process(self, value: Any, timestamp: int | None) -> None:
        try:
            self.set_current_key(value)
        except Exception as exc:
            self.reject(self._key_selector, exc, value, timestamp)
            return
        if self.buffer.add(self.current_key, (value, timestamp), self.clock):
            self.flush()

    def flush(self) -> None:
        """Apply every buffered key's rows, emit their changes, then the watermark held meanwhile."""
        drained = self.buffer.drain()
        emit = self.output.emit
        for key, entries in drained.groups:
            self.switch_to_key(key)
            held = self.state.value()
            timestamp = entries[-1][1]
            try:
                state, out = self.group.apply(key, held, [value for value, _ in entries])
            except Exception:  # apply row by row: the row it raises on is rejected alone
                state, out = self._one_by_one(key, held, entries)
            if state is None:
                self.state.clear()
            else:
                self.state.update(state)
            for change in out:
                emit(change, timestamp)
        self.batches += 1
        if drained.watermark is not None:
            self.output.emit_watermark(drained.watermark)

    def _one_by_one(self, key: Any, held: Any, entries: Sequence[tuple[Any, int | None]]) -> tuple[Any, list[Any]]:
        """The batch without the rows it raises on, each found by applying the rows one at a time and
        rejected (``on_error``); the others then applied as one batch (one change, as without them)."""
        state, good = held, []
        for value, timestamp in entries:
            try:
                state, _changes = self.group.apply(key, state, [value])
            except Exception as exc:
                self.reject(self.group.apply, exc, value, timestamp, key)
                continue
            good.append(value)
        return self.group.apply(key, held, good) if good else (held, [])

    def process_watermark(self, watermark: int) -> None:
        forward = self.buffer.watermark(watermark)
        if forward is not None:
            self.output.emit_watermark(forward)

    def next_processing_time(self) -> int | None:
        return self.buffer.due_at()

    def on_processing_time(self, now_ms: int) -> None:
        self.flush()

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        """The buffer applied first (its changes go out before the barrier), then the expired values
        dropped and the store flushed."""
        self.flush()
        if self.ttl is not None:
            drop_expired(self.store, self.state_name, self.ctx.key_group_range, self.ttl)
        return super().snapshot_state(checkpoint_id)

    def end_input(self) -> None:
        self.flush()
        super().end_input()


__all__ = [
    "Accumulating",
    "BatchGroup",
    "ChangelogAggregate",
    "ChangelogBatch",
    "MiniBatchGroupAggregate",
    "UpsertBatch",
    "GroupStep",
    "Retracting",
    "RetractingAccumulators",
    "average",
    "group_changes",
]
