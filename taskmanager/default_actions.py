"""The default actions of a task's loop (``mailbox_processor.DefaultAction``), one per phase of its life.

A source task polls its source (:class:`PollSource`); once a bounded source has read everything it
waits for its final checkpoint (:class:`AwaitFinalCheckpoint`). A task with inputs takes buffers
from its input gate (:class:`ProcessInput`) until every channel ended. Every task then waits for the
notifications of the checkpoints it acknowledged (:class:`AwaitNotifications`), so that its sinks'
transactions commit through checkpoints before it ends. Flink's ``StreamTask`` likewise runs its
mailbox loop with ``processInput`` as the default action, then again, suspended, until the final
checkpoint completed (``afterInvoke``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Never, assert_never

from weir.core.errors import Fault, WeirError
from weir.core.watermarks import ReportsWatermarkStatus, WatermarkStatus
from weir.operators.base import SourceOperator
from weir.taskmanager.checkpointer import SubtaskCheckpointer
from weir.taskmanager.input_processor import InputProcessor
from weir.taskmanager.network.gate import ReceivedBuffer
from weir.taskmanager.task_metrics import TimeAccount
from weir.taskmanager.task_types import TaskAddress

SOURCE_BATCH = 500
SOURCE_IDLE_WAIT_MAX_S = 0.05
"""Longest rest between two polls of a source that had nothing to read (mails are handled during it)."""
FINAL_NOTIFICATION_TIMEOUT_S = 120.0


class CheckpointNotificationTimeout(WeirError):
    """A finished task never learnt whether its last checkpoints completed; the job restarts from the
    latest completed checkpoint (retriable)."""

    retriable = True
    fault = Fault.INTERNAL


class PollSource:
    """A source task's default action: poll a batch of records while the outputs can take them, rest
    a little after a poll that read nothing (``idle_wait_s``), read nothing more once drained (``weir
    stop --drain``). Finished when a bounded source has read all its input."""

    def __init__(
        self,
        source: SourceOperator,
        account: TimeAccount,
        records_emitted: Callable[[], int],
        announce: Callable[[WatermarkStatus], None],
    ) -> None:
        self._source = source
        self._status_of = source.watermark_status if isinstance(source, ReportsWatermarkStatus) else None
        self._account = account
        self._records_emitted = records_emitted
        self._announce = announce
        self._rest_until: float | None = None  # monotonic: the end of the rest after an empty poll
        self._drained = False
        self._ended = False

    def drain(self) -> None:
        """Stopping at a drained savepoint: read nothing more."""
        self._drained = True

    def _resting(self) -> bool:
        rest = self._rest_until
        if rest is None:
            return False
        if time.monotonic() < rest:
            return True
        self._rest_until = None
        return False

    def take(self, outputs_available: bool) -> SourceOperator | None:
        if self._drained or not outputs_available or self._resting():
            return None
        return self._source

    def held_back(self, outputs_available: bool) -> bool:
        return not outputs_available and not self._drained and not self._resting()

    def deadline(self) -> float | None:
        return self._rest_until

    def finished(self) -> bool:
        return self._ended

    def run(self, source: SourceOperator) -> None:
        before, read = self._records_emitted(), source.records_polled
        polled = time.monotonic()
        more = source.poll(source.poll_records or SOURCE_BATCH)
        now = time.monotonic()
        if source.records_polled == read:  # the poll waited for input that did not come
            self._account.add_idle(now - polled)
        if self._status_of is not None:
            self._announce(self._status_of())
        if not more:
            self._ended = True
        elif self._records_emitted() == before:
            wait = source.idle_wait_s()
            if wait > 0:
                self._rest_until = now + min(wait, SOURCE_IDLE_WAIT_MAX_S)


class ProcessInput:
    """A task with inputs: take the next buffer from the input gate (only priority events while its
    outputs cannot take more) and process it. Finished when every input channel ended."""

    def __init__(self, processor: InputProcessor) -> None:
        self._processor = processor

    def take(self, outputs_available: bool) -> ReceivedBuffer | None:
        return self._processor.take(outputs_available)

    def run(self, received: ReceivedBuffer) -> None:
        self._processor.process(received)

    def held_back(self, outputs_available: bool) -> bool:
        return not outputs_available

    def deadline(self) -> float | None:
        return None

    def finished(self) -> bool:
        return self._processor.ended


class AwaitFinalCheckpoint:
    """A bounded source read all its input and told the JobManager, which triggers a final
    checkpoint: only mails (that trigger, other checkpoints, notifications) until the final
    checkpoint completed, so that two-phase sinks commit everything through checkpoints (Flink's
    end-of-data protocol, FLIP-147)."""

    def __init__(self, checkpointer: SubtaskCheckpointer) -> None:
        self._checkpointer = checkpointer

    def take(self, outputs_available: bool) -> None:
        return None

    def run(self, work: Never) -> None:
        assert_never(work)

    def held_back(self, outputs_available: bool) -> bool:
        return False

    def deadline(self) -> float | None:
        return None

    def finished(self) -> bool:
        return self._checkpointer.final_completed


class AwaitNotifications:
    """End of input: only mails until every checkpoint this task acknowledged was notified complete
    or aborted (their sink transactions commit then); the task fails, retriably, if that takes more
    than ``timeout_s``."""

    def __init__(
        self, checkpointer: SubtaskCheckpointer, address: TaskAddress, timeout_s: float = FINAL_NOTIFICATION_TIMEOUT_S
    ) -> None:
        self._checkpointer = checkpointer
        self._address = address
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s

    def take(self, outputs_available: bool) -> float | None:
        """The deadline, once it passed (the step then fails the task)."""
        return self._deadline if time.monotonic() >= self._deadline else None

    def run(self, deadline: float) -> None:
        raise CheckpointNotificationTimeout(
            f"task {self._address}: no completion notice for checkpoint(s) {sorted(self._checkpointer.unconfirmed)} "
            f"within {self._timeout_s:.0f}s of the end of input"
        )

    def held_back(self, outputs_available: bool) -> bool:
        return False

    def deadline(self) -> float | None:
        return self._deadline

    def finished(self) -> bool:
        return not self._checkpointer.unconfirmed
