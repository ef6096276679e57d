from __future__ import annotations

import random
from collections import deque

import pytest

from weir.core.errors import ProtocolError
from weir.taskmanager.credit import InputChannelCredits, OutputChannelCredits


def test_receiver_grants_credit_as_buffers_are_consumed() -> None:
    receiver = InputChannelCredits(initial_credits=2)
    receiver.on_buffer_received()
    receiver.on_buffer_received()
    assert receiver.queued == 2 and receiver.outstanding == 0
    with pytest.raises(ProtocolError, match="overran its credit"):
        receiver.on_buffer_received()
    assert receiver.on_buffer_consumed() == 1
    assert receiver.outstanding == 1
    receiver.on_buffer_received()


def test_receiver_batches_announcements() -> None:
    receiver = InputChannelCredits(initial_credits=4, announce_threshold=3)
    for _ in range(4):
        receiver.on_buffer_received()
    assert receiver.on_buffer_consumed() == 0
    assert receiver.on_buffer_consumed() == 0
    assert receiver.on_buffer_consumed() == 3
    assert receiver.on_buffer_consumed() == 0
    assert receiver.unannounced == 1
    assert receiver.flush_announcement() == 1
    assert receiver.flush_announcement() == 0
    assert receiver.outstanding == 4


def test_consuming_from_empty_queue_is_an_error() -> None:
    receiver = InputChannelCredits(initial_credits=1)
    with pytest.raises(ProtocolError, match="empty"):
        receiver.on_buffer_consumed()


@pytest.mark.parametrize(("credits", "threshold"), [(0, 1), (2, 0), (2, 3)])
def test_receiver_validation(credits: int, threshold: int) -> None:
    with pytest.raises(ValueError):
        InputChannelCredits(credits, threshold)


def test_sender_never_sends_without_credit() -> None:
    sender = OutputChannelCredits(initial_credits=1, now_ms=0.0)
    sender.on_buffer_enqueued(0.0)
    sender.on_buffer_enqueued(0.0)
    assert sender.can_send()
    sender.on_buffer_sent(1.0)
    assert not sender.can_send()
    with pytest.raises(ProtocolError, match="without credit"):
        sender.on_buffer_sent(2.0)
    with pytest.raises(ProtocolError, match="at least one credit"):
        sender.add_credits(0, 2.0)
    sender.add_credits(3, 2.0)
    sender.on_buffer_sent(2.0)
    assert sender.backlog == 0
    sender.on_buffer_sent(2.0)  # sent without being enqueued first
    assert sender.backlog == 0 and sender.credits == 1
    with pytest.raises(ValueError):
        OutputChannelCredits(initial_credits=-1, now_ms=0.0)


def test_backpressure_time_accounting() -> None:
    sender = OutputChannelCredits(initial_credits=1, now_ms=0.0)
    sender.on_buffer_enqueued(0.0)
    sender.on_buffer_sent(0.0)
    assert not sender.is_backpressured  # no credit, but nothing to send either
    sender.on_buffer_enqueued(100.0)
    assert sender.is_backpressured
    assert sender.backpressured_ms(150.0) == 50.0
    sender.add_credits(1, 400.0)
    assert not sender.is_backpressured
    assert sender.backpressured_ms(900.0) == 300.0
    assert sender.sample_backpressured_ms_per_second(1000.0) == pytest.approx(300.0)
    sender.on_buffer_sent(1000.0)
    sender.on_buffer_enqueued(1000.0)
    sender.on_buffer_enqueued(1500.0)
    assert sender.sample_backpressured_ms_per_second(2000.0) == pytest.approx(1000.0)
    assert sender.sample_backpressured_ms_per_second(2000.0) == 0.0


def test_backpressure_starts_when_last_credit_is_used_with_backlog() -> None:
    sender = OutputChannelCredits(initial_credits=1, now_ms=0.0)
    sender.on_buffer_enqueued(0.0)
    sender.on_buffer_enqueued(0.0)
    sender.on_buffer_sent(10.0)
    assert sender.is_backpressured
    sender.add_credits(2, 30.0)
    assert sender.backpressured_ms(100.0) == 20.0


@pytest.mark.parametrize("seed", range(20))
def test_randomized_sender_receiver_simulation(seed: int) -> None:
    """Random producer, network and consumer speeds: credits bound the queue and nothing deadlocks."""
    rng = random.Random(seed)
    initial = rng.randint(1, 8)
    threshold = rng.randint(1, initial)
    receiver = InputChannelCredits(initial, threshold)
    now = 0.0
    sender = OutputChannelCredits(initial, now)
    to_receiver: deque[int] = deque()  # buffers in flight
    to_sender: deque[int] = deque()  # credit announcements in flight
    queue: deque[int] = deque()
    produced = sent = consumed = 0
    total = 2000
    produce_p, network_p, consume_p = rng.random() * 0.9 + 0.1, rng.random() * 0.9 + 0.1, rng.random() * 0.9 + 0.1
    steps = 0
    while consumed < total:
        steps += 1
        assert steps < 1_000_000, "flow control deadlocked"
        now += 1.0
        event = rng.random()
        if event < produce_p / 3 and produced < total:
            sender.on_buffer_enqueued(now)
            produced += 1
        if sender.can_send() and sender.backlog > 0 and rng.random() < 0.5:
            sender.on_buffer_sent(now)
            to_receiver.append(sent)
            sent += 1
        if to_receiver and rng.random() < network_p:
            receiver.on_buffer_received()
            queue.append(to_receiver.popleft())
        if to_sender and rng.random() < network_p:
            sender.add_credits(to_sender.popleft(), now)
        if queue and rng.random() < consume_p / 2:
            assert queue.popleft() == consumed
            consumed += 1
            announced = receiver.on_buffer_consumed()
            if announced:
                to_sender.append(announced)
        # Invariants.
        assert len(queue) == receiver.queued <= initial
        assert receiver.queued + receiver.outstanding + receiver.unannounced == initial
        assert sender.credits + len(to_receiver) + sum(to_sender) == receiver.outstanding
        assert sender.credits >= 0
        if sender.is_backpressured:
            assert sender.credits == 0 and sender.backlog > 0
    assert 0.0 <= sender.backpressured_ms(now) <= now


def test_sender_reads_the_monotonic_clock_when_no_time_is_given() -> None:
    sender = OutputChannelCredits()
    assert sender.credits == 0 and not sender.can_send()
    sender.on_buffer_enqueued()
    assert sender.is_backpressured
    assert sender.backpressured_ms() >= 0.0
    sender.add_credits(2)
    sender.on_buffer_sent()
    sender.on_buffer_sent()
    assert not sender.is_backpressured
    assert 0.0 <= sender.sample_backpressured_ms_per_second() <= 1000.0
