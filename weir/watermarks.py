"""Watermarks: how far event time has progressed, at a source and at an operator with many inputs.

A watermark ``w`` promises that no more elements with timestamp ``<= w`` will arrive (late ones
excepted). Watermarks are integer milliseconds between :data:`MIN_WATERMARK` (nothing known yet) and
:data:`MAX_WATERMARK` (the input has ended: every window may fire).
"""

from __future__ import annotations

from enum import Enum

from weir.errors import ProtocolError
from weir.ids import ChannelIndex

MIN_WATERMARK = -(1 << 63)
"""The watermark before any element was seen (Flink's Long.MIN_VALUE)."""

MAX_WATERMARK = (1 << 63) - 1
"""The watermark of an ended input: event time is complete (Flink's Long.MAX_VALUE)."""


class BoundedOutOfOrdernessWatermarks:
    """Source-side generator: elements may arrive up to ``max_out_of_orderness_ms`` out of order.

    The watermark is ``max timestamp seen - bound - 1``: an element exactly ``bound`` ms older than the
    newest one is still on time.
    """

    __slots__ = ("_last_polled", "_max_timestamp", "max_out_of_orderness_ms")

    def __init__(self, max_out_of_orderness_ms: int) -> None:
        if max_out_of_orderness_ms < 0:
            raise ValueError(f"max out-of-orderness must be >= 0 ms, got {max_out_of_orderness_ms}")
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        # Chosen so that current_watermark() is exactly MIN_WATERMARK until the first element.
        self._max_timestamp = MIN_WATERMARK + max_out_of_orderness_ms + 1
        self._last_polled = MIN_WATERMARK

    def on_event(self, timestamp_ms: int) -> None:
        """Account for one element's timestamp."""
        if timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms

    def current_watermark(self) -> int:
        return self._max_timestamp - self.max_out_of_orderness_ms - 1

    def poll(self) -> int | None:
        """The current watermark if it advanced since the previous poll, else None (nothing to emit)."""
        watermark = self._max_timestamp - self.max_out_of_orderness_ms - 1
        if watermark > self._last_polled:
            self._last_polled = watermark
            return watermark
        return None


class ChannelStatus(Enum):
    ACTIVE = "active"
    IDLE = "idle"
    ENDED = "ended"


_ACTIVE = ChannelStatus.ACTIVE
_IDLE = ChannelStatus.IDLE
_ENDED = ChannelStatus.ENDED


class WatermarkTracker:
    """Combines the watermarks of an operator's input channels into the operator's watermark.

    The combined watermark is the minimum over active channels; an ended channel counts as
    :data:`MAX_WATERMARK`; an idle channel is left out, so it does not hold the others back. When every
    channel that has not ended is idle, the combined watermark moves to the highest of theirs (as in
    Flink's ``StatusWatermarkValve``). A channel that resumes behind the combined watermark is left out
    until it catches up. Each method returns the new combined watermark when it advances, else None:
    the combined watermark never goes back.
    """

    __slots__ = ("_combined", "_status", "_watermarks")

    def __init__(self, num_channels: int) -> None:
        if num_channels < 1:
            raise ValueError(f"a watermark tracker needs at least one input channel, got {num_channels}")
        self._watermarks = [MIN_WATERMARK] * num_channels
        self._status = [_ACTIVE] * num_channels
        self._combined = MIN_WATERMARK

    @property
    def current(self) -> int:
        """The combined watermark emitted so far (MIN_WATERMARK before the first)."""
        return self._combined

    @property
    def num_channels(self) -> int:
        return len(self._status)

    @property
    def is_idle(self) -> bool:
        """No channel is active and at least one is idle: the operator's output is idle too."""
        status = self._status
        return _ACTIVE not in status and _IDLE in status

    @property
    def all_ended(self) -> bool:
        return all(status is _ENDED for status in self._status)

    def channel_status(self, channel: ChannelIndex) -> ChannelStatus:
        self._check(channel)
        return self._status[channel]

    def channel_watermark(self, channel: ChannelIndex) -> int:
        self._check(channel)
        return self._watermarks[channel]

    def on_watermark(self, channel: ChannelIndex, watermark: int) -> int | None:
        """A watermark arrived on ``channel``; it also makes an idle channel active again."""
        self._check(channel)
        status = self._status[channel]
        if status is _ENDED:
            raise ProtocolError(f"watermark {watermark} on input channel {channel} after its end of stream")
        if watermark <= self._watermarks[channel]:
            if status is _ACTIVE:
                return None
        else:
            self._watermarks[channel] = watermark
        self._status[channel] = _ACTIVE
        return self._advance()

    def mark_idle(self, channel: ChannelIndex) -> int | None:
        """``channel`` has no data for now; the others may advance without it."""
        self._check(channel)
        status = self._status[channel]
        if status is _ENDED:
            raise ProtocolError(f"input channel {channel} marked idle after its end of stream")
        if status is _IDLE:
            return None
        self._status[channel] = _IDLE
        return self._advance()

    def mark_active(self, channel: ChannelIndex) -> None:
        """``channel`` has data again. Adding a channel to the minimum can never advance it."""
        self._check(channel)
        if self._status[channel] is _ENDED:
            raise ProtocolError(f"input channel {channel} marked active after its end of stream")
        self._status[channel] = _ACTIVE

    def on_end_of_stream(self, channel: ChannelIndex) -> int | None:
        """``channel`` will send nothing more; it counts as MAX_WATERMARK from now on."""
        self._check(channel)
        if self._status[channel] is _ENDED:
            raise ProtocolError(f"second end of stream on input channel {channel}")
        self._status[channel] = _ENDED
        self._watermarks[channel] = MAX_WATERMARK
        return self._advance()

    def _check(self, channel: ChannelIndex) -> None:
        if not 0 <= channel < len(self._status):
            raise ValueError(f"input channel must be in 0..{len(self._status) - 1}, got {channel}")

    def _advance(self) -> int | None:
        combined = self._combined
        lowest_active: int | None = None
        has_active = False
        highest_idle: int | None = None
        for watermark, status in zip(self._watermarks, self._status, strict=True):
            if status is _ACTIVE:
                has_active = True
                if watermark >= combined and (lowest_active is None or watermark < lowest_active):
                    lowest_active = watermark
            elif status is _IDLE and (highest_idle is None or watermark > highest_idle):
                highest_idle = watermark
        if has_active:
            candidate = lowest_active
        elif highest_idle is not None:
            candidate = highest_idle
        else:
            candidate = MAX_WATERMARK
        if candidate is not None and candidate > combined:
            self._combined = candidate
            return candidate
        return None
