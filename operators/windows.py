"""Keyed event-time windows with incremental aggregation and allowed lateness.

Each (key, window) accumulator is one RocksDB entry. Event-time timers live in a heap rebuilt from
that state on restore: a window fires when the watermark reaches its last timestamp and its state is
dropped when the watermark passes the end plus the allowed lateness. A value for a window that has
fired but is not yet cleaned up updates it and fires it again (a late firing), as in Flink.

The accumulators are the keyed state ``win``, each entry ``(key, accumulator)``; its schema (version,
migration) is the job's (``state_schema``), and a migration rewrites the accumulator, never the key.

The operator state is the watermark the subtask had reached: ``{"format": 1, "watermark": int}``.
Restored into a job at another parallelism, each key group's timers are rebuilt against the
watermark of the old subtask that owned it (what fired there stays fired), and the subtask goes on
from the lowest of them.
"""

from __future__ import annotations

import heapq
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from operators.base import InheritedState
from operators.keyed import KeyedOperator
from weir.core.documents import load_versioned, typed
from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.keygroups import KeyGroupRange
from weir.core.state_schema import StateSchema
from weir.core.watermarks import MIN_WATERMARK
from weir.core.windows import TimeWindow, cleanup_time, is_window_late, window_fires

_BOUNDS = struct.Struct(">qq")
FIRE_TIMER: Final = 0
CLEANUP_TIMER: Final = 1
"""The kinds of a window timer ``(time, kind, key group, state key)``: fire the window, or drop its state."""
_FIRE = FIRE_TIMER
_CLEANUP = CLEANUP_TIMER
WINDOW_STATE: Final = "win"
"""The name of the keyed state holding the accumulators (what a job's ``state_version`` versions)."""
_STATE = WINDOW_STATE
WINDOW_STATE_FORMAT: Final = 1


class WindowAggregateOperator(KeyedOperator):
    def __init__(
        self,
        fn: Any,
        key_selector: Callable[[Any], Any],
        assigner: Any,
        allowed_lateness_ms: int,
        state_schema: StateSchema | None = None,
    ) -> None:
        super().__init__(key_selector, [state_schema or StateSchema(_STATE)])
        if self.state_schemas()[0].name != _STATE:
            raise ValueError(f"a window's state is named {_STATE!r}, not {self.state_schemas()[0].name!r}")
        self._fn = fn
        self._assigner = assigner
        self._lateness = allowed_lateness_ms
        self._watermark = MIN_WATERMARK
        self._inherited_watermarks: list[tuple[KeyGroupRange, int]] = []  # restored at another parallelism
        self._timers: list[tuple[int, int, int, bytes]] = []
        self.late_records_dropped = 0
        self._bounds_of: TimeWindow | None = None
        self._bounds = b""

    def open(self) -> None:
        super().open()
        self._rebuild_timers()

    def migrate_value(self, schema: StateSchema, stored_version: int, value: Any) -> Any:
        """An entry is ``(key, accumulator)``: the accumulator is the user's to migrate."""
        key, acc = value
        return key, super().migrate_value(schema, stored_version, acc)

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
        if self._inherited_watermarks:  # until the watermark passes every old subtask's
            wm = max(wm, self._fired_through(kg))
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
        if self._inherited_watermarks and watermark >= max(w for _r, w in self._inherited_watermarks):
            self._inherited_watermarks = []
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
        return json.dumps({"format": WINDOW_STATE_FORMAT, "watermark": self._watermark}).encode()

    def restore_state(self, data: bytes) -> None:
        self._watermark = decode_window_state(data)

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        mine = self.ctx.key_group_range
        for state in states:
            common = state.key_group_range.intersection(mine)
            if common is not None:
                self._inherited_watermarks.append((common, decode_window_state(state.data)))
        if self._inherited_watermarks:
            self._watermark = min(w for _r, w in self._inherited_watermarks)

    def _fired_through(self, key_group: int) -> int:
        """The watermark key group ``key_group`` has reached: after a restore at another parallelism,
        that of its old subtask until the watermark passes it."""
        for key_groups, watermark in self._inherited_watermarks:
            if key_group in key_groups:
                return max(watermark, self._watermark)
        return self._watermark

    def _rebuild_timers(self) -> None:
        self._timers = []
        for kg in self.ctx.key_group_range:
            fired_through = self._fired_through(kg)
            for sk, _entry in self.store.items(_STATE, kg):
                _start, end = _BOUNDS.unpack_from(sk, len(sk) - _BOUNDS.size)
                if end - 1 <= fired_through:
                    self._timers.append((end - 1 + self._lateness, _CLEANUP, kg, sk))
                else:
                    self._timers.append((end - 1, _FIRE, kg, sk))
        heapq.heapify(self._timers)


def decode_window_state(data: bytes) -> int:
    """The watermark in a window operator's state."""
    document = load_versioned(
        data, "window operator state", WINDOW_STATE_FORMAT, "restore it with the Weir version that wrote it"
    )
    try:
        return typed(document["watermark"], int)
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"window operator state is malformed: {exc}") from exc
