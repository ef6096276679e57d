"""Keyed operators driven directly: ReduceOperator and KeyedProcessOperator with ValueState and MapState."""

from __future__ import annotations

from typing import Any

from tests.unit.conftest import StartOperator
from weir.api import Collector, KeyedProcessFunction
from weir.core.keygroups import key_group_for_key, key_to_bytes
from weir.operators.keyed import KeyedProcessContext, KeyedProcessOperator, ReduceOperator


def add(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return a[0], a[1] + b[1]


def test_reduce_emits_the_running_reduction_per_key(start_operator: StartOperator) -> None:
    op = ReduceOperator(add, lambda v: v[0])
    out = start_operator(op, uid="sum")
    for i, key in enumerate("abab"):
        op.process((key, i + 1), 100 + i)
    op.process(("c", 7), None)
    assert out.records == [(("a", 1), 100), (("b", 2), 101), (("a", 4), 102), (("b", 6), 103), (("c", 7), None)]


def test_reduce_state_outlives_the_operator_instance(start_operator: StartOperator) -> None:
    first = ReduceOperator(add, lambda v: v[0])
    start_operator(first, uid="sum")
    first.process(("a", 5), None)
    assert first.snapshot_state(1) is None  # keyed state lives in the backend, flushed by the snapshot
    second = ReduceOperator(add, lambda v: v[0])
    out = start_operator(second, uid="sum")
    second.process(("a", 1), None)
    other_uid = ReduceOperator(add, lambda v: v[0])
    other_out = start_operator(other_uid, uid="other-sum")
    other_uid.process(("a", 1), None)
    assert out.values == [("a", 6)]
    assert other_out.values == [("a", 1)]


def test_reduce_keys_by_the_canonical_key_group(start_operator: StartOperator) -> None:
    op = ReduceOperator(add, lambda v: v[0])
    start_operator(op, uid="sum", max_parallelism=16)
    op.process(("user-42", 1), None)
    assert op.current_key == "user-42"
    assert op.current_key_group == key_group_for_key("user-42", 16)


class CountAndRemember(KeyedProcessFunction):
    """Counts each key's values (ValueState) and the distinct items seen per key (MapState)."""

    def __init__(self) -> None:
        self.opened_with: Any = None

    def open(self, ctx: KeyedProcessContext) -> None:
        self.opened_with = ctx

    def process_element(self, value: tuple[str, str], ctx: Any, out: Collector) -> None:
        count_state = ctx.value_state("count")
        count = (count_state.value() or 0) + 1
        seen = ctx.map_state("seen")
        first_time = seen.get(value[1]) is None
        seen.put(value[1], ctx.timestamp)
        if value[1] == "reset":
            count_state.clear()
            seen.remove("reset")
            out.collect((ctx.key, "cleared"), timestamp=0)
            return
        count_state.update(count)
        out.collect((ctx.key, count, first_time))


def test_keyed_process_keeps_value_and_map_state_per_key(start_operator: StartOperator) -> None:
    fn = CountAndRemember()
    op = KeyedProcessOperator(fn, lambda v: v[0])
    out = start_operator(op, uid="proc")
    assert isinstance(fn.opened_with, KeyedProcessContext)
    op.process(("a", "x"), 10)
    op.process(("b", "x"), 11)
    op.process(("a", "x"), 12)
    op.process(("a", "y"), 13)
    op.process(("a", "reset"), 14)
    op.process(("a", "reset"), 15)
    op.process(("a", "x"), None)
    assert out.records == [
        (("a", 1, True), 10),
        (("b", 1, True), 11),
        (("a", 2, False), 12),
        (("a", 3, True), 13),
        (("a", "cleared"), 0),
        (("a", "cleared"), 0),
        (("a", 1, False), None),
    ]


def test_keyed_process_state_survives_a_new_instance_after_a_snapshot(start_operator: StartOperator) -> None:
    first = KeyedProcessOperator(CountAndRemember(), lambda v: v[0])
    start_operator(first, uid="proc")
    first.process(("a", "x"), 1)
    first.process(("a", "y"), 2)
    first.snapshot_state(1)
    second = KeyedProcessOperator(CountAndRemember(), lambda v: v[0])
    out = start_operator(second, uid="proc")
    second.process(("a", "y"), 3)
    second.process(("a", "z"), 4)
    assert out.values == [("a", 3, False), ("a", 4, True)]


class Echo(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
        state = ctx.value_state("last")
        previous = state.value()
        state.update(value[1])
        out.collect((ctx.key, previous))


def test_value_state_can_hold_none(start_operator: StartOperator) -> None:
    op = KeyedProcessOperator(Echo(), lambda v: v[0])
    out = start_operator(op, uid="echo")
    op.process(("a", 1), None)
    op.store.flush()
    op.process(("a", None), None)
    op.process(("a", 2), None)
    assert out.values == [("a", None), ("a", 1), ("a", None)]


def test_two_jobs_with_the_same_operator_uid_keep_their_state_apart(start_operator: Any) -> None:
    """One RocksDB serves every job on a TaskManager: state is namespaced by job id, not by uid alone."""
    first = ReduceOperator(lambda a, b: a + b, lambda v: "k")
    out_first = start_operator(first, uid="sum", job_id="job-a")
    second = ReduceOperator(lambda a, b: a + b, lambda v: "k")
    out_second = start_operator(second, uid="sum", job_id="job-b")
    for value in (1, 2, 3):
        first.process(value, None)
    first.store.flush()  # into the shared database, where the second job would find it under the same uid
    second.process(100, None)
    assert [v for v, _ in out_first.records] == [1, 3, 6]
    assert [v for v, _ in out_second.records] == [100]


def test_equal_keys_of_different_types_keep_their_own_encoding_and_key_group(start_operator: StartOperator) -> None:
    op = ReduceOperator(lambda a, b: b, key_selector=lambda v: v)
    start_operator(op, uid="types")
    for key in [1, 1.0, True, "1", b"1", 1, (1, "a"), (1.0, "a"), "1", 1.0]:  # 1 == 1.0 == True, all hash alike
        op.process(key, None)
        assert op.current_key_bytes == key_to_bytes(key), key
        assert op.current_key_group == key_group_for_key(key, 128), key
        assert op.current_key_prefix == len(key_to_bytes(key)).to_bytes(4, "big") + key_to_bytes(key), key
