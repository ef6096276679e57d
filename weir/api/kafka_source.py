"""The Kafka source and its builder (Flink's ``KafkaSource.builder()``).

::

    source = (
        KafkaSource.builder()
        .topic("orders")
        .starting_offsets(Timestamp(1_764_000_000_000))
        .timestamp(lambda order: order["ts"])
        .max_out_of_orderness_ms(5_000)
        .dead_letter_topic("orders-dlq")
        .build()
    )
    orders = env.from_source(source, uid="orders-source")

Each setter checks its option when it is given; ``build()`` checks how they go together and makes
the :class:`~weir.core.descriptors.KafkaSourceSpec` the JobManager reads. The builder is immutable:
every setter returns a new one, so a partly set builder can be the base of several sources.
``env.from_kafka(topic, uid=..., **options)`` is this builder with the same option names.
See docs/kafka-source.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from weir.api.connector import Duration, Options, Source, checked, required
from weir.core.columnar import Schema
from weir.core.descriptors import (
    EARLIEST,
    Committed,
    KafkaRecord,
    KafkaSourceSpec,
    OffsetReset,
    StartingOffsets,
    Timestamp,
    validate_consumer_properties,
)
from weir.core.errors import JobDefinitionError
from weir.core.json_codec import decode as json_deserializer

if TYPE_CHECKING:
    from weir.operators.sources import KafkaSourceOperator

OPTIONS = Options("kafka source")


@dataclass(frozen=True)
class KafkaSource(Source):
    """A replayable Kafka source (Flink's ``KafkaSource``): the topic's partitions spread over the
    subtasks, read read_committed, their positions kept in checkpoints. Made by :meth:`builder`."""

    spec: KafkaSourceSpec

    @staticmethod
    def builder() -> KafkaSourceBuilder:
        return KafkaSourceBuilder()

    def descriptor(self) -> KafkaSourceSpec:
        return self.spec

    def create_operator(self) -> KafkaSourceOperator:
        # The operator runs in the TaskManager: imported there, so a client builds the job without the server install.
        from weir.operators.sources import KafkaSourceOperator

        return KafkaSourceOperator(self.spec)

    def default_name(self) -> str:
        return f"kafka:{self.spec.topic}"

    def columnar_schema(self) -> Schema | None:
        return self.spec.schema

    def projected(self, fields: tuple[str, ...] | None) -> KafkaSource:
        return KafkaSource(replace(self.spec, projection=fields))


@dataclass(frozen=True)
class _Settings:
    """What the builder was given, each option checked on its own."""

    topic: str | None = None
    bounded: bool = False
    deserializer: Callable[[bytes], Any] | None = None
    record_deserializer: Callable[[KafkaRecord], Any] | None = None
    timestamp: Callable[[Any], int] | None = None
    max_out_of_orderness_ms: int = 0
    idle_timeout_ms: int | None = None
    dead_letter_topic: str | None = None
    max_record_bytes: int | None = None
    records_per_second: float | None = None
    schema: Schema | None = None
    timestamp_field: str | None = None
    starting_offsets: StartingOffsets = EARLIEST
    properties: tuple[tuple[str, str], ...] = ()
    partition_discovery_interval_ms: int | None = None
    commit_offsets_on_checkpoint: bool = True
    group_id: str | None = None


class KafkaSourceBuilder:
    """Sets a Kafka source's options one by one; :meth:`build` makes the :class:`KafkaSource`."""

    __slots__ = ("_settings",)

    def __init__(self, settings: _Settings | None = None) -> None:
        self._settings = settings or _Settings()

    def _with(self, **options: Any) -> KafkaSourceBuilder:
        return KafkaSourceBuilder(replace(self._settings, **options))

    def topic(self, topic: str) -> KafkaSourceBuilder:
        """The topic to read (required)."""
        return self._with(topic=OPTIONS.text("topic", topic))

    def bounded(self, bounded: bool = True) -> KafkaSourceBuilder:
        """Read up to the end offsets fixed when the job is submitted, then end (default: unbounded)."""
        return self._with(bounded=OPTIONS.flag("bounded", bounded))

    def deserializer(self, deserializer: Callable[[bytes], Any] | None) -> KafkaSourceBuilder:
        """The value bytes to a record (default: JSON, ``json_deserializer``)."""
        return self._with(deserializer=OPTIONS.function("deserializer", deserializer))

    def record_deserializer(self, record_deserializer: Callable[[KafkaRecord], Any] | None) -> KafkaSourceBuilder:
        """The whole :class:`KafkaRecord` (key, headers, position, timestamp) to a record, instead of
        :meth:`deserializer`."""
        return self._with(record_deserializer=OPTIONS.function("record_deserializer", record_deserializer))

    def timestamp(self, timestamp: Callable[[Any], int] | None) -> KafkaSourceBuilder:
        """The record's event time in epoch ms (None: records carry no event time)."""
        return self._with(timestamp=OPTIONS.function("timestamp", timestamp))

    def max_out_of_orderness_ms(self, bound: Duration) -> KafkaSourceBuilder:
        """How far behind the latest event time the watermark stays (Flink's
        ``forBoundedOutOfOrderness``; default 0)."""
        return self._with(max_out_of_orderness_ms=OPTIONS.millis("max_out_of_orderness_ms", bound, positive=False))

    def idle_timeout_ms(self, timeout: Duration | None) -> KafkaSourceBuilder:
        """A partition without records for that long (wall time) stops holding the watermark back
        (Flink's ``withIdleness``); None (default): never idle."""
        return self._with(idle_timeout_ms=OPTIONS.optional_positive_millis("idle_timeout_ms", timeout))

    def dead_letter_topic(self, topic: str | None) -> KafkaSourceBuilder:
        """Where a record the deserializer or the timestamp function rejects goes, with the reason
        (None: such a record fails the job)."""
        return self._with(dead_letter_topic=OPTIONS.optional_text("dead_letter_topic", topic))

    def max_record_bytes(self, limit: int | None) -> KafkaSourceBuilder:
        """A record whose value is longer is dead-lettered (its first 512 KiB); None: no limit."""
        return self._with(max_record_bytes=OPTIONS.optional_positive_int("max_record_bytes", limit))

    def records_per_second(self, rate: float | None) -> KafkaSourceBuilder:
        """Pace the source (all subtasks together) in wall time; None (default): as fast as it goes."""
        return self._with(records_per_second=OPTIONS.optional_rate("records_per_second", rate))

    def schema(self, schema: Schema | Mapping[str, type] | None) -> KafkaSourceBuilder:
        """Make the source columnar: each poll's JSON records decoded into one Arrow record batch of
        these fields (name -> str, int, float or bool); needs :meth:`timestamp_field`."""
        if schema is None or isinstance(schema, Schema):
            return self._with(schema=schema)
        if not isinstance(schema, Mapping):
            raise OPTIONS.refuse("schema", "a Schema or a mapping of field name to str, int, float or bool", schema)
        return self._with(schema=checked(OPTIONS, "schema", lambda: Schema.of(schema)))

    def timestamp_field(self, field: str | None) -> KafkaSourceBuilder:
        """A columnar source's event time: an int field of its schema (epoch ms)."""
        return self._with(timestamp_field=OPTIONS.optional_text("timestamp_field", field))

    def starting_offsets(self, starting_offsets: StartingOffsets) -> KafkaSourceBuilder:
        """Where a partition without a restored position starts: EARLIEST (default), LATEST,
        ``Timestamp(ms)``, COMMITTED or ``Committed(OffsetReset.LATEST)``; fixed once at submit."""
        return self._with(starting_offsets=_starting_offsets(starting_offsets))

    def properties(self, properties: Mapping[str, str]) -> KafkaSourceBuilder:
        """Client settings of this source's consumer and dead-letter producer, over the job's
        ``-D kafka.*`` ones: security (a secret as ``${env:NAME}`` or ``${file:/path}``, a literal
        one is refused), ``client.id``, fetch sizes. Those Weir sets itself are refused with what to
        do instead (docs/kafka-security.md)."""
        if not isinstance(properties, Mapping):
            raise OPTIONS.refuse("properties", "a mapping of consumer setting to string value", properties)
        try:
            return self._with(properties=validate_consumer_properties(properties))
        except JobDefinitionError as exc:  # names the property and says what to do instead
            raise OPTIONS.error(str(exc)) from None

    def partition_discovery_interval_ms(self, interval: Duration | None) -> KafkaSourceBuilder:
        """An unbounded source looks this often for partitions added while the job runs (None, the
        default: the partitions present when a subtask opens)."""
        checked_interval = OPTIONS.optional_positive_millis("partition_discovery_interval_ms", interval)
        return self._with(partition_discovery_interval_ms=checked_interval)

    def commit_offsets_on_checkpoint(self, commit: bool) -> KafkaSourceBuilder:
        """Commit a completed checkpoint's positions to the consumer group (default True; for lag
        monitoring and a later COMMITTED start, never read back for recovery)."""
        return self._with(commit_offsets_on_checkpoint=OPTIONS.flag("commit_offsets_on_checkpoint", commit))

    def group_id(self, group_id: str | None) -> KafkaSourceBuilder:
        """The consumer group committed to (None, the default: ``weir-<job name>-<uid>``)."""
        return self._with(group_id=OPTIONS.optional_text("group_id", group_id))

    def build(self) -> KafkaSource:
        """The source, once the options are checked together."""
        s = self._settings
        topic = required(OPTIONS, "topic", s.topic, "give the topic to read (.topic(name))")
        if s.partition_discovery_interval_ms is not None and s.bounded:
            raise OPTIONS.error(
                "a bounded source reads the partitions present at submit; leave partition_discovery_interval_ms out"
            )
        if s.record_deserializer is not None and s.deserializer is not None:
            raise OPTIONS.error("give deserializer (value bytes) or record_deserializer (the whole record), not both")
        if s.schema is not None:
            if s.deserializer is not None or s.timestamp is not None or s.record_deserializer is not None:
                raise OPTIONS.error(
                    "a columnar source (schema=) decodes JSON by its schema and takes its event time from "
                    "timestamp_field; leave deserializer, record_deserializer and timestamp out"
                )
            if s.timestamp_field is None:
                raise OPTIONS.error("a columnar source needs timestamp_field")
            schema, field = s.schema, s.timestamp_field
            checked(OPTIONS, "timestamp_field", lambda: schema.check_timestamp_field(field))  # an int field
        elif s.timestamp_field is not None:
            raise OPTIONS.error("timestamp_field needs a schema (the columnar source)")
        return KafkaSource(
            KafkaSourceSpec(
                topic=topic,
                bounded=s.bounded,
                deserializer=s.deserializer or json_deserializer,
                timestamp=s.timestamp,
                max_out_of_orderness_ms=s.max_out_of_orderness_ms,
                dead_letter_topic=s.dead_letter_topic,
                records_per_second=s.records_per_second,
                idle_timeout_ms=s.idle_timeout_ms,
                schema=s.schema,
                timestamp_field=s.timestamp_field,
                starting_offsets=s.starting_offsets,
                properties=s.properties,
                record_deserializer=s.record_deserializer,
                partition_discovery_interval_ms=s.partition_discovery_interval_ms,
                commit_offsets_on_checkpoint=s.commit_offsets_on_checkpoint,
                group_id=s.group_id,
                max_record_bytes=s.max_record_bytes,
            )
        )


def _starting_offsets(given: object) -> StartingOffsets:
    match given:
        case OffsetReset():
            return given
        case Timestamp(ms=ms):
            if type(ms) is not int or ms < 0:
                raise OPTIONS.error(
                    f"starting_offsets Timestamp(ms) takes epoch milliseconds (an int >= 0), got {ms!r}"
                )
            return given
        case Committed(reset=reset):
            if not isinstance(reset, OffsetReset):
                raise OPTIONS.error(
                    f"starting_offsets Committed(reset) takes OffsetReset.EARLIEST or LATEST, got {reset!r}"
                )
            return given
        case _:
            raise OPTIONS.refuse("starting_offsets", "EARLIEST, LATEST, Timestamp(ms) or Committed(...)", given)


__all__ = ["KafkaSource", "KafkaSourceBuilder"]
