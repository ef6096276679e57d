"""The operators of one vertex wired into a chain, and the input side that feeds its head.

A record's path through a subtask reads in order: the head (a source, or the input gate through
:class:`ChainInput`) -> the chained operators -> an :class:`EdgeOutput` per network edge (a record
writer in a cluster, a direct call into the next chain in the reference run). An operator's side
outputs (``ctx.output(tag, value)``) go to the chained operators and edges that take that tag only;
its watermarks go to all of them. Everything is bound when the chain is built; nothing is rebound
while it runs.

The cluster's Task and ``weir.tools.reference`` both drive this class, so chain wiring, watermark
handling into the head, end of input and snapshots are one code path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex
from weir.core.process_functions import OutputTag
from weir.core.watermarks import StatusWatermarkValve, ValveOutput, WatermarkStatus, WatermarkTracker
from weir.operators.base import (
    NO_SIDE_OUTPUTS,
    ChainOutput,
    InheritedState,
    OperatorContext,
    Output,
    SideOutputs,
    SourceOperator,
    StreamOperator,
)
from weir.operators.keyed import KeyedOperator
from weir.plan import Vertex


class EdgeOutput(Protocol):
    """Where records leave the chain along one edge to another vertex."""

    def emit(self, value: Any, timestamp: int | None) -> None: ...
    def emit_watermark(self, watermark: int) -> None: ...
    def end_of_stream(self) -> None:
        """Everything before was emitted; the consumer's channel ends."""


class FanOut:
    """One operator's output to several places: chained successors first, then its edges."""

    __slots__ = ("_outputs",)

    def __init__(self, outputs: Sequence[Output]) -> None:
        self._outputs = tuple(outputs)

    def emit(self, value: Any, timestamp: int | None) -> None:
        for o in self._outputs:
            o.emit(value, timestamp)

    def emit_watermark(self, watermark: int) -> None:
        for o in self._outputs:
            o.emit_watermark(watermark)


class MainOutput:
    """The output of an operator some of whose side outputs are taken: records go to the consumers
    of its main output, watermarks to every consumer, main and side (as in Flink)."""

    __slots__ = ("emit", "emit_watermark")

    def __init__(self, main: Output, every: Output) -> None:
        self.emit: Callable[[Any, int | None], None] = main.emit
        self.emit_watermark: Callable[[int], None] = every.emit_watermark


def _one_output(outputs: Sequence[Output]) -> Output:
    return outputs[0] if len(outputs) == 1 else FanOut(outputs)


class SourceWatermarkTap:
    """The output of a chain's head source: records go straight through (``emit`` is the next
    output's own, bound once: no call in between), the last watermark it emitted is kept (for the
    task's watermark gauge and its idle/active logs)."""

    __slots__ = ("_inner", "emit", "watermark")

    def __init__(self, inner: Output) -> None:
        self._inner = inner
        self.emit: Callable[[Any, int | None], None] = inner.emit
        self.watermark: int | None = None

    def emit_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        self._inner.emit_watermark(watermark)


class OperatorChain:
    """The operators of ``vertex`` in chain order (head first), each set up with its output.

    ``operator_of`` builds the operator of a uid (the job's factory in a cluster, a capture or a
    replayed source in the reference run); ``edge_outputs[i]`` carries ``vertex.outputs[i]``;
    ``context_of`` gives each operator its context."""

    def __init__(
        self,
        vertex: Vertex,
        operator_of: Callable[[str], StreamOperator],
        edge_outputs: Sequence[EdgeOutput],
        context_of: Callable[[str], OperatorContext],
    ) -> None:
        if len(edge_outputs) != len(vertex.outputs):
            raise ValueError(
                f"vertex {vertex.uid!r} has {len(vertex.outputs)} output edges, given {len(edge_outputs)} outputs"
            )
        self.vertex = vertex
        self.by_uid: dict[str, StreamOperator] = {uid: operator_of(uid) for uid in vertex.operator_uids}
        self.operators: tuple[StreamOperator, ...] = tuple(self.by_uid.values())
        self.head = self.operators[0]
        self.edge_outputs = tuple(edge_outputs)
        self.source_tap: SourceWatermarkTap | None = None
        for uid, op in self.by_uid.items():
            # Chained successors first, then edges; each takes the main output or a tag's.
            targets: list[tuple[OutputTag | None, Output]] = [
                (vertex.chained_side_outputs.get(s), ChainOutput(self.by_uid[s])) for s in vertex.chained.get(uid, [])
            ]
            targets += [
                (edge.side_output, out)
                for out, edge in zip(edge_outputs, vertex.outputs, strict=True)
                if edge.producer_operator == uid
            ]
            main = [out for tag, out in targets if tag is None]
            output = _one_output(main)
            side_outputs = NO_SIDE_OUTPUTS
            if len(main) < len(targets):
                sides: dict[str, list[Output]] = {}
                for tag, out in targets:
                    if tag is not None:
                        sides.setdefault(tag.name, []).append(out)
                side_outputs = SideOutputs({name: _one_output(outs) for name, outs in sides.items()})
                output = MainOutput(output, _one_output([out for _tag, out in targets]))
            if op is self.head and isinstance(op, SourceOperator):
                output = self.source_tap = SourceWatermarkTap(output)
            op.setup(context_of(uid), output, side_outputs)

    @property
    def source(self) -> SourceOperator | None:
        """The head, when the chain starts with a source."""
        return self.head if isinstance(self.head, SourceOperator) else None

    @property
    def keyed_operators(self) -> tuple[KeyedOperator, ...]:
        return tuple(op for op in self.operators if isinstance(op, KeyedOperator))

    @property
    def broadcast_operator_uids(self) -> frozenset[str]:
        """The operators whose state is broadcast state (stored once per distinct copy)."""
        return frozenset(uid for uid, op in self.by_uid.items() if op.holds_broadcast_state)

    # Lifecycle, in the order a subtask runs it.

    def prepare_restore(self) -> None:
        """Each operator starts what its restore will wait for (see ``StreamOperator.prepare_restore``)."""
        for op in self.operators:
            op.prepare_restore()

    def restore(self, operator_states: Mapping[str, bytes]) -> None:
        """Each operator's own state from a checkpoint (keyed state is restored into the backend); a
        state that cannot be read is a SerializationError naming the operator."""
        for uid, op in self.by_uid.items():
            blob = operator_states.get(uid)
            if blob is not None:
                try:
                    op.restore_state(blob)
                except SerializationError as exc:
                    raise SerializationError(f"operator {uid!r} ({type(op).__name__}): {exc}") from exc

    def restore_inherited(self, states: Mapping[str, Sequence[InheritedState]]) -> None:
        """Each operator's share of a retained checkpoint of another job (``weir.core.rescale``): every
        operator is told, an operator the checkpoint holds no state of with no states."""
        for uid, op in self.by_uid.items():
            op.restore_inherited_state(states.get(uid, ()))

    def open(self, each: Callable[[str, Callable[[], None]], None] | None = None) -> None:
        """Open the operators from the last to the head, so that each one's output is open before it
        emits; ``each(uid, open)`` may wrap every call (the reference run names the failing operator)."""
        for uid, op in reversed(self.by_uid.items()):
            if each is None:
                op.open()
            else:
                each(uid, op.open)

    def end_input(self) -> None:
        """The chain's input ended: every operator flushes in chain order, then every edge ends."""
        for op in self.operators:
            op.end_input()
        for out in self.edge_outputs:
            out.end_of_stream()

    def snapshot(self, checkpoint_id: int) -> dict[str, bytes]:
        """Every operator's own state for the checkpoint by uid (sinks pre-commit, keyed operators
        flush their caches into the backend)."""
        states: dict[str, bytes] = {}
        for uid, op in self.by_uid.items():
            blob = op.snapshot_state(checkpoint_id)
            if blob is not None:
                states[uid] = blob
        return states

    def next_processing_time(self) -> int | None:
        """The earliest processing-time timer (epoch ms) of any operator; None: none has one."""
        times = [t for op in self.operators if (t := op.next_processing_time()) is not None]
        return min(times) if times else None

    def on_processing_time(self, now_ms: int) -> None:
        """The wall clock reached ``now_ms``: every operator with a timer due by then fires it."""
        for op in self.operators:
            due = op.next_processing_time()
            if due is not None and due <= now_ms:
                op.on_processing_time(now_ms)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_aborted(checkpoint_id)

    def close(self, on_error: Callable[[str, Exception], None]) -> None:
        """Close every operator; one failing to close does not stop the others."""
        for uid, op in self.by_uid.items():
            try:
                op.close()
            except Exception as exc:  # closing must not hide the task's real outcome
                on_error(uid, exc)


def _no_status_change(_status: WatermarkStatus) -> None:
    return None


def _no_watermark_change(_watermark: int) -> None:
    return None


class ChainInput:
    """The input side of a chain fed by channels: records into the head, each channel's watermark,
    idleness and end of stream combined (Flink's StatusWatermarkValve) into the head's watermark.

    ``channel_inputs[c]`` is the head's input that channel ``c`` feeds (0, or 1 for the second input
    of a two-input operator). ``announce`` is told when the chain's output goes idle or active (before
    the watermark that comes with going active, after the last one when going idle);
    ``watermark_advanced`` of every new combined watermark."""

    def __init__(
        self,
        chain: OperatorChain,
        channel_inputs: Sequence[int],
        announce: Callable[[WatermarkStatus], None] = _no_status_change,
        watermark_advanced: Callable[[int], None] = _no_watermark_change,
    ) -> None:
        self._head = chain.head
        self._two_inputs = len(set(channel_inputs)) > 1
        self._channel_inputs = tuple(channel_inputs)
        self.tracker = WatermarkTracker(len(channel_inputs))
        self._valve = StatusWatermarkValve(self.tracker)
        self._announce = announce
        self._watermark_advanced = watermark_advanced

    @property
    def all_ended(self) -> bool:
        return self.tracker.all_ended

    def record(self, channel: ChannelIndex, value: Any, timestamp: int | None) -> None:
        self._apply(self._valve.on_records(channel))  # a record ends the channel's idleness
        if self._two_inputs:
            self._head.process_input(self._channel_inputs[channel], value, timestamp)
        else:
            self._head.process(value, timestamp)

    def records(self, channel: ChannelIndex, values: Sequence[Any], timestamps: Sequence[int | None]) -> None:
        if not values:
            return
        self._apply(self._valve.on_records(channel))
        head = self._head
        if self._two_inputs:
            input_index = self._channel_inputs[channel]
            for value, ts in zip(values, timestamps, strict=True):
                head.process_input(input_index, value, ts)
        else:
            process = head.process
            for value, ts in zip(values, timestamps, strict=True):
                process(value, ts)

    def watermark(self, channel: ChannelIndex, watermark: int) -> None:
        self._apply(self._valve.on_watermark(channel, watermark))

    def idle(self, channel: ChannelIndex) -> None:
        self._apply(self._valve.on_idle(channel))

    def active(self, channel: ChannelIndex) -> None:
        self._apply(self._valve.on_active(channel))

    def end_of_stream(self, channel: ChannelIndex) -> None:
        """The channel ended (its watermark no longer holds the others back). Once every channel
        ended, the driver ends the chain's input (a task first waits for its checkpoints' notices)."""
        self._apply(self._valve.on_end_of_stream(channel))

    def _apply(self, change: ValveOutput) -> None:
        if change.status is WatermarkStatus.ACTIVE:
            self._announce(change.status)
        advanced = change.watermark
        if advanced is not None:
            self._watermark_advanced(advanced)
            self._head.process_watermark(advanced)
        if change.status is WatermarkStatus.IDLE:
            self._announce(change.status)
