"""The Kafka source's columnar poll (``schema=``): one record batch per poll, a malformed record
dead-lettered alone with its offset, each partition's watermark from its latest event time."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.core.columnar import Schema, timestamp_field_of
from weir.core.descriptors import KafkaSourceSpec
from weir.operators import sources
from weir.operators.sources import KafkaSourceOperator


@dataclass(frozen=True)
class Message:
    _partition: int
    _offset: int
    _value: bytes | None

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


@dataclass
class Consumer:
    queued: list[Message] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)

    def add(self, partition: int, value: bytes | None) -> None:
        offset = self.offsets.get(partition, 0)
        self.offsets[partition] = offset + 1
        self.queued.append(Message(partition, offset, value))

    def assign(self, next_offsets: dict[int, int | None]) -> None:
        return None

    def consume(self, max_messages: int, timeout_s: float) -> list[Message]:
        out, self.queued = self.queued[:max_messages], self.queued[max_messages:]
        return out

    @staticmethod
    def is_end_of_partition(error: object) -> bool:
        return False

    def close(self) -> None:
        return None


@dataclass
class DeadLetters:
    produced: list[tuple[str, bytes | None, dict[str, Any]]] = field(default_factory=list)

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.produced.append((topic, key, json.loads(value)))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        return 0


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], tuple[Consumer, DeadLetters]]:
    consumer, dlq = Consumer(), DeadLetters()

    def with_partitions(partitions: int) -> tuple[Consumer, DeadLetters]:
        monkeypatch.setattr(sources.kafka, "partition_count", lambda _endpoints, _topic: partitions)
        monkeypatch.setattr(sources.kafka, "PartitionReader", lambda _endpoints, _topic, **_kw: consumer)
        monkeypatch.setattr(sources.kafka, "producer", lambda _endpoints, **_kw: dlq)
        return consumer, dlq

    return with_partitions


def columnar_spec() -> KafkaSourceSpec:
    return KafkaSourceSpec(
        topic="events",
        bounded=False,
        deserializer=None,  # type: ignore[arg-type]
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic="events-dlq",
        schema=Schema.of({"key": str, "value": int, "ts": int}),
        timestamp_field="ts",
    )


def event(key: str, value: Any, ts: int) -> bytes:
    return json.dumps({"key": key, "value": value, "ts": ts}).encode()


def test_a_poll_is_one_batch_and_a_malformed_record_is_dead_lettered_alone(
    start_operator: StartOperator, kafka: Callable[[int], tuple[Consumer, DeadLetters]]
) -> None:
    consumer, dlq = kafka(2)
    source = KafkaSourceOperator(columnar_spec())
    out = start_operator(source, uid="events-source")
    consumer.add(0, event("a", 1, 100))
    consumer.add(1, event("b", 2, 50))
    consumer.add(0, b'{"key": "c", "value": 3')  # truncated
    consumer.add(1, event("d", True, 60))  # bool is not an int
    consumer.add(0, event("e", 5, 120))
    consumer.add(1, None)
    assert source.poll(100) is True
    (emitted,) = out.records
    batch, timestamp = emitted
    assert timestamp is None and timestamp_field_of(batch) == "ts"
    assert batch.to_pylist() == [  # partition by partition, in offset order
        {"key": "a", "value": 1, "ts": 100},
        {"key": "e", "value": 5, "ts": 120},
        {"key": "b", "value": 2, "ts": 50},
    ]
    letters = sorted((d["partition"], d["offset"], d["reason"].split(":")[0]) for _t, _k, d in dlq.produced)
    assert letters == [(0, 1, "JSONDecodeError"), (1, 1, "ValueError"), (1, 2, "ValueError")]
    assert {topic for topic, _k, _d in dlq.produced} == {"events-dlq"}
    assert source.dead_lettered == 3
    assert out.watermarks == [49]  # the lower partition's latest event time, minus 1
    state = json.loads(source.snapshot_state(1) or b"{}")
    assert state["next_offsets"] == {"0": 3, "1": 3}


def test_a_projected_source_decodes_only_the_fields_the_job_reads_and_the_event_time(
    start_operator: StartOperator, kafka: Callable[[int], tuple[Consumer, DeadLetters]]
) -> None:
    consumer, dlq = kafka(1)
    spec = replace(columnar_spec(), schema=Schema.of({"id": str, "key": str, "value": int, "ts": int}))
    source = KafkaSourceOperator(replace(spec, projection=("key",)))
    out = start_operator(source, uid="events-source")
    consumer.add(0, json.dumps({"id": "e1", "key": "a", "value": 1, "ts": 10}).encode())
    consumer.add(0, json.dumps({"id": 2, "key": "b", "ts": 11}).encode())  # id and value unread: not checked
    consumer.add(0, json.dumps({"id": "e3", "key": 3, "value": 3, "ts": 12}).encode())  # key is read
    consumer.add(0, json.dumps({"id": "e4", "key": "d", "value": 4}).encode())  # so is the event time
    source.poll(10)
    (emitted,) = out.records
    assert emitted[0].schema.names == ["key", "ts"] and timestamp_field_of(emitted[0]) == "ts"
    assert emitted[0].to_pylist() == [{"key": "a", "ts": 10}, {"key": "b", "ts": 11}]
    assert sorted(d["offset"] for _t, _k, d in dlq.produced) == [2, 3]


def test_a_poll_of_only_malformed_records_emits_no_batch(
    start_operator: StartOperator, kafka: Callable[[int], tuple[Consumer, DeadLetters]]
) -> None:
    consumer, dlq = kafka(1)
    source = KafkaSourceOperator(columnar_spec())
    out = start_operator(source, uid="events-source")
    consumer.add(0, b"not json")
    source.poll(10)
    assert out.records == [] and len(dlq.produced) == 1


def test_an_int_beyond_int64_is_dead_lettered_not_fatal(
    start_operator: StartOperator, kafka: Callable[[int], tuple[Consumer, DeadLetters]]
) -> None:
    consumer, dlq = kafka(1)
    source = KafkaSourceOperator(columnar_spec())
    out = start_operator(source, uid="events-source")
    consumer.add(0, event("a", 2**63, 1))
    consumer.add(0, event("b", 1, 2))
    source.poll(10)
    assert [r["key"] for r in out.records[0][0].to_pylist()] == ["b"]
    assert len(dlq.produced) == 1


@pytest.mark.parametrize("columnar", [False, True])
def test_a_bounded_source_stops_at_its_end_offset_within_a_poll(
    start_operator: StartOperator, kafka: Callable[[int], tuple[Consumer, DeadLetters]], columnar: bool
) -> None:
    """Records appended after the end offset was fixed arrive in the same poll: neither path emits
    them, and the position stays at the end (the reference run reads up to the same offset)."""
    consumer, _dlq = kafka(1)
    consumer.end_offset = lambda _partition: 2  # type: ignore[attr-defined]
    consumer.unassign = lambda _partition: None  # type: ignore[attr-defined]
    spec = columnar_spec()
    if not columnar:
        spec = KafkaSourceSpec(
            topic="events",
            bounded=True,
            deserializer=json.loads,
            timestamp=lambda e: e["ts"],
            max_out_of_orderness_ms=0,
            dead_letter_topic="events-dlq",
        )
    else:
        spec = KafkaSourceSpec(**{**spec.__dict__, "bounded": True})
    source = KafkaSourceOperator(spec)
    out = start_operator(source, uid="events-source")
    for i in range(4):
        consumer.add(0, event(f"k{i}", i, 10 + i))
    source.poll(10)
    if columnar:
        keys = [r["key"] for batch, _ts in out.records for r in batch.to_pylist()]
    else:
        keys = [r["key"] for r, _ts in out.records]
    assert keys == ["k0", "k1"]
    assert json.loads(source.snapshot_state(1) or b"{}")["next_offsets"] == {"0": 2}
    assert source.poll(10) is False  # the only partition is done


def test_a_poll_of_interleaved_partitions_is_one_batch_partition_by_partition(
    start_operator: StartOperator, kafka: Callable[[int], tuple[Consumer, DeadLetters]]
) -> None:
    """librdkafka hands out fetch runs of partitions in turn: the batch holds each partition's rows
    together, in offset order, and each partition's watermark is its own latest event time."""
    consumer, dlq = kafka(3)
    source = KafkaSourceOperator(columnar_spec())
    out = start_operator(source, uid="events-source")
    for partition, key, ts in [(2, "a", 30), (0, "b", 7), (2, "c", 20), (1, "d", 9), (0, "e", 8), (2, "f", 40)]:
        consumer.add(partition, event(key, ts, ts))
    source.poll(100)
    (emitted,) = out.records
    assert [r["key"] for r in emitted[0].to_pylist()] == ["a", "c", "f", "b", "e", "d"]
    assert dlq.produced == []
    assert out.watermarks == [7]  # min(40, 8, 9) - 1
    assert json.loads(source.snapshot_state(1) or b"{}")["next_offsets"] == {"0": 2, "1": 1, "2": 3}
