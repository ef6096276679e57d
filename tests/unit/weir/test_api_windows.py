"""The job API of windows: session, processing-time windows, reduce, process, durations."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from weir.api import (
    Environment,
    EventTimeSessionWindows,
    KeyedStream,
    ProcessWindowFunction,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowContext,
)
from weir.core.errors import JobDefinitionError
from weir.operators.windows import ElementList, ProcessElements, ProcessResult, ReduceAggregate, WindowAggregateOperator


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: dict[str, int]) -> int:
        return acc + value["n"]

    def result(self, key: object, window_start: int, window_end: int, acc: int) -> int:
        return acc


class MergingSum(Sum):
    def merge(self, a: int, b: int) -> int:
        return a + b


class Describe(ProcessWindowFunction):
    def process(self, key: Any, context: WindowContext, elements: Any, out: Any) -> None:
        out.collect((key, context.window.start, list(elements)))


def keyed(env: Environment) -> KeyedStream:
    uid = f"gen-{len(env.graph.transformations)}"
    src = env.from_generator(lambda i: {"k": i % 3, "n": i}, uid=uid, count=10, timestamp=lambda e: e["n"])
    return src.key_by(lambda e: e["k"])


def operator_of(env: Environment, uid: str) -> WindowAggregateOperator:
    op = env.graph.transformations[uid].factory()
    assert isinstance(op, WindowAggregateOperator)
    return op


def test_a_session_window_of_an_aggregate_without_merge_fails_at_build_time() -> None:
    env = Environment("j")
    with pytest.raises(JobDefinitionError, match="operator 'win': session windows .* Sum has no merge"):
        keyed(env).window(EventTimeSessionWindows(10)).aggregate(Sum(), uid="win")
    assert "win" not in env.graph.transformations
    out = keyed(env).window(EventTimeSessionWindows.with_gap(timedelta(seconds=1))).aggregate(MergingSum(), uid="win")
    op = operator_of(env, out.uid)
    assert op._assigner == EventTimeSessionWindows(1000) and op._merging


def test_reduce_process_and_aggregate_with_a_window_function_build_their_operators() -> None:
    env = Environment("j")
    windowed = keyed(env).window(
        TumblingEventTimeWindows(timedelta(seconds=1)), allowed_lateness_ms=timedelta(seconds=2)
    )
    reduced = operator_of(env, windowed.reduce(lambda a, b: a, uid="r").uid)
    assert isinstance(reduced._fn, ReduceAggregate) and reduced._window_function is None
    assert reduced._lateness == 2000 and reduced._assigner == TumblingEventTimeWindows(1000)
    fn = Describe()
    processed = operator_of(env, windowed.process(fn, uid="p").uid)
    assert isinstance(processed._fn, ElementList) and processed._window_function == ProcessElements(fn)
    aggregated = operator_of(env, windowed.aggregate(Sum(), uid="a", window_function=fn).uid)
    assert isinstance(aggregated._fn, Sum) and aggregated._window_function == ProcessResult(fn)
    reduced_fn = operator_of(env, windowed.reduce(lambda a, b: a, uid="rf", window_function=fn).uid)
    assert reduced_fn._window_function == ProcessResult(fn)
    sessions = keyed(env).window(EventTimeSessionWindows(5))
    operator_of(env, sessions.reduce(lambda a, b: a, uid="sr").uid)  # a reduce merges by itself
    operator_of(env, sessions.process(fn, uid="sp").uid)  # so does a list of elements
    assert [env.graph.transformations[u].name for u in ("r", "p", "a")] == [
        "window-reduce",
        "window-process",
        "window-aggregate",
    ]


def test_window_functions_and_reducers_are_checked_at_build_time() -> None:
    env = Environment("j")
    windowed = keyed(env).window(TumblingEventTimeWindows(10))
    with pytest.raises(JobDefinitionError, match="operator 'p': a window function is a ProcessWindowFunction"):
        windowed.process(object(), uid="p")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="operator 'a': a window function"):
        windowed.aggregate(Sum(), uid="a", window_function=lambda: None)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="operator 'r': reduce takes a function of two values"):
        windowed.reduce(3, uid="r")  # type: ignore[arg-type]


def test_allowed_lateness_takes_milliseconds_or_a_timedelta() -> None:
    env = Environment("j")
    stream = keyed(env)
    assert stream.window(TumblingEventTimeWindows(10), allowed_lateness_ms=timedelta(milliseconds=7))._lateness == 7
    assert stream.window(TumblingEventTimeWindows(10)).allowed_lateness(timedelta(minutes=1))._lateness == 60_000
    assert stream.window(TumblingEventTimeWindows(10)).allowed_lateness(5)._lateness == 5
    with pytest.raises(JobDefinitionError, match="^allowed_lateness_ms must be >= 0$"):
        stream.window(TumblingEventTimeWindows(10), allowed_lateness_ms=timedelta(seconds=-1))
    with pytest.raises(JobDefinitionError, match="whole number of milliseconds"):
        stream.window(TumblingEventTimeWindows(10)).allowed_lateness(timedelta(microseconds=10))
    with pytest.raises(JobDefinitionError, match="an int of milliseconds or a datetime.timedelta"):
        stream.window(TumblingEventTimeWindows(10), allowed_lateness_ms=1.5)  # type: ignore[arg-type]


def test_a_processing_time_window_builds_an_operator_without_lateness() -> None:
    env = Environment("j")
    windowed = keyed(env).window(TumblingProcessingTimeWindows(timedelta(seconds=1)), allowed_lateness_ms=100)
    op = operator_of(env, windowed.aggregate(Sum(), uid="w").uid)
    assert op._processing_time and op._lateness == 0 and op.next_processing_time() is None
