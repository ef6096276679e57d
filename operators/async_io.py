"""Asynchronous I/O: enrich records from a service without blocking the stream, after Flink's
``AsyncWaitOperator`` (FLIP-12).

``stream.async_map(fn, capacity=..., timeout_ms=..., ordered=...)`` runs ``fn``, an ``async def``, on
an asyncio event loop of the operator's own (one thread per subtask), up to ``capacity`` calls at
once. Results are emitted on the task's thread, never on the loop's: a call that completes posts a
mail to the task's mailbox (``OperatorContext.mailbox_executor``, Flink's ``MailboxExecutor``), and the
mail emits what is ready. A full queue blocks the task until a call completes (backpressure).

Order: *ordered* emits results in input order (a slow call holds back the ones behind it);
*unordered* emits a result as soon as it is ready, but never across a watermark: the watermarks split
the queue into segments, a segment's results go in any order, its watermark after all of them
(Flink's ``UnorderedStreamElementQueue``), so no result is ever late because of the reordering.

Checkpoints: what is in the queue and not yet emitted (the *inputs* of the calls in flight, and the
watermarks between them) is the operator's state; a restore issues those calls again. A call's
result emitted after a barrier belongs to the next checkpoint, so each input's result reaches the
sinks' committed output exactly once; ``fn`` itself may run more than once for an input (a request to
an outside service is at least once, as in Flink).

Each subtask runs its own copy of ``fn`` (as each Flink subtask deserializes its own): an object's
``open()`` and ``close()``, when it has them (sync or async), run on the subtask's loop, which is where
its clients (an ``httpx.AsyncClient``) must be made.

Failures: a call that raises, or that has no result within ``timeout_ms``, is handed to ``on_error``
like any user function's failure (fail the job naming the record, or dead-letter it).

Without a mailbox (the in-process runs of ``weir verify`` and ``weir test``) the calls still run
``capacity`` at once, but results go out in input order (one of the orders an unordered run may
have), as records and watermarks come in: the run's output does not depend on the calls' timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.rejections import FAIL, OnRecordError
from weir.core.serde import dumps_value, loads_value
from weir.core.watermarks import MAX_WATERMARK
from weir.operators.base import InheritedState, StreamOperator

STATE_FORMAT: Final = 1
"""Version of the operator state: ``(1, [("r", value, timestamp) | ("w", watermark), ...])``, pickled."""


def check_async_function(uid: str, fn: Any) -> None:
    """``fn`` must be an ``async def`` (or an object whose ``__call__`` is one): a JobDefinitionError
    at build time otherwise, rather than a coroutine never awaited at run time."""
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", None)  # noqa: B004
    if call is None or not inspect.iscoroutinefunction(call):
        raise JobDefinitionError(
            f"operator {uid!r}: async_map takes an async function (async def fn(value) -> result), not {fn!r}"
        )


@dataclass(eq=False)
class _Call:
    """One input in the queue: its call in flight (None until issued) and whether it was emitted."""

    value: Any
    timestamp: int | None
    future: concurrent.futures.Future[Any] | None = None


@dataclass(eq=False)
class _Segment:
    """The calls between two watermarks (unordered mode), and the watermark that closes them."""

    calls: list[_Call] = field(default_factory=list)
    watermark: int | None = None


class AsyncMapOperator(StreamOperator):
    """See the module."""

    def __init__(
        self,
        fn: Callable[[Any], Awaitable[Any]],
        capacity: int,
        timeout_ms: int | None,
        ordered: bool,
        on_error: OnRecordError = FAIL,
    ) -> None:
        self._fn = fn
        self._capacity = capacity
        self._timeout_s = None if timeout_ms is None else timeout_ms / 1000.0
        self._timeout_ms = timeout_ms
        self._ordered = ordered
        self.on_error = on_error
        # Ordered: one segment whose "calls" hold records and watermarks in input order.
        self._ordered_queue: deque[_Call | int] = deque()
        self._segments: deque[_Segment] = deque([_Segment()])
        self._in_flight = 0
        self._restored: list[tuple[Any, ...]] = []
        self._done = threading.Condition()
        self._mail_posted = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # Life ----------------------------------------------------------------------------------------

    def open(self) -> None:
        if self.ctx.mailbox_executor is None:
            # An in-process run: nothing wakes the operator when a call completes, so results go out
            # as records and watermarks come in, in input order whatever the mode (one order an
            # unordered run may also have): the run's output does not depend on the calls' timing.
            self._ordered = True
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"async-io-{self.ctx.uid}-{self.ctx.subtask}", daemon=True
        )
        self._thread.start()
        self._fn = _own_copy(self._fn, self.ctx.log)
        opened = asyncio.run_coroutine_threadsafe(_call_hook(self._fn, "open"), loop)
        opened.result()  # an open() that raises fails the task, as any operator's open
        restored, self._restored = self._restored, []
        for entry in restored:
            match entry:
                case ("r", value, timestamp):
                    self.process(value, timestamp)
                case ("w", watermark):
                    self.process_watermark(watermark)
                case _:
                    raise SerializationError(f"operator {self.ctx.uid!r}: unknown async I/O queue entry {entry!r}")

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        # Calls still in flight are cancelled (a restore issues them again), the function's close()
        # runs on its loop (its clients belong to it), then the loop stops.
        for step, coroutine in (("cancel", _cancel_other_tasks()), ("close", _call_hook(self._fn, "close"))):
            done = asyncio.run_coroutine_threadsafe(coroutine, loop)
            try:
                done.result(timeout=5.0)
            except Exception as exc:  # a call that ignores cancellation, a close that raises: stop anyway
                self.ctx.log.warning("async_io_close_incomplete", step=step, error=repr(exc))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5.0)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None

    # Input ---------------------------------------------------------------------------------------

    def process(self, value: Any, timestamp: int | None) -> None:
        self._emit_ready()
        while self._in_flight >= self._capacity:
            self._wait_for_a_result()
            self._emit_ready()
        call = _Call(value, timestamp)
        if self._ordered:
            self._ordered_queue.append(call)
        else:
            self._segments[-1].calls.append(call)
        self._in_flight += 1
        self._issue(call)

    def process_watermark(self, watermark: int) -> None:
        if self._ordered:
            self._ordered_queue.append(watermark)
        else:  # closes the open segment (the last one); a new one takes what follows
            self._segments[-1].watermark = watermark
            self._segments.append(_Segment())
        self._emit_ready()
        if watermark >= MAX_WATERMARK:
            self._complete_all()

    def end_input(self) -> None:
        self._complete_all()

    def _complete_all(self) -> None:
        """Every call in flight completes and is emitted: at the end of event time, which a bounded
        source (or ``weir stop --drain``) emits before the job's final checkpoint, so that no result
        comes after the final barrier (Flink waits in ``endInput``, before its final checkpoint)."""
        while self._in_flight:
            self._wait_for_a_result()
            self._emit_ready()

    # Checkpoints ---------------------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._emit_ready()
        entries: list[tuple[Any, ...]] = []
        if self._ordered:
            for item in self._ordered_queue:
                entries.append(("w", item) if isinstance(item, int) else ("r", item.value, item.timestamp))
        else:
            for segment in self._segments:
                entries.extend(("r", call.value, call.timestamp) for call in segment.calls)
                if segment.watermark is not None:
                    entries.append(("w", segment.watermark))
        entries.extend(self._restored)  # restored, not yet re-issued (a snapshot before open)
        if not entries:
            return None
        return dumps_value((STATE_FORMAT, entries))

    def restore_state(self, data: bytes) -> None:
        self._restored.extend(_entries(self.ctx.uid, data))

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        """In-flight inputs belong to no key group: at another parallelism, old subtask ``s``'s go to
        subtask ``s mod parallelism`` (its watermarks are dropped: the new subtasks' inputs bring theirs)."""
        if not states:
            return
        if states[0].parallelism == self.ctx.parallelism:
            super().restore_inherited_state(states)
            return
        for state in sorted(states, key=lambda s: s.subtask):
            if state.subtask % self.ctx.parallelism == self.ctx.subtask:
                self._restored.extend(e for e in _entries(self.ctx.uid, state.data) if e[0] == "r")

    # The calls -----------------------------------------------------------------------------------

    def _issue(self, call: _Call) -> None:
        loop = self._loop
        assert loop is not None, "async_map: a record before open()"
        future = asyncio.run_coroutine_threadsafe(self._call(call.value), loop)
        call.future = future
        future.add_done_callback(self._completed)

    async def _call(self, value: Any) -> Any:
        if self._timeout_s is None:
            return await self._fn(value)
        try:
            return await asyncio.wait_for(self._fn(value), self._timeout_s)
        except TimeoutError:
            raise TimeoutError(f"async_map {self.ctx.uid!r}: no result within {self._timeout_ms} ms") from None

    def _completed(self, _future: concurrent.futures.Future[Any]) -> None:
        """On the loop's thread: wake the task, through a mail (one at a time) or the condition."""
        executor = self.ctx.mailbox_executor
        with self._done:
            self._done.notify_all()
            if executor is None or self._mail_posted:
                return
            self._mail_posted = True
        executor(self._on_mail)

    def _on_mail(self) -> None:
        with self._done:
            self._mail_posted = False
        if self._loop is not None:
            self._emit_ready()

    def _wait_for_a_result(self) -> None:
        """Until something can be emitted: the head of the queue completed (ordered), or a call of the
        first segment did (unordered). Not merely any call: a completed call that cannot be emitted
        yet would make the caller spin, starving the event loop's thread of the interpreter."""
        with self._done:
            while not self._emittable():
                self._done.wait(timeout=1.0)

    def _emittable(self) -> bool:
        if self._ordered:
            if not self._ordered_queue:
                return True
            head = self._ordered_queue[0]
            return isinstance(head, int) or (head.future is not None and head.future.done())
        first = self._segments[0]
        if not first.calls:
            return True
        return any(c.future is not None and c.future.done() for c in first.calls)

    def _queued_calls(self) -> list[_Call]:
        if self._ordered:
            return [c for c in self._ordered_queue if isinstance(c, _Call)]
        return [c for segment in self._segments for c in segment.calls]

    # Emission, on the task's thread --------------------------------------------------------------

    def _emit_ready(self) -> None:
        if self._ordered:
            queue = self._ordered_queue
            while queue:
                head = queue[0]
                if isinstance(head, int):
                    queue.popleft()
                    self.output.emit_watermark(head)
                    continue
                if head.future is None or not head.future.done():
                    return
                queue.popleft()
                self._emit_result(head)
            return
        segments = self._segments
        while True:
            first = segments[0]
            ready = [c for c in first.calls if c.future is not None and c.future.done()]
            if ready:
                first.calls = [c for c in first.calls if c not in ready]
                for call in ready:
                    self._emit_result(call)
            if first.calls or first.watermark is None:
                return
            segments.popleft()  # never the last one: it is open (no watermark yet)
            self.output.emit_watermark(first.watermark)

    def _emit_result(self, call: _Call) -> None:
        self._in_flight -= 1
        future = call.future
        assert future is not None
        try:
            result = future.result()
        except Exception as exc:
            self.reject(self._fn, exc, call.value, call.timestamp)
            return
        self.output.emit(result, call.timestamp)


def _own_copy(fn: Any, log: Any) -> Any:
    """The subtask's own copy of the function, as each Flink subtask deserializes its own: an
    object's clients (an ``httpx.AsyncClient``) belong to the event loop that made them, and every
    subtask (and every attempt) has its own loop. A function object that cannot be copied is shared,
    with a warning."""
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return fn  # no attributes of its own to keep apart
    try:
        return copy.deepcopy(fn)
    except Exception as exc:
        log.warning("async_function_shared", reason=f"cannot be copied: {type(exc).__name__}: {exc}")
        return fn


async def _call_hook(fn: Any, name: str) -> None:
    """``fn.open()`` / ``fn.close()`` when it has one (Flink's RichAsyncFunction), awaited if async."""
    hook = getattr(fn, name, None)
    if not callable(hook) or inspect.isfunction(fn):
        return
    result = hook()
    if inspect.isawaitable(result):
        await result


async def _cancel_other_tasks() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def _entries(uid: str, data: bytes) -> list[tuple[Any, ...]]:
    decoded = loads_value(data)
    match decoded:
        case (1, list() as entries):
            return entries
        case _:
            raise SerializationError(f"operator {uid!r}: async I/O state of an unknown format")
