"""The consumer side of a subtask's channels: its input gate (Flink's ``SingleInputGate``).

Every input channel queues the buffers its producer sent against credit; the task takes them round
robin, priority events (unaligned barriers) first, and each buffer taken grants its producer a
credit back. A channel blocked by barrier alignment is skipped until it is unblocked.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from weir.core.errors import ProtocolError
from weir.core.ids import ChannelIndex
from weir.taskmanager.credit import InputChannelCredits
from weir.taskmanager.network.codec import ChannelBuffer, ChannelClosedError, Event, message_of, records_of
from weir.wire import common_pb2, taskmanager_pb2

INITIAL_CREDITS = 4
"""Buffers a consumer lets each of its producers send before it grants credit back."""


@dataclass(frozen=True, slots=True)
class _Queued:
    """A buffer in an input channel's queue, with its arrival number on the channel (0, 1, ...): a
    priority event is ahead of exactly the queued buffers numbered below its mark, whatever is taken
    from or deleted in the queue meanwhile; a count of the buffers ahead would go stale. Flink's
    ``RemoteInputChannel`` does the same: it keeps the sequence number of the last barrier and its
    in-flight buffers are those queued with a lower one."""

    arrival: int
    buffer: ChannelBuffer


@dataclass
class _InputChannel:
    index: int
    gate: int
    credits: InputChannelCredits
    buffers: deque[_Queued]
    announcements: queue.SimpleQueue[int | None]  # credit grants to a remote producer; None: closed
    local_producer: Callable[[int | None], None] | None = None  # credit grants to a local producer, instead
    blocked: bool = False
    ended: bool = False  # the task took the end-of-stream buffer
    eos_received: bool = False  # the end-of-stream buffer arrived (the producer may now hang up)
    connected: bool = False
    arrivals: int = 0  # buffers ever queued: the arrival number of the next one

    def queue(self, buffer: ChannelBuffer) -> None:
        self.buffers.append(_Queued(self.arrivals, buffer))
        self.arrivals += 1

    def ahead_of(self, mark: int) -> tuple[ChannelBuffer, ...]:
        """The queued buffers that arrived before ``mark``, in order."""
        return tuple(q.buffer for q in itertools.takewhile(lambda q: q.arrival < mark, self.buffers))


@dataclass(frozen=True)
class ReceivedBuffer:
    """A buffer the task took from one of its input channels; ``gate``: the head's input it feeds.
    For a priority event, ``overtaken``: the buffers that arrived on its channel before it and are
    still queued (the task takes them next, in order)."""

    channel: ChannelIndex
    gate: int
    message: ChannelBuffer
    overtaken: tuple[ChannelBuffer, ...] = ()


class InputGate:
    """All input channels of one subtask; the task thread takes buffers, round robin.

    ``condition`` guards the channels and is notified when a buffer arrives, a channel is unblocked or
    a producer is lost: the task's mailbox shares it, so that input and control mails wake the task
    through one signal."""

    def __init__(
        self, gates: list[int], initial_credits: int = INITIAL_CREDITS, condition: threading.Condition | None = None
    ) -> None:
        self._cond = condition if condition is not None else threading.Condition()
        self.channels = [
            _InputChannel(i, g, InputChannelCredits(initial_credits), deque(), queue.SimpleQueue())
            for i, g in enumerate(gates)
        ]
        self._initial_credits = initial_credits
        self._next = 0
        self._failure: str | None = None
        # Priority events by arrival, each with its mark: the arrival number its channel's next buffer
        # had then, so the buffers it overtook are those still queued with a lower one.
        self._priority: deque[tuple[_InputChannel, ChannelBuffer, int]] = deque()
        # In-order checkpoint barriers still queued: checkpoint id -> (its trigger time, how many).
        self._queued_barriers: dict[int, tuple[float, int]] = {}

    # Called by the gRPC servicer threads.

    def connect(self, channel: int) -> int:
        with self._cond:
            ch = self.channels[channel]
            if ch.connected:
                raise ProtocolError(f"input channel {channel} is already connected")
            ch.connected = True
            return self._initial_credits

    def connect_local(self, channel: int, grant: Callable[[int | None], None]) -> int:
        """Connect a producer in this process: its later credits go to ``grant`` (called on the task's
        thread, maybe with the gate's condition held; None once the gate closed) instead of the
        announcement queue. Answers the initial credits."""
        with self._cond:
            initial = self.connect(channel)
            self.channels[channel].local_producer = grant
            return initial

    def _announce(self, ch: _InputChannel, grant: int) -> None:
        if ch.local_producer is not None:
            ch.local_producer(grant)
        else:
            ch.announcements.put(grant)

    def push(self, channel: int, buffer: ChannelBuffer) -> None:
        msg = message_of(buffer)
        with self._cond:
            ch = self.channels[channel]
            if msg.priority:  # sent without credit, taken ahead of the queue
                if msg.record_count or msg.event != Event.EVENT_KIND_BARRIER:
                    raise ProtocolError(f"input channel {channel}: a priority message must be a bare barrier")
                self._priority.append((ch, buffer, ch.arrivals))
                self._cond.notify()
                return
            ch.credits.on_buffer_received()
            ch.queue(buffer)
            if _timeoutable(msg):
                timestamp, count = self._queued_barriers.get(msg.checkpoint_id, (msg.checkpoint_timestamp, 0))
                self._queued_barriers[msg.checkpoint_id] = (timestamp, count + 1)
            if msg.event == Event.EVENT_KIND_END_OF_STREAM:
                ch.eos_received = True
            self._cond.notify()

    def producer_gone(self, channel: int, reason: str) -> None:
        with self._cond:
            ch = self.channels[channel]
            if not ch.eos_received and self._failure is None:
                self._failure = f"input channel {channel} lost its producer: {reason}"
            self._cond.notify()

    # Called by the task thread.

    @property
    def condition(self) -> threading.Condition:
        return self._cond

    def take(self) -> ReceivedBuffer | None:
        """The next priority event, else the next buffer of an unblocked channel, without waiting;
        None when none is queued. Raises ChannelClosedError once a channel lost its producer before
        its end of stream."""
        with self._cond:
            priority = self.take_priority()
            if priority is not None:
                return priority
            n = len(self.channels)
            for step in range(n):
                ch = self.channels[(self._next + step) % n]
                if ch.buffers and not ch.blocked:
                    self._next = (ch.index + 1) % n
                    buffer = ch.buffers.popleft().buffer
                    msg = message_of(buffer)
                    if msg.event == Event.EVENT_KIND_END_OF_STREAM:
                        ch.ended = True
                    elif _timeoutable(msg):
                        self._barrier_taken(msg.checkpoint_id)
                    grant = ch.credits.on_buffer_consumed()
                    if grant:
                        self._announce(ch, grant)
                    return ReceivedBuffer(ChannelIndex(ch.index), ch.gate, buffer)
            return None

    def take_priority(self) -> ReceivedBuffer | None:
        """The next priority event, without waiting (a backpressured task takes only these); None
        when none arrived. Raises ChannelClosedError as :meth:`take` does."""
        with self._cond:
            if self._failure is not None:
                raise ChannelClosedError(self._failure)
            if not self._priority:
                return None
            return self._received_priority(*self._priority.popleft())

    def pending_priority(self) -> tuple[ReceivedBuffer, ...]:
        """The priority events not taken yet, each with what it overtook, in the order
        :meth:`take_priority` hands them out; nothing is taken."""
        with self._cond:
            return tuple(self._received_priority(*entry) for entry in self._priority)

    def _received_priority(self, ch: _InputChannel, msg: ChannelBuffer, mark: int) -> ReceivedBuffer:
        return ReceivedBuffer(ChannelIndex(ch.index), ch.gate, msg, ch.ahead_of(mark))

    def _barrier_taken(self, checkpoint_id: int) -> None:
        timestamp, count = self._queued_barriers.get(checkpoint_id, (0.0, 1))
        if count > 1:
            self._queued_barriers[checkpoint_id] = (timestamp, count - 1)
        else:
            self._queued_barriers.pop(checkpoint_id, None)

    def queued_barrier_times(self) -> dict[int, float]:
        """The in-order checkpoint barriers still queued: checkpoint id -> its trigger time (epoch s)."""
        with self._cond:
            return {cid: timestamp for cid, (timestamp, _) in self._queued_barriers.items()}

    def prioritize(self, checkpoint_id: int) -> int:
        """Turn the queued in-order barriers of ``checkpoint_id`` into priority events that overtake the
        buffers ahead of them (the aligned-checkpoint timeout). A barrier's records stay in its place;
        a bare barrier's slot is freed (its credit goes back). Answers how many were turned."""
        with self._cond:
            turned = 0
            for ch in self.channels:
                position = next(
                    (
                        i
                        for i, queued in enumerate(message_of(q.buffer) for q in ch.buffers)
                        if _timeoutable(queued) and queued.checkpoint_id == checkpoint_id
                    ),
                    None,
                )
                if position is None:
                    continue
                slot = ch.buffers[position]
                msg = message_of(slot.buffer)
                barrier = taskmanager_pb2.DataMessage(
                    event=msg.event,
                    checkpoint_id=msg.checkpoint_id,
                    checkpoint_kind=msg.checkpoint_kind,
                    checkpoint_timestamp=msg.checkpoint_timestamp,
                    priority=True,
                    barrier_alignment=msg.barrier_alignment,
                )
                if msg.record_count:  # the records before the barrier stay queued, as a buffer of their own
                    ch.buffers[position] = _Queued(slot.arrival, records_of(slot.buffer))
                    mark = slot.arrival + 1
                else:
                    del ch.buffers[position]
                    grant = ch.credits.on_buffer_consumed()
                    if grant:
                        self._announce(ch, grant)
                    mark = slot.arrival
                self._priority.append((ch, barrier, mark))
                turned += 1
            self._queued_barriers.pop(checkpoint_id, None)
            if turned:
                self._cond.notify()
            return turned

    def poll(self, timeout: float) -> tuple[int, int, ChannelBuffer] | None:
        """The next buffer of an unblocked channel as (channel, gate, message), waiting up to
        ``timeout``; None on timeout. (A task waits through its mailbox instead.)"""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                taken = self.take()
                if taken is not None:
                    return taken.channel, taken.gate, taken.message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def block(self, channel: int) -> None:
        with self._cond:
            self.channels[channel].blocked = True

    def unblock(self, channels: Collection[int] | None = None) -> None:
        with self._cond:
            for ch in self.channels:
                if channels is None or ch.index in channels:
                    ch.blocked = False
            self._cond.notify()

    def queued_buffers(self) -> int:
        return sum(len(ch.buffers) for ch in self.channels)

    def capacity(self) -> int:
        return len(self.channels) * self._initial_credits

    def close(self) -> None:
        """The task is done with its input: its producers are told (their channels end)."""
        for ch in self.channels:
            if ch.local_producer is not None:
                ch.local_producer(None)
            else:
                ch.announcements.put(None)


def _timeoutable(msg: taskmanager_pb2.DataMessage) -> bool:
    """An in-order checkpoint barrier, which the aligned-checkpoint timeout may turn into a priority one
    (a savepoint's barrier never: a savepoint stays aligned; nor a forced aligned one, a final
    checkpoint's, which must not overtake the records before it)."""
    return (
        msg.event == Event.EVENT_KIND_BARRIER
        and msg.checkpoint_kind != common_pb2.CHECKPOINT_KIND_SAVEPOINT
        and msg.barrier_alignment != common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED
    )
