"""Event-time windows: assigners, the window value, and when a window fires or is too late.

Timestamps are integer milliseconds. A window covers ``[start, end)``; its last timestamp is
``end - 1``. Window starts follow Flink's ``TimeWindow.getWindowStartWithOffset`` and are aligned to
the epoch plus ``offset_ms``, for negative timestamps too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, order=True)
class TimeWindow:
    """The event-time interval ``[start, end)`` in milliseconds."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last timestamp inside the window."""
        return self.end - 1

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


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

    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
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

    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
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
