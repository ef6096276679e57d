"""The operator contract every runtime operator follows, and the chain that links them.

Records travel as ``(value, timestamp)``; the timestamp is event time in epoch ms or None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import structlog

from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError
from weir.core.keygroups import KeyGroupRange
from weir.core.process_functions import OutputTag
from weir.core.rejections import FAIL, NO_KEY, Firing, OnRecordError, SourcePosition
from weir.core.state_backend import KeyedStateBackend
from weir.operators.rejections import CapturedDeadLetters, RecordRejections, rejected_by_function

NO_PARAMETERS: Mapping[str, str] = MappingProxyType({})
"""The parameters of a job that has none (an operator checked on its own)."""


class StateNotRedistributableError(JobDefinitionError):
    """An operator's state cannot be handed to a job at another parallelism."""


@dataclass(frozen=True)
class InheritedState:
    """One old subtask's state of this operator (its ``snapshot_state`` bytes), from a retained
    checkpoint restored into a new job (``weir run --from-checkpoint``), with where that subtask sat."""

    subtask: int
    parallelism: int
    key_group_range: KeyGroupRange
    data: bytes


class Output(Protocol):
    """Where an operator sends what it produces."""

    def emit(self, value: Any, timestamp: int | None) -> None: ...
    def emit_watermark(self, watermark: int) -> None: ...


class SideOutputs:
    """Where an operator's side outputs go, by tag name (the chain binds them, as it binds the main
    output): a value emitted to a tag nothing takes is dropped, as in Flink."""

    __slots__ = ("_by_name",)

    def __init__(self, by_name: Mapping[str, Output] | None = None) -> None:
        self._by_name = dict(by_name or {})

    def emit(self, tag: OutputTag, value: Any, timestamp: int | None) -> None:
        """``value`` (at ``timestamp``) to side output ``tag``."""
        out = self._by_name.get(tag.name)
        if out is not None:
            out.emit(value, timestamp)

    def takes(self, tag: OutputTag) -> bool:
        """Whether anything takes side output ``tag`` (else what is emitted to it is dropped)."""
        return tag.name in self._by_name


NO_SIDE_OUTPUTS: SideOutputs = SideOutputs()
"""The side outputs of an operator none of whose side outputs is taken."""


def check_output_tag(uid: str, tag: Any) -> OutputTag:
    """``tag`` as given to ``ctx.output``: an OutputTag, else a JobDefinitionError."""
    if not isinstance(tag, OutputTag):
        raise JobDefinitionError(f"operator {uid!r}: ctx.output takes an OutputTag and a value, got tag {tag!r}")
    return tag


class DeadLetters(Protocol):
    """Where a source sends records it could not read, with the reason."""

    def send(self, raw: bytes | None, key: bytes | None, reason: str, origin: str) -> None: ...


@dataclass
class OperatorContext:
    """What a subtask tells its operators about where they run."""

    job_id: str
    job_name: str
    uid: str
    subtask: int
    parallelism: int
    max_parallelism: int
    attempt: int
    key_group_range: KeyGroupRange
    parameters: Mapping[str, str]
    state: KeyedStateBackend | None
    """The subtask's keyed state (the task binds it once the chain is built); None where no operator is keyed."""
    dead_letters: DeadLetters | None = None
    log: Any = field(default_factory=lambda: structlog.get_logger("weir.operator"))
    metrics: Any = None  # weir.core.metrics.TaskMetrics
    rejections: RecordRejections | None = None  # None: rejected records are kept in memory (a reference run)
    mailbox_executor: Callable[[Callable[[], None]], None] | None = None
    """Runs an action on the task's thread, between records (Flink's ``MailboxExecutor``): how work
    completed on another thread (an async I/O call) reaches the operator. None: no task loop (an
    in-process run), the operator completes such work before it returns."""


class StreamOperator:
    """Base class with the default behaviour of every hook."""

    ctx: OperatorContext
    output: Output
    side_outputs: SideOutputs = NO_SIDE_OUTPUTS
    on_error: OnRecordError = FAIL
    """What happens to a record this operator's user function raises on (see :meth:`reject`)."""
    holds_broadcast_state: ClassVar[bool] = False
    """Its ``snapshot_state`` is its copy of a state every subtask holds the same (broadcast state): the
    TaskManager stores it content-addressed, once per distinct copy (``weir.core.broadcast_state``)."""

    def setup(self, ctx: OperatorContext, output: Output, side_outputs: SideOutputs = NO_SIDE_OUTPUTS) -> None:
        """Bind the operator to where it runs: ``output`` takes its records and watermarks (a
        watermark reaches its side outputs' consumers too), ``side_outputs`` what it emits by tag."""
        self.ctx = ctx
        self.output = output
        self.side_outputs = side_outputs

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """Called by the JobManager on an operator built only for this, before any task starts: check
        what the operator needs of its external system (a topic, a table) and raise
        JobDefinitionError (or ServiceUnavailableError) with one clear line; create nothing.
        ``parameters``: the job's, as its tasks will see them (``ctx.parameters``: its Kafka settings)."""

    def open(self) -> None:
        """Called once before the first record, after any restore."""

    def process(self, value: Any, timestamp: int | None) -> None:
        raise NotImplementedError(f"{type(self).__name__} takes no input")

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        self.process(value, timestamp)

    def process_watermark(self, watermark: int) -> None:
        self.output.emit_watermark(watermark)

    def next_processing_time(self) -> int | None:
        """The earliest processing time (epoch ms) at which the task must call
        :meth:`on_processing_time`; None: no processing-time timer. The task waits no longer than that."""
        return None

    def on_processing_time(self, now_ms: int) -> None:
        """The wall clock reached ``now_ms`` (epoch ms), at or past :meth:`next_processing_time`:
        fire the processing-time timers due by then."""

    def end_input(self) -> None:
        """All inputs ended (a bounded job reached its end): flush what is buffered."""

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        """Operator (non-keyed) state for checkpoint ``checkpoint_id``; keyed state lives in the backend."""
        return None

    def prepare_restore(self) -> None:
        """The subtask is about to restore from a checkpoint: start, without waiting for it, slow
        preparation that ``restore_state`` or ``open`` will need anyway, so that it overlaps the
        download of the keyed state (a transactional sink fences its predecessor's producer). Called
        once per attempt, before any state is restored, only when the attempt restores."""

    def restore_state(self, data: bytes) -> None:
        """Load what ``snapshot_state`` returned in the restored checkpoint (a restart of this job:
        the same subtask at the same parallelism)."""

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        """Take this operator's state from a retained checkpoint of another job, restored at this
        subtask's parallelism, which may differ: ``states`` holds the state of every old subtask of
        the operator (a union), and the operator keeps what is this subtask's own.

        The default suits state that belongs to one subtask index: at the same parallelism it is
        restored as by ``restore_state``; at another one, state that cannot be split raises
        StateNotRedistributableError. Operators whose state can be split override this."""
        if not states:
            return
        old_parallelism = states[0].parallelism
        if old_parallelism == self.ctx.parallelism:
            for state in states:
                if state.subtask == self.ctx.subtask:
                    self.restore_state(state.data)
            return
        raise StateNotRedistributableError(
            f"operator {self.ctx.uid!r} ({type(self).__name__}) keeps per-subtask state that cannot be "
            f"redistributed from parallelism {old_parallelism} to {self.ctx.parallelism}: restore it at "
            f"parallelism {old_parallelism}"
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed on every task: commit what it covers."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def close(self) -> None:
        """Release resources; called on finish, cancel and failure."""

    def reject(
        self,
        function: Any,
        exc: Exception,
        value: Any,
        timestamp: int | None,
        key: Any = NO_KEY,
        *,
        firing: Firing | None = None,
    ) -> None:
        """Called in the ``except`` around ``function`` (the operator's user function) when it raised
        ``exc`` on record ``value``: by :attr:`on_error`, raise a UserFunctionError that names the
        record (fail), or send the record to the dead-letter topic and return (the operator then
        drops it). An exception that only passed up through the function (from an operator chained
        after it, a sink, the network) is raised again as it is. ``firing``: the function raised on a
        timer or window firing, not a record (``value``: what the firing gave it; no timestamp)."""
        if not rejected_by_function(exc, self, StreamOperator):
            raise exc
        ctx = self.ctx
        if ctx.rejections is None:
            ctx.rejections = RecordRejections(ctx.job_id, ctx.subtask, CapturedDeadLetters(), ctx.log)
        ctx.rejections.reject(ctx.uid, self.on_error, function, exc, value, timestamp, key, firing=firing)


class SourceOperator(StreamOperator):
    """A source: the task calls ``poll`` in a loop and checks for barriers between calls."""

    records_polled: int = 0
    """Records taken from the input so far, counted per poll: a poll that read none waited for input
    (the task counts its time as idle)."""

    poll_records: int | None = None
    """How many records the task asks for per poll; None: the task's default. A columnar source asks
    for more, so that each record batch spreads its fixed costs over more rows."""

    def poll(self, max_records: int) -> bool:
        """Emit up to ``max_records`` records; return False once a bounded source is exhausted."""
        raise NotImplementedError

    def idle_wait_s(self) -> float:
        """How long the task may wait before the next poll when the last one emitted nothing."""
        return 0.0

    def position_in_flight(self) -> SourcePosition | None:
        """Where the record this source is emitting now was read, asked by an operator chained to it
        while the emit is on the stack (on the exception path only); None: this source cannot say."""
        return None


class ChainOutput:
    """Feeds one operator's output into the next operator of the same chain."""

    __slots__ = ("emit", "emit_watermark")

    def __init__(self, next_operator: StreamOperator) -> None:
        self.emit: Callable[[Any, int | None], None] = next_operator.process
        self.emit_watermark: Callable[[int], None] = next_operator.process_watermark
