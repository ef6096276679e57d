"""What a job declares about its sources and sinks, as plain values, and the submit-time rules over
them that need no external system.

The job API records one descriptor per source and sink transformation; the operators layer builds
the runtime operator from it, the JobManager reads it to check a job before any task starts (the
checks that need Kafka or PostgreSQL are the operators' ``validate_at_submit``), and the reference
runner reads the same input. Nothing here imports an operator, a connector or a process role.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from weir.core.columnar import Schema
from weir.core.errors import JobDefinitionError

DEFAULT_TRANSACTION_TIMEOUT_MS: Final = 900_000
"""15 minutes: the broker's default ``transaction.max.timeout.ms`` (librdkafka's own default is 60 s)."""


def end_offsets_parameter(source_uid: str) -> str:
    """The parameter under which the JobManager fixes a bounded Kafka source's end offsets at submit."""
    return f"weir.internal.end_offsets.{source_uid}"


# Sources -------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class GeneratorSourceSpec:
    generate: Callable[[int], Any]
    count: int | None  # None: unbounded
    timestamp: Callable[[Any], int] | None
    max_out_of_orderness_ms: int
    records_per_second: float | None


SourceSpec = KafkaSourceSpec | GeneratorSourceSpec


def is_bounded(spec: SourceSpec) -> bool:
    match spec:
        case KafkaSourceSpec():
            return spec.bounded
        case GeneratorSourceSpec():
            return spec.count is not None


# Sinks ---------------------------------------------------------------------------------------------


class SinkSystem(enum.Enum):
    KAFKA = "kafka"
    POSTGRES = "postgres"
    FUNCTION = "function"  # sink(fn), print, file: the job's own side effects
    FILE = "file"
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
