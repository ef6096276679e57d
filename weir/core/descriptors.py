"""What a job declares about its sources and sinks, as plain values, and the submit-time rules over
them that need no external system.

The job API records one descriptor per source and sink transformation; the operators layer builds
the runtime operator from it, the JobManager reads it to check a job before any task starts (the
checks that need Kafka or PostgreSQL are the operators' ``validate_at_submit``), and the reference
runner reads the same input. Nothing here imports an operator, a connector or a process role.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from weir.core.cdc import SlotRetention
from weir.core.columnar import Schema
from weir.core.errors import JobDefinitionError
from weir.core.kafka_config import Properties, check_properties

DEFAULT_TRANSACTION_TIMEOUT_MS: Final = 900_000
"""15 minutes: the broker's default ``transaction.max.timeout.ms`` (librdkafka's own default is 60 s)."""


def end_offsets_parameter(source_uid: str) -> str:
    """The parameter under which the JobManager fixes a bounded Kafka source's end offsets at submit."""
    return f"weir.internal.end_offsets.{source_uid}"


def start_offsets_parameter(source_uid: str) -> str:
    """The parameter under which the JobManager fixes a Kafka source's start offsets at submit."""
    return f"weir.internal.start_offsets.{source_uid}"


# Sources -------------------------------------------------------------------------------------------


class OffsetReset(enum.Enum):
    """Where a partition starts when nothing else says: its first record, or after its last one."""

    EARLIEST = "earliest"
    LATEST = "latest"


@dataclass(frozen=True)
class Timestamp:
    """Start each partition at its first record with a timestamp at or after ``ms`` (epoch ms); a
    partition with none starts at its end."""

    ms: int


@dataclass(frozen=True)
class Committed:
    """Start each partition at the consumer group's committed offset, or by ``reset`` without one."""

    reset: OffsetReset = OffsetReset.EARLIEST


StartingOffsets = OffsetReset | Timestamp | Committed
"""Where a Kafka source starts the partitions it has no restored position for."""

EARLIEST: Final = OffsetReset.EARLIEST
LATEST: Final = OffsetReset.LATEST
COMMITTED: Final = Committed()


class TimestampType(enum.Enum):
    """What a Kafka record's timestamp means (the broker's timestamp type)."""

    NOT_AVAILABLE = 0
    CREATE_TIME = 1
    LOG_APPEND_TIME = 2


@dataclass(frozen=True)
class KafkaRecord:
    """One Kafka record as a ``record_deserializer`` sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # epoch ms
    timestamp_type: TimestampType
    headers: tuple[tuple[str, bytes | None], ...]


def validate_consumer_properties(properties: Mapping[str, str]) -> Properties:
    """A Kafka source's consumer properties as sorted pairs; JobDefinitionError for a non-string one,
    one that would override a setting Weir relies on, or a literal secret (``weir.core.kafka_config``)."""
    return check_properties(properties, "kafka consumer property ", connector=True)


def validate_producer_properties(properties: Mapping[str, str]) -> Properties:
    """A Kafka sink's client properties (its producer's and its commit-marker clients') as sorted
    pairs, checked as a source's are."""
    return check_properties(properties, "kafka producer property ", connector=True)


def default_group_id(job_name: str, source_uid: str) -> str:
    """The consumer group a Kafka source commits its positions to unless it names one: stable over
    resubmissions of the job."""
    return f"weir-{job_name}-{source_uid}"


@dataclass(frozen=True)
class KafkaSourceSpec:
    topic: str
    bounded: bool
    deserializer: Callable[[bytes], Any]
    timestamp: Callable[[Any], int] | None
    max_out_of_orderness_ms: int
    dead_letter_topic: str | None
    records_per_second: float | None = None  # throttle (tests and demos); None: as fast as possible
    idle_timeout_ms: int | None = None  # a partition without records this long stops holding the watermark
    schema: Schema | None = None  # columnar: each poll decoded into one record batch of these fields
    timestamp_field: str | None = None  # columnar: the int field that is the event time
    projection: tuple[str, ...] | None = None  # columnar: the schema fields the job reads; None: all
    starting_offsets: StartingOffsets = OffsetReset.EARLIEST  # partitions without a restored position
    properties: Properties = ()  # over the job's Kafka settings for this source's clients (validated)
    record_deserializer: Callable[[KafkaRecord], Any] | None = None  # instead of deserializer: the whole record
    partition_discovery_interval_ms: int | None = None  # unbounded: look for new partitions this often
    commit_offsets_on_checkpoint: bool = True  # commit a completed checkpoint's positions to the group
    group_id: str | None = None  # None: default_group_id(job name, uid)
    max_record_bytes: int | None = None  # a record value longer than this is dead-lettered; None: no limit

    def group_id_for(self, job_name: str, source_uid: str) -> str:
        return self.group_id if self.group_id is not None else default_group_id(job_name, source_uid)


@dataclass(frozen=True)
class GeneratorSourceSpec:
    generate: Callable[[int], Any]
    count: int | None  # None: unbounded
    timestamp: Callable[[Any], int] | None
    max_out_of_orderness_ms: int
    records_per_second: float | None


@dataclass(frozen=True)
class PostgresCdcSourceSpec:
    tables: tuple[str, ...]  # as the server resolves them (search_path): "orders", "shop.orders"
    slot_name: str  # the logical replication slot the source owns
    publication: str  # the publication decoded (created with the slot when missing)
    max_changes_per_poll: int = 1000  # whole transactions are read, at least this many changes when committed
    chunk_size: int = 8096  # snapshot rows read per chunk (by primary key), checkpointed between chunks
    slot_retention: SlotRetention = SlotRetention.UNLESS_SAVEPOINT  # the slot at the job's end


SourceSpec = KafkaSourceSpec | GeneratorSourceSpec | PostgresCdcSourceSpec


def is_bounded(spec: SourceSpec) -> bool:
    match spec:
        case KafkaSourceSpec():
            return spec.bounded
        case GeneratorSourceSpec():
            return spec.count is not None
        case PostgresCdcSourceSpec():
            return False


# Sinks ---------------------------------------------------------------------------------------------


class SinkSystem(enum.Enum):
    KAFKA = "kafka"
    POSTGRES = "postgres"
    FUNCTION = "function"  # sink(fn), print, file: the job's own side effects
    FILE = "file"  # the debugging sink: lines appended to a file per subtask
    FILES = "files"  # the exactly-once file sink: part files on S3 or in a directory
    PRINT = "print"


class SinkDelivery(enum.Enum):
    """What a sink promises about its external effects after a restore."""

    EXACTLY_ONCE = "exactly_once"  # transactional: commits only for completed checkpoints
    AT_LEAST_ONCE = "at_least_once"  # flushed at checkpoints, duplicates after a restore (or idempotent upserts)


@dataclass(frozen=True)
class SinkSpec:
    system: SinkSystem
    target: str  # the topic, table, file or "" for a function
    delivery: SinkDelivery
    transaction_timeout_ms: int | None = None  # Kafka, exactly-once
    epoch_memory_bytes: int | None = None  # Kafka, exactly-once: pending records held in memory per subtask

    @property
    def transactional(self) -> bool:
        return self.delivery is SinkDelivery.EXACTLY_ONCE


# Submit-time rules ---------------------------------------------------------------------------------


def validate_transaction_timeout(
    transaction_timeout_ms: int,
    checkpoint_interval_s: float,
    restart_allowance_s: float,
    *,
    broker_max_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
) -> None:
    """Reject a Kafka ``transaction.timeout.ms`` that cannot cover one checkpoint interval plus the
    time a restart may take, or that the broker would refuse (``transaction.max.timeout.ms``)."""
    if transaction_timeout_ms <= 0:
        raise JobDefinitionError(f"transaction.timeout.ms must be positive, got {transaction_timeout_ms}")
    if transaction_timeout_ms > broker_max_timeout_ms:
        raise JobDefinitionError(
            f"transaction.timeout.ms = {transaction_timeout_ms} exceeds the broker's transaction.max.timeout.ms "
            f"({broker_max_timeout_ms}): the producer would be refused; lower transaction_timeout_ms or raise the "
            "broker setting"
        )
    needed_ms = (checkpoint_interval_s + restart_allowance_s) * 1000.0
    if transaction_timeout_ms < needed_ms:
        raise JobDefinitionError(
            f"transaction.timeout.ms = {transaction_timeout_ms} cannot cover a checkpoint interval of "
            f"{checkpoint_interval_s:g}s plus a restart allowance of {restart_allowance_s:g}s ({needed_ms:.0f} ms): "
            "the broker would abort transactions before their checkpoint completes; raise transaction_timeout_ms "
            f"(at most the broker's transaction.max.timeout.ms, default {DEFAULT_TRANSACTION_TIMEOUT_MS}) "
            "or checkpoint more often"
        )
