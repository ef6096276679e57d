"""Credit-based flow control between a sending subtask and a receiving one, as bookkeeping only.

The receiver owns a bounded queue of ``initial_credits`` buffers per input channel and hands the sender
one credit per free slot; the sender sends one buffer per credit and never without one. So a receiver
holds at most ``initial_credits`` buffers and memory is bounded by credits x buffer size; a slow
receiver stops its senders (backpressure) instead of growing a queue.

The receiver's initial credits count as announced when the channel opens (the sender starts with
``OutputChannelCredits(initial_credits)``); later grants travel as credit announcements.

Invariant on the receiver: ``queued + outstanding + unannounced == initial_credits``. Announcing as soon
as ``unannounced`` reaches a threshold ``<= initial_credits`` means a stalled sender always gets credit
once the receiver has drained its queue, so the two can never deadlock.
"""

from __future__ import annotations

import time

from weir.core.errors import ProtocolError


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class InputChannelCredits:
    """Receiver side of one input channel."""

    __slots__ = ("_outstanding", "_queued", "_unannounced", "announce_threshold", "initial_credits")

    def __init__(self, initial_credits: int, announce_threshold: int = 1) -> None:
        if initial_credits < 1:
            raise ValueError(f"an input channel needs at least one credit, got {initial_credits}")
        if not 1 <= announce_threshold <= initial_credits:
            raise ValueError(
                f"credit announce threshold must be in 1..{initial_credits} (the initial credits), "
                f"got {announce_threshold}"
            )
        self.initial_credits = initial_credits
        self.announce_threshold = announce_threshold
        self._outstanding = initial_credits
        self._queued = 0
        self._unannounced = 0

    @property
    def queued(self) -> int:
        """Buffers received and not yet consumed."""
        return self._queued

    @property
    def outstanding(self) -> int:
        """Credits the sender holds: buffers it may still send without a new announcement."""
        return self._outstanding

    @property
    def unannounced(self) -> int:
        """Freed slots not yet announced to the sender."""
        return self._unannounced

    def on_buffer_received(self) -> None:
        """A buffer arrived from the sender; it used one credit."""
        if self._outstanding == 0:
            raise ProtocolError(
                f"sender overran its credit: a buffer arrived while it held no credit "
                f"({self._queued} of {self.initial_credits} buffers queued)"
            )
        self._outstanding -= 1
        self._queued += 1

    def on_buffer_consumed(self) -> int:
        """The task took one buffer off the queue. Returns the credits to announce now (0: not yet)."""
        if self._queued == 0:
            raise ProtocolError("a buffer was consumed from an empty input channel queue")
        self._queued -= 1
        unannounced = self._unannounced + 1
        if unannounced >= self.announce_threshold:
            self._unannounced = 0
            self._outstanding += unannounced
            return unannounced
        self._unannounced = unannounced
        return 0

    def flush_announcement(self) -> int:
        """Announce every freed slot now, below the threshold too (e.g. on a timer). Returns the count."""
        unannounced = self._unannounced
        self._unannounced = 0
        self._outstanding += unannounced
        return unannounced


class OutputChannelCredits:
    """Sender side of one output channel, with backpressure-time accounting.

    The sender may enqueue buffers as they fill (``on_buffer_enqueued``) and sends while it holds
    credit; a buffer may also be sent without being enqueued first. Time during which an enqueued
    buffer waits and the credit is zero is backpressured time. Clock values are milliseconds from one
    monotonic clock, passed in by the caller; when omitted, ``time.monotonic()`` is read.
    """

    __slots__ = (
        "_backlog",
        "_backpressured_ms",
        "_backpressured_since",
        "_credits",
        "_sample_backpressured_ms",
        "_sample_time_ms",
    )

    def __init__(self, initial_credits: int = 0, now_ms: float | None = None) -> None:
        if initial_credits < 0:
            raise ValueError(f"initial credits must be >= 0, got {initial_credits}")
        self._credits = initial_credits
        self._backlog = 0
        self._backpressured_ms = 0.0
        self._backpressured_since: float | None = None
        self._sample_time_ms = _monotonic_ms() if now_ms is None else now_ms
        self._sample_backpressured_ms = 0.0

    @property
    def credits(self) -> int:
        return self._credits

    @property
    def backlog(self) -> int:
        """Buffers enqueued and not yet sent."""
        return self._backlog

    @property
    def is_backpressured(self) -> bool:
        return self._backpressured_since is not None

    def can_send(self) -> bool:
        """Whether the sender holds a credit."""
        return self._credits > 0

    def add_credits(self, credits: int, now_ms: float | None = None) -> None:
        """The receiver announced ``credits`` more free slots."""
        if credits < 1:
            raise ProtocolError(f"a credit announcement must grant at least one credit, got {credits}")
        self._credits += credits
        if self._backpressured_since is not None:
            if now_ms is None:
                now_ms = _monotonic_ms()
            self._backpressured_ms += now_ms - self._backpressured_since
            self._backpressured_since = None

    def on_buffer_enqueued(self, now_ms: float | None = None) -> None:
        """A full buffer is ready to send."""
        self._backlog += 1
        if self._credits == 0 and self._backpressured_since is None:
            self._backpressured_since = _monotonic_ms() if now_ms is None else now_ms

    def on_buffer_sent(self, now_ms: float | None = None) -> None:
        """One buffer was sent, using one credit: the oldest enqueued one, if any."""
        if self._credits == 0:
            raise ProtocolError("a buffer was sent without credit: the receiver's queue would overflow")
        self._credits -= 1
        if self._backlog > 0:
            self._backlog -= 1
            if self._credits == 0 and self._backlog > 0:
                self._backpressured_since = _monotonic_ms() if now_ms is None else now_ms

    def backpressured_ms(self, now_ms: float | None = None) -> float:
        """Total backpressured time so far, including an ongoing stretch."""
        since = self._backpressured_since
        if since is None:
            return self._backpressured_ms
        if now_ms is None:
            now_ms = _monotonic_ms()
        return self._backpressured_ms + (now_ms - since)

    def sample_backpressured_ms_per_second(self, now_ms: float | None = None) -> float:
        """Backpressured ms per second of wall time since the previous sample (0..1000)."""
        if now_ms is None:
            now_ms = _monotonic_ms()
        total = self.backpressured_ms(now_ms)
        elapsed = now_ms - self._sample_time_ms
        rate = (total - self._sample_backpressured_ms) * 1000.0 / elapsed if elapsed > 0 else 0.0
        self._sample_time_ms = _monotonic_ms() if now_ms is None else now_ms
        self._sample_backpressured_ms = total
        return rate
