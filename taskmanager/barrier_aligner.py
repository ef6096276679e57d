"""Checkpoint barrier handling for one task with N input channels, as a pure state machine.

The TaskManager's input loop feeds the aligner the control events it reads from each input channel
(barriers, cancellation markers, end of stream) and the JobManager's aborts; the aligner answers with
actions for the loop to carry out, in order: block or unblock a channel, snapshot the operator,
forward a cancellation marker, give up on a checkpoint, capture a channel's in-flight records. It
does no I/O and reads no clock: every call that may start or finish a checkpoint takes ``now``, and the actions that
snapshot or complete a checkpoint carry when each barrier arrived (``BarrierArrival``), so the task
can tell the JobManager where the checkpoint spent its time (``weir checkpoints JOB --detail CID``).

Modes (``weir.core.checkpointing.CheckpointingMode``, the job's ``checkpointing.mode`` as the JobManager
settled it and deployed it; Flink's three barrier handlers):

- ``EXACTLY_ONCE``: aligned. A channel that delivered barrier N is blocked until every live channel
  has delivered N; then the operator snapshots and all channels are unblocked. The snapshot holds
  exactly the records that precede barrier N on every channel.
- ``AT_LEAST_ONCE``: nothing is blocked; the operator snapshots when the last barrier of N arrives.
  The snapshot holds every record before barrier N and possibly some after it.
- ``UNALIGNED``: nothing is blocked; the operator snapshots on the first barrier of N, and the
  records still arriving on each channel until its own barrier N are captured as in-flight state,
  so that snapshot + captured records hold exactly the records before barrier N. A barrier of this
  mode is a priority event that overtakes the buffers queued on its channel: those are captured too
  (CaptureQueued), after what the channel delivered before. Savepoints stay aligned in this mode, as
  in Flink: a savepoint must not depend on in-flight data. So does a barrier that says it is forced
  aligned (``BarrierAlignment.FORCED_ALIGNED``, Flink's ``FORCED_ALIGNED``): a bounded job's final
  checkpoint (FLIP-147), after which the sinks commit and the job ends, so that no record lies in
  flight behind it for a sink to write into an epoch no checkpoint covers. Such a barrier never comes
  as a priority event (its producer sends it in order, the gate never times it out into one).
- ``UNALIGNED`` with ``aligned_start`` (Flink's aligned-checkpoint-timeout, FLIP-183): a checkpoint
  starts aligned on an in-order barrier; the runtime turns a barrier still queued when the timeout
  has passed into a priority one, and the first priority barrier of an aligning checkpoint switches
  it to unaligned: the operator snapshots at once, the blocked channels (their barrier came, what
  follows it is not the checkpoint's) are unblocked, the others capture until their barrier. A
  savepoint or a forced aligned checkpoint never switches.

The first barrier of a checkpoint decides how this task aligns it (the JobManager triggers every
source of a checkpoint alike, and each task forwards the alignment it was given with ``TriggerSnapshot``).

One checkpoint is pending at a time (the JobManager runs one checkpoint at a time, so a barrier or
cancellation of a newer checkpoint means the pending one is already dead). Invariants between calls:

- ``pending_checkpoint`` is None or equal to the highest checkpoint id seen so far; anything about
  an older id, or about that id once it is no longer pending, is obsolete and ignored.
- A pending checkpoint has an arrived channel set that does not cover every live channel (had it
  covered them, the checkpoint would have completed in the same call).
- The blocked channels are the arrived ones of a pending aligned checkpoint, and nothing else.
- The capturing channels are the live, not yet arrived ones of a pending unaligned checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import assert_never

from weir.core.checkpointing import BarrierAlignment, CheckpointingMode, CheckpointKind
from weir.core.errors import ProtocolError
from weir.core.ids import ChannelIndex, CheckpointId, TaskId


class AbortReason(Enum):
    SUBSUMED = "subsumed"
    """A barrier or cancellation marker of a newer checkpoint arrived first."""
    CANCELLED_UPSTREAM = "cancelled_upstream"
    """An input channel delivered a cancellation marker for it."""
    ABORTED_BY_JOBMANAGER = "aborted_by_jobmanager"
    """The JobManager aborted it; it already knows, so the task need not decline it."""


@dataclass(frozen=True)
class BarrierArrival:
    """Barrier N arrived on ``channel`` at ``at`` (the caller's ``now``)."""

    channel: ChannelIndex
    at: float


# Actions, carried out by the input loop in the order given.


@dataclass(frozen=True)
class BlockChannel:
    """Stop polling this channel until it is unblocked."""

    channel: ChannelIndex


@dataclass(frozen=True)
class UnblockChannels:
    """Resume polling these channels."""

    channels: tuple[ChannelIndex, ...]


@dataclass(frozen=True)
class TriggerSnapshot:
    """Snapshot the operator's state for this checkpoint, then forward barrier N on every output.

    With ``capture_inflight`` the checkpoint also holds the records captured between StartCapture and
    StopCapture; acknowledge it to the JobManager only after InflightCaptureComplete.

    ``alignment``: the barrier's, which the task forwards (a forced aligned barrier stays one downstream).
    ``alignment_started_at``: the first barrier's arrival; ``triggered_at``: now, the alignment's end;
    ``barriers``: the arrivals so far, in order (every live channel's unless ``capture_inflight``: then
    the rest come with InflightCaptureComplete). They are an observation for the checkpoint's
    timeline, not a decision of the protocol: actions compare equal without them.
    """

    checkpoint_id: CheckpointId
    kind: CheckpointKind
    alignment_started_at: float
    triggered_at: float
    capture_inflight: bool = False
    alignment: BarrierAlignment = BarrierAlignment.BY_MODE
    barriers: tuple[BarrierArrival, ...] = field(default=(), compare=False)

    @property
    def alignment_duration(self) -> float:
        return self.triggered_at - self.alignment_started_at


@dataclass(frozen=True)
class ForwardCancellation:
    """Send a cancellation marker for this checkpoint on every output, so downstream stops waiting."""

    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class AbortedCheckpoint:
    """This task gave up on the checkpoint: drop whatever it holds for it and (unless the JobManager
    aborted it) decline it to the JobManager."""

    checkpoint_id: CheckpointId
    reason: AbortReason


@dataclass(frozen=True)
class StartCapture:
    """Records read from this channel from now on belong to the checkpoint's in-flight state."""

    channel: ChannelIndex
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class StopCapture:
    """Stop capturing this channel's records for the checkpoint (its barrier arrived, it ended, or
    the checkpoint was aborted)."""

    channel: ChannelIndex
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class CaptureQueued:
    """The channel's barrier arrived ahead of buffers the channel still queues (an unaligned barrier
    overtook them): those buffers belong to the checkpoint's in-flight state, after what the channel
    delivered before. The task processes them next, as usual."""

    channel: ChannelIndex
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class InflightCaptureComplete:
    """Every channel's in-flight records for the unaligned checkpoint are captured: acknowledge it.
    ``barriers``: every barrier's arrival, in order (a channel that ended instead has none); like
    TriggerSnapshot's, not compared."""

    checkpoint_id: CheckpointId
    barriers: tuple[BarrierArrival, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class AllChannelsEnded:
    """Every input channel delivered end of stream: finish the operator."""


Action = (
    BlockChannel
    | UnblockChannels
    | TriggerSnapshot
    | ForwardCancellation
    | AbortedCheckpoint
    | StartCapture
    | StopCapture
    | CaptureQueued
    | InflightCaptureComplete
    | AllChannelsEnded
)


class InputProtocolError(ProtocolError):
    """An input event the channel protocol rules out: read from a blocked channel, after end of
    stream, or a second barrier of one checkpoint on one channel. Fail the task."""


class _Strategy(Enum):
    ALIGNED = "aligned"  # block channels that delivered the barrier; snapshot on the last barrier
    TRACKING = "tracking"  # block nothing; snapshot on the last barrier
    UNALIGNED = "unaligned"  # block nothing; snapshot on the first barrier, capture the others


@dataclass(frozen=True)
class _Pending:
    checkpoint_id: CheckpointId
    kind: CheckpointKind
    alignment: BarrierAlignment
    strategy: _Strategy
    started_at: float
    arrived: frozenset[ChannelIndex]
    arrivals: tuple[BarrierArrival, ...]  # the arrived channels' barriers, in order

    def arrive(self, channel: ChannelIndex, now: float) -> _Pending:
        return replace(self, arrived=self.arrived | {channel}, arrivals=(*self.arrivals, BarrierArrival(channel, now)))


class BarrierAligner:
    """Turns the control events of a task's input channels into checkpoint actions."""

    def __init__(
        self, task: TaskId, num_channels: int, mode: CheckpointingMode, *, aligned_start: bool = False
    ) -> None:
        if num_channels < 1:
            raise ValueError(f"task {task}: a barrier aligner needs at least one input channel")
        self._task = task
        self._mode = mode
        self._aligned_start = aligned_start and mode is CheckpointingMode.UNALIGNED
        self._channels = frozenset(ChannelIndex(i) for i in range(num_channels))
        self._ended: set[ChannelIndex] = set()
        self._latest: CheckpointId | None = None
        self._pending: _Pending | None = None
        self._last_completed: CheckpointId | None = None
        self._aborted_ahead: set[CheckpointId] = set()

    # Observers.

    @property
    def mode(self) -> CheckpointingMode:
        return self._mode

    @property
    def pending_checkpoint(self) -> CheckpointId | None:
        return self._pending.checkpoint_id if self._pending is not None else None

    @property
    def last_completed_checkpoint(self) -> CheckpointId | None:
        return self._last_completed

    @property
    def live_channels(self) -> frozenset[ChannelIndex]:
        return self._channels - self._ended

    @property
    def blocked_channels(self) -> frozenset[ChannelIndex]:
        pending = self._pending
        if pending is None or pending.strategy is not _Strategy.ALIGNED:
            return frozenset()
        return pending.arrived

    @property
    def capturing_channels(self) -> frozenset[ChannelIndex]:
        pending = self._pending
        if pending is None or pending.strategy is not _Strategy.UNALIGNED:
            return frozenset()
        return self._waiting_for(pending)

    @property
    def all_ended(self) -> bool:
        return not self.live_channels

    # Events read from input channels.

    def on_barrier(
        self,
        channel: ChannelIndex,
        checkpoint_id: CheckpointId,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        *,
        now: float,
        priority: bool = False,
        alignment: BarrierAlignment = BarrierAlignment.BY_MODE,
    ) -> tuple[Action, ...]:
        """Barrier ``checkpoint_id`` read from ``channel`` at time ``now``. A barrier of a newer
        checkpoint subsumes the pending one; an older or finished one is ignored. ``priority``: it
        came ahead of the channel's queue (an unaligned barrier), so it may come on a blocked channel.
        ``alignment``: what the barrier says of its alignment; a forced aligned one must not come as a
        priority event (the records it overtook would land after an aligned snapshot)."""
        if priority and alignment is BarrierAlignment.FORCED_ALIGNED:
            raise InputProtocolError(
                f"task {self._task}: barrier {checkpoint_id} on channel {channel} is forced aligned but came as a "
                "priority event, ahead of records its snapshot must hold"
            )
        self._check_readable(
            channel, f"barrier of checkpoint {checkpoint_id}", blocked_ok=priority and self._is_newer(checkpoint_id)
        )
        pending = self._pending
        if pending is not None and checkpoint_id == pending.checkpoint_id:
            if channel in pending.arrived:
                raise InputProtocolError(
                    f"task {self._task}: channel {channel} delivered barrier {checkpoint_id} twice"
                )
            if priority and pending.strategy is _Strategy.ALIGNED and self._switchable(pending):
                return self._switch_to_unaligned(pending, channel, now)
            return self._arrive(pending, channel, now)
        if not self._is_newer(checkpoint_id):
            return ()
        actions = self._abort_pending(AbortReason.SUBSUMED)
        aborted_by_jobmanager = checkpoint_id in self._aborted_ahead
        self._advance_to(checkpoint_id)
        if aborted_by_jobmanager:
            return (*actions, ForwardCancellation(checkpoint_id))
        return actions + self._start(channel, checkpoint_id, kind, alignment, now, priority)

    def on_cancellation(self, channel: ChannelIndex, checkpoint_id: CheckpointId) -> tuple[Action, ...]:
        """A cancellation marker: the upstream task gave up on the checkpoint."""
        self._check_readable(channel, f"cancellation marker of checkpoint {checkpoint_id}")
        pending = self._pending
        if pending is not None and checkpoint_id == pending.checkpoint_id:
            return self._abort_pending(AbortReason.CANCELLED_UPSTREAM)
        if not self._is_newer(checkpoint_id):
            return ()
        actions = self._abort_pending(AbortReason.SUBSUMED)
        self._advance_to(checkpoint_id)
        return (*actions, ForwardCancellation(checkpoint_id))

    def on_end_of_stream(self, channel: ChannelIndex, *, now: float) -> tuple[Action, ...]:
        """The channel ended: it no longer owes barriers, which may complete the pending checkpoint."""
        self._check_readable(channel, "end of stream")
        self._ended.add(channel)
        actions: tuple[Action, ...] = ()
        pending = self._pending
        if pending is not None and channel not in pending.arrived:
            if pending.strategy is _Strategy.UNALIGNED:
                actions += (StopCapture(channel, pending.checkpoint_id),)
            actions += self._complete_if_all_arrived(now, unblocked=frozenset())
        if self.all_ended:
            actions += (AllChannelsEnded(),)
        return actions

    # Events from the JobManager.

    def abort(self, checkpoint_id: CheckpointId) -> tuple[Action, ...]:
        """The JobManager aborted the checkpoint. A checkpoint not started yet is remembered: its
        barriers will be ignored and replaced by a cancellation marker downstream."""
        pending = self._pending
        if pending is not None and checkpoint_id == pending.checkpoint_id:
            return self._abort_pending(AbortReason.ABORTED_BY_JOBMANAGER)
        if self._is_newer(checkpoint_id):
            self._aborted_ahead.add(checkpoint_id)
        return ()

    # Transitions.

    def _start(
        self,
        channel: ChannelIndex,
        checkpoint_id: CheckpointId,
        kind: CheckpointKind,
        alignment: BarrierAlignment,
        now: float,
        priority: bool,
    ) -> tuple[Action, ...]:
        strategy = self._strategy_for(kind, alignment)
        if strategy is _Strategy.UNALIGNED and self._aligned_start and not priority:
            strategy = _Strategy.ALIGNED  # an in-order barrier: aligned until it times out
        fresh = _Pending(checkpoint_id, kind, alignment, strategy, now, frozenset(), ())
        if strategy is not _Strategy.UNALIGNED:
            return self._arrive(fresh, channel, now)
        pending = fresh.arrive(channel, now)
        others = sorted(self._waiting_for(pending))
        trigger = TriggerSnapshot(
            checkpoint_id, kind, now, now, capture_inflight=True, alignment=alignment, barriers=pending.arrivals
        )
        queued = CaptureQueued(channel, checkpoint_id)
        if not others:
            self._last_completed = checkpoint_id
            return (trigger, queued, InflightCaptureComplete(checkpoint_id, pending.arrivals))
        self._pending = pending
        return (trigger, queued, *(StartCapture(other, checkpoint_id) for other in others))

    def _arrive(self, pending: _Pending, channel: ChannelIndex, now: float) -> tuple[Action, ...]:
        self._pending = pending.arrive(channel, now)
        completed = self._complete_if_all_arrived(now, unblocked=frozenset({channel}))
        match pending.strategy:
            case _Strategy.ALIGNED:
                return completed or (BlockChannel(channel),)
            case _Strategy.TRACKING:
                return completed
            case _Strategy.UNALIGNED:
                return (
                    StopCapture(channel, pending.checkpoint_id),
                    CaptureQueued(channel, pending.checkpoint_id),
                    *completed,
                )

    def _switch_to_unaligned(self, pending: _Pending, channel: ChannelIndex, now: float) -> tuple[Action, ...]:
        """The aligning checkpoint's barrier on ``channel`` timed out into a priority one: snapshot now,
        release the blocked channels, capture the rest until their barriers."""
        checkpoint_id = pending.checkpoint_id
        switched = replace(pending.arrive(channel, now), strategy=_Strategy.UNALIGNED)
        trigger = TriggerSnapshot(
            checkpoint_id,
            pending.kind,
            pending.started_at,
            now,
            capture_inflight=True,
            alignment=pending.alignment,
            barriers=switched.arrivals,
        )
        actions: tuple[Action, ...] = (trigger,)
        if pending.arrived:
            actions += (UnblockChannels(tuple(sorted(pending.arrived))),)
        actions += (CaptureQueued(channel, checkpoint_id),)
        waiting = sorted(self._waiting_for(switched))
        if not waiting:
            self._pending = None
            self._last_completed = checkpoint_id
            return (*actions, InflightCaptureComplete(checkpoint_id, switched.arrivals))
        self._pending = switched
        return actions + tuple(StartCapture(other, checkpoint_id) for other in waiting)

    def _complete_if_all_arrived(self, now: float, unblocked: frozenset[ChannelIndex]) -> tuple[Action, ...]:
        """Complete the pending checkpoint if no live channel still owes its barrier. ``unblocked``:
        arrived channels that were never blocked (the one whose barrier arrives in this call)."""
        pending = self._pending
        if pending is None or self._waiting_for(pending):
            return ()
        self._pending = None
        self._last_completed = pending.checkpoint_id
        match pending.strategy:
            case _Strategy.ALIGNED:
                trigger = self._aligned_trigger(pending, now)
                blocked = pending.arrived - unblocked
                return (trigger, UnblockChannels(tuple(sorted(blocked)))) if blocked else (trigger,)
            case _Strategy.TRACKING:
                return (self._aligned_trigger(pending, now),)
            case _Strategy.UNALIGNED:
                return (InflightCaptureComplete(pending.checkpoint_id, pending.arrivals),)

    @staticmethod
    def _aligned_trigger(pending: _Pending, now: float) -> TriggerSnapshot:
        """The snapshot of a checkpoint whose every barrier is in (aligned or tracked)."""
        return TriggerSnapshot(
            pending.checkpoint_id,
            pending.kind,
            pending.started_at,
            now,
            alignment=pending.alignment,
            barriers=pending.arrivals,
        )

    def _abort_pending(self, reason: AbortReason) -> tuple[Action, ...]:
        pending = self._pending
        if pending is None:
            return ()
        self._pending = None
        checkpoint_id = pending.checkpoint_id
        released: tuple[Action, ...] = ()
        match pending.strategy:
            case _Strategy.ALIGNED:
                released = (UnblockChannels(tuple(sorted(pending.arrived))),)
            case _Strategy.UNALIGNED:
                waiting = sorted(self._waiting_for(pending))
                released = tuple(StopCapture(channel, checkpoint_id) for channel in waiting)
            case _Strategy.TRACKING:
                pass
        return (*released, AbortedCheckpoint(checkpoint_id, reason), ForwardCancellation(checkpoint_id))

    # Helpers.

    def _strategy_for(self, kind: CheckpointKind, alignment: BarrierAlignment) -> _Strategy:
        match self._mode:
            case CheckpointingMode.EXACTLY_ONCE:
                return _Strategy.ALIGNED
            case CheckpointingMode.AT_LEAST_ONCE:
                return _Strategy.TRACKING
            case CheckpointingMode.UNALIGNED:
                return _Strategy.UNALIGNED if self._may_be_unaligned(kind, alignment) else _Strategy.ALIGNED
            case _:
                assert_never(self._mode)

    @staticmethod
    def _may_be_unaligned(kind: CheckpointKind, alignment: BarrierAlignment) -> bool:
        """In unaligned mode: a checkpoint, unless its barrier is forced aligned; never a savepoint."""
        match alignment:
            case BarrierAlignment.BY_MODE:
                return kind is CheckpointKind.CHECKPOINT
            case BarrierAlignment.FORCED_ALIGNED:
                return False
            case _:
                assert_never(alignment)

    def _switchable(self, pending: _Pending) -> bool:
        """Whether a priority barrier (the aligned-checkpoint timeout) may switch it to unaligned."""
        return self._aligned_start and self._may_be_unaligned(pending.kind, pending.alignment)

    def _waiting_for(self, pending: _Pending) -> frozenset[ChannelIndex]:
        return self.live_channels - pending.arrived

    def _is_newer(self, checkpoint_id: CheckpointId) -> bool:
        return self._latest is None or checkpoint_id > self._latest

    def _advance_to(self, checkpoint_id: CheckpointId) -> None:
        self._latest = checkpoint_id
        self._aborted_ahead = {aborted for aborted in self._aborted_ahead if aborted > checkpoint_id}

    def _check_readable(self, channel: ChannelIndex, event: str, *, blocked_ok: bool = False) -> None:
        """``blocked_ok``: a barrier of a newer checkpoint, which may reach a blocked channel as a
        priority event (the JobManager aborted the aligning checkpoint and started the next one,
        unaligned, before its abort reached this task)."""
        if channel not in self._channels:
            raise InputProtocolError(
                f"task {self._task}: {event} on channel {channel}, but the task has "
                f"{len(self._channels)} input channels"
            )
        if channel in self._ended:
            raise InputProtocolError(f"task {self._task}: {event} on channel {channel} after its end of stream")
        if channel in self.blocked_channels and not blocked_ok:
            raise InputProtocolError(
                f"task {self._task}: {event} on channel {channel}, which is blocked while checkpoint "
                f"{self.pending_checkpoint} aligns; the input loop must not poll a blocked channel"
            )
