"""Operators of the columnar path (``weir.core.columnar``): record batches in, vectorized work.

- :class:`ToRecordsOperator` turns each batch into its records (dicts, stamped with the batch's
  event-time column), where a columnar stream meets a per-record operator.
- :class:`ColumnarWindowAggregateOperator` is the window operator of ``weir.operators.windows`` with
  built-in aggregates (:class:`~weir.core.columnar.BuiltinAggregates`), fed batches: each batch's
  rows are assigned to windows and checked for lateness on arrays, and the on-time rows wait, as
  they came, until a watermark fires a window they belong to, a checkpoint, the end of input or
  ``COMPACT_ROWS`` rows. A watermark groups the rows of the windows it fires by (key, window) in one
  Arrow group-by and emits each group's aggregate as its window's result without a state entry,
  where the window has none and no allowed lateness must keep one (the rows of later windows wait
  on). A checkpoint groups the pending rows by (key, window) and keeps them so, one row of partials
  per window, and writes them into the operator state as one Arrow IPC stream (format 3,
  ``docs/formats.md``; Flink keeps its heap timers as raw keyed state the same way), not as state
  entries: no entry per window to write at the checkpoint and delete at the firing. At the row
  limit the pending rows are grouped by (key, window) in Arrow and stay pending, one row of partial
  aggregates per window (a pending row is partials: one record's, or a group's). With allowed
  lateness, at the end of input, or at the row limit when that grouping frees too little or a sum
  leaves int64, every pending row is grouped into its window's accumulator in the state, whence
  those windows fire as the per-record operator's do. State, timers, firing, lateness, snapshots
  and restores (also at another parallelism) are the per-record operator's own, so the two share
  one state layout: a per-record job and its columnar version restore each other's savepoints when
  their accumulators agree (a restore writes the pending windows of a format-3 state as the state
  entries ``(key, partials)`` of its own key groups). A row for a window that already fired but is
  within the allowed lateness takes the per-record path at once (a late firing per row, as there).
"""

from __future__ import annotations

import heapq
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.core.columnar import (
    PENDING_KEY,
    PENDING_START,
    BatchKeys,
    BuiltinAggregates,
    FieldKey,
    batch_timestamps,
    encode_pending_windows,
    is_batch,
    records_of,
)
from weir.core.process_functions import OutputTag
from weir.core.state_layout import WINDOW_STATE, window_bounds, window_key
from weir.core.state_schema import StateSchema
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.base import StreamOperator
from weir.operators.windows import CLEANUP_TIMER, WindowAggregateOperator, pending_window_state

COMPACT_ROWS: Final = 65_536
"""On-time rows a columnar window keeps before grouping them (bounds its memory between firings):
in Arrow while that leaves at most half as many, else into the state."""

_KEY, _START = PENDING_KEY, PENDING_START


class ToRecordsOperator(StreamOperator):
    """Each batch as its records (dicts), each stamped with the batch's event-time column."""

    def process(self, value: Any, timestamp: int | None) -> None:
        emit = self.output.emit
        if not is_batch(value):
            emit(value, timestamp)
            return
        rows, timestamps = records_of(value)
        for row, ts in zip(rows, timestamps, strict=True):
            emit(row, ts)


class ColumnarWindowAggregateOperator(WindowAggregateOperator):
    SLICES = False  # its batches are grouped per window (sliding windows are not sliced here yet)

    def __init__(
        self,
        aggregates: BuiltinAggregates,
        key_field: str,
        assigner: TumblingEventTimeWindows | SlidingEventTimeWindows,
        allowed_lateness_ms: int,
        state_schema: StateSchema | None = None,
        late_data: OutputTag | None = None,
    ) -> None:
        super().__init__(
            aggregates, FieldKey(key_field), assigner, allowed_lateness_ms, state_schema, late_data=late_data
        )
        self._aggregates = aggregates
        self._key_field = key_field
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_first_fire: int | None = None  # the lowest last timestamp of a pending window
        # The windows the grouping created, by the watermark that fires them: one timer per window and
        # time instead of one heap entry per key (restored windows are on the per-key heap, as ever).
        self._fire_groups: dict[int, list[tuple[int, bytes]]] = {}
        # Pending rows are partial aggregates, one column per partial (``__p0``, ...): a row as it came
        # is the partials of one record (count 1, the field's value for a sum, min or max), a
        # compacted row those of a (key, window) group. Grouping merges them either way.
        partials = aggregates.partials
        self._partial_names = [f"__p{i}" for i in range(len(partials))]
        self._row_partials = [(name, field) for name, (field, _op) in zip(self._partial_names, partials, strict=True)]
        self._group_aggregations = [
            (name, "sum" if op == "count" else op)
            for name, (_field, op) in zip(self._partial_names, partials, strict=True)
        ]
        self._sum_columns = [
            name for name, (field, op) in zip(self._partial_names, partials, strict=True) if op == "sum"
        ]
        self._partial_columns = [f"{name}_{op}" for name, op in self._group_aggregations]

    # Batches in ----------------------------------------------------------------------------------

    def process(self, value: Any, timestamp: int | None) -> None:
        if not is_batch(value):
            super().process(value, timestamp)  # a record (a columnar window also takes those)
            return
        if value.num_rows == 0:
            return
        timestamps = batch_timestamps(value)
        late_firings: list[tuple[int, int, int]] = []  # (row, window index, window start)
        late_rows: np.ndarray | None = None  # rows late for every window they belong to
        for k, (starts, rows) in enumerate(self._windows_of(timestamps)):
            part = value if rows is None else value.take(pa.array(rows))
            firings, late = self._take(part, starts)
            for position, start in firings:
                late_firings.append((position if rows is None else int(rows[position]), k, start))
            if k == 0 and self._late_data is not None and late.any():  # a row's latest window comes first
                late_rows = np.flatnonzero(late) if rows is None else rows[late]
        if late_firings:  # the rare late firing, per record in row order, then window order (as assign)
            late_firings.sort()
            rows_late = sorted({row for row, _k, _s in late_firings})
            records, _stamps = records_of(value.take(pa.array(rows_late)))
            record_of = dict(zip(rows_late, records, strict=True))
            for row, _k, start in late_firings:
                self._fire_late(record_of[row], start)
        if late_rows is not None:
            self._late_rows(value, late_rows)

    def _late_rows(self, batch: pa.RecordBatch, rows: np.ndarray) -> None:
        """Rows of ``batch`` dropped from every window they belong to, as records to the late-data
        side output (each with its own timestamp)."""
        assert self._late_data is not None
        records, stamps = records_of(batch.take(pa.array(rows)))
        emit, tag = self.side_outputs.emit, self._late_data
        for record, ts in zip(records, stamps, strict=True):
            emit(tag, record, ts)

    def _windows_of(self, timestamps: np.ndarray) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """For each window a row belongs to (one for tumbling windows, up to size/slide for sliding
        ones): the window starts and the rows (None: all of them, in order). The first entry is every
        row's latest window, so a row late for it is late for all of its windows."""
        assigner = self._assigner
        if isinstance(assigner, TumblingEventTimeWindows):
            return [(timestamps - (timestamps - assigner.offset_ms) % assigner.size_ms, None)]
        slide, size = assigner.slide_ms, assigner.size_ms
        last_start = timestamps - (timestamps - assigner.offset_ms) % slide
        out: list[tuple[np.ndarray, np.ndarray | None]] = []
        for k in range(-(-size // slide)):
            starts = last_start - k * slide
            rows = np.flatnonzero(starts > timestamps - size)
            if rows.size:
                out.append((starts[rows], rows))
        return out

    def _window_size(self) -> int:
        return self._assigner.size_ms

    def _take(self, batch: pa.RecordBatch, starts: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
        """Rows of ``batch`` for the windows starting at ``starts``: late ones dropped (answered as a
        mask over the rows), the rest pending, except those whose window already fired (within the
        allowed lateness), answered as (row, window start) for a late firing each."""
        last = starts + (self._window_size() - 1)
        watermark: Any = self._watermark
        if self._inherited_watermarks:
            fired_through = np.array(
                [self._fired_through(kg) for kg in range(self.ctx.max_parallelism)], dtype=np.int64
            )
            watermark = fired_through[self._batch_keys.key_groups(batch)]
        late = last + self._lateness <= watermark
        fired = last <= watermark
        dropped = int(np.count_nonzero(late))
        if dropped:
            self.late_records_dropped += dropped
            if self.ctx.metrics is not None:
                self.ctx.metrics.late_dropped.inc(dropped)
        refire = fired & ~late
        late_firings: list[tuple[int, int]] = []
        if refire.any():
            rows = np.flatnonzero(refire)
            late_firings = list(zip(rows.tolist(), starts[rows].tolist(), strict=True))
        keep = ~fired
        if not keep.any():
            return late_firings, late
        if not keep.all():
            rows_kept = np.flatnonzero(keep)
            batch, starts, last = batch.take(pa.array(rows_kept)), starts[rows_kept], last[rows_kept]
        columns = {_KEY: batch.column(self._key_field), _START: pa.array(starts, type=pa.int64())}
        ones = None
        for name, field in self._row_partials:
            if field is None:
                ones = pa.array(np.ones(batch.num_rows, dtype=np.int64)) if ones is None else ones
                columns[name] = ones
            else:
                columns[name] = batch.column(field)
        self._pending.append(pa.table(columns))
        self._pending_rows += batch.num_rows
        first = int(last.min())
        if self._pending_first_fire is None or first < self._pending_first_fire:
            self._pending_first_fire = first
        if self._pending_rows >= COMPACT_ROWS and not self._group_pending():
            self._compact()
        return late_firings, late

    def _fire_late(self, record: Any, start: int) -> None:
        """One row for window ``[start, start + size)``, which already fired: added and fired again."""
        self.set_current_key(record)
        kg, key, fn, size = self.current_key_group, self.current_key, self._aggregates, self._window_size()
        sk = window_key(self.current_key_prefix, start, start + size)
        entry = self.store.get(WINDOW_STATE, kg, sk)
        if entry is None:
            acc = fn.add(fn.create(), record)
            heapq.heappush(self._timers, (start + size - 1 + self._lateness, CLEANUP_TIMER, kg, sk))
        else:
            acc = fn.add(entry[1], record)
        self.store.put(WINDOW_STATE, kg, sk, (key, acc))
        self._emit(key, start, start + size, acc)

    # Grouping --------------------------------------------------------------------------------------

    def _group_pending(self) -> bool:
        """The pending rows grouped by (key, window) in Arrow, one row of partials per group, still
        pending: what bounds a window's memory between firings where the state is not needed (as
        :meth:`_fire_pending`: no allowed lateness, no per-key timers, no inherited watermarks), so
        that no window goes to the state before a checkpoint. False: not done (state needed, a sum
        that left int64, or too many groups for grouping to free room)."""
        if self._lateness or self._timers or self._inherited_watermarks or not self._pending:
            return False
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        grouped = self._grouped_partials(table)
        if grouped is None or grouped.num_rows > COMPACT_ROWS // 2:
            return False
        self._pending, self._pending_rows = [grouped], grouped.num_rows
        return True

    def _grouped_partials(self, table: pa.Table) -> pa.Table | None:
        """The rows of ``table`` grouped by (key, window) as pending rows (one per group, its partials
        merged); None when a merged column no longer fits its pending column's type (a sum beyond
        int64: such a window goes to the state, whose accumulators hold Python ints)."""
        grouped = (
            self._widen_sums(table).group_by([_KEY, _START], use_threads=False).aggregate(self._group_aggregations)
        )
        columns = {_KEY: grouped.column(_KEY), _START: grouped.column(_START)}
        for name, grouped_name in zip(self._partial_names, self._partial_columns, strict=True):
            column, kind = grouped.column(grouped_name), table.schema.field(name).type
            if column.type != kind:  # a widened sum (decimal) back to int64, where every one fits
                try:
                    column = column.cast(kind)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return None
            columns[name] = column
        return pa.table(columns).combine_chunks()

    def _compact(self) -> None:
        """The pending rows grouped by (key, window), each group merged into its accumulator."""
        if not self._pending:
            return
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_rows, self._pending_first_fire = [], 0, None
        self._merge_into_state(table)

    def _snapshot_pending(self) -> pa.Table | None:
        """The pending windows for a snapshot, one row of partials each: the rows of windows with
        state (``_fire_groups``) merged into it, the others grouped by (key, window) and kept pending
        so; None: none pending (or a sum left int64: then every row went into the state)."""
        if not self._pending:
            return None
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        size = self._window_size()
        last = table.column(_START).to_numpy() + (size - 1)
        if self._fire_groups:
            into_state = np.isin(last, list(self._fire_groups))
            if into_state.any():
                self._merge_into_state(table.filter(pa.array(into_state)))
                stay = ~into_state
                table, last = table.filter(pa.array(stay)), last[stay]
                self._pending, self._pending_rows = ([table] if table.num_rows else []), table.num_rows
                self._pending_first_fire = int(last.min()) if table.num_rows else None
        if not table.num_rows:
            return None
        grouped = self._grouped_partials(table)
        if grouped is None:
            self._compact()
            return None
        self._pending, self._pending_rows = [grouped], grouped.num_rows  # the same windows: the first to fire stays
        return grouped

    def _merge_into_state(self, table: pa.Table) -> None:
        """The rows of ``table`` grouped by (key, window), each group merged into its window's
        accumulator in the state; a window new there joins the timer of its time (``_fire_groups``)."""
        keys, starts, columns = self._grouped(table, ordered=False)
        size, store, merge, encode = self._window_size(), self.store, self._aggregates.merge, self._batch_keys.encode
        groups = self._fire_groups
        for key, start, partial in zip(keys, starts, zip(*columns, strict=True), strict=True):
            _kb, kg, prefix = encode(key)
            sk = window_key(prefix, start, start + size)
            entry = store.get(WINDOW_STATE, kg, sk)
            if entry is None:
                acc = partial  # a new window's accumulator is its first partial aggregate
                fires = start + size - 1  # pending windows have not fired
                group = groups.get(fires)
                if group is None:
                    group = groups[fires] = []
                group.append((kg, sk))
            else:
                acc = merge(entry[1], partial)
            store.put(WINDOW_STATE, kg, sk, (key, acc))

    def _grouped(self, table: pa.Table, *, ordered: bool) -> tuple[list[Any], list[int], list[list[Any]]]:
        """The rows of ``table`` grouped by (key, window): each group's key, window start and partial
        aggregate, as columns (the keys, the starts, a list per partial); ``ordered``: in window order
        (as their timers would fire them) when the rows are of several windows."""
        table = self._widen_sums(table)
        grouped = table.group_by([_KEY, _START], use_threads=False).aggregate(self._group_aggregations)
        if ordered and grouped.num_rows > 1:
            low, high = pc.min_max(grouped.column(_START)).values()
            if low.as_py() != high.as_py():
                grouped = grouped.sort_by(_START)
        keys = grouped.column(_KEY).to_pylist()
        starts = grouped.column(_START).to_pylist()
        return keys, starts, [_python_values(grouped.column(c)) for c in self._partial_columns]

    def _fire_pending(self, watermark: int) -> bool:
        """Fire the windows ``watermark`` closes from the pending rows: grouped by (key, window), each
        group's partial aggregate is its window's whole accumulator, emitted without a state entry (no
        put, get and delete per window). The rows of a closing window that has state (grouped into it
        by a snapshot or at ``COMPACT_ROWS``) are merged into it and fire from there; the rows of later
        windows stay pending. Results go out in the order of the windows' timers. Only where no window
        can have state but those: without allowed lateness (a fired window keeps its state for late
        rows), per-key timers (restored windows, records taken one by one) and key groups behind an
        old subtask's watermark. False: nothing done (the caller groups every row into the state)."""
        if self._lateness or self._timers or self._inherited_watermarks or not self._pending:
            return False
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        size = self._window_size()
        last = table.column(_START).to_numpy() + (size - 1)
        due = last <= watermark
        if due.all():
            self._pending, self._pending_rows, self._pending_first_fire = [], 0, None
        else:
            later = ~due
            rest = table.filter(pa.array(later))
            self._pending, self._pending_rows = [rest], rest.num_rows
            self._pending_first_fire = int(last[later].min())
            table, last = table.filter(pa.array(due)), last[due]
        in_state = sorted(fires for fires in self._fire_groups if fires <= watermark)
        if in_state:
            into_state = np.isin(last, in_state)
            if into_state.any():
                self._merge_into_state(table.filter(pa.array(into_state)))
                table = table.filter(pa.array(~into_state))
        starts: list[int] = []
        results: list[dict[str, Any]] = []
        if table.num_rows:
            keys, starts, columns = self._grouped(table, ordered=True)
            results = self._aggregates.results(keys, starts, size, columns)
        emit, i = self.output.emit, 0
        for fires in in_state:  # the windows with state fire in turn, as their timers would
            while i < len(starts) and starts[i] + size - 1 < fires:
                emit(results[i], starts[i] + size - 1)
                i += 1
            self._fire_group(self._fire_groups.pop(fires), watermark)
        for j in range(i, len(starts)):
            emit(results[j], starts[j] + size - 1)  # stamped with the window's last timestamp, as _emit does
        return True

    def _widen_sums(self, table: pa.Table) -> pa.Table:
        """An int64 column summed where a group's sum could leave int64 (largest |value| times the
        rows) is summed as decimal128 instead: a sum is exact, as the per-record Python int sum is."""
        for field in self._sum_columns:
            column = table.column(field)
            if not pa.types.is_integer(column.type) or not table.num_rows:
                continue
            low, high = pc.min_max(column).values()
            largest = max(abs(low.as_py() or 0), abs(high.as_py() or 0))
            if largest * table.num_rows >= 2**63:
                table = table.set_column(table.schema.get_field_index(field), field, column.cast(pa.decimal128(38, 0)))
        return table

    def process_watermark(self, watermark: int) -> None:
        if (
            self._pending_first_fire is not None
            and watermark >= self._pending_first_fire
            and not self._fire_pending(watermark)
        ):
            self._compact()
        if watermark > self._watermark and self._fire_groups:
            for fires in sorted(t for t in self._fire_groups if t <= watermark):
                self._fire_group(self._fire_groups.pop(fires), watermark)
        super().process_watermark(watermark)  # per-key timers (restored, late firings, cleanups)

    def _fire_group(self, windows: list[tuple[int, bytes]], watermark: int) -> None:
        """Fire the windows of one timer: emit each result, then drop its state, or keep it for late
        rows until the allowed lateness passes."""
        store, emit, lateness = self.store, self._emit, self._lateness
        for kg, sk in windows:
            entry = store.get(WINDOW_STATE, kg, sk)
            if entry is None:
                continue
            start, end = window_bounds(sk)
            emit(entry[0], start, end, entry[1])
            if lateness > 0 and end - 1 + lateness > watermark:
                heapq.heappush(self._timers, (end - 1 + lateness, CLEANUP_TIMER, kg, sk))
            else:
                store.delete(WINDOW_STATE, kg, sk)

    def open(self) -> None:
        super().open()
        self._batch_keys = BatchKeys(self._key_field, self.ctx.max_parallelism)
        self._fire_groups = {}

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        if self._lateness or self._timers or self._inherited_watermarks:
            self._compact()  # where a watermark would group every pending row into the state anyway
            return super().snapshot_state(checkpoint_id)
        pending = self._snapshot_pending()
        document = super().snapshot_state(checkpoint_id)
        if pending is None:
            return document
        return pending_window_state(self._watermark, pending.num_rows, encode_pending_windows(pending))

    def end_input(self) -> None:
        self._compact()
        super().end_input()


def _python_values(column: pa.ChunkedArray) -> list[Any]:
    """A result column as Python values; a decimal sum (of ints) as ints."""
    values = column.to_pylist()
    if pa.types.is_decimal(column.type):
        return [None if v is None else int(v) for v in values]
    return values
