"""What the JobManager checks when a job is submitted, before any task starts.

Each refusal is one line that says what to change; the job is not started (``weir run`` exits 2):
- an exactly-once sink that could never commit: an unbounded job with checkpointing off (its
  transactions would buffer forever), or checkpointing.mode=at_least_once (its snapshots may hold
  records after the barrier, so its commits would repeat output after a restore) unless the sink
  says ``delivery="at_least_once"`` (Kafka) or ``delivery="upsert"`` (PostgreSQL);
- a Kafka transaction timeout that cannot cover a checkpoint interval plus a restart;
- Kafka settings (``-D kafka.*``, a connector's ``properties=``) that set what Weir sets itself or
  hold a literal secret (``weir.core.kafka_config``), or that the cluster refuses: every check
  below reaches Kafka as the job's tasks will, so a wrong password or certificate is refused here,
  with the broker's error named;
- a Kafka source whose topic does not exist;
- an operator's dead-letter topic (``DeadLetterOnError(topic)``: its own ``on_error`` or the
  job's ``on_record_error``) that does not exist;
- whatever a source or sink checks about its external system (``validate_at_submit``: the sink's
  topic, the PostgreSQL table with its columns and key constraint).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from weir.connectors import kafka
from weir.core.checkpointing import CheckpointingMode
from weir.core.config import Endpoints
from weir.core.descriptors import KafkaSourceSpec, SinkSystem, is_bounded, validate_transaction_timeout
from weir.core.errors import JobDefinitionError
from weir.core.kafka_config import kafka_client_config
from weir.core.rejections import DeadLetterOnError
from weir.graph import LogicalGraph, OperatorKind
from weir.jobmanager.checkpointing.config import CheckpointSettings


def job_is_bounded(graph: LogicalGraph) -> bool:
    """Every source of the job ends: a bounded Kafka source, a generator with a count."""
    return all(
        t.source_spec is not None and is_bounded(t.source_spec)
        for t in graph.transformations.values()
        if t.kind is OperatorKind.SOURCE
    )


def check_job_rules(graph: LogicalGraph, settings: CheckpointSettings, restart_allowance_s: float) -> None:
    """The checks that need no external system (pure: unit-tested without a broker)."""
    sinks = [t for t in graph.transformations.values() if t.sink_spec is not None]
    exactly_once = [t for t in sinks if t.sink_spec is not None and t.sink_spec.transactional]
    names = ", ".join(repr(t.uid) for t in exactly_once)
    if exactly_once and not settings.enabled and not job_is_bounded(graph):
        raise JobDefinitionError(
            f"exactly-once sink(s) {names} commit only when a checkpoint completes, and this unbounded job runs "
            "with checkpointing off: they would never commit; set -D checkpointing.interval=10s (for example)"
        )
    if exactly_once and settings.mode is CheckpointingMode.AT_LEAST_ONCE:
        raise JobDefinitionError(
            f"exactly-once sink(s) {names} cannot run with checkpointing.mode=at_least_once (unaligned barriers "
            "let records after a barrier into its snapshot, so a restore repeats their output): use "
            "checkpointing.mode=exactly_once, or say delivery='at_least_once' (Kafka) / delivery='upsert' (PostgreSQL)"
        )
    for t in exactly_once:
        spec = t.sink_spec
        if spec is None or spec.system is not SinkSystem.KAFKA or spec.transaction_timeout_ms is None:
            continue
        try:
            validate_transaction_timeout(
                spec.transaction_timeout_ms, settings.trigger.interval_s or 0.0, restart_allowance_s
            )
        except JobDefinitionError as exc:
            raise JobDefinitionError(f"kafka sink {t.uid!r}: {exc}") from exc


def dead_letter_topics(graph: LogicalGraph) -> dict[str, tuple[str, ...]]:
    """Each Kafka topic the job's operators send records their functions raise on to, with the uids
    of those operators (``DeadLetterOnError``, their own or the job's), in graph order. (A Kafka
    source's ``dead_letter_topic`` for malformed records is not among them.)"""
    topics: dict[str, list[str]] = {}
    for t in graph.transformations.values():
        handling = t.on_error() if t.on_error is not None else None
        if isinstance(handling, DeadLetterOnError):
            topics.setdefault(handling.topic, []).append(t.uid)
    return {topic: tuple(uids) for topic, uids in topics.items()}


def check_job_at_submit(
    graph: LogicalGraph,
    settings: CheckpointSettings,
    restart_allowance_s: float,
    endpoints: Endpoints,
    parameters: Mapping[str, str] = MappingProxyType({}),
) -> None:
    """The rules, then what the external systems must provide, asked with the job's Kafka settings
    (its ``parameters``, each connector's own ``properties`` over them)."""
    check_job_rules(graph, settings, restart_allowance_s)
    cluster = kafka_client_config(endpoints, parameters)
    for transformation in graph.transformations.values():
        spec = transformation.source_spec
        if not isinstance(spec, KafkaSourceSpec):
            continue
        try:
            found = kafka.topic_partition_count(cluster.merged(spec.properties), spec.topic)
        except JobDefinitionError as exc:  # the cluster refuses the source's settings
            raise JobDefinitionError(f"kafka source {transformation.uid!r}: {exc}") from None
        if found is None:
            raise JobDefinitionError(
                f"kafka source {transformation.uid!r}: topic {spec.topic!r} does not exist at "
                f"{cluster.bootstrap_servers}; create it before the job runs"
            )
    for topic, uids in dead_letter_topics(graph).items():
        if kafka.topic_partition_count(cluster, topic) is None:
            raise JobDefinitionError(
                f"dead-letter topic {topic!r} of {', '.join(map(repr, uids))} does not exist at "
                f"{cluster.bootstrap_servers}: a rejected record could not be kept; create it before the job runs"
            )
    for transformation in graph.transformations.values():
        if transformation.kind not in (OperatorKind.SOURCE, OperatorKind.SINK):
            continue
        try:
            # builds the operator only; connects nothing
            transformation.factory().validate_at_submit(endpoints, parameters)
        except JobDefinitionError as exc:
            raise JobDefinitionError(f"{transformation.kind.value} {transformation.uid!r}: {exc}") from exc
