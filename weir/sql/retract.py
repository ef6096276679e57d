"""A GROUP BY without a window as a changelog operator (Flink's ``GroupAggFunction``): each key's
accumulators and the row it last emitted, an input :class:`~weir.sql.changelog.Change` added or
retracted, the key's changed result emitted as ``+I`` / ``-U`` ``+U`` / ``-D``.

- :class:`RetractingAccumulators`: the built-in aggregates with a ``retract`` (Flink's ``*WithRetract``
  aggregate functions): COUNT an int, SUM and AVG ``(total, rows)``, MIN and MAX (and every DISTINCT
  call) the multiset of the values as ``{value: times}`` (a retracted minimum is replaced by the next
  one: the values must be kept, as Flink's ``MinWithRetractAggFunction`` keeps them in a map view).
- :func:`group_changes`: the pure decision of what a key's new result emits, given what it emitted.
- :class:`ChangelogAggregate`: the thin keyed operator that applies both to its state.

A key's state is the plain tuple ``(rows, accumulators, emitted)``: how many input rows the key
holds, the accumulators (tuples, ints, dicts of values), and the row last emitted (a dict, or None);
pickled as every SQL aggregate's accumulators are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, assert_never, runtime_checkable

from weir.api import Collector, KeyedProcessContext, KeyedProcessFunction, StateTtlConfig
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.plan import AggregateCall, AggregateName

Row = Mapping[str, Any]


def average(total: Any, count: int) -> Any:
    """Flink's AVG keeps the argument's type: an integer average is truncated toward zero."""
    if isinstance(total, int):
        quotient = abs(total) // count
        return quotient if total >= 0 else -quotient
    return total / count


def over_values(function: AggregateName, values: list[Any]) -> Any:
    """A built-in aggregate over a list of values (a DISTINCT call's set, MIN/MAX's live values): NULL
    over none, except COUNT's 0."""
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

    def results(self, accs: tuple[Any, ...]) -> dict[str, Any]: ...


@runtime_checkable
class Retracting(Accumulating, Protocol):
    """Accumulators that also take a row back (an input's -U or -D)."""

    def retract(self, accs: tuple[Any, ...], row: Row) -> tuple[Any, ...]: ...


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
        rows, accs, emitted = (0, self.accumulators.create(), None) if held is None else held
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
            state.update((rows, accs, None if step.emitted is None else dict(step.emitted)))


__all__ = [
    "Accumulating",
    "ChangelogAggregate",
    "GroupStep",
    "Retracting",
    "RetractingAccumulators",
    "average",
    "group_changes",
]
