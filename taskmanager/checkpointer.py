"""A subtask's part in checkpoints, after Flink's ``SubtaskCheckpointCoordinatorImpl``.

The task hands it what the JobManager and the barrier aligner decide (a trigger at a source, a
snapshot once the barriers are in, a capture of in-flight records, an abort, a notification); it
snapshots the chain's operators, sends the barrier on through the task's outputs (in order, or ahead
of their queues for an unaligned checkpoint), starts the keyed snapshot's upload and acknowledges
once the upload (and for an unaligned checkpoint, the in-flight capture) is done. It keeps what a
checkpoint needs between those steps: the trigger time each pending barrier carries, the in-flight
capture under way, the halves of an unaligned acknowledgement, the checkpoints not yet confirmed and
the final ones.

It is a one-way collaborator of the task: it reaches the chain only through ``snapshot_operators``,
the network only through :class:`~weir.taskmanager.network.writer.TaskOutputs`, and the TaskManager
only through :class:`~weir.taskmanager.task_types.TaskCallbacks`. Everything runs on the task thread
except the upload's completion, which joins on :class:`UnalignedAck` (thread-safe) or acknowledges
directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, assert_never

from weir.core.checkpointing import (
    BarrierAlignment,
    ChannelBarrierTime,
    CheckpointingMode,
    CheckpointKind,
    SubtaskCheckpointTimeline,
)
from weir.core.crashpoints import crash_point
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid
from weir.core.keygroups import KeyGroupRange
from weir.core.task_state import SubtaskLayout
from weir.taskmanager import barrier_aligner as ba
from weir.taskmanager.inflight import INFLIGHT_STATE_NAME, InflightCapture, InputOrigin, OutputTarget, encode_inflight
from weir.taskmanager.mailbox import CheckpointRequest
from weir.taskmanager.network.codec import ChannelBuffer, barrier_message, cancel_barrier_message
from weir.taskmanager.network.writer import TaskOutputs
from weir.taskmanager.snapshots import TaskKeyedState
from weir.taskmanager.task_types import ChainSnapshot, CheckpointAck, TaskAddress, TaskCallbacks


@dataclass(frozen=True)
class BarrierTimes:
    """When a checkpoint's barriers reached the task, up to its snapshot (epoch seconds): the first
    barrier (at a source, the trigger), each channel's so far, the alignment's end."""

    first_barrier_at: float
    alignment_end_at: float
    barriers: tuple[ba.BarrierArrival, ...] = ()


class UnalignedAck:
    """Joins the two halves of an unaligned checkpoint's acknowledgement, which finish on different
    threads: the snapshot's (after its keyed upload, on the snapshotter's thread) and the in-flight
    capture's (on the task thread, once the last barrier arrived). The ack goes out when both are in."""

    __slots__ = ("_ack", "_buffer_bytes", "_channels", "_dropped", "_inflight", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ack: CheckpointAck | None = None
        self._inflight: bytes | None = None
        self._buffer_bytes = 0
        self._channels: tuple[ChannelBarrierTime, ...] = ()  # every channel's barrier, known at the capture's end
        self._dropped = False

    def snapshot_done(self, ack: CheckpointAck) -> CheckpointAck | None:
        with self._lock:
            self._ack = ack
            return self._ready()

    def inflight_done(
        self, inflight: bytes, buffer_bytes: int, channels: tuple[ChannelBarrierTime, ...]
    ) -> CheckpointAck | None:
        with self._lock:
            self._inflight = inflight
            self._buffer_bytes = buffer_bytes
            self._channels = channels
            return self._ready()

    def drop(self) -> None:
        with self._lock:
            self._dropped = True

    def _ready(self) -> CheckpointAck | None:
        ack, inflight = self._ack, self._inflight
        if self._dropped or ack is None or inflight is None:
            return None
        self._dropped = True  # sent once
        states = {**ack.snapshot.operator_states, INFLIGHT_STATE_NAME: inflight}
        timeline = replace(ack.timeline, channels=self._channels) if ack.timeline is not None else None
        return replace(
            ack,
            snapshot=replace(ack.snapshot, operator_states=states),
            timeline=timeline,
            inflight_bytes=self._buffer_bytes,
        )


def barrier_alignment_of(request: CheckpointRequest) -> BarrierAlignment:
    """The alignment of the barrier a source sends for a triggered checkpoint: a final checkpoint's
    is forced aligned in every mode (FLIP-147), so that every record before it reaches the sinks
    before they pre-commit at it and nothing lies in flight behind it; a rescale's too (``aligned``),
    so that the job is redeployed at another parallelism from state alone, with no in-flight records
    to redistribute; any other as the mode says."""
    return BarrierAlignment.FORCED_ALIGNED if request.final or request.aligned else BarrierAlignment.BY_MODE


@dataclass(frozen=True)
class CheckpointTopology:
    """What of the task's plan a checkpoint records: each input channel's edge (``origins``) and
    producer subtask (``upstream``, for the timeline), and each output's edge (``targets``)."""

    origins: Mapping[ChannelIndex, InputOrigin]
    targets: Mapping[int, OutputTarget]
    upstream: Mapping[ChannelIndex, tuple[str, int]]


class SubtaskCheckpointer:
    """One subtask's checkpoints, from trigger or barriers to acknowledgement; see the module."""

    def __init__(
        self,
        *,
        address: TaskAddress,
        taskmanager_id: str,
        log: Any,
        mode: CheckpointingMode,
        aligned_timeout_s: float,
        snapshot_operators: Callable[[int], dict[str, bytes]],
        outputs: TaskOutputs,
        layout: SubtaskLayout,
        broadcast_operator_uids: frozenset[str] = frozenset(),
        keyed_state: TaskKeyedState | None,
        keyed_ranges: Sequence[tuple[OperatorUid, KeyGroupRange]],
        topology: CheckpointTopology,
        callbacks: TaskCallbacks,
    ) -> None:
        self._address = address
        self._taskmanager_id = taskmanager_id
        self._log = log
        self._mode = mode
        self._aligned_timeout_s = aligned_timeout_s  # > 0: an unaligned checkpoint starts aligned
        self._snapshot_operators = snapshot_operators
        self._outputs = outputs
        self._layout = layout
        self._broadcast_uids = broadcast_operator_uids
        self._keyed_state = keyed_state
        self._keyed_ranges = list(keyed_ranges)
        self._topology = topology
        self._callbacks = callbacks
        self.capture: InflightCapture | None = None  # the in-flight records of the pending unaligned checkpoint
        self._unaligned_acks: dict[CheckpointId, UnalignedAck] = {}  # awaiting their snapshot or capture
        self._barrier_times: dict[CheckpointId, float] = {}  # the trigger time each pending barrier carries
        self._full_barriers: set[CheckpointId] = set()  # pending checkpoints whose barriers say "full"
        self._unconfirmed: set[int] = set()  # checkpoints snapshotted here, not yet notified complete/aborted
        self._final_checkpoints: set[int] = set()  # final checkpoints this source took part in
        self._final_completed = False
        # A final checkpoint's barrier went out: no record follows it, and no processing-time timer
        # fires any more (Flink quiesces the processing-time service before the final checkpoint):
        # what it emitted would reach the sinks after they pre-committed at the final checkpoint.
        self._final_barrier_sent = False

    # What the task's loop asks -------------------------------------------------------------------

    @property
    def final_completed(self) -> bool:
        """A final checkpoint this source took part in completed: its stream may end."""
        return self._final_completed

    @property
    def final_barrier_sent(self) -> bool:
        """A forced aligned (final) barrier went out: nothing more is emitted, no timer fires."""
        return self._final_barrier_sent

    @property
    def unconfirmed(self) -> frozenset[int]:
        """The checkpoints snapshotted here whose completion or abort was not notified yet."""
        return frozenset(self._unconfirmed)

    # Triggers ------------------------------------------------------------------------------------

    def trigger(self, request: CheckpointRequest) -> None:
        """The JobManager triggered a checkpoint at this source: snapshot now."""
        if request.final:
            self._final_checkpoints.add(request.checkpoint_id)
        self._log.info(
            "checkpoint_triggered_at_source",
            checkpoint_id=request.checkpoint_id,
            final=request.final,
            full=request.full,
        )
        now = time.time()
        self._checkpoint(
            request,
            alignment_s=0.0,
            start_delay_s=max(0.0, now - request.timestamp),
            times=BarrierTimes(first_barrier_at=now, alignment_end_at=now),
            alignment=barrier_alignment_of(request),
        )

    def barrier_arrived(self, checkpoint_id: CheckpointId, triggered_at: float, *, full: bool = False) -> None:
        """A barrier of ``checkpoint_id`` came in, carrying the time its checkpoint was triggered and
        whether it is a full checkpoint (every barrier of one checkpoint says the same)."""
        self._barrier_times.setdefault(checkpoint_id, triggered_at)
        if full:
            self._full_barriers.add(checkpoint_id)

    def snapshot_on_barriers(self, action: ba.TriggerSnapshot) -> None:
        """The aligner decided the snapshot (the barriers are in, or the first one of an unaligned
        checkpoint): snapshot, and start the capture of what is still in flight if it says so."""
        checkpoint_id = action.checkpoint_id
        timestamp = self._barrier_times.pop(checkpoint_id, time.time())
        full = checkpoint_id in self._full_barriers
        self._full_barriers.discard(checkpoint_id)
        alignment_s = action.alignment_duration
        if action.capture_inflight:
            self.capture = InflightCapture(checkpoint_id, self._topology.origins, self._topology.targets)
            self._unaligned_acks[checkpoint_id] = UnalignedAck()
        self._checkpoint(
            CheckpointRequest(checkpoint_id, timestamp, action.kind, full=full),
            alignment_s=alignment_s,
            start_delay_s=max(0.0, time.time() - timestamp - alignment_s),
            times=BarrierTimes(action.alignment_started_at, action.triggered_at, action.barriers),
            alignment=action.alignment,
        )

    # Aborts and notifications --------------------------------------------------------------------

    def cancel_downstream(self, checkpoint_id: CheckpointId) -> None:
        """Send a cancellation marker on every output, so that downstream stops waiting for it."""
        self._outputs.broadcast(cancel_barrier_message(checkpoint_id))

    def abort_on_barriers(self, checkpoint_id: CheckpointId, reason: ba.AbortReason) -> None:
        """The aligner gave the checkpoint up: drop what it held, and decline it unless the JobManager
        aborted it (it knows)."""
        self._barrier_times.pop(checkpoint_id, None)
        self._full_barriers.discard(checkpoint_id)
        self._drop_unaligned(checkpoint_id)
        self._log.info("checkpoint_alignment_aborted", checkpoint_id=checkpoint_id, reason=reason.value)
        if reason is not ba.AbortReason.ABORTED_BY_JOBMANAGER:
            self._callbacks.on_decline(self._address, checkpoint_id, reason.value)

    def notify_complete(self, checkpoint_id: CheckpointId) -> None:
        """Checkpoint ``checkpoint_id`` completed: it and every older one are confirmed."""
        self._unconfirmed = {c for c in self._unconfirmed if c > checkpoint_id}
        self._final_completed = self._final_completed or any(c <= checkpoint_id for c in self._final_checkpoints)

    def notify_aborted(self, checkpoint_id: CheckpointId) -> None:
        """The JobManager aborted the checkpoint (after the aligner let go of it): its capture and its
        half-joined ack go (e.g. its capture complete, its upload not yet)."""
        self._unconfirmed.discard(checkpoint_id)
        self._drop_unaligned(checkpoint_id)

    # The in-flight capture of an unaligned checkpoint ---------------------------------------------

    def start_capture(self, checkpoint_id: CheckpointId, channel: ChannelIndex) -> None:
        self._capture_of(checkpoint_id).start(channel)

    def stop_capture(self, checkpoint_id: CheckpointId, channel: ChannelIndex) -> None:
        self._capture_of(checkpoint_id).stop(channel)

    def capture_queued(
        self, checkpoint_id: CheckpointId, channel: ChannelIndex, queued: Iterable[ChannelBuffer]
    ) -> None:
        """What the channel's priority barrier overtook belongs to the checkpoint, in order."""
        self._capture_of(checkpoint_id).add_queued(channel, queued)

    def complete_capture(self, checkpoint_id: CheckpointId, barriers: tuple[ba.BarrierArrival, ...]) -> None:
        """Every barrier of the unaligned checkpoint arrived: its in-flight records join its operator
        state; the ack goes out once the snapshot's upload is done too."""
        state = self._capture_of(checkpoint_id).complete()
        self.capture = None
        join = self._unaligned_acks.pop(checkpoint_id, None)
        self._log.info(
            "inflight_capture_complete",
            checkpoint_id=checkpoint_id,
            buffers=state.buffer_count,
            inflight_bytes=state.size_bytes,
            channels=sorted(state.channels),
        )
        if join is None:  # aborted meanwhile
            return
        ack = join.inflight_done(encode_inflight(state), state.size_bytes, self._channel_times(barriers))
        if ack is not None:
            self._send_ack(ack)

    def _capture_of(self, checkpoint_id: CheckpointId) -> InflightCapture:
        capture = self.capture
        if capture is None or capture.checkpoint_id != checkpoint_id:
            raise ba.InputProtocolError(
                f"task {self._address}: the aligner named checkpoint {checkpoint_id}'s in-flight capture, but "
                f"the capture under way is {capture.checkpoint_id if capture is not None else 'none'}"
            )
        return capture

    def _drop_unaligned(self, checkpoint_id: CheckpointId) -> None:
        """The checkpoint was given up: its capture and its half-joined ack go."""
        if self.capture is not None and self.capture.checkpoint_id == checkpoint_id:
            self.capture = None
        join = self._unaligned_acks.pop(checkpoint_id, None)
        if join is not None:
            join.drop()

    # Snapshot, upload, acknowledgement -----------------------------------------------------------

    def _checkpoint(
        self,
        request: CheckpointRequest,
        alignment_s: float,
        start_delay_s: float,
        times: BarrierTimes,
        alignment: BarrierAlignment,
    ) -> None:
        """Snapshot every operator (sinks pre-commit, keyed operators flush their caches), forward the
        barrier with ``alignment``, take the RocksDB snapshot; its upload runs in the background and
        the ack follows it."""
        cid = request.checkpoint_id
        join = self._unaligned_acks.get(cid)  # an unaligned checkpoint's: the ack also waits for its capture
        started = time.perf_counter()
        states = self._snapshot_operators(cid)
        self._outputs.flush()
        barrier = barrier_message(cid, request.timestamp, request.kind, alignment, full=request.full)
        capture = self.capture if self.capture is not None and self.capture.checkpoint_id == cid else None
        if alignment is BarrierAlignment.FORCED_ALIGNED:
            self._final_barrier_sent = True
        if self._unaligned_snapshot(request, capture, alignment):
            # The barrier overtakes what the outputs queue; that belongs to the checkpoint (FLIP-76).
            own = capture if capture is not None else InflightCapture(cid, targets=self._topology.targets)
            for edge, overtaken_per_channel in enumerate(self._outputs.broadcast_priority(barrier)):
                for channel, overtaken in enumerate(overtaken_per_channel):
                    own.add_outputs((edge, channel), overtaken)
            if capture is None:  # a source: no input to capture, its in-flight state is complete
                states = {**states, INFLIGHT_STATE_NAME: encode_inflight(own.complete())}
        else:
            self._outputs.broadcast(barrier)
        self._unconfirmed.add(cid)
        operators_s = time.perf_counter() - started
        self._log.info("checkpoint_barrier_forwarded", checkpoint_id=cid, alignment_s=round(alignment_s, 4))

        def timeline(sync_end_at: float, async_end_at: float) -> SubtaskCheckpointTimeline:
            return SubtaskCheckpointTimeline(
                first_barrier_at=times.first_barrier_at,
                channels=self._channel_times(times.barriers),
                alignment_end_at=times.alignment_end_at,
                sync_end_at=sync_end_at,
                async_end_at=async_end_at,
            )

        if not self._keyed_ranges or self._keyed_state is None:
            snapshot = ChainSnapshot(self._address, cid, states, self._layout, None, request.kind, self._broadcast_uids)
            done = time.time()
            ack = CheckpointAck(snapshot, alignment_s, start_delay_s, operators_s, 0.0, timeline(done, done))
            self._deliver_ack(ack, join)
            return
        future = self._keyed_state.snapshotter.begin(
            JobId(self._address.job_id),
            cid,
            self._keyed_ranges,
            request.kind,
            attempt=self._address.attempt,
            full=request.full,
        )
        sync_end_at = time.time()

        def uploaded(done: Future[Any]) -> None:
            try:
                result = done.result()
            except Exception as exc:  # the upload failed: the checkpoint cannot complete
                self._log.warning("snapshot_upload_failed", checkpoint_id=cid, error=str(exc))
                self._callbacks.on_decline(self._address, cid, f"snapshot upload failed: {exc}")
                return
            crash_point(
                "during_snapshot_upload",
                task=str(self._address),
                checkpoint_id=cid,
                taskmanager=self._taskmanager_id,
                subtask=self._address.subtask,
            )
            self._log.info(
                "snapshot_uploaded",
                checkpoint_id=cid,
                uploaded_bytes=result.uploaded_bytes,
                files=result.uploaded_files,
                async_s=round(result.async_duration_s, 4),
            )
            snapshot = ChainSnapshot(
                self._address, cid, states, self._layout, result.handle, request.kind, self._broadcast_uids
            )
            self._deliver_ack(
                CheckpointAck(
                    snapshot,
                    alignment_s,
                    start_delay_s,
                    operators_s + result.sync_duration_s,
                    result.async_duration_s,
                    timeline(sync_end_at, max(sync_end_at, time.time())),
                ),
                join,
            )

        future.add_done_callback(uploaded)

    def _unaligned_snapshot(
        self, request: CheckpointRequest, capture: InflightCapture | None, alignment: BarrierAlignment
    ) -> bool:
        """Whether this snapshot is unaligned, so its barrier goes out as a priority event: in unaligned
        mode, a checkpoint (not a savepoint, not a forced aligned final checkpoint) unless it starts
        aligned (aligned-checkpoint-timeout) and this task did not switch it (it captures nothing in
        flight: a source, or aligned to the end). An aligned barrier that then waits in a consumer's
        queue past the timeout is turned there (never a forced aligned one)."""
        if self._mode is not CheckpointingMode.UNALIGNED or request.kind is not CheckpointKind.CHECKPOINT:
            return False
        match alignment:
            case BarrierAlignment.FORCED_ALIGNED:
                if capture is not None:
                    raise ba.InputProtocolError(
                        f"task {self._address}: checkpoint {request.checkpoint_id} is forced aligned but captured "
                        "records in flight"
                    )
                return False
            case BarrierAlignment.BY_MODE:
                return capture is not None or self._aligned_timeout_s <= 0
            case _:
                assert_never(alignment)

    def _channel_times(self, barriers: Iterable[ba.BarrierArrival]) -> tuple[ChannelBarrierTime, ...]:
        """Every input channel with its barrier's arrival, None for one whose barrier has not come."""
        arrived = {b.channel: b.at for b in barriers}
        return tuple(
            ChannelBarrierTime(channel, vertex, subtask, arrived.get(channel))
            for channel, (vertex, subtask) in sorted(self._topology.upstream.items())
        )

    def _deliver_ack(self, ack: CheckpointAck, join: UnalignedAck | None) -> None:
        """The snapshot half is done (any thread): send it, or for an unaligned checkpoint hand it to
        its join (taken when the snapshot began), which sends it once the in-flight capture is complete
        as well, and never if the checkpoint was given up meanwhile."""
        if join is not None:
            ack_now = join.snapshot_done(ack)
            if ack_now is None:
                return
            ack = ack_now
        self._send_ack(ack)

    def _send_ack(self, ack: CheckpointAck) -> None:
        self._callbacks.on_checkpoint(self._address, ack)
        self._log.info(
            "checkpoint_acknowledged",
            checkpoint_id=ack.snapshot.checkpoint_id,
            sync_s=round(ack.sync_s, 4),
            inflight_bytes=ack.inflight_bytes,
        )
