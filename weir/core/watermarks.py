"""Watermarks: how far event time has progressed, at a source and at an operator with many inputs.

A watermark ``w`` promises that no more elements with timestamp ``<= w`` will arrive (late ones
excepted). Watermarks are integer milliseconds between :data:`MIN_WATERMARK` (nothing known yet) and
:data:`MAX_WATERMARK` (the input has ended: every window may fire).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from weir.core.errors import ProtocolError
from weir.core.ids import ChannelIndex

MIN_WATERMARK = -(1 << 63)
"""The watermark before any element was seen (Flink's Long.MIN_VALUE)."""

MAX_WATERMARK = (1 << 63) - 1
"""The watermark of an ended input: event time is complete (Flink's Long.MAX_VALUE)."""


class BoundedOutOfOrdernessWatermarks:
    """Source-side generator: elements may arrive up to ``max_out_of_orderness_ms`` out of order.

    The watermark is ``max timestamp seen - bound - 1``: an element exactly ``bound`` ms older than the
    newest one is still on time.
    """

    __slots__ = ("_last_polled", "max_out_of_orderness_ms", "max_timestamp")

    def __init__(self, max_out_of_orderness_ms: int) -> None:
        if max_out_of_orderness_ms < 0:
            raise ValueError(f"max out-of-orderness must be >= 0 ms, got {max_out_of_orderness_ms}")
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        # Chosen so that current_watermark() is exactly MIN_WATERMARK until the first element. A
        # source's read loop raises it itself (on_event inline, once per record).
        self.max_timestamp = MIN_WATERMARK + max_out_of_orderness_ms + 1
        self._last_polled = MIN_WATERMARK

    def on_event(self, timestamp_ms: int) -> None:
        """Account for one element's timestamp."""
        if timestamp_ms > self.max_timestamp:
            self.max_timestamp = timestamp_ms

    def current_watermark(self) -> int:
        return self.max_timestamp - self.max_out_of_orderness_ms - 1

    def poll(self) -> int | None:
        """The current watermark if it advanced since the previous poll, else None (nothing to emit)."""
        watermark = self.max_timestamp - self.max_out_of_orderness_ms - 1
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

    def add_channel(self) -> ChannelIndex:
        """One more input channel, active at the combined watermark: it holds it there until its own
        watermark passes it (the combined watermark never goes back)."""
        self._watermarks.append(self._combined)
        self._status.append(_ACTIVE)
        return ChannelIndex(len(self._status) - 1)

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
        watermarks = self._watermarks
        if len(watermarks) == 1:
            # One channel: active, idle or ended (stored as MAX_WATERMARK), the candidate is its own
            # watermark (the loop below, without the loop: this runs after every record).
            only = watermarks[0]
            if only > combined:
                self._combined = only
                return only
            return None
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


class WatermarkStatus(Enum):
    """Flink's WatermarkStatus of a stream: an IDLE stream sends no records or watermarks for now, so
    its consumers leave it out of their combined watermark until it is ACTIVE again."""

    ACTIVE = "active"
    IDLE = "idle"


@runtime_checkable
class ReportsWatermarkStatus(Protocol):
    """A source that can go idle (the task announces its status downstream when it changes)."""

    def watermark_status(self) -> WatermarkStatus: ...


@dataclass(frozen=True)
class PartitionStatusChange:
    """One partition of a source subtask went idle, or active again."""

    partition: int
    status: WatermarkStatus


class PartitionWatermarks:
    """A source subtask's watermark over its partitions, with Flink's source idleness.

    Each partition has its own :class:`BoundedOutOfOrdernessWatermarks`; the subtask's watermark
    combines them in a :class:`WatermarkTracker` (one channel per partition), so an ended partition
    counts as MAX_WATERMARK and an idle one is left out. With ``idle_timeout_ms`` a partition that
    had no record for that long (wall time, ``now`` in seconds from the caller's monotonic clock) goes
    idle; its next record makes it active again, and it cannot move the combined watermark back. The
    subtask is IDLE when no partition is active and one is idle, or when it has no partition at all
    and an idle timeout is set.

    The hot path is the caller's: per record ``generators[p].on_event(ts)`` and ``seen.add(p)``; once
    per poll :meth:`advance`.
    """

    __slots__ = (
        "_emitted",
        "_idle_timeout_s",
        "_index",
        "_last_record",
        "_max_out_of_orderness_ms",
        "_tracker",
        "generators",
        "seen",
    )

    def __init__(
        self,
        partitions: Sequence[int],
        max_out_of_orderness_ms: int,
        idle_timeout_ms: int | None,
        now: float,
        ended: Iterable[int] = (),
    ) -> None:
        if idle_timeout_ms is not None and idle_timeout_ms <= 0:
            raise ValueError(f"idle timeout must be a positive number of ms, got {idle_timeout_ms}")
        self._idle_timeout_s = None if idle_timeout_ms is None else idle_timeout_ms / 1000.0
        self._max_out_of_orderness_ms = max_out_of_orderness_ms
        self._index = {p: ChannelIndex(i) for i, p in enumerate(partitions)}
        self._tracker = WatermarkTracker(len(partitions)) if partitions else None
        self._last_record = dict.fromkeys(partitions, now)
        self._emitted = MIN_WATERMARK
        self.generators = {p: BoundedOutOfOrdernessWatermarks(max_out_of_orderness_ms) for p in partitions}
        self.seen: set[int] = set()  # partitions with a record since the last advance
        for p in ended:
            self.end(p)

    @property
    def current(self) -> int:
        """The combined watermark emitted so far (MIN_WATERMARK before the first)."""
        return self._emitted

    def status(self) -> WatermarkStatus:
        tracker = self._tracker
        if tracker is None:
            return WatermarkStatus.ACTIVE if self._idle_timeout_s is None else WatermarkStatus.IDLE
        return WatermarkStatus.IDLE if tracker.is_idle else WatermarkStatus.ACTIVE

    def partition_status(self, partition: int) -> ChannelStatus:
        assert self._tracker is not None, "no partitions"
        return self._tracker.channel_status(self._index[partition])

    def add(self, partition: int, now: float) -> None:
        """A partition found after the start (partition discovery): it holds the watermark until its
        first records, or goes idle after the idle timeout from ``now``."""
        if partition in self._index:
            return
        if self._tracker is None:
            self._tracker = WatermarkTracker(1)
            self._index[partition] = ChannelIndex(0)
        else:
            self._index[partition] = self._tracker.add_channel()
        self._last_record[partition] = now
        self.generators[partition] = BoundedOutOfOrdernessWatermarks(self._max_out_of_orderness_ms)

    def end(self, partition: int) -> None:
        """``partition`` reached its end (a bounded source): it counts as MAX_WATERMARK."""
        tracker = self._tracker
        assert tracker is not None, "no partitions"
        index = self._index[partition]
        if tracker.channel_status(index) is not _ENDED:
            tracker.on_end_of_stream(index)

    def _generators_by_watermark(self) -> list[tuple[int, int]]:
        """(watermark, partition) of the partitions seen, lowest first: fed in this order, the tracker
        ends where it would for all of them at once (a higher one first could pass a lower one that
        resumed behind the combined watermark and is catching up in this same poll)."""
        generators = self.generators
        return sorted((generators[p].current_watermark(), p) for p in self.seen)

    def advance(self, now: float) -> tuple[int | None, list[PartitionStatusChange]]:
        """Account for the partitions in ``seen`` (each had a record) and for the idle timeout at
        ``now``: the combined watermark if it advanced since the last call (else None), and the
        partitions that went active or idle, in that order."""
        tracker = self._tracker
        changes: list[PartitionStatusChange] = []
        if tracker is None:
            return None, changes
        index, last_record, generators = self._index, self._last_record, self._generators_by_watermark()
        for watermark, p in generators:
            channel = index[p]
            last_record[p] = now
            status = tracker.channel_status(channel)
            if status is _ENDED:
                continue
            if status is _IDLE:
                changes.append(PartitionStatusChange(p, WatermarkStatus.ACTIVE))
            tracker.on_watermark(channel, watermark)  # also marks it active
        self.seen.clear()
        timeout = self._idle_timeout_s
        if timeout is not None:
            for p, channel in index.items():
                if tracker.channel_status(channel) is _ACTIVE and now - last_record[p] >= timeout:
                    tracker.mark_idle(channel)
                    changes.append(PartitionStatusChange(p, WatermarkStatus.IDLE))
        combined = tracker.current
        if combined > self._emitted:
            self._emitted = combined
            return combined, changes
        return None, changes


@dataclass(frozen=True)
class ValveOutput:
    """What one input event changes for the operator: its combined watermark advanced to
    ``watermark``, and/or its output's status changed to ``status`` (None: unchanged)."""

    watermark: int | None = None
    status: WatermarkStatus | None = None


_NO_CHANGE = ValveOutput()


class StatusWatermarkValve:
    """An operator's input side of idleness (Flink's StatusWatermarkValve) over a WatermarkTracker.

    An input channel goes idle on an IDLE event and is left out of the combined watermark until it
    sends a record, a watermark or ACTIVE. The operator is IDLE while no channel that has not ended
    is active and one is idle; each method answers what changed, so the task forwards the new
    watermark and announces the new status downstream."""

    __slots__ = ("_status", "tracker")

    def __init__(self, tracker: WatermarkTracker) -> None:
        self.tracker = tracker
        self._status = WatermarkStatus.ACTIVE

    @property
    def status(self) -> WatermarkStatus:
        return self._status

    def on_records(self, channel: ChannelIndex) -> ValveOutput:
        """Records arrived on ``channel``: an idle channel is active again (before they are processed)."""
        if self.tracker.channel_status(channel) is not _IDLE:
            return _NO_CHANGE
        return self.on_active(channel)

    def on_watermark(self, channel: ChannelIndex, watermark: int) -> ValveOutput:
        return self._output(self.tracker.on_watermark(channel, watermark))

    def on_idle(self, channel: ChannelIndex) -> ValveOutput:
        return self._output(self.tracker.mark_idle(channel))

    def on_active(self, channel: ChannelIndex) -> ValveOutput:
        self.tracker.mark_active(channel)
        return self._output(None)

    def on_end_of_stream(self, channel: ChannelIndex) -> ValveOutput:
        return self._output(self.tracker.on_end_of_stream(channel))

    def _output(self, advanced: int | None) -> ValveOutput:
        tracker = self.tracker
        status = WatermarkStatus.IDLE if tracker.is_idle else WatermarkStatus.ACTIVE
        changed: WatermarkStatus | None = None
        if status is not self._status and not tracker.all_ended:
            self._status = changed = status
        if advanced is None and changed is None:
            return _NO_CHANGE
        return ValveOutput(advanced, changed)
