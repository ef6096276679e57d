"""Event-time windows: assigners, the window value, and when a window fires or is too late.

Timestamps are integer milliseconds. A window covers ``[start, end)``; its last timestamp is
``end - 1``. Window starts follow Flink's ``TimeWindow.getWindowStartWithOffset`` and are aligned to
the epoch plus ``offset_ms``, for negative timestamps too. Every duration (a size, slide, offset, gap
or allowed lateness) is an int of milliseconds or a :class:`datetime.timedelta` (:func:`to_millis`).

Session windows (:class:`EventTimeSessionWindows`) merge: each element opens ``[ts, ts + gap)`` and
the windows of a key that overlap or touch become one (:func:`merge_window`), as Flink's
``MergingWindowAssigner``. Processing-time windows (:class:`TumblingProcessingTimeWindows`) are
assigned by the wall time an element arrives at, not by its timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

_MILLISECOND = timedelta(milliseconds=1)


def to_millis(duration: int | timedelta, what: str) -> int:
    """``duration`` in whole milliseconds: an int as it is, a timedelta converted exactly.

    Raises TypeError for anything else (a bool or float too) and ValueError for a timedelta that is
    not a whole number of milliseconds."""
    if isinstance(duration, timedelta):
        millis, rest = divmod(duration, _MILLISECOND)
        if rest:
            raise ValueError(f"{what} must be a whole number of milliseconds, got {duration!r}")
        return int(millis)
    if type(duration) is not int:
        raise TypeError(f"{what} must be an int of milliseconds or a datetime.timedelta, got {duration!r}")
    return duration


@dataclass(frozen=True, slots=True, order=True)
class TimeWindow:
    """The event-time interval ``[start, end)`` in milliseconds."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last timestamp inside the window."""
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """Whether the two windows overlap or touch (Flink's ``TimeWindow.intersects``): such session
        windows merge."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


def merge_window(windows: Sequence[TimeWindow], new: TimeWindow) -> tuple[TimeWindow, tuple[TimeWindow, ...]]:
    """Add ``new`` to a key's session windows ``windows`` (disjoint and not touching): the window it
    becomes and the windows of ``windows`` it absorbs (by start; empty when it merges with none). The
    result equals one of the absorbed windows when ``new`` falls inside it."""
    merged = new
    absorbed = tuple(sorted(w for w in windows if w.intersects(new)))
    for window in absorbed:
        merged = merged.cover(window)
    return merged, absorbed


def window_start(timestamp_ms: int, offset_ms: int, size_ms: int) -> int:
    """Start of the window of length ``size_ms`` (aligned at ``offset_ms``) containing ``timestamp_ms``.

    Python's ``%`` is never negative for a positive divisor, so this also holds for negative timestamps.
    """
    return timestamp_ms - (timestamp_ms - offset_ms) % size_ms


def window_fires(window: TimeWindow, watermark: int) -> bool:
    """Whether the event-time trigger fires: the watermark has reached the window's last timestamp."""
    return watermark >= window.end - 1


def cleanup_time(window: TimeWindow, allowed_lateness_ms: int) -> int:
    """The watermark at which the window's state is dropped and its elements count as late."""
    return window.end - 1 + allowed_lateness_ms


def is_window_late(window: TimeWindow, watermark: int, allowed_lateness_ms: int) -> bool:
    """Whether an element assigned to ``window`` is dropped as late: the lateness allowance is over."""
    return window.end - 1 + allowed_lateness_ms <= watermark


class WindowAssigner(Protocol):
    """Maps an element's timestamp to the windows it belongs to."""

    def assign(self, timestamp_ms: int) -> tuple[TimeWindow, ...]: ...


class TumblingEventTimeWindows:
    """Fixed-size, non-overlapping windows: each timestamp belongs to exactly one window."""

    __slots__ = ("_last", "offset_ms", "size_ms")

    def __init__(self, size_ms: int | timedelta, offset_ms: int | timedelta = 0) -> None:
        size_ms = to_millis(size_ms, "tumbling window size")
        offset_ms = to_millis(offset_ms, "tumbling window offset")
        if size_ms <= 0:
            raise ValueError(f"tumbling window size must be > 0 ms, got {size_ms}")
        if abs(offset_ms) >= size_ms:
            raise ValueError(f"tumbling window offset must satisfy |offset| < size ({size_ms}), got {offset_ms}")
        self.size_ms = size_ms
        self.offset_ms = offset_ms
        # Consecutive records mostly fall into the same window: reuse its tuple.
        self._last: tuple[TimeWindow, ...] = (TimeWindow(offset_ms, offset_ms + size_ms),)

    def assign(self, timestamp_ms: int) -> tuple[TimeWindow, ...]:
        """The one window containing ``timestamp_ms``."""
        last = self._last
        window = last[0]
        if window.start <= timestamp_ms < window.end:
            return last
        start = timestamp_ms - (timestamp_ms - self.offset_ms) % self.size_ms
        last = self._last = (TimeWindow(start, start + self.size_ms),)
        return last

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TumblingEventTimeWindows):
            return NotImplemented
        return (self.size_ms, self.offset_ms) == (other.size_ms, other.offset_ms)

    def __hash__(self) -> int:
        return hash((TumblingEventTimeWindows, self.size_ms, self.offset_ms))

    def __repr__(self) -> str:
        return f"TumblingEventTimeWindows(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


class SlidingEventTimeWindows:
    """Windows of ``size_ms`` starting every ``slide_ms``: a timestamp belongs to ``ceil(size/slide)``."""

    __slots__ = ("_last", "_last_start", "_reusable", "offset_ms", "size_ms", "slide_ms")

    def __init__(self, size_ms: int | timedelta, slide_ms: int | timedelta, offset_ms: int | timedelta = 0) -> None:
        size_ms = to_millis(size_ms, "sliding window size")
        slide_ms = to_millis(slide_ms, "sliding window slide")
        offset_ms = to_millis(offset_ms, "sliding window offset")
        if size_ms <= 0 or slide_ms <= 0:
            raise ValueError(f"sliding window size and slide must be > 0 ms, got size {size_ms} and slide {slide_ms}")
        if abs(offset_ms) >= slide_ms:
            raise ValueError(f"sliding window offset must satisfy |offset| < slide ({slide_ms}), got {offset_ms}")
        self.size_ms = size_ms
        self.slide_ms = slide_ms
        self.offset_ms = offset_ms
        # With size a multiple of slide, the windows depend on the latest start only: reuse them.
        self._reusable = size_ms % slide_ms == 0
        self._last_start: int | None = None
        self._last: tuple[TimeWindow, ...] = ()

    def assign(self, timestamp_ms: int) -> tuple[TimeWindow, ...]:
        """The windows containing ``timestamp_ms``, latest start first."""
        slide = self.slide_ms
        last_start = timestamp_ms - (timestamp_ms - self.offset_ms) % slide
        if last_start == self._last_start and self._reusable:
            return self._last
        size = self.size_ms
        windows = tuple(TimeWindow(start, start + size) for start in range(last_start, timestamp_ms - size, -slide))
        self._last_start = last_start
        self._last = windows
        return windows

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SlidingEventTimeWindows):
            return NotImplemented
        return (self.size_ms, self.slide_ms, self.offset_ms) == (other.size_ms, other.slide_ms, other.offset_ms)

    def __hash__(self) -> int:
        return hash((SlidingEventTimeWindows, self.size_ms, self.slide_ms, self.offset_ms))

    def __repr__(self) -> str:
        return f"SlidingEventTimeWindows(size_ms={self.size_ms}, slide_ms={self.slide_ms}, offset_ms={self.offset_ms})"


class EventTimeSessionWindows:
    """Session windows: each element opens ``[ts, ts + gap)``; a key's windows that overlap or touch
    merge into one (:func:`merge_window`), so a session ends after ``gap_ms`` without elements."""

    __slots__ = ("gap_ms",)

    def __init__(self, gap_ms: int | timedelta) -> None:
        gap_ms = to_millis(gap_ms, "session gap")
        if gap_ms <= 0:
            raise ValueError(f"session gap must be > 0 ms, got {gap_ms}")
        self.gap_ms = gap_ms

    @classmethod
    def with_gap(cls, gap: int | timedelta) -> EventTimeSessionWindows:
        """Flink's ``EventTimeSessionWindows.withGap``."""
        return cls(gap)

    def assign(self, timestamp_ms: int) -> tuple[TimeWindow, ...]:
        """The element's own window, before any merge."""
        return (TimeWindow(timestamp_ms, timestamp_ms + self.gap_ms),)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventTimeSessionWindows):
            return NotImplemented
        return self.gap_ms == other.gap_ms

    def __hash__(self) -> int:
        return hash((EventTimeSessionWindows, self.gap_ms))

    def __repr__(self) -> str:
        return f"EventTimeSessionWindows(gap_ms={self.gap_ms})"


class CumulativeEventTimeWindows:
    """Flink's cumulating windows (SQL's ``CUMULATE`` TVF): windows of ``max_size_ms`` aligned to the
    epoch, each also as its growing prefixes ``[start, start + step)``, ``[start, start + 2 * step)``,
    ... ``[start, start + max_size)``: a timestamp belongs to every prefix that has reached it."""

    __slots__ = ("max_size_ms", "step_ms")

    def __init__(self, max_size_ms: int | timedelta, step_ms: int | timedelta) -> None:
        max_size_ms = to_millis(max_size_ms, "cumulative window size")
        step_ms = to_millis(step_ms, "cumulative window step")
        if step_ms <= 0 or max_size_ms <= 0 or max_size_ms % step_ms != 0:
            raise ValueError(
                f"cumulative windows need a positive step and a size that is a multiple of it, got step "
                f"{step_ms} ms and size {max_size_ms} ms"
            )
        self.max_size_ms, self.step_ms = max_size_ms, step_ms

    def assign(self, timestamp_ms: int) -> tuple[TimeWindow, ...]:
        """The windows containing ``timestamp_ms``: one start, each end from the first past it on."""
        start = timestamp_ms - timestamp_ms % self.max_size_ms
        first_end = timestamp_ms - (timestamp_ms - start) % self.step_ms + self.step_ms
        return tuple(TimeWindow(start, end) for end in range(first_end, start + self.max_size_ms + 1, self.step_ms))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CumulativeEventTimeWindows):
            return NotImplemented
        return (self.max_size_ms, self.step_ms) == (other.max_size_ms, other.step_ms)

    def __hash__(self) -> int:
        return hash((CumulativeEventTimeWindows, self.max_size_ms, self.step_ms))

    def __repr__(self) -> str:
        return f"CumulativeEventTimeWindows(max_size_ms={self.max_size_ms}, step_ms={self.step_ms})"


class TumblingProcessingTimeWindows:
    """Fixed-size, non-overlapping windows of wall time: an element belongs to the window containing
    the moment it arrives; the window fires when the wall time passes its last millisecond. There is
    no lateness: processing time never goes back."""

    __slots__ = ("_event_time", "offset_ms", "size_ms")

    def __init__(self, size_ms: int | timedelta, offset_ms: int | timedelta = 0) -> None:
        self._event_time = TumblingEventTimeWindows(size_ms, offset_ms)  # the same arithmetic, checks too
        self.size_ms = self._event_time.size_ms
        self.offset_ms = self._event_time.offset_ms

    def assign(self, now_ms: int) -> tuple[TimeWindow, ...]:
        """The one window containing wall time ``now_ms``."""
        return self._event_time.assign(now_ms)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TumblingProcessingTimeWindows):
            return NotImplemented
        return (self.size_ms, self.offset_ms) == (other.size_ms, other.offset_ms)

    def __hash__(self) -> int:
        return hash((TumblingProcessingTimeWindows, self.size_ms, self.offset_ms))

    def __repr__(self) -> str:
        return f"TumblingProcessingTimeWindows(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


def _no_side_outputs(tag: Any, value: Any) -> None:
    """Where a WindowContext made outside an operator sends side outputs: nowhere."""


@dataclass(frozen=True, slots=True)
class WindowContext:
    """What a ProcessWindowFunction is told about the window it processes, and where its side
    outputs go (:meth:`output`)."""

    window: TimeWindow
    current_watermark: int
    current_processing_time: int
    side_output: Callable[[Any, Any], None] = field(default=_no_side_outputs, repr=False, compare=False)

    def output(self, tag: Any, value: Any) -> None:
        """Emit ``value`` to side output ``tag`` (an ``OutputTag``), stamped with the window's last
        timestamp as its results are; dropped when nothing takes that side output."""
        self.side_output(tag, value)
