"""The one loop of a task's thread, after Flink's ``MailboxProcessor`` and ``MailboxDefaultAction``.

Each iteration waits on the mailbox for a mail or for the work of the *default action*, whichever
comes first (mails first), handles what came, then runs the loop's *duties*. The default action is
what the task does when no mail is waiting, one step at a time: poll its source, take a buffer from
its input gate, wait for its final checkpoint, wait for the last notifications. The task runs one
default action after the other through the same loop; the loop knows none of them.

Whatever the default action, every iteration, in one place:

- the wait ends no later than the earliest deadline of the duties and of the action;
- the time of the wait is accounted as backpressured when the action holds work back because its
  outputs cannot take more (Flink's output availability), else as idle;
- every duty runs (processing-time timers, buffer timeouts, the aligned-checkpoint timeout, the
  metrics sync), each doing what is due: a deadline is due once ``now >= deadline``.

Backpressure is a property the loop checks (``outputs_available``) and hands to the action: a
backpressured action takes only what needs no output (an input task its priority events); mails are
handled all the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from weir.taskmanager.mailbox import (
    Cancel,
    CheckpointAborted,
    CheckpointComplete,
    Mail,
    Mailbox,
    RunInTask,
    TriggerCheckpoint,
)

Work = TypeVar("Work")


class DefaultAction(Protocol[Work]):
    """What a task does between mails (Flink's ``MailboxDefaultAction``), one step at a time."""

    def take(self, outputs_available: bool) -> Work | None:
        """The work of the next step if it is ready now, else None (the loop waits). Called with the
        mailbox's condition held, so that an input and a mail wake the task through one signal; so
        it must not block."""

    def run(self, work: Work) -> None:
        """Do one step's work, on the task thread; mails wait until it returns."""

    def held_back(self, outputs_available: bool) -> bool:
        """Whether the action has work it does not take because its outputs cannot take more: the
        loop's wait is then backpressured time, not idle time."""

    def deadline(self) -> float | None:
        """When (monotonic) :meth:`take` answers without being woken (e.g. a source's rest ends);
        None: only a wake-up makes it answer."""

    def finished(self) -> bool:
        """Whether the action has nothing more to do: the loop returns to the task."""


class Duty(Protocol):
    """What the loop does once per iteration, whatever its default action: due once ``now >= deadline``."""

    def deadline(self) -> float | None:
        """When (monotonic) the duty is next due; None: nothing is pending."""

    def run_due(self, now: float) -> None:
        """Do what is due at ``now`` (monotonic), nothing otherwise."""


class WaitAccount(Protocol):
    """Where the loop books the time it waited (``task_metrics.TimeAccount``)."""

    def add_idle(self, seconds: float) -> None: ...
    def start_backpressure(self, now: float) -> None: ...
    def end_backpressure(self, now: float) -> None: ...


class MailboxProcessor:
    """Runs a task's default actions between its mails; see the module. Pure: it reaches the task
    only through what it is given, so it is tested with fakes and no network."""

    def __init__(
        self,
        mailbox: Mailbox,
        on_mail: Callable[[Mail], None],
        outputs_available: Callable[[], bool],
        duties: Sequence[Duty],
        waits: WaitAccount,
    ) -> None:
        self._mailbox = mailbox
        self._on_mail = on_mail
        self._outputs_available = outputs_available
        self._duties = tuple(duties)
        self._waits = waits

    def run(self, action: DefaultAction[Any]) -> None:
        """Run ``action`` until it is finished, handling every mail that comes meanwhile."""
        mailbox, outputs_available, account = self._mailbox, self._outputs_available, self._waits

        def take() -> Any:
            return action.take(outputs_available())

        def deadline() -> float | None:
            return self.next_deadline(action)

        while not action.finished():
            held_back = action.held_back(outputs_available())
            started = time.monotonic()
            if held_back:
                account.start_backpressure(started)
            item = mailbox.wait(take, deadline)
            now = time.monotonic()
            if held_back:
                account.end_backpressure(now)
            else:
                account.add_idle(now - started)
            match item:
                case None:  # a deadline passed
                    pass
                case TriggerCheckpoint() | CheckpointComplete() | CheckpointAborted() | Cancel() | RunInTask():
                    self._on_mail(item)
                case _:
                    action.run(item)
            self.run_duties()

    def next_deadline(self, action: DefaultAction[Any]) -> float | None:
        """When the loop must wake without a mail or input: the earliest deadline of its duties and
        of ``action``; None when none is pending."""
        earliest = action.deadline()
        for duty in self._duties:
            due = duty.deadline()
            if due is not None and (earliest is None or due < earliest):
                earliest = due
        return earliest

    def run_duties(self) -> None:
        """Every duty, in order, does what is due now."""
        now = time.monotonic()
        for duty in self._duties:
            duty.run_due(now)

    def drain(self) -> None:
        """Handle every mail queued now, without waiting (the task's last act before it closes)."""
        while (mail := self._mailbox.take()) is not None:
            self._on_mail(mail)
