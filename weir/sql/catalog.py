"""The catalog a script's ``CREATE TABLE`` statements build: each table's columns with their types,
computed columns, watermark, primary key and connector (its Flink options checked and typed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sqlglot import exp

from weir.sql.errors import Position, SqlError
from weir.sql.types import Kind, SqlType


@dataclass(frozen=True)
class Column:
    name: str
    type: SqlType


@dataclass(frozen=True)
class ComputedColumn:
    """``name AS expr``: computed from the physical columns when a row is read."""

    name: str
    expression: exp.Expr = field(compare=False)
    text: str


@dataclass(frozen=True)
class Watermark:
    """``WATERMARK FOR column AS column - INTERVAL 'n' unit``: event time from ``column``, the
    watermark ``delay_ms`` behind the latest."""

    column: str
    delay_ms: int


@dataclass(frozen=True)
class DebeziumJson:
    """A 'kafka' table's ``'format' = 'debezium-json'`` (Flink's): each record a Debezium change
    envelope, read as a changelog and written from one (``weir.sql.debezium``). ``schema_include``:
    the envelope is the ``payload`` of ``{"schema": ..., "payload": ...}`` (Kafka Connect's
    ``value.converter.schemas.enable``; read only, as Flink's); ``ignore_parse_errors``: a message
    that does not decode is skipped, a field of the wrong type NULL, as Flink's."""

    schema_include: bool = False
    ignore_parse_errors: bool = False


@dataclass(frozen=True)
class KafkaTable:
    """``'connector' = 'kafka'`` (append, or a Debezium changelog: ``debezium``) or ``'upsert-kafka'``
    (keyed by the primary key)."""

    topic: str
    upsert: bool
    bounded: bool  # 'scan.bounded.mode' = 'latest-offset'
    startup_mode: str  # earliest-offset | latest-offset | group-offsets
    group_id: str | None
    delivery: str  # exactly-once | at-least-once
    records_per_second: float | None = None  # 'scan.records-per-second' (Weir's): the source's subtasks together
    dead_letter_topic: str | None = None  # 'scan.dead-letter-topic' (Weir's): where a row that does not decode goes
    key_fields: tuple[str, ...] = ()  # 'key.fields' (kafka; upsert-kafka's key is its PRIMARY KEY): see KafkaLayout
    key_fields_prefix: str = ""  # 'key.fields-prefix'
    value_fields_include: str = "ALL"  # 'value.fields-include': ALL | EXCEPT_KEY
    debezium: DebeziumJson | None = None  # 'format' = 'debezium-json': a changelog read and written


@dataclass(frozen=True)
class KafkaLayout:
    """Which of a Kafka table's physical columns its record key and its value hold, as Flink's Kafka
    connectors lay them out: the key (``'key.fields'``, or upsert-kafka's PRIMARY KEY) a JSON object of
    those columns, each named without ``'key.fields-prefix'``; the value a JSON object of every physical
    column (``'value.fields-include' = 'ALL'``) or of those not in the key (``'EXCEPT_KEY'``)."""

    key: tuple[tuple[str, str], ...]  # (column, its field name in the key's JSON object), in key order
    value: tuple[str, ...]  # the columns in the value's JSON object, in the table's order

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(column for column, _ in self.key)

    def key_object(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The record key's JSON object of a row's JSON values (by column)."""
        return {name: values[column] for column, name in self.key}

    def value_object(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The record value's JSON object of a row's JSON values (by column)."""
        return {column: values[column] for column in self.value}

    def fields(self, key: Mapping[str, Any] | None, value: Mapping[str, Any] | None) -> dict[str, Any]:
        """A record's JSON fields by column, as Flink's Kafka source projects them: the key's columns
        from the key object, then the value's from the value object (a column in both, under 'ALL', is
        the value's; a field missing from its object is NULL)."""
        out: dict[str, Any] = {}
        if key is not None:
            for column, name in self.key:
                out[column] = key.get(name)
        if value is not None:
            for column in self.value:
                out[column] = value.get(column)
        return out


def kafka_layout(table: Table) -> KafkaLayout:
    """The key and value layout of a 'kafka' or 'upsert-kafka' table (checked by ``check_table``)."""
    connector = table.connector
    assert isinstance(connector, KafkaTable), table.name
    keys = table.primary_key if connector.upsert else connector.key_fields
    prefix = connector.key_fields_prefix
    physical = tuple(c.name for c in table.columns)
    value = physical if connector.value_fields_include == "ALL" else tuple(c for c in physical if c not in keys)
    return KafkaLayout(tuple((k, k.removeprefix(prefix)) for k in keys), value)


@dataclass(frozen=True)
class JdbcTable:
    """``'connector' = 'jdbc'``: a PostgreSQL table written by upsert on the primary key."""

    table_name: str
    url: str


@dataclass(frozen=True)
class DatagenTable:
    """``'connector' = 'datagen'``: rows from the row number, deterministic (``fields.NAME.kind``
    ``sequence`` with ``start``/``end``, or ``random`` with ``min``/``max``/``length`` and a seed)."""

    rows: int | None
    rows_per_second: float | None
    fields: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


@dataclass(frozen=True)
class NexmarkTable:
    """``'connector' = 'nexmark'``: Weir's Nexmark generator (``weir.nexmark``), one row per event."""

    events: int | None
    events_per_second: int
    seed: int


@dataclass(frozen=True)
class PrintTable:
    """``'connector' = 'print'``: each row printed (``print-identifier`` as its prefix)."""

    prefix: str


@dataclass(frozen=True)
class PostgresCdcTable:
    """``'connector' = 'postgres-cdc'`` (Flink CDC's): the snapshot and then every change of one
    PostgreSQL table, as a changelog (``weir.sql.cdc``), from the job's PostgreSQL."""

    schema_name: str
    table_name: str
    slot_name: str
    chunk_size: int
    upsert: bool = False  # 'changelog-mode' = 'upsert': new rows and deleted keys, normalized (weir.sql.upsert)
    parallelism: int = 1  # 'scan.parallelism' (Flink's FLIP-367): subtasks reading the snapshot in parallel


@dataclass(frozen=True)
class FilesystemTable:
    """``'connector' = 'filesystem'`` with ``'format' = 'csv'``: a local file (``path``, absolute or
    ``file://``) read whole as a lookup join's side input (``JOIN t FOR SYSTEM_TIME AS OF
    p.proc_time``): each subtask reads it at its first lookup and keeps its rows by the join key; or,
    written, a directory (local, or ``s3://bucket/prefix``) of part files (the job API's exactly-once
    file sink), a folder
    ``col=value/...`` per value of the table's PARTITIONED BY columns, a part file rolled after
    ``rollover_ms`` (``sink.rolling-policy.rollover-interval``) and at every checkpoint."""

    path: str
    rollover_ms: int | None = None
    partition_commit: PartitionCommitOptions | None = None  # 'sink.partition-commit.policy.kind' = 'success-file'


@dataclass(frozen=True)
class PartitionCommitOptions:
    """A 'filesystem' sink's ``sink.partition-commit.*`` (Flink's names): ``_SUCCESS`` (``success_file``)
    written into a partition once ``trigger`` says it is complete, ``delay_ms`` after its time
    (``partition-time``: read from its values by ``timestamp_pattern``) or its first write
    (``process-time``)."""

    trigger: str  # process-time | partition-time
    delay_ms: int
    success_file: str
    timestamp_pattern: str | None


Connector = KafkaTable | JdbcTable | DatagenTable | NexmarkTable | PrintTable | PostgresCdcTable | FilesystemTable


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    computed: tuple[ComputedColumn, ...]
    watermark: Watermark | None
    primary_key: tuple[str, ...]
    connector: Connector
    options: tuple[tuple[str, str], ...]
    partition_by: tuple[str, ...] = ()  # PARTITIONED BY (...): a 'filesystem' sink's partition folders

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns) + tuple(c.name for c in self.computed)

    def physical(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


SOURCE_CONNECTORS: Final = ("kafka", "datagen", "nexmark", "postgres-cdc")
SINK_CONNECTORS: Final = ("kafka", "upsert-kafka", "jdbc", "print")

SUCCESS_FILE_NAME: Final = "_SUCCESS"
"""Flink's ``sink.partition-commit.success-file.name`` by default."""

_IGNORED: Final = ("properties.bootstrap.servers", "sink.transactional-id-prefix", "value.format")
"""Options Weir accepts and does not need: the cluster's Kafka (``-D kafka.*``, weir.conf) is the one
it reads and writes; transactional ids are Weir's own (per sink uid); JSON is the one format."""


_DURATION_UNITS: Final = {
    "": 1, "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip


def flink_duration_ms(value: str) -> int | None:
    """Flink's duration text (``'1 h'``, ``'30 min'``, ``'1min'``, ``'90s'``, ``'3600000'``:
    milliseconds) in ms; None for anything else."""
    text = value.strip().lower()
    digits = len(text) - len(text.lstrip("0123456789"))
    unit = text[digits:].strip()
    if digits == 0 or unit not in _DURATION_UNITS:
        return None
    return int(text[:digits]) * _DURATION_UNITS[unit]


class _Options:
    def __init__(
        self, table: str, options: Mapping[str, str], positions: Mapping[str, Position], position: Position
    ) -> None:
        self.table, self.options, self.positions, self.position = table, dict(options), positions, position
        self.used = set(_IGNORED)

    def refuse(self, what: str, key: str | None = None) -> SqlError:
        return SqlError(f"table {self.table}: {what}", self.positions.get(key or "", self.position))

    def get(self, key: str, default: str | None = None) -> str | None:
        self.used.add(key)
        return self.options.get(key, default)

    def need(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise self.refuse(
                f"option '{key}' is required for 'connector' = '{self.options['connector']}'", "connector"
            )
        return value

    def one_of(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.get(key, default)
        assert value is not None
        if value not in allowed:
            raise self.refuse(f"option '{key}' = '{value}' is not supported (one of: {', '.join(allowed)})", key)
        return value

    def integer(self, key: str, default: int | None) -> int | None:
        value = self.get(key)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise self.refuse(f"option '{key}' = '{value}' is not an integer", key) from None

    def boolean(self, key: str) -> bool:
        return self.one_of(key, "false", ("false", "true")) == "true"

    def check_all_used(self) -> None:
        for key in self.options:
            if key in self.used or key.startswith("properties.") or key.startswith("fields."):
                continue
            raise self.refuse(f"option '{key}' is not supported", key)


def _partition_commit(opts: _Options) -> PartitionCommitOptions | None:
    """A 'filesystem' sink's partition commit options: the ``success-file`` policy only (Flink's
    ``metastore`` needs a Hive catalog, ``custom`` a Java class), UTC partition times, Flink's default
    time extractor."""
    trigger = opts.one_of("sink.partition-commit.trigger", "process-time", ("process-time", "partition-time"))
    delay_text = opts.get("sink.partition-commit.delay", "0 s")
    assert delay_text is not None
    delay_ms = flink_duration_ms(delay_text)
    if delay_ms is None:
        key = "sink.partition-commit.delay"
        raise opts.refuse(f"option '{key}' = '{delay_text}' is not a duration (like '1 min', '0 s')", key)
    opts.one_of("sink.partition-commit.watermark-time-zone", "UTC", ("UTC",))
    opts.one_of("partition.time-extractor.kind", "default", ("default",))
    opts.one_of("partition.time-extractor.timestamp-formatter", "yyyy-MM-dd HH:mm:ss", ("yyyy-MM-dd HH:mm:ss",))
    pattern = opts.get("partition.time-extractor.timestamp-pattern")
    success_file = opts.get("sink.partition-commit.success-file.name", SUCCESS_FILE_NAME) or SUCCESS_FILE_NAME
    if "/" in success_file or success_file.startswith("."):
        key = "sink.partition-commit.success-file.name"
        raise opts.refuse(f"option '{key}' = '{success_file}' is not a visible file name", key)
    kinds = opts.get("sink.partition-commit.policy.kind")
    if kinds is None:
        return None  # as Flink's: a trigger without a policy commits nothing
    for kind in (k.strip() for k in kinds.split(",")):
        if kind != "success-file":
            key = "sink.partition-commit.policy.kind"
            raise opts.refuse(
                f"option '{key}': policy '{kind}' is not supported (Weir writes the 'success-file' policy's file; "
                "'metastore' needs a Hive catalog, 'custom' a Java class)",
                key,
            )
    return PartitionCommitOptions(trigger, delay_ms, success_file, pattern)


def _key_fields(opts: _Options) -> tuple[str, ...]:
    """A 'kafka' table's ``'key.fields'`` (columns separated by ``;``), with ``'key.format'``: both or
    neither, refused as Flink's KafkaConnectorOptionsUtil words it."""
    key_format = opts.get("key.format")
    text = opts.get("key.fields")
    if key_format is None and text is not None:
        raise opts.refuse(
            "The option 'key.fields' can only be declared if a key format is defined using 'key.format'.", "key.fields"
        )
    fields = tuple(f.strip() for f in (text or "").split(";") if f.strip())
    if key_format is not None and not fields:
        raise opts.refuse(
            "A key format 'key.format' requires the declaration of one or more of key fields using 'key.fields'.",
            "key.format",
        )
    if key_format is not None:
        opts.one_of("key.format", "json", ("json",))
    return fields


def _debezium_json(opts: _Options, prefix: str) -> DebeziumJson:
    """Flink's ``debezium-json`` options (``prefix``: ``debezium-json.``, or ``value.debezium-json.``
    under ``'value.format'``): those that change nothing Weir reads or writes are accepted (a MAP's
    null keys: Weir has no MAP type), those that would and Weir does not do refused with their name."""
    schema_include = opts.boolean(prefix + "schema-include")
    ignore_parse_errors = opts.boolean(prefix + "ignore-parse-errors")
    opts.one_of(prefix + "timestamp-format.standard", "SQL", ("SQL",))
    opts.one_of(prefix + "map-null-key.mode", "FAIL", ("FAIL", "DROP", "LITERAL"))
    opts.get(prefix + "map-null-key.literal")
    opts.one_of(prefix + "encode.decimal-as-plain-number", "false", ("false",))
    opts.one_of(prefix + "encode.ignore-null-fields", "false", ("false",))
    if opts.options.get("key.format") is not None:
        raise opts.refuse("'key.format' with 'debezium-json' is not supported (the record key is not read)",
                          "key.format")  # fmt: skip
    return DebeziumJson(schema_include=schema_include, ignore_parse_errors=ignore_parse_errors)


def connector_of(
    table: str, options: Mapping[str, str], positions: Mapping[str, Position], position: Position
) -> Connector:
    """The typed connector of a ``WITH (...)`` clause: Flink's option names; an unknown option or
    value is refused with its name."""
    opts = _Options(table, options, positions, position)
    name = opts.get("connector")
    connector: Connector
    match name:
        case "kafka" | "upsert-kafka":
            key_fields: tuple[str, ...] = ()
            debezium = None
            if name == "kafka":
                # 'format', or 'value.format' (Flink's name beside a 'key.format'): its options prefixed so
                format_key = "format" if "format" in options or "value.format" not in options else "value.format"
                value_format = opts.one_of(format_key, "json", ("json", "debezium-json"))
                if value_format == "debezium-json":
                    debezium = _debezium_json(
                        opts, "debezium-json." if format_key == "format" else "value.debezium-json."
                    )
                key_fields = _key_fields(opts)
            else:
                opts.one_of("key.format", "json", ("json",))
                opts.one_of("value.format", "json", ("json",))
            prefix = opts.get("key.fields-prefix", "") or ""
            include = opts.one_of("value.fields-include", "ALL", ("ALL", "EXCEPT_KEY"))
            startup = opts.one_of(
                "scan.startup.mode",
                "group-offsets" if name == "kafka" else "earliest-offset",
                ("earliest-offset", "latest-offset", "group-offsets"),
            )
            bounded = opts.one_of("scan.bounded.mode", "unbounded", ("unbounded", "latest-offset"))
            delivery = opts.one_of("sink.delivery-guarantee", "exactly-once", ("exactly-once", "at-least-once"))
            pace = opts.get("scan.records-per-second")
            try:
                records_per_second = None if pace is None else float(pace)
            except ValueError:
                key = "scan.records-per-second"
                raise opts.refuse(f"option '{key}' = '{pace}' is not a number", key) from None
            connector = KafkaTable(
                topic=opts.need("topic"),
                upsert=name == "upsert-kafka",
                bounded=bounded == "latest-offset",
                startup_mode=startup,
                group_id=opts.get("properties.group.id"),
                delivery=delivery,
                records_per_second=records_per_second,
                dead_letter_topic=opts.get("scan.dead-letter-topic"),
                key_fields=key_fields,
                key_fields_prefix=prefix,
                value_fields_include=include,
                debezium=debezium,
            )
            opts.get("properties.isolation.level")
            opts.get("properties.linger.ms")
            opts.get("sink.transaction-timeout")
        case "jdbc":
            url = opts.need("url")
            if not url.startswith("jdbc:postgresql:"):
                raise opts.refuse(
                    f"'url' = '{url}': Weir's jdbc connector writes PostgreSQL (jdbc:postgresql://...)", "url"
                )
            connector = JdbcTable(table_name=opts.need("table-name"), url=url)
            opts.get("username")
            opts.get("password")
        case "datagen":
            rate = opts.get("rows-per-second")
            fields: dict[str, dict[str, str]] = {}
            for key, value in options.items():
                if key.startswith("fields."):
                    parts = key.split(".")
                    if len(parts) != 3:
                        raise opts.refuse(f"option '{key}' is not supported", key)
                    fields.setdefault(parts[1], {})[parts[2]] = value
            connector = DatagenTable(
                rows=opts.integer("number-of-rows", None),
                rows_per_second=None if rate is None else float(rate),
                fields=tuple((f, tuple(sorted(o.items()))) for f, o in sorted(fields.items())),
            )
        case "nexmark":
            events = opts.integer("events.num", None)
            events_per_second = opts.integer("first-event.rate", 10_000)
            assert events_per_second is not None
            seed = opts.integer("seed", 0) or 0
            connector = NexmarkTable(events=events or None, events_per_second=events_per_second, seed=seed)
        case "print":
            connector = PrintTable(prefix=opts.get("print-identifier", "") or "")
        case "postgres-cdc":
            for key in ("hostname", "port", "username", "password", "database-name"):
                opts.get(key)  # the job's PostgreSQL (WEIR_POSTGRES_DSN) is the one read
            opts.one_of("decoding.plugin.name", "pgoutput", ("pgoutput",))
            mode = opts.one_of("changelog-mode", "all", ("all", "upsert"))
            opts.one_of("scan.startup.mode", "initial", ("initial",))
            opts.one_of("scan.incremental.snapshot.enabled", "true", ("true",))
            chunk_size = opts.integer("scan.incremental.snapshot.chunk.size", 8096)
            assert chunk_size is not None
            parallelism = opts.integer("scan.parallelism", 1)
            assert parallelism is not None
            if parallelism < 1:
                raise opts.refuse(f"option 'scan.parallelism' = '{parallelism}' is not a parallelism of 1 or more",
                                  "scan.parallelism")  # fmt: skip
            connector = PostgresCdcTable(
                schema_name=opts.get("schema-name", "public") or "public",
                table_name=opts.need("table-name"),
                slot_name=opts.need("slot.name"),
                chunk_size=chunk_size,
                upsert=mode == "upsert",
                parallelism=parallelism,
            )
        case "filesystem":
            path = opts.need("path")
            local = path.removeprefix("file://")
            in_s3 = path.startswith("s3://") and not path.startswith("s3:///") and len(path) > len("s3://")
            if in_s3:
                local = path  # written through the job's S3 settings (docs/configuration.md); never read
            elif not local.startswith("/"):
                raise opts.refuse(
                    f"'path' = '{path}': Weir's filesystem connector takes a local path (an absolute path or "
                    "file:///...), or s3://bucket/prefix for a table that is only written",
                    "path",
                )
            opts.one_of("format", "csv", ("csv",))
            rollover = opts.get("sink.rolling-policy.rollover-interval")
            rollover_ms = None
            if rollover is not None:
                rollover_ms = flink_duration_ms(rollover)
                if rollover_ms is None or rollover_ms <= 0:
                    key = "sink.rolling-policy.rollover-interval"
                    raise opts.refuse(f"option '{key}' = '{rollover}' is not a positive duration", key)
            # Weir checks a part file's age on each record and on its own timer: accepted, not needed
            opts.get("sink.rolling-policy.check-interval")
            connector = FilesystemTable(path=local, rollover_ms=rollover_ms, partition_commit=_partition_commit(opts))
        case None:
            raise opts.refuse("the 'connector' option is required")
        case _:
            raise opts.refuse(
                f"'connector' = '{name}' is not supported (one of: kafka, upsert-kafka, jdbc, datagen, nexmark, print, "
                "postgres-cdc, filesystem)",
                "connector",
            )
    opts.check_all_used()
    return connector


def _check_kafka_fields(table: Table, options: Mapping[str, Position], position: Position) -> None:
    """A Kafka table's key fields are physical columns, each named with ``'key.fields-prefix'``, and a
    prefix needs ``'value.fields-include' = 'EXCEPT_KEY'``: refused as Flink's Kafka connectors word it
    (its list of columns on the same line), in the order Flink checks them."""
    connector = table.connector
    assert isinstance(connector, KafkaTable)
    prefix = connector.key_fields_prefix
    physical = [c.name for c in table.columns]
    keys = table.primary_key if connector.upsert else connector.key_fields
    at = options.get("key.fields", options.get("key.fields-prefix", position))
    for key in keys:
        if key not in physical:
            raise SqlError(
                f"table {table.name}: Could not find the field '{key}' in the table schema for usage in the key "
                "format. A key field must be a regular, physical column. The following columns can be selected in "
                f"the 'key.fields' option: [{', '.join(physical)}]",
                at,
            )
        if not key.startswith(prefix):
            raise SqlError(
                f"table {table.name}: All fields in 'key.fields' must be prefixed with '{prefix}' when option "
                f"'key.fields-prefix' is set but field '{key}' is not prefixed.",
                options.get("key.fields-prefix", position),
            )
    if prefix and connector.value_fields_include == "ALL":
        raise SqlError(
            f"table {table.name}: A key prefix is not allowed when option 'value.fields-include' is set to 'ALL'. "
            "Set it to 'EXCEPT_KEY' instead to avoid field overlaps.",
            options.get("value.fields-include", options.get("key.fields-prefix", position)),
        )


def check_table(table: Table, position: Position, options: Mapping[str, Position] | None = None) -> None:
    """The rules that need the whole table: the watermark's column is a timestamp, a primary key's
    columns exist, upsert-kafka has a primary key, a Kafka table's key fields (``options``: where each
    option is in the script, for a refusal's position)."""
    names = table.column_names
    if len(set(names)) != len(names):
        raise SqlError(f"table {table.name}: a column name appears twice", position)
    if table.watermark is not None:
        if table.watermark.column not in names:
            raise SqlError(f"table {table.name}: WATERMARK FOR {table.watermark.column}: no such column", position)
        physical = table.physical(table.watermark.column)
        if physical is not None and physical.type.kind is not Kind.TIMESTAMP:
            raise SqlError(
                f"table {table.name}: WATERMARK FOR {table.watermark.column}: the column is {physical.type.text}, "
                "not a TIMESTAMP",
                position,
            )
    for key in table.primary_key:
        if key not in names:
            raise SqlError(f"table {table.name}: PRIMARY KEY ({key}): no such column", position)
    if isinstance(table.connector, KafkaTable) and table.connector.upsert and not table.primary_key:
        raise SqlError(f"table {table.name}: 'upsert-kafka' needs a PRIMARY KEY (...) NOT ENFORCED", position)
    if isinstance(table.connector, KafkaTable):
        _check_kafka_fields(table, options or {}, position)
    if isinstance(table.connector, PostgresCdcTable) and table.watermark is not None:
        raise SqlError(f"table {table.name}: a 'postgres-cdc' table has no event time (WATERMARK) yet", position)
    if isinstance(table.connector, PostgresCdcTable) and table.computed:
        raise SqlError(f"table {table.name}: a 'postgres-cdc' table with computed columns is not supported", position)
    if isinstance(table.connector, PostgresCdcTable) and not table.primary_key:
        raise SqlError(
            f"table {table.name}: a 'postgres-cdc' table is a changelog by its PRIMARY KEY (...) NOT ENFORCED "
            "(the PostgreSQL table's); declare one",
            position,
        )
    for column in table.partition_by:
        if column not in names:
            raise SqlError(f"table {table.name}: PARTITIONED BY ({column}): no such column", position)
    if table.partition_by and not isinstance(table.connector, FilesystemTable):
        raise SqlError(f"table {table.name}: PARTITIONED BY is supported for a 'filesystem' table only", position)
    if isinstance(table.connector, FilesystemTable) and (table.computed or table.watermark is not None):
        raise SqlError(
            f"table {table.name}: a 'filesystem' table (a lookup join's side input) has no computed columns or "
            "WATERMARK",
            position,
        )
    if (
        isinstance(table.connector, FilesystemTable)
        and table.connector.partition_commit is not None
        and table.connector.partition_commit.trigger == "partition-time"
        and not table.partition_by
    ):
        raise SqlError(
            f"table {table.name}: 'sink.partition-commit.trigger' = 'partition-time' needs PARTITIONED BY (...): a "
            "partition's time is read from its values",
            (options or {}).get("sink.partition-commit.trigger", position),
        )
    if isinstance(table.connector, JdbcTable) and not table.primary_key:
        raise SqlError(
            f"table {table.name}: a 'jdbc' sink upserts by its PRIMARY KEY (...) NOT ENFORCED; declare one", position
        )


__all__ = [
    "Column",
    "ComputedColumn",
    "Connector",
    "DatagenTable",
    "DebeziumJson",
    "FilesystemTable",
    "JdbcTable",
    "KafkaLayout",
    "KafkaTable",
    "NexmarkTable",
    "PartitionCommitOptions",
    "PostgresCdcTable",
    "PrintTable",
    "Table",
    "Watermark",
    "check_table",
    "connector_of",
    "flink_duration_ms",
    "kafka_layout",
]
