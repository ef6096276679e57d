"""Every public method that adds an operator goes through one path, ``GraphBuilder.add_operator``:
nothing else adds a transformation or draws an edge, and every operator records its uid, name,
parallelism and ``on_error`` the same way (the operator's own handling, else the job's, read when a
task builds the operator; none for an operator that hands no record to a user function)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from weir.api import (
    BroadcastProcessFunction,
    ColumnarKeyedStream,
    ColumnarStream,
    ConnectedStreams,
    CoProcessFunction,
    DataStream,
    DeadLetterOnError,
    Environment,
    GeneratorSource,
    IntervalJoin,
    IntervalJoined,
    JoinedStreams,
    JoinEqualTo,
    JoinWhere,
    KafkaSink,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    KeyedStream,
    ProcessFunction,
    ProcessWindowFunction,
    Sum,
    TumblingEventTimeWindows,
    WindowedJoin,
    WindowedStream,
)
from weir.api.stream_sinks import StreamSinks
from weir.api.wiring import GraphBuilder
from weir.core.errors import JobDefinitionError
from weir.graph import Edge, LogicalGraph, Transformation

OWN = DeadLetterOnError("own-dlq")
JOBS = DeadLetterOnError("job-dlq")
API_CLASSES = (
    Environment,
    DataStream,
    StreamSinks,
    KeyedStream,
    WindowedStream,
    ConnectedStreams,
    JoinedStreams,
    JoinWhere,
    JoinEqualTo,
    WindowedJoin,
    IntervalJoin,
    IntervalJoined,
    ColumnarStream,
    ColumnarKeyedStream,
)


class Added:
    """What entered the graph, and by which path."""

    def __init__(self) -> None:
        self.uids: list[str] = []
        self.depth = 0


@pytest.fixture
def added(monkeypatch: pytest.MonkeyPatch) -> Iterator[Added]:
    seen = Added()
    add_operator, graph_add, graph_connect = GraphBuilder.add_operator, LogicalGraph.add, LogicalGraph.connect

    def spied_add_operator(self: GraphBuilder, *args: Any, **kwargs: Any) -> Transformation:
        seen.depth += 1
        try:
            t = add_operator(self, *args, **kwargs)
        finally:
            seen.depth -= 1
        seen.uids.append(t.uid)
        return t

    def spied_graph_add(self: LogicalGraph, t: Transformation) -> Transformation:
        assert seen.depth == 1, f"operator {t.uid!r} entered the graph outside GraphBuilder.add_operator"
        return graph_add(self, t)

    def spied_graph_connect(self: LogicalGraph, edge: Edge) -> None:
        assert seen.depth == 1, f"edge {edge} drawn outside GraphBuilder.add_operator"
        graph_connect(self, edge)

    monkeypatch.setattr(GraphBuilder, "add_operator", spied_add_operator)
    monkeypatch.setattr(LogicalGraph, "add", spied_graph_add)
    monkeypatch.setattr(LogicalGraph, "connect", spied_graph_connect)
    yield seen


def square(i: int) -> dict[str, int]:
    return {"k": i % 3, "ts": i}


def numbers(env: Environment, uid: str = "numbers") -> DataStream:
    return env.from_generator(square, uid=uid, count=10, timestamp=lambda r: r["ts"])


def keyed(env: Environment, uid: str = "numbers") -> KeyedStream:
    return numbers(env, uid).key_by("k")


class Total:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: dict[str, int]) -> int:
        return acc + value["ts"]

    def result(self, key: object, window_start: int, window_end: int, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


class Stateless(ProcessFunction, CoProcessFunction, ProcessWindowFunction):
    pass


class Keyed(KeyedProcessFunction, KeyedCoProcessFunction):
    pass


def pair(a: object, b: object) -> tuple[object, object]:
    return a, b


async def lookup(value: object) -> object:
    return value


class Rules(BroadcastProcessFunction):
    pass


class KeyedRules(KeyedBroadcastProcessFunction):
    pass


Case = Callable[[Environment, dict[str, Any]], object]
CASES: dict[str, Case] = {
    "Environment.from_source": lambda env, kw: env.from_source(GeneratorSource(square, count=1), **kw),
    "Environment.from_kafka": lambda env, kw: env.from_kafka("events", **kw),
    "Environment.from_generator": lambda env, kw: env.from_generator(square, count=1, **kw),
    "Environment.from_collection": lambda env, kw: env.from_collection([1, 2], **kw),
    "Environment.from_postgres_cdc": lambda env, kw: env.from_postgres_cdc(["orders"], slot_name="orders_cdc", **kw),
    "DataStream.map": lambda env, kw: numbers(env).map(dict, **kw),
    "DataStream.filter": lambda env, kw: numbers(env).filter(bool, **kw),
    "DataStream.flat_map": lambda env, kw: numbers(env).flat_map(list, **kw),
    "DataStream.process": lambda env, kw: numbers(env).process(Stateless(), **kw),
    "DataStream.async_map": lambda env, kw: numbers(env).async_map(lookup, **kw),
    "DataStream.union": lambda env, kw: numbers(env).union(numbers(env, "more"), **kw),
    "StreamSinks.sink_to": lambda env, kw: numbers(env).sink_to(KafkaSink.builder().topic("out").build(), **kw),
    "StreamSinks.sink_to_kafka": lambda env, kw: numbers(env).sink_to_kafka("out", **kw),
    "StreamSinks.sink_to_postgres": lambda env, kw: keyed(env).sink_to_postgres(
        "totals", columns=("k", "ts"), key_columns=("k",), **kw
    ),
    "StreamSinks.sink_to_files": lambda env, kw: numbers(env).sink_to_files("s3://lake/one-path", **kw),
    "StreamSinks.sink": lambda env, kw: numbers(env).sink(print, **kw),
    "StreamSinks.print": lambda env, kw: numbers(env).print(**kw),
    "StreamSinks.sink_to_file": lambda env, kw: numbers(env).sink_to_file("/tmp/weir-one-path", **kw),
    "KeyedStream.reduce": lambda env, kw: keyed(env).reduce(max, **kw),
    "KeyedStream.process": lambda env, kw: keyed(env).process(Keyed(), **kw),
    "WindowedStream.aggregate": lambda env, kw: (
        keyed(env).window(TumblingEventTimeWindows(10)).aggregate(Total(), **kw)
    ),
    "WindowedStream.reduce": lambda env, kw: keyed(env).window(TumblingEventTimeWindows(10)).reduce(max, **kw),
    "WindowedStream.process": lambda env, kw: (
        keyed(env).window(TumblingEventTimeWindows(10)).process(Stateless(), **kw)
    ),
    "ConnectedStreams.process": lambda env, kw: numbers(env).connect(numbers(env, "more")).process(Stateless(), **kw),
    "ConnectedStreams.process[keyed]": lambda env, kw: (
        numbers(env).connect(numbers(env, "more")).key_by("k", "k").process(Keyed(), **kw)
    ),
    "ConnectedStreams.process[broadcast]": lambda env, kw: (
        numbers(env).connect(numbers(env, "rules").broadcast()).process(Rules(), **kw)
    ),
    "ConnectedStreams.process[keyed broadcast]": lambda env, kw: (
        keyed(env).connect(numbers(env, "rules").broadcast()).process(KeyedRules(), **kw)
    ),
    "WindowedJoin.apply": lambda env, kw: (
        numbers(env).join(numbers(env, "more")).where("k").equal_to("k").window(TumblingEventTimeWindows(10))
    ).apply(pair, **kw),
    "IntervalJoined.process": lambda env, kw: (
        keyed(env).interval_join(keyed(env, "more")).between(-5, 5).process(pair, **kw)
    ),
    "WindowedStream.aggregate[columnar records]": lambda env, kw: (
        env.from_kafka("events", uid="events", schema={"k": str, "ts": int}, timestamp_field="ts")
        .key_by("k")
        .window(TumblingEventTimeWindows(10))
        .aggregate(Total(), **kw)
    ),
}
CLASSES = {cls.__name__: cls for cls in API_CLASSES}


def method_of(case: str) -> Callable[..., Any]:
    cls, name = case.split("[")[0].split(".")
    method: Callable[..., Any] = getattr(CLASSES[cls], name)
    return method


def test_the_cases_cover_every_public_method_that_adds_an_operator() -> None:
    adding = {
        member.__qualname__
        for cls in API_CLASSES
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and "uid" in inspect.signature(member).parameters
    }
    assert adding == {case.split("[")[0] for case in CASES}


@pytest.mark.parametrize("own_handling", [True, False], ids=["own on_error", "the job's"])
@pytest.mark.parametrize("case", CASES)
def test_each_method_adds_its_operator_by_the_one_path_and_records_it_alike(
    case: str, own_handling: bool, added: Added
) -> None:
    accepts = inspect.signature(method_of(case)).parameters
    given: dict[str, Any] = {"uid": "op"}
    if "name" in accepts:
        given["name"] = "the-op"
    if "parallelism" in accepts:
        given["parallelism"] = 3
    if "on_error" in accepts and own_handling:
        given["on_error"] = OWN
    env = Environment("j")
    CASES[case](env, given)
    env.on_record_error(JOBS)  # after the operators: read when a task builds them

    assert added.uids[-1] == "op" and sorted(added.uids) == sorted(env.graph.transformations)
    t = env.graph.transformations["op"]
    assert t.uid == "op"
    if "name" in accepts:
        assert t.name == "the-op"
    assert t.parallelism == (3 if "parallelism" in accepts else None)
    operator = t.factory()
    assert operator is not t.factory()  # a fresh operator per subtask
    if "on_error" in accepts:
        handling = OWN if own_handling else JOBS
        assert t.on_error is not None and t.on_error() == handling
        assert operator.on_error == handling
    else:
        assert t.on_error is None


def test_an_operator_that_calls_no_user_function_refuses_on_error_by_the_one_path(added: Added) -> None:
    """The vectorized window of built-in aggregates on a columnar stream hands no record to a user function."""
    env = Environment("j")
    events = env.from_kafka("events", uid="events", schema={"k": str, "v": int, "ts": int}, timestamp_field="ts")
    window = events.key_by("k").window(TumblingEventTimeWindows(10))
    with pytest.raises(JobDefinitionError, match=r"^operator 'sums' \(window-aggregate\) takes no on_error"):
        window.aggregate({"total": Sum("v")}, uid="sums", on_error=OWN)
    window.aggregate({"total": Sum("v")}, uid="sums", parallelism=2)
    assert added.uids == ["events", "sums"] and env.graph.transformations["sums"].on_error is None
    assert env.graph.transformations["sums"].parallelism == 2
