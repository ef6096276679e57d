"""The async I/O operator (``stream.async_map``): order, watermarks, capacity, timeouts, checkpoints.

A ``Service`` stands in for the outside service the user's ``async def`` calls: each call waits until
the test releases its value, so the order in which calls complete is the test's. Results reach the
operator's output only through its mailbox executor (here a list the test runs), as on a task.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import Environment
from weir.core.errors import JobDefinitionError
from weir.core.rejections import UserFunctionError
from weir.core.watermarks import MAX_WATERMARK
from weir.operators.async_io import AsyncMapOperator
from weir.operators.base import InheritedState

DEADLINE_S = 10.0


@dataclass
class Service:
    """Answers ``call(v)`` with ``v * 10`` once the test released ``v``."""

    released: set[Any] = field(default_factory=set)
    started: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def call(self, value: Any) -> Any:
        with self.lock:
            self.started.append(value)
        while True:
            with self.lock:
                if value in self.released:
                    break
            await asyncio.sleep(0.001)
        if value == "boom":
            raise ValueError("the service refused boom")
        return value * 10

    def release(self, *values: Any) -> None:
        with self.lock:
            self.released.update(values)


@dataclass
class Mailbox:
    """The task's mailbox as the operator sees it: actions queued from the loop's thread."""

    actions: list[Callable[[], None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def execute(self, action: Callable[[], None]) -> None:
        with self.lock:
            self.actions.append(action)

    def run(self) -> int:
        with self.lock:
            actions, self.actions = self.actions, []
        for action in actions:
            action()
        return len(actions)


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.002)


def run_mail_until(mailbox: Mailbox, condition: Callable[[], bool], what: str) -> None:
    def ran() -> bool:
        mailbox.run()
        return condition()

    until(ran, what)


def start(
    make_context: MakeContext,
    op: AsyncMapOperator,
    mailbox: Mailbox | None,
    restore: bytes | None = None,
    **context: Any,
) -> CollectingOutput:
    ctx = make_context("enrich", **context)
    ctx.mailbox_executor = mailbox.execute if mailbox is not None else None
    output = CollectingOutput()
    op.setup(ctx, output)
    if restore is not None:
        op.restore_state(restore)
    op.open()
    return output


def test_ordered_mode_emits_in_input_order_and_holds_watermarks_behind_results(make_context: MakeContext) -> None:
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=True)
    out = start(make_context, op, mailbox)
    try:
        op.process(1, 100)
        op.process(2, 200)
        op.process_watermark(150)
        op.process(3, 300)
        service.release(3, 2)
        until(lambda: len(mailbox.actions) > 0, "a completed call posts a mail")
        mailbox.run()
        assert out.events == []  # 1 holds back everything behind it
        service.release(1)
        run_mail_until(mailbox, lambda: len(out.records) == 3, "all three emitted")
        assert out.events == [("record", 10), ("record", 20), ("watermark", 150), ("record", 30)]
        assert out.records == [(10, 100), (20, 200), (30, 300)]
    finally:
        op.close()


def test_unordered_mode_emits_as_completed_but_never_across_a_watermark(make_context: MakeContext) -> None:
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=False)
    out = start(make_context, op, mailbox)
    try:
        op.process(1, 100)
        op.process(2, 200)
        op.process_watermark(250)
        op.process(3, 300)
        service.release(2, 3)
        run_mail_until(mailbox, lambda: out.records == [(20, 200)], "2 emitted before 1")
        # 3 completed too, but it is behind the watermark, which waits for 1.
        assert out.events == [("record", 20)]
        service.release(1)
        run_mail_until(mailbox, lambda: len(out.records) == 3, "all emitted")
        assert out.events == [("record", 20), ("record", 10), ("watermark", 250), ("record", 30)]
    finally:
        op.close()


def test_a_full_queue_blocks_the_next_record_until_a_call_completes(make_context: MakeContext) -> None:
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=2, timeout_ms=None, ordered=True)
    out = start(make_context, op, mailbox)
    try:
        op.process(1, None)
        op.process(2, None)
        third = threading.Thread(target=op.process, args=(3, None))
        third.start()
        until(lambda: sorted(service.started) == [1, 2], "the first two calls in flight")
        assert third.is_alive() and 3 not in service.started  # capacity 2: the third waits
        service.release(1)
        third.join(DEADLINE_S)
        assert not third.is_alive()
        until(lambda: 3 in service.started, "the third call issued once one completed")
        assert out.values == [10]  # the completed one was emitted to make room
        service.release(2, 3)
        op.end_input()
        assert out.values == [10, 20, 30]
    finally:
        op.close()


def test_the_end_of_event_time_waits_for_every_call_in_flight(make_context: MakeContext) -> None:
    """A bounded source emits the end of event time before the job's final checkpoint: every result
    must be out by then (a result after the final barrier would be in no checkpoint)."""
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=False)
    out = start(make_context, op, mailbox)
    try:
        op.process(1, 100)
        op.process(2, 200)
        releaser = threading.Thread(
            target=lambda: (until(lambda: len(service.started) == 2, "both issued"), service.release(1, 2))
        )
        releaser.start()
        op.process_watermark(MAX_WATERMARK)
        releaser.join(DEADLINE_S)
        assert sorted(out.values) == [10, 20]
        assert out.events[-1] == ("watermark", MAX_WATERMARK)
        assert op.snapshot_state(3) is None
    finally:
        op.close()


def test_a_call_without_a_result_in_time_fails_the_job_naming_the_record(make_context: MakeContext) -> None:
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=10, timeout_ms=20, ordered=True)
    start(make_context, op, mailbox)
    try:
        op.process(7, 700)  # never released
        with pytest.raises(UserFunctionError) as raised:
            run_mail_until(mailbox, lambda: False, "never")
        assert "no result within 20 ms" in str(raised.value)
        assert "7" in str(raised.value)
    finally:
        op.close()


def test_a_call_that_raises_goes_to_on_error(make_context: MakeContext) -> None:
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=True)
    start(make_context, op, mailbox)
    try:
        op.process("boom", None)
        service.release("boom")
        with pytest.raises(UserFunctionError, match="the service refused boom"):
            run_mail_until(mailbox, lambda: False, "never")
    finally:
        op.close()


def test_calls_in_flight_at_a_checkpoint_are_issued_again_after_a_restore(make_context: MakeContext) -> None:
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=True)
    out = start(make_context, op, mailbox)
    try:
        op.process(1, 100)
        op.process(2, 200)
        op.process_watermark(250)
        op.process(3, 300)
        service.release(1)
        run_mail_until(mailbox, lambda: out.values == [10], "1 emitted before the checkpoint")
        state = op.snapshot_state(1)
    finally:
        op.close()  # the task fails: 2 and 3 never complete here
    assert state is not None

    again, mailbox2 = Service(), Mailbox()
    restored = AsyncMapOperator(again.call, capacity=10, timeout_ms=None, ordered=True)
    out2 = start(make_context, restored, mailbox2, restore=state)
    try:
        until(lambda: sorted(again.started) == [2, 3], "the calls in flight issued again, and only they")
        again.release(2, 3)
        run_mail_until(mailbox2, lambda: len(out2.records) == 2, "both emitted")
        assert out2.events == [("record", 20), ("watermark", 250), ("record", 30)]
        assert restored.snapshot_state(2) is None  # nothing left in flight
    finally:
        restored.close()


def test_without_a_mailbox_results_go_out_in_input_order_whatever_the_timing(make_context: MakeContext) -> None:
    async def times_ten(value: int) -> int:
        await asyncio.sleep((10 - value) / 1000)  # the later the record, the sooner its result
        return value * 10

    op = AsyncMapOperator(times_ten, capacity=4, timeout_ms=None, ordered=False)
    out = start(make_context, op, None)
    try:
        for v in range(10):
            op.process(v, v)
            if v == 5:
                op.process_watermark(5)
        op.end_input()
        expected = [("record", v * 10) for v in range(6)] + [("watermark", 5)]
        expected += [("record", v * 10) for v in range(6, 10)]
        assert out.events == expected
    finally:
        op.close()


def test_in_flight_inputs_go_to_subtask_s_mod_parallelism_at_another_parallelism(make_context: MakeContext) -> None:
    states = []
    for subtask in range(3):
        service, mailbox = Service(), Mailbox()
        op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=True)
        start(make_context, op, mailbox, subtask=subtask, parallelism=3)
        op.process(subtask + 1, None)
        op.process_watermark(5)
        blob = op.snapshot_state(1)
        op.close()
        assert blob is not None
        kg = make_context(subtask=subtask, parallelism=3).key_group_range
        states.append(InheritedState(subtask, 3, kg, blob))
    issued: list[list[Any]] = []
    for subtask in range(2):
        service = Service()
        service.release(1, 2, 3)
        op = AsyncMapOperator(service.call, capacity=10, timeout_ms=None, ordered=True)
        ctx = make_context("enrich", subtask=subtask, parallelism=2)
        out = CollectingOutput()
        op.setup(ctx, out)
        op.restore_inherited_state(states)
        op.open()
        try:
            op.end_input()
            issued.append(sorted(out.values))
            assert out.watermarks == []  # the old subtasks' watermarks are not carried over
        finally:
            op.close()
    assert issued == [[10, 30], [20]]


def test_async_map_takes_only_an_async_function() -> None:
    env = Environment("async-job")
    stream = env.from_collection([1, 2, 3], uid="numbers")
    with pytest.raises(JobDefinitionError, match="async_map takes an async function"):
        stream.async_map(lambda v: v, uid="enrich")

    class Lookup:
        async def __call__(self, value: int) -> int:
            return value

    stream.async_map(Lookup(), uid="enrich", capacity=4, timeout_ms=1000, ordered=False)
    with pytest.raises(JobDefinitionError, match="capacity must be a positive int"):
        stream.async_map(Lookup(), uid="enrich2", capacity=0)


def test_each_subtask_runs_its_own_copy_opened_and_closed_on_its_loop(make_context: MakeContext) -> None:
    class Client:
        def __init__(self) -> None:
            self.loop: asyncio.AbstractEventLoop | None = None
            self.closed_on: asyncio.AbstractEventLoop | None = None

        async def open(self) -> None:
            self.loop = asyncio.get_running_loop()
            opened.append(self)

        async def close(self) -> None:
            self.closed_on = asyncio.get_running_loop()

        async def __call__(self, value: int) -> tuple[int, bool]:
            return (value, asyncio.get_running_loop() is self.loop)

    opened: list[Client] = []
    shared = Client()
    ops = [AsyncMapOperator(shared, capacity=4, timeout_ms=None, ordered=True) for _ in range(2)]
    outs = [start(make_context, op, None, subtask=i, parallelism=2) for i, op in enumerate(ops)]
    for op in ops:
        op.process(1, None)
        op.end_input()
    copies = list(opened)
    loops = [c.loop for c in copies]
    for op in ops:
        op.close()
    assert [out.values for out in outs] == [[(1, True)], [(1, True)]]  # each call on its own copy's loop
    assert len(copies) == 2 and shared not in copies and loops[0] is not loops[1]
    assert [c.closed_on for c in copies] == loops


def test_a_full_queue_waits_without_spinning_while_only_a_later_call_completed(make_context: MakeContext) -> None:
    """Ordered, capacity 2: call 2 completed, call 1 (the head) did not. The next record waits for
    the head; it must sleep, not loop: a spinning task thread starves the event loop's thread of the
    interpreter (two such subtasks in one TaskManager slowed every lookup to seconds)."""
    service, mailbox = Service(), Mailbox()
    op = AsyncMapOperator(service.call, capacity=2, timeout_ms=None, ordered=True)
    start(make_context, op, mailbox)
    emits = 0
    emit_ready = op._emit_ready

    def counted() -> None:
        nonlocal emits
        emits += 1
        emit_ready()

    op._emit_ready = counted  # type: ignore[method-assign]
    try:
        op.process(1, None)
        op.process(2, None)
        service.release(2)
        until(lambda: len(mailbox.actions) > 0, "call 2 completed")
        third = threading.Thread(target=op.process, args=(3, None))
        third.start()
        time.sleep(0.3)  # an interval to count the waiting thread's work in, not a wait for a condition
        assert third.is_alive()
        assert emits < 10, f"the waiting task thread looped {emits} times in 0.3 s"
        service.release(1, 3)
        third.join(DEADLINE_S)
        assert not third.is_alive()
    finally:
        op.close()
