"""KeyedCoProcessOperator: one key's state and timers shared by both inputs, each input keyed by its
own key selector into the same key groups; snapshot, restore mid-stream and restore at another
parallelism give what an uninterrupted run gives."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.api import Collector, KeyedCoProcessFunction
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.operators.keyed import KeyedCoProcessOperator, KeyedProcessContext, OnTimerContext


class OrderPayments(KeyedCoProcessFunction):
    """Orders ``{"order": k, "amount": a}`` (first input) meet payments ``("pay", k, paid)`` (second):
    the first input keeps the amount, the second the paid total; a match emits, and an event-time
    timer 100 ms after the order emits an unpaid order's reminder."""

    def process_element1(self, value: dict[str, Any], ctx: KeyedProcessContext, out: Collector) -> None:
        ctx.value_state("amount").update(value["amount"])
        assert ctx.timestamp is not None
        ctx.timer_service().register_event_time_timer(ctx.timestamp + 100)
        self._check(ctx, out)

    def process_element2(self, value: tuple[str, Any, int], ctx: KeyedProcessContext, out: Collector) -> None:
        ctx.list_state("payments").add(value[2])
        self._check(ctx, out)

    def _check(self, ctx: KeyedProcessContext, out: Collector) -> None:
        amount = ctx.value_state("amount").value()
        paid = sum(ctx.list_state("payments").get())
        if amount is not None and paid >= amount:
            out.collect(("paid", ctx.key, paid))
            ctx.value_state("amount").clear()

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        amount = ctx.value_state("amount").value()
        if amount is not None:
            out.collect(("unpaid", ctx.key, amount, sum(ctx.list_state("payments").get())))


def order_key(value: dict[str, Any]) -> Any:
    return value["order"]


def payment_key(value: tuple[str, Any, int]) -> Any:
    return value[1]


def operator() -> KeyedCoProcessOperator:
    return KeyedCoProcessOperator(OrderPayments(), (order_key, payment_key))


def test_both_inputs_share_the_state_and_timers_of_a_key(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="co")
    op.process_input(0, {"order": "a", "amount": 10}, 5)
    op.process_input(1, ("pay", "b", 3), 6)  # b's payments, a is not touched
    op.process_input(1, ("pay", "a", 4), 7)
    op.process_input(0, {"order": "b", "amount": 3}, 8)  # b is paid already
    assert out.take() == [(("paid", "b", 3), 8)]
    op.process_input(1, ("pay", "a", 6), 9)
    assert out.take() == [(("paid", "a", 10), 9)]
    op.process_input(0, {"order": "c", "amount": 1}, 20)
    op.process_watermark(120)
    assert out.take() == [(("unpaid", "c", 1, 0), 120)]  # a's and b's timers found them paid
    assert out.watermarks == [120]


def test_equal_keys_of_either_input_are_one_key_whatever_their_record(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="co")
    op.process_input(0, {"order": 7, "amount": 2}, 1)
    op.process_input(1, ("pay", 7, 2), 2)
    assert out.values == [("paid", 7, 2)]
    assert op.current_key_group == key_group_for_key(7, 128)


def test_process_without_an_index_is_the_first_input(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="co")
    op.process({"order": "x", "amount": 0}, 3)
    assert out.values == [("paid", "x", 0)]


def test_an_input_index_other_than_0_or_1_is_refused(start_operator: StartOperator) -> None:
    op = operator()
    start_operator(op, uid="co")
    with pytest.raises(ValueError, match="inputs 0 and 1"):
        op.process_input(2, {"order": "x", "amount": 0}, 3)


# Restore -------------------------------------------------------------------------------------------

Event = tuple[str, int, Any, int | None]  # ("record", input, value, ts) or ("watermark", -1, None, wm)


def random_events(seed: int, n: int = 300) -> list[Event]:
    rng = random.Random(seed)
    events: list[Event] = []
    ts = 0
    for _ in range(n):
        ts += rng.randint(0, 10)
        key = f"k{rng.randint(0, 12)}"
        if rng.random() < 0.4:
            events.append(("record", 0, {"order": key, "amount": rng.randint(1, 20)}, ts))
        else:
            events.append(("record", 1, ("pay", key, rng.randint(1, 8)), ts))
        if rng.random() < 0.1:
            events.append(("watermark", -1, None, ts - 5))
    events.append(("watermark", -1, None, ts + 1000))
    return events


def feed(op: KeyedCoProcessOperator, events: list[Event]) -> None:
    for kind, index, value, ts in events:
        if kind == "record":
            op.process_input(index, value, ts)
        else:
            assert ts is not None
            op.process_watermark(ts)


def owner(value: Any, index: int, parallelism: int) -> int:
    key = order_key(value) if index == 0 else payment_key(value)
    kg = key_group_for_key(key, 128)
    return next(s for s in range(parallelism) if kg in key_group_range_for_subtask(128, parallelism, SubtaskIndex(s)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_restore_mid_stream_gives_what_an_uninterrupted_run_gives(start_operator: StartOperator, seed: int) -> None:
    events = random_events(seed)
    whole = operator()
    expected = start_operator(whole, uid="whole")
    feed(whole, events)

    cut = len(events) // 2
    before = operator()
    out_before = start_operator(before, uid="cut")
    feed(before, events[:cut])
    before.snapshot_state(1)
    after = operator()
    out_after = start_operator(after, uid="cut")
    feed(after, events[cut:])
    assert out_before.records + out_after.records == expected.records
    assert expected.records  # the run emitted something to compare


@pytest.mark.parametrize("seed", [4, 5])
def test_a_restore_at_another_parallelism_gives_what_an_uninterrupted_run_gives(
    start_operator: StartOperator, make_context: MakeContext, seed: int
) -> None:
    events = random_events(seed)
    whole = operator()
    expected = start_operator(whole, uid="whole")
    feed(whole, events)

    cut = len(events) // 3
    before = operator()
    out_before = start_operator(before, uid="scaled")
    feed(before, events[:cut])
    before.snapshot_state(1)

    outs: list[CollectingOutput] = []
    ops: list[KeyedCoProcessOperator] = []
    for subtask in range(3):
        op = operator()
        out = CollectingOutput()
        op.setup(make_context("scaled", subtask=subtask, parallelism=3), out)
        op.open()
        ops.append(op)
        outs.append(out)
    for kind, index, value, ts in events[cut:]:
        if kind == "record":
            ops[owner(value, index, 3)].process_input(index, value, ts)
        else:
            assert ts is not None
            for op in ops:
                op.process_watermark(ts)
    got = out_before.records + [r for out in outs for r in out.records]
    assert sorted(got, key=repr) == sorted(expected.records, key=repr)
