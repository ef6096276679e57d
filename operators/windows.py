"""Keyed windows with incremental aggregation and allowed lateness: event-time windows that fire by
the watermark (tumbling, sliding and merging session windows) and processing-time windows that fire
by the wall time.

Each (key, window) accumulator is one RocksDB entry. Event-time timers live in a heap rebuilt from
that state on restore: a window fires when the watermark reaches its last timestamp and its state is
dropped when the watermark passes the end plus the allowed lateness. A value for a window that has
fired but is not yet cleaned up updates it and fires it again (a late firing), as in Flink.

Session windows (``EventTimeSessionWindows``) merge: a value's window ``[ts, ts + gap)`` and every
session of its key it overlaps or touches become one window, whose accumulator is the ``merge`` of
theirs (in window order) plus the value; the absorbed windows' entries are deleted (their timers find
no state and do nothing). A merged window is only checked for lateness as a whole (a value whose own
window would be late still joins a session that is not), and one that has already fired fires again at
once. The sessions of each key are kept in memory beside the timers and, like them, rebuilt from the
state on restore, so the state layout is the same for every window kind.

What is kept per window and what a firing emits (:class:`ProcessResult`, :class:`ProcessElements`):
the accumulator of an AggregateFunction (``.aggregate``), the reduced value (:class:`ReduceAggregate`,
``.reduce``) or every element (:class:`ElementList`, ``.process``); emitted is the function's result,
or what a ProcessWindowFunction makes of it and the window's metadata.

The accumulators are the keyed state ``win``, each entry ``(key, accumulator)`` at the window's state
key (``weir.core.state_layout.window_key``: the key, then the window's bounds); its schema (version,
migration) is the job's (``state_schema``), and a migration rewrites the accumulator, never the key.

Sliding windows whose aggregate can merge (an AggregateFunction with ``merge``, not a reduce or the
element list) are sliced, as Flink SQL's window slicing: a value goes into one slice of width
``gcd(size, slide)`` (one state entry per key and slice, at the slice's bounds) instead of into each of
its ``size/slide`` windows; a window that fires merges its slices into a fresh accumulator
(``merge(create(), slice)`` in slice order). Each slice is dropped when the last window it belongs to is
cleaned up. A window's fire timer ``(last, FIRE, key group, window's state key)`` is pushed when a
slice opens in its earliest window not yet fired, and by the firing of the window before it when they
share a slice (the same timer pushed twice fires once). Results, timestamps, late firings, late
drops (counted per window) and the late-data side output are the per-window ones; ``merge`` must be
associative and indifferent to the order of values (count, sum, min, max). A per-window state of a
sliced operator (a savepoint of format 1) is read as it is: those windows keep their accumulators
until cleaned up and a firing merges them with the slices opened since.

The operator state is the watermark the subtask had reached: ``{"format": 1, "watermark": int}``,
or, when its sliding windows are sliced, ``{"format": 2, "watermark": int, "slice_ms": int}``.
Restored into a job at another parallelism, each key group's timers are rebuilt against the
watermark of the old subtask that owned it (what fired there stays fired), and the subtask goes on
from the lowest of them. Processing-time windows restored fire at the first wall time past their end.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any, ClassVar, Final, assert_never

from weir.core.columnar import decode_pending_windows
from weir.core.documents import load_versioned, typed
from weir.core.errors import JobDefinitionError, SerializationError, WeirError
from weir.core.keygroups import KeyGroupRange
from weir.core.process_functions import OutputTag
from weir.core.rejections import FAIL, OnRecordError, WindowFiring
from weir.core.state_layout import (
    WINDOW_STATE,
    WindowKeys,
    window_bounds,
    window_key_prefix,
    window_key_suffix,
)
from weir.core.state_schema import StateSchema
from weir.core.watermarks import MIN_WATERMARK
from weir.core.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingProcessingTimeWindows,
    WindowContext,
)
from weir.operators.base import InheritedState, check_output_tag
from weir.operators.basic import _TimestampedCollector
from weir.operators.keyed import KeyedOperator

FIRE_TIMER: Final = 0
CLEANUP_TIMER: Final = 1
"""The kinds of a window timer ``(time, kind, key group, state key)``: fire the window, or drop its state."""
_FIRE = FIRE_TIMER
_CLEANUP = CLEANUP_TIMER
_STATE = WINDOW_STATE
WINDOW_STATE_FORMAT: Final = 1
SLICED_WINDOW_STATE_FORMAT: Final = 2
"""The operator state of a window operator whose sliding windows are sliced (it names the slice width)."""
PENDING_WINDOWS_STATE_FORMAT: Final = 3
"""The operator state of a columnar window with pending windows: format 1's document on its own line,
then those windows' rows as an Arrow IPC stream (``weir.core.columnar.encode_pending_windows``)."""


def wall_clock_ms() -> int:
    """The wall time in epoch milliseconds: the default clock of processing-time windows."""
    return time.time_ns() // 1_000_000


# What a window keeps ------------------------------------------------------------------------------


class _Empty:
    """The accumulator of a reduce before its first value (never stored: a value follows at once)."""

    __slots__ = ()


_EMPTY: Final = _Empty()


class ReduceAggregate:
    """A reduce function as an aggregate: the accumulator is the reduced value itself, so two merge by
    reducing them too."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self._fn = fn

    def create(self) -> Any:
        return _EMPTY

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is _EMPTY else self._fn(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return self._fn(a, b)

    def result(self, key: Any, window_start: int, window_end: int, acc: Any) -> Any:
        return acc


class ElementList:
    """Every element of the window, in arrival order (a merged session's: its windows' in window
    order); the result is a tuple, so that a function may keep or sort it without touching state."""

    __slots__ = ()

    def create(self) -> list[Any]:
        return []

    def add(self, acc: list[Any], value: Any) -> list[Any]:
        acc.append(value)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b

    def result(self, key: Any, window_start: int, window_end: int, acc: list[Any]) -> tuple[Any, ...]:
        return tuple(acc)


# What a firing emits ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """A ProcessWindowFunction given the aggregate's one result (Flink's ``aggregate(agg, fn)``)."""

    function: Any


@dataclass(frozen=True, slots=True)
class ProcessElements:
    """A ProcessWindowFunction given the window's elements (the aggregate must be :class:`ElementList`)."""

    function: Any


WindowFunction = ProcessResult | ProcessElements
"""What turns a fired window into output; none: the aggregate's result is emitted as it is."""


class WindowAggregateOperator(KeyedOperator):
    """Windows of each key (``assigner``), each aggregated by ``fn`` (create, add, result; ``merge``
    too for session windows), fired as ``window_function`` says (none: ``fn.result`` is emitted).

    ``clock``: the wall time in epoch ms, by which processing-time windows assign values (default:
    :func:`wall_clock_ms`); the task fires them through :meth:`on_processing_time`.

    ``late_data`` (Flink's ``sideOutputLateData``): an element dropped as late (too late for every
    window it belongs to) goes to that side output, with its own timestamp; it is counted as dropped
    all the same."""

    SLICES: ClassVar[bool] = True
    """Whether sliding windows of a mergeable aggregate are sliced (see the module's docstring)."""

    def __init__(
        self,
        fn: Any,
        key_selector: Callable[[Any], Any],
        assigner: Any,
        allowed_lateness_ms: int,
        state_schema: StateSchema | None = None,
        *,
        window_function: WindowFunction | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        late_data: OutputTag | None = None,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(key_selector, [state_schema or StateSchema(_STATE)])
        self.on_error = on_error
        if self.state_schemas()[0].name != _STATE:
            raise ValueError(f"a window's state is named {_STATE!r}, not {self.state_schemas()[0].name!r}")
        self._merging = isinstance(assigner, EventTimeSessionWindows)
        self._gap_ms = assigner.gap_ms if isinstance(assigner, EventTimeSessionWindows) else 0
        if self._merging and not callable(getattr(fn, "merge", None)):
            raise JobDefinitionError(
                f"session windows ({assigner!r}) merge accumulators: {type(fn).__name__} needs a merge(a, b) method"
            )
        if isinstance(window_function, ProcessElements) and not isinstance(fn, ElementList):
            raise ValueError("a ProcessWindowFunction of the elements needs the ElementList aggregate")
        self._processing_time = isinstance(assigner, TumblingProcessingTimeWindows)
        self._fn = fn
        self._assigner = assigner
        self._lateness = 0 if self._processing_time else allowed_lateness_ms
        self._window_function = window_function
        self._clock = clock
        self._late_data = late_data
        self._watermark = MIN_WATERMARK
        self._inherited_watermarks: list[tuple[KeyGroupRange, int]] = []  # restored at another parallelism
        self._timers: list[tuple[int, int, int, bytes]] = []
        self._processing_timers: list[tuple[int, int, bytes]] = []  # (last timestamp, key group, state key)
        self._sessions: dict[bytes, list[TimeWindow]] = {}  # key prefix -> its session windows
        self.late_records_dropped = 0
        self._window_keys = WindowKeys()
        self._plan_of: tuple[TimeWindow, ...] = ()  # the assigner's last windows, and their plan
        self._plan: tuple[tuple[int, int, int, bytes], ...] = ()
        self._slice_ms = (
            slice_width(assigner, fn) if self.SLICES and not isinstance(window_function, ProcessElements) else 0
        )
        self._slice_plan: tuple[int | None, int, int, int, bytes] = (None, 0, 0, 0, b"")  # the last slice's
        self._slices_of: dict[int, tuple[bytes, tuple[tuple[bool, bytes], ...]]] = {}  # by window start
        self._restored_windows = False  # a format-1 state's per-window accumulators may be in the state
        self._restored_pending: list[bytes] = []  # a format-3 state's pending windows (Arrow IPC), until open

    @property
    def slice_ms(self) -> int:
        """The slice width of sliced sliding windows; 0: one accumulator per window."""
        return self._slice_ms

    def open(self) -> None:
        super().open()
        self._out = _TimestampedCollector(self.output.emit)
        self._rebuild_timers()

    def migrate_value(self, schema: StateSchema, stored_version: int, value: Any) -> Any:
        """An entry is ``(key, accumulator)``: the accumulator is the user's to migrate."""
        key, acc = value
        return key, super().migrate_value(schema, stored_version, acc)

    def _state_key(self, window: TimeWindow) -> bytes:
        """The state key of ``window`` of the current key."""
        return self._window_keys.key(self.current_key_prefix, window.start, window.end)

    # Values in -----------------------------------------------------------------------------------

    def process(self, value: Any, timestamp: int | None) -> None:
        if self._processing_time:
            self._process_in_processing_time(value, timestamp)
            return
        if timestamp is None:
            raise JobDefinitionError(
                f"window operator {self.ctx.uid!r} received a record without a timestamp: give the source "
                "a timestamp function"
            )
        try:  # set_current_key, inline: this runs once per record
            key = self._key_selector(value)
            kb, kg, prefix = self._keys.encode(key)
        except Exception as exc:
            self.reject(self._key_selector, exc, value, timestamp)
            return
        self.current_key, self.current_key_bytes, self.current_key_group, self.current_key_prefix = key, kb, kg, prefix
        if self.samples_left:
            self.sample_key(0, value)
        wm = self._watermark
        if self._inherited_watermarks:  # until the watermark passes every old subtask's
            wm = max(wm, self._fired_through(kg))
        if self._merging:
            self._add_to_session(value, timestamp, wm)
            return
        if self._slice_ms:
            self._add_to_slice(value, timestamp, wm)
            return
        windows = self._assigner.assign(timestamp)
        if windows is not self._plan_of:  # the assigner hands out the same tuple while it holds
            self._plan_of, self._plan = windows, _window_plan(windows)
        store, fn, lateness = self.store, self._fn, self._lateness
        late = 0
        for start, end, last, bounds in self._plan:
            if last + lateness <= wm:  # is_window_late
                late += 1
                self._drop_late(value, timestamp, TimeWindow(start, end))
                continue
            sk = prefix + bounds
            entry = store.get(_STATE, kg, sk)
            try:
                acc = fn.add(fn.create(), value) if entry is None else fn.add(entry[1], value)
            except Exception as exc:  # windows before this one (sliding) keep the record, as in Flink
                self.reject(fn.add, exc, value, timestamp, key)
                return
            fired = wm >= last  # window_fires
            if entry is None:
                heapq.heappush(self._timers, (last + lateness, _CLEANUP, kg, sk) if fired else (last, _FIRE, kg, sk))
            store.put(_STATE, kg, sk, (key, acc))
            if fired:
                self._emit(key, start, end, acc)
        if late and late == len(windows):
            self._late_element(value, timestamp)

    def _add_to_slice(self, value: Any, timestamp: int, wm: int) -> None:
        """Add ``value`` to its slice of the current key (the key group's watermark is ``wm``); a
        window it belongs to that has fired (within the allowed lateness) fires again at once, as a
        per-window late firing does."""
        g, lateness = self._slice_ms, self._lateness
        slice_start = timestamp - (timestamp - self._assigner.offset_ms) % g
        plan = self._slice_plan
        if plan[0] != slice_start:  # consecutive values mostly fall into the same slice
            plan = self._slice_plan = _slice_plan(self._assigner, slice_start, g)
        _, first_start, last_start, first_last, bounds = plan
        if first_last + lateness <= wm and self._late_for_some(value, timestamp, wm, first_start, last_start):
            return
        kg, prefix, key = self.current_key_group, self.current_key_prefix, self.current_key
        store, fn = self.store, self._fn
        sk = prefix + bounds
        entry = store.get(_STATE, kg, sk)
        try:
            acc = fn.add(fn.create(), value) if entry is None else fn.add(entry[1], value)
        except Exception as exc:
            self.reject(fn.add, exc, value, timestamp, key)
            return
        store.put(_STATE, kg, sk, (key, acc))
        size, slide = self._assigner.size_ms, self._assigner.slide_ms
        if entry is None:  # a new slice: dropped with the last window it is in; its first window's timer
            heapq.heappush(self._timers, (last_start + size - 1 + lateness, _CLEANUP, kg, sk))
            fire_start = first_start
            while fire_start + size - 1 <= wm:
                fire_start += slide
            if fire_start <= last_start:
                heapq.heappush(
                    self._timers,
                    (fire_start + size - 1, _FIRE, kg, prefix + window_key_suffix(fire_start, fire_start + size)),
                )
        if first_last <= wm:  # fired windows this value is in: late firings, latest first
            for start in range(last_start, first_start - 1, -slide):
                if start + size - 1 <= wm < start + size - 1 + lateness:
                    self._fire_sliced(kg, prefix, start)

    def _late_for_some(self, value: Any, timestamp: int, wm: int, first_start: int, last_start: int) -> bool:
        """``value`` is late for some of its windows (rare): each such window drops it (counted), as
        per window; answers whether it is late for all of them (then it is late data)."""
        size, slide, lateness = self._assigner.size_ms, self._assigner.slide_ms, self._lateness
        late = 0
        for start in range(last_start, first_start - 1, -slide):
            if start + size - 1 + lateness <= wm:
                late += 1
                self._drop_late(value, timestamp, TimeWindow(start, start + size))
        if late == (last_start - first_start) // slide + 1:
            self._late_element(value, timestamp)
            return True
        return False

    def _fire_sliced(self, key_group: int, prefix: bytes, start: int) -> bool:
        """Emit window ``[start, start + size)`` of the key with ``prefix``: its slices merged into a
        fresh accumulator (after the per-window accumulator a format-1 state left, if any). Returns
        whether a slice after the window's first slide is there (the next window shares it)."""
        window_bounds_, slices = self._slices_of.get(start) or self._window_slices(start)
        store, fn = self.store, self._fn
        parts = []
        if self._restored_windows:
            legacy = store.get(_STATE, key_group, prefix + window_bounds_)
            if legacy is not None:
                parts.append(legacy)
        shared = False
        for later, bounds in slices:
            entry = store.get(_STATE, key_group, prefix + bounds)
            if entry is not None:
                parts.append(entry)
                shared = shared or later
        if not parts:
            return shared
        end = start + self._assigner.size_ms
        try:
            acc = fn.create()
            for _key, part in parts:
                acc = fn.merge(acc, part)
        except Exception as exc:
            accumulators = [part for _key, part in parts]
            self.reject(fn.merge, exc, accumulators, None, parts[0][0], firing=WindowFiring(start, end))
            return shared
        self._emit(parts[0][0], start, end, acc)
        return shared

    def _window_slices(self, start: int) -> tuple[bytes, tuple[tuple[bool, bytes], ...]]:
        """The state-key bounds of window ``[start, start + size)`` and of each of its slices, each
        slice with whether it is after the window's first slide (remembered: windows fire in order)."""
        size, slide, g = self._assigner.size_ms, self._assigner.slide_ms, self._slice_ms
        if len(self._slices_of) >= 1024:
            self._slices_of.clear()
        slices = tuple((s >= start + slide, window_key_suffix(s, s + g)) for s in range(start, start + size, g))
        found = self._slices_of[start] = (window_key_suffix(start, start + size), slices)
        return found

    def _drop_late(self, value: Any, timestamp: int, window: TimeWindow) -> None:
        """``value`` (at ``timestamp``) came after the lateness allowance of ``window``: it is dropped
        from it and counted."""
        self.late_records_dropped += 1
        if self.ctx.metrics is not None:  # rare: counted per record
            self.ctx.metrics.late_dropped.inc()

    def _late_element(self, value: Any, timestamp: int) -> None:
        """``value`` was dropped from every window it belongs to: it goes to the late-data side
        output, if there is one (once, however many sliding windows dropped it, as in Flink)."""
        if self._late_data is not None:
            self.side_outputs.emit(self._late_data, value, timestamp)

    def _add_to_session(self, value: Any, timestamp: int, wm: int) -> None:
        """Add ``value`` to the session of the current key it opens, extends or bridges (the key's
        watermark is ``wm``): the absorbed windows' accumulators are merged into the new window's.

        ``merge_window`` on bounds as ints (this runs once per record): the element's own window is
        the assigner's ``[timestamp, timestamp + gap)``; a ``TimeWindow`` is built only for a session
        with new bounds (or a late drop)."""
        prefix, kg, key = self.current_key_prefix, self.current_key_group, self.current_key
        sessions = self._sessions.get(prefix, ())
        start = timestamp
        end = timestamp + self._gap_ms
        absorbed = [w for w in sessions if w.start <= end and start <= w.end]  # TimeWindow.intersects
        if len(absorbed) > 1:
            absorbed.sort()  # merged by start, as merge_window does
        kept = None  # the absorbed window the element falls inside: its bounds, state key and timer stay
        for w in absorbed:
            if w.start < start:
                start = w.start
            if w.end > end:
                end = w.end
        if end - 1 + self._lateness <= wm:  # is_window_late
            self._drop_late(value, timestamp, TimeWindow(start, end))
            self._late_element(value, timestamp)
            return
        store, fn = self.store, self._fn
        absorbed_keys = [prefix + window_key_suffix(w.start, w.end) for w in absorbed]
        accumulators = [self._session_entry(kg, sk)[1] for sk in absorbed_keys]
        function = fn.merge if accumulators else fn.create
        try:  # a record rejected here leaves the sessions as they were
            merged_acc = reduce(function, accumulators) if accumulators else fn.create()
            function = fn.add
            acc = function(merged_acc, value)
        except Exception as exc:
            self.reject(function, exc, value, timestamp, key)
            return
        sk = b""
        for merged, merged_key in zip(absorbed, absorbed_keys, strict=True):
            if merged.start == start and merged.end == end:
                kept, sk = merged, merged_key
            else:
                store.delete(_STATE, kg, merged_key)  # its timers find no state
        if kept is None:
            sk = prefix + window_key_suffix(start, end)
        store.put(_STATE, kg, sk, (key, acc))
        fired = wm >= end - 1  # window_fires
        if kept is None:  # new bounds: the timer of a window kept as it was stays valid
            window = TimeWindow(start, end)
            if len(absorbed) == len(sessions):
                self._sessions[prefix] = [window]
            else:
                self._sessions[prefix] = [w for w in sessions if w not in absorbed] + [window]
            heapq.heappush(
                self._timers,
                (end - 1 + self._lateness, _CLEANUP, kg, sk) if fired else (end - 1, _FIRE, kg, sk),
            )
        if fired:
            self._emit(key, start, end, acc)

    def _session_entry(self, key_group: int, state_key: bytes) -> tuple[Any, Any]:
        """The ``(key, accumulator)`` of a session of the current key: kept until its cleanup, which
        also forgets the session."""
        entry = self.store.get(_STATE, key_group, state_key)
        if entry is None:
            raise WeirError(
                f"window operator {self.ctx.uid!r}: a session window of key {self.current_key!r} lost its state"
            )
        return entry

    def _process_in_processing_time(self, value: Any, timestamp: int | None) -> None:
        """Add ``value`` to the window of the wall time now; a new window's timer is its last millisecond."""
        try:
            self.set_current_key(value)
        except Exception as exc:
            self.reject(self._key_selector, exc, value, timestamp)
            return
        kg, key, store, fn = self.current_key_group, self.current_key, self.store, self._fn
        for window in self._assigner.assign(self._clock()):
            sk = self._state_key(window)
            entry = store.get(_STATE, kg, sk)
            try:
                acc = fn.add(fn.create(), value) if entry is None else fn.add(entry[1], value)
            except Exception as exc:  # windows before this one (sliding) keep the record, as in Flink
                self.reject(fn.add, exc, value, timestamp, key)
                return
            if entry is None:
                heapq.heappush(self._processing_timers, (window.max_timestamp, kg, sk))
            store.put(_STATE, kg, sk, (key, acc))

    # Firing --------------------------------------------------------------------------------------

    def _emit(self, key: Any, start: int, end: int, acc: Any) -> None:
        """The window's result, stamped with the window's last timestamp. A result (or window)
        function that raises is handled by :attr:`on_error` as the window's firing (key, bounds, what
        the function was given; no source position): dead-lettered, the window emits nothing."""
        try:
            result = self._fn.result(key, start, end, acc)
        except Exception as exc:
            self.reject(self._fn.result, exc, acc, None, key, firing=WindowFiring(start, end))
            return
        match self._window_function:
            case None:
                self.output.emit(result, end - 1)
            case ProcessResult(function):
                self._process_window(function, key, start, end, (result,))
            case ProcessElements(function):
                self._process_window(function, key, start, end, result)
            case unreachable:
                assert_never(unreachable)

    def _process_window(self, function: Any, key: Any, start: int, end: int, elements: Sequence[Any]) -> None:
        context = WindowContext(TimeWindow(start, end), self._watermark, self._clock(), self._window_side_output)
        out = self._out
        out.timestamp = end - 1
        try:
            function.process(key, context, elements, out)
        except Exception as exc:  # what it emitted before raising stays emitted, as in Flink
            self.reject(function.process, exc, list(elements), None, key, firing=WindowFiring(start, end))

    def _window_side_output(self, tag: Any, value: Any) -> None:
        """A ProcessWindowFunction's ``context.output``: stamped as the window's results are."""
        self.side_outputs.emit(check_output_tag(self.ctx.uid, tag), value, self._out.timestamp)

    def process_watermark(self, watermark: int) -> None:
        if watermark <= self._watermark:
            return
        self._watermark = watermark
        if self._processing_time:  # these windows wait for the wall time
            self.output.emit_watermark(watermark)
            return
        if self._inherited_watermarks and watermark >= max(w for _r, w in self._inherited_watermarks):
            self._inherited_watermarks = []
        timers, store = self._timers, self.store
        if self._slice_ms:
            self._fire_slices(watermark)
            self.output.emit_watermark(watermark)
            return
        while timers and timers[0][0] <= watermark:
            _, kind, kg, sk = heapq.heappop(timers)
            entry = store.get(_STATE, kg, sk)
            if entry is None:
                continue
            start, end = window_bounds(sk)
            if kind == _FIRE:
                self._emit(entry[0], start, end, entry[1])
                if self._lateness > 0 and end - 1 + self._lateness > watermark:
                    heapq.heappush(timers, (end - 1 + self._lateness, _CLEANUP, kg, sk))
                    continue
            store.delete(_STATE, kg, sk)
            if self._merging:
                self._forget_session(sk, TimeWindow(start, end))
        self.output.emit_watermark(watermark)

    def _fire_slices(self, watermark: int) -> None:
        """The due timers of a sliced operator: fire windows (and push the next window's timer when
        it shares a slice), drop slices and per-window accumulators of a format-1 state."""
        timers, store, lateness = self._timers, self.store, self._lateness
        size, slide = self._assigner.size_ms, self._assigner.slide_ms
        previous = None
        while timers and timers[0][0] <= watermark:
            timer = heapq.heappop(timers)
            if timer == previous:  # pushed by a new slice and by the window before: fires once
                continue
            previous = timer
            _, kind, kg, sk = timer
            if kind == _CLEANUP:  # a slice the last window it is in is done with, or a format-1 window's
                store.delete(_STATE, kg, sk)
                continue
            start, end = window_bounds(sk)
            prefix = window_key_prefix(sk)
            if self._fire_sliced(kg, prefix, start):
                following = start + slide
                bounds = (self._slices_of.get(following) or self._window_slices(following))[0]
                heapq.heappush(timers, (following + size - 1, _FIRE, kg, prefix + bounds))
            if self._restored_windows and store.get(_STATE, kg, sk) is not None:  # a format-1 accumulator
                if lateness > 0 and end - 1 + lateness > watermark:  # kept while late values may come
                    heapq.heappush(timers, (end - 1 + lateness, _CLEANUP, kg, sk))
                else:
                    store.delete(_STATE, kg, sk)

    def _forget_session(self, sk: bytes, window: TimeWindow) -> None:
        """A session window's state was dropped: it is no longer one of its key's sessions."""
        prefix = window_key_prefix(sk)
        sessions = self._sessions.get(prefix)
        if sessions is None or window not in sessions:
            return
        sessions.remove(window)
        if not sessions:
            del self._sessions[prefix]

    def on_processing_time(self, now_ms: int) -> None:
        """The wall time is ``now_ms``: fire (and drop) every processing-time window that ended by then."""
        timers, store = self._processing_timers, self.store
        while timers and timers[0][0] <= now_ms:
            _, kg, sk = heapq.heappop(timers)
            entry = store.get(_STATE, kg, sk)
            if entry is None:
                continue
            start, end = window_bounds(sk)
            self._emit(entry[0], start, end, entry[1])
            store.delete(_STATE, kg, sk)

    def next_processing_time(self) -> int | None:
        """The wall time at which the next processing-time window fires (None: no window is open)."""
        timers = self._processing_timers
        return timers[0][0] if timers else None

    # Snapshots and restores -------------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        super().snapshot_state(checkpoint_id)
        if self._slice_ms:
            document = {"format": SLICED_WINDOW_STATE_FORMAT, "watermark": self._watermark, "slice_ms": self._slice_ms}
            return json.dumps(document).encode()
        return json.dumps({"format": WINDOW_STATE_FORMAT, "watermark": self._watermark}).encode()

    def restore_state(self, data: bytes) -> None:
        self._watermark = self._restored_watermark(data)
        rows = pending_windows_of(data)
        if rows is not None:
            self._restored_pending.append(rows)

    def _restored_watermark(self, data: bytes) -> int:
        """The watermark of a restored operator state, which must hold this operator's state layout:
        slices of its width, or windows (a format-1 state, which a sliced operator reads too)."""
        watermark, slice_ms = decode_window_document(data)
        if slice_ms is not None and slice_ms != self._slice_ms:
            now = f"slices of {self._slice_ms} ms" if self._slice_ms else "one accumulator per window"
            raise SerializationError(
                f"window operator {self.ctx.uid!r}: the restored state holds sliding-window slices of "
                f"{slice_ms} ms but this job's windows keep {now} (the window's size, slide or the "
                "aggregate's merge changed): restore it with the windows and aggregate that wrote it"
            )
        return watermark

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        mine = self.ctx.key_group_range
        for state in states:
            common = state.key_group_range.intersection(mine)
            if common is not None:
                self._inherited_watermarks.append((common, self._restored_watermark(state.data)))
                rows = pending_windows_of(state.data)
                if rows is not None:  # every row of another subtask's key groups is left out
                    self._restored_pending.append(rows)
        if self._inherited_watermarks:
            self._watermark = min(w for _r, w in self._inherited_watermarks)

    def _store_restored_state(self) -> None:
        """The pending windows of a restored format-3 state (a columnar window's), each of this
        subtask's key groups written as its ``win`` entry ``(key, accumulator)``, the accumulator the
        tuple of its partials (what the state holds for the columnar window, and for a per-record
        aggregate whose accumulator agrees): from here they are restored windows as any other."""
        if not self._restored_pending:
            return
        size = getattr(self._assigner, "size_ms", None)
        if self._processing_time or self._merging or not isinstance(size, int):
            raise SerializationError(
                f"window operator {self.ctx.uid!r}: the restored state holds pending event-time windows of "
                f"a columnar window, which {self._assigner!r} cannot hold: restore it with the windows that wrote it"
            )
        mine, store, encode = self.ctx.key_group_range, self.store, self._keys.encode
        for rows in self._restored_pending:
            for key, start, acc in decode_pending_windows(rows):
                _kb, kg, prefix = encode(key)
                if kg not in mine:
                    continue
                sk = prefix + window_key_suffix(start, start + size)
                if store.get(_STATE, kg, sk) is not None:
                    raise SerializationError(
                        f"window operator {self.ctx.uid!r}: window [{start}, {start + size}) of key {key!r} is "
                        "both pending and in the restored state: the snapshot is inconsistent; restore another"
                    )
                store.put(_STATE, kg, sk, (key, acc))
        store.flush()
        self._restored_pending = []

    def _fired_through(self, key_group: int) -> int:
        """The watermark key group ``key_group`` has reached: after a restore at another parallelism,
        that of its old subtask until the watermark passes it."""
        for key_groups, watermark in self._inherited_watermarks:
            if key_group in key_groups:
                return max(watermark, self._watermark)
        return self._watermark

    def _rebuild_timers(self) -> None:
        """The timers (and the sessions of each key) of the windows in the restored state."""
        self._timers, self._processing_timers, self._sessions = [], [], {}
        for kg in self.ctx.key_group_range:
            fired_through = self._fired_through(kg)
            for sk, _entry in self.store.items(_STATE, kg):
                start, end = window_bounds(sk)
                if self._processing_time:
                    self._processing_timers.append((end - 1, kg, sk))
                    continue
                if self._merging:
                    self._sessions.setdefault(window_key_prefix(sk), []).append(TimeWindow(start, end))
                if self._slice_ms and end - start == self._slice_ms:
                    self._slice_timers(kg, sk, start, fired_through)
                    continue
                if self._slice_ms:
                    self._restored_windows = True
                if end - 1 <= fired_through:
                    self._timers.append((end - 1 + self._lateness, _CLEANUP, kg, sk))
                else:
                    self._timers.append((end - 1, _FIRE, kg, sk))
        heapq.heapify(self._timers)
        heapq.heapify(self._processing_timers)

    def _slice_timers(self, key_group: int, sk: bytes, slice_start: int, fired_through: int) -> None:
        """A restored slice's timers (appended, heapified after): its cleanup, and the fire timer of its
        earliest window not yet fired (the windows after it are pushed as each fires)."""
        assigner = self._assigner
        size, slide = assigner.size_ms, assigner.slide_ms
        last_start = slice_start - (slice_start - assigner.offset_ms) % slide
        first_start = last_start - (last_start - slice_start + size - 1) // slide * slide
        self._timers.append((last_start + size - 1 + self._lateness, _CLEANUP, key_group, sk))
        fire_start = first_start
        while fire_start + size - 1 <= fired_through:
            fire_start += slide
        if fire_start <= last_start:
            prefix = window_key_prefix(sk)
            self._timers.append(
                (fire_start + size - 1, _FIRE, key_group, prefix + window_key_suffix(fire_start, fire_start + size))
            )


def _slice_plan(assigner: Any, slice_start: int, g: int) -> tuple[int | None, int, int, int, bytes]:
    """The slice starting at ``slice_start``: its start, the starts of the earliest and latest windows
    it is in, the earliest one's last timestamp, and the state key's bounds after the key prefix."""
    size, slide = assigner.size_ms, assigner.slide_ms
    last_start = slice_start - (slice_start - assigner.offset_ms) % slide
    first_start = last_start - (last_start - slice_start + size - 1) // slide * slide
    return slice_start, first_start, last_start, first_start + size - 1, window_key_suffix(slice_start, slice_start + g)


def _window_plan(windows: tuple[TimeWindow, ...]) -> tuple[tuple[int, int, int, bytes], ...]:
    """Per window: start, end, last timestamp and the state key's bounds after the key prefix."""
    return tuple((w.start, w.end, w.end - 1, window_key_suffix(w.start, w.end)) for w in windows)


def slice_width(assigner: Any, fn: Any) -> int:
    """The slice width of ``assigner``'s windows aggregated by ``fn``: ``gcd(size, slide)`` for
    overlapping sliding windows of an aggregate with ``merge`` (not a reduce or the element list,
    whose values are seen in arrival order); 0: one accumulator per window."""
    if not isinstance(assigner, SlidingEventTimeWindows) or assigner.size_ms <= assigner.slide_ms:
        return 0
    if isinstance(fn, ReduceAggregate | ElementList) or not callable(getattr(fn, "merge", None)):
        return 0
    return math.gcd(assigner.size_ms, assigner.slide_ms)


def decode_window_state(data: bytes) -> int:
    """The watermark in a window operator's state."""
    return decode_window_document(data)[0]


def pending_window_state(watermark: int, pending_windows: int, rows: bytes) -> bytes:
    """The state of a (columnar) window operator at ``watermark`` with ``pending_windows`` pending
    windows whose rows are the Arrow IPC stream ``rows``: format 3."""
    header = {"format": PENDING_WINDOWS_STATE_FORMAT, "watermark": watermark, "pending_windows": pending_windows}
    return json.dumps(header).encode() + b"\n" + rows


def _window_header(data: bytes) -> tuple[dict[str, Any], bytes | None]:
    """The JSON document of a window operator's state, and the rows after it (format 3's only)."""
    header, newline, rows = data.partition(b"\n")
    document = load_versioned(
        header,
        "window operator state",
        (WINDOW_STATE_FORMAT, SLICED_WINDOW_STATE_FORMAT, PENDING_WINDOWS_STATE_FORMAT),
        "restore it with the Weir version that wrote it",
    )
    pending = document["format"] == PENDING_WINDOWS_STATE_FORMAT
    if pending != bool(newline):
        what = "no rows after its document" if pending else "bytes after its document"
        raise SerializationError(f"window operator state of format {document['format']} is malformed: {what}")
    return document, rows if pending else None


def pending_windows_of(data: bytes) -> bytes | None:
    """The pending windows' rows (Arrow IPC) of a window operator's state; None: it has none."""
    return _window_header(data)[1]


def pending_window_count(data: bytes) -> int | None:
    """How many pending windows a window operator's state holds, by its document (None: format 1
    or 2, none)."""
    document, rows = _window_header(data)
    if rows is None:
        return None
    try:
        return typed(document["pending_windows"], int)
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"window operator state is malformed: {exc}") from exc


def decode_window_document(data: bytes) -> tuple[int, int | None]:
    """The watermark in a window operator's state and the width of its slices (None: format 1 or 3,
    an accumulator per window)."""
    document, _rows = _window_header(data)
    try:
        watermark = typed(document["watermark"], int)
        if document["format"] != SLICED_WINDOW_STATE_FORMAT:
            return watermark, None
        slice_ms = typed(document["slice_ms"], int)
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"window operator state is malformed: {exc}") from exc
    if slice_ms <= 0:
        raise SerializationError(f"window operator state is malformed: slice_ms {slice_ms} is not > 0")
    return watermark, slice_ms
