"""What a stream is written to (Flink's ``DataStream.sinkTo``): :meth:`StreamSinks.sink_to` takes a
sink its connector built, and ``sink_to_kafka``, ``sink_to_postgres``, ``sink_to_files``, ``sink``,
``print`` and ``sink_to_file`` are that call with the connector's options under the same names. Each
option is checked, and documented, by its connector (``weir.api.kafka_sink``, ``postgres_sink``,
``file_sink``, ``local_sinks``);
a refused one is told of the sink's uid."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from weir.api.connector import Duration, Sink, told_as
from weir.api.file_sink import FileFormatName, PartFileSink
from weir.api.kafka_sink import KafkaDelivery, KafkaSink
from weir.api.local_sinks import FileSink, FunctionSink, PrintSink
from weir.api.postgres_sink import PostgresDelivery, PostgresSink
from weir.core.changelog import Delete
from weir.core.errors import JobDefinitionError
from weir.core.rejections import OnRecordError


class StreamSinks(abc.ABC):
    """The sink methods of a stream (:class:`weir.api.streams.DataStream`), which adds the sink
    operator by its one path (``_add_sink``)."""

    @abc.abstractmethod
    def _add_sink(
        self, sink: Sink, *, uid: str, name: str | None, parallelism: int | None, on_error: OnRecordError | None
    ) -> None: ...

    def sink_to(
        self,
        sink: Sink,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> None:
        """Write the stream to ``sink``, built by its connector: ``KafkaSink.builder()...build()``,
        ``PostgresSink.builder()...build()``, ``FileSink(path)``, ``PrintSink()``, ``FunctionSink(fn)``.
        ``on_error`` as for ``map``, for a sink that calls user functions on records (Kafka's
        ``serializer`` and ``key``, PostgreSQL's ``row``); Kafka's and PostgreSQL's own errors are
        never the record's: they fail the task as they are."""
        if not isinstance(sink, Sink):
            raise JobDefinitionError(
                f"operator {uid!r}: sink_to takes a sink built by its connector (KafkaSink.builder()...build(), "
                f"PostgresSink.builder()...build(), FileSink(path), PrintSink(), FunctionSink(fn)), not {sink!r}"
            )
        self._add_sink(sink, uid=uid, name=name, parallelism=parallelism, on_error=on_error)

    def sink_to_kafka(
        self,
        topic: str,
        *,
        uid: str,
        serializer: Callable[[Any], bytes | None] | None = None,
        key: Callable[[Any], bytes | str | None] | None = None,
        parallelism: int | None = None,
        delivery: KafkaDelivery = "exactly_once",
        transaction_timeout_ms: Duration | None = None,
        marker_replication_factor: int | None = None,
        epoch_memory_bytes: int | None = None,
        spill_directory: str | Path | None = None,
        on_error: OnRecordError | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        """Write each value to ``topic``: ``sink_to(KafkaSink.builder().topic(topic)...build())``, each
        option as the :class:`~weir.api.kafka_sink.KafkaSinkBuilder` method of its name (docs/sinks.md).
        ``exactly_once`` (the default): one Kafka transaction per checkpoint, committed when the
        checkpoint completes, so read_committed consumers see each value once, after the checkpoint;
        ``transaction_timeout_ms`` (default 15 min) must cover a checkpoint interval plus a restart;
        ``epoch_memory_bytes`` (default 64 MiB) bounds the records a sink subtask holds until they
        commit, the rest going to files under ``spill_directory``. ``at_least_once``: flushed at every
        checkpoint, duplicates after a failure. ``on_error``: a record ``serializer`` or ``key`` raises on.
        A ``serializer`` answering None for a value whose ``key`` is not None writes a tombstone (a null
        value: the key's delete in a compacted topic); without a key None is that record's error.
        ``properties``: the sink's own Kafka client settings, over the job's ``-D kafka.*`` ones."""
        with told_as(f"kafka sink {uid!r}"):
            sink = (
                KafkaSink.builder()
                .topic(topic)
                .serializer(serializer)
                .key(key)
                .delivery(delivery)
                .transaction_timeout_ms(transaction_timeout_ms)
                .marker_replication_factor(marker_replication_factor)
                .epoch_memory_bytes(epoch_memory_bytes)
                .spill_directory(spill_directory)
                .properties(properties or {})
                .build()
            )
        self.sink_to(sink, uid=uid, parallelism=parallelism, on_error=on_error)

    def sink_to_postgres(
        self,
        table: str,
        *,
        uid: str,
        columns: tuple[str, ...],
        key_columns: tuple[str, ...],
        row: Callable[[Any], tuple[Any, ...] | Delete] | None = None,
        parallelism: int | None = None,
        delivery: PostgresDelivery = "two_phase",
        version_column: str | None = None,
        on_error: OnRecordError | None = None,
    ) -> None:
        """Upsert each value into ``table`` by its key columns: ``sink_to(PostgresSink.builder()...build())``,
        each option as the :class:`~weir.api.postgres_sink.PostgresSinkBuilder` method of its name
        (docs/sinks.md). ``two_phase`` (the default): one prepared transaction per checkpoint,
        committed when the checkpoint completes (exactly once; rows of one key must always reach the
        same sink subtask: key the stream by the table's key, or use parallelism 1). ``upsert``:
        batches committed as they fill (idempotent, at least once). ``row`` may return ``Delete(key)``
        to delete the row of a key instead. With ``version_column`` a row never overwrites a stored
        row of a higher version. ``on_error``: a record ``row`` raises on, or turns into another number
        of values than ``columns`` (a ``Delete``: than ``key_columns``)."""
        with told_as(f"postgres sink {uid!r}"):
            sink = (
                PostgresSink.builder()
                .table(table)
                .columns(columns)
                .key_columns(key_columns)
                .row(row)
                .delivery(delivery)
                .version_column(version_column)
                .build()
            )
        self.sink_to(sink, uid=uid, parallelism=parallelism, on_error=on_error)

    def sink_to_files(
        self,
        path: str,
        *,
        uid: str,
        format: FileFormatName = "parquet",  # noqa: A002 - Flink's and the issue's name for it
        bucket_assigner: Callable[[Any, int | None], str] | None = None,
        max_part_bytes: int | None = None,
        rollover_interval: Duration | None = None,
        serializer: Callable[[Any], bytes] | None = None,
        schema: Any = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> None:
        """Write each value into part files under ``path`` (``s3://bucket/prefix`` or a directory),
        exactly once (Flink's ``FileSink``): ``sink_to(PartFileSink(path, ...))``. A part file per
        subtask and bucket (``bucket_assigner(value, timestamp)``, default the record's hour,
        ``dt=YYYY-MM-DD/hour=HH``), rolled at ``max_part_bytes`` (default 128 MiB), after
        ``rollover_interval`` (default 15 min) and at every checkpoint; it becomes visible (the S3
        upload completed, the hidden file renamed) once that checkpoint completes. ``parquet``: dicts,
        ``schema`` a ``pyarrow.Schema`` or inferred from the first rows; ``jsonl``: ``serializer``
        (default JSON); ``csv``: ``serializer`` (each record's CSV line, required). ``on_error``: a
        record the assigner or serializer raises on (docs/sinks.md)."""
        with told_as(f"file sink {uid!r}"):
            options: dict[str, Any] = {}
            if max_part_bytes is not None:
                options["max_part_bytes"] = max_part_bytes
            if rollover_interval is not None:
                options["rollover_interval"] = rollover_interval
            sink = PartFileSink(
                path, format, bucket_assigner=bucket_assigner, serializer=serializer, schema=schema, **options
            )
        self.sink_to(sink, uid=uid, parallelism=parallelism, on_error=on_error)

    def sink(self, fn: Callable[[Any], None], *, uid: str, parallelism: int | None = None) -> None:
        """Call ``fn(value)`` for every value (Flink's SinkFunction): at-least-once, no transaction."""
        with told_as(f"sink {uid!r}"):
            sink = FunctionSink(fn)
        self.sink_to(sink, uid=uid, parallelism=parallelism)

    def print(self, *, uid: str, prefix: str = "") -> None:
        """Print each value to the TaskManager's stdout after ``prefix``."""
        with told_as(f"print sink {uid!r}"):
            sink = PrintSink(prefix)
        self.sink_to(sink, uid=uid)

    def sink_to_file(self, path: str, *, uid: str, serializer: Callable[[Any], bytes] | None = None) -> None:
        """Append one line per value to ``path``.<subtask> (a debugging sink, at-least-once)."""
        with told_as(f"file sink {uid!r}"):
            sink = FileSink(path, serializer)
        self.sink_to(sink, uid=uid)


__all__ = ["StreamSinks"]
