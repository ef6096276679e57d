"""The Kafka source's options with a fake consumer: where partitions start, consumer properties, the
record deserializer, partition discovery and committing positions when a checkpoint completes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.api import COMMITTED, EARLIEST, LATEST, Committed, Environment, KafkaRecord, OffsetReset, Timestamp
from weir.core.descriptors import KafkaSourceSpec, TimestampType, start_offsets_parameter
from weir.core.errors import JobDefinitionError
from weir.core.kafka_config import KafkaClientConfig
from weir.jobmanager.submission import fixed_source_starts
from weir.operators import sources
from weir.operators.sources import (
    CheckpointPositions,
    KafkaSourceOperator,
    decide_start_offsets,
    decode_start_offsets,
    encode_start_offsets,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Message:
    _partition: int
    _offset: int
    _value: bytes
    _key: bytes | None = None
    _headers: tuple[tuple[str, bytes], ...] | None = None
    _timestamp: int = 77

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return None if self._headers is None else list(self._headers)

    def timestamp(self) -> tuple[int, int]:
        return (2, self._timestamp)


class FakeReader:
    """A topic of ``partitions`` partitions with given end, by-time and committed offsets."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.ends: dict[int, int] = {}
        self.by_time: dict[int, int] = {}
        self.committed_offsets: dict[int, int] = {}
        self.assigned: dict[int, int | None] = {}
        self.queued: list[Message] = []
        self.commits: list[dict[int, int]] = []
        self.lookups: list[str] = []

    def partition_count(self) -> int:
        return self.partitions

    def end_offset(self, partition: int) -> int:
        self.lookups.append("end")
        return self.ends.get(partition, 0)

    def offsets_for_time(self, partitions: Iterable[int], timestamp_ms: int) -> dict[int, int]:
        self.lookups.append(f"time:{timestamp_ms}")
        return {p: self.by_time[p] for p in partitions if p in self.by_time}

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        self.lookups.append("committed")
        return {p: self.committed_offsets.get(p) for p in partitions}

    def assign(self, next_offsets: dict[int, int | None]) -> None:
        self.assigned = dict(next_offsets)

    def add(self, next_offsets: dict[int, int | None]) -> None:
        self.assigned.update(next_offsets)

    def commit(self, next_offsets: dict[int, int]) -> None:
        self.commits.append(dict(next_offsets))

    def consume(self, max_messages: int, timeout_s: float) -> list[Message]:
        out, self.queued = self.queued[:max_messages], self.queued[max_messages:]
        return out

    def cached_high_watermark(self, partition: int) -> int:
        return -1

    @staticmethod
    def is_end_of_partition(error: object) -> bool:
        return False

    def close(self) -> None:
        return None


def kafka_spec(**options: Any) -> KafkaSourceSpec:
    base = KafkaSourceSpec(
        topic="events",
        bounded=False,
        deserializer=json.loads,
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic=None,
    )
    return replace(base, **options)


@pytest.fixture
def fake_reader(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], FakeReader]:
    def with_partitions(partitions: int) -> FakeReader:
        reader = FakeReader(partitions)
        monkeypatch.setattr(sources.kafka, "partition_count", lambda _endpoints, _topic: reader.partitions)
        monkeypatch.setattr(sources.kafka, "PartitionReader", lambda _endpoints, _topic, **_kw: reader)
        return reader

    return with_partitions


# Where partitions start ----------------------------------------------------------------------------


def test_earliest_starts_every_partition_at_its_beginning_without_asking_kafka() -> None:
    reader = FakeReader(3)
    assert decide_start_offsets(EARLIEST, [0, 1, 2], reader) == {0: None, 1: None, 2: None}
    assert reader.lookups == []


def test_latest_starts_at_the_end_offsets() -> None:
    reader = FakeReader(2)
    reader.ends = {0: 10, 1: 4}
    assert decide_start_offsets(LATEST, [0, 1], reader) == {0: 10, 1: 4}


def test_a_timestamp_starts_at_the_first_offset_at_or_after_it_or_at_the_end() -> None:
    reader = FakeReader(2)
    reader.by_time = {0: 3}
    reader.ends = {0: 9, 1: 6}
    assert decide_start_offsets(Timestamp(1_700_000_000_000), [0, 1], reader) == {0: 3, 1: 6}


@pytest.mark.parametrize(("reset", "fallback"), [(OffsetReset.EARLIEST, None), (OffsetReset.LATEST, 8)])
def test_committed_starts_at_the_groups_offsets_and_falls_back_to_the_reset(
    reset: OffsetReset, fallback: int | None
) -> None:
    reader = FakeReader(2)
    reader.committed_offsets = {0: 5}
    reader.ends = {0: 20, 1: 8}
    assert decide_start_offsets(Committed(reset), [0, 1], reader) == {0: 5, 1: fallback}
    assert COMMITTED == Committed(OffsetReset.EARLIEST)


def test_start_offsets_parameter_round_trips() -> None:
    starts = {2: 7, 0: None}
    assert decode_start_offsets(encode_start_offsets(starts)) == starts


def test_the_jobmanager_fixes_starts_for_all_but_earliest_sources() -> None:
    env = Environment("orders")
    env.from_kafka("a", uid="a-source", starting_offsets=LATEST)
    env.from_kafka("b", uid="b-source")
    env.from_kafka("c", uid="c-source", starting_offsets=COMMITTED, group_id="my-group")
    asked: list[tuple[str, str]] = []

    def read(cluster: KafkaClientConfig, spec: KafkaSourceSpec, group_id: str) -> dict[int, int | None]:
        asked.append((spec.topic, group_id))
        return {0: 11, 1: None}

    fixed = fixed_source_starts(env.graph, "orders", KafkaClientConfig("broker:9092"), read)
    assert asked == [("a", "weir-orders-a-source"), ("c", "my-group")]
    assert set(fixed) == {start_offsets_parameter("a-source"), start_offsets_parameter("c-source")}
    assert decode_start_offsets(fixed[start_offsets_parameter("a-source")]) == {0: 11, 1: None}


def test_open_uses_the_starts_fixed_at_submit_and_puts_them_in_the_state(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader], make_context: Any
) -> None:
    reader = fake_reader(3)
    reader.ends = {0: 999, 2: 999}  # the ends now: not asked, the submit's starts win
    source = KafkaSourceOperator(kafka_spec(starting_offsets=LATEST))
    ctx = make_context("events-source")
    ctx.parameters = {start_offsets_parameter("events-source"): encode_start_offsets({0: 40, 1: 41})}
    source.setup(ctx, _Collect())
    source.open()
    # partition 2 is not in the submit's starts: created after submit, read from its beginning
    assert reader.assigned == {0: 40, 1: 41, 2: None}
    assert reader.lookups == []
    assert sources.decode_kafka_source_state(source.snapshot_state(1) or b"")[0] == {0: 40, 1: 41}


def test_without_fixed_starts_open_decides_them_once_and_a_restore_keeps_them(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader = fake_reader(2)
    reader.ends = {0: 5, 1: 6}
    source = KafkaSourceOperator(kafka_spec(starting_offsets=LATEST))
    start_operator(source, uid="events-source")
    assert reader.assigned == {0: 5, 1: 6}
    snapshot = source.snapshot_state(1)
    assert snapshot is not None
    reader.ends = {0: 50, 1: 60}  # records written since: a restore must not skip them
    again = KafkaSourceOperator(kafka_spec(starting_offsets=LATEST))
    start_operator(again, uid="events-source", restore=snapshot)
    assert reader.assigned == {0: 5, 1: 6}


def test_restored_positions_win_over_committed_offsets(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader = fake_reader(2)
    reader.committed_offsets = {0: 100, 1: 100}
    restored = sources.encode_kafka_source_state({0: 3}, None)
    source = KafkaSourceOperator(kafka_spec(starting_offsets=COMMITTED))
    start_operator(source, uid="events-source", restore=restored)
    # partition 1 has no restored position after a restore: created later, read from its beginning
    assert reader.assigned == {0: 3, 1: None}
    assert "committed" not in reader.lookups


# Consumer properties -------------------------------------------------------------------------------


def test_consumer_properties_pass_through_sorted() -> None:
    env = Environment("job")
    env.from_kafka(
        "events", uid="s", properties={"security.protocol": "SASL_SSL", "client.id": "me", "sasl.mechanism": "PLAIN"}
    )
    (t,) = env.graph.transformations.values()
    assert t.source_spec.properties == (
        ("client.id", "me"),
        ("sasl.mechanism", "PLAIN"),
        ("security.protocol", "SASL_SSL"),
    )


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("group.id", "group_id="),
        ("enable.auto.commit", "commit_offsets_on_checkpoint"),
        ("isolation.level", "read_committed"),
        ("auto.offset.reset", "starting_offsets="),
        ("bootstrap.servers", "endpoints"),
        ("ENABLE.PARTITION.EOF", "end-of-partition"),
    ],
)
def test_properties_weir_sets_itself_are_refused(key: str, hint: str) -> None:
    env = Environment("job")
    with pytest.raises(JobDefinitionError, match=rf"kafka source 's'.*{key}.*set by Weir.*{hint}"):
        env.from_kafka("events", uid="s", properties={key: "x"})


def test_non_string_property_values_are_refused() -> None:
    with pytest.raises(JobDefinitionError, match="must be strings"):
        Environment("job").from_kafka("events", uid="s", properties={"fetch.min.bytes": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"starting_offsets": "latest"}, "starting_offsets must be"),
        ({"starting_offsets": Timestamp(-1)}, "epoch milliseconds"),
        ({"partition_discovery_interval_ms": 0}, "positive int"),
        ({"partition_discovery_interval_ms": 1000, "bounded": True}, "bounded source"),
        ({"group_id": ""}, "group_id"),
        ({"record_deserializer": lambda r: r, "deserializer": json.loads}, "not both"),
        ({"record_deserializer": lambda r: r, "schema": {"ts": int}, "timestamp_field": "ts"}, "record_deserializer"),
    ],
)
def test_from_kafka_refuses_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(JobDefinitionError, match=match):
        Environment("job").from_kafka("events", uid="s", **options)


# The record deserializer ---------------------------------------------------------------------------


class _Collect:
    def __init__(self) -> None:
        self.records: list[tuple[Any, int | None]] = []
        self.watermarks: list[int] = []

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.records.append((value, timestamp))

    def emit_watermark(self, watermark: int) -> None:
        self.watermarks.append(watermark)


def test_a_record_deserializer_sees_the_whole_record(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader = fake_reader(1)
    seen: list[KafkaRecord] = []

    def deserialize(record: KafkaRecord) -> str:
        seen.append(record)
        return f"{record.key!r}:{record.value!r}"

    source = KafkaSourceOperator(kafka_spec(record_deserializer=deserialize))
    out = start_operator(source, uid="events-source")
    reader.queued = [Message(0, 4, b"v", b"k", (("trace", b"abc"),), 1234), Message(0, 5, b"w")]
    source.poll(10)
    assert seen[0] == KafkaRecord(
        topic="events",
        partition=0,
        offset=4,
        key=b"k",
        value=b"v",
        timestamp=1234,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        headers=(("trace", b"abc"),),
    )
    assert seen[1].headers == () and seen[1].key is None
    assert out.records == [("b'k':b'v'", 1234), ("None:b'w'", 77)]


# Partition discovery -------------------------------------------------------------------------------


def test_discovery_reads_new_partitions_of_this_subtask_from_the_beginning(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader, clock = fake_reader(2), FakeClock()
    source = KafkaSourceOperator(kafka_spec(partition_discovery_interval_ms=1000), clock=clock)
    start_operator(source, uid="events-source", subtask=1, parallelism=2)
    assert reader.assigned == {1: None}
    reader.partitions = 5
    clock.now += 0.5
    source.poll(10)
    assert reader.assigned == {1: None}  # not due yet
    clock.now += 0.5
    source.poll(10)
    assert reader.assigned == {1: None, 3: 0}  # 2 and 4 belong to subtask 0
    reader.queued = [Message(3, 0, b"1")]
    source.poll(10)
    assert sources.decode_kafka_source_state(source.snapshot_state(1) or b"")[0] == {3: 1}


def test_a_subtask_without_partitions_keeps_polling_for_new_ones_when_discovery_is_on(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader, clock = fake_reader(1), FakeClock()
    source = KafkaSourceOperator(kafka_spec(partition_discovery_interval_ms=100), clock=clock)
    out = start_operator(source, uid="events-source", subtask=1, parallelism=2)
    assert source.poll(10) is True
    reader.partitions = 2
    clock.now += 0.1
    assert source.poll(10) is True
    assert reader.assigned == {1: 0}
    reader.queued = [Message(1, 0, b"7")]
    source.poll(10)
    assert out.records == [(7, 77)]
    assert out.watermarks == [76]  # the new partition's watermark is the subtask's


def test_without_discovery_new_partitions_are_not_read(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader, clock = fake_reader(1), FakeClock()
    source = KafkaSourceOperator(kafka_spec(), clock=clock)
    start_operator(source, uid="events-source")
    reader.partitions = 3
    clock.now += 3600
    source.poll(10)
    assert reader.assigned == {0: None}


# Committing positions on checkpoint completion -----------------------------------------------------


def test_checkpoint_positions_bookkeeping() -> None:
    positions = CheckpointPositions()
    positions.taken(1, {0: 5})
    positions.taken(2, {0: 7})
    positions.taken(3, {0: 9})
    positions.aborted(2)
    assert positions.completed(2) is None  # aborted: nothing to commit
    assert positions.completed(3) == {0: 9}  # covers 1, which is dropped
    assert positions.pending == []


def test_a_completed_checkpoint_commits_the_positions_of_its_snapshot(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader = fake_reader(2)
    source = KafkaSourceOperator(kafka_spec())
    start_operator(source, uid="events-source")
    reader.queued = [Message(0, 0, b"1"), Message(1, 0, b"2")]
    source.poll(10)
    source.snapshot_state(1)
    reader.queued = [Message(0, 1, b"3")]
    source.poll(10)
    source.snapshot_state(2)
    reader.queued = [Message(0, 2, b"4")]
    source.poll(10)
    source.snapshot_state(3)
    source.notify_checkpoint_aborted(2)
    assert reader.commits == []
    source.notify_checkpoint_complete(1)
    assert reader.commits == [{0: 1, 1: 1}]  # the snapshot's positions, not the current ones
    source.notify_checkpoint_complete(2)  # aborted before: nothing more
    source.notify_checkpoint_complete(3)
    assert reader.commits == [{0: 1, 1: 1}, {0: 3, 1: 1}]


def test_a_later_completion_covers_a_checkpoint_never_confirmed(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader = fake_reader(1)
    source = KafkaSourceOperator(kafka_spec())
    start_operator(source, uid="events-source")
    reader.queued = [Message(0, 0, b"1")]
    source.poll(10)
    source.snapshot_state(4)
    reader.queued = [Message(0, 1, b"2")]
    source.poll(10)
    source.snapshot_state(5)
    source.notify_checkpoint_complete(5)
    source.notify_checkpoint_complete(4)  # late: already covered
    assert reader.commits == [{0: 2}]


def test_commits_can_be_turned_off(start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]) -> None:
    reader = fake_reader(1)
    source = KafkaSourceOperator(kafka_spec(commit_offsets_on_checkpoint=False))
    start_operator(source, uid="events-source")
    reader.queued = [Message(0, 0, b"1")]
    source.poll(10)
    source.snapshot_state(1)
    source.notify_checkpoint_complete(1)
    assert reader.commits == []


def test_the_group_id_defaults_to_job_name_and_uid() -> None:
    assert kafka_spec().group_id_for("orders", "src") == "weir-orders-src"
    assert kafka_spec(group_id="g").group_id_for("orders", "src") == "g"


def test_a_discovered_partition_holds_the_watermark_until_its_first_record(
    start_operator: StartOperator, fake_reader: Callable[[int], FakeReader]
) -> None:
    reader, clock = fake_reader(1), FakeClock()
    spec = kafka_spec(partition_discovery_interval_ms=100, timestamp=lambda v: v)
    source = KafkaSourceOperator(spec, clock=clock)
    out = start_operator(source, uid="events-source")
    reader.queued = [Message(0, 0, b"1000")]
    source.poll(10)
    assert out.watermarks == [999]
    reader.partitions = 2
    clock.now += 0.1
    reader.queued = [Message(0, 1, b"2000")]
    source.poll(10)  # partition 1 found before these records: it holds the watermark at 999
    assert out.watermarks == [999]
    reader.queued = [Message(1, 0, b"3000")]
    source.poll(10)
    assert out.watermarks == [999, 1999]
