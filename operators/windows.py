"""Keyed event-time windows with incremental aggregation and allowed lateness.

Each (key, window) accumulator is one RocksDB entry. Event-time timers live in a heap rebuilt from
that state on restore: a window fires when the watermark reaches its last timestamp and its state is
dropped when the watermark passes the end plus the allowed lateness. A value for a window that has
fired but is not yet cleaned up updates it and fires it again (a late firing), as in Flink.
"""

from __future__ import annotations

import heapq
import pickle
import struct
from collections.abc import Callable
from typing import Any

from operators.keyed import KeyedOperator
from weir.core.errors import JobDefinitionError
from weir.core.watermarks import MIN_WATERMARK
from weir.core.windows import TimeWindow, cleanup_time, is_window_late, window_fires

_BOUNDS = struct.Struct(">qq")
_FIRE = 0
_CLEANUP = 1
_STATE = "win"


class WindowAggregateOperator(KeyedOperator):
    def __init__(
        self,
        fn: Any,
        key_selector: Callable[[Any], Any],
        assigner: Any,
        allowed_lateness_ms: int,
    ) -> None:
        super().__init__(key_selector)
        self._fn = fn
        self._assigner = assigner
        self._lateness = allowed_lateness_ms
        self._watermark = MIN_WATERMARK
        self._timers: list[tuple[int, int, int, bytes]] = []
        self.late_records_dropped = 0
        self._bounds_of: TimeWindow | None = None
        self._bounds = b""

    def open(self) -> None:
        super().open()
        self._rebuild_timers()

    def _state_key(self, window: TimeWindow) -> bytes:
        """The current key (length-prefixed) and the window's bounds; the bounds of the last window
        are kept, as consecutive records mostly fall into the same one."""
        if window is not self._bounds_of:
            self._bounds_of, self._bounds = window, _BOUNDS.pack(window.start, window.end)
        return self.current_key_prefix + self._bounds

    def process(self, value: Any, timestamp: int | None) -> None:
        if timestamp is None:
            raise JobDefinitionError(
                f"window operator {self.ctx.uid!r} received a record without a timestamp: give the source "
                "a timestamp function"
            )
        self.set_current_key(value)
        kg, key = self.current_key_group, self.current_key
        store, fn, wm, lateness = self.store, self._fn, self._watermark, self._lateness
        for window in self._assigner.assign(timestamp):
            if is_window_late(window, wm, lateness):
                self.late_records_dropped += 1
                if self.ctx.metrics is not None:  # rare: counted per record
                    self.ctx.metrics.late_dropped.inc()
                continue
            sk = self._state_key(window)
            entry = store.get(_STATE, kg, sk)
            fired = window_fires(window, wm)
            if entry is None:
                acc = fn.add(fn.create(), value)
                heapq.heappush(
                    self._timers,
                    (cleanup_time(window, lateness), _CLEANUP, kg, sk)
                    if fired
                    else (window.max_timestamp, _FIRE, kg, sk),
                )
            else:
                acc = fn.add(entry[1], value)
            store.put(_STATE, kg, sk, (key, acc))
            if fired:
                self._emit(key, window.start, window.end, acc)

    def _emit(self, key: Any, start: int, end: int, acc: Any) -> None:
        """The window's result, stamped with the window's last timestamp."""
        self.output.emit(self._fn.result(key, start, end, acc), end - 1)

    def process_watermark(self, watermark: int) -> None:
        if watermark <= self._watermark:
            return
        self._watermark = watermark
        timers, store = self._timers, self.store
        while timers and timers[0][0] <= watermark:
            _, kind, kg, sk = heapq.heappop(timers)
            entry = store.get(_STATE, kg, sk)
            if entry is None:
                continue
            start, end = _BOUNDS.unpack_from(sk, len(sk) - _BOUNDS.size)
            if kind == _FIRE:
                self._emit(entry[0], start, end, entry[1])
                if self._lateness > 0 and end - 1 + self._lateness > watermark:
                    heapq.heappush(timers, (end - 1 + self._lateness, _CLEANUP, kg, sk))
                    continue
            store.delete(_STATE, kg, sk)
        self.output.emit_watermark(watermark)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self.store.flush()
        return pickle.dumps({"watermark": self._watermark})

    def restore_state(self, data: bytes) -> None:
        self._watermark = pickle.loads(data)["watermark"]

    def _rebuild_timers(self) -> None:
        self._timers = []
        for kg in self.ctx.key_group_range:
            for sk, _entry in self.store.items(_STATE, kg):
                _start, end = _BOUNDS.unpack_from(sk, len(sk) - _BOUNDS.size)
                if end - 1 <= self._watermark:
                    self._timers.append((end - 1 + self._lateness, _CLEANUP, kg, sk))
                else:
                    self._timers.append((end - 1, _FIRE, kg, sk))
        heapq.heapify(self._timers)
