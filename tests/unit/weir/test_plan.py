"""The physical plan: which operators chain into one vertex, and how channels are numbered on both sides."""

from __future__ import annotations

from collections import Counter
from typing import Any

from weir.api import CoProcessFunction, Environment, TumblingEventTimeWindows
from weir.graph import Partitioning
from weir.plan import JobPlan, build_plan


class Count:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def result(self, key: Any, window_start: int, window_end: int, acc: int) -> tuple[Any, int, int]:
        return key, window_start, acc


def generated(env: Environment, uid: str, parallelism: int | None = None) -> Any:
    return env.from_generator(
        lambda i: {"k": i % 7, "ts": i}, uid=uid, count=100, timestamp=lambda e: e["ts"], parallelism=parallelism
    )


def assert_channels_consistent(plan: JobPlan) -> None:
    """Every producer output channel lands on the consumer channel of the same (producer, subtask, gate, edge),
    and every consumer input channel is fed by exactly one producer output channel."""
    fed: Counter[tuple[str, int, int]] = Counter()
    for vertex in plan.vertices.values():
        for s in range(vertex.parallelism):
            for out in plan.output_channels(vertex.uid, s):
                edge = vertex.outputs[out.edge_index]
                assert out.consumer_vertex == edge.consumer_vertex
                inputs = plan.input_channels(out.consumer_vertex, out.consumer_subtask)
                target = inputs[out.consumer_channel]
                assert (target.producer_vertex, target.producer_subtask, target.gate) == (
                    vertex.uid,
                    s,
                    edge.input_index,
                )
                if edge.partitioning is Partitioning.FORWARD:
                    assert out.consumer_subtask == s
                fed[(out.consumer_vertex, out.consumer_subtask, out.consumer_channel)] += 1
    for vertex in plan.vertices.values():
        for s in range(vertex.parallelism):
            channels = plan.input_channels(vertex.uid, s)
            assert [c.channel for c in channels] == list(range(len(channels)))
            for c in channels:
                assert fed[(vertex.uid, s, c.channel)] == 1, f"{vertex.uid}#{s} channel {c.channel}"


def test_forward_operators_of_equal_parallelism_chain_into_one_vertex() -> None:
    env = Environment("j", parallelism=3)
    generated(env, "src").map(lambda e: e, uid="m").filter(lambda e: True, uid="f").print(uid="out")
    plan = build_plan(env.graph)
    assert list(plan.vertices) == ["src"]
    vertex = plan.vertices["src"]
    assert vertex.operator_uids == ["src", "m", "f", "out"]
    assert vertex.chained == {"src": ["m"], "m": ["f"], "f": ["out"]}
    assert vertex.parallelism == 3
    assert vertex.is_source and not vertex.outputs
    assert plan.input_channels("src", 0) == [] and plan.output_channels("src", 2) == []
    assert plan.vertex_of_operator("f") is vertex


def test_key_by_breaks_the_chain_with_an_all_to_all_hash_edge() -> None:
    env = Environment("j", parallelism=2)
    keyed = generated(env, "src", parallelism=3).key_by(lambda e: e["k"])
    keyed.window(TumblingEventTimeWindows(10)).aggregate(Count(), uid="win").print(uid="out")
    plan = build_plan(env.graph)
    assert list(plan.vertices) == ["src", "win"]
    assert plan.vertices["win"].operator_uids == ["win", "out"]
    (edge,) = plan.vertices["src"].outputs
    assert plan.vertices["win"].inputs == [edge]
    assert (edge.producer_operator, edge.consumer_vertex, edge.partitioning) == ("src", "win", Partitioning.HASH)
    assert edge.key_selector is not None and edge.key_selector({"k": 5}) == 5
    for s in range(2):
        channels = plan.input_channels("win", s)
        assert [(c.channel, c.gate, c.producer_vertex, c.producer_subtask) for c in channels] == [
            (0, 0, "src", 0),
            (1, 0, "src", 1),
            (2, 0, "src", 2),
        ]
    for s in range(3):
        outs = plan.output_channels("src", s)
        assert [(o.consumer_subtask, o.consumer_channel) for o in outs] == [(0, s), (1, s)]
    assert plan.max_parallelism_over_vertices == 3
    assert_channels_consistent(plan)


def test_different_parallelism_is_not_chained_and_rebalances() -> None:
    env = Environment("j", parallelism=2)
    generated(env, "src").map(lambda e: e, uid="wide", parallelism=4).print(uid="out")
    plan = build_plan(env.graph)
    assert list(plan.vertices) == ["src", "wide", "out"]
    assert plan.vertices["src"].outputs[0].partitioning is Partitioning.REBALANCE
    assert plan.vertices["wide"].outputs[0].partitioning is Partitioning.REBALANCE
    assert len(plan.output_channels("src", 1)) == 4
    assert len(plan.input_channels("out", 0)) == 4
    assert_channels_consistent(plan)


def test_rebalance_and_broadcast_edges_are_not_chained_even_at_equal_parallelism() -> None:
    env = Environment("j", parallelism=2)
    src = generated(env, "src")
    src.rebalance().map(lambda e: e, uid="r").print(uid="r-out")
    src.broadcast().map(lambda e: e, uid="b").print(uid="b-out")
    plan = build_plan(env.graph)
    assert set(plan.vertices) == {"src", "r", "b"}
    assert [e.partitioning for e in plan.vertices["src"].outputs] == [Partitioning.REBALANCE, Partitioning.BROADCAST]
    assert_channels_consistent(plan)


def test_union_gets_its_own_vertex_with_one_gate_ordered_by_producer() -> None:
    env = Environment("j", parallelism=2)
    zeta = generated(env, "zeta", parallelism=1)
    alpha = generated(env, "alpha", parallelism=3)
    zeta.union(alpha, uid="u").print(uid="out")
    plan = build_plan(env.graph)
    assert plan.vertices["u"].operator_uids == ["u", "out"]
    channels = plan.input_channels("u", 1)
    # Numbered by (gate, producer vertex): alpha's three subtasks before zeta's one.
    assert [(c.channel, c.gate, c.producer_vertex, c.producer_subtask) for c in channels] == [
        (0, 0, "alpha", 0),
        (1, 0, "alpha", 1),
        (2, 0, "alpha", 2),
        (3, 0, "zeta", 0),
    ]
    assert [o.consumer_channel for o in plan.output_channels("zeta", 0)] == [3, 3]
    assert_channels_consistent(plan)


def test_forward_network_edges_are_pointwise() -> None:
    env = Environment("j", parallelism=3)
    a = generated(env, "a")
    b = generated(env, "b")
    a.union(b, uid="u").print(uid="out")
    plan = build_plan(env.graph)
    assert {e.partitioning for e in plan.vertices["u"].inputs} == {Partitioning.FORWARD}
    for s in range(3):
        channels = plan.input_channels("u", s)
        assert [(c.producer_vertex, c.producer_subtask) for c in channels] == [("a", s), ("b", s)]
        (out_a,) = plan.output_channels("a", s)
        (out_b,) = plan.output_channels("b", s)
        assert (out_a.channel, out_a.consumer_subtask, out_a.consumer_channel) == (s, s, 0)
        assert (out_b.channel, out_b.consumer_subtask, out_b.consumer_channel) == (s, s, 1)
    assert_channels_consistent(plan)


class PassThrough(CoProcessFunction):
    pass


def test_two_input_operator_numbers_first_gate_before_second() -> None:
    env = Environment("j", parallelism=2)
    first = generated(env, "zz-first")
    second = generated(env, "aa-second", parallelism=1)
    first.key_by(lambda e: e["k"]).connect(second.broadcast()).process(PassThrough(), uid="co").print(uid="out")
    plan = build_plan(env.graph)
    co = plan.vertices["co"]
    assert sorted((e.producer_vertex, e.input_index, e.partitioning) for e in co.inputs) == [
        ("aa-second", 1, Partitioning.BROADCAST),
        ("zz-first", 0, Partitioning.HASH),
    ]
    channels = plan.input_channels("co", 0)
    assert [(c.gate, c.producer_vertex, c.producer_subtask) for c in channels] == [
        (0, "zz-first", 0),
        (0, "zz-first", 1),
        (1, "aa-second", 0),
    ]
    assert [(o.consumer_subtask, o.consumer_channel) for o in plan.output_channels("aa-second", 0)] == [(0, 2), (1, 2)]
    assert_channels_consistent(plan)


def test_forward_two_input_edges_from_one_vertex_use_separate_gates() -> None:
    env = Environment("j", parallelism=2)
    src = generated(env, "src")
    left = src.map(lambda e: e, uid="left")
    right = src.map(lambda e: e, uid="right")
    left.connect(right).process(PassThrough(), uid="co").print(uid="out")
    plan = build_plan(env.graph)
    assert plan.vertices["src"].operator_uids == ["src", "left", "right"]
    channels = plan.input_channels("co", 1)
    assert [(c.channel, c.gate, c.producer_vertex, c.producer_subtask) for c in channels] == [
        (0, 0, "src", 1),
        (1, 1, "src", 1),
    ]
    assert_channels_consistent(plan)


def test_several_chained_outputs_into_one_consumer_land_on_distinct_channels() -> None:
    """Two branches chained in the source vertex, unioned again: both forward edges have the same producer
    vertex, subtask and gate, so the consumer channel must be told apart by the edge."""
    env = Environment("j", parallelism=2)
    src = generated(env, "src")
    evens = src.filter(lambda e: e["ts"] % 2 == 0, uid="evens")
    odds = src.filter(lambda e: e["ts"] % 2 == 1, uid="odds")
    evens.union(odds, uid="u").print(uid="out")
    plan = build_plan(env.graph)
    source = plan.vertices["src"]
    assert source.chained == {"src": ["evens", "odds"]}
    assert [e.producer_operator for e in source.outputs] == ["evens", "odds"]
    assert [e.producer_operator for e in source.outputs_of("odds")] == ["odds"]
    for s in range(2):
        outs = plan.output_channels("src", s)
        assert [(o.edge_index, o.consumer_subtask, o.consumer_channel) for o in outs] == [(0, s, 0), (1, s, 1)]
    assert_channels_consistent(plan)


def test_a_larger_graph_is_consistent_everywhere() -> None:
    env = Environment("j", parallelism=3)
    a = generated(env, "a", parallelism=2)
    b = generated(env, "b", parallelism=4)
    mapped = a.map(lambda e: e, uid="a-map", parallelism=2)
    merged = mapped.union(b, a, uid="merge")
    keyed = merged.key_by(lambda e: e["k"])
    windowed = keyed.window(TumblingEventTimeWindows(5)).aggregate(Count(), uid="win", parallelism=2)
    windowed.connect(b.broadcast()).process(PassThrough(), uid="co").print(uid="out")
    keyed.reduce(lambda x, y: x, uid="reduce").map(lambda e: e, uid="tail", parallelism=1).print(uid="tail-out")
    plan = build_plan(env.graph)
    assert plan.vertices["a"].operator_uids == ["a", "a-map"]
    assert plan.vertices["reduce"].operator_uids == ["reduce"]
    assert plan.vertices["tail"].operator_uids == ["tail"]  # print() runs at the default parallelism
    assert_channels_consistent(plan)


def test_building_a_graph_with_external_sinks_connects_nowhere() -> None:
    env = Environment("j", parallelism=1)
    src = generated(env, "src")
    src.sink_to_kafka("topic", uid="kafka")
    src.sink_to_postgres("t", uid="pg", columns=("k", "ts"), key_columns=("k",))
    src.sink_to_file("/nonexistent/dir/out", uid="file")
    plan = build_plan(env.graph)
    assert plan.vertices["src"].chained == {"src": ["kafka", "pg", "file"]}
    assert env.graph.transformations["kafka"].name == "kafka-sink:topic"
