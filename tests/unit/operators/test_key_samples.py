"""Key samples (``weir.core.key_samples``): which records a keyed operator samples, how many it keeps,
and the key function's fingerprint."""

from __future__ import annotations

import functools
import operator
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.core.errors import SerializationError
from weir.core.key_samples import (
    KEY_SAMPLE_STATE,
    SAMPLES_AT_OPEN,
    SAMPLES_PER_INTERVAL,
    SLOTS_PER_KEY_GROUP,
    KeySample,
    key_function_fingerprint,
)
from weir.core.state_layout import load_value
from weir.operators.keyed import KeyedCoProcessOperator, ReduceOperator

MAX_PARALLELISM = 128


def stored_samples(op: Any) -> list[KeySample]:
    return [
        KeySample.from_stored(value)
        for group in op.ctx.key_group_range
        for _slot, value in op.store.items(KEY_SAMPLE_STATE, group)
    ]


def add(a: int, b: int) -> int:
    return a + b


def test_the_first_records_after_opening_and_after_each_checkpoint_are_sampled(
    start_operator: StartOperator,
) -> None:
    op = ReduceOperator(add, lambda v: v)
    start_operator(op, uid="r")
    for n in range(3 * SAMPLES_AT_OPEN):
        op.process(n, None)
    first = stored_samples(op)
    assert {load_value(s.record) for s in first} <= set(range(SAMPLES_AT_OPEN))
    assert len(first) > SAMPLES_AT_OPEN // 2  # few share a key group and slot
    assert op.samples_left == 0
    op.snapshot_state(1)
    assert op.samples_left == SAMPLES_PER_INTERVAL
    for n in range(1000, 1000 + SAMPLES_PER_INTERVAL + 5):
        op.process(n, None)
    after = {load_value(s.record) for s in stored_samples(op)}
    assert after & set(range(1000, 1000 + SAMPLES_PER_INTERVAL))
    assert not after & set(range(1000 + SAMPLES_PER_INTERVAL, 1000 + SAMPLES_PER_INTERVAL + 5))
    for s in stored_samples(op):
        assert s.key_bytes == (load_value(s.record)).to_bytes(8, "big", signed=True)
        assert s.key_repr == repr(load_value(s.record))


def test_an_operator_keeps_at_most_slots_per_key_group(start_operator: StartOperator) -> None:
    op = ReduceOperator(add, lambda v: v)
    start_operator(op, uid="r")
    for checkpoint in range(1, 2000):
        for n in range(SAMPLES_PER_INTERVAL):
            op.process(checkpoint * 1000 + n, None)
        op.snapshot_state(checkpoint)
    per_group = [sum(1 for _ in op.store.items(KEY_SAMPLE_STATE, g)) for g in range(MAX_PARALLELISM)]
    assert max(per_group) == SLOTS_PER_KEY_GROUP
    assert sum(per_group) <= MAX_PARALLELISM * SLOTS_PER_KEY_GROUP


def test_sampling_is_deterministic(start_operator: StartOperator) -> None:
    def run(uid: str) -> list[tuple[bytes, bytes]]:
        op = ReduceOperator(add, lambda v: v % 1000)
        start_operator(op, uid=uid)
        for n in range(500):
            op.process(n * 7, None)
        return sorted((s.key_bytes, s.record) for s in stored_samples(op))

    assert run("a") == run("b")


class Nothing:
    """Keeps no state; notes the records of input 0 in ``seen``."""

    def __init__(self, seen: list[Any] | None = None) -> None:
        self.seen = [] if seen is None else seen

    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        self.seen.append(value)

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        pass


def test_a_two_input_operator_samples_each_input_with_its_key_function(start_operator: StartOperator) -> None:
    op = KeyedCoProcessOperator(Nothing(), (lambda v: v["user"], lambda v: v[0]))
    start_operator(op, uid="co")
    op.process_input(0, {"user": "ann"}, 1)
    op.process_input(1, ("bob", 2), 1)
    samples = sorted((s.input_index, s.key_repr, load_value(s.record)) for s in stored_samples(op))
    assert samples == [(0, "'ann'", {"user": "ann"}), (1, "'bob'", ("bob", 2))]
    fingerprints = {s.input_index: s.fingerprint for s in stored_samples(op)}
    assert fingerprints[0] != fingerprints[1]


def test_a_record_that_does_not_pickle_is_not_sampled_and_still_processed(start_operator: StartOperator) -> None:
    seen: list[Any] = []
    op = KeyedCoProcessOperator(Nothing(seen), (lambda v: v[0], lambda v: v[0]))
    start_operator(op, uid="co")
    record = ("k", lambda: 1)
    op.process_input(0, record, 1)
    assert stored_samples(op) == [] and seen == [record]


def key_by_user(v: Any) -> Any:
    return v["user"]


def test_the_fingerprint_follows_the_code_not_its_name_or_place() -> None:
    def moved(v: Any) -> Any:
        return v["user"]

    assert key_function_fingerprint(key_by_user) == key_function_fingerprint(moved)
    assert key_function_fingerprint(key_by_user) != key_function_fingerprint(lambda v: v["user"].lower())
    assert key_function_fingerprint(operator.itemgetter(0)) == key_function_fingerprint(operator.itemgetter(0))
    assert key_function_fingerprint(operator.itemgetter(0)) != key_function_fingerprint(operator.itemgetter(1))

    def field(v: Any, name: str) -> Any:
        return v[name]

    assert key_function_fingerprint(functools.partial(field, name="a")) != key_function_fingerprint(
        functools.partial(field, name="b")
    )

    def closing_over(name: str) -> Any:
        return lambda v: v[name]

    assert key_function_fingerprint(closing_over("a")) != key_function_fingerprint(closing_over("b"))
    assert key_function_fingerprint(closing_over("a")) == key_function_fingerprint(closing_over("a"))


def test_a_sample_of_another_format_is_refused() -> None:
    with pytest.raises(SerializationError, match="weir.key-sample/2"):
        KeySample.from_stored(("weir.key-sample/2", 0, "", b"", "", b""))
    with pytest.raises(SerializationError, match="not a key sample"):
        KeySample.from_stored(b"x")
