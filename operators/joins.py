"""Joins of two keyed streams (Flink's window join and interval join), each a keyed two-input
function run by :class:`~weir.operators.keyed.KeyedCoProcessOperator`: its keyed state kinds hold the
buffered records, its event-time timers fire windows and drop what can no longer match, so both are
checkpointed, restored and rescaled by key group like any keyed process function.

Event time throughout: a record without a timestamp fails the job; a record at or behind the
watermark (``timestamp <= watermark``: the watermark promises no more such records) is dropped as
late and counted (``late_records_dropped``). The watermark is not part of a snapshot (as in Flink):
after a restore, records count as late again only from the first watermark on.

- **Window join** (:class:`WindowJoinOperator`): each record is buffered per key and window of a
  non-merging event-time assigner, in the MapState ``join.left`` or ``join.right`` (window end ->
  the window's records of that side, in arrival order). When the watermark reaches the window's last
  timestamp, every pair ``(x, y)`` of its two lists (first side outer, in arrival order) gives
  ``join(x, y)``, stamped with the window's last timestamp; both lists are dropped.
- **Interval join** (:class:`IntervalJoinOperator`): a first-side record at ``t`` pairs with every
  second-side record at a time in ``[t + lower, t + upper]`` (bounds inclusive; exclusive ones are
  given as moved by 1 ms), emitted as soon as the later of the two arrives, stamped with the later
  timestamp. Each side's records are buffered per key and timestamp (MapState ``join.left`` /
  ``join.right``: timestamp -> records) with the sorted timestamps of the key (ValueState
  ``join.left-times`` / ``join.right-times``), so a record reads only the buckets it matches. A
  record's bucket is dropped by an event-time timer once the watermark passes the last time an
  arriving record of the other side could match it: ``t + max(upper, 0)`` for the first side,
  ``t + max(-lower, 0)`` for the second.

A raising join function is handled by the operator's ``on_error`` (``StreamOperator.reject``), as
are the key selectors and the process functions of the other operators. In a window join the pair
``[x, y]`` it raised on is rejected as part of the window's firing (the key and the window; no
source position): dead-lettered, the window's other pairs are still joined. In an interval join the
arriving record is rejected (the pairs emitted before stay emitted) and is not buffered, so it pairs
with nothing later.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from weir.core.errors import JobDefinitionError
from weir.core.process_functions import Clock, wall_clock_ms
from weir.core.rejections import FAIL, Firing, OnRecordError, WindowFiring
from weir.core.windows import TimeWindow, is_window_late
from weir.operators.keyed import KeyedCoProcessOperator, KeyedProcessContext, OnTimerContext
from weir.operators.process_state import MapState, ValueState

LEFT_BUFFER: Final = "join.left"
RIGHT_BUFFER: Final = "join.right"
LEFT_TIMES: Final = "join.left-times"
RIGHT_TIMES: Final = "join.right-times"
"""The keyed state names of the joins' buffers (and of the interval join's timestamp indexes)."""

KeySelectors = tuple[Callable[[Any], Any], Callable[[Any], Any]]


class Collector(Protocol):
    timestamp: int | None

    def collect(self, value: Any, timestamp: int | None = None) -> None: ...


class NonMergingAssigner(Protocol):
    """A window assigner whose windows never merge (tumbling, sliding event-time windows)."""

    size_ms: int

    def assign(self, timestamp_ms: int) -> tuple[TimeWindow, ...]: ...


class Reject(Protocol):
    """The operator's ``reject`` (``StreamOperator.reject``): the join function raised."""

    def __call__(
        self, function: Any, exc: Exception, value: Any, timestamp: int | None, key: Any, *, firing: Firing | None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class JoinContext:
    """What an interval join's function sees of one pair: both records' timestamps; ``timestamp``
    (the later one) is the pair's output timestamp."""

    left_timestamp: int
    right_timestamp: int

    @property
    def timestamp(self) -> int:
        return max(self.left_timestamp, self.right_timestamp)


ProcessJoin = Callable[[Any, Any, JoinContext, Collector], None]
"""An interval join's ``process_element(left, right, ctx, out)``: what one pair emits."""


class EmitJoined:
    """An interval join's ``fn(left, right) -> value`` as a :data:`ProcessJoin`: the value is emitted."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def __call__(self, left: Any, right: Any, ctx: JoinContext, out: Collector) -> None:
        out.collect(self.fn(left, right))


def _user_function(process: ProcessJoin) -> Any:
    """The function a rejection names: the user's, not the wrapper that emits its value."""
    return process.fn if isinstance(process, EmitJoined) else process


def _event_time(op_kind: str, uid: str, timestamp: int | None) -> int:
    if timestamp is None:
        raise JobDefinitionError(
            f"{op_kind} {uid!r} received a record without a timestamp: give the source a timestamp function"
        )
    return timestamp


class _WindowJoin:
    """The keyed two-input function of a window join (see the module docstring)."""

    def __init__(
        self, uid: Callable[[], str], reject: Reject, join: Callable[[Any, Any], Any], assigner: NonMergingAssigner
    ) -> None:
        self._uid = uid
        self._reject = reject
        self._join = join
        self._assigner = assigner
        self.late_records_dropped = 0

    def open(self, ctx: KeyedProcessContext) -> None:
        self._buffers: tuple[MapState, MapState] = (ctx.map_state(LEFT_BUFFER), ctx.map_state(RIGHT_BUFFER))

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._add(0, value, ctx)

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._add(1, value, ctx)

    def _add(self, side: int, value: Any, ctx: KeyedProcessContext) -> None:
        timestamp = _event_time("window join", self._uid(), ctx.timestamp)
        timers = ctx.timer_service()
        watermark = timers.current_watermark()
        buffer = self._buffers[side]
        assigned = False
        for window in self._assigner.assign(timestamp):
            if is_window_late(window, watermark, 0):
                continue
            assigned = True
            values = buffer.get(window.end)
            buffer.put(window.end, [value] if values is None else [*values, value])
            timers.register_event_time_timer(window.max_timestamp)
        if not assigned:
            self.late_records_dropped += 1

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        end = timestamp + 1
        left, right = self._buffers
        lefts, rights = left.get(end), right.get(end)
        left.remove(end)
        right.remove(end)
        if lefts and rights:
            join = self._join
            for x in lefts:
                for y in rights:
                    try:
                        joined = join(x, y)
                    except Exception as exc:
                        firing = WindowFiring(end - self._assigner.size_ms, end)
                        self._reject(join, exc, [x, y], None, ctx.key, firing=firing)
                        continue
                    out.collect(joined)


class _IntervalJoin:
    """The keyed two-input function of an interval join (see the module docstring)."""

    def __init__(
        self, uid: Callable[[], str], reject: Reject, process: ProcessJoin, lower_ms: int, upper_ms: int
    ) -> None:
        if lower_ms > upper_ms:
            raise JobDefinitionError(f"an interval join's lower bound {lower_ms} is above its upper bound {upper_ms}")
        self._uid = uid
        self._reject = reject
        self._process = process
        self._named = _user_function(process)
        self._lower = lower_ms
        self._upper = upper_ms
        self._keep = (max(upper_ms, 0), max(-lower_ms, 0))  # how long past its time each side's record may match
        self.late_records_dropped = 0

    def open(self, ctx: KeyedProcessContext) -> None:
        self._buffers: tuple[MapState, MapState] = (ctx.map_state(LEFT_BUFFER), ctx.map_state(RIGHT_BUFFER))
        self._times: tuple[ValueState, ValueState] = (ctx.value_state(LEFT_TIMES), ctx.value_state(RIGHT_TIMES))

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._element(0, value, ctx, out)

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._element(1, value, ctx, out)

    def _element(self, side: int, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        timestamp = _event_time("interval join", self._uid(), ctx.timestamp)
        timers = ctx.timer_service()
        if timestamp <= timers.current_watermark():
            self.late_records_dropped += 1
            return
        if side == 0:
            first, last = timestamp + self._lower, timestamp + self._upper
        else:
            first, last = timestamp - self._upper, timestamp - self._lower
        other = 1 - side
        times: list[int] = self._times[other].value() or []
        matching = times[bisect.bisect_left(times, first) : bisect.bisect_right(times, last)]
        process, buffer = self._process, self._buffers[other]
        for other_time in matching:
            for other_value in buffer.get(other_time) or ():
                if side == 0:
                    pair = JoinContext(timestamp, other_time)
                    left, right = value, other_value
                else:
                    pair = JoinContext(other_time, timestamp)
                    left, right = other_value, value
                out.timestamp = pair.timestamp
                try:
                    process(left, right, pair, out)
                except Exception as exc:  # the record is not buffered: it pairs with nothing later
                    self._reject(self._named, exc, value, timestamp, ctx.key, firing=None)
                    return
        out.timestamp = timestamp
        self._buffer(side, timestamp, value)
        timers.register_event_time_timer(timestamp + self._keep[side])

    def _buffer(self, side: int, timestamp: int, value: Any) -> None:
        buffer = self._buffers[side]
        bucket = buffer.get(timestamp)
        if bucket is None:
            index = self._times[side]
            times: list[int] = index.value() or []
            bisect.insort(times, timestamp)
            index.update(times)
            buffer.put(timestamp, [value])
        else:
            buffer.put(timestamp, [*bucket, value])

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        for side in (0, 1):
            self._drop(side, timestamp - self._keep[side])

    def _drop(self, side: int, timestamp: int) -> None:
        buffer = self._buffers[side]
        if not buffer.contains(timestamp):
            return
        buffer.remove(timestamp)
        index = self._times[side]
        times: list[int] = index.value() or []
        position = bisect.bisect_left(times, timestamp)
        if position < len(times) and times[position] == timestamp:
            del times[position]
        if times:
            index.update(times)
        else:
            index.clear()


class WindowJoinOperator(KeyedCoProcessOperator):
    """A window join of two keyed inputs (Flink's ``a.join(b).where(...).equalTo(...).window(...)``):
    ``join(x, y)`` for every pair of a key's window, emitted when the window fires."""

    def __init__(
        self,
        join: Callable[[Any, Any], Any],
        assigner: NonMergingAssigner,
        key_selectors: KeySelectors,
        clock: Clock = wall_clock_ms,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        self._join = _WindowJoin(self._uid, self.reject, join, assigner)
        super().__init__(self._join, key_selectors, clock=clock, on_error=on_error)

    def _uid(self) -> str:
        return self.ctx.uid

    @property
    def late_records_dropped(self) -> int:
        """Records dropped because every window they belong to had fired."""
        return self._join.late_records_dropped


class IntervalJoinOperator(KeyedCoProcessOperator):
    """An interval join of two keyed inputs (Flink's ``a.intervalJoin(b).between(lower, upper)``):
    ``process(left, right, ctx, out)`` for every pair whose second timestamp is within
    ``[first + lower_ms, first + upper_ms]`` (both inclusive), as soon as both are there."""

    def __init__(
        self,
        process: ProcessJoin,
        lower_ms: int,
        upper_ms: int,
        key_selectors: KeySelectors,
        clock: Clock = wall_clock_ms,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        self._join = _IntervalJoin(self._uid, self.reject, process, lower_ms, upper_ms)
        super().__init__(self._join, key_selectors, clock=clock, on_error=on_error)

    def _uid(self) -> str:
        return self.ctx.uid

    @property
    def late_records_dropped(self) -> int:
        """Records dropped because they were at or behind the watermark."""
        return self._join.late_records_dropped
