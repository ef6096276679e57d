"""The task's one loop, driven with fake default actions and duties (no task, no network): mails go
between steps, every duty runs once per iteration whatever the action did, the wait ends at the
earliest deadline, and a wait is booked as backpressured exactly when the action is held back by its
outputs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from weir.core.ids import CheckpointId
from weir.taskmanager.mailbox import CheckpointComplete, Mail, Mailbox
from weir.taskmanager.mailbox_processor import MailboxProcessor


@dataclass
class Log:
    """Every call the loop makes into the fakes, in order."""

    entries: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, *entry: Any) -> None:
        self.entries.append(entry)

    def names(self) -> list[str]:
        return [e[0] for e in self.entries]


@dataclass
class Steps:
    """A default action with ``work`` items ready, one per step; finished once they are done (or once
    ``done`` says so). ``held`` tells whether it holds work back while the outputs are unavailable."""

    log: Log
    work: list[str]
    held: bool = True
    own_deadline: float | None = None
    done: Callable[[], bool] | None = None
    seen_availability: list[bool] = field(default_factory=list)

    def take(self, outputs_available: bool) -> str | None:
        self.seen_availability.append(outputs_available)
        return self.work[0] if self.work and outputs_available else None

    def run(self, work: str) -> None:
        self.log.add("run", work)
        self.work.pop(0)

    def held_back(self, outputs_available: bool) -> bool:
        return self.held and not outputs_available and bool(self.work)

    def deadline(self) -> float | None:
        return self.own_deadline

    def finished(self) -> bool:
        return self.done() if self.done is not None else not self.work


@dataclass
class FakeDuty:
    """A duty due at ``at`` (monotonic; None: never); counts the iterations it was asked to run."""

    log: Log
    name: str
    at: float | None = None
    runs: int = 0
    fired_at: list[float] = field(default_factory=list)

    def deadline(self) -> float | None:
        return self.at

    def run_due(self, now: float) -> None:
        self.runs += 1
        if self.at is not None and now >= self.at:
            self.fired_at.append(now)
            self.log.add("fired", self.name)
            self.at = None


@dataclass
class Waits:
    """The time account the loop books its waits into."""

    idle: list[float] = field(default_factory=list)
    backpressured: list[tuple[float, float]] = field(default_factory=list)
    _since: float | None = None

    def add_idle(self, seconds: float) -> None:
        self.idle.append(seconds)

    def start_backpressure(self, now: float) -> None:
        assert self._since is None, "a backpressured wait started twice"
        self._since = now

    def end_backpressure(self, now: float) -> None:
        assert self._since is not None, "a backpressured wait ended without a start"
        self.backpressured.append((self._since, now))
        self._since = None


def processor(
    log: Log, duties: list[FakeDuty], waits: Waits, available: Callable[[], bool] = lambda: True
) -> tuple[MailboxProcessor, Mailbox]:
    mailbox = Mailbox()

    def on_mail(mail: Mail) -> None:
        log.add("mail", mail)

    return MailboxProcessor(mailbox, on_mail, available, duties, waits), mailbox


def test_every_duty_runs_once_per_iteration_whatever_the_action_did() -> None:
    log, waits = Log(), Waits()
    duties = [FakeDuty(log, "timers"), FakeDuty(log, "flush"), FakeDuty(log, "metrics")]
    loop, mailbox = processor(log, duties, waits)
    mailbox.put(CheckpointComplete(CheckpointId(1)))
    loop.run(Steps(log, ["a", "b", "c"]))
    assert log.names() == ["mail", "run", "run", "run"]  # the queued mail first, then one step per iteration
    assert [d.runs for d in duties] == [4, 4, 4]  # four iterations: the mail's and the three steps'


def test_a_mail_that_comes_during_the_steps_is_handled_between_two_of_them() -> None:
    log, waits = Log(), Waits()
    loop, mailbox = processor(log, [], waits)

    class MailsDuringFirstStep(Steps):
        def run(self, work: str) -> None:
            super().run(work)
            if work == "a":
                mailbox.put(CheckpointComplete(CheckpointId(2)))

    loop.run(MailsDuringFirstStep(log, ["a", "b"]))
    assert log.entries == [("run", "a"), ("mail", CheckpointComplete(CheckpointId(2))), ("run", "b")]


def test_the_wait_ends_at_the_earliest_deadline_of_the_duties_and_the_action() -> None:
    log, waits = Log(), Waits()
    start = time.monotonic()
    soon, later = FakeDuty(log, "soon", start + 0.05), FakeDuty(log, "later", start + 60.0)
    loop, _ = processor(log, [later, soon], waits)
    loop.run(Steps(log, [], done=lambda: bool(soon.fired_at)))  # no work: only the deadline wakes it
    assert soon.fired_at[0] >= start + 0.05
    assert time.monotonic() - start < 5.0, "the wait did not end at the earliest deadline"
    assert later.fired_at == []
    action = Steps(log, [], own_deadline=start + 0.01)
    assert loop.next_deadline(action) == start + 0.01  # the action's own deadline counts too
    assert loop.next_deadline(Steps(log, [])) == later.at


@pytest.mark.parametrize("held", [True, False])
def test_a_wait_is_backpressured_exactly_when_the_action_is_held_back_by_its_outputs(held: bool) -> None:
    log, waits = Log(), Waits()
    outputs = {"available": False}
    start = time.monotonic()
    release = FakeDuty(log, "credit", start + 0.05)  # the consumer grants credit: the outputs are available

    def credit_arrives() -> bool:
        if release.fired_at:
            outputs["available"] = True
        return outputs["available"]

    loop, _ = processor(log, [release], waits, available=credit_arrives)
    action = Steps(log, ["a"], held=held)
    loop.run(action)
    assert log.entries[-1] == ("run", "a") and False in action.seen_availability
    if held:
        assert sum(end - begin for begin, end in waits.backpressured) >= 0.04
        assert sum(waits.idle) < 0.04
    else:
        assert waits.backpressured == []
        assert sum(waits.idle) >= 0.04


def test_drain_handles_every_queued_mail_without_waiting() -> None:
    log, waits = Log(), Waits()
    loop, mailbox = processor(log, [], waits)
    mailbox.put(CheckpointComplete(CheckpointId(1)))
    mailbox.put(CheckpointComplete(CheckpointId(2)))
    loop.drain()
    assert log.entries == [("mail", CheckpointComplete(CheckpointId(1))), ("mail", CheckpointComplete(CheckpointId(2)))]
    loop.drain()  # nothing queued: returns at once
    assert len(log.entries) == 2
