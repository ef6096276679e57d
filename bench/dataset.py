"""The benchmark's input and output: events over 8 partitions, paced production, committed output.

Event ``i`` goes to partition ``p = i % 8`` as that partition's ``j = i // 8``-th record; its key is
``key-NNNN`` with ``NNNN = (j % 125) * 8 + p`` (1,000 keys, each living in one partition, as a
Kafka-keyed topic has them) and its event time is ``START_MS + j``: event time advances 1 ms per
event in each partition, so every window of 1 s holds 1,000 events per partition, 8 per key. The
payload is the keyed aggregation's JSON ``{"id", "key", "value", "ts"}``. After the last event each
partition gets one sentinel event 10 s later in event time (key ``end-P``), so that contenders which
close windows on event time only (Quix Streams, the raw limit) close the last real window too.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import time
from collections.abc import Iterable
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from weir.connectors import kafka
from weir.core.config import Endpoints

PARTITIONS: Final = 8
KEYS: Final = 1000
KEYS_PER_PARTITION: Final = KEYS // PARTITIONS
START_MS: Final = 1_700_000_000_000
WINDOW_MS: Final = 1000
SENTINEL_GAP_MS: Final = 10_000


def partition_of_key(key_index: int) -> int:
    return key_index % PARTITIONS


def event_bytes(i: int) -> tuple[int, bytes, bytes]:
    """(partition, key, value) of event ``i``."""
    p = i % PARTITIONS
    j = i // PARTITIONS
    key = f"key-{(j % KEYS_PER_PARTITION) * PARTITIONS + p:04d}"
    value = f'{{"id":"e{i}","key":"{key}","value":{i % 97},"ts":{START_MS + j}}}'
    return p, key.encode(), value.encode()


def sentinel_bytes(partition: int, events: int) -> tuple[bytes, bytes]:
    last_j = (events - 1 - partition) // PARTITIONS if events > partition else 0
    key = f"end-{partition}"
    ts = START_MS + last_j + SENTINEL_GAP_MS
    return key.encode(), f'{{"id":"end-{partition}","key":"{key}","value":0,"ts":{ts}}}'.encode()


def last_event_of_window(key_index: int, window_start: int) -> int:
    """Index j (within the key's partition) of the key's last event in the window."""
    r = key_index // PARTITIONS
    last = window_start - START_MS + WINDOW_MS - 1
    return last - ((last - r) % KEYS_PER_PARTITION)


def create_topics(endpoints: Endpoints, topics: dict[str, int], config: dict[str, str] | None = None) -> None:
    """Create topics (optionally with topic configs); existing ones are replaced.

    Time retention is off (``retention.ms=-1``) unless ``config`` says otherwise: event times are from
    2023 (``START_MS``) and contenders stamp their output with event time, so the broker's 7-day
    retention would delete output records in the middle of a run. The run deletes its topics at the end.
    """
    from confluent_kafka.admin import NewTopic

    kafka.delete_topics(endpoints, topics)
    client = kafka.admin(endpoints)
    futures = client.create_topics(
        [
            NewTopic(name, num_partitions=n, replication_factor=1, config={"retention.ms": "-1", **(config or {})})
            for name, n in topics.items()
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = client.list_topics(timeout=10).topics
        if all(name in listed and len(listed[name].partitions) == n for name, n in topics.items()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topics {sorted(topics)} not visible 30 s after creation")


def delete_topics_containing(endpoints: Endpoints, marker: str) -> list[str]:
    """Delete every topic whose name contains ``marker`` (the run id): inputs, outputs, changelogs."""
    names = [t for t in kafka.admin(endpoints).list_topics(timeout=10).topics if marker in t]
    if names:
        kafka.delete_topics(endpoints, names)
    return names


def produce_dataset(endpoints: Endpoints, topic: str, events: int) -> int:
    """Produce ``events`` events and one sentinel per partition; returns the records written."""
    producer = kafka.producer(
        endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True, compression_type="none"
    )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    def produce(partition: int, key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(events):
        produce(*event_bytes(i))
        if i % 20_000 == 0:
            producer.poll(0)
    for p in range(PARTITIONS):
        produce(p, *sentinel_bytes(p, events))
    if producer.flush(120) or errors:
        raise RuntimeError(f"producing the data set into {topic} failed: {errors[:3]}")
    return events + PARTITIONS


def end_offsets(endpoints: Endpoints, topic: str) -> dict[int, int]:
    consumer = kafka.consumer(endpoints, group_id="weir-bench-offsets")
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def quiet_admin(endpoints: Endpoints) -> AdminClient:
    """An admin client that logs warnings and errors only (the benchmark polls with one)."""
    return AdminClient({**kafka.client_config(endpoints), "log_level": 4})


def committed_offsets(client: AdminClient, group: str, topic: str) -> dict[int, int]:
    """The consumer group's committed offsets on ``topic`` (partitions without a commit are absent)."""
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])]
    result = next(iter(client.list_consumer_group_offsets(request).values())).result(timeout=10)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def group_fully_assigned(client: AdminClient, group: str, members: int, partitions: int) -> bool:
    """Whether the consumer group is stable with ``members`` members holding ``partitions`` partitions."""
    from confluent_kafka import ConsumerGroupState

    description = next(iter(client.describe_consumer_groups([group]).values())).result(timeout=10)
    assigned = sum(len(m.assignment.topic_partitions) for m in description.members if m.assignment)
    return (
        description.state == ConsumerGroupState.STABLE
        and len(description.members) == members
        and assigned >= partitions
    )


def wait_output_settled(endpoints: Endpoints, topic: str, timeout_s: float = 30.0) -> None:
    """Wait until no transaction is open on ``topic`` (last stable offset == high watermark everywhere).

    A producer's ``commit_transaction`` returns once the commit is decided; the markers that make the
    records visible reach the partitions a moment later, so output is read only once settled."""
    deadline = time.monotonic() + timeout_s
    partitions = kafka.partition_count(endpoints, topic)
    while time.monotonic() < deadline:
        offsets = kafka.partition_offsets(endpoints, topic, partitions)
        if all(stable == high for _low, stable, high in offsets.values()):
            return
        time.sleep(0.2)


# Output --------------------------------------------------------------------------------------------------


WindowResult = tuple[str, int, int, int, int]
"""One window result as a whole record: (key, window_start, window_end, count, sum)."""


def expected_windows(events: int) -> int:
    """Distinct (key, window) pairs among events 0..events-1 (a key meets every window up to its last)."""
    total = 0
    for p in range(PARTITIONS):
        in_partition = (events - p + PARTITIONS - 1) // PARTITIONS if events > p else 0
        for r in range(min(KEYS_PER_PARTITION, in_partition)):
            last_j = r + (in_partition - 1 - r) // KEYS_PER_PARTITION * KEYS_PER_PARTITION
            total += last_j // WINDOW_MS + 1
    return total


def expected_results(events: int) -> list[WindowResult]:
    """Every window result the input implies, as whole records (count and sum): the reference each
    contender's output is compared with. From the event formula of :func:`event_bytes`, without
    the sentinels' windows."""
    acc: dict[tuple[int, int], list[int]] = {}
    for i in range(events):
        p, j = i % PARTITIONS, i // PARTITIONS
        key_index = (j % KEYS_PER_PARTITION) * PARTITIONS + p
        window_start = START_MS + j - j % WINDOW_MS
        entry = acc.get((key_index, window_start))
        if entry is None:
            acc[(key_index, window_start)] = [1, i % 97]
        else:
            entry[0] += 1
            entry[1] += i % 97
    return [(f"key-{k:04d}", w, w + WINDOW_MS, c, s) for (k, w), (c, s) in acc.items()]


def result_record(result: dict[str, Any]) -> WindowResult:
    """A contender's result record (JSON object) as a whole record; a missing field raises KeyError."""
    return (
        str(result["key"]),
        int(result["window_start"]),
        int(result["window_end"]),
        int(result["count"]),
        int(result["sum"]),
    )


def read_results(endpoints: Endpoints, topic: str) -> list[WindowResult]:
    """The committed window results of ``topic`` (read_committed, once no transaction is open), the
    sentinels' windows left out; a record that is not a result becomes a record that matches none."""
    wait_output_settled(endpoints, topic)
    out: list[WindowResult] = []
    for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, topic, timeout_s=300):
        try:
            result = json.loads(value or b"{}")
            if str(result.get("key", "")).startswith("end-"):
                continue  # the sentinels' windows
            out.append(result_record(result))
        except (ValueError, KeyError, TypeError, AttributeError):
            out.append(("<not a result>", 0, 0, 0, len(value or b"")))
    return out


def result_identity(record: tuple[Any, ...]) -> tuple[Any, ...]:
    """A window result's identity, (key, window_start): a record with another count or sum is a
    changed record, not a missing and an unexpected one."""
    return record[:2]


# Paced production and output visibility (each in its own process) -------------------------------------


def paced_producer(
    bootstrap: str, topic: str, rate: float, duration_s: float, result: multiprocessing.connection.Connection
) -> None:
    """Produce events 0.. at ``rate`` events/s for ``duration_s``; send back, per partition, the
    broker's append time (ms, LogAppendTime topics) of each offset, and the events produced."""
    endpoints = Endpoints.from_env({"WEIR_KAFKA_BOOTSTRAP": bootstrap})
    producer = kafka.producer(endpoints, linger_ms=2, enable_idempotence=True)
    appended: list[dict[int, int]] = [{} for _ in range(PARTITIONS)]
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            appended[msg.partition()][msg.offset()] = msg.timestamp()[1]

    started = time.monotonic()
    i = 0
    step_s = 0.005
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= duration_s:
            break
        due = int(elapsed * rate)
        while i < due:
            p, key, value = event_bytes(i)
            try:
                producer.produce(topic, value=value, key=key, partition=p, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.01)
                continue
            i += 1
        producer.poll(step_s)
    producer.flush(60)
    result.send({"events": i, "errors": errors[:5], "appended": [sorted(a.items()) for a in appended], "rate": rate})


def output_watcher(bootstrap: str, topic: str, stop: multiprocessing.connection.Connection) -> None:
    """Read ``topic`` read_committed from the start until told to stop; send back each record's
    (key, window_start, wall-clock ms when this consumer received it)."""
    endpoints = Endpoints.from_env({"WEIR_KAFKA_BOOTSTRAP": bootstrap})
    consumer = kafka.consumer(
        endpoints,
        group_id=f"weir-bench-watch-{topic}",
        isolation_level="read_committed",
        enable_partition_eof=False,
        fetch_wait_max_ms=10,
        fetch_min_bytes=1,
    )
    partitions = kafka.partition_count(endpoints, topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen: list[tuple[str, int, float]] = []
    try:
        while not stop.poll():
            for msg in consumer.consume(num_messages=1000, timeout=0.05):
                received = time.time() * 1000.0
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}: {msg.error()}")
                    continue
                result = json.loads(msg.value())
                seen.append((str(result["key"]), int(result["window_start"]), received))
    finally:
        consumer.close()
    stop.recv()
    stop.send(seen)


def latencies_ms(
    appended: list[list[tuple[int, int]]], seen: Iterable[tuple[str, int, float]], since_ms: float
) -> list[float]:
    """Visibility minus the append time of the window's last event, per (key, window) seen first,
    for windows whose last event was appended at or after ``since_ms`` (the warm-up excluded)."""
    append_ms = [dict(a) for a in appended]
    first_seen: dict[tuple[str, int], float] = {}
    for key, window_start, received in seen:
        if key.startswith("key-"):
            first_seen.setdefault((key, window_start), received)
    out: list[float] = []
    for (key, window_start), received in first_seen.items():
        key_index = int(key[4:])
        j = last_event_of_window(key_index, window_start)
        appended_at = append_ms[partition_of_key(key_index)].get(j)
        if appended_at is None or appended_at < since_ms:
            continue
        out.append(received - appended_at)
    return out
