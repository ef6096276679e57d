"""The mailbox: one wait that a control mail or an input buffer ends, whichever comes first."""

from __future__ import annotations

import threading
import time
from typing import Any

from weir.core.ids import CheckpointId
from weir.taskmanager.mailbox import Cancel, CheckpointComplete, Mailbox
from weir.taskmanager.network.codec import watermark_message
from weir.taskmanager.network.gate import InputGate, ReceivedBuffer


def wait_in_thread(mailbox: Mailbox, take_input: Any) -> tuple[threading.Thread, list[Any]]:
    woken: list[Any] = []
    waiter = threading.Thread(target=lambda: woken.append(mailbox.wait(take_input, deadline=None)))
    waiter.start()
    return waiter, woken


def test_a_mail_wakes_a_wait_that_has_no_input_and_no_deadline() -> None:
    gate = InputGate([0])
    mailbox = Mailbox(gate.condition)
    waiter, woken = wait_in_thread(mailbox, gate.take)
    mailbox.put(CheckpointComplete(CheckpointId(3)))
    waiter.join(10)
    assert not waiter.is_alive() and woken == [CheckpointComplete(CheckpointId(3))]


def test_a_buffer_pushed_into_the_gate_wakes_the_same_wait() -> None:
    gate = InputGate([0, 0])
    mailbox = Mailbox(gate.condition)
    waiter, woken = wait_in_thread(mailbox, gate.take)
    gate.push(1, watermark_message(5))
    waiter.join(10)
    assert not waiter.is_alive()
    (item,) = woken
    assert isinstance(item, ReceivedBuffer) and item.channel == 1 and item.message.watermark == 5


def test_mails_go_before_queued_input() -> None:
    gate = InputGate([0])
    mailbox = Mailbox(gate.condition)
    gate.push(0, watermark_message(1))
    mailbox.put(Cancel())
    assert mailbox.wait(gate.take, deadline=None) == Cancel()
    assert isinstance(mailbox.wait(gate.take, deadline=None), ReceivedBuffer)
    assert mailbox.take() is None


def test_a_wait_ends_empty_at_its_deadline() -> None:
    mailbox = Mailbox()
    assert mailbox.wait_for_mail(time.monotonic() + 0.01) is None
