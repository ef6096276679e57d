"""Kafka adapter: the one module that talks to confluent-kafka.

Weir's sources read explicit partitions from explicit offsets (never consumer-group commits), and its
sinks write through transactional producers. Every client built here gets its configuration from
``client_config``: the cluster and its settings of a job's
:class:`~weir.core.kafka_config.KafkaClientConfig` (its secret references resolved there, in this
process, and handed to the client alone), under the settings Weir needs of that client. Each function
takes a :data:`KafkaTarget`: a job's configuration, or the endpoints (the endpoints' broker with no
setting of its own: the local tools and tests).
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError, ServiceUnavailableError, WeirError
from weir.core.kafka_config import KafkaClientConfig, secret_values

KafkaTarget = KafkaClientConfig | Endpoints
"""Which Kafka cluster a call reaches and how: a job's client configuration, or the endpoints' broker
with no setting of its own."""

_Client = TypeVar("_Client", Producer, Consumer, AdminClient)

METADATA_SLICE_S = 1.0
"""A metadata request's first try waits this long (each next one twice as long), so that a refused
login ends the wait within a second."""

_REFUSALS: dict[int, str] = {
    KafkaError._AUTHENTICATION: "refused the client's login",
    KafkaError.SASL_AUTHENTICATION_FAILED: "refused the client's login",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "refused access to a topic",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "refused access to the cluster",
    KafkaError._SSL: "failed the TLS handshake",
}
"""Client errors that are the job's configuration, not an outage: retrying cannot help."""

_FINAL_ONLY = frozenset({KafkaError._SSL})
"""Refusals that also happen in passing (a connection dropped mid-handshake): they end a request only
when it found no answer at all within its time, as the reason why."""


def cluster_config(target: KafkaTarget) -> KafkaClientConfig:
    """The target as a client configuration (the endpoints: their broker, no setting of its own)."""
    match target:
        case KafkaClientConfig():
            return target
        case Endpoints():
            return KafkaClientConfig.of(target)
        case _:
            assert_never(target)


def bootstrap_of(target: KafkaTarget) -> str:
    """The bootstrap servers a target names (for messages)."""
    return cluster_config(target).bootstrap_servers


def client_config(target: KafkaTarget, **defaults: object) -> dict[str, object]:
    """A client's constructor settings: Weir's ``defaults`` for this client (``linger_ms`` for
    ``linger.ms``), the target's settings over them (resolved here). The settings Weir relies on are
    refused in a job's settings (``weir.core.kafka_config.RESERVED_PROPERTIES``), so whatever a
    caller passes for them stays."""
    return _settings(target, {k.replace("_", "."): v for k, v in defaults.items()})


def _settings(
    target: KafkaTarget, defaults: Mapping[str, object], fixed: Mapping[str, object] | None = None
) -> dict[str, object]:
    """``defaults``, the target's resolved settings over them, ``fixed`` (callbacks, what a client
    cannot work without) over those."""
    config: dict[str, object] = dict(defaults)
    config.update(cluster_config(target).client_settings())
    config.update(fixed or {})
    return config


class ClientErrors:
    """The client-level errors librdkafka reports (``error_cb``) of one client, the last few kept: an
    authentication or TLS failure shows there, while a request only times out."""

    def __init__(self, kept: int = 8) -> None:
        self.errors: deque[KafkaError] = deque(maxlen=kept)

    def __call__(self, error: KafkaError) -> None:
        # 'brokers are down' summarizes the others, many to one failed connection: kept, they would
        # push the cause out.
        if error.code() != KafkaError._ALL_BROKERS_DOWN:
            self.errors.append(error)

    @property
    def last_cause(self) -> KafkaError | None:
        """The latest error the client reported (a summary of brokers down aside)."""
        return self.errors[-1] if self.errors else None

    def refusal(self, *, final: bool = True) -> KafkaError | None:
        """The latest error that says the cluster refuses this client's configuration; before a
        request's time is over (``final=False``) only those that cannot happen in passing."""
        return next(
            (e for e in reversed(self.errors) if e.code() in _REFUSALS and (final or e.code() not in _FINAL_ONLY)),
            None,
        )


def _new(kind: type[_Client], target: KafkaTarget, config: dict[str, object]) -> _Client:
    """Make the client; settings librdkafka refuses (an unknown key, a bad value) are the job's error,
    in one line without any secret value."""
    try:
        return kind(config)
    except (KafkaException, ValueError, TypeError) as exc:
        text = str(exc.args[0].str() if isinstance(exc, KafkaException) else exc)
        for secret in secret_values({k: str(v) for k, v in config.items()}):
            text = text.replace(secret, "<redacted>")
        raise JobDefinitionError(
            f"kafka: the client settings for {bootstrap_of(target)} are refused: {text} (check the job's "
            "-D kafka.* parameters and the connector's properties=)"
        ) from None


def refused_error(target: KafkaTarget, error: KafkaError) -> JobDefinitionError:
    """A cluster that refuses the job's credentials or certificates: one line naming the broker's
    error and the settings to check (as given: references, never a secret)."""
    config = cluster_config(target)
    shown = {k: v for k, v in config.redacted().items() if k.startswith(("security.", "sasl.", "ssl."))}
    settings = ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "no security settings"
    return JobDefinitionError(
        f"kafka at {config.bootstrap_servers} {_REFUSALS[error.code()]}: {error.str()} (with {settings}; check the "
        "job's -D kafka.* parameters and the connector's properties=)",
        fault="user",
    )


def unreachable(target: KafkaTarget, errors: ClientErrors, what: str, exc: object) -> WeirError:
    """Why a request (``what`` went wrong) failed: the cluster refusing the configuration (the job's
    to fix, not retriable), or Kafka not answering (retriable), with what the client saw last (a
    broker that closes a TLS connection with an alert, as one requiring a client certificate does
    under TLS 1.3, is a transport error to librdkafka: only its text says why)."""
    refusal = errors.refusal()
    if refusal is not None:
        return refused_error(target, refusal)
    seen = "" if errors.last_cause is None else f" (the client's last error: {errors.last_cause.str()})"
    return ServiceUnavailableError(f"kafka: {what}: {exc}{seen}")


def admin(target: KafkaTarget) -> AdminClient:
    return _new(AdminClient, target, client_config(target))


def create_topics(
    target: KafkaTarget, topics: Mapping[str, int], timeout_s: float = 30.0, replace: bool = False
) -> None:
    """Create each topic with its partition count; an existing topic is kept (or replaced)."""
    client = admin(target)
    if replace:
        delete_topics(target, topics.keys(), timeout_s)
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


def delete_topics(target: KafkaTarget, names: Iterable[str], timeout_s: float = 30.0) -> None:
    client = admin(target)
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


def _list_topics(
    client: AdminClient | Consumer,
    errors: ClientErrors,
    target: KafkaTarget,
    timeout_s: float,
    topic: str | None = None,
) -> Any:
    """Cluster metadata (of one topic, or of all), asked in slices: a refused login or TLS handshake
    ends the wait at once (JobDefinitionError naming the broker's error); no answer within
    ``timeout_s`` is ServiceUnavailableError."""
    deadline = time.monotonic() + timeout_s
    slice_s = METADATA_SLICE_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            return client.list_topics(topic=topic, timeout=max(0.1, min(slice_s, remaining)))
        except KafkaException as exc:
            slice_s *= 2  # a large cluster's metadata may take longer than the first slice
            _serve_error_callbacks(client)
            if errors.refusal(final=False) is not None or time.monotonic() >= deadline:
                what = "no answer" if topic is None else f"no metadata for topic {topic!r}"
                raise unreachable(
                    target, errors, f"{what} from {bootstrap_of(target)} within {timeout_s}s", exc
                ) from None


def _serve_error_callbacks(client: AdminClient | Consumer) -> None:
    """Have ``error_cb`` told what the client saw: confluent-kafka calls it from ``poll`` only. A
    consumer's poll could hand out a record, so a consumer is left to its own ``consume``."""
    if isinstance(client, AdminClient):
        client.poll(0)


def partition_count(target: KafkaTarget, topic: str, timeout_s: float = 10.0) -> int:
    client, errors = _inspect_admin(target)
    metadata = _list_topics(client, errors, target, timeout_s, topic).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise ServiceUnavailableError(f"kafka: topic {topic!r} does not exist at {bootstrap_of(target)}")
    return len(metadata.partitions)


def producer(target: KafkaTarget, **defaults: object) -> Producer:
    return _new(Producer, target, client_config(target, **defaults))


def consumer(target: KafkaTarget, **defaults: object) -> Consumer:
    base: dict[str, object] = {
        "group.id": "weir-reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    }
    base.update({k.replace("_", "."): v for k, v in defaults.items()})
    return _new(Consumer, target, _settings(target, base))


CommitErrorHandler = Callable[[str], None]
"""Told why an asynchronous offset commit failed (one line)."""


class PartitionReader:
    """A source subtask's reader of explicit partitions of one topic, from explicit offsets,
    read_committed. Messages come back as the client gives them (``value()``, ``key()``,
    ``partition()``, ``offset()``, ``timestamp()``, ``headers()``, ``error()``); an error that only
    says a partition's end was reached is told apart by ``is_end_of_partition``.

    Positions are never read back from the consumer group for recovery; ``commit`` only publishes
    them (for lag monitoring and ``Committed`` starts), asynchronously: a failure goes to
    ``on_commit_error`` when the next ``consume`` serves the callback."""

    def __init__(
        self,
        target: KafkaTarget,
        topic: str,
        *,
        group_id: str,
        fetch_wait_max_ms: int = 50,
        on_commit_error: CommitErrorHandler | None = None,
    ) -> None:
        """``target``: the source's configuration (the job's settings, the source's ``properties=``
        over them); ``fetch_wait_max_ms`` is a default they may change."""
        self.topic = topic
        self._target = target
        self._on_commit_error = on_commit_error
        self._errors = ClientErrors()
        fixed: dict[str, object] = {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "on_commit": self._committed,
            "error_cb": self._errors,
        }
        self._consumer = _new(Consumer, target, _settings(target, {"fetch.wait.max.ms": fetch_wait_max_ms}, fixed))

    def _committed(self, err: Any, partitions: list[TopicPartition]) -> None:
        failed = [f"[{tp.partition}]: {tp.error}" for tp in partitions or [] if tp.error is not None]
        if (err is not None or failed) and self._on_commit_error is not None:
            self._on_commit_error(f"{err if err is not None else ''} {' '.join(failed)}".strip())

    def partition_count(self, timeout_s: float = 10.0) -> int:
        """The topic's partition count as the cluster metadata says now."""
        metadata = _list_topics(self._consumer, self._errors, self._target, timeout_s, self.topic).topics.get(
            self.topic
        )
        if metadata is None or metadata.error is not None:
            raise ServiceUnavailableError(f"kafka: topic {self.topic!r} does not exist at {bootstrap_of(self._target)}")
        return len(metadata.partitions)

    def end_offset(self, partition: int, timeout_s: float = 30.0) -> int:
        """The partition's high watermark, asked of the broker."""
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=timeout_s)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"kafka: no end offset for {self.topic}[{partition}]: {exc}") from exc
        return int(high)

    def offsets_for_time(self, partitions: Iterable[int], timestamp_ms: int, timeout_s: float = 30.0) -> dict[int, int]:
        """Per partition the first offset whose record's timestamp is at or after ``timestamp_ms``;
        the partition's end offset when it has none."""
        request = [TopicPartition(self.topic, p, timestamp_ms) for p in partitions]
        if not request:
            return {}
        try:
            answered = self._consumer.offsets_for_times(request, timeout=timeout_s)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"kafka: offsets for time {timestamp_ms} of {self.topic!r}: {exc}") from exc
        out: dict[int, int] = {}
        for tp in answered:
            if tp.error is not None:
                raise ServiceUnavailableError(f"kafka: offset for time of {self.topic}[{tp.partition}]: {tp.error}")
            out[tp.partition] = int(tp.offset) if tp.offset >= 0 else self.end_offset(tp.partition, timeout_s)
        return out

    def committed(self, partitions: Iterable[int], timeout_s: float = 30.0) -> dict[int, int | None]:
        """The consumer group's committed offset of each partition (None: nothing committed)."""
        request = [TopicPartition(self.topic, p) for p in partitions]
        if not request:
            return {}
        try:
            answered = self._consumer.committed(request, timeout=timeout_s)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"kafka: committed offsets of {self.topic!r}: {exc}") from exc
        return {tp.partition: (int(tp.offset) if tp.offset >= 0 else None) for tp in answered}

    def cached_high_watermark(self, partition: int) -> int:
        """The high watermark of the last fetch response (no broker request); negative while unknown."""
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
        except KafkaException:
            return -1
        return int(high)

    def assign(self, next_offsets: Mapping[int, int | None]) -> None:
        """Read these partitions (only these), each from its next offset (None: from the beginning)."""
        self._consumer.assign(self._positions(next_offsets))

    def add(self, next_offsets: Mapping[int, int | None]) -> None:
        """Also read these partitions, each from its next offset (None: from the beginning)."""
        self._consumer.incremental_assign(self._positions(next_offsets))

    def _positions(self, next_offsets: Mapping[int, int | None]) -> list[TopicPartition]:
        return [
            TopicPartition(self.topic, p, OFFSET_BEGINNING if offset is None else offset)
            for p, offset in next_offsets.items()
        ]

    def unassign(self, partition: int) -> None:
        self._consumer.incremental_unassign([TopicPartition(self.topic, partition)])

    def commit(self, next_offsets: Mapping[int, int]) -> None:
        """Commit these positions (next offset per partition) to the group, without waiting."""
        if not next_offsets:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in next_offsets.items()], asynchronous=True
            )
        except KafkaException as exc:
            if self._on_commit_error is not None:
                self._on_commit_error(str(exc))

    def consume(self, max_messages: int, timeout_s: float) -> list[Any]:
        return self._consumer.consume(num_messages=max_messages, timeout=timeout_s)

    @staticmethod
    def is_end_of_partition(error: Any) -> bool:
        return bool(error.code() == KafkaError._PARTITION_EOF)

    def close(self) -> None:
        self._consumer.close()


def committed_offsets(target: KafkaTarget, group_id: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """The offsets ``group_id`` has committed for ``topic``, by partition (uncommitted ones left out),
    read through the admin API."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    client = admin(target)
    request = ConsumerGroupTopicPartitions(
        group_id, [TopicPartition(topic, p) for p in range(partition_count(target, topic, timeout_s))]
    )
    try:
        answer = client.list_consumer_group_offsets([request], request_timeout=timeout_s)[group_id].result(
            timeout=timeout_s
        )
    except KafkaException as exc:
        raise ServiceUnavailableError(f"kafka: committed offsets of group {group_id!r}: {exc}") from exc
    return {tp.partition: int(tp.offset) for tp in answer.topic_partitions if tp.offset >= 0}


def read_all(
    target: KafkaTarget, topic: str, isolation_level: str = "read_committed", timeout_s: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of a topic, from the start to the end offsets seen now: (partition, offset, key, value)."""
    from confluent_kafka import TopicPartition

    # The broker holds an empty fetch SCAN_FETCH_WAIT_MS, not 500 ms: a transactional topic's end is a
    # control record, which no consumer is given, so the read ends on the end-of-partition event
    reader = consumer(target, isolation_level=isolation_level, fetch_wait_max_ms=SCAN_FETCH_WAIT_MS)
    try:
        n = partition_count(target, topic)
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
                raise ServiceUnavailableError(f"kafka: reading {topic!r} did not reach its end in {timeout_s}s")
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


# Read-only inspection (weir verify, reference mode) -----------------------------------------------


def _quiet_logger() -> object:
    """A logger for inspection clients: a command reports an unreachable broker in one error line,
    without librdkafka's connection failures on stderr."""
    import logging

    log = logging.getLogger("weir.kafka.inspect")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False
    return log


def _inspect_admin(target: KafkaTarget) -> tuple[AdminClient, ClientErrors]:
    """An admin client that logs nothing and keeps its client errors (a refused login shows there)."""
    errors = ClientErrors()
    return _new(AdminClient, target, _settings(target, {}, {"logger": _quiet_logger(), "error_cb": errors})), errors


def _cluster_metadata(target: KafkaTarget, timeout_s: float) -> Any:
    """Every topic's metadata (asking for all, so that a broker allowing auto-creation creates none);
    ServiceUnavailableError when Kafka does not answer, JobDefinitionError naming the broker's error
    when it refuses the job's credentials or certificates."""
    client, errors = _inspect_admin(target)
    return _list_topics(client, errors, target, timeout_s)


def topic_partition_count(target: KafkaTarget, topic: str, timeout_s: float = 10.0) -> int | None:
    """The topic's partition count, None when it does not exist."""
    layout = lookup_topic(target, topic, timeout_s).topic
    return None if layout is None else layout.partitions


def partition_offsets(
    target: KafkaTarget, topic: str, partitions: int, timeout_s: float = 30.0
) -> dict[int, tuple[int, int, int]]:
    """Per partition ``(low watermark, last stable offset, high watermark)`` from the ListOffsets API.

    The last stable offset (LSO) is where a read_committed consumer stops: below the first record of
    a transaction still open. LSO < high watermark means a transaction is open on that partition.
    """
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    client, _errors = _inspect_admin(target)

    def offsets(spec: OffsetSpec, isolation: IsolationLevel) -> dict[int, int]:
        request = {TopicPartition(topic, p): spec for p in range(partitions)}
        try:
            futures = client.list_offsets(request, isolation_level=isolation, request_timeout=timeout_s)
            return {tp.partition: future.result(timeout=timeout_s).offset for tp, future in futures.items()}
        except KafkaException as exc:
            raise ServiceUnavailableError(f"kafka: cannot list the offsets of {topic!r}: {exc}") from exc

    low = offsets(OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)
    stable = offsets(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
    high = offsets(OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
    return {p: (low[p], stable[p], high[p]) for p in range(partitions)}


def read_committed_records(
    target: KafkaTarget, topic: str, timeout_s: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    """Every committed record of a topic up to the last stable offsets seen now, as
    ``(partition, offset, key, value, timestamp ms)``. Unlike ``read_all`` it does not wait for a
    transaction still open: it stops where a read_committed consumer must stop."""
    from confluent_kafka import TopicPartition

    partitions = topic_partition_count(target, topic)
    if partitions is None:
        raise ServiceUnavailableError(f"kafka: topic {topic!r} does not exist")
    offsets = partition_offsets(target, topic, partitions)
    starts = {p: low for p, (low, _stable, _high) in offsets.items()}
    ends = {p: stable for p, (low, stable, _high) in offsets.items() if stable > low}
    if not ends:
        return []
    # Short fetch waits and consume slices, as the recovery scans (SCAN_FETCH_WAIT_MS, SCAN_SLICE_S):
    # with the defaults every read took at least a second (weir verify reads three topics a job)
    reader = consumer(
        target, isolation_level="read_committed", logger=_quiet_logger(), fetch_wait_max_ms=SCAN_FETCH_WAIT_MS
    )
    try:
        reader.assign([TopicPartition(topic, p, starts[p]) for p in ends])
        pending = set(ends)
        out: list[tuple[int, int, bytes | None, bytes | None, int]] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"kafka: reading {topic!r} did not reach its last stable offsets in {timeout_s}s"
                )
            for msg in reader.consume(num_messages=1000, timeout=SCAN_SLICE_S):
                partition, offset = msg.partition(), msg.offset()
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if partition in ends and offset >= ends[partition]:
                            pending.discard(partition)
                        continue
                    raise ServiceUnavailableError(f"kafka: reading {topic!r}: {msg.error()}")
                if partition not in ends or offset >= ends[partition]:
                    continue
                out.append((partition, offset, msg.key(), msg.value(), msg.timestamp()[1]))
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
        return out
    finally:
        reader.close()


def end_offsets(target: KafkaTarget, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """The high watermark of every partition of ``topic`` now."""
    from confluent_kafka import TopicPartition

    reader = consumer(target)
    try:
        return {
            p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
            for p in range(partition_count(target, topic))
        }
    finally:
        reader.close()


# Transactions (exactly-once sinks) ------------------------------------------------------------------


SCAN_SLICE_S = 0.01
"""A recovery read's ``consume`` slice: librdkafka's batch consume returns only once it has the whole
batch or the timeout passed, so a read of a few records (a sink's commit markers) waited out the whole
timeout on every call; the callers loop to their own deadline, so a short slice costs nothing."""

SCAN_FETCH_WAIT_MS = 10
"""How long the broker holds a recovery read's fetch when it has nothing new: a read's end is often a
transaction's control record, which no consumer is given, so the read ends on the end-of-partition
event, which came only after the default 500 ms fetch wait."""

FLUSH_SLICE_S = 0.5  # a flush waits in slices of this, checking its progress in between
FLUSH_STALL_S = 15.0  # no record acknowledged for this long while some are pending: the flush fails
CLIENT_ERRORS_KEPT = 8


@dataclass
class FlushProgress:
    """Whether a flush still gets records acknowledged: pure, for its clock-driven tests."""

    pending: int
    since: float  # when ``pending`` last fell (or the flush began)
    stall_s: float

    def stalled(self, pending: int, now: float) -> bool:
        """Record ``pending`` at ``now``; True when it has not fallen for ``stall_s``."""
        if pending < self.pending:
            self.pending, self.since = pending, now
            return False
        return now - self.since >= self.stall_s


@dataclass
class Delivery:
    """Where one produced record landed; filled in by the delivery report during ``flush``."""

    partition: int | None = None
    offset: int | None = None


class TransactionalProducer:
    """A producer with a stable ``transactional.id``: the one place that calls confluent-kafka's
    transaction API. Errors come out as ServiceUnavailableError (retriable: the task restarts and the
    sink's recovery decides what to re-produce), or JobDefinitionError for a configuration the broker
    refuses."""

    def __init__(
        self, target: KafkaTarget, transactional_id: str, transaction_timeout_ms: int, **overrides: object
    ) -> None:
        self.transactional_id = transactional_id
        self._target = target
        fixed = {
            "transactional.id": transactional_id,
            "transaction.timeout.ms": transaction_timeout_ms,
            "error_cb": self._on_client_error,
        }
        self._transaction_timeout_ms = transaction_timeout_ms
        self._client_errors: deque[KafkaError] = deque(maxlen=CLIENT_ERRORS_KEPT)
        defaults = {"linger.ms": 5, **{k.replace("_", "."): v for k, v in overrides.items()}}
        self._producer = _new(Producer, target, _settings(target, defaults, fixed))
        self._errors: list[str] = []  # failed deliveries of the records produced with a ``Delivery``

    def _on_client_error(self, error: KafkaError) -> None:
        """librdkafka's client-level errors (brokers down, a fatal producer error); kept for the
        flush's failure message, and a fatal one ends the flush at once."""
        self._client_errors.append(error)

    def _fail(self, action: str, exc: KafkaException) -> ServiceUnavailableError:
        return ServiceUnavailableError(
            f"kafka transactional producer {self.transactional_id!r}: {action} failed: {exc.args[0]}"
        )

    def init(self, timeout_s: float) -> None:
        """Register the transactional id with its coordinator: bumps the producer epoch, which fences
        any older producer with the same id and aborts the transaction it left open (or completes
        one whose commit was already requested)."""
        try:
            self._producer.init_transactions(timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            refusal = next((e for e in reversed(self._client_errors) if e.code() in _REFUSALS), None)
            if refusal is not None:
                raise refused_error(self._target, refusal) from None
            if error.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise JobDefinitionError(
                    f"kafka transactional producer {self.transactional_id!r}: the broker refuses "
                    f"transaction.timeout.ms={self._transaction_timeout_ms}; it must not exceed the broker's "
                    "transaction.max.timeout.ms (default 900000): lower transaction_timeout_ms or raise the "
                    "broker setting",
                    fault="user",
                ) from exc
            raise self._fail("init_transactions", exc) from exc

    def begin(self) -> None:
        self._errors.clear()
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise self._fail("begin_transaction", exc) from exc

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        delivery: Delivery | None = None,
    ) -> None:
        """Queue a record into the open transaction; waits (serving delivery reports) while the local
        queue is full.

        Only a record given a ``delivery`` gets a delivery callback (where it landed, or its error
        for ``flush``). A sink's record gets none: the callback's Python call and message object
        were ~0.5 of the producer's ~3 CPU µs per record (``python -m bench.producer_delivery``,
        ``bench/results/producer-delivery.json``). Its failure is not lost:
        librdkafka counts every failed delivery of the transaction, and once one failed the
        transaction is abortable: a later ``produce`` is refused and ``commit_transaction`` fails
        (``commit`` aborts it, then reports it), so the checkpoint's epoch is never committed in
        part; the task's restart finds its marker uncommitted and produces the epoch again from the
        snapshot."""
        if delivery is None and partition is None:  # a sink's record: no keyword dict, no callback
            try:
                self._producer.produce(topic, value, key=key, timestamp=timestamp or 0)
                return
            except BufferError:
                pass  # the local queue is full: the loop below waits for room
            except KafkaException as exc:
                raise self._fail(f"produce to {topic!r}", exc) from exc
        kwargs: dict[str, Any] = {"key": key, "timestamp": timestamp or 0}
        if delivery is not None:

            def callback(err: Any, msg: Any) -> None:
                if err is not None:
                    self._errors.append(str(err))
                else:
                    delivery.partition, delivery.offset = msg.partition(), msg.offset()

            kwargs["on_delivery"] = callback
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, value, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise self._fail(f"produce to {topic!r}", exc) from exc

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float, stall_s: float = FLUSH_STALL_S) -> None:
        """Wait until every queued record of the transaction is acknowledged (the pre-commit).

        Fails (retriable) when the delivery of a record produced with a ``Delivery`` (the sink's
        commit marker) failed (another record's failure fails ``commit``, see ``produce``), when
        the client reports a fatal error,
        when ``timeout_s`` is over, or as soon as no record was acknowledged for ``stall_s`` while
        some are pending: after a broker restart librdkafka can keep records unacknowledged with no
        error until the transaction times out, and a new producer (the task's restart) gets them
        through at once."""
        clock = time.monotonic
        deadline = clock() + timeout_s
        progress = FlushProgress(len(self._producer), clock(), stall_s)
        while True:
            pending = self._producer.flush(max(0.0, min(FLUSH_SLICE_S, deadline - clock())))
            now = clock()
            fatal = [e for e in self._client_errors if e.fatal()]
            if fatal:
                raise ServiceUnavailableError(
                    f"kafka transactional producer {self.transactional_id!r}: fatal client error while "
                    f"flushing: {fatal[-1].str()}"
                )
            if self._errors or (pending and now >= deadline):
                raise ServiceUnavailableError(
                    f"kafka transactional producer {self.transactional_id!r}: {pending} record(s) not "
                    f"acknowledged within {timeout_s:.0f}s, delivery errors: {self._errors[:3]}"
                    f"{self._client_errors_text()}"
                )
            if not pending:
                return
            if progress.stalled(pending, now):
                raise ServiceUnavailableError(
                    f"kafka transactional producer {self.transactional_id!r}: no record acknowledged for "
                    f"{stall_s:.0f}s, {pending} pending{self._client_errors_text()}; the task restarts "
                    "with a new producer"
                )

    def _client_errors_text(self) -> str:
        if not self._client_errors:
            return ""
        return "; client errors: " + ", ".join(e.str() for e in list(self._client_errors)[-3:])

    def commit(self, timeout_s: float) -> None:
        """Commit the open transaction; a retriable error is retried within ``timeout_s``. A transaction
        that can no longer commit is aborted, then reported."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable() and time.monotonic() < deadline:
                    time.sleep(0.1)  # back off before asking the coordinator again
                    continue
                if error.txn_requires_abort():
                    self.abort(max(1.0, deadline - time.monotonic()))
                raise self._fail("commit_transaction", exc) from exc

    def abort(self, timeout_s: float) -> None:
        try:
            self._producer.abort_transaction(timeout_s)
        except KafkaException as exc:
            raise self._fail("abort_transaction", exc) from exc

    def close(self) -> None:
        """Discard what is still queued without waiting; the client is destroyed when dropped. A
        transaction left open ends by fencing (the next ``init``) or by its timeout."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        self._producer.poll(0)


def stable_partition(key: bytes, partitions: int) -> int:
    """A partition chosen from the key alone (CRC-32), the same in every process and client."""
    return zlib.crc32(key) % partitions


def ensure_topic(target: KafkaTarget, topic: str, partitions: int, timeout_s: float = 30.0) -> int:
    """Create the topic when missing; its partition count (an existing topic keeps its own)."""
    existing = topic_partition_count(target, topic, timeout_s)
    if existing is not None:
        return existing
    create_topics(target, {topic: partitions}, timeout_s)
    return partition_count(target, topic, timeout_s)


def _assign(reader: Consumer, topic: str, partition: int, offset: int) -> None:
    from confluent_kafka import TopicPartition

    reader.assign([TopicPartition(topic, partition, offset)])


def partition_range(target: KafkaTarget, topic: str, partition: int, timeout_s: float = 30.0) -> tuple[int, int]:
    """``(low watermark, high watermark)`` of one partition, open transactions included."""
    from confluent_kafka import TopicPartition

    reader = consumer(target, isolation_level="read_uncommitted")
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
        return int(low), int(high)
    except KafkaException as exc:
        raise ServiceUnavailableError(f"kafka: watermarks of {topic}[{partition}]: {exc}") from exc
    finally:
        reader.close()


def scan_partition(
    target: KafkaTarget, topic: str, partition: int, start: int, end: int, timeout_s: float = 60.0
) -> list[tuple[int, bytes | None, bytes | None]]:
    """Records ``start <= offset < end`` of one partition, read_uncommitted (aborted and open
    transactions included): ``(offset, key, value)``."""
    if end <= start:
        return []
    reader = consumer(target, isolation_level="read_uncommitted", fetch_wait_max_ms=SCAN_FETCH_WAIT_MS)
    try:
        _assign(reader, topic, partition, start)
        out: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"kafka: reading {topic}[{partition}] offsets {start}..{end} did not finish in {timeout_s:.0f}s"
                )
            for msg in reader.consume(num_messages=1000, timeout=SCAN_SLICE_S):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= end:
                            return out
                        continue
                    raise ServiceUnavailableError(f"kafka: reading {topic}[{partition}]: {msg.error()}")
                if msg.offset() >= end:
                    return out
                out.append((msg.offset(), msg.key(), msg.value()))
                if msg.offset() + 1 >= end:
                    return out
    finally:
        reader.close()


def is_committed(target: KafkaTarget, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
    """Whether the transactional record at ``offset`` was committed (False: aborted).

    A read_committed consumer positioned at ``offset`` is served the record once the partition's last
    stable offset has passed it, or skips past it if its transaction was aborted. Until every
    transaction that started before ``offset`` has ended (by commit, abort, fencing of its producer or
    its timeout) nobody can tell: then this waits, up to ``timeout_s``, and raises
    ServiceUnavailableError."""
    reader = consumer(
        target, isolation_level="read_committed", logger=_quiet_logger(), fetch_wait_max_ms=SCAN_FETCH_WAIT_MS
    )
    try:
        _assign(reader, topic, partition, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in reader.consume(num_messages=100, timeout=SCAN_SLICE_S):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() > offset:
                            return False
                        continue
                    raise ServiceUnavailableError(f"kafka: reading {topic}[{partition}]: {msg.error()}")
                if msg.offset() >= offset:
                    return msg.offset() == offset
        raise ServiceUnavailableError(
            f"kafka: cannot tell within {timeout_s:.0f}s whether the record at {topic}[{partition}]@{offset} was "
            "committed: a transaction that started before it is still open (its producer has not committed, "
            "restarted or reached transaction.timeout.ms)"
        )
    finally:
        reader.close()


# Topic administration (the sinks' commit marker topics) ---------------------------------------------


@dataclass(frozen=True)
class TopicLayout:
    """A topic as the cluster metadata describes it."""

    name: str
    partitions: int
    replication_factor: int  # replicas of its first partition


@dataclass(frozen=True)
class TopicLookup:
    """What one metadata request says: how many brokers the cluster has, and the topic if it exists."""

    brokers: int
    topic: TopicLayout | None


def lookup_topic(target: KafkaTarget, topic: str, timeout_s: float = 10.0) -> TopicLookup:
    """The broker count and the topic's layout (None when it does not exist; asks for every topic's
    metadata, so that a broker allowing auto-creation does not create it). Raises
    ServiceUnavailableError when Kafka does not answer."""
    metadata = _cluster_metadata(target, timeout_s)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return TopicLookup(len(metadata.brokers), None)
    first = found.partitions[min(found.partitions)]
    return TopicLookup(len(metadata.brokers), TopicLayout(topic, len(found.partitions), len(first.replicas)))


def list_topic_names(target: KafkaTarget, prefix: str = "", timeout_s: float = 10.0) -> list[str]:
    """The names of the existing topics that start with ``prefix``, sorted."""
    topics = _cluster_metadata(target, timeout_s).topics
    return sorted(name for name, meta in topics.items() if name.startswith(prefix) and meta.error is None)


def create_topic(
    target: KafkaTarget,
    topic: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str],
    timeout_s: float = 30.0,
) -> bool:
    """Create the topic with these settings and wait until its partitions are visible; False when it
    already existed (created by someone else, maybe with other settings: check them)."""
    client = admin(target)
    request = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor, config=dict(config))
    created = True
    try:
        client.create_topics([request], operation_timeout=timeout_s)[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise ServiceUnavailableError(f"kafka: cannot create topic {topic!r}: {exc.args[0].str()}") from exc
        created = False
    wait_for_partitions(target, topic, partitions if created else 1, timeout_s)
    return created


def grow_partitions(target: KafkaTarget, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    """Give the topic ``partitions`` partitions if it has fewer (never fewer than it has)."""
    client = admin(target)  # referenced until the result is in: a dropped client cancels its requests
    try:
        client.create_partitions([NewPartitions(topic, partitions)], operation_timeout=timeout_s)[topic].result(
            timeout=timeout_s
        )
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:  # already that many or more (a concurrent grow)
            raise ServiceUnavailableError(
                f"kafka: cannot grow topic {topic!r} to {partitions} partitions: {exc.args[0].str()}"
            ) from exc
    wait_for_partitions(target, topic, partitions, timeout_s)


def wait_for_partitions(target: KafkaTarget, topic: str, at_least: int, timeout_s: float = 30.0) -> int:
    """Poll the metadata until the topic shows at least ``at_least`` partitions; their count."""
    deadline = time.monotonic() + timeout_s
    while True:
        layout = lookup_topic(target, topic, timeout_s).topic
        if layout is not None and layout.partitions >= at_least:
            return layout.partitions
        if time.monotonic() >= deadline:
            raise ServiceUnavailableError(
                f"kafka: topic {topic!r} does not show {at_least} partition(s) after {timeout_s:.0f}s"
            )
        time.sleep(0.1)


def topic_configs(target: KafkaTarget, topic: str, names: Iterable[str], timeout_s: float = 30.0) -> dict[str, str]:
    """The topic's current value of each named config (its own override or the broker's default)."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    client = admin(target)
    try:
        entries = client.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceUnavailableError(f"kafka: cannot describe the configs of topic {topic!r}: {exc.args[0]}") from exc
    return {name: str(entries[name].value) for name in names if name in entries}


def set_topic_configs(target: KafkaTarget, topic: str, values: Mapping[str, str], timeout_s: float = 30.0) -> None:
    """Set these configs on the topic (incremental alter: its other configs stay as they are)."""
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in values.items()
        ],
    )
    client = admin(target)
    try:
        client.incremental_alter_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceUnavailableError(f"kafka: cannot alter the configs of topic {topic!r}: {exc.args[0]}") from exc


def delete_records_before(target: KafkaTarget, topic: str, partition: int, offset: int, timeout_s: float = 30.0) -> int:
    """Delete the records of one partition below ``offset`` (the DeleteRecords API: moves its log start
    offset); the new log start offset."""
    from confluent_kafka import TopicPartition

    request = TopicPartition(topic, partition, offset)
    client = admin(target)
    try:
        result = client.delete_records([request], request_timeout=timeout_s)[request].result(timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceUnavailableError(f"kafka: cannot delete records of {topic}[{partition}]: {exc.args[0]}") from exc
    return int(result.low_watermark)


def require_topic(target: KafkaTarget, topic: str, timeout_s: float = 10.0) -> TopicLookup:
    """The lookup of a topic that must exist already (a sink's output topic at submit): creates
    nothing; JobDefinitionError when it is missing, ServiceUnavailableError when Kafka does not answer."""
    lookup = lookup_topic(target, topic, timeout_s)
    if lookup.topic is None:
        raise JobDefinitionError(
            f"kafka sink output topic {topic!r} does not exist on {bootstrap_of(target)}: create it before "
            "submitting the job"
        )
    return lookup
