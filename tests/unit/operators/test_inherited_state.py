"""Operators taking their state from another job's retained checkpoint at another parallelism
(``restore_inherited_state``): Kafka source positions as a union, a window operator's watermark per
old key-group range, per-subtask state refused when it cannot be split."""

from __future__ import annotations

import json

import pytest

from operators import sources
from operators.base import InheritedState, StateNotRedistributableError
from operators.sources import (
    GeneratorSourceOperator,
    KafkaSourceOperator,
    decode_kafka_source_state,
    encode_kafka_source_state,
    merge_kafka_source_states,
)
from operators.windows import WindowAggregateOperator
from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.core.descriptors import GeneratorSourceSpec, KafkaSourceSpec
from weir.core.errors import SerializationError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.core.windows import TumblingEventTimeWindows

MAX_PARALLELISM = 128


def inherited(subtask: int, parallelism: int, data: bytes) -> InheritedState:
    kg = key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(subtask))
    return InheritedState(subtask, parallelism, kg, data)


# Kafka source ---------------------------------------------------------------------------------------


def test_kafka_source_state_round_trips_as_versioned_json() -> None:
    data = encode_kafka_source_state({0: 12, 3: 40}, {0: 100, 3: 90})
    assert json.loads(data)["format"] == 1
    assert decode_kafka_source_state(data) == ({0: 12, 3: 40}, {0: 100, 3: 90})
    assert decode_kafka_source_state(encode_kafka_source_state({1: 5}, None)) == ({1: 5}, None)


def test_kafka_source_states_merge_into_one_position_per_partition() -> None:
    states = [encode_kafka_source_state({p: 10 * p + s for p in range(6) if p % 3 == s}, None) for s in range(3)]
    assert merge_kafka_source_states(states) == ({0: 0, 1: 11, 2: 22, 3: 30, 4: 41, 5: 52}, None)


def test_two_positions_for_one_partition_are_refused() -> None:
    states = [encode_kafka_source_state({0: 5}, None), encode_kafka_source_state({0: 7}, None)]
    with pytest.raises(SerializationError, match="next offsets 5 and 7 for partition 0"):
        merge_kafka_source_states(states)


def test_bounded_and_unbounded_states_do_not_mix() -> None:
    states = [encode_kafka_source_state({0: 5}, {0: 9}), encode_kafka_source_state({1: 7}, None)]
    with pytest.raises(SerializationError, match="bounded and unbounded"):
        merge_kafka_source_states(states)


class RecordingConsumer:
    """A consumer that remembers where each partition was assigned from and has nothing to read."""

    def __init__(self) -> None:
        self.assigned: dict[int, int | None] = {}

    def assign(self, next_offsets: dict[int, int | None]) -> None:
        self.assigned = dict(next_offsets)

    def end_offset(self, partition: int) -> int:
        raise AssertionError("a restored bounded source reads to its restored ends")

    def close(self) -> None:
        return None


@pytest.mark.parametrize(("old", "new"), [(3, 2), (2, 3), (3, 1)])
def test_a_kafka_source_subtask_resumes_the_partitions_it_reads_now_from_the_old_positions(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch, old: int, new: int
) -> None:
    partitions = 6
    monkeypatch.setattr(sources.Endpoints, "from_env", classmethod(lambda cls: None))
    monkeypatch.setattr(sources.kafka, "partition_count", lambda _endpoints, _topic: partitions)
    positions = {p: 100 + p for p in range(partitions)}
    ends = {p: 1000 for p in range(partitions)}
    states = [
        inherited(
            s,
            old,
            encode_kafka_source_state(
                {p: positions[p] for p in range(partitions) if p % old == s},
                {p: ends[p] for p in range(partitions) if p % old == s},
            ),
        )
        for s in range(old)
    ]
    read: dict[int, int | None] = {}
    for subtask in range(new):
        consumer = RecordingConsumer()
        monkeypatch.setattr(sources.kafka, "PartitionReader", lambda _e, _t, consumer=consumer, **_kw: consumer)
        source = KafkaSourceOperator(kafka_spec(bounded=True))
        output = CollectingOutput()
        source.setup(make_context("events-source", subtask=subtask, parallelism=new), output)
        source.restore_inherited_state(states)
        source.open()
        assert sorted(consumer.assigned) == [p for p in range(partitions) if p % new == subtask]
        assert not set(consumer.assigned) & set(read), "a partition is read by two new subtasks"
        read.update(consumer.assigned)
        source.close()
    assert read == positions  # every partition once, from where the old job's checkpoint left it


def kafka_spec(*, bounded: bool) -> KafkaSourceSpec:
    return KafkaSourceSpec(
        topic="events",
        bounded=bounded,
        deserializer=json.loads,
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic=None,
        idle_timeout_ms=None,
    )


# Per-subtask state ----------------------------------------------------------------------------------


def generator() -> GeneratorSourceOperator:
    return GeneratorSourceOperator(
        GeneratorSourceSpec(
            generate=lambda i: i, count=100, timestamp=None, max_out_of_orderness_ms=0, records_per_second=None
        )
    )


def test_per_subtask_state_is_taken_by_the_same_subtask_at_the_same_parallelism(
    start_operator: StartOperator, make_context: MakeContext
) -> None:
    before = [generator() for _ in range(2)]
    for s, g in enumerate(before):
        start_operator(g, uid="gen", subtask=s, parallelism=2)
        g.poll(3 + s)
    states = [inherited(s, 2, g.snapshot_state(1) or b"") for s, g in enumerate(before)]
    after = generator()
    out = CollectingOutput()
    after.setup(make_context("gen", subtask=1, parallelism=2), out)
    after.restore_inherited_state(states)
    after.open()
    after.poll(2)
    assert out.values == [9, 11]  # subtask 1 had emitted 1, 3, 5, 7


def test_per_subtask_state_cannot_move_to_another_parallelism(
    start_operator: StartOperator, make_context: MakeContext
) -> None:
    old = generator()
    start_operator(old, uid="gen", subtask=0, parallelism=2)
    after = generator()
    after.setup(make_context("gen", subtask=0, parallelism=3), CollectingOutput())
    with pytest.raises(StateNotRedistributableError, match="from parallelism 2 to 3: restore it at parallelism 2"):
        after.restore_inherited_state([inherited(0, 2, old.snapshot_state(1) or b"")])


# Window operator ------------------------------------------------------------------------------------


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: tuple[str, int]) -> int:
        return acc + value[1]

    def result(self, key: str, window_start: int, window_end: int, acc: int) -> tuple[str, int, int, int]:
        return key, window_start, window_end, acc


def window() -> WindowAggregateOperator:
    return WindowAggregateOperator(Sum(), lambda v: v[0], TumblingEventTimeWindows(10), allowed_lateness_ms=100)


def key_in(subtask: int, parallelism: int) -> str:
    owned = key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(subtask))
    return next(k for i in range(1000) if key_group_for_key(k := f"key-{i}", MAX_PARALLELISM) in owned)


def test_a_window_restored_from_two_old_subtasks_fires_each_window_as_its_old_owner_would(
    start_operator: StartOperator, make_context: MakeContext
) -> None:
    """Old subtask 0 had fired window [0, 10) of its key (kept for the allowed lateness); old subtask
    1, whose watermark lagged, had not fired its own. The one new subtask fires only the latter."""
    a, b = key_in(0, 2), key_in(1, 2)
    old = [window(), window()]
    outputs = [start_operator(op, uid="win", subtask=s, parallelism=2) for s, op in enumerate(old)]
    old[0].process((a, 1), 5)
    old[0].process_watermark(12)
    assert outputs[0].take() == [((a, 0, 10, 1), 9)]
    old[1].process((b, 2), 5)
    old[1].process_watermark(4)
    assert outputs[1].records == []
    states = [inherited(s, 2, op.snapshot_state(1) or b"") for s, op in enumerate(old)]

    new = window()
    out = CollectingOutput()
    new.setup(make_context("win", subtask=0, parallelism=1), out)
    new.restore_inherited_state(states)
    new.open()
    new.process((a, 3), 6)  # late for a's old subtask, within the lateness: fires again at once
    assert out.take() == [((a, 0, 10, 4), 9)]
    new.process_watermark(9)
    assert out.take() == [((b, 0, 10, 2), 9)]  # b's window fires; a's does not fire a second time
    new.process_watermark(200)
    assert out.records == []
