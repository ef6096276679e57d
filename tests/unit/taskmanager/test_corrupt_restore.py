"""A checkpoint whose operator state cannot be read (damaged, or of an unknown format version): the
restore fails with one error naming the operator and what is wrong, and that failure is not retriable
(a restart would read the same bytes), so the job fails at once instead of restarting in a loop."""

from __future__ import annotations

import json

import pytest

from weir.api import Environment, TumblingEventTimeWindows
from weir.core.errors import Fault, SerializationError
from weir.core.failures import Failure
from weir.core.keygroups import KeyGroup, KeyGroupRange
from weir.operators.base import OperatorContext, StreamOperator
from weir.plan import build_plan
from weir.taskmanager.chain import OperatorChain


class Count:
    def create(self) -> int:
        return 0

    def add(self, acc: int, _v: object) -> int:
        return acc + 1

    def result(self, key: object, start: int, end: int, acc: int) -> int:
        return acc


class NoEdge:
    """An edge out of the chain that nothing here sends to (only restores run)."""

    def emit(self, value: object, timestamp: int | None) -> None:
        raise AssertionError("no record leaves the chain in these tests")

    def emit_watermark(self, watermark: int) -> None:
        raise AssertionError("no watermark leaves the chain in these tests")

    def end_of_stream(self) -> None:
        raise AssertionError("no channel ends in these tests")


def context(uid: str) -> OperatorContext:
    return OperatorContext("job", "job", uid, 0, 1, 128, 1, KeyGroupRange(KeyGroup(0), KeyGroup(127)), {}, None)


def chain_of(vertex: str) -> OperatorChain:
    env = Environment("job")
    numbers = env.from_generator(lambda i: {"k": i % 3, "ts": i}, uid="numbers", count=10, timestamp=lambda e: e["ts"])
    numbers.key_by(lambda e: e["k"]).window(TumblingEventTimeWindows(5)).aggregate(Count(), uid="count").print(
        uid="out"
    )
    plan = build_plan(env.graph)
    graph = plan.graph

    def operator_of(uid: str) -> StreamOperator:
        op: StreamOperator = graph.transformations[uid].factory()
        return op

    return OperatorChain(plan.vertices[vertex], operator_of, [NoEdge()] * len(plan.vertices[vertex].outputs), context)


@pytest.mark.parametrize(
    ("vertex", "uid", "state", "complaint"),
    [
        ("numbers", "numbers", b"\x00garbage", "generator source state is not a JSON document"),
        ("numbers", "numbers", json.dumps({"format": 99, "next_k": 3}).encode(), "has format 99; this Weir reads"),
        ("numbers", "numbers", json.dumps({"format": 1}).encode(), "generator source state is malformed"),
        ("count", "count", b"{", "window operator state is not a JSON document"),
        ("count", "count", json.dumps({"format": 99, "watermark": 0}).encode(), "has format 99; this Weir reads"),
    ],
)
def test_unreadable_operator_state_names_the_operator_and_fails_without_restarts(
    vertex: str, uid: str, state: bytes, complaint: str
) -> None:
    chain = chain_of(vertex)
    with pytest.raises(SerializationError, match=complaint) as raised:
        chain.restore({uid: state})
    assert str(raised.value).startswith(f"operator {uid!r} (")
    assert "restore it with the Weir version that wrote it" in str(raised.value) or "malformed" in str(raised.value)
    failure = Failure.from_exception(raised.value)
    assert failure.retriable is False and failure.fault is Fault.INTERNAL
