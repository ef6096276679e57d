"""The job API of keyed two-input functions and joins: the graph they build (both inputs
hash-partitioned by their own key into one two-input operator), what they refuse at build time, and
small join jobs run in reference mode (generator sources, out of order within the watermark bound)
against plain-Python references."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from weir.api import (
    CoProcessFunction,
    Environment,
    EventTimeSessionWindows,
    KeyedCoProcessFunction,
    TumblingEventTimeWindows,
)
from weir.core.errors import JobDefinitionError
from weir.graph import OperatorKind, Partitioning
from weir.operators.joins import IntervalJoinOperator, WindowJoinOperator
from weir.operators.keyed import KeyedCoProcessOperator
from weir.tools.reference import run_reference_source


class Nothing(KeyedCoProcessFunction):
    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        pass

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        pass


def two_sources(env: Environment) -> tuple[Any, Any]:
    a = env.from_generator(lambda i: {"k": i % 3, "ts": i}, uid="a", count=10, timestamp=lambda e: e["ts"])
    b = env.from_generator(lambda i: (i % 3, i), uid="b", count=10, timestamp=lambda e: e[1])
    return a, b


def first_key(e: dict[str, Any]) -> Any:
    return e["k"]


def second_key(e: tuple[int, int]) -> Any:
    return e[0]


@pytest.mark.parametrize("form", ["connect-then-key", "key-then-connect"])
def test_a_keyed_co_process_is_one_two_input_operator_fed_by_both_keys(form: str) -> None:
    env = Environment("job", parallelism=2)
    a, b = two_sources(env)
    if form == "connect-then-key":
        connected = a.connect(b).key_by(first_key, second_key)
    else:
        connected = a.key_by(first_key).connect(b.key_by(second_key))
    connected.process(Nothing(), uid="co")
    t = env.graph.transformations["co"]
    assert t.kind is OperatorKind.TWO_INPUT
    assert t.key_selector is first_key
    edges = env.graph.inputs_of("co")
    assert [(e.source_uid, e.input_index, e.partitioning, e.key_selector) for e in edges] == [
        ("a", 0, Partitioning.HASH, first_key),
        ("b", 1, Partitioning.HASH, second_key),
    ]
    assert isinstance(t.factory(), KeyedCoProcessOperator)


def test_a_keyed_co_process_function_needs_both_streams_keyed() -> None:
    env = Environment("job")
    a, b = two_sources(env)
    with pytest.raises(JobDefinitionError, match="'co': a keyed two-input operator needs both streams keyed"):
        a.key_by(first_key).connect(b).process(Nothing(), uid="co")


def test_a_stateless_co_process_function_stays_as_it_was() -> None:
    env = Environment("job")
    a, b = two_sources(env)
    a.connect(b).process(CoProcessFunction(), uid="co")
    assert [e.partitioning for e in env.graph.inputs_of("co")] == [Partitioning.FORWARD, Partitioning.FORWARD]
    with pytest.raises(JobDefinitionError, match="needs a KeyedCoProcessFunction"):
        a.connect(b).process(CoProcessFunction(), uid="co2", state_schemas=())


def test_joins_build_keyed_two_input_operators() -> None:
    env = Environment("job")
    a, b = two_sources(env)
    a.join(b).where("k").equal_to(second_key).window(TumblingEventTimeWindows(timedelta(seconds=1))).apply(
        lambda x, y: (x, y), uid="wj"
    )
    a.key_by("k").interval_join(b.key_by(second_key)).between(timedelta(milliseconds=-5), 5).lower_exclusive().process(
        lambda x, y: (x, y), uid="ij"
    )
    for uid, kind in (("wj", WindowJoinOperator), ("ij", IntervalJoinOperator)):
        assert [(e.input_index, e.partitioning) for e in env.graph.inputs_of(uid)] == [
            (0, Partitioning.HASH),
            (1, Partitioning.HASH),
        ]
        assert isinstance(env.graph.transformations[uid].factory(), kind)


def test_joins_refuse_what_they_cannot_do() -> None:
    env = Environment("job")
    a, b = two_sources(env)
    with pytest.raises(JobDefinitionError, match="tumbling or sliding event-time windows"):
        a.join(b).where("k").equal_to(second_key).window(EventTimeSessionWindows(10))  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="interval_join takes a keyed stream"):
        a.key_by("k").interval_join(b)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="above its upper bound"):
        a.key_by("k").interval_join(b.key_by(second_key)).between(5, 4)
    with pytest.raises(JobDefinitionError, match="match nothing"):
        a.key_by("k").interval_join(b.key_by(second_key)).between(3, 3).upper_exclusive().process(max, uid="ij")
    with pytest.raises(JobDefinitionError, match="whole number of milliseconds"):
        a.key_by("k").interval_join(b.key_by(second_key)).between(timedelta(microseconds=1), 4)
    with pytest.raises(JobDefinitionError, match="a window join takes fn"):
        a.join(b).where("k").equal_to(second_key).window(TumblingEventTimeWindows(5)).apply(3, uid="w")  # type: ignore[arg-type]


# Reference mode ----------------------------------------------------------------------------------

SOURCES = """
N = 400
OOO = 15

def ts_a(i): return 10 * i - (i * 7919) % (OOO + 1)
def ts_b(i): return 7 * i - (i * 104729) % (OOO + 1)
def gen_a(i): return {"k": (i * 31) % 5, "ts": ts_a(i), "id": i}
def gen_b(i): return {"k": (i * 17) % 5, "ts": ts_b(i), "id": i}

def sources(env):
    a = env.from_generator(gen_a, uid="a", count=N, timestamp=lambda e: e["ts"], max_out_of_orderness_ms=OOO)
    b = env.from_generator(gen_b, uid="b", count=N, timestamp=lambda e: e["ts"], max_out_of_orderness_ms=OOO)
    return a, b
"""

N, OOO = 400, 15


def gen_a(i: int) -> dict[str, int]:
    return {"k": (i * 31) % 5, "ts": 10 * i - (i * 7919) % (OOO + 1), "id": i}


def gen_b(i: int) -> dict[str, int]:
    return {"k": (i * 17) % 5, "ts": 7 * i - (i * 104729) % (OOO + 1), "id": i}


A, B = [gen_a(i) for i in range(N)], [gen_b(i) for i in range(N)]


def test_a_window_join_job_in_reference_mode_matches_a_direct_computation() -> None:
    job = (
        SOURCES
        + """
from weir.api import SlidingEventTimeWindows

def build(env):
    a, b = sources(env)
    a.join(b).where("k").equal_to(lambda e: e["k"]).window(SlidingEventTimeWindows(100, 50)).apply(
        lambda x, y: (x["id"], y["id"]), uid="join").print(uid="out")
"""
    )
    result = run_reference_source(job)
    assert result.late_records == {"join": 0}
    expected = sorted(
        (x["id"], y["id"])
        for x in A
        for y in B
        if x["k"] == y["k"]
        for start in range(-100, 4000, 50)
        if start <= x["ts"] < start + 100 and start <= y["ts"] < start + 100
    )
    assert sorted(result["out"]) == expected
    assert expected


@pytest.mark.parametrize(("lower_exclusive", "upper_exclusive"), [(False, False), (True, False), (False, True)])
def test_an_interval_join_job_in_reference_mode_matches_a_direct_computation(
    lower_exclusive: bool, upper_exclusive: bool
) -> None:
    job = (
        SOURCES
        + f"""
from datetime import timedelta
from weir.api import ProcessJoinFunction

class Pair(ProcessJoinFunction):
    def process_element(self, left, right, ctx, out):
        out.collect((left["id"], right["id"], ctx.timestamp))

def build(env):
    a, b = sources(env)
    joined = a.key_by("k").interval_join(b.key_by("k")).between(timedelta(milliseconds=-20), 30)
    if {lower_exclusive}:
        joined = joined.lower_exclusive()
    if {upper_exclusive}:
        joined = joined.upper_exclusive()
    joined.process(Pair(), uid="join").print(uid="out")
"""
    )
    result = run_reference_source(job)
    assert result.late_records == {"join": 0}
    low, high = -20 + lower_exclusive, 30 - upper_exclusive
    expected = sorted(
        (x["id"], y["id"], max(x["ts"], y["ts"]))
        for x in A
        for y in B
        if x["k"] == y["k"] and x["ts"] + low <= y["ts"] <= x["ts"] + high
    )
    assert sorted(result["out"]) == expected
    assert any(y["ts"] - x["ts"] in (-20, 30) for x in A for y in B if x["k"] == y["k"])  # the bounds are hit


def test_a_keyed_co_process_job_in_reference_mode_keeps_state_across_both_inputs() -> None:
    job = (
        SOURCES
        + """
from weir.api import KeyedCoProcessFunction

class LastOfEach(KeyedCoProcessFunction):
    def process_element1(self, value, ctx, out):
        ctx.value_state("a").update(value["id"])
        ctx.timer_service().register_event_time_timer(4_000)

    def process_element2(self, value, ctx, out):
        ctx.list_state("b").add(value["id"])

    def on_timer(self, timestamp, ctx, out):
        out.collect((ctx.key, ctx.value_state("a").value(), len(ctx.list_state("b").get())))

def build(env):
    a, b = sources(env)
    a.connect(b).key_by("k", lambda e: e["k"]).process(LastOfEach(), uid="co").print(uid="out")
"""
    )
    result = run_reference_source(job)
    expected = sorted((k, max(x["id"] for x in A if x["k"] == k), sum(1 for y in B if y["k"] == k)) for k in range(5))
    assert sorted(result["out"]) == expected
