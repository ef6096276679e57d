"""The Kafka sink and its builder (Flink's ``KafkaSink.builder()``).

::

    sink = (
        KafkaSink.builder()
        .topic("window-results")
        .key(lambda r: r["key"])
        .delivery("exactly_once")
        .transaction_timeout_ms(timedelta(minutes=10))
        .build()
    )
    results.sink_to(sink, uid="kafka-sink")

``exactly_once`` (the default) is the transactional sink (one Kafka transaction per checkpoint,
committed when it completes); ``at_least_once`` flushes at every checkpoint. The options of the
transactional sink alone are refused with ``at_least_once``. ``properties`` are the sink's own
Kafka settings, over the job's ``-D kafka.*`` ones (``weir.core.kafka_config``,
docs/kafka-security.md). ``stream.sink_to_kafka(topic, uid=..., **options)`` is this builder with the
same option names. See docs/sinks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, assert_never

from weir.api.connector import Duration, OperatorFactory, Options, Sink, WithOnError, required
from weir.core.descriptors import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    SinkDelivery,
    SinkSpec,
    SinkSystem,
    validate_producer_properties,
)
from weir.core.errors import JobDefinitionError
from weir.core.json_codec import encode as json_serializer
from weir.core.kafka_config import Properties
from weir.core.rejections import OnRecordError
from weir.operators.epoch_spill import DEFAULT_EPOCH_MEMORY_BYTES

if TYPE_CHECKING:
    from weir.operators.sinks import KafkaSinkOperator
    from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator

KafkaDelivery = Literal["exactly_once", "at_least_once"]

OPTIONS = Options("kafka sink")


@dataclass(frozen=True)
class KafkaSink(Sink):
    """Writes each value to a Kafka topic (Flink's ``KafkaSink``). Made by :meth:`builder`.

    ``transaction_timeout_ms``, ``marker_replication_factor``, ``epoch_memory_bytes`` and
    ``spill_directory`` belong to ``exactly_once`` and are None with ``at_least_once``. ``properties``:
    the sink's own client settings (its producer's and, exactly-once, its marker topic's clients')."""

    topic: str
    serializer: Callable[[Any], bytes | None]
    key: Callable[[Any], bytes | str | None] | None
    delivery: KafkaDelivery
    transaction_timeout_ms: int | None
    marker_replication_factor: int | None
    epoch_memory_bytes: int | None
    spill_directory: Path | None
    properties: Properties = ()

    @staticmethod
    def builder() -> KafkaSinkBuilder:
        return KafkaSinkBuilder()

    def descriptor(self) -> SinkSpec:
        match self.delivery:
            case "exactly_once":
                return SinkSpec(
                    SinkSystem.KAFKA,
                    self.topic,
                    SinkDelivery.EXACTLY_ONCE,
                    transaction_timeout_ms=self.transaction_timeout_ms,
                    epoch_memory_bytes=self.epoch_memory_bytes,
                )
            case "at_least_once":
                return SinkSpec(SinkSystem.KAFKA, self.topic, SinkDelivery.AT_LEAST_ONCE)
            case _:
                assert_never(self.delivery)

    def operator(self) -> OperatorFactory:
        return WithOnError(self._create)

    def _create(self, on_error: OnRecordError) -> KafkaSinkOperator | TransactionalKafkaSinkOperator:
        # The operator runs in the TaskManager: imported there, so a client builds the job without the server install.
        from weir.operators.sinks import KafkaSinkOperator
        from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator

        match self.delivery:
            case "exactly_once":
                assert self.transaction_timeout_ms is not None and self.epoch_memory_bytes is not None
                return TransactionalKafkaSinkOperator(
                    self.topic,
                    self.serializer,
                    self.key,
                    transaction_timeout_ms=self.transaction_timeout_ms,
                    marker_replication_factor=self.marker_replication_factor,
                    epoch_memory_bytes=self.epoch_memory_bytes,
                    spill_directory=self.spill_directory,
                    on_error=on_error,
                    properties=self.properties,
                )
            case "at_least_once":
                return KafkaSinkOperator(
                    self.topic, self.serializer, self.key, on_error=on_error, properties=self.properties
                )
            case _:
                assert_never(self.delivery)

    def default_name(self) -> str:
        return f"kafka-sink:{self.topic}"


@dataclass(frozen=True)
class _Settings:
    topic: str | None = None
    serializer: Callable[[Any], bytes | None] | None = None
    key: Callable[[Any], bytes | str | None] | None = None
    delivery: KafkaDelivery = "exactly_once"
    transaction_timeout_ms: int | None = None
    marker_replication_factor: int | None = None
    epoch_memory_bytes: int | None = None
    spill_directory: Path | None = None
    properties: Properties = ()


class KafkaSinkBuilder:
    """Sets a Kafka sink's options one by one; :meth:`build` makes the :class:`KafkaSink`."""

    __slots__ = ("_settings",)

    def __init__(self, settings: _Settings | None = None) -> None:
        self._settings = settings or _Settings()

    def _with(self, **options: Any) -> KafkaSinkBuilder:
        return KafkaSinkBuilder(replace(self._settings, **options))

    def topic(self, topic: str) -> KafkaSinkBuilder:
        """The topic written (required)."""
        return self._with(topic=OPTIONS.text("topic", topic))

    def serializer(self, serializer: Callable[[Any], bytes | None] | None) -> KafkaSinkBuilder:
        """A value to the record's value bytes (default: JSON, ``json_serializer``); None for a value
        with a key (``key``) is a tombstone, a record with a null value (a delete of its key in a
        compacted topic, as upsert-kafka writes it)."""
        return self._with(serializer=OPTIONS.function("serializer", serializer))

    def key(self, key: Callable[[Any], bytes | str | None] | None) -> KafkaSinkBuilder:
        """A value to the record's key (None, the default: records without a key)."""
        return self._with(key=OPTIONS.function("key", key))

    def delivery(self, delivery: KafkaDelivery) -> KafkaSinkBuilder:
        """``exactly_once`` (default): one transaction per checkpoint, visible to read_committed
        consumers once it completes; ``at_least_once``: flushed at every checkpoint, duplicates
        after a failure."""
        if delivery not in ("exactly_once", "at_least_once"):
            raise OPTIONS.refuse("delivery", "'exactly_once' or 'at_least_once'", delivery)
        return self._with(delivery=delivery)

    def transaction_timeout_ms(self, timeout: Duration | None) -> KafkaSinkBuilder:
        """``exactly_once``: the transactions' ``transaction.timeout.ms`` (default 15 min, at most the
        broker's ``transaction.max.timeout.ms``): it must cover a checkpoint interval plus a restart."""
        return self._with(transaction_timeout_ms=OPTIONS.optional_positive_millis("transaction_timeout_ms", timeout))

    def marker_replication_factor(self, factor: int | None) -> KafkaSinkBuilder:
        """``exactly_once``: the replication factor of the sink's commit marker topic when the sink
        creates it (None, the default: min(3, brokers))."""
        if factor is not None and (type(factor) is not int or factor < 1):
            raise OPTIONS.error(
                f"marker_replication_factor must be at least 1, got {factor!r}; leave it unset for min(3, brokers)"
            )
        return self._with(marker_replication_factor=factor)

    def epoch_memory_bytes(self, limit: int | None) -> KafkaSinkBuilder:
        """``exactly_once``: the not yet committed records a sink subtask holds in memory, all its
        epochs together (None: 64 MiB; 0: every record on disk); past it an epoch goes to a file."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise OPTIONS.error(
                f"epoch_memory_bytes must be an int of at least 0 (0: every record on disk), got {limit!r}; "
                f"leave it unset for {DEFAULT_EPOCH_MEMORY_BYTES} bytes (64 MiB)"
            )
        return self._with(epoch_memory_bytes=limit)

    def spill_directory(self, directory: str | Path | None) -> KafkaSinkBuilder:
        """``exactly_once``: where epochs past ``epoch_memory_bytes`` go, an absolute path on each
        TaskManager (None: ``epoch-spill/`` in the run directory)."""
        return self._with(spill_directory=_spill_directory(directory))

    def properties(self, properties: Mapping[str, str]) -> KafkaSinkBuilder:
        """Client settings of this sink's producer (and, exactly-once, of its commit-marker topic's
        clients), over the job's ``-D kafka.*`` ones: security (a secret as ``${env:NAME}`` or
        ``${file:/path}``), ``client.id``, batching. Those Weir sets itself are refused with what to do
        instead."""
        if not isinstance(properties, Mapping):
            raise OPTIONS.refuse("properties", "a mapping of client setting to string value", properties)
        try:
            return self._with(properties=validate_producer_properties(properties))
        except JobDefinitionError as exc:  # names the property and says what to do instead
            raise OPTIONS.error(str(exc)) from None

    def build(self) -> KafkaSink:
        """The sink, once the options are checked together."""
        s = self._settings
        topic = required(OPTIONS, "topic", s.topic, "give the topic to write (.topic(name))")
        serializer = s.serializer or json_serializer
        match s.delivery:
            case "exactly_once":
                return KafkaSink(
                    topic,
                    serializer,
                    s.key,
                    s.delivery,
                    DEFAULT_TRANSACTION_TIMEOUT_MS if s.transaction_timeout_ms is None else s.transaction_timeout_ms,
                    s.marker_replication_factor,
                    DEFAULT_EPOCH_MEMORY_BYTES if s.epoch_memory_bytes is None else s.epoch_memory_bytes,
                    s.spill_directory,
                    s.properties,
                )
            case "at_least_once":
                for option, given in (
                    ("transaction_timeout_ms", s.transaction_timeout_ms),
                    ("marker_replication_factor", s.marker_replication_factor),
                    ("epoch_memory_bytes", s.epoch_memory_bytes),
                    ("spill_directory", s.spill_directory),
                ):
                    if given is not None:
                        raise OPTIONS.error(f"{option} applies to delivery='exactly_once' only")
                return KafkaSink(topic, serializer, s.key, s.delivery, None, None, None, None, s.properties)
            case _:
                assert_never(s.delivery)


def _spill_directory(given: object) -> Path | None:
    """Absolute, since every TaskManager loads the job file in its own working directory."""
    if given is None:
        return None
    if not isinstance(given, str | Path) or not str(given):
        raise OPTIONS.refuse("spill_directory", "a path", given)
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise OPTIONS.error(
            f"spill_directory {str(given)!r} must be an absolute path: each TaskManager would resolve a "
            "relative one against its own working directory"
        )
    return path


__all__ = ["KafkaDelivery", "KafkaSink", "KafkaSinkBuilder"]
