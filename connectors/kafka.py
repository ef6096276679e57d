"""Kafka adapter: the one module that talks to confluent-kafka.

Weir's sources read explicit partitions from explicit offsets (never consumer-group commits), and its
sinks write through transactional producers. Every client built here gets its configuration from
``client_config`` so that bootstrap servers and client ids are set in one place.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from weir.config import Endpoints
from weir.errors import ServiceUnavailableError


def client_config(endpoints: Endpoints, **overrides: object) -> dict[str, object]:
    config: dict[str, object] = {"bootstrap.servers": endpoints.kafka_bootstrap}
    config.update({k.replace("_", "."): v for k, v in overrides.items()})
    return config


def admin(endpoints: Endpoints) -> AdminClient:
    return AdminClient(client_config(endpoints))


def create_topics(
    endpoints: Endpoints, topics: Mapping[str, int], timeout_s: float = 30.0, replace: bool = False
) -> None:
    """Create each topic with its partition count; an existing topic is kept (or replaced)."""
    client = admin(endpoints)
    if replace:
        delete_topics(endpoints, topics.keys(), timeout_s)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=n, replication_factor=1) for name, n in topics.items()],
        operation_timeout=timeout_s,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ServiceUnavailableError(f"kafka: cannot create topic {name!r}: {exc}") from exc
    _wait_for_topics(client, topics, timeout_s)


def delete_topics(endpoints: Endpoints, names: Iterable[str], timeout_s: float = 30.0) -> None:
    client = admin(endpoints)
    names = list(names)
    existing = set(client.list_topics(timeout=timeout_s).topics)
    doomed = [n for n in names if n in existing]
    if not doomed:
        return
    for future in client.delete_topics(doomed, operation_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not set(doomed) & set(client.list_topics(timeout=timeout_s).topics):
            return
        time.sleep(0.1)
    raise ServiceUnavailableError(f"kafka: topics {doomed} still listed {timeout_s}s after deletion")


def _wait_for_topics(client: AdminClient, topics: Mapping[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metadata = client.list_topics(timeout=timeout_s).topics
        if all(name in metadata and len(metadata[name].partitions) == n for name, n in topics.items()):
            return
        time.sleep(0.1)
    raise ServiceUnavailableError(f"kafka: topics {sorted(topics)} not visible after {timeout_s}s")


def partition_count(endpoints: Endpoints, topic: str, timeout_s: float = 10.0) -> int:
    metadata = admin(endpoints).list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise ServiceUnavailableError(f"kafka: topic {topic!r} does not exist")
    return len(metadata.partitions)


def producer(endpoints: Endpoints, **overrides: object) -> Producer:
    return Producer(client_config(endpoints, **overrides))


def consumer(endpoints: Endpoints, **overrides: object) -> Consumer:
    base: dict[str, object] = {
        "group.id": "weir-reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    }
    base.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Consumer(client_config(endpoints, **base))


def read_all(
    endpoints: Endpoints, topic: str, isolation_level: str = "read_committed", timeout_s: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of a topic, from the start to the end offsets seen now: (partition, offset, key, value)."""
    from confluent_kafka import TopicPartition

    reader = consumer(endpoints, isolation_level=isolation_level)
    try:
        n = partition_count(endpoints, topic)
        ends: dict[int, int] = {}
        for p in range(n):
            _low, high = reader.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            ends[p] = high
        pending = {p for p, high in ends.items() if high > 0}
        reader.assign([TopicPartition(topic, p, 0) for p in pending])
        out: list[tuple[int, int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"kafka: reading {topic!r} did not reach its end in {timeout_s}s"
                )
            msg = reader.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= ends[msg.partition()]:
                        pending.discard(msg.partition())
                    continue
                raise ServiceUnavailableError(f"kafka: reading {topic!r}: {msg.error()}")
            out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
        return out
    finally:
        reader.close()
