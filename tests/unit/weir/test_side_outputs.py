"""Side outputs in the job API and the graph: ``get_side_output`` edges (forward, keyed, rebalanced,
chained when they can be), the one-meaning-per-name check, ``side_output_late_data``, and a
reference-mode run of jobs with side outputs giving exactly the expected captures."""

from __future__ import annotations

import pytest

from weir.api import Environment, OutputTag, TumblingEventTimeWindows
from weir.core.errors import JobDefinitionError
from weir.graph import Partitioning
from weir.plan import build_plan
from weir.tools.reference import run_reference_source


class Split:
    def process_element(self, value: int, ctx: object, out: object) -> None: ...


def test_get_side_output_edges_carry_their_tag_and_chain_when_they_can() -> None:
    env = Environment("side", parallelism=2)
    odd = OutputTag("odd", int)
    split = env.from_collection([1, 2, 3], uid="src").process(Split(), uid="split")
    split.get_side_output(odd).map(lambda v: v, uid="odd-map").sink(print, uid="odd-sink")
    split.get_side_output(odd).key_by(lambda v: v).map(lambda v: v, uid="odd-keyed").sink(print, uid="k-sink")
    split.get_side_output(odd).map(lambda v: v, uid="odd-wide", parallelism=3).sink(print, uid="w-sink")
    split.sink(print, uid="main-sink")
    graph = env.graph
    graph.validate()
    edges = {e.target_uid: (e.source_uid, e.partitioning, e.side_output) for e in graph.edges}
    assert edges["odd-map"] == ("split", Partitioning.FORWARD, odd)
    assert edges["odd-keyed"] == ("split", Partitioning.HASH, odd)
    assert edges["odd-wide"] == ("split", Partitioning.REBALANCE, odd)
    assert edges["main-sink"] == ("split", Partitioning.FORWARD, None)
    plan = build_plan(graph)
    head = plan.vertices["src"]
    assert head.chained["split"] == ["odd-map", "main-sink"]
    assert head.chained_side_outputs == {"odd-map": odd}
    assert sorted((e.consumer_vertex, e.side_output) for e in head.outputs) == [
        ("odd-keyed", odd),
        ("odd-wide", odd),
    ]


def test_a_side_output_name_taken_with_two_value_types_is_refused() -> None:
    env = Environment("side")
    split = env.from_collection([1], uid="src").process(Split(), uid="split")
    split.get_side_output(OutputTag("x", int)).sink(print, uid="a")
    split.get_side_output(OutputTag("x", int)).sink(print, uid="b")  # the same meaning: fine
    for other in (OutputTag("x", str), OutputTag("x")):
        with pytest.raises(JobDefinitionError, match="side output 'x' is taken as"):
            split.get_side_output(other)
    split.get_side_output(OutputTag("y")).sink(print, uid="c")  # another name: fine


def test_a_window_declares_its_late_data_tag_and_a_tag_it_never_emits_is_allowed() -> None:
    env = Environment("side")
    keyed = env.from_collection([1], uid="src", timestamp=lambda v: v).key_by(lambda v: v)
    late = OutputTag("late", int)
    windows = keyed.window(TumblingEventTimeWindows(10)).side_output_late_data(late).reduce(max, uid="w")
    assert env.graph.transformations["w"].side_outputs == (late,)
    windows.get_side_output(OutputTag("never")).sink(print, uid="never-sink")  # Flink allows it
    with pytest.raises(JobDefinitionError, match="side output 'late'"):
        windows.get_side_output(OutputTag("late", str))


def test_get_side_output_refuses_what_has_no_side_outputs() -> None:
    env = Environment("side")
    split = env.from_collection([1], uid="src").process(Split(), uid="split")
    with pytest.raises(JobDefinitionError, match="takes an OutputTag"):
        split.get_side_output("odd")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="no side outputs of its own"):
        split.get_side_output(OutputTag("a")).get_side_output(OutputTag("b"))


PROCESS_JOB = """
from weir.api import Environment, KeyedProcessFunction, OutputTag, ProcessFunction

ODD = OutputTag("odd", int)
ALARM = OutputTag("alarm")


class Split(ProcessFunction):
    def process_element(self, value, ctx, out):
        if value % 2:
            ctx.output(ODD, value)
            ctx.output(OutputTag("unread"), value)
        else:
            out.collect(value)


class Alarm(KeyedProcessFunction):
    def process_element(self, value, ctx, out):
        ctx.timer_service().register_event_time_timer(ctx.timestamp + 100)
        out.collect(value * 10)

    def on_timer(self, timestamp, ctx, out):
        ctx.output(ALARM, (ctx.key, timestamp))


def build(env: Environment) -> None:
    split = env.from_generator(lambda i: i, uid="gen", count=6, timestamp=lambda v: 1000 + v).process(
        Split(), uid="split")
    split.sink(lambda v: None, uid="evens")
    split.get_side_output(ODD).map(lambda v: -v, uid="negate").sink(lambda v: None, uid="odds")
    alarms = split.get_side_output(ODD).key_by(lambda v: v % 3).process(Alarm(), uid="alarm")
    alarms.sink(lambda v: None, uid="tens")
    alarms.get_side_output(ALARM).rebalance().sink(lambda v: None, uid="alarms")
"""


def test_a_reference_run_captures_each_side_output_exactly() -> None:
    result = run_reference_source(PROCESS_JOB)
    assert result["evens"] == [0, 2, 4]
    assert result["odds"] == [-1, -3, -5]
    assert result["tens"] == [10, 30, 50]
    assert sorted(result["alarms"]) == [(0, 1103), (1, 1101), (2, 1105)]


LATE_JOB = """
from weir.api import Environment, OutputTag, TumblingEventTimeWindows

LATE = OutputTag("late")
EVENTS = [("a", 1, 5), ("a", 2, 25), ("a", 4, 8), ("b", 8, 30), ("b", 16, 12)]


def build(env: Environment) -> None:
    events = env.from_collection(EVENTS, uid="gen", timestamp=lambda e: e[2])
    sums = events.key_by(lambda e: e[0]).window(TumblingEventTimeWindows(10)).side_output_late_data(
        LATE).reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])), uid="window")
    sums.sink(lambda v: None, uid="sums")
    sums.get_side_output(LATE).sink(lambda v: None, uid="late")
"""


def test_a_reference_run_sends_late_window_data_to_its_side_output() -> None:
    result = run_reference_source(LATE_JOB)
    assert result["late"] == [("a", 4, 8), ("b", 16, 12)]
    assert sorted(result["sums"]) == [("a", 1, 5), ("a", 2, 25), ("b", 8, 30)]
    assert result.late_records == {"window": 2}


CO_AND_WINDOW_JOB = """
from weir.api import (CoProcessFunction, Environment, OutputTag, ProcessWindowFunction,
                      TumblingEventTimeWindows)

REJECTED = OutputTag("rejected")
BIG = OutputTag("big")


class Admit(CoProcessFunction):
    def process_element1(self, value, ctx, out):
        if value < 0:
            ctx.output(REJECTED, ("first", value, ctx.timestamp))
        else:
            out.collect(value)

    def process_element2(self, value, ctx, out):
        if value < 0:
            ctx.output(REJECTED, ("second", value, ctx.timestamp))
        else:
            out.collect(value)


class Totals(ProcessWindowFunction):
    def process(self, key, context, elements, out):
        total = sum(elements)
        if total > 10:
            context.output(BIG, (key, context.window.start, total))
        out.collect((key, context.window.start, total))


def build(env: Environment) -> None:
    first = env.from_collection([1, -2, 3, 9], uid="first", timestamp=lambda v: abs(v))
    second = env.from_collection([-4, 5], uid="second", timestamp=lambda v: 10 + abs(v))
    admitted = first.connect(second).process(Admit(), uid="admit")
    admitted.get_side_output(REJECTED).sink(lambda v: None, uid="rejected")
    totals = admitted.key_by(lambda v: v % 2).window(TumblingEventTimeWindows(10)).process(Totals(), uid="totals")
    totals.sink(lambda v: None, uid="totals-out")
    totals.map(lambda v: v, uid="stamped").sink(lambda v: None, uid="totals-copy")
    totals.get_side_output(BIG).sink(lambda v: None, uid="big")
"""


def test_a_co_process_function_and_a_window_process_function_emit_side_outputs() -> None:
    result = run_reference_source(CO_AND_WINDOW_JOB)
    assert sorted(result["rejected"]) == [("first", -2, 2), ("second", -4, 14)]
    assert sorted(result["totals-out"]) == [(1, 0, 13), (1, 10, 5)]
    assert result["big"] == [(1, 0, 13)]
