"""Operators of the columnar path (``weir.core.columnar``): record batches in, vectorized work.

- :class:`ToRecordsOperator` turns each batch into its records (dicts, stamped with the batch's
  event-time column), where a columnar stream meets a per-record operator.
- :class:`ColumnarWindowAggregateOperator` is the window operator of ``operators.windows`` with
  built-in aggregates (:class:`~weir.core.columnar.BuiltinAggregates`), fed batches: each batch's
  rows are assigned to windows and checked for lateness on arrays, and the on-time rows wait, as
  they came, until a watermark is about to fire a window they belong to, a checkpoint, the end of
  input or ``COMPACT_ROWS`` rows; then they are grouped by (key, window) in one Arrow group-by and
  each group's partial aggregate is merged into the window's accumulator. State, timers, firing,
  lateness, snapshots and restores (also at another parallelism) are the per-record operator's
  own, so the two share one state layout: a per-record job and its columnar version restore each
  other's savepoints when their accumulators agree. A row for a window that already fired but is
  within the allowed lateness takes the per-record path at once (a late firing per row, as there).
"""

from __future__ import annotations

import heapq
import struct
from typing import Any, Final

import numpy as np
import pyarrow as pa

from operators.base import StreamOperator
from operators.windows import CLEANUP_TIMER, FIRE_TIMER, WINDOW_STATE, WindowAggregateOperator
from weir.core.columnar import (
    BatchKeys,
    BuiltinAggregates,
    FieldKey,
    batch_timestamps,
    is_batch,
    records_of,
)
from weir.core.state_schema import StateSchema
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows

COMPACT_ROWS: Final = 65_536
"""On-time rows a columnar window keeps before grouping them (bounds its memory between firings)."""

_BOUNDS = struct.Struct(">qq")
_KEY, _START = "__key", "__window_start"


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
    def __init__(
        self,
        aggregates: BuiltinAggregates,
        key_field: str,
        assigner: TumblingEventTimeWindows | SlidingEventTimeWindows,
        allowed_lateness_ms: int,
        state_schema: StateSchema | None = None,
    ) -> None:
        super().__init__(aggregates, FieldKey(key_field), assigner, allowed_lateness_ms, state_schema)
        self._aggregates = aggregates
        self._key_field = key_field
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_first_fire: int | None = None  # the lowest last timestamp of a pending window
        self._group_aggregations = [
            ([], "count_all") if field is None else (field, op) for field, op in aggregates.partials
        ]
        self._partial_columns = ["count_all" if field is None else f"{field}_{op}" for field, op in aggregates.partials]

    def open(self) -> None:
        super().open()
        self._batch_keys = BatchKeys(self._key_field, self.ctx.max_parallelism)

    # Batches in ----------------------------------------------------------------------------------

    def process(self, value: Any, timestamp: int | None) -> None:
        if not is_batch(value):
            super().process(value, timestamp)  # a record (a columnar window also takes those)
            return
        if value.num_rows == 0:
            return
        timestamps = batch_timestamps(value)
        for starts, rows in self._windows_of(timestamps):
            self._take(value if rows is None else value.take(pa.array(rows)), starts)

    def _windows_of(self, timestamps: np.ndarray) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """For each window a row belongs to (one for tumbling windows, up to size/slide for sliding
        ones): the window starts and the rows (None: all of them, in order)."""
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
        return self._assigner.size_ms  # type: ignore[no-any-return]

    def _take(self, batch: pa.RecordBatch, starts: np.ndarray) -> None:
        """Rows of ``batch`` for the windows starting at ``starts``: late ones dropped, ones whose
        window already fired (within the allowed lateness) at once per record, the rest pending."""
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
        if refire.any():  # the rare late firing: each such row as a record, into this one window
            rows = np.flatnonzero(refire)
            records, _stamps = records_of(batch.take(pa.array(rows)))
            for record, start in zip(records, starts[rows].tolist(), strict=True):
                self._fire_late(record, start)
        keep = ~fired
        if not keep.any():
            return
        if not keep.all():
            rows_kept = np.flatnonzero(keep)
            batch, starts, last = batch.take(pa.array(rows_kept)), starts[rows_kept], last[rows_kept]
        columns = {_KEY: batch.column(self._key_field), _START: pa.array(starts, type=pa.int64())}
        for field in self._aggregates.fields():
            columns[field] = batch.column(field)
        self._pending.append(pa.table(columns))
        self._pending_rows += batch.num_rows
        first = int(last.min())
        if self._pending_first_fire is None or first < self._pending_first_fire:
            self._pending_first_fire = first
        if self._pending_rows >= COMPACT_ROWS:
            self._compact()

    def _fire_late(self, record: Any, start: int) -> None:
        """One row for window ``[start, start + size)``, which already fired: added and fired again."""
        self.set_current_key(record)
        kg, key, fn, size = self.current_key_group, self.current_key, self._aggregates, self._window_size()
        sk = self.current_key_prefix + _BOUNDS.pack(start, start + size)
        entry = self.store.get(WINDOW_STATE, kg, sk)
        if entry is None:
            acc = fn.add(fn.create(), record)
            heapq.heappush(self._timers, (start + size - 1 + self._lateness, CLEANUP_TIMER, kg, sk))
        else:
            acc = fn.add(entry[1], record)
        self.store.put(WINDOW_STATE, kg, sk, (key, acc))
        self._emit(key, start, start + size, acc)

    # Grouping --------------------------------------------------------------------------------------

    def _compact(self) -> None:
        """The pending rows grouped by (key, window), each group merged into its accumulator."""
        if not self._pending:
            return
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_rows, self._pending_first_fire = [], 0, None
        grouped = table.group_by([_KEY, _START], use_threads=False).aggregate(self._group_aggregations)
        keys = grouped.column(_KEY).to_pylist()
        starts = grouped.column(_START).to_pylist()
        partials = list(zip(*(grouped.column(c).to_pylist() for c in self._partial_columns), strict=True))
        size, store, merge, encode = self._window_size(), self.store, self._aggregates.merge, self._batch_keys.encode
        timers, push, create = self._timers, heapq.heappush, self._aggregates.create
        for key, start, partial in zip(keys, starts, partials, strict=True):
            _kb, kg, prefix = encode(key)
            sk = prefix + _BOUNDS.pack(start, start + size)
            entry = store.get(WINDOW_STATE, kg, sk)
            if entry is None:
                acc = merge(create(), partial)
                push(timers, (start + size - 1, FIRE_TIMER, kg, sk))  # pending windows have not fired
            else:
                acc = merge(entry[1], partial)
            store.put(WINDOW_STATE, kg, sk, (key, acc))

    def process_watermark(self, watermark: int) -> None:
        if self._pending_first_fire is not None and watermark >= self._pending_first_fire:
            self._compact()
        super().process_watermark(watermark)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._compact()
        return super().snapshot_state(checkpoint_id)

    def end_input(self) -> None:
        self._compact()
        super().end_input()
