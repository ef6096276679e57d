"""A task's mailbox (Flink's MailboxProcessor): the one thing its thread waits on.

Control mails (trigger a checkpoint, a checkpoint completed or was aborted, cancel) come from other
threads; the input gate's buffers arrive through the same condition, so a buffer and a mail wake
the task alike and an input task never polls on an interval. Mails go before buffers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId


@dataclass(frozen=True)
class CheckpointRequest:
    checkpoint_id: CheckpointId
    timestamp: float
    kind: CheckpointKind
    final: bool = False  # the job's final checkpoint: every bounded source has ended
    drain: bool = False  # weir stop --drain: emit the end of event time before the barrier
    aligned: bool = False  # forced aligned in every mode (a rescale's checkpoint)
    full: bool = False  # weir checkpoint --full: the RocksDB snapshots reuse no file of an earlier checkpoint


@dataclass(frozen=True)
class TriggerCheckpoint:
    """The JobManager triggers a checkpoint at this source task."""

    request: CheckpointRequest


@dataclass(frozen=True)
class CheckpointComplete:
    """Checkpoint ``checkpoint_id`` completed on every task: commit what it (and older ones) cover."""

    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class CheckpointAborted:
    """Checkpoint ``checkpoint_id`` will never complete."""

    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class Cancel:
    """Stop the task: a fail-over or a cancel of its job."""


@dataclass(frozen=True)
class RunInTask:
    """An operator's action to run on the task's thread (its ``mailbox_executor``): e.g. emit the
    results of asynchronous calls that completed on another thread."""

    action: Callable[[], None]


Mail = TriggerCheckpoint | CheckpointComplete | CheckpointAborted | Cancel | RunInTask

Input = TypeVar("Input")


class Mailbox:
    """Control mails in order, and a wait that wakes on a mail or on input, whichever comes first.

    ``condition`` is shared with the input gate (its notifications wake the waiting task); without a
    gate the mailbox has a condition of its own."""

    def __init__(self, condition: threading.Condition | None = None) -> None:
        self._condition = condition if condition is not None else threading.Condition()
        self._mails: deque[Mail] = deque()

    def put(self, mail: Mail) -> None:
        """From any thread: queue ``mail`` and wake the task."""
        with self._condition:
            self._mails.append(mail)
            self._condition.notify_all()

    def notify(self) -> None:
        """From any thread: wake the task to re-check what it waits for (an output became available)."""
        with self._condition:
            self._condition.notify_all()

    def take(self) -> Mail | None:
        """The next mail, without waiting."""
        with self._condition:
            return self._mails.popleft() if self._mails else None

    def wait(
        self, take_input: Callable[[], Input | None], deadline: float | Callable[[], float | None] | None
    ) -> Mail | Input | None:
        """The next mail, else the next input ``take_input`` answers (it is called with the shared
        condition held), waiting until one comes; None once ``deadline`` (monotonic) passed. A
        callable ``deadline`` is asked (with the condition held) only when the wait would block, once:
        a task that has input ready does not compute when it would otherwise wake."""
        with self._condition:
            ask = deadline if callable(deadline) else None
            until = None if callable(deadline) else deadline
            while True:
                if self._mails:
                    return self._mails.popleft()
                item = take_input()
                if item is not None:
                    return item
                if ask is not None:
                    until, ask = ask(), None
                if until is None:
                    self._condition.wait()
                    continue
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return None
                self._condition.wait(remaining)

    def wait_for_mail(self, deadline: float | None) -> Mail | None:
        """The next mail, waiting for it until ``deadline`` (monotonic); None if none came."""
        return self.wait(_no_input, deadline)


def _no_input() -> None:
    return None
