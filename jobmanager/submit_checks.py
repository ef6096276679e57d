"""What the JobManager checks when a job is submitted, before any task starts.

Each refusal is one line that says what to change; the job is not started (``weir run`` exits 2):
- an exactly-once sink that could never commit: an unbounded job with checkpointing off (its
  transactions would buffer forever), or checkpointing.mode=at_least_once (its snapshots may hold
  records after the barrier, so its commits would repeat output after a restore) unless the sink
  says ``delivery="at_least_once"`` (Kafka) or ``delivery="upsert"`` (PostgreSQL);
- a Kafka source whose topic does not exist;
- whatever a source or sink checks about its external system (``validate_at_submit``: the sink's
  topic, the PostgreSQL table with its columns and key constraint).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from connectors import kafka
from jobmanager.checkpointing.config import CheckpointSettings
from taskmanager.operators.transactional_sinks import TransactionalKafkaSinkOperator, TwoPhasePostgresSinkOperator
from weir.api import GeneratorSourceSpec, KafkaSourceSpec
from weir.checkpointing import CheckpointingMode
from weir.config import Endpoints
from weir.errors import JobDefinitionError
from weir.graph import LogicalGraph, OperatorKind, Transformation


def _operators(graph: LogicalGraph) -> Iterator[tuple[Transformation, Any]]:
    """Every transformation with one operator instance built by its factory (factories connect to
    nothing; ``validate_at_submit`` does)."""
    for transformation in graph.transformations.values():
        yield transformation, transformation.factory()


def is_bounded(graph: LogicalGraph) -> bool:
    """Every source of the job ends: a bounded Kafka source, a generator with a count."""
    for transformation in graph.transformations.values():
        spec = transformation.source_spec
        if transformation.kind is not OperatorKind.SOURCE:
            continue
        if isinstance(spec, KafkaSourceSpec) and not spec.bounded:
            return False
        if isinstance(spec, GeneratorSourceSpec) and spec.count is None:
            return False
    return True


def check_job_at_submit(graph: LogicalGraph, settings: CheckpointSettings, endpoints: Endpoints) -> None:
    operators = list(_operators(graph))
    exactly_once = [
        t for t, op in operators if isinstance(op, TransactionalKafkaSinkOperator | TwoPhasePostgresSinkOperator)
    ]
    if exactly_once and not settings.enabled and not is_bounded(graph):
        names = ", ".join(repr(t.uid) for t in exactly_once)
        raise JobDefinitionError(
            f"exactly-once sink(s) {names} commit only when a checkpoint completes, and this unbounded job runs "
            "with checkpointing off: they would never commit; set -D checkpointing.interval=10s (for example)"
        )
    if exactly_once and settings.mode is CheckpointingMode.AT_LEAST_ONCE:
        names = ", ".join(repr(t.uid) for t in exactly_once)
        raise JobDefinitionError(
            f"exactly-once sink(s) {names} cannot run with checkpointing.mode=at_least_once (unaligned barriers "
            "let records after a barrier into its snapshot, so a restore repeats their output): use "
            "checkpointing.mode=exactly_once, or say delivery='at_least_once' (Kafka) / delivery='upsert' (PostgreSQL)"
        )
    for transformation in graph.transformations.values():
        spec = transformation.source_spec
        if isinstance(spec, KafkaSourceSpec) and kafka.topic_partition_count(endpoints, spec.topic) is None:
            raise JobDefinitionError(
                f"kafka source {transformation.uid!r}: topic {spec.topic!r} does not exist at "
                f"{endpoints.kafka_bootstrap}; create it before the job runs"
            )
    for transformation, operator in operators:
        try:
            operator.validate_at_submit(endpoints)
        except JobDefinitionError as exc:
            raise JobDefinitionError(f"{transformation.kind.value} {transformation.uid!r}: {exc}") from exc
