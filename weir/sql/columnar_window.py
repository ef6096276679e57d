"""SQL window aggregation (``GROUP BY`` over a ``TUMBLE`` or ``HOP`` window TVF) pre-aggregated on
Arrow batches, with the per-record path's exact results (``SET 'weir.columnar' = 'true'``).

:class:`ColumnarWindowOperator` is the per-record window operator (``weir.operators.windows``) with
the same aggregate (``weir.sql.compile.WindowAggregation``), key function, windows and state: each
(key, window) accumulator, or each (key, slice) one for a HOP window (sliced as the per-record path
slices them: a row is aggregated into one slice of width ``gcd(size, slide)``, not into each of its
windows), is the same ``(key, accumulators)`` entry, and the operator state the same watermark
document. A savepoint of either path therefore restores into the other, and at another parallelism
(docs/formats.md). What changes is how rows reach the state:

- rows are gathered as they come (up to :data:`BATCH_ROWS`); nothing is fired or dropped meanwhile;
- when a watermark is about to fire a window (or drop a slice) that a gathered row belongs to, at a
  checkpoint's snapshot (so nothing is held across a barrier), at the end of input, or when
  :data:`BATCH_ROWS` are gathered, the gathered rows are assessed against the watermark they came
  under (it has not moved past any of their windows, so it is the current one): a row whose window
  (a slice's earliest window) has already fired, or is late, takes the per-record path, in arrival
  order (late drop, late-data side output, late firing, exactly as there); the others are grouped
  by (key, window or slice start) in one ``pyarrow`` group-by, and each group's partial aggregate is
  merged into its state entry once (a new entry is the partial itself, with the per-record path's
  timers);
- after a restore at another parallelism, while some key groups still follow their old subtask's
  watermark, rows take the per-record path.

Vectorized, and exact as Python computes them: ``COUNT(*)``, ``COUNT(x)``; ``SUM``, ``AVG`` of BIGINT
(a group whose sum could leave int64 is summed as decimal128); ``MIN``/``MAX`` of BIGINT and STRING
(UTF-8 byte order is code point order). A batch whose argument values are of another kind (DOUBLE:
a float sum depends on the order of its terms), mix kinds, whose key holds a DOUBLE zero (0.0 and
-0.0 are one dict key but two keys' bytes in the state), or whose key or argument raises for a row,
is processed per record, whole, in order. Keys are grouped by Python equality, which for the values
of one SQL type is equality of their bytes but for that zero. DISTINCT aggregates, Python aggregate functions,
CUMULATE and SESSION windows and HOP windows whose size is not above their slide stay per record
(:func:`window_columnar` says why, for EXPLAIN).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.api import DataStream
from weir.api.checks import state_schema
from weir.api.connector import WithOnError
from weir.core.process_functions import OutputTag
from weir.core.rejections import FAIL, OnRecordError
from weir.core.state_layout import WINDOW_STATE, window_key_suffix
from weir.core.state_schema import StateSchema
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.windows import CLEANUP_TIMER, FIRE_TIMER, WindowAggregateOperator
from weir.sql.plan import Aggregate, AggregateCall

BATCH_ROWS: Final = 8_192
"""Rows a :class:`ColumnarWindowOperator` gathers at most before it aggregates them."""

VECTORIZED: Final = frozenset({"COUNT", "SUM", "MIN", "MAX", "AVG"})

_KEY, _START = "__key", "__start"
_TIME_LIMIT: Final = 2**61  # a row's time beyond it (int64 window arithmetic could overflow): per record


@dataclass(frozen=True)
class WindowFallback:
    """Why a statement's window aggregation stays on the per-record path."""

    reason: str


def window_columnar(node: Aggregate) -> WindowFallback | None:
    """None when ``node`` (a GROUP BY over a window TVF) runs on batches, else why it does not."""
    window = node.window
    if window is None:
        return WindowFallback("a GROUP BY without a window")
    match window.kind:
        case "TUMBLE":
            pass
        case "HOP":
            if window.size_ms <= window.slide_ms:
                return WindowFallback("a HOP window whose size is not above its slide (it is not sliced)")
        case _:
            return WindowFallback(f"{window.kind} windows")
    for call in node.calls:
        if call.function not in VECTORIZED or call.distinct:
            return WindowFallback(f"the aggregate {call.sql}")
    return None


@dataclass(frozen=True)
class _Partial:
    """How one call's accumulator is read from the group-by's columns."""

    function: str
    columns: tuple[str, ...]  # COUNT(*)/COUNT/SUM/MIN/MAX: one column; AVG: (sum, count)


class _NotVectorized(Exception):
    """A batch whose values Arrow would not aggregate as Python does: it is processed per record."""


class ColumnarWindowOperator(WindowAggregateOperator):
    """The per-record window operator (same aggregate ``fn``, key function, windows and state), its
    on-time rows aggregated in batches; see the module's docstring. ``key_parts`` are the key's
    expressions (``key_selector(row) == tuple(f(row) for f in key_parts)``) and ``calls`` the
    aggregate's calls, as ``fn`` (a ``WindowAggregation``) accumulates them."""

    def __init__(
        self,
        fn: Any,
        key_selector: Callable[[Any], Any],
        calls: Sequence[AggregateCall],
        assigner: TumblingEventTimeWindows | SlidingEventTimeWindows,
        allowed_lateness_ms: int = 0,
        state_schema: StateSchema | None = None,
        *,
        late_data: OutputTag | None = None,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(
            fn, key_selector, assigner, allowed_lateness_ms, state_schema, late_data=late_data, on_error=on_error
        )
        if isinstance(assigner, SlidingEventTimeWindows) and not self.slice_ms:
            raise ValueError(f"{assigner!r}: only sliced sliding windows (size above slide) are columnar")
        self._rows: list[Any] = []
        self._stamps: list[int] = []
        self._assessed = 0  # gathered rows whose earliest firing is in _first_fire
        self._first_fire: int | None = None
        arguments: dict[str, Callable[[Any], Any]] = {}
        self._partials: list[_Partial] = []
        aggregations: dict[tuple[str, str], str] = {}  # (column, Arrow function) -> its result column

        def column(name: str, function: str) -> str:
            if (name, function) not in aggregations:
                aggregations[(name, function)] = "count_all" if not name else f"{name}_{function}"
            return aggregations[(name, function)]

        self._kinds: dict[str, str] = {}  # argument column -> what it may hold: "count", "number", "ordered"
        for call in calls:
            if call.argument is None:
                self._partials.append(_Partial("COUNT", (column("", "count_all"),)))
                continue
            name = next((n for n, f in arguments.items() if f is call.argument.evaluate), None)
            if name is None:
                name = f"a{len(arguments)}"
                arguments[name] = call.argument.evaluate
            wanted = {"COUNT": "count", "SUM": "number", "AVG": "number"}.get(call.function, "ordered")
            if self._kinds.get(name) in (None, "count") or wanted == "number":
                self._kinds[name] = wanted
            match call.function:
                case "COUNT":
                    self._partials.append(_Partial("COUNT", (column(name, "count"),)))
                case "SUM" | "MIN" | "MAX":
                    self._partials.append(_Partial(call.function, (column(name, call.function.lower()),)))
                case "AVG":
                    self._partials.append(_Partial("AVG", (column(name, "sum"), column(name, "count"))))
                case other:
                    raise ValueError(f"{other} is not vectorized")
        self._arguments = tuple(arguments.items())
        self._aggregations = [([], "count_all") if not name else (name, fn_) for name, fn_ in aggregations]
        self.batches_per_record = 0  # batches processed per record, whole (values Arrow would not aggregate alike)
        self.rows_grouped = 0  # rows aggregated on batches

    # Rows in -----------------------------------------------------------------------------------------

    def process(self, value: Any, timestamp: int | None) -> None:
        if timestamp is None or self._inherited_watermarks or not -_TIME_LIMIT < timestamp < _TIME_LIMIT:
            self._flush()  # in arrival order: the rows gathered before it first
            super().process(value, timestamp)  # no timestamp: the per-record path's error
            return
        self._rows.append(value)
        self._stamps.append(timestamp)
        if len(self._rows) >= BATCH_ROWS:
            self._flush()

    def process_watermark(self, watermark: int) -> None:
        if watermark > self._watermark and self._rows:
            if self._assessed < len(self._rows):
                fires = self._fire_points(np.array(self._stamps[self._assessed :], dtype=np.int64))
                first = int(fires.min())
                self._first_fire = first if self._first_fire is None else min(self._first_fire, first)
                self._assessed = len(self._rows)
            assert self._first_fire is not None
            if watermark >= self._first_fire:  # it fires (or drops) a window a gathered row belongs to
                self._flush()
        super().process_watermark(watermark)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._flush()  # nothing gathered is left out of the snapshot
        return super().snapshot_state(checkpoint_id)

    def end_input(self) -> None:
        self._flush()
        super().end_input()

    # Windows of a batch ---------------------------------------------------------------------------------

    def _starts(self, stamps: np.ndarray) -> np.ndarray:
        """Each row's window start (tumbling) or slice start (sliced sliding windows)."""
        width = self.slice_ms or self._assigner.size_ms
        result: np.ndarray = stamps - (stamps - self._assigner.offset_ms) % width
        return result

    def _first_windows(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For slices starting at ``starts``: the starts of the earliest and the latest window each is in."""
        assigner = self._assigner
        size, slide = assigner.size_ms, assigner.slide_ms
        last_start = starts - (starts - assigner.offset_ms) % slide
        first_start = last_start - (last_start - starts + size - 1) // slide * slide
        return first_start, last_start

    def _fire_points(self, stamps: np.ndarray) -> np.ndarray:
        """The watermark at which each row's earliest window fires (its last timestamp)."""
        starts = self._starts(stamps)
        if self.slice_ms:
            starts = self._first_windows(starts)[0]
        result: np.ndarray = starts + (self._assigner.size_ms - 1)
        return result

    # Aggregating a batch ----------------------------------------------------------------------------

    def _flush(self) -> None:
        rows, stamps = self._rows, self._stamps
        if not rows:
            return
        self._rows, self._stamps, self._assessed, self._first_fire = [], [], 0, None
        times = np.array(stamps, dtype=np.int64)
        starts = self._starts(times)
        fires = (
            self._first_windows(starts)[0] + (self._assigner.size_ms - 1)
            if self.slice_ms
            else starts + (self._assigner.size_ms - 1)
        )
        on_time = fires > self._watermark
        grouped = np.flatnonzero(on_time)
        if grouped.size:
            try:
                work = self._grouped(rows, grouped, starts[grouped])
            except _NotVectorized:
                self.batches_per_record += 1
                for row, ts in zip(rows, stamps, strict=True):
                    super().process(row, ts)
                return
            self._apply(*work)
            self.rows_grouped += int(grouped.size)
        if grouped.size < len(rows):  # fired or late windows: the per-record path, in arrival order
            process = super().process
            for i in np.flatnonzero(~on_time).tolist():
                process(rows[i], stamps[i])

    def _grouped(
        self, rows: Sequence[Any], indices: np.ndarray, starts: np.ndarray
    ) -> tuple[list[tuple[Any, tuple[bytes, int, bytes]]], list[tuple[int, int, tuple[Any, ...]]], list[Any]]:
        """The on-time rows ``indices`` grouped by (key, start): the distinct keys (each with its
        encoding: bytes, key group, state key prefix), each group's (key index, start, partial
        accumulators), and the rows to sample keys from. Mutates nothing."""
        picked = [rows[i] for i in indices.tolist()]
        key_of = self._key_selector
        index: dict[Any, int] = {}
        try:
            keys = [key_of(row) for row in picked]
            ids = [index.setdefault(k, len(index)) for k in keys]
            columns: dict[str, Any] = {
                _KEY: pa.array(ids, type=pa.int64()),
                _START: pa.array(starts, type=pa.int64()),
            }
            for name, evaluate in self._arguments:
                columns[name] = _argument([evaluate(row) for row in picked], self._kinds[name])
            if any(_signed_zero(k) for k in index):
                raise _NotVectorized  # 0.0 == -0.0 in a dict, not in the keys' bytes: per record
            encode = self._keys.encode
            encoded = [encode(k) for k in index]
        except _NotVectorized:
            raise
        except Exception:  # a key or an argument that raises: the per-record path's error handling
            raise _NotVectorized from None
        table = _widen_sums(pa.table(columns), [n for n, k in self._kinds.items() if k == "number"])
        result = table.group_by([_KEY, _START], use_threads=False).aggregate(self._aggregations)
        values = {c: _python_values(result.column(c)) for c in result.column_names}
        partials = []
        for p in self._partials:
            match p.function:
                case "AVG":
                    partials.append(list(zip(values[p.columns[0]], values[p.columns[1]], strict=True)))
                case _:
                    partials.append(values[p.columns[0]])
        groups = list(
            zip(values[_KEY], values[_START], zip(*partials, strict=True), strict=True)
            if partials
            else ((k, s, ()) for k, s in zip(values[_KEY], values[_START], strict=True))
        )
        return list(zip(index, encoded, strict=True)), groups, picked[: self.samples_left] if self.samples_left else []

    def _apply(
        self,
        keys: list[tuple[Any, tuple[bytes, int, bytes]]],
        groups: list[tuple[int, int, tuple[Any, ...]]],
        samples: list[Any],
    ) -> None:
        """Merge each group's partial accumulators into its state entry (a new entry: the partial,
        with the per-record path's timers for a new window or slice)."""
        store, merge, timers, lateness = self.store, self._fn.merge, self._timers, self._lateness
        size, offset = self._assigner.size_ms, self._assigner.offset_ms
        slide = getattr(self._assigner, "slide_ms", size)
        sliced = self.slice_ms
        width = sliced or size
        for key_id, start, partial in groups:
            key, (_kb, kg, prefix) = keys[key_id]
            sk = prefix + window_key_suffix(start, start + width)
            entry = store.get(WINDOW_STATE, kg, sk)
            if entry is None:
                acc = tuple(partial)
                if sliced:
                    last = start - (start - offset) % slide  # the latest and earliest windows of the slice
                    first = last - (last - start + size - 1) // slide * slide
                    heapq.heappush(timers, (last + size - 1 + lateness, CLEANUP_TIMER, kg, sk))
                    fire_key = prefix + window_key_suffix(first, first + size)
                    heapq.heappush(timers, (first + size - 1, FIRE_TIMER, kg, fire_key))
                else:
                    heapq.heappush(timers, (start + size - 1, FIRE_TIMER, kg, sk))
            else:
                acc = merge(entry[1], tuple(partial))
            store.put(WINDOW_STATE, kg, sk, (key, acc))
        key_of = self._key_selector
        for row in samples:  # the first rows after a checkpoint, as the per-record path samples them
            if not self.samples_left:
                break
            self.switch_to_key(key_of(row))
            self.sample_key(0, row)


def _signed_zero(key: Any) -> bool:
    """Whether a key is, or holds, a float zero (0.0 and -0.0 are one dict key but two keys' bytes)."""
    parts = key if isinstance(key, tuple) else (key,)
    return any(type(x) is float and x == 0.0 for x in parts)


def _argument(values: list[Any], kind: str) -> pa.Array:
    """An aggregate's argument values as an Arrow array of a kind Arrow aggregates as Python does."""
    try:
        array = pa.array(values)
    except (pa.ArrowException, OverflowError):
        raise _NotVectorized from None  # mixed kinds, or an int beyond int64
    if pa.types.is_null(array.type):
        return array.cast(pa.int64())
    if pa.types.is_int64(array.type):
        return array
    if kind == "count" or (kind == "ordered" and pa.types.is_string(array.type)):
        return array
    raise _NotVectorized  # DOUBLE sums and extremes depend on order and NaN: per record


def _widen_sums(table: pa.Table, fields: Sequence[str]) -> pa.Table:
    """An int64 column summed where a group's sum could leave int64 (largest |value| times the rows)
    is summed as decimal128 instead: exact, as Python's int sum is."""
    for field in fields:
        column = table.column(field)
        if not pa.types.is_int64(column.type) or column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        if max(abs(low.as_py()), abs(high.as_py())) * table.num_rows >= 2**63:
            table = table.set_column(table.schema.get_field_index(field), field, column.cast(pa.decimal128(38, 0)))
    return table


def _python_values(column: pa.ChunkedArray) -> list[Any]:
    """A result column as Python values; a decimal sum (of ints) as ints."""
    values = column.to_pylist()
    if pa.types.is_decimal(column.type):
        return [None if v is None else int(v) for v in values]
    return values


def columnar_window_aggregate(
    upstream: DataStream | None,
    node: Aggregate,
    key_of: Callable[[Any], Any],
    assigner: Any,
    fn: Any,
    next_uid: Callable[[str, str], str],
    detail: str,
) -> DataStream | None:
    """The statement's window aggregate: on batches (:class:`ColumnarWindowOperator`), or, when
    :func:`window_columnar` refuses it, the per-record window operator; either under the same uid,
    whose EXPLAIN detail says which and why."""
    fallback = window_columnar(node)
    if fallback is not None:
        uid = next_uid("window-aggregate", f"{detail} [per record; not columnar: {fallback.reason}]")
        if upstream is None:
            return None
        return upstream.key_by(key_of).window(assigner).aggregate(fn, uid=uid)
    where = "slice" if isinstance(assigner, SlidingEventTimeWindows) else "window"
    uid = next_uid("window-aggregate", f"{detail} [columnar: pre-aggregated per key and {where} on Arrow batches]")
    if upstream is None:
        return None
    keyed = upstream.key_by(key_of)
    schema = state_schema(uid, WINDOW_STATE, fn, None, None)
    calls = node.calls
    return keyed._add(  # noqa: SLF001  # the SQL layer's own operator, as the job API adds its own
        WithOnError(lambda on_error: ColumnarWindowOperator(fn, key_of, calls, assigner, 0, schema, on_error=on_error)),
        uid=uid,
        name="window-aggregate",
        parallelism=None,
        key_selector=keyed._key,  # noqa: SLF001
    )
