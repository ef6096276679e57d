"""OperatorChain routing of side outputs: a value emitted to a tag reaches the chained operators and
edges that take that tag only, the main output's reach the main ones only, every watermark reaches
all of them, and a tag nothing takes is dropped."""

from __future__ import annotations

from typing import Any

from tests.unit.taskmanager.fakes import Journal, Recording
from weir.core.keygroups import KeyGroup, KeyGroupRange
from weir.core.process_functions import OutputTag
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.operators.base import NO_SIDE_OUTPUTS, OperatorContext, StreamOperator
from weir.plan import build_plan
from weir.taskmanager.chain import OperatorChain

ODD = OutputTag("odd")
UNTAKEN = OutputTag("untaken")


class Splitter(StreamOperator):
    """Even values to the main output, odd ones to ``ODD``; every value to ``UNTAKEN`` too."""

    def process(self, value: Any, timestamp: int | None) -> None:
        if value % 2:
            self.side_outputs.emit(ODD, value, timestamp)
        else:
            self.output.emit(value, timestamp)
        self.side_outputs.emit(UNTAKEN, value, timestamp)


class EdgeOut:
    """An EdgeOutput that writes into the journal, with each record's timestamp."""

    def __init__(self, journal: Journal, name: str) -> None:
        self.journal, self.name = journal, name

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.journal.add(self.name, "record", value, timestamp)

    def emit_watermark(self, watermark: int) -> None:
        self.journal.add(self.name, "watermark", watermark)

    def end_of_stream(self) -> None:
        self.journal.add(self.name, "end_of_stream")


def context(uid: str) -> OperatorContext:
    return OperatorContext("job", "job", uid, 0, 1, 128, 1, KeyGroupRange(KeyGroup(0), KeyGroup(127)), {}, None)


def side_output_graph(journal: Journal) -> LogicalGraph:
    """``split`` (the head) with chained ``evens`` (main) and ``odds`` (side ODD), and network edges
    to ``remote-evens`` (main) and ``remote-odds`` (side ODD)."""
    graph = LogicalGraph("side-outputs", 1, 128)
    graph.add(Transformation("split", "split", OperatorKind.ONE_INPUT, Splitter))
    for uid in ("evens", "odds", "remote-evens", "remote-odds"):
        graph.add(Transformation(uid, uid, OperatorKind.SINK, lambda uid=uid: Recording(journal, uid)))
    graph.connect(Edge("split", "evens", Partitioning.FORWARD))
    graph.connect(Edge("split", "odds", Partitioning.FORWARD, side_output=ODD))
    graph.connect(Edge("split", "remote-evens", Partitioning.HASH, key_selector=lambda v: v))
    graph.connect(Edge("split", "remote-odds", Partitioning.REBALANCE, side_output=ODD))
    return graph


def split_chain(journal: Journal) -> OperatorChain:
    plan = build_plan(side_output_graph(journal))
    vertex = plan.vertices["split"]
    edges = [EdgeOut(journal, edge.consumer_vertex) for edge in vertex.outputs]
    return OperatorChain(vertex, lambda uid: plan.graph.transformations[uid].factory(), edges, context)


def test_the_plan_chains_a_side_output_and_keeps_its_tag_on_the_network_edge() -> None:
    plan = build_plan(side_output_graph(Journal()))
    vertex = plan.vertices["split"]
    assert vertex.operator_uids == ["split", "evens", "odds"]
    assert vertex.chained == {"split": ["evens", "odds"]}
    assert vertex.chained_side_outputs == {"odds": ODD}
    edges = [(e.consumer_vertex, e.side_output) for e in vertex.outputs]
    assert edges == [("remote-evens", None), ("remote-odds", ODD)]


def test_main_records_reach_the_main_consumers_and_tagged_ones_the_tags_consumers_only() -> None:
    journal = Journal()
    chain = split_chain(journal)
    for value, ts in ((2, 20), (3, 30)):
        chain.head.process(value, ts)
    assert journal.entries == [
        ("evens", "record", 2),
        ("remote-evens", "record", 2, 20),
        ("odds", "record", 3),
        ("remote-odds", "record", 3, 30),
    ]  # nothing takes UNTAKEN: dropped


def test_a_watermark_reaches_the_consumers_of_every_output_and_end_of_input_ends_every_edge() -> None:
    journal = Journal()
    chain = split_chain(journal)
    chain.head.process_watermark(7)
    chain.end_input()
    assert journal.entries == [
        ("evens", "watermark", 7),
        ("odds", "watermark", 7),
        ("remote-evens", "watermark", 7),
        ("remote-odds", "watermark", 7),
        ("evens", "end_input"),
        ("odds", "end_input"),
        ("remote-evens", "end_of_stream"),
        ("remote-odds", "end_of_stream"),
    ]


def test_an_operator_whose_side_outputs_nothing_takes_gets_no_side_outputs() -> None:
    journal = Journal()
    graph = side_output_graph(journal)
    graph.edges = [e for e in graph.edges if e.side_output is None]
    plan = build_plan(graph)
    vertex = plan.vertices["split"]
    chain = OperatorChain(
        vertex,
        lambda uid: plan.graph.transformations[uid].factory(),
        [EdgeOut(journal, e.consumer_vertex) for e in vertex.outputs],
        context,
    )
    assert chain.head.side_outputs is NO_SIDE_OUTPUTS
    chain.head.process(3, 1)
    chain.head.process(4, 2)
    assert journal.entries == [("evens", "record", 4), ("remote-evens", "record", 4, 2)]


def test_a_chained_operator_may_take_a_side_output_of_a_chained_operator() -> None:
    journal = Journal()
    graph = LogicalGraph("nested", 1, 128)
    graph.add(Transformation("head", "head", OperatorKind.ONE_INPUT, lambda: Recording(journal, "head")))
    graph.add(Transformation("split", "split", OperatorKind.ONE_INPUT, Splitter))
    graph.add(Transformation("odds", "odds", OperatorKind.SINK, lambda: Recording(journal, "odds")))
    graph.connect(Edge("head", "split", Partitioning.FORWARD))
    graph.connect(Edge("split", "odds", Partitioning.FORWARD, side_output=ODD))
    plan = build_plan(graph)
    assert list(plan.vertices) == ["head"]
    chain = OperatorChain(plan.vertices["head"], lambda uid: graph.transformations[uid].factory(), [], context)
    for value in (1, 2, 5):
        chain.head.process(value, None)
    assert journal.of("odds") == [("record", 1), ("record", 5)]
