"""A logical plan as job API calls: the SQL layer adds no engine of its own. A Kafka table is
``from_kafka`` with its JSON rows decoded to the table's types (and computed columns), event time
from its WATERMARK column; WHERE is ``filter``; the SELECT list ``map``; GROUP BY over a window TVF
``key_by(...).window(Tumbling|SlidingEventTimeWindows).aggregate``; GROUP BY without a window
``key_by(...).reduce`` (the running accumulators, an updated row after each input row); the sink
``sink_to_kafka`` (exactly-once; upsert-kafka keyed by the primary key) or ``sink_to_postgres``
(two-phase, upsert on the primary key).

Operator uids: ``sql-<digest>-<n>-<what>``, ``digest`` the first 10 hex digits of the SHA-1 of the
INSERT statement as sqlglot normalises it (whitespace, comments and keyword case do not change it),
``n`` the operator's place in the statement's plan; a second identical statement gets ``-2``. The
same SQL submitted again has the same uids, so a savepoint restores into it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from operator import itemgetter
from typing import Any, Final, assert_never

from weir import nexmark
from weir.api import (
    COMMITTED,
    EARLIEST,
    LATEST,
    Collector,
    CumulativeEventTimeWindows,
    DataStream,
    Environment,
    EventTimeSessionWindows,
    KeyedProcessContext,
    KeyedProcessFunction,
    OnTimerContext,
    PrintSink,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    StateTtlConfig,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowContext,
)
from weir.api.connector import WithOnError, WithoutOnError
from weir.api.file_sink import PartFileSink
from weir.core import json_codec
from weir.core.changelog import Delete
from weir.core.descriptors import Committed, KafkaRecord, OffsetReset, StartingOffsets
from weir.graph import OperatorKind
from weir.sql.catalog import (
    DatagenTable,
    FilesystemTable,
    JdbcTable,
    KafkaLayout,
    KafkaTable,
    NexmarkTable,
    PostgresCdcTable,
    PrintTable,
    Table,
    kafka_layout,
)
from weir.sql.cdc import CdcChanges, CdcUpserts
from weir.sql.changelog import Change, ChangelogMode
from weir.sql.changelog_join import ChangelogJoin, RowsKept, SideRows, sides_kept
from weir.sql.debezium import DebeziumEncoder, DebeziumRecords
from weir.sql.decode import bare_column, checked, coercer, read_above, read_columns, reads
from weir.sql.errors import SqlError
from weir.sql.expressions import Evaluate, Locate, Scope, column_read, compile_expression
from weir.sql.join import MiniBatchRegularJoin, RegularJoin, joined_row
from weir.sql.join_layout_compat import layout_changed, layout_uid_suffix
from weir.sql.lookup import LookupRows
from weir.sql.materialize import SinkUpsertMaterializer
from weir.sql.minibatch import MiniBatchConfig
from weir.sql.part_files import CsvLine, PartitionFolder, partition_commit
from weir.sql.plan import (
    Aggregate,
    AggregateCall,
    Filter,
    InsertPlan,
    Interval,
    Join,
    LookupJoin,
    Materializer,
    NamedExpression,
    Node,
    OrderKey,
    OverAggregate,
    Project,
    Scan,
    Sink,
    TopN,
    WindowTvf,
    changelog_of,
)
from weir.sql.ranking import RankedRows, RetractingRankedRows
from weir.sql.retract import (
    BatchGroup,
    ChangelogAggregate,
    ChangelogBatch,
    MiniBatchGroupAggregate,
    RetractingAccumulators,
    UpsertBatch,
    over_values,
)
from weir.sql.retract import average as _average
from weir.sql.state_format import GROUP_AGGREGATE_STATE
from weir.sql.types import Kind, to_json
from weir.sql.upsert import ChangelogNormalize, SinkWrite, UpsertKafkaRecords, sink_write


@dataclass(frozen=True)
class Operator:
    """One operator a statement adds to the job, for EXPLAIN."""

    uid: str
    kind: str
    detail: str


def statement_digest(normalized: str) -> str:
    return hashlib.sha1(normalized.encode("utf-8")).hexdigest()[:10]


class _Uids:
    """The uids of a statement's operators (and what it compiles with: the tables' sources, the state TTL)."""

    def __init__(
        self,
        prefix: str,
        out: list[Operator],
        sources: dict[str, DataStream],
        state_ttl_ms: int = 0,
        *,
        plan: object = None,
        decoders: dict[str, RowDecoder] | None = None,
    ) -> None:
        self.prefix, self.n, self.out, self.sources = prefix, 0, out, sources
        self.reads = reads(plan)  # column pruning: the names each table is read by (None: all)
        self.read_above = read_above(plan)  # the names read above each projection and regular join, by id
        self.decoders = {} if decoders is None else decoders  # the job's sources' decoders, by table
        self.ttl = StateTtlConfig(state_ttl_ms) if state_ttl_ms > 0 else None
        self.columnar = False  # SET 'weir.columnar' = 'true': window aggregates on batches where they can
        self.mini_batch: MiniBatchConfig | None = None  # SET 'table.exec.mini-batch.*': GROUP BY, regular join

    def next(self, kind: str, detail: str, suffix: str = "") -> str:
        """The next operator's uid, ``suffix`` after its kind (a changelog join whose layout changed)."""
        uid = f"{self.prefix}-{self.n}-{kind}{suffix}"
        self.n += 1
        self.out.append(Operator(uid, kind, detail))
        return uid

    def source(self, table: str, detail: str) -> str:
        """A table's source: one per table in the job, read by every statement that reads it."""
        uid = source_uid(table)
        self.out.append(Operator(uid, "source", detail))
        return uid


def source_uid(table: str) -> str:
    """The uid of a table's source operator: ``sql-source-<table>`` (its offsets in checkpoints)."""
    return f"sql-source-{table}"


def compile_insert(
    env: Environment | None,
    plan: InsertPlan,
    prefix: str,
    script: str,
    sources: dict[str, DataStream] | None = None,
    state_ttl_ms: int = 0,
    columnar: bool = False,
    decoders: dict[str, RowDecoder] | None = None,
    mini_batch: MiniBatchConfig | None = None,
) -> list[Operator]:
    """Add the statement's operators to ``env`` (None: only name them, for EXPLAIN); answer them.
    ``sources``: the tables already read in this job, by name (one source each). ``state_ttl_ms``
    (SET 'table.exec.state.ttl'): the TTL of a regular join's and a GROUP BY without a window's state.
    ``columnar`` (SET 'weir.columnar' = 'true'): a scan -> filter/projection chain runs on Arrow batches.
    ``decoders``: the decoders of ``sources`` (a statement reading a source widens its columns).
    ``mini_batch`` (SET 'table.exec.mini-batch.enabled' = 'true' and its latency and size): a GROUP BY
    without a window applies its input in mini-batches (``weir.sql.retract.MiniBatchGroupAggregate``),
    and so does a regular join (``weir.sql.join.MiniBatchRegularJoin``)."""
    operators: list[Operator] = []
    uids = _Uids(prefix, operators, {} if sources is None else sources, state_ttl_ms, plan=plan, decoders=decoders)
    uids.mini_batch = mini_batch
    stream = _columnar(env, plan, uids, script) if columnar else _node(env, plan.sink.input, uids, script)
    _sink(env, stream, plan.sink, uids)
    return operators


def _columnar(env: Environment | None, plan: InsertPlan, uids: _Uids, script: str) -> DataStream | None:
    """The statement's scan -> filter/projection chain as one operator on Arrow batches
    (weir.sql.columnar), or, when it is not such a chain or holds what Arrow does not compute as the
    per-record path does, the per-record operators, each saying why in EXPLAIN."""
    from weir.sql.columnar import ColumnarChain, ColumnarChainOperator, columnar_chain  # Arrow: only when asked

    node, sink = plan.sink.input, plan.sink
    chain = columnar_chain(node, sink)
    if not isinstance(chain, ColumnarChain):
        first = len(uids.out)
        uids.columnar = True
        stream = _node(env, node, uids, script)
        for i in range(first, len(uids.out)):
            operator = uids.out[i]
            if operator.kind != "source" and "[columnar" not in operator.detail:
                uids.out[i] = dataclasses.replace(
                    operator, detail=f"{operator.detail} [per record; not columnar: {chain.reason}]"
                )
        return stream
    upstream = _scan(env, chain.scan, uids, script)
    steps = []
    walk: Node = node
    while isinstance(walk, Filter | Project):
        steps.append(
            f"WHERE {walk.condition.sql}"
            if isinstance(walk, Filter)
            else "SELECT " + ", ".join(f"{o.sql} AS {o.name}" for o in walk.outputs)
        )
        walk = walk.input
    uid = uids.next("columnar", "on Arrow batches: " + "; ".join(reversed(steps)))
    if env is None or upstream is None:
        return None
    return upstream._add(  # noqa: SLF001  # the SQL layer's own operator, as the job API adds its own
        WithoutOnError(lambda: ColumnarChainOperator(node, sink)), uid=uid, name="sql columnar", parallelism=None
    )


def compile_query(
    env: Environment,
    node: Node,
    prefix: str,
    script: str,
    sources: dict[str, DataStream] | None = None,
    decoders: dict[str, RowDecoder] | None = None,
) -> DataStream:
    """A query's rows as a stream of dicts (column name -> value) in ``env``'s job."""
    uids = _Uids(prefix, [], {} if sources is None else sources, plan=node, decoders=decoders)
    stream = _node(env, node, uids, script)
    assert stream is not None
    return stream


# -- rows ---------------------------------------------------------------------------------------


class RowDecoder:
    """A table's JSON value as its row: each physical column the job reads as its type (a missing
    field is NULL), then the computed columns; an unread column is NULL in the row (no expression the
    job evaluates reads it), but a value of the wrong type in it raises all the same
    (weir.sql.decode). A value that is not a JSON object or a field of the wrong type raises (the
    source's dead letters or job failure, as for any deserializer). ``read``: the physical columns to
    decode (None: all); :meth:`read_also` widens it while the job is built (a later statement reading
    the same source)."""

    def __init__(self, table: Table, script: str, read: frozenset[str] | None = None) -> None:
        self.table = table
        self.kinds = tuple((c.name, c.type.kind) for c in table.columns)
        scope = Scope({c.name: c.type for c in table.columns}, frozenset({table.name}), {})
        locate = Locate(script, 0)
        computed = []
        for c in table.computed:
            computed.append((c.name, compile_expression(c.expression, scope, locate)))
            scope = Scope({**scope.columns, c.name: None}, scope.qualifiers, {})
        self.computed = tuple(computed)
        self.read = frozenset(name for name, _ in self.kinds) if read is None else read
        self._precompute()

    def read_also(self, read: frozenset[str]) -> None:
        self.read = self.read | read
        self._precompute()

    def _precompute(self) -> None:
        self.columns = tuple((name, coercer(kind)) for name, kind in self.kinds if name in self.read)
        self.checked = checked(self.kinds, self.read)
        self.template = {name: None for name, _ in self.kinds}  # an unread column is NULL in the row

    @property
    def pruned(self) -> tuple[str, ...]:
        """The physical columns not decoded, in the table's order."""
        return tuple(name for name, _ in self.kinds if name not in self.read)

    def row(self, record: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.template.copy()  # a missing or null field stays NULL: no conversion
        get = record.get
        for name, convert in self.columns:
            value = get(name)
            if value is not None:
                try:
                    out[name] = convert(value)
                except ValueError as exc:
                    raise ValueError(f"column {name}: {exc}") from None
        for name, convert in self.checked:
            value = get(name)
            if value is not None:
                try:
                    convert(value)
                except ValueError as exc:
                    raise ValueError(f"column {name}: {exc}") from None
        for name, evaluate in self.computed:
            out[name] = evaluate(out)
        return out

    def lenient_row(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`row` with a field that does not decode NULL, as Flink's JSON converter makes it under
        ``ignore-parse-errors`` (a computed column that fails still raises)."""
        out: dict[str, Any] = self.template.copy()
        get = record.get
        for name, convert in self.columns:
            value = get(name)
            if value is not None:
                try:
                    out[name] = convert(value)
                except (ValueError, TypeError):
                    pass  # NULL
        for name, evaluate in self.computed:
            out[name] = evaluate(out)
        return out

    def __call__(self, raw: bytes) -> dict[str, Any]:
        record = json_codec.decode(raw)
        if not isinstance(record, dict):
            raise ValueError(f"a row is a JSON object, not {type(record).__name__}")
        return self.row(record)


class RowEncoder:
    """A sink row (the sink table's columns, already of their types) as the JSON format writes it."""

    def __init__(self, table: Table) -> None:
        self.columns = tuple((c.name, c.type.kind) for c in table.columns)

    def values(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        """The row's values in the table's column order, as PostgreSQL takes them (a TIMESTAMP as a
        UTC ``datetime`` without zone, for a ``timestamp`` column)."""
        return tuple(
            _utc(row[name]) if kind is Kind.TIMESTAMP and row[name] is not None else row[name]
            for name, kind in self.columns
        )

    def json(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {name: to_json(row[name], kind) for name, kind in self.columns}

    def __call__(self, row: Mapping[str, Any]) -> bytes:
        return json_codec.encode(self.json(row))


KEYED_PARTITIONER: Final = {"partitioner": "murmur2_random"}
"""A keyed Kafka sink's partitioner: librdkafka's murmur2 of the key's bytes, the Java client's default,
which Flink's Kafka sink leaves in place (no 'sink.partitioner'): a key lands in the partition Flink's
sink puts it in (librdkafka's own default hashes with CRC-32), so a compacted topic both write keeps
each key's records in one partition."""


class KafkaRecordEncoder:
    """A 'kafka' or 'upsert-kafka' sink row's record key and value, as the table's
    :class:`~weir.sql.catalog.KafkaLayout` lays them out (JSON objects): ``key`` None when the table
    has no key fields, ``value`` the whole row's JSON when the value holds every column."""

    def __init__(self, table: Table) -> None:
        self.encoder = RowEncoder(table)
        self.layout = kafka_layout(table)
        self.has_key = bool(self.layout.key)
        self.whole = self.layout.value == tuple(c.name for c in table.columns)

    def key(self, row: Mapping[str, Any]) -> bytes:
        """The key's JSON object, its fields in key order ('key.fields', or the PRIMARY KEY's columns
        as declared), the bytes Flink's key format writes: a topic compacts by them."""
        return json_codec.encode_in_order(self.layout.key_object(self.encoder.json(row)))

    def value(self, row: Mapping[str, Any]) -> bytes:
        if self.whole:
            return self.encoder(row)
        return json_codec.encode(self.layout.value_object(self.encoder.json(row)))


class KafkaRows:
    """A 'kafka' table's record with ``'key.fields'`` as its row: the key's columns from the record
    key's JSON object (named without ``'key.fields-prefix'``), the value's from its value
    (:meth:`~weir.sql.catalog.KafkaLayout.fields`), decoded by the table's :class:`RowDecoder`. A record
    without a key or a value, or whose key or value is not a JSON object, raises (the source's dead
    letters or the job's failure; Flink's source skips a record without a key)."""

    def __init__(self, table: str, layout: KafkaLayout, decoder: RowDecoder) -> None:
        self.table, self.layout, self.decoder = table, layout, decoder

    def __call__(self, record: KafkaRecord) -> dict[str, Any]:
        if record.key is None:
            columns = ", ".join(self.layout.key_columns)
            raise ValueError(f"kafka table {self.table}: a record without a key (it holds {columns})")
        key = json_codec.decode(record.key)
        if not isinstance(key, dict):
            raise ValueError(f"kafka table {self.table}: a record key is a JSON object, not {type(key).__name__}")
        if record.value is None:
            raise ValueError(f"kafka table {self.table}: a record without a value")
        value = json_codec.decode(record.value)
        if not isinstance(value, dict):
            raise ValueError(f"a row is a JSON object, not {type(value).__name__}")
        return self.decoder.row(self.layout.fields(key, value))


def _layout_words(table: Table) -> str:
    """EXPLAIN's words for a Kafka table's key and value, when it has a key or its value is not the row."""
    layout = kafka_layout(table)
    words = []
    assert isinstance(table.connector, KafkaTable)
    renamed = any(c != n for c, n in layout.key)
    if layout.key and (renamed or not table.connector.upsert):  # upsert-kafka's key is its primary key
        words.append("key " + ", ".join(c if c == n else f"{c} as {n}" for c, n in layout.key))
    if layout.value != tuple(c.name for c in table.columns):
        words.append("value " + (", ".join(layout.value) or "{}"))
    return "; " + "; ".join(words) if words else ""


def _utc(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)


def _event_time(column: str) -> Callable[[Mapping[str, Any]], int]:
    def timestamp(row: Mapping[str, Any]) -> int:
        value = row[column]
        if value is None:
            raise ValueError(f"the event time column {column} is NULL")
        return int(value)

    return timestamp


def _starting_offsets(mode: str) -> StartingOffsets:
    match mode:
        case "earliest-offset":
            return EARLIEST
        case "latest-offset":
            return LATEST
        case _:
            return Committed(OffsetReset.EARLIEST) if mode == "group-offsets" else COMMITTED


def _scan(env: Environment | None, scan: Scan, uids: _Uids, script: str) -> DataStream | None:
    read = read_columns(scan.table, uids.reads)
    if scan.table.name in uids.sources:
        decoder = uids.decoders.get(scan.table.name)
        if decoder is None:
            read = frozenset(c.name for c in scan.table.columns)
        else:
            decoder.read_also(read)
        uids.source(scan.table.name, f"(read once in the job){_decoded(scan.table, read)}")
        return uids.sources[scan.table.name]
    stream = _new_scan(env, scan, uids, script, read)
    if stream is not None:
        uids.sources[scan.table.name] = stream
    return stream


def _decoded(table: Table, read: frozenset[str]) -> str:
    """EXPLAIN's words for a source's column pruning: the physical columns it decodes."""
    if len(read) == len(table.columns):
        return ""
    return "; decodes " + ", ".join(c.name for c in table.columns if c.name in read)


def _new_scan(env: Environment | None, scan: Scan, uids: _Uids, script: str, read: frozenset[str]) -> DataStream | None:
    table = scan.table
    connector = table.connector
    decoder = RowDecoder(table, script, read)
    uids.decoders[table.name] = decoder
    decoded = _decoded(table, read)
    timestamp = _event_time(table.watermark.column) if table.watermark else None
    delay = table.watermark.delay_ms if table.watermark else 0
    match connector:
        case KafkaTable() if connector.upsert:
            return _upsert_kafka_scan(env, table, connector, uids, decoder)
        case KafkaTable() if connector.debezium is not None:
            return _debezium_scan(env, table, connector, uids, decoder)
        case KafkaTable():
            uid = uids.source(
                table.name, f"kafka topic {connector.topic} ({table.name}{_layout_words(table)}{decoded})"
            )
            if env is None:
                return None
            layout = kafka_layout(table)
            return env.from_kafka(
                connector.topic,
                uid=uid,
                bounded=connector.bounded,
                deserializer=None if layout.key else decoder,
                record_deserializer=KafkaRows(table.name, layout, decoder) if layout.key else None,
                timestamp=timestamp,
                max_out_of_orderness_ms=delay,
                starting_offsets=_starting_offsets(connector.startup_mode),
                group_id=connector.group_id,
                records_per_second=connector.records_per_second,
                dead_letter_topic=connector.dead_letter_topic,
                name=f"sql source {table.name}",
            )
        case NexmarkTable():
            uid = uids.source(table.name, f"nexmark generator ({table.name}{decoded})")
            if env is None:
                return None
            config = nexmark.NexmarkConfig(events_per_second=connector.events_per_second, seed=connector.seed)
            return env.from_generator(
                lambda n: decoder.row(nexmark.to_dict(nexmark.event(n, config))),
                uid=uid,
                count=connector.events,
                timestamp=timestamp,
                max_out_of_orderness_ms=delay,
                name=f"sql source {table.name}",
            )
        case DatagenTable():
            uid = uids.source(table.name, f"datagen ({table.name}{decoded})")
            if env is None:
                return None
            generate = Datagen(table, connector)
            return env.from_generator(
                lambda n: decoder.row(generate(n)),
                uid=uid,
                count=connector.rows,
                timestamp=timestamp,
                max_out_of_orderness_ms=delay,
                records_per_second=connector.rows_per_second,
                name=f"sql source {table.name}",
            )
        case PostgresCdcTable():
            qualified = f"{connector.schema_name}.{connector.table_name}"
            uid = uids.source(table.name, f"postgres-cdc {qualified} slot {connector.slot_name} ({table.name})")
            changes_uid = f"{uid}-changes"  # the table's, as its source's: the same whichever statement reads it
            normalize_uid = f"{uid}-normalize"
            if connector.upsert:  # 'changelog-mode' = 'upsert': new rows and deleted keys, then normalized
                uids.out.append(Operator(changes_uid, "changes", f"the changes of {qualified} as upserts +U/-D"))
                uids.out.append(
                    Operator(
                        normalize_uid,
                        "changelog-normalize",
                        f"the last row per key of {table.name}: emits [+I, -U, +U, -D]",
                    )
                )
            else:
                uids.out.append(Operator(changes_uid, "changes", f"the changes of {qualified} as +I/-U/+U/-D"))
            if env is None:
                return None
            events = env.from_postgres_cdc(
                [qualified],
                uid=uid,
                slot_name=connector.slot_name,
                chunk_size=connector.chunk_size,
                name=f"sql source {table.name}",
                parallelism=connector.parallelism,
            )
            # chained to the source: subtask 0 streams every change in commit order (its readers' rows,
            # 'scan.parallelism' > 1, come before a row's first change); then each key's to one subtask
            parallelism = connector.parallelism
            if connector.upsert:
                upserts = events.flat_map(CdcUpserts(table, decoder.row), uid=changes_uid, parallelism=parallelism)
                return upserts.key_by(_change_key(table)).process(ChangelogNormalize(), uid=normalize_uid)
            changes = events.flat_map(CdcChanges(table, decoder.row), uid=changes_uid, parallelism=parallelism)
            return changes.key_by(_change_key(table))
        case JdbcTable() | PrintTable():
            raise SqlError(f"table {table.name}: its connector is a sink; it cannot be read")
        case FilesystemTable():  # the planner refuses it first
            raise SqlError(f"table {table.name}: a 'filesystem' table is read only by a lookup join")
        case _:
            assert_never(connector)


def _upsert_kafka_scan(
    env: Environment | None, table: Table, connector: KafkaTable, uids: _Uids, decoder: RowDecoder
) -> DataStream | None:
    """An 'upsert-kafka' table as a changelog: each record an upsert (a value) or a delete (a tombstone)
    of its key (weir.sql.upsert.UpsertKafkaRecords), keyed by the primary key into the table's
    ``changelog-normalize`` (Flink's ChangelogNormalize: the last row per key, so a new row is +I or
    -U/+U of whole rows and a tombstone -D of the whole row)."""
    assert table.watermark is None, "the planner refuses reading an upsert-kafka table with a WATERMARK"
    decoder.read_also(frozenset(c.name for c in table.columns))  # the normalizer compares whole rows
    uid = uids.source(table.name, f"upsert-kafka topic {connector.topic} ({table.name}{_layout_words(table)})")
    normalize_uid = f"{uid}-normalize"  # the table's, as its source's: the same whichever statement reads it
    uids.out.append(
        Operator(normalize_uid, "changelog-normalize", f"the last row per key of {table.name}: emits [+I, -U, +U, -D]")
    )
    if env is None:
        return None
    key_types = {c.name: c.type for c in table.columns if c.name in table.primary_key}
    key_decoder = RowDecoder(
        dataclasses.replace(table, columns=tuple(c for c in table.columns if c.name in key_types), computed=()), ""
    )
    records = UpsertKafkaRecords(table.name, kafka_layout(table), decoder.row, key_decoder.row)
    upserts = _record_source(env, table, connector, uid, records)
    return upserts.key_by(_change_key(table)).process(ChangelogNormalize(), uid=normalize_uid)


def _record_source(
    env: Environment, table: Table, connector: KafkaTable, uid: str, records: Callable[[KafkaRecord], Any]
) -> DataStream:
    """A changelog table's Kafka source: each whole record (key and value) through ``records``."""
    return env.from_kafka(
        connector.topic,
        uid=uid,
        bounded=connector.bounded,
        record_deserializer=records,
        starting_offsets=_starting_offsets(connector.startup_mode),
        group_id=connector.group_id,
        records_per_second=connector.records_per_second,
        dead_letter_topic=connector.dead_letter_topic,
        name=f"sql source {table.name}",
    )


def _debezium_scan(
    env: Environment | None, table: Table, connector: KafkaTable, uids: _Uids, decoder: RowDecoder
) -> DataStream | None:
    """A 'kafka' table of 'debezium-json' as a changelog: each record's envelope decoded once into its
    changes (weir.sql.debezium.DebeziumRecords: +I, -U and +U, or -D of whole rows), chained to the
    source; as Flink's, no ChangelogNormalize (the envelope carries the old row) and no exchange (a
    key's changes are in order as its partition holds them)."""
    assert table.watermark is None, "the planner refuses reading a changelog table with a WATERMARK"
    options = connector.debezium
    assert options is not None
    words = ", schema included" if options.schema_include else ""
    words += ", parse errors ignored" if options.ignore_parse_errors else ""
    uid = uids.source(
        table.name, f"kafka topic {connector.topic} ({table.name}{_decoded(table, decoder.read)}), debezium-json{words}"
    )
    changes_uid = f"{uid}-changes"  # the table's, as its source's: the same whichever statement reads it
    uids.out.append(Operator(changes_uid, "changes", f"the Debezium envelopes of {table.name} as +I/-U/+U/-D"))
    if env is None:
        return None
    records = DebeziumRecords(
        table.name,
        decoder.row,
        decoder.lenient_row,
        schema_include=options.schema_include,
        ignore_parse_errors=options.ignore_parse_errors,
    )
    envelopes = _record_source(env, table, connector, uid, records)
    return envelopes.flat_map(_each, uid=changes_uid)


def _each(changes: tuple[Change, ...]) -> tuple[Change, ...]:
    return changes


class Datagen:
    """Flink's datagen, deterministic: ``fields.NAME.kind`` = ``sequence`` (``start``, ``end``: row n is
    start + n) or ``random`` (default; ``min``/``max`` for numbers, ``length`` for strings), a random
    value a hash of (row number, column), so a replay gives the same rows."""

    def __init__(self, table: Table, connector: DatagenTable) -> None:
        self.table = table
        self.fields = {name: dict(options) for name, options in connector.fields}

    def __call__(self, n: int) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for column in self.table.columns:
            options = self.fields.get(column.name, {})
            kind = options.get("kind", "random")
            if kind == "sequence":
                row[column.name] = int(options.get("start", "0")) + n
                continue
            digest = int.from_bytes(hashlib.blake2b(f"{column.name}:{n}".encode(), digest_size=8).digest(), "big")
            match column.type.kind:
                case Kind.INTEGER:
                    low, high = int(options.get("min", "0")), int(options.get("max", str(2**31 - 1)))
                    row[column.name] = low + digest % (high - low + 1)
                case Kind.DOUBLE:
                    low_f, high_f = float(options.get("min", "0")), float(options.get("max", "1"))
                    row[column.name] = low_f + (digest / 2**64) * (high_f - low_f)
                case Kind.STRING:
                    length = int(options.get("length", "10"))
                    row[column.name] = hashlib.blake2b(f"{column.name}:{n}".encode(), digest_size=32).hexdigest()[
                        :length
                    ]
                case Kind.BOOLEAN:
                    row[column.name] = digest % 2 == 0
                case Kind.TIMESTAMP:
                    row[column.name] = n
                case _:
                    assert_never(column.type.kind)
        return row


# -- operators ----------------------------------------------------------------------------------


def _node(env: Environment | None, node: Node, uids: _Uids, script: str) -> DataStream | None:
    match node:
        case Scan():
            return _scan(env, node, uids, script)
        case WindowTvf():
            return _node(env, node.input, uids, script)  # the windows are assigned by the aggregate
        case Filter():
            upstream = _node(env, node.input, uids, script)
            uid = uids.next("filter", node.condition.sql)
            condition = node.condition.evaluate
            if upstream is None:
                return None
            if changelog_of(node.input) is not None:  # each change kept or dropped by its row
                return upstream.filter(lambda change: condition(change.row) is True, uid=uid)
            return upstream.filter(lambda row: condition(row) is True, uid=uid)
        case Project():
            upstream = _node(env, node.input, uids, script)
            uid = uids.next("project", ", ".join(f"{o.sql} AS {o.name}" for o in node.outputs))
            read = uids.read_above.get(id(node))
            outputs = tuple((o.name, o.evaluate) for o in node.outputs if read is None or _kept(o, read))
            if upstream is None:
                return None
            if changelog_of(node.input) is not None:  # each change's row projected, its kind kept
                return upstream.map(lambda change: Change(change.kind, {n: f(change.row) for n, f in outputs}), uid=uid)
            return upstream.map(projection(outputs), uid=uid)
        case Aggregate():
            return _aggregate(env, node, uids, script)
        case Join():
            return _join(env, node, uids, script)
        case LookupJoin():
            return _lookup_join(env, node, uids, script)
        case TopN():
            return _top_n(env, node, uids, script)
        case OverAggregate():
            return _over(env, node, uids, script)
        case _:
            assert_never(node)


def projection(outputs: tuple[tuple[str, Evaluate], ...]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A projection's row: each output's value by its name. When every output is an input column as
    it is (``expressions.column_read``), the values are read by one ``itemgetter`` of them all."""
    columns = tuple(column_read(f) for _, f in outputs)
    if len(columns) >= 2 and all(c is not None for c in columns):
        names = tuple(n for n, _ in outputs)
        values = itemgetter(*columns)
        return lambda row: dict(zip(names, values(row), strict=True))
    return lambda row: {n: f(row) for n, f in outputs}


def _kept(output: NamedExpression, read: frozenset[str]) -> bool:
    """A projection's output is built when it is read above (``read``: case-folded names), or when it
    is an expression (still evaluated: a value it raises on is rejected as before)."""
    return output.name.casefold() in read or not bare_column(output.sql)


class Ranking:
    """The order of a window Top-N: its ORDER BY items (NULL first or last as each says), then, for
    rows that tie, the rows' values (JSON text) so that the same rows always rank alike."""

    def __init__(self, order: tuple[OrderKey, ...]) -> None:
        self.order = tuple((o.value.evaluate, o.descending, o.nulls_first) for o in order)
        self.key = functools.cmp_to_key(self.compare)

    def compare(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
        for evaluate, descending, nulls_first in self.order:
            x, y = evaluate(a), evaluate(b)
            if x is None or y is None:
                if x is None and y is None:
                    continue
                return (-1 if x is None else 1) * (1 if nulls_first else -1)
            if x != y:
                less = x < y
                return (-1 if less else 1) * (-1 if descending else 1)
        ta, tb = _row_text(a), _row_text(b)
        return -1 if ta < tb else 1 if ta > tb else 0


def _row_text(row: Mapping[str, Any]) -> str:
    return json_codec.encode({k: str(v) if isinstance(v, Decimal) else v for k, v in row.items()}).decode()


class TopRows:
    """The first ``limit`` rows of one partition of one window as they arrive (a sorted list, never
    longer than ``limit``); the window function emits them with their row numbers."""

    def __init__(self, node: TopN) -> None:
        self.limit, self.ranking = node.limit, Ranking(node.order)

    def create(self) -> list[dict[str, Any]]:
        return []

    def add(self, acc: list[dict[str, Any]], row: Mapping[str, Any]) -> list[dict[str, Any]]:
        return sorted([*acc, dict(row)], key=self.ranking.key)[: self.limit]

    def merge(self, a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted([*a, *b], key=self.ranking.key)[: self.limit]

    def result(self, key: Any, window_start: int, window_end: int, acc: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return acc


class EmitRanked(ProcessWindowFunction):
    """Each row of a window Top-N with its row number (1 the first) in column ``rank``."""

    def __init__(self, rank: str) -> None:
        self.rank = rank

    def process(self, key: Any, context: WindowContext, elements: Sequence[Any], out: Collector) -> None:
        for rows in elements:
            for number, row in enumerate(rows, start=1):
                out.collect({**row, self.rank: number})


def row_key(parts: tuple[Callable[[Mapping[str, Any]], Any], ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A row's key: the tuple of ``parts``' values. A key function runs twice per record (the
    partitioner's and the keyed operator's): one or two parts are called without a generator."""
    match parts:
        case (only,):
            return lambda row: (only(row),)
        case (first, second):
            return lambda row: (first(row), second(row))
        case _:
            return lambda row: tuple(f(row) for f in parts)


def _top_n(env: Environment | None, node: TopN, uids: _Uids, script: str) -> DataStream | None:
    upstream = _node(env, node.input, uids, script)
    order = ", ".join(f"{o.value.sql}{' DESC' if o.descending else ''}" for o in node.order)
    partition = ", ".join(p.sql for p in node.partition)
    over = f"ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order}) <= {node.limit}"
    key_of = row_key(tuple(p.evaluate for p in node.partition))
    if node.slide_ms is None and node.input_mode is not None:  # over a changelog: every row of a partition kept
        uid = uids.next("retracting-top-n", f"{over}, retracting, emits {changelog_of(node)}")
        if upstream is None:
            return None
        retracting = RetractingRankedRows(Ranking(node.order).key, node.limit, node.rank, uids.ttl)
        return upstream.key_by(_row_of(key_of)).process(retracting, uid=uid)
    if node.slide_ms is None:  # without a window: a changelog keyed by the partition and the row number
        uid = uids.next("top-n", f"{over}, emits [+I, -U, +U]")
        if upstream is None:
            return None
        ranked = RankedRows(Ranking(node.order).key, node.limit, node.rank, uids.ttl)
        return upstream.key_by(key_of).process(ranked, uid=uid)
    uid = uids.next("window-top-n", over)
    if upstream is None:
        return None

    # the input is a window aggregation's result, each row stamped with its window's last millisecond:
    # the rows of one window (the partition holds window_start/window_end) are a tumbling window of the slide
    return (
        upstream.key_by(key_of)
        .window(TumblingEventTimeWindows(node.slide_ms))
        .aggregate(TopRows(node), uid=uid, window_function=EmitRanked(node.rank), name="window-top-n")
    )


def _join(env: Environment | None, node: Join, uids: _Uids, script: str) -> DataStream | None:
    left = _node(env, node.left, uids, script)
    right = _node(env, node.right, uids, script)
    if node.interval is not None:
        return _interval_join(left, right, node, node.interval, uids)
    on = " AND ".join(f"{a.sql} = {b.sql}" for a, b in zip(node.left_keys, node.right_keys, strict=True))
    ttl = f", state TTL {uids.ttl.ttl_ms} ms" if uids.ttl else ""
    mode = changelog_of(node)
    if mode is not None:
        return _changelog_join(left, right, node, mode, on, ttl, uids)
    batched = f", {uids.mini_batch}" if uids.mini_batch is not None else ""
    uid = uids.next(
        "join", f"{node.left_qualifier} INNER JOIN {node.right_qualifier} ON {on} (regular join{ttl}{batched})"
    )
    if left is None or right is None:
        return None
    left_key = row_key(tuple(k.evaluate for k in node.left_keys))
    right_key = row_key(tuple(k.evaluate for k in node.right_keys))
    joined = joined_row(node, uids.read_above.get(id(node)))
    if uids.mini_batch is None:
        return left.connect(right).key_by(left_key, right_key).process(RegularJoin(joined, uids.ttl), uid=uid)
    config, ttl_config = uids.mini_batch, uids.ttl
    first, second = left.key_by(left_key), right.key_by(right_key)
    return first._add(  # noqa: SLF001  # the SQL layer's own operator (as _mini_batch's), fed by both keyed sides
        WithOnError(
            lambda on_error: MiniBatchRegularJoin((left_key, right_key), joined, config, ttl_config, on_error=on_error)
        ),
        kind=OperatorKind.TWO_INPUT,
        uid=uid,
        name="join",
        parallelism=None,
        inputs=(first, second),
        key_selector=first._key_selector,  # noqa: SLF001
    )


def _changelog_join(
    left: DataStream | None, right: DataStream | None, node: Join, mode: ChangelogMode, on: str, ttl: str, uids: _Uids
) -> DataStream | None:
    """An outer join, or a join of a changelog (``weir.sql.changelog_join``): row by row, also under
    mini-batch (Flink batches it; Weir applies each change as it arrives)."""
    inputs = ", ".join(
        f"{q} {'changelog' if m is not None else 'append'}"
        for q, m in ((node.left_qualifier, node.left_mode), (node.right_qualifier, node.right_mode))
    )
    kept = sides_kept(node)
    layout = ", ".join(
        f"{q} {_layout(side)}" for q, side in zip((node.left_qualifier, node.right_qualifier), kept, strict=True)
    )
    uid = uids.next(
        "changelog-join",
        f"{node.left_qualifier} {node.kind} JOIN {node.right_qualifier} ON {on} "
        f"(regular join of {inputs}{ttl}), emits {mode}; state: {layout}",
        _layout_suffix(node, kept),
    )
    if left is None or right is None:
        return None
    left_changes, right_changes = node.left_mode is not None, node.right_mode is not None
    left_key = row_key(tuple(k.evaluate for k in node.left_keys))
    right_key = row_key(tuple(k.evaluate for k in node.right_keys))
    function = ChangelogJoin(
        joined_row(node, uids.read_above.get(id(node))),
        (dict.fromkeys(node.left_columns), dict.fromkeys(node.right_columns)),
        outer=node.outer,
        changelogs=(left_changes, right_changes),
        kept=kept,
        ttl=uids.ttl,
    )
    return (
        left.connect(right)
        .key_by(_row_of(left_key) if left_changes else left_key, _row_of(right_key) if right_changes else right_key)
        .process(function, uid=uid)
    )


def _layout_suffix(node: Join, kept: tuple[SideRows, SideRows]) -> str:
    """After a changelog join's kind in its uid: nothing when its sides are kept as an earlier Weir
    kept them (``weir.sql.join_layout_compat``: its savepoints restore as before), else the two
    layouts, ``-<left>-<right>`` (``-by-unique-key-one-row``): a savepoint of the statement taken by
    an earlier Weir, its entries kept another way, is then refused at restore (its uid is gone), not
    read wrong."""
    return layout_uid_suffix(kept) if layout_changed(node, kept) else ""


def _layout(side: SideRows) -> str:
    """How EXPLAIN says a changelog join keeps a side's rows, with Flink's name of its input spec."""
    match side.kept:
        case RowsKept.ONE_ROW:
            return "one row per join key (JoinKeyContainsUniqueKey)"
        case RowsKept.BY_UNIQUE_KEY:
            return f"rows by unique key ({', '.join(side.unique_key)}) (HasUniqueKey)"
        case RowsKept.BY_ROW:
            return "rows by whole row, counted (NoUniqueKey)"
        case _:
            assert_never(side.kept)


def _row_of(key: Callable[[Mapping[str, Any]], tuple[Any, ...]]) -> Callable[[Change], tuple[Any, ...]]:
    """A key of rows as the key of changes (by each change's row)."""

    def of(change: Change) -> tuple[Any, ...]:
        return key(change.row)

    return of


def _lookup_join(env: Environment | None, node: LookupJoin, uids: _Uids, script: str) -> DataStream | None:
    """Each input row joined with the side input's rows of its key (``weir.sql.lookup``): a flat map,
    no state, the file read by each subtask at its first lookup."""
    upstream = _node(env, node.input, uids, script)
    connector = node.table.connector
    assert isinstance(connector, FilesystemTable)
    on = " AND ".join(f"{k.sql} = {node.right_qualifier}.{c}" for k, c in zip(node.keys, node.columns, strict=True))
    uid = uids.next(
        "lookup-join",
        f"{node.left_qualifier} INNER JOIN {node.table.name} FOR SYSTEM_TIME AS OF processing time "
        f"AS {node.right_qualifier} ON {on} (lookup join: file {connector.path}, read at the first lookup)",
    )
    if upstream is None:
        return None
    joined = joined_row(node)
    lookup = LookupRows(node.table, tuple(k.evaluate for k in node.keys), node.columns, joined)
    return upstream.flat_map(lookup, uid=uid)


def _interval_join(
    left: DataStream | None, right: DataStream | None, node: Join, interval: Interval, uids: _Uids
) -> DataStream | None:
    """The job API's interval join, keyed by the ON equalities (rows whose key has a NULL are dropped
    first: SQL's ``=`` never matches NULL), each pair the joined row."""
    on = " AND ".join(f"{a.sql} = {b.sql}" for a, b in zip(node.left_keys, node.right_keys, strict=True))
    low = f"{interval.lower_ms} {'<' if interval.lower_exclusive else '<='}"
    high = f"{'<' if interval.upper_exclusive else '<='} {interval.upper_ms}"
    left_uid = uids.next("filter", f"{node.left_qualifier}: join key not NULL")
    right_uid = uids.next("filter", f"{node.right_qualifier}: join key not NULL")
    uid = uids.next(
        "interval-join",
        f"{node.left_qualifier} INNER JOIN {node.right_qualifier} ON {on}, "
        f"{low} {node.right_qualifier} time - {node.left_qualifier} time {high} ms (interval join)",
    )
    if left is None or right is None:
        return None
    left_key = row_key(tuple(k.evaluate for k in node.left_keys))
    right_key = row_key(tuple(k.evaluate for k in node.right_keys))

    joined = (
        left.filter(lambda row: None not in left_key(row), uid=left_uid)
        .key_by(left_key)
        .interval_join(right.filter(lambda row: None not in right_key(row), uid=right_uid).key_by(right_key))
        .between(interval.lower_ms, interval.upper_ms)
    )
    if interval.lower_exclusive:
        joined = joined.lower_exclusive()
    if interval.upper_exclusive:
        joined = joined.upper_exclusive()
    return joined.process(joined_row(node), uid=uid)


def _adder(call: AggregateCall) -> Callable[[Any, Any], Any]:
    """``Accumulators._add`` of ``call``, its decisions taken once: ``adder(acc, value)``."""
    if call.argument is None:  # COUNT(*)
        return lambda acc, _value: acc + 1
    if call.function == "PYTHON":  # every row, NULLs too: the function decides
        python = call.python
        return lambda acc, value: python.add(acc, *value)
    if call.distinct:  # a value seen already leaves the (immutable) set as it is: no copy
        return lambda acc, value: acc if value is None or value in acc else acc | {value}
    match call.function:
        case "COUNT":
            return lambda acc, value: acc if value is None else acc + 1
        case "SUM":
            return lambda acc, value: acc if value is None else value if acc is None else acc + value
        case "MIN":
            return lambda acc, value: acc if value is None else value if acc is None or value < acc else acc
        case "MAX":
            return lambda acc, value: acc if value is None else value if acc is None or value > acc else acc
        case "AVG":
            return _add_to_average
    return lambda acc, value: Accumulators._add(call, acc, value)  # raises for an unknown function


def _add_to_average(acc: tuple[Any, int], value: Any) -> tuple[Any, int]:
    if value is None:
        return acc
    total, count = acc
    return (value if total is None else total + value, count + 1)


class Accumulators:
    """The accumulators of an aggregate's calls, as a tuple of plain values (pickled in state):
    COUNT an int, SUM/MIN/MAX the value or None, AVG (sum, count), a DISTINCT one the frozenset of
    values seen (and its function applied to them at the end). A call's ``FILTER (WHERE ...)``
    leaves its accumulator as it is for a row whose condition is not TRUE."""

    def __init__(self, calls: tuple[AggregateCall, ...]) -> None:
        self.calls = calls
        self.arguments = tuple(c.argument.evaluate if c.argument is not None else None for c in calls)
        self.conditions = tuple(c.condition.evaluate if c.condition is not None else None for c in calls)
        self._adders = tuple(_adder(c) for c in calls)
        only = len(calls) == 1 and self.conditions[0] is None
        self._only = (self._adders[0], self.arguments[0]) if only else None  # one call, no FILTER

    def create(self) -> tuple[Any, ...]:
        return tuple(self._empty(c) for c in self.calls)

    @staticmethod
    def _empty(call: AggregateCall) -> Any:
        if call.function == "PYTHON":
            return call.python.create()
        if call.distinct:
            return frozenset()
        if call.function == "COUNT":
            return 0
        if call.function == "AVG":
            return (None, 0)
        return None

    def add(self, accs: tuple[Any, ...], row: Mapping[str, Any]) -> tuple[Any, ...]:
        only = self._only
        if only is not None:  # the common aggregate of one call: no generator, no zip
            adder, f = only
            return (adder(accs[0], None if f is None else f(row)),)
        return tuple(
            a if w is not None and w(row) is not True else adder(a, None if f is None else f(row))
            for adder, a, f, w in zip(self._adders, accs, self.arguments, self.conditions, strict=True)
        )

    def add_all(self, accs: tuple[Any, ...], rows: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
        """``add`` of each row in turn (a mini-batch), a DISTINCT call's set grown once for all of them."""
        out = []
        for c, adder, a, f, w in zip(self.calls, self._adders, accs, self.arguments, self.conditions, strict=True):
            chosen = rows if w is None else [r for r in rows if w(r) is True]
            if f is None:  # COUNT(*)
                out.append(a + len(chosen))
            elif c.distinct and c.function != "PYTHON":
                seen = {v for r in chosen if (v := f(r)) is not None}
                out.append(a if seen <= a else a | seen)
            elif c.function in ("MIN", "MAX"):  # the first extreme value, as added one by one
                values = [v for r in chosen if (v := f(r)) is not None]
                if values:
                    best = max(values) if c.function == "MAX" else min(values)
                    if a is None or (best > a if c.function == "MAX" else best < a):
                        a = best
                out.append(a)
            else:
                for r in chosen:
                    a = adder(a, f(r))
                out.append(a)
        return tuple(out)

    @staticmethod
    def _add(call: AggregateCall, acc: Any, value: Any) -> Any:
        if call.argument is None:  # COUNT(*)
            return acc + 1
        if call.function == "PYTHON":  # every row, NULLs too: the function decides
            return call.python.add(acc, *value)
        if value is None:
            return acc
        if call.distinct:  # a value seen already leaves the (immutable) set as it is: no copy
            return acc if value in acc else acc | {value}
        match call.function:
            case "COUNT":
                return acc + 1
            case "SUM":
                return value if acc is None else acc + value
            case "MIN":
                return value if acc is None or value < acc else acc
            case "MAX":
                return value if acc is None or value > acc else acc
            case "AVG":
                total, count = acc
                return (value if total is None else total + value, count + 1)
        raise AssertionError(call.function)

    def merge(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(self._merge(c, x, y) for c, x, y in zip(self.calls, a, b, strict=True))

    @staticmethod
    def _merge(call: AggregateCall, x: Any, y: Any) -> Any:
        if call.function == "PYTHON":
            return call.python.merge(x, y)
        if call.distinct:
            return x if y <= x else y if x <= y else x | y
        match call.function:
            case "COUNT":
                return x + y
            case "SUM":
                return y if x is None else x if y is None else x + y
            case "MIN":
                return y if x is None else x if y is None else min(x, y)
            case "MAX":
                return y if x is None else x if y is None else max(x, y)
            case "AVG":
                total = y[0] if x[0] is None else x[0] if y[0] is None else x[0] + y[0]
                return (total, x[1] + y[1])
        raise AssertionError(call.function)

    def results(self, accs: tuple[Any, ...]) -> dict[str, Any]:
        return {c.name: self._result(c, a) for c, a in zip(self.calls, accs, strict=True)}

    @staticmethod
    def _result(call: AggregateCall, acc: Any) -> Any:
        if call.function == "PYTHON":
            return call.python.result(acc)
        if call.distinct:
            return over_values(call.function, acc)  # the frozenset itself: len, sum, min, max read it in place
        if call.function == "AVG":
            total, count = acc
            return None if count == 0 else _average(total, count)
        return acc


class WindowAggregation:
    """The window aggregate of a TVF's GROUP BY: the job API's AggregateFunction over the rows of one
    key and window; its result the row of the keys, window_start, window_end, window_time and the
    aggregates."""

    def __init__(self, key_names: tuple[str, ...], accumulators: Accumulators) -> None:
        self.key_names, self.accumulators = key_names, accumulators

    def create(self) -> tuple[Any, ...]:
        return self.accumulators.create()

    def add(self, acc: tuple[Any, ...], row: Mapping[str, Any]) -> tuple[Any, ...]:
        return self.accumulators.add(acc, row)

    def merge(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
        return self.accumulators.merge(a, b)

    def result(self, key: tuple[Any, ...], window_start: int, window_end: int, acc: tuple[Any, ...]) -> dict[str, Any]:
        row = dict(zip(self.key_names, key, strict=True))
        row.update(window_start=window_start, window_end=window_end, window_time=window_end - 1)
        row.update(self.accumulators.results(acc))
        return row


class GroupAggregateWithTtl(KeyedProcessFunction):
    """A GROUP BY without a window under SET 'table.exec.state.ttl': each key's accumulators in a
    value state with that TTL (a key idle for the TTL starts again from nothing, as Flink's), the
    key's updated row after each input row."""

    def __init__(self, key_names: tuple[str, ...], accumulators: Accumulators, ttl: StateTtlConfig) -> None:
        self.key_names, self.accumulators, self.ttl = key_names, accumulators, ttl

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        state = ctx.value_state("accumulators", self.ttl)
        held = state.value()
        accs = self.accumulators.add(
            self.accumulators.create() if held is None else GROUP_AGGREGATE_STATE.body(held), value
        )
        state.update(GROUP_AGGREGATE_STATE.tagged(accs))
        row = dict(zip(self.key_names, ctx.key, strict=True))
        row.update(self.accumulators.results(accs))
        out.collect(row)


def _aggregate(env: Environment | None, node: Aggregate, uids: _Uids, script: str) -> DataStream | None:
    upstream = _node(env, node.input, uids, script)
    keys = tuple((k.name, k.evaluate) for k in node.keys)
    key_names = tuple(name for name, _ in keys)
    accumulators = Accumulators(node.calls)
    detail = f"GROUP BY {', '.join(k.sql for k in node.keys) or '()'}: {', '.join(c.sql for c in node.calls)}"

    key_of = row_key(tuple(f for _, f in keys))

    if node.window is not None and node.window.processing_time:  # Nexmark q12: windows of the wall clock
        window = node.window
        uid = uids.next("window-aggregate", f"TUMBLE {window.size_ms} ms of processing time, {detail}")
        if upstream is None:
            return None
        wall_clock = TumblingProcessingTimeWindows(window.size_ms)
        return upstream.key_by(key_of).window(wall_clock).aggregate(WindowAggregation(key_names, accumulators), uid=uid)
    if node.window is not None:
        window = node.window
        assigner: (
            TumblingEventTimeWindows | SlidingEventTimeWindows | CumulativeEventTimeWindows | EventTimeSessionWindows
        )
        match window.kind:
            case "TUMBLE":
                assigner = TumblingEventTimeWindows(window.size_ms)
            case "HOP":
                assigner = SlidingEventTimeWindows(window.size_ms, window.slide_ms)
            case "CUMULATE":
                assigner = CumulativeEventTimeWindows(window.size_ms, window.slide_ms)
            case "SESSION":
                assigner = EventTimeSessionWindows(window.size_ms)
            case _:
                assert_never(window.kind)
        detail = f"{window.kind} {window.size_ms} ms / {window.slide_ms} ms, {detail}"
        if uids.columnar:
            from weir.sql.columnar_window import columnar_window_aggregate  # Arrow: only when asked

            return columnar_window_aggregate(
                upstream, node, key_of, assigner, WindowAggregation(key_names, accumulators), uids.next, detail
            )
        uid = uids.next("window-aggregate", detail)
        if upstream is None:
            return None
        return upstream.key_by(key_of).window(assigner).aggregate(WindowAggregation(key_names, accumulators), uid=uid)
    mode = changelog_of(node)
    ttl = f", state TTL {uids.ttl.ttl_ms} ms" if uids.ttl is not None else ""
    batched = f", {uids.mini_batch}" if uids.mini_batch is not None else ""
    if mode is not None:  # a changelog: read by another operator, or of an updating input (retracting)
        retracts = not node.input_mode.appends
        uid = uids.next(
            "changelog-aggregate", f"{detail}, {'retracting, ' if retracts else ''}emits {mode}{ttl}{batched}"
        )
        if upstream is None:
            return None
        if uids.mini_batch is not None:
            batch = ChangelogBatch(
                key_names,
                RetractingAccumulators(node.calls) if retracts else accumulators,
                input_changelog=changelog_of(node.input) is not None,
                paired=node.pairs_updates,
            )
            by_key = (lambda change: key_of(change.row)) if retracts else key_of
            return _mini_batch(upstream, by_key, batch, uids.mini_batch, "group", uids.ttl, uid)
        function = ChangelogAggregate(
            key_names,
            RetractingAccumulators(node.calls) if retracts else accumulators,
            input_changelog=changelog_of(node.input) is not None,
            paired=node.pairs_updates,
            ttl=uids.ttl,
        )
        if retracts:
            return upstream.key_by(lambda change: key_of(change.row)).process(function, uid=uid)
        return upstream.key_by(key_of).process(function, uid=uid)
    if uids.mini_batch is not None:  # one operator: the rows of each key applied at once, its row emitted
        uid = uids.next("group-aggregate", f"{detail}{ttl}{batched}")
        if upstream is None:
            return None
        batch_rows = UpsertBatch(key_names, accumulators)
        return _mini_batch(upstream, key_of, batch_rows, uids.mini_batch, "accumulators", uids.ttl, uid)
    if uids.ttl is not None:
        uid = uids.next("group-aggregate-ttl", f"{detail}, state TTL {uids.ttl.ttl_ms} ms")
        if upstream is None:
            return None
        return upstream.key_by(key_of).process(GroupAggregateWithTtl(key_names, accumulators, uids.ttl), uid=uid)
    prepare_uid = uids.next("accumulate", "each row as its key and accumulators")
    uid = uids.next("group-aggregate", detail)
    result_uid = uids.next("aggregate-result", "the updated row of the key")
    if upstream is None:
        return None
    group = GroupReduce(key_names, key_of, accumulators)
    return (
        upstream.map(group.accumulate, uid=prepare_uid)
        .key_by(group.key)
        .reduce(group.merge, uid=uid)
        .map(group.result, uid=result_uid)
    )


class GroupReduce:
    """A GROUP BY of an append input into an upsert sink, as the job API's reduce: each row as its
    key and accumulators, merged per key, the key's row from the merged value. The value, which the
    reduce keeps as its state, is ``[1, (key, accumulators)]`` (``GROUP_AGGREGATE_STATE``; the pair
    ``(key, accumulators)`` itself before the tag, read as format 1)."""

    def __init__(
        self,
        key_names: tuple[str, ...],
        key_of: Callable[[Mapping[str, Any]], tuple[Any, ...]],
        accumulators: Accumulators,
    ) -> None:
        self.key_names, self.key_of, self.accumulators = key_names, key_of, accumulators
        self.empty = accumulators.create()

    def accumulate(self, row: Mapping[str, Any]) -> Any:
        return GROUP_AGGREGATE_STATE.tagged((self.key_of(row), self.accumulators.add(self.empty, row)))

    def key(self, value: Any) -> tuple[Any, ...]:
        key: tuple[Any, ...] = GROUP_AGGREGATE_STATE.body(value)[0]
        return key

    def merge(self, held: Any, added: Any) -> Any:
        (key, accs), (_, more) = GROUP_AGGREGATE_STATE.body(held), GROUP_AGGREGATE_STATE.body(added)
        return GROUP_AGGREGATE_STATE.tagged((key, self.accumulators.merge(accs, more)))

    def result(self, value: Any) -> dict[str, Any]:
        key, accs = GROUP_AGGREGATE_STATE.body(value)
        row = dict(zip(self.key_names, key, strict=True))
        row.update(self.accumulators.results(accs))
        return row


def _mini_batch(
    upstream: DataStream,
    key_of: Callable[[Any], tuple[Any, ...]],
    group: BatchGroup,
    config: MiniBatchConfig,
    state_name: str,
    ttl: StateTtlConfig | None,
    uid: str,
) -> DataStream:
    """The SQL layer's own keyed operator (as the job API adds its own): a GROUP BY in mini-batches."""
    keyed = upstream.key_by(key_of)
    return keyed._add(  # noqa: SLF001
        WithOnError(
            lambda on_error: MiniBatchGroupAggregate(key_of, group, config, state_name, ttl, on_error=on_error)
        ),
        uid=uid,
        name="group-aggregate",
        parallelism=None,
        key_selector=keyed._key,  # noqa: SLF001
    )


class OverAggregation(KeyedProcessFunction):
    """An OVER aggregation per partition key: each row waits in map state ``pending`` (by its time)
    for an event-time timer at its time; when the timer fires (the watermark passed it) the rows of
    that time are emitted in arrival order, each with the aggregates over its frame. ``frame`` keeps
    what the frames need: the accumulators (UNBOUNDED), the last ``preceding`` rows (ROWS) or the
    rows of the last ``preceding`` ms (RANGE, as ``(time, row)``). A row at or behind the watermark
    when it arrives is dropped (late), as Flink's."""

    def __init__(self, node: OverAggregate, accumulators: Accumulators) -> None:
        self.frame, self.preceding, self.time_column = node.frame, node.preceding, node.time_column
        self.accumulators = accumulators

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        time = value.get(self.time_column)
        timers = ctx.timer_service()
        if time is None or time <= timers.current_watermark():
            return
        pending = ctx.map_state("pending")
        rows = pending.get(time)
        pending.put(time, [*(rows or []), value])
        if rows is None:
            timers.register_event_time_timer(time)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        pending = ctx.map_state("pending")
        rows = pending.get(timestamp) or []
        pending.remove(timestamp)
        state = ctx.value_state("frame")
        held = state.value()
        acc = self.accumulators
        if self.preceding is None:  # UNBOUNDED: the accumulators of every row so far
            accs = acc.create() if held is None else held
            if self.frame == "RANGE":  # the rows of this time are all in each one's frame
                for row in rows:
                    accs = acc.add(accs, row)
            for row in rows:
                if self.frame == "ROWS":
                    accs = acc.add(accs, row)
                out.collect({**row, **acc.results(accs)})
            state.update(accs)
            return
        if self.frame == "ROWS":
            before: list[Any] = held or []
            for row in rows:
                accs = acc.create()
                for earlier in [*before[-self.preceding :], row] if self.preceding else [row]:
                    accs = acc.add(accs, earlier)
                out.collect({**row, **acc.results(accs)})
                before = [*before, row][-self.preceding :] if self.preceding else []
            state.update(before)
            return
        kept = [(t, r) for t, r in (held or []) if t >= timestamp - self.preceding] + [(timestamp, r) for r in rows]
        accs = acc.create()
        for _t, row in kept:
            accs = acc.add(accs, row)
        results = acc.results(accs)
        for row in rows:
            out.collect({**row, **results})
        state.update(kept)


def _over(env: Environment | None, node: OverAggregate, uids: _Uids, script: str) -> DataStream | None:
    upstream = _node(env, node.input, uids, script)
    preceding = "UNBOUNDED" if node.preceding is None else f"{node.preceding}{' ms' if node.frame == 'RANGE' else ''}"
    partition = ", ".join(p.sql for p in node.partition)
    detail = f"{', '.join(c.sql for c in node.calls)}: PARTITION BY {partition or '()'}, {node.frame} {preceding}"
    uid = uids.next("over-aggregate", detail)
    if upstream is None:
        return None
    key_of = row_key(tuple(p.evaluate for p in node.partition))
    return upstream.key_by(key_of).process(OverAggregation(node, Accumulators(node.calls)), uid=uid)


def _kafka_value(
    encoder: Callable[[Mapping[str, Any]], bytes], keeps_update_before: bool
) -> Callable[[Change], bytes | None]:
    """An upsert-kafka sink's record value of a change (weir.sql.upsert.sink_write): the row's JSON, or
    None, a tombstone (the sink writes the key with a null value), for a delete."""

    def value(change: Change) -> bytes | None:
        write = sink_write(change.kind, keeps_update_before=keeps_update_before)
        match write:
            case SinkWrite.UPSERT:
                return encoder(change.row)
            case SinkWrite.DELETE:
                return None
            case SinkWrite.NOTHING:
                raise AssertionError("a change the sink does not write is dropped before it")
            case _:
                assert_never(write)

    return value


def _written(
    table: Table, encoder: RowEncoder, keeps_update_before: bool
) -> Callable[[Change], tuple[Any, ...] | Delete]:
    """A PostgreSQL sink's write of a change (weir.sql.upsert.sink_write): the row to upsert, or the
    Delete of its key."""

    def write(change: Change) -> tuple[Any, ...] | Delete:
        action = sink_write(change.kind, keeps_update_before=keeps_update_before)
        match action:
            case SinkWrite.UPSERT:
                return encoder.values(change.row)
            case SinkWrite.DELETE:
                return Delete(_key_values(table)(change.row))
            case SinkWrite.NOTHING:
                raise AssertionError("a change the sink does not write is dropped before it")
            case _:
                assert_never(action)

    return write


def _sink(env: Environment | None, stream: DataStream | None, sink: Sink, uids: _Uids) -> None:
    table = sink.table
    encoder = RowEncoder(table)
    connector = table.connector
    if changelog_of(sink.input) is not None:
        _changelog_sink(env, stream, sink, encoder, uids)
        return
    match connector:
        case KafkaTable():
            kind = "upsert-kafka" if connector.upsert else "kafka"
            words = _layout_words(table) + (", debezium-json" if connector.debezium is not None else "")
            uid = uids.next("sink", f"{kind} topic {connector.topic} ({table.name}{words}), {connector.delivery}")
            if env is None or stream is None:
                return
            record = KafkaRecordEncoder(table)
            stream.sink_to_kafka(
                connector.topic,
                uid=uid,
                serializer=record.value if connector.debezium is None else _debezium_encoder(encoder).appended,
                key=record.key if record.has_key else None,
                delivery="exactly_once" if connector.delivery == "exactly-once" else "at_least_once",
                properties=KEYED_PARTITIONER if record.has_key else None,
            )
        case JdbcTable():
            uid = uids.next("sink", f"postgresql table {connector.table_name} ({table.name}), upsert, two-phase")
            if env is None or stream is None:
                return
            columns = tuple(c.name for c in table.columns)
            keyed = stream.key_by(_key_values(table))  # one key's rows reach one sink subtask
            keyed.sink_to_postgres(
                connector.table_name,
                uid=uid,
                columns=columns,
                key_columns=table.primary_key,
                row=encoder.values,
            )
        case PrintTable():
            uid = uids.next("sink", f"print ({table.name})")
            if env is None or stream is None:
                return
            stream.sink_to(PrintSink(prefix=connector.prefix), uid=uid)
        case DatagenTable() | NexmarkTable() | PostgresCdcTable():
            raise SqlError(f"table {table.name}: its connector is a source; it cannot be written")
        case FilesystemTable():
            folders = f", a folder per {', '.join(table.partition_by)}" if table.partition_by else ""
            commit = connector.partition_commit
            if commit is not None and table.partition_by:
                folders += f", {commit.success_file} once committed ({commit.trigger}, delay {commit.delay_ms} ms)"
            uid = uids.next(
                "sink", f"filesystem {connector.path} ({table.name}), csv part files{folders}, exactly-once"
            )
            if env is None or stream is None:
                return
            options: dict[str, Any] = {}
            if connector.rollover_ms is not None:
                options["rollover_interval"] = connector.rollover_ms
            files = PartFileSink(
                connector.path.rstrip("/") or "/",
                "csv",
                bucket_assigner=PartitionFolder(table),
                serializer=CsvLine(table),
                partition_commit=partition_commit(table),
                **options,
            )
            stream.sink_to(files, uid=uid)
        case _:
            assert_never(connector)


def _changelog_sink(
    env: Environment | None, stream: DataStream | None, sink: Sink, encoder: RowEncoder, uids: _Uids
) -> None:
    """A changelog into an upsert sink (the planner refuses an append one), each change written as
    weir.sql.upsert.sink_write decides: +I/+U upserted, -D deleted (upsert-kafka: a tombstone), a -U
    deleted when the plan keeps it (``Sink.keeps_update_before``) and dropped otherwise."""
    table, kept = sink.table, sink.keeps_update_before
    connector = table.connector
    dropped = "-U delete their key" if kept else "-U dropped"
    if sink.materializer is not None:  # the planner puts one before an upsert sink only
        stream = _materialized(stream, sink, sink.materializer, uids)

    def written(change: Change) -> bool:
        return sink_write(change.kind, keeps_update_before=kept) is not SinkWrite.NOTHING

    match connector:
        case KafkaTable() if connector.debezium is not None:
            uid = uids.next(
                "sink",
                f"kafka topic {connector.topic} ({table.name}), debezium-json: each change, {connector.delivery}",
            )
            if env is None or stream is None:
                return
            stream.sink_to_kafka(
                connector.topic,
                uid=uid,
                serializer=_debezium_encoder(encoder).change,
                delivery="exactly_once" if connector.delivery == "exactly-once" else "at_least_once",
            )
        case KafkaTable():
            upserts_uid = uids.next("upserts", f"the changelog's +I/+U rows and -D tombstones ({dropped})")
            words = _layout_words(table)
            uid = uids.next("sink", f"upsert-kafka topic {connector.topic} ({table.name}{words}), {connector.delivery}")
            if env is None or stream is None:
                return
            record = KafkaRecordEncoder(table)
            key = record.key
            stream.filter(written, uid=upserts_uid).sink_to_kafka(
                connector.topic,
                uid=uid,
                serializer=_kafka_value(record.value, kept),
                key=lambda change: key(change.row),
                delivery="exactly_once" if connector.delivery == "exactly-once" else "at_least_once",
                properties=KEYED_PARTITIONER,
            )
        case JdbcTable():
            writes_uid = uids.next("writes", f"the changelog's +I/+U/-D ({dropped})")
            uid = uids.next("sink", f"postgresql table {connector.table_name} ({table.name}), upsert, two-phase")
            if env is None or stream is None:
                return
            writes = stream.filter(written, uid=writes_uid)
            writes.key_by(lambda change: _key_values(table)(change.row)).sink_to_postgres(
                connector.table_name,
                uid=uid,
                columns=tuple(c.name for c in table.columns),
                key_columns=table.primary_key,
                row=_written(table, encoder, kept),
            )
        case PrintTable() | DatagenTable() | NexmarkTable() | PostgresCdcTable() | FilesystemTable():
            raise SqlError(f"table {table.name}: a changelog needs an upsert sink ('upsert-kafka' or 'jdbc')")
        case _:
            assert_never(connector)


def _debezium_encoder(encoder: RowEncoder) -> DebeziumEncoder:
    """Flink's debezium-json serializer's bytes: the row's object its columns in the table's order."""

    def row(values: Mapping[str, Any]) -> bytes:
        return json_codec.encode_in_order(encoder.json(values))

    return DebeziumEncoder(row)


def _materialized(stream: DataStream | None, sink: Sink, materializer: Materializer, uids: _Uids) -> DataStream | None:
    """The changelog through Flink's SinkUpsertMaterializer (``weir.sql.materialize``), keyed by the
    sink's primary key: what the sink must hold of each key, ``+I``/``+U`` of its last row or ``-D``.
    Its uid, ``<statement prefix>-upsert-materializer``, takes no place in the statement's numbering:
    the other operators keep their uids whether the planner adds it or not."""
    table = sink.table
    compared = (
        "whole rows" if materializer.upsert_key is None else f"the upsert key ({', '.join(materializer.upsert_key)})"
    )
    ttl = f", state TTL {uids.ttl.ttl_ms} ms" if uids.ttl else ""
    uid = f"{uids.prefix}-upsert-materializer"
    uids.out.append(
        Operator(
            uid,
            "sink-upsert-materializer",
            f"the rows of each {table.name} key ({', '.join(table.primary_key)}) in order of arrival, retracted by "
            f"{compared}{ttl}; emits [+I, +U, -D]",
        )
    )
    if stream is None:
        return None
    return stream.key_by(_change_key(table)).process(SinkUpsertMaterializer(materializer.upsert_key, uids.ttl), uid=uid)


def _change_key(table: Table) -> Callable[[Change], tuple[Any, ...]]:
    def key(change: Change) -> tuple[Any, ...]:
        return tuple(change.row[k] for k in table.primary_key)

    return key


def _key_values(table: Table) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in table.primary_key)

    return key


__all__ = [
    "KEYED_PARTITIONER",
    "KafkaRecordEncoder",
    "KafkaRows",
    "Operator",
    "RowDecoder",
    "RowEncoder",
    "compile_insert",
    "compile_query",
    "source_uid",
    "statement_digest",
]
