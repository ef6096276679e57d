"""Operators taking their state from another job's retained checkpoint at another parallelism
(``restore_inherited_state``): Kafka source positions as a union of which each subtask keeps, snapshots
and commits only its own partitions' (through several generations), a window operator's watermark
per old key-group range, per-subtask state refused when it cannot be split."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from tests.unit.operators.fake_topic import FakeTopic
from weir.core.descriptors import (
    EARLIEST,
    LATEST,
    GeneratorSourceSpec,
    KafkaSourceSpec,
    StartingOffsets,
    start_offsets_parameter,
)
from weir.core.errors import SerializationError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.core.windows import TumblingEventTimeWindows
from weir.operators import sources
from weir.operators.base import InheritedState, StateNotRedistributableError
from weir.operators.sources import (
    GeneratorSourceOperator,
    KafkaSourceOperator,
    decode_kafka_source_state,
    encode_kafka_source_state,
    encode_start_offsets,
    merge_kafka_source_states,
)
from weir.operators.windows import WindowAggregateOperator

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


def kafka_spec(*, bounded: bool, starting: StartingOffsets = EARLIEST) -> KafkaSourceSpec:
    return KafkaSourceSpec(
        topic="events",
        bounded=bounded,
        deserializer=json.loads,
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic=None,
        idle_timeout_ms=None,
        starting_offsets=starting,
    )


# Kafka source through several generations ----------------------------------------------------------


def positions_of(state: InheritedState) -> dict[int, int]:
    return decode_kafka_source_state(state.data)[0]


def first_generation(partitions: int, parallelism: int) -> list[InheritedState]:
    """The snapshots of a job that read partition p up to offset 100 + p, each subtask its own."""
    return [
        inherited(
            s,
            parallelism,
            encode_kafka_source_state({p: 100 + p for p in range(partitions) if p % parallelism == s}, None),
        )
        for s in range(parallelism)
    ]


def next_generation(
    topic: FakeTopic,
    make_context: MakeContext,
    states: list[InheritedState],
    parallelism: int,
    *,
    read: int = 5,
    spec: KafkaSourceSpec | None = None,
    parameters: dict[str, str] | None = None,
) -> list[InheritedState]:
    """A new job restored from ``states`` at ``parallelism`` (``weir run --from-checkpoint``): each
    subtask restores, opens, reads ``read`` records of each partition it reads, snapshots for
    checkpoint 1, which completes. Its snapshots, as the job after it inherits them."""
    snapshots = []
    for subtask in range(parallelism):
        source = KafkaSourceOperator(spec or kafka_spec(bounded=False))
        context = make_context("events-source", subtask=subtask, parallelism=parallelism)
        context.parameters = parameters or {}
        source.setup(context, CollectingOutput())
        source.restore_inherited_state(states)
        source.open()
        topic.readers[-1].budget = dict.fromkeys(range(len(topic.lengths)), read)
        source.poll(1000)
        data = source.snapshot_state(1) or b""
        source.notify_checkpoint_complete(1)
        source.close()
        snapshots.append(inherited(subtask, parallelism, data))
    return snapshots


def assert_each_partition_in_its_owners_snapshot(snapshots: list[InheritedState], expected: dict[int, int]) -> None:
    parallelism = len(snapshots)
    for s, snapshot in enumerate(snapshots):
        held = positions_of(snapshot)
        assert sorted(held) == [p for p in sorted(expected) if p % parallelism == s], (
            f"subtask {s}/{parallelism} snapshots the positions of partitions {sorted(held)}"
        )
    union = [(p, o) for snapshot in snapshots for p, o in positions_of(snapshot).items()]
    assert sorted(union) == sorted(expected.items()), "every partition once, where the reads left it"


@pytest.mark.parametrize("parallelisms", [(2, 2), (2, 2, 2), (2, 3, 1), (3, 1, 2, 3)])
def test_kafka_source_positions_pass_through_generations_each_partition_once(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch, parallelisms: tuple[int, ...]
) -> None:
    """Each new job restores from the previous one's snapshots (``--from-checkpoint``, a savepoint
    upgrade, a rescale) and reads 5 records of every partition: each subtask snapshots the positions
    of the partitions it reads and no other, so the next restore sees one position per partition."""
    partitions = 6
    topic = FakeTopic([1000] * partitions)
    topic.serve(monkeypatch)
    first, *rest = parallelisms
    states = first_generation(partitions, first)
    expected = {p: 100 + p for p in range(partitions)}
    for parallelism in rest:
        states = next_generation(topic, make_context, states, parallelism)
        expected = {p: o + 5 for p, o in expected.items()}
        assert_each_partition_in_its_owners_snapshot(states, expected)


def test_each_subtask_commits_to_the_group_only_the_partitions_it_reads(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 -> 3 -> 1: no subtask commits a partition another one reads, so the group's offsets never go
    back and end where the last snapshots are."""
    partitions = 6
    topic = FakeTopic([1000] * partitions)
    topic.serve(monkeypatch)
    states = first_generation(partitions, 2)
    for parallelism in (3, 1):
        seen = len(topic.commits)
        before = dict(topic.group)
        states = next_generation(topic, make_context, states, parallelism)
        for commit in topic.commits[seen:]:
            subtask = commit.reader - (len(topic.readers) - parallelism)
            assert sorted(commit.offsets) == [p for p in range(partitions) if p % parallelism == subtask], (
                f"subtask {subtask}/{parallelism} committed {dict(commit.offsets)}"
            )
            assert all(o >= before.get(p, 0) for p, o in commit.offsets.items()), "a commit moved the group back"
        assert topic.group == {p: o for s in states for p, o in positions_of(s).items()}


def test_states_that_hold_copies_of_other_partitions_restore_from_each_partitions_owner(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint where every subtask also holds stale copies of the partitions another subtask
    read (as Weir wrote them before each subtask kept only its own): each partition's position comes
    from the old subtask that read it, the copies are left out."""
    topic = FakeTopic([1000] * 4)
    topic.serve(monkeypatch)
    written = [
        inherited(0, 2, encode_kafka_source_state({0: 105, 1: 101, 2: 107, 3: 103}, None)),
        inherited(1, 2, encode_kafka_source_state({0: 100, 1: 106, 2: 102, 3: 108}, None)),
    ]
    states = next_generation(topic, make_context, written, 1, read=0)
    assert_each_partition_in_its_owners_snapshot(states, {0: 105, 1: 106, 2: 107, 3: 108})
    # A restart of the same job from such a state (restore_state) keeps its own partitions too.
    source = KafkaSourceOperator(kafka_spec(bounded=False))
    source.setup(make_context("events-source", subtask=1, parallelism=2), CollectingOutput())
    source.restore_state(written[1].data)
    source.open()
    assert topic.readers[-1].assigned_from == {1: 106, 3: 108}
    assert positions_of(inherited(1, 2, source.snapshot_state(2) or b"")) == {1: 106, 3: 108}


def test_a_position_of_a_partition_the_topic_does_not_show_is_kept_by_its_owner_and_not_committed(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata shows fewer partitions than the old job read (a topic being recreated): the
    owner of a partition it cannot read keeps its position in its snapshot, reads and commits none
    of it, and a later job that sees the partition resumes it there."""
    topic = FakeTopic([1000] * 4)
    topic.serve(monkeypatch)
    topic.visible_partitions = 2
    states = next_generation(topic, make_context, first_generation(4, 1), 2)
    assert_each_partition_in_its_owners_snapshot(states, {0: 105, 1: 106, 2: 102, 3: 103})
    assert sorted(p for c in topic.commits for p in c.offsets) == [0, 1]
    topic.visible_partitions = None
    states = next_generation(topic, make_context, states, 3)
    assert_each_partition_in_its_owners_snapshot(states, {0: 110, 1: 111, 2: 107, 3: 108})


def test_partition_discovery_resumes_a_kept_position_where_the_state_left_it(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A position kept for a partition the topic did not show at open is where discovery resumes it."""
    topic = FakeTopic([1000] * 4)
    topic.serve(monkeypatch)
    topic.visible_partitions = 2
    now = [1000.0]
    source = KafkaSourceOperator(
        replace(kafka_spec(bounded=False), partition_discovery_interval_ms=100), clock=lambda: now[0]
    )
    source.setup(make_context("events-source", subtask=0, parallelism=2), CollectingOutput())
    source.restore_inherited_state(first_generation(4, 1))
    source.open()
    reader = topic.readers[-1]
    assert reader.assigned_from == {0: 100}
    topic.visible_partitions = None
    now[0] += 1.0
    reader.budget = {}
    source.poll(10)
    assert reader.assigned_from == {0: 100, 2: 102}


def test_a_partition_missing_from_the_inherited_state_is_read_from_its_beginning(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old job read 2 partitions, the topic has 3 now: the new partition's records were never
    read, so the new job reads it from its beginning, not where its own LATEST start (fixed at its
    submit) would put it, as Flink reads a partition discovered after a restore."""
    topic = FakeTopic([1000, 1000, 10])
    topic.serve(monkeypatch)
    latest = {start_offsets_parameter("events-source"): encode_start_offsets({0: 1000, 1: 1000, 2: 10})}
    states = next_generation(
        topic,
        make_context,
        first_generation(2, 2),
        1,
        spec=kafka_spec(bounded=False, starting=LATEST),
        parameters=latest,
    )
    assert topic.readers[-1].assigned_from == {0: 100, 1: 101, 2: None}
    assert_each_partition_in_its_owners_snapshot(states, {0: 105, 1: 106, 2: 5})


@pytest.mark.parametrize("fixed", [False, True])
def test_a_source_the_old_checkpoint_holds_no_state_of_starts_by_its_starting_offsets(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch, fixed: bool
) -> None:
    """A Kafka source new in this version of the job inherits nothing: it is not a restored one."""
    topic = FakeTopic([7, 9])
    topic.serve(monkeypatch)
    starts = {start_offsets_parameter("events-source"): encode_start_offsets({0: 7, 1: 9})} if fixed else {}
    states = next_generation(
        topic, make_context, [], 1, read=0, spec=kafka_spec(bounded=False, starting=LATEST), parameters=starts
    )
    assert topic.readers[-1].assigned_from == {0: 7, 1: 9}
    assert_each_partition_in_its_owners_snapshot(states, {0: 7, 1: 9})


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


def test_generator_positions_pass_through_generations_at_the_same_parallelism(make_context: MakeContext) -> None:
    """A generator subtask's state is its own index sequence: each generation's subtask takes the one
    of its own index, so every index is emitted once across three jobs."""
    states: list[InheritedState] = []
    emitted: list[int] = []
    for generation in range(3):
        snapshots = []
        for s in range(2):
            g = generator()
            out = CollectingOutput()
            g.setup(make_context("gen", subtask=s, parallelism=2), out)
            g.restore_inherited_state(states)
            g.open()
            g.poll(3 + s + generation)
            emitted += out.values
            snapshots.append(inherited(s, 2, g.snapshot_state(1) or b""))
        states = snapshots
    for s in range(2):
        own = sorted(i for i in emitted if i % 2 == s)
        assert own == [s + 2 * k for k in range(len(own))], f"subtask {s}'s indices: {own}"


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
