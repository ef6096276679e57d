"""A task's input side: buffers from its input gate into its chain, barriers through its aligner
(Flink's ``StreamOneInputProcessor`` over a ``CheckpointedInputGate``).

Each buffer's records go to the chain's head (through :class:`~weir.taskmanager.chain.ChainInput`,
which keeps each channel's watermark), and are captured first when an unaligned checkpoint is
collecting what is in flight. Its event (watermark, idle/active, barrier, cancellation marker, end of
stream) goes to the chain input or to the barrier aligner, whose actions this class carries out:
block and unblock channels on the gate, and hand every checkpoint decision to the task's
:class:`~weir.taskmanager.checkpointer.SubtaskCheckpointer`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, assert_never

from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.metrics import TaskMetrics
from weir.taskmanager import barrier_aligner as ba
from weir.taskmanager.barrier_aligner import BarrierAligner
from weir.taskmanager.chain import ChainInput
from weir.taskmanager.checkpointer import SubtaskCheckpointer
from weir.taskmanager.network.codec import (
    Barrier,
    CancelBarrier,
    ChannelBuffer,
    ChannelEvent,
    EndOfStream,
    WatermarkActive,
    WatermarkEvent,
    WatermarkIdle,
    message_of,
    read_buffer,
)
from weir.taskmanager.network.gate import InputGate, ReceivedBuffer
from weir.taskmanager.restorer import InflightReplay


class InputProcessor:
    """Feeds one task's chain from its input gate; see the module. Task thread only."""

    def __init__(
        self,
        gate: InputGate,
        chain_input: ChainInput,
        aligner: BarrierAligner,
        checkpointer: SubtaskCheckpointer,
        metrics: TaskMetrics,
        log: Any,
    ) -> None:
        self._gate = gate
        self._chain_input = chain_input
        self._aligner = aligner
        self._checkpointer = checkpointer
        self._metrics = metrics
        self._log = log
        self.records_in = 0
        self.ended = False  # every input channel delivered its end of stream

    @property
    def chain_input(self) -> ChainInput:
        return self._chain_input

    def take(self, outputs_available: bool) -> ReceivedBuffer | None:
        """The next buffer, without waiting; a backpressured task takes only priority events."""
        return self._gate.take() if outputs_available else self._gate.take_priority()

    def process(self, received: ReceivedBuffer) -> None:
        """One buffer: captured if an unaligned checkpoint collects its channel, its records into the
        chain, then its event."""
        buffer = read_buffer(received.message)
        capture = self._checkpointer.capture
        if capture is not None:
            capture.add(received.channel, received.message)
        if buffer.values:
            self.records_in += message_of(received.message).record_count
            self._metrics.bytes_in.inc(buffer.size_bytes)
            self._chain_input.records(received.channel, buffer.values, buffer.timestamps)
        if buffer.event is not None:
            priority = message_of(received.message).priority
            self._on_event(received.channel, buffer.event, priority=priority, overtaken=received.overtaken)

    def replay(self, replay: InflightReplay | None) -> None:
        """The restored in-flight input into the chain, channel by channel, before any new input: it
        was sent before the checkpoint's barrier but read after the snapshot."""
        if replay is None:
            return
        before = self.records_in
        for channel, message in replay.inputs:
            self.process(ReceivedBuffer(channel, self._gate.channels[channel].gate, message))
        self._log.info(
            "inflight_records_replayed",
            checkpoint_id=replay.checkpoint_id,
            records=self.records_in - before,
            buffers=len(replay.inputs),
            channels=sorted({channel for channel, _ in replay.inputs}),
            redistributed=replay.redistributed,
        )

    def abort(self, checkpoint_id: CheckpointId) -> None:
        """The JobManager aborted the checkpoint: the aligner lets go of it."""
        self.apply(self._aligner.abort(checkpoint_id))

    def _on_event(
        self,
        channel: ChannelIndex,
        event: ChannelEvent,
        *,
        priority: bool = False,
        overtaken: tuple[ChannelBuffer, ...] = (),
    ) -> None:
        chain_input, aligner = self._chain_input, self._aligner
        match event:
            case WatermarkEvent(watermark=watermark):
                chain_input.watermark(channel, watermark)
            case WatermarkIdle():
                chain_input.idle(channel)
            case WatermarkActive():
                chain_input.active(channel)
            case EndOfStream():
                chain_input.end_of_stream(channel)
                self.apply(aligner.on_end_of_stream(channel, now=time.time()))
            case Barrier(checkpoint_id=checkpoint_id, timestamp=timestamp, kind=kind, full=full):
                self._log.info(
                    "checkpoint_barrier_received",
                    checkpoint_id=checkpoint_id,
                    channel=channel,
                    priority=priority,
                    alignment=event.alignment.value,
                    overtaken_buffers=len(overtaken),
                )
                self._checkpointer.barrier_arrived(checkpoint_id, timestamp, full=full)
                actions = aligner.on_barrier(
                    channel, checkpoint_id, kind, now=time.time(), priority=priority, alignment=event.alignment
                )
                self.apply(actions, overtaken)
            case CancelBarrier(checkpoint_id=checkpoint_id):
                self.apply(aligner.on_cancellation(channel, checkpoint_id))
            case _:
                assert_never(event)

    def apply(self, actions: Iterable[ba.Action], overtaken: tuple[ChannelBuffer, ...] = ()) -> None:
        """Carry out what the barrier aligner decided, every action in order; ``overtaken``: what the
        priority barrier being handled overtook on its channel (a CaptureQueued captures it)."""
        gate, checkpointer = self._gate, self._checkpointer
        for action in actions:
            match action:
                case ba.BlockChannel(channel=channel):
                    gate.block(channel)
                case ba.UnblockChannels(channels=channels):
                    gate.unblock(channels)
                case ba.TriggerSnapshot():
                    checkpointer.snapshot_on_barriers(action)
                case ba.ForwardCancellation(checkpoint_id=checkpoint_id):
                    checkpointer.cancel_downstream(checkpoint_id)
                case ba.AbortedCheckpoint(checkpoint_id=checkpoint_id, reason=reason):
                    checkpointer.abort_on_barriers(checkpoint_id, reason)
                case ba.StartCapture(channel=channel, checkpoint_id=checkpoint_id):
                    checkpointer.start_capture(checkpoint_id, channel)
                case ba.StopCapture(channel=channel, checkpoint_id=checkpoint_id):
                    checkpointer.stop_capture(checkpoint_id, channel)
                case ba.CaptureQueued(channel=channel, checkpoint_id=checkpoint_id):
                    checkpointer.capture_queued(checkpoint_id, channel, overtaken)
                case ba.InflightCaptureComplete(checkpoint_id=checkpoint_id, barriers=barriers):
                    checkpointer.complete_capture(checkpoint_id, barriers)
                case ba.AllChannelsEnded():
                    self.ended = True
                case _:
                    assert_never(action)
