"""Sinks: Kafka, PostgreSQL (idempotent upsert), print and file.

Here a sink flushes what it buffered whenever a checkpoint snapshot is taken and at the end of the
input, so every value reaches the external system at least once; the PostgreSQL upsert makes replays
harmless (same key, same row). The transactional, exactly-once variants build on the same hooks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from weir.connectors import kafka  # postgres (psycopg): in the methods that talk to the server
from weir.core import json_codec
from weir.core.changelog import Delete, KeyedChanges
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError
from weir.core.kafka_config import Properties, kafka_client_config
from weir.core.rejections import FAIL, OnRecordError
from weir.operators.base import NO_PARAMETERS, StreamOperator
from weir.operators.transactional_sinks import (
    encode_for_kafka,
    row_for_postgres,
    row_key_indexes,
    validate_postgres_sink,
)

json_serializer: Final = json_codec.encode
"""The default: compact JSON with sorted keys, UTF-8 (the codec itself: no call between)."""


class KafkaSinkOperator(StreamOperator):
    def __init__(
        self,
        topic: str,
        serializer: Callable[[Any], bytes | None],
        key: Callable[[Any], bytes | str | None] | None,
        on_error: OnRecordError = FAIL,
        properties: Properties = (),
    ) -> None:
        """``properties``: the sink's own Kafka settings, over the job's (``weir.core.kafka_config``)."""
        self._topic = topic
        self._serializer = serializer
        self._key = key
        self.on_error = on_error
        self.properties = properties
        self._errors: list[str] = []

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """At submit: the output topic exists (JobDefinitionError naming it; ServiceUnavailableError
        when Kafka does not answer). Creates nothing."""
        kafka.require_topic(kafka_client_config(endpoints, parameters, self.properties), self._topic)

    def open(self) -> None:
        cluster = kafka_client_config(Endpoints.from_env(), self.ctx.parameters, self.properties)
        self._producer = kafka.producer(cluster, enable_idempotence=True, linger_ms=20, acks="all")
        kafka.partition_count(cluster, self._topic)  # a missing topic fails at open

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))

    def process(self, value: Any, timestamp: int | None) -> None:
        encoded = encode_for_kafka(self, self._serializer, self._key, value, timestamp)
        if encoded is None:
            return
        key, data = encoded
        while True:
            try:
                self._producer.produce(
                    self._topic,
                    value=data,
                    key=key,
                    timestamp=timestamp or 0,
                    on_delivery=self._on_delivery,
                )
                break
            except BufferError:
                self._producer.poll(0.1)  # the local queue is full: wait for deliveries (backpressure)
        self._producer.poll(0)

    def _flush(self) -> None:
        remaining = self._producer.flush(60)
        if remaining or self._errors:
            raise ServiceUnavailableError(
                f"kafka sink {self.ctx.uid!r} -> {self._topic}: {remaining} undelivered, errors: {self._errors[:3]}"
            )

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._flush()
        return None

    def end_input(self) -> None:
        self._flush()

    def close(self) -> None:
        producer = getattr(self, "_producer", None)
        if producer is not None:
            producer.flush(10)


class PostgresUpsertSinkOperator(StreamOperator):
    """Idempotent sink: rows are upserted by their key columns, and keys deleted (the ``row`` function
    returns ``Delete(key)``), in batches of ``batch_size`` keys, each collapsed per key like a
    two-phase epoch (``KeyedChanges``: deletes written first, then upserts, in one transaction).

    A replay after a failure rewrites rows already written. With ``version_column`` an upsert only
    replaces a stored row whose version is not higher (``ON CONFLICT ... DO UPDATE ... WHERE
    stored.version <= EXCLUDED.version``), so a replay of older rows cannot undo newer ones."""

    def __init__(
        self,
        table: str,
        columns: Sequence[str],
        key_columns: Sequence[str],
        to_row: Callable[[Any], tuple[Any, ...] | Delete],
        batch_size: int = 2000,
        *,
        version_column: str | None = None,
        on_error: OnRecordError = FAIL,
    ) -> None:
        self._table = table
        self._columns = tuple(columns)
        self._key_columns = tuple(key_columns)
        self._to_row = to_row
        self.on_error = on_error
        self._batch_size = batch_size
        self._version_column = version_column
        self._key_index, self._version_index = row_key_indexes(table, columns, key_columns, version_column)
        self._changes = KeyedChanges(self._key_index, self._version_index)

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """At submit, before any task runs: PostgreSQL answers and the table has the columns and a
        unique key on exactly the key columns (ON CONFLICT needs it). Creates nothing."""
        validate_postgres_sink(endpoints, self._table, self._columns, self._key_columns, two_phase=False)

    def open(self) -> None:
        from weir.connectors import postgres

        self._conn = postgres.connect(Endpoints.from_env())
        postgres.require_table(self._conn, self._table, self._columns, self._key_columns)
        self._conn.rollback()
        self._statement = postgres.upsert_statement(self._table, self._columns, self._key_columns, self._version_column)
        self._delete = postgres.delete_statement(self._table, self._key_columns)

    def process(self, value: Any, timestamp: int | None) -> None:
        change = row_for_postgres(self, self._to_row, len(self._columns), len(self._key_columns), value, timestamp)
        if change is None:
            return
        self._changes.add(change)
        if len(self._changes) >= self._batch_size:
            self._flush()

    def _flush(self) -> None:
        from weir.connectors import postgres

        changes = self._changes
        if not len(changes):
            return
        postgres.delete_keys(self._conn, self._delete, changes.deletes())
        postgres.upsert_rows(self._conn, self._statement, changes.upserts())
        self._conn.commit()
        self._changes = KeyedChanges(self._key_index, self._version_index)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._flush()
        return None

    def end_input(self) -> None:
        self._flush()

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()


class FunctionSinkOperator(StreamOperator):
    """Calls a user function per value; what the function writes is its own (at-least-once) business."""

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        self._fn(value)


class PrintSinkOperator(StreamOperator):
    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    def process(self, value: Any, timestamp: int | None) -> None:
        print(f"{self._prefix}{value}", file=sys.stdout, flush=False)

    def end_input(self) -> None:
        sys.stdout.flush()


class FileSinkOperator(StreamOperator):
    def __init__(self, path: str, serializer: Callable[[Any], bytes]) -> None:
        self._path = path
        self._serializer = serializer

    def open(self) -> None:
        target = Path(f"{self._path}.{self.ctx.subtask}")
        target.parent.mkdir(parents=True, exist_ok=True)
        self._file = target.open("ab")

    def process(self, value: Any, timestamp: int | None) -> None:
        self._file.write(self._serializer(value) + b"\n")

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._file.flush()
        return None

    def end_input(self) -> None:
        self._file.flush()

    def close(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
