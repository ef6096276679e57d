"""What a job file's ``build(env)`` receives (Flink's ``StreamExecutionEnvironment``): the job's
parameters, its sources and its handling of rejected records.

A source is built by its connector and added by :meth:`Environment.from_source`;
``from_kafka``, ``from_postgres_cdc``, ``from_generator`` and ``from_collection`` are that call with
the connector's options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from weir.api.columnar import ColumnarStream, FieldsRead
from weir.api.connector import Duration, Source, WithoutOnError, told_as
from weir.api.generator_source import GeneratorSource
from weir.api.kafka_source import KafkaSource
from weir.api.postgres_cdc_source import PostgresCdcSource
from weir.api.streams import DataStream
from weir.api.wiring import GraphBuilder
from weir.core.columnar import Schema
from weir.core.descriptors import EARLIEST, KafkaRecord, StartingOffsets
from weir.core.errors import JobDefinitionError
from weir.core.rejections import OnRecordError
from weir.graph import LogicalGraph, OperatorKind

DEFAULT_MAX_PARALLELISM = 128


class Parameters(Mapping[str, str]):
    """The job's ``-D key=value`` parameters with typed getters."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def get_str(self, key: str, default: str) -> str:
        return self._values.get(key, default)

    def get_int(self, key: str, default: int) -> int:
        raw = self._values.get(key)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise JobDefinitionError(f"parameter {key}={raw!r} is not an integer") from None

    def get_bool(self, key: str, default: bool) -> bool:
        raw = self._values.get(key)
        if raw is None:
            return default
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise JobDefinitionError(f"parameter {key}={raw!r} is not a boolean (true/false)")


class Environment:
    """What a job file's ``build(env)`` receives: parameters and the sources."""

    def __init__(
        self,
        job_name: str,
        parameters: Mapping[str, str] | None = None,
        parallelism: int = 1,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> None:
        self.params = Parameters(parameters)
        self.graph = LogicalGraph(job_name=job_name, default_parallelism=parallelism, max_parallelism=max_parallelism)
        self._builder = GraphBuilder(self.graph)

    def set_max_parallelism(self, max_parallelism: int) -> None:
        self.graph.max_parallelism = max_parallelism

    def on_record_error(self, handling: OnRecordError) -> None:
        """What every operator does with a record its user function raises on, unless the operator
        is given its own ``on_error`` (Kafka Streams' ``processing.exception.handler``):

        - ``FailOnError()`` (the default): the task fails with the record named (operator, function,
          exception, record, key, timestamp, and its topic/partition/offset when the operator is
          chained to its Kafka source); the restart strategy restarts the job from its last
          checkpoint, so the record is tried again; once the restarts are spent the job is FAILED;
        - ``DeadLetterOnError(topic)``: the record goes to Kafka topic ``topic`` as a JSON envelope
          (the Kafka source's for malformed records, with the reason, operator, function and
          position), counted in ``weir_rejected_records_total``, and the job goes on without it."""
        self._builder.on_record_error(handling)

    def record_error_handling(self, given: OnRecordError | None) -> OnRecordError:
        """An operator's handling of rejected records: its own, else the job's (:meth:`on_record_error`)."""
        return self._builder.record_error_handling(given)

    def from_source(
        self, source: Source, *, uid: str, name: str | None = None, parallelism: int | None = None
    ) -> DataStream:
        """Read ``source``, built by its connector (Flink's ``fromSource``):
        ``KafkaSource.builder()...build()``, ``PostgresCdcSource.builder()...build()`` or
        ``GeneratorSource(...)``. A columnar source's stream is a :class:`~weir.api.columnar.ColumnarStream`.
        Without ``parallelism`` a source runs at its default one (the CDC source: 1), else at the job's."""
        if not isinstance(source, Source):
            raise JobDefinitionError(
                f"operator {uid!r}: from_source takes a source built by its connector (KafkaSource.builder()..."
                f"build(), GeneratorSource(fn, ...)), not {source!r}"
            )
        if parallelism is None:
            parallelism = source.default_parallelism()
        schema = source.columnar_schema()
        t = self._builder.add_operator(
            WithoutOnError(source.create_operator),
            kind=OperatorKind.SOURCE,
            uid=uid,
            name=name or source.default_name(),
            parallelism=parallelism,
            source_spec=source.descriptor(),
            columnar=schema is not None,
        )
        if schema is None:
            return DataStream(self._builder, t)
        return ColumnarStream(self._builder, t, schema, FieldsRead(source, t))

    def from_kafka(
        self,
        topic: str,
        *,
        uid: str,
        bounded: bool = False,
        deserializer: Callable[[bytes], Any] | None = None,
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: Duration = 0,
        dead_letter_topic: str | None = None,
        records_per_second: float | None = None,
        idle_timeout_ms: Duration | None = None,
        parallelism: int | None = None,
        name: str | None = None,
        schema: Schema | Mapping[str, type] | None = None,
        timestamp_field: str | None = None,
        starting_offsets: StartingOffsets = EARLIEST,
        properties: Mapping[str, str] | None = None,
        record_deserializer: Callable[[KafkaRecord], Any] | None = None,
        partition_discovery_interval_ms: Duration | None = None,
        commit_offsets_on_checkpoint: bool = True,
        group_id: str | None = None,
        max_record_bytes: int | None = None,
    ) -> DataStream:
        """A replayable Kafka source: ``from_source(KafkaSource.builder().topic(topic)...build())``
        with these options (``weir.api.kafka_source``, docs/kafka-source.md). Partitions spread over
        subtasks, offsets kept in checkpoints.

        ``starting_offsets`` (EARLIEST, LATEST, ``Timestamp(ms)``, COMMITTED or
        ``Committed(OffsetReset.LATEST)``) for partitions without a restored position, fixed once at
        submit; ``properties`` the source's own Kafka client settings over the job's ``-D kafka.*``
        ones (security, client.id, fetch settings; not those Weir sets itself); ``record_deserializer``
        taking the whole :class:`KafkaRecord` instead of ``deserializer``'s value bytes;
        ``partition_discovery_interval_ms`` (unbounded only) to read partitions added while the job
        runs; ``commit_offsets_on_checkpoint`` to commit a completed checkpoint's positions to the
        consumer group ``group_id`` (default ``weir-<job name>-<uid>``), never read back for recovery.

        With ``schema`` (field name -> str, int, float or bool) and ``timestamp_field`` (an int field,
        epoch ms), the source is columnar: each poll's JSON records are decoded in one call into an
        Arrow record batch (``weir.core.columnar``), and the stream is a :class:`ColumnarStream`.

        A record the deserializer or the timestamp function rejects goes to ``dead_letter_topic``
        with the reason (or fails the job when no dead-letter topic is given); so does, with
        ``max_record_bytes``, a record whose value is longer than that (its dead letter carries the
        value's first 512 KiB, ``value_truncated`` true).

        ``idle_timeout_ms`` (Flink's ``withIdleness``): a partition without records for that long
        (wall time) no longer holds the watermark back, until its next record; a subtask whose
        partitions are all idle (or that has none) is idle downstream. None (default): never idle."""
        with told_as(f"kafka source {uid!r}"):
            source = (
                KafkaSource.builder()
                .topic(topic)
                .bounded(bounded)
                .deserializer(deserializer)
                .record_deserializer(record_deserializer)
                .timestamp(timestamp)
                .max_out_of_orderness_ms(max_out_of_orderness_ms)
                .idle_timeout_ms(idle_timeout_ms)
                .dead_letter_topic(dead_letter_topic)
                .max_record_bytes(max_record_bytes)
                .records_per_second(records_per_second)
                .schema(schema)
                .timestamp_field(timestamp_field)
                .starting_offsets(starting_offsets)
                .properties(properties or {})
                .partition_discovery_interval_ms(partition_discovery_interval_ms)
                .commit_offsets_on_checkpoint(commit_offsets_on_checkpoint)
                .group_id(group_id)
                .build()
            )
        return self.from_source(source, uid=uid, name=name, parallelism=parallelism)

    def from_postgres_cdc(
        self,
        tables: Sequence[str],
        *,
        uid: str,
        slot_name: str,
        publication: str | None = None,
        max_changes_per_poll: int = 1000,
        chunk_size: int = 8096,
        slot_retention: str = "unless-savepoint",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> DataStream:
        """The changes of PostgreSQL tables: a consistent snapshot (``read`` events), then their
        inserts, updates and deletes decoded from the logical replication slot ``slot_name``, as
        :class:`~weir.core.cdc.ChangeEvent` values (``from_source(PostgresCdcSource.builder()...build())``,
        ``weir.api.postgres_cdc_source``, docs/postgres-cdc-source.md). The snapshot is read in chunks
        of ``chunk_size`` rows by primary key, checkpointed between chunks; at ``parallelism`` > 1
        (default 1) each subtask reads a partition of the rows by the hash of their key, and subtask
        0 alone streams the changes after; the slot is advanced only when a checkpoint completes, so
        a restore decodes again from the checkpoint; ``slot_retention`` says what the job's end does
        with the slot."""
        with told_as(f"postgres cdc source {uid!r}"):
            builder = (
                PostgresCdcSource.builder()
                .tables(tables)
                .slot_name(slot_name)
                .publication(publication)
                .max_changes_per_poll(max_changes_per_poll)
                .chunk_size(chunk_size)
                .slot_retention(slot_retention)
            )
            source = builder.build()
        return self.from_source(source, uid=uid, name=name, parallelism=parallelism)

    def from_generator(
        self,
        generate: Callable[[int], Any],
        *,
        uid: str,
        count: int | None = None,
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: Duration = 0,
        records_per_second: float | None = None,
        parallelism: int | None = None,
        name: str | None = None,
    ) -> DataStream:
        """A deterministic, replayable source: record i is ``generate(i)`` for i in 0..count-1
        (unbounded when ``count`` is None); subtask s produces the indices s, s+p, s+2p, ...
        (``from_source(GeneratorSource(generate, ...))``, ``weir.api.generator_source``)."""
        with told_as(f"generator source {uid!r}"):
            source = GeneratorSource(
                generate,
                count=count,
                timestamp=timestamp,
                max_out_of_orderness_ms=max_out_of_orderness_ms,
                records_per_second=records_per_second,
            )
        return self.from_source(source, uid=uid, name=name, parallelism=parallelism)

    def from_collection(
        self,
        items: Iterable[Any],
        *,
        uid: str,
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: Duration = 0,
        records_per_second: float | None = None,
        parallelism: int | None = None,
        name: str | None = None,
    ) -> DataStream:
        """The items in their order: a generator over a list (``GeneratorSource.of_collection``)."""
        with told_as(f"generator source {uid!r}"):
            source = GeneratorSource.of_collection(
                items,
                timestamp=timestamp,
                max_out_of_orderness_ms=max_out_of_orderness_ms,
                records_per_second=records_per_second,
            )
        return self.from_source(source, uid=uid, name=name, parallelism=parallelism)


__all__ = ["DEFAULT_MAX_PARALLELISM", "Environment", "Parameters"]
