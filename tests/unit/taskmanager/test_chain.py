"""OperatorChain and ChainInput with fakes: wiring in chain order, end of input, snapshots, and
watermarks, idleness and end of stream combined over the channels into the head."""

from __future__ import annotations

from typing import Any

from tests.unit.taskmanager.fakes import Journal, three_vertex_graph
from weir.core.ids import ChannelIndex
from weir.core.keygroups import KeyGroup, KeyGroupRange
from weir.core.watermarks import MAX_WATERMARK, WatermarkStatus
from weir.operators.base import OperatorContext, StreamOperator
from weir.plan import build_plan
from weir.taskmanager.chain import ChainInput, OperatorChain


class Edge:
    """An EdgeOutput that writes into the journal."""

    def __init__(self, journal: Journal, name: str) -> None:
        self.journal, self.name = journal, name

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.journal.add(self.name, "record", value)

    def emit_watermark(self, watermark: int) -> None:
        self.journal.add(self.name, "watermark", watermark)

    def end_of_stream(self) -> None:
        self.journal.add(self.name, "end_of_stream")


def context(uid: str) -> OperatorContext:
    return OperatorContext("job", "job", uid, 0, 1, 128, 1, KeyGroupRange(KeyGroup(0), KeyGroup(127)), {}, None)


def op_chain(journal: Journal) -> OperatorChain:
    """The ``op -> sink`` vertex, its edge to ``down`` written to the journal as ``edge``."""
    plan = build_plan(three_vertex_graph(journal))
    graph = plan.graph

    def operator_of(uid: str) -> StreamOperator:
        op: StreamOperator = graph.transformations[uid].factory()
        return op

    return OperatorChain(plan.vertices["op"], operator_of, [Edge(journal, "edge")], context)


def test_a_record_goes_to_the_chained_operator_first_then_to_the_edge() -> None:
    journal = Journal()
    chain = op_chain(journal)
    assert [type(op).__name__ for op in chain.operators] == ["Recording", "Recording"] and chain.source is None
    chain.head.process("x", 1)
    assert journal.entries == [("op", "record", "x"), ("sink", "record", "x"), ("edge", "record", "x")]


def test_end_of_input_flushes_every_operator_in_chain_order_then_ends_every_edge() -> None:
    journal = Journal()
    op_chain(journal).end_input()
    assert journal.entries == [("op", "end_input"), ("sink", "end_input"), ("edge", "end_of_stream")]


def test_open_goes_from_the_last_operator_to_the_head_and_a_snapshot_holds_each_operator() -> None:
    journal = Journal()
    chain = op_chain(journal)
    chain.open()
    assert journal.entries == [("sink", "open"), ("op", "open")]
    assert chain.snapshot(4) == {"op": b"op@4", "sink": b"sink@4"}
    chain.restore({"sink": b"s"})
    assert journal.entries[-1] == ("sink", "restore", b"s")


def test_the_head_watermark_is_the_minimum_over_live_channels() -> None:
    journal = Journal()
    chain = op_chain(journal)
    statuses: list[WatermarkStatus] = []
    chain_input = ChainInput(chain, [0, 0, 0], announce=statuses.append)
    chain_input.watermark(ChannelIndex(0), 30)
    chain_input.watermark(ChannelIndex(1), 10)
    chain_input.idle(ChannelIndex(2))  # left out of the minimum while idle
    assert journal.of("op") == [("watermark", 10)]
    chain_input.end_of_stream(ChannelIndex(1))
    assert journal.of("op")[-1] == ("watermark", 30) and not chain_input.all_ended
    chain_input.end_of_stream(ChannelIndex(0))  # only the idle channel is left
    assert statuses == [WatermarkStatus.IDLE]
    chain_input.record(ChannelIndex(2), "late", None)  # a record makes it active again
    assert statuses == [WatermarkStatus.IDLE, WatermarkStatus.ACTIVE]
    chain_input.end_of_stream(ChannelIndex(2))
    assert journal.of("op")[-1] == ("watermark", MAX_WATERMARK) and chain_input.all_ended


def test_a_two_input_head_is_told_which_input_each_channel_feeds() -> None:
    journal = Journal()
    chain = op_chain(journal)
    chain_input = ChainInput(chain, [0, 1])
    chain_input.records(ChannelIndex(1), ["b"], [None])
    chain_input.record(ChannelIndex(0), "a", None)
    assert journal.of("op") == [("input", 1, "b"), ("input", 0, "a")]
