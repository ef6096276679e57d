"""The Kafka source's options against the real broker, the operator driven directly (no cluster):
LATEST, Timestamp and COMMITTED starts, a partition added while reading, and the positions a
completed checkpoint commits as an admin client reads them."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from tests.integration import polling
from tests.integration.conftest import create_topics
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.descriptors import (
    LATEST,
    Committed,
    KafkaSourceSpec,
    OffsetReset,
    StartingOffsets,
    Timestamp,
    start_offsets_parameter,
)
from weir.core.kafka_config import kafka_client_config
from weir.core.keygroups import KeyGroupRange
from weir.jobmanager.submission import kafka_start_offsets
from weir.operators.base import OperatorContext
from weir.operators.sources import KafkaSourceOperator, encode_start_offsets

pytestmark = pytest.mark.integration

UID = "events-source"


class Collect:
    def __init__(self) -> None:
        self.values: list[Any] = []

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.values.append(value)

    def emit_watermark(self, watermark: int) -> None:
        pass


@pytest.fixture
def topic(services: Endpoints) -> Iterator[str]:
    name = f"source-opts-{uuid.uuid4().hex[:8]}"
    create_topics(services, {name: 2})  # records stamped 2023: kept from the broker's time retention
    yield name
    kafka.delete_topics(services, [name])


def produce(endpoints: Endpoints, topic: str, records: list[tuple[int, int, int | None]]) -> None:
    """(partition, value, timestamp ms or None) each."""
    producer = kafka.producer(endpoints)
    for partition, value, ts in records:
        producer.produce(topic, json.dumps(value).encode(), partition=partition, timestamp=ts or 0)
    assert producer.flush(30) == 0


def spec_for(topic: str, starting: StartingOffsets, **options: Any) -> KafkaSourceSpec:
    base = KafkaSourceSpec(
        topic=topic,
        bounded=False,
        deserializer=json.loads,
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic=None,
        starting_offsets=starting,
    )
    return replace(base, **options)


def start(spec: KafkaSourceSpec, parameters: dict[str, str] | None = None) -> tuple[KafkaSourceOperator, Collect]:
    source, out = KafkaSourceOperator(spec), Collect()
    context = OperatorContext(
        job_id=f"job-{uuid.uuid4().hex[:6]}",
        job_name="source-opts",
        uid=UID,
        subtask=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        key_group_range=KeyGroupRange(0, 127),  # type: ignore[arg-type]
        parameters=parameters or {},
        state=None,
    )
    source.setup(context, out)
    source.open()
    return source, out


def read(source: KafkaSourceOperator, out: Collect, at_least: int, timeout_s: float = 30.0) -> list[Any]:

    def read_on() -> int:
        source.poll(100)  # waits for records up to 100 ms
        return len(out.values)

    polling.settle(timeout_s, read_on, lambda read: read >= at_least, 0)
    assert len(out.values) >= at_least, f"read {out.values} of {at_least} records within {timeout_s}s"
    quiet_until = time.monotonic() + 0.5  # nothing more than expected arrives: read on for half a second
    while time.monotonic() < quiet_until:
        source.poll(100)
    return sorted(out.values)


def test_latest_fixed_at_submit_reads_what_was_written_after_it(services: Endpoints, topic: str) -> None:
    produce(services, topic, [(0, 1, None), (1, 2, None)])
    spec = spec_for(topic, LATEST)
    fixed = kafka_start_offsets(kafka_client_config(services, {}), spec, "unused-group")
    assert dict(fixed) == {0: 1, 1: 1}
    produce(services, topic, [(0, 3, None), (1, 4, None)])  # after submit, before the tasks open
    source, out = start(spec, {start_offsets_parameter(UID): encode_start_offsets(fixed)})
    try:
        assert read(source, out, 2) == [3, 4]
    finally:
        source.close()


def test_latest_decided_at_open_skips_what_was_there(services: Endpoints, topic: str) -> None:
    produce(services, topic, [(0, 1, None), (1, 2, None)])
    source, out = start(spec_for(topic, LATEST))
    try:
        produce(services, topic, [(1, 5, None)])
        assert read(source, out, 1) == [5]
    finally:
        source.close()


def test_a_timestamp_start_reads_from_the_first_record_at_or_after_it(services: Endpoints, topic: str) -> None:
    base = 1_700_000_000_000
    produce(services, topic, [(0, 10, base + 1000), (0, 20, base + 2000), (0, 30, base + 3000), (1, 40, base + 500)])
    source, out = start(spec_for(topic, Timestamp(base + 2000)))
    try:
        assert read(source, out, 2) == [20, 30]  # partition 1 has nothing after: it starts at its end
        produce(services, topic, [(1, 50, base + 100)])
        assert read(source, out, 3) == [20, 30, 50]
    finally:
        source.close()


def test_committed_positions_are_visible_to_an_admin_client_and_a_committed_start_resumes_there(
    services: Endpoints, topic: str
) -> None:
    group = f"weir-test-{uuid.uuid4().hex[:8]}"
    produce(services, topic, [(0, 1, None), (0, 2, None), (1, 3, None)])
    first, out = start(spec_for(topic, OffsetReset.EARLIEST, group_id=group))
    try:
        assert read(first, out, 3) == [1, 2, 3]
        first.snapshot_state(1)
        produce(services, topic, [(0, 4, None)])
        read(first, out, 4)
        first.snapshot_state(2)
        first.notify_checkpoint_aborted(2)  # never committed
        first.notify_checkpoint_complete(1)

        def committed() -> dict[int, int]:
            first.poll(10)  # serves the commit callback
            return kafka.committed_offsets(services, group, topic)

        offsets = polling.settle(30, committed, lambda found: found == {0: 2, 1: 1}, 0.1)
        assert offsets == {0: 2, 1: 1}, f"committed offsets {offsets}"
    finally:
        first.close()
    again, out_again = start(spec_for(topic, Committed(OffsetReset.LATEST), group_id=group))
    try:
        assert read(again, out_again, 1) == [4]  # partition 0 from its committed offset 2
    finally:
        again.close()


def test_committed_without_a_commit_falls_back_to_the_reset(services: Endpoints, topic: str) -> None:
    produce(services, topic, [(0, 1, None), (1, 2, None)])
    group = f"weir-test-{uuid.uuid4().hex[:8]}"
    source, out = start(spec_for(topic, Committed(OffsetReset.EARLIEST), group_id=group))
    try:
        assert read(source, out, 2) == [1, 2]
    finally:
        source.close()


def test_discovery_reads_a_partition_added_while_reading(services: Endpoints, topic: str) -> None:
    produce(services, topic, [(0, 1, None)])
    source, out = start(spec_for(topic, OffsetReset.EARLIEST, partition_discovery_interval_ms=200))
    try:
        assert read(source, out, 1) == [1]
        kafka.grow_partitions(services, topic, 3)
        produce(services, topic, [(2, 7, None), (1, 8, None)])
        assert read(source, out, 3) == [1, 7, 8]
    finally:
        source.close()
