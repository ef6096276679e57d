"""The Kafka source's ``max_record_bytes``: a record whose value is longer goes to the dead-letter
topic with the reason (its value cut in the envelope), on the record and the columnar paths; without
a dead-letter topic it fails the job with its position; the records around it pass."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from tests.unit.operators.test_sources import FakeConsumer, FakeMessage, kafka_spec
from tests.unit.operators.test_sources import fake_kafka as fake_kafka  # the fixture
from weir.api import Environment
from weir.core.columnar import Schema
from weir.core.errors import JobDefinitionError
from weir.core.rejections import DEAD_LETTER_VALUE_BYTES
from weir.operators import sources
from weir.operators.sources import KafkaSourceOperator

LIMIT = 1000


class FakeProducer:
    def __init__(self) -> None:
        self.produced: list[tuple[str, dict[str, Any]]] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes = b"") -> None:
        self.produced.append((topic, json.loads(value)))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        return 0


@pytest.fixture
def dlq(monkeypatch: pytest.MonkeyPatch) -> FakeProducer:
    producer = FakeProducer()
    monkeypatch.setattr(sources.kafka, "producer", lambda _endpoints, **_kw: producer)
    return producer


def queue(consumer: FakeConsumer, *values: bytes) -> None:
    for offset, value in enumerate(values):
        consumer.queued.append(FakeMessage(0, offset, value))


def event(ts: int, pad: int = 0) -> bytes:
    return json.dumps({"ts": ts, "pad": "x" * pad}).encode()


def test_an_oversized_record_is_dead_lettered_with_the_reason_and_the_others_pass(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer], dlq: FakeProducer
) -> None:
    consumer = fake_kafka(1)
    spec = dataclasses.replace(kafka_spec(None), dead_letter_topic="events-dlq", max_record_bytes=LIMIT)
    source = KafkaSourceOperator(spec)
    out = start_operator(source, uid="events-source")
    big = event(2, pad=DEAD_LETTER_VALUE_BYTES + 10)
    queue(consumer, event(1), big, event(3, pad=LIMIT - 30))
    source.poll(10)
    assert [v["ts"] for v in out.values] == [1, 3]
    ((topic, envelope),) = dlq.produced
    assert topic == "events-dlq" and (envelope["partition"], envelope["offset"]) == (0, 1)
    assert envelope["reason"] == (
        f"OversizedRecordError: record value of {len(big)} bytes is over the source's max_record_bytes of {LIMIT}"
    )
    assert envelope["value_truncated"] is True and len(envelope["value"].encode()) == DEAD_LETTER_VALUE_BYTES
    assert source.dead_lettered == 1


def test_a_malformed_record_s_dead_letter_is_not_cut(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer], dlq: FakeProducer
) -> None:
    consumer = fake_kafka(1)
    source = KafkaSourceOperator(dataclasses.replace(kafka_spec(None), dead_letter_topic="events-dlq"))
    start_operator(source, uid="events-source")
    queue(consumer, b"{not json")
    source.poll(10)
    ((_topic, envelope),) = dlq.produced
    assert envelope["value"] == "{not json" and envelope["value_truncated"] is False
    assert envelope["reason"].startswith("JSONDecodeError")


def test_without_a_dead_letter_topic_an_oversized_record_fails_the_job_with_its_position(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    consumer = fake_kafka(1)
    source = KafkaSourceOperator(dataclasses.replace(kafka_spec(None), max_record_bytes=LIMIT))
    start_operator(source, uid="events-source")
    queue(consumer, event(1), event(2, pad=LIMIT))
    with pytest.raises(JobDefinitionError, match=r"malformed record at events\[0\]@1: OversizedRecordError"):
        source.poll(10)


def test_the_columnar_source_dead_letters_an_oversized_record_alone(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer], dlq: FakeProducer
) -> None:
    consumer = fake_kafka(1)
    spec = dataclasses.replace(
        kafka_spec(None),
        deserializer=lambda b: b,
        timestamp=None,
        dead_letter_topic="events-dlq",
        max_record_bytes=LIMIT,
        schema=Schema.of({"ts": int, "pad": str}),
        timestamp_field="ts",
    )
    source = KafkaSourceOperator(spec)
    out = start_operator(source, uid="events-source")
    queue(consumer, event(1), event(2, pad=LIMIT), event(3))
    source.poll(10)
    (batch,) = out.values
    assert batch.column("ts").to_pylist() == [1, 3]
    ((_topic, envelope),) = dlq.produced
    assert envelope["offset"] == 1 and envelope["reason"].startswith("OversizedRecordError")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1000"])
def test_max_record_bytes_is_a_positive_int(bad: Any) -> None:
    with pytest.raises(JobDefinitionError, match="max_record_bytes must be a positive int"):
        Environment("job").from_kafka("events", uid="events-source", max_record_bytes=bad)
