"""The logical plan of one ``INSERT INTO ... SELECT``: frozen operator values, from the scan of a
catalog table to the sink, each with the scope of columns it emits. ``plan_insert`` builds it from
sqlglot's tree, refusing (with the position) every construct it does not plan; ``weir.sql.compile``
turns it into job API calls."""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, Final, Literal, assert_never

from sqlglot import exp

from weir.sql import functions
from weir.sql.catalog import FilesystemTable, JdbcTable, KafkaTable, Table
from weir.sql.cdc import is_changelog_source, is_debezium, projection_refusal
from weir.sql.changelog import APPEND, RETRACT, WITH_DELETES, ChangelogMode, aggregation_mode
from weir.sql.errors import Position, SqlError
from weir.sql.expressions import Evaluate, Locate, Scope, compile_expression, interval_ms, normalized
from weir.sql.script import PARTITION_MARK, CreateView, Insert
from weir.sql.types import Kind, SqlType, coerce

WINDOW_COLUMNS: Final = ("window_start", "window_end", "window_time")
TIMESTAMP: Final = SqlType(Kind.TIMESTAMP, "TIMESTAMP(3)")
BIGINT: Final = SqlType(Kind.INTEGER, "BIGINT")


@dataclass(frozen=True)
class NamedExpression:
    name: str
    sql: str
    evaluate: Evaluate = field(compare=False, repr=False)


@dataclass(frozen=True)
class Scan:
    table: Table


@dataclass(frozen=True)
class WindowTvf:
    """``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), size))`` or ``HOP(..., slide, size)``: rows of ``t`` (a
    table or a view) each in its windows, over the event time of ``ts`` (the WATERMARK column, or a
    view's column passing it through)."""

    input: Node
    kind: Literal["TUMBLE", "HOP", "CUMULATE", "SESSION"]  # SESSION: size_ms its gap
    # CUMULATE: windows of size_ms, each also as its prefixes growing by slide_ms (the step)
    time_column: str
    size_ms: int
    slide_ms: int
    partition: tuple[str, ...] = ()  # the SESSION TVF's PARTITION BY columns (a group window's: none)
    processing_time: bool = False  # GROUP BY TUMBLE(p_time, size) of a PROCTIME() column: wall-clock windows


@dataclass(frozen=True)
class Filter:
    input: Node
    condition: NamedExpression


@dataclass(frozen=True)
class Project:
    input: Node
    outputs: tuple[NamedExpression, ...]


AggregateName = Literal["COUNT", "SUM", "MIN", "MAX", "AVG", "PYTHON"]  # PYTHON: a registered function


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate: ``COUNT(*)`` has no argument; ``condition`` is its ``FILTER (WHERE ...)``: a row
    whose condition is not TRUE is not aggregated by this call."""

    name: str  # the column holding its value downstream
    function: AggregateName
    distinct: bool
    argument: NamedExpression | None  # PYTHON: the tuple of the call's argument values
    sql: str
    python: Any = field(default=None, compare=False)  # PYTHON: the aggregate function object
    condition: NamedExpression | None = None


@dataclass(frozen=True)
class Aggregate:
    """``GROUP BY keys``: over a window TVF, one final row per key and window when the watermark
    passes its end (append); otherwise an updated row per key after each input row (updating).
    ``input_mode``: the input's changelog (not append: the aggregates retract, ``weir.sql.retract``);
    ``emits_changelog``: the result is read by another operator, as a changelog (-U/+U rows);
    ``holds_input_key``: each key is a column of the input changelog's own GROUP BY keys, so an
    input -U and its +U reach the same key (a key emptied by a -U is not deleted: its +U follows)."""

    input: Node
    keys: tuple[NamedExpression, ...]
    calls: tuple[AggregateCall, ...]
    window: WindowTvf | None
    input_mode: ChangelogMode = APPEND
    emits_changelog: bool = False
    holds_input_key: bool = False

    @property
    def pairs_updates(self) -> bool:
        """An input -U's +U reaches the same key: the input appends, or each key is of its key."""
        return self.input_mode.appends or self.holds_input_key


JoinKind = Literal["INNER", "LEFT", "RIGHT", "FULL"]


@dataclass(frozen=True)
class Join:
    """``left [INNER | LEFT | RIGHT | FULL] JOIN right ON left.k = right.k [AND ...]``: a regular
    equi-join, every row of each side kept in state (Flink's regular join, without a state TTL), a
    joined row emitted for each match as the later of the two arrives. The joined row holds every
    column as ``alias.column``, and as ``column`` where only one side has it; conditions of ON other
    than the key equalities filter the joined rows (an inner join's only). An inner join of two
    append inputs appends (``weir.sql.join``); an outer join, or a join of a changelog (``left_mode``
    / ``right_mode``: the inputs' changelogs, None for plain rows), is a changelog
    (``weir.sql.changelog_join``, Flink's StreamingJoinOperator)."""

    left: Node
    right: Node
    left_keys: tuple[NamedExpression, ...]
    right_keys: tuple[NamedExpression, ...]
    left_qualifier: str
    right_qualifier: str
    left_columns: tuple[str, ...]
    right_columns: tuple[str, ...]
    interval: Interval | None = None  # an interval join: the bounds of the two sides' event times
    kind: JoinKind = "INNER"
    left_mode: ChangelogMode | None = None
    right_mode: ChangelogMode | None = None

    @property
    def outer(self) -> tuple[bool, bool]:
        """Whether the left and the right side are outer: their rows without a match are in the result."""
        return (self.kind in ("LEFT", "FULL"), self.kind in ("RIGHT", "FULL"))

    @property
    def emits_changelog(self) -> bool:
        return self.kind != "INNER" or self.left_mode is not None or self.right_mode is not None


def join_mode(join: Join) -> ChangelogMode | None:
    """A regular join's changelog (None: it appends): an inner join's changes keep their inputs'
    kinds; an outer join also retracts its rows padded with NULLs (-D)."""
    if join.interval is not None or not join.emits_changelog:
        return None
    if join.kind != "INNER":
        return WITH_DELETES
    kinds = frozenset().union(*(m.kinds for m in (join.left_mode, join.right_mode, APPEND) if m is not None))
    return ChangelogMode(kinds)


@dataclass(frozen=True)
class LookupJoin:
    """``input [INNER] JOIN t FOR SYSTEM_TIME AS OF input.proc_time AS alias ON expr = alias.column
    [AND ...]`` (Flink's processing-time lookup join): each input row, as it arrives, joined with the
    rows of the lookup table ``t`` (a 'filesystem' file, ``weir.sql.lookup``) whose ``columns`` equal
    its ``keys``; no state. The joined row holds every column as ``alias.column``, and as ``column``
    where only one side has it, as a regular join's; the ON's other conditions filter it."""

    input: Node
    table: Table
    keys: tuple[NamedExpression, ...]
    columns: tuple[str, ...]
    left_qualifier: str
    right_qualifier: str
    left_columns: tuple[str, ...]
    right_columns: tuple[str, ...]


@dataclass(frozen=True)
class Interval:
    """An interval join's bounds (Flink's interval join): a left row at event time ``t`` joins the
    right rows of its key at ``[t + lower_ms, t + upper_ms]`` (either end exclusive), each row
    joined as the later of the two arrives and its state dropped once the watermark passes what it
    could still match."""

    lower_ms: int
    upper_ms: int
    lower_exclusive: bool
    upper_exclusive: bool


@enum.unique
class UpsertMaterialize(enum.Enum):
    """``SET 'table.exec.sink.upsert-materialize'`` (Flink's option and names): whether an upsert
    sink's input goes through a :class:`Materializer`. ``AUTO`` (the default): when the sink's
    primary key holds none of the input changelog's upsert keys (``upsert_keys``); ``FORCE``: for
    every changelog into a sink with a primary key; ``NONE``: never (each change written as it
    comes, wrong where two rows of the result share a sink key, as Flink's)."""

    NONE = "NONE"
    AUTO = "AUTO"
    FORCE = "FORCE"


@dataclass(frozen=True)
class Materializer:
    """Flink's SinkUpsertMaterializer before an upsert sink (``weir.sql.materialize``): keyed by the
    sink's primary key, the rows of each key in order of arrival; ``upsert_key``: the sink columns of
    the input's smallest upsert key, by which a row replaces and is retracted (None: whole rows)."""

    upsert_key: tuple[str, ...] | None


@dataclass(frozen=True)
class Sink:
    """``keeps_update_before``: the input is a changelog whose -U may lack a +U of the same sink key
    (a WHERE/HAVING between its producer and the sink, or a sink key other than the result's), so
    the sink deletes a -U's key (``weir.sql.upsert.sink_write``); otherwise a -U is dropped.
    ``materializer``: the changelog goes through a :class:`Materializer` first (it writes no -U)."""

    input: Node
    table: Table
    updating: bool
    keeps_update_before: bool = False
    materializer: Materializer | None = None


@dataclass(frozen=True)
class OrderKey:
    """One ``ORDER BY`` item of a ranking: its value, descending or not, where NULL sorts."""

    value: NamedExpression
    descending: bool
    nulls_first: bool


@dataclass(frozen=True)
class TopN:
    """Window Top-N: ``ROW_NUMBER() OVER (PARTITION BY window_start, window_end [, k] ORDER BY ...)``
    over a window aggregation's result, filtered by ``rownum <= limit``: the first ``limit`` rows of
    each partition of each window, each with its row number in ``rank``, emitted once, when the
    watermark passes the window's end (an append result). Rows whose ORDER BY values tie are ordered
    by their values (Flink leaves that order undefined)."""

    input: Node
    partition: tuple[NamedExpression, ...]
    order: tuple[OrderKey, ...]
    limit: int
    rank: str
    slide_ms: int | None  # the input's rows of one window are those of a tumbling window of the slide
    # None: a Top-N without a window (weir.sql.ranking), its result a changelog keyed by the partition
    # and the row number
    input_mode: ChangelogMode | None = None  # an updating input's changelog (a GROUP BY's): it retracts


@dataclass(frozen=True)
class OverAggregate:
    """``agg OVER (PARTITION BY keys ORDER BY ts {ROWS|RANGE} BETWEEN p PRECEDING AND CURRENT ROW)``:
    every input row, once the watermark passes its time, with each aggregate over its frame: the
    partition's rows up to it in event-time order, ``preceding`` rows before it (ROWS) or those at
    most ``preceding`` ms before its time (RANGE, rows of the same time all in), all of them when
    ``preceding`` is None (UNBOUNDED). A row behind the watermark when it arrives is dropped (late)."""

    input: Node
    partition: tuple[NamedExpression, ...]
    time_column: str
    frame: Literal["ROWS", "RANGE"]
    preceding: int | None
    calls: tuple[AggregateCall, ...]


Node = Scan | WindowTvf | Filter | Project | Aggregate | Join | LookupJoin | TopN | OverAggregate


def changelog_of(node: Node) -> ChangelogMode | None:
    """The changelog a node's output is (its elements ``weir.sql.changelog.Change`` values), or None
    for plain rows: an append result, or a GROUP BY's updated rows written straight to an upsert sink."""
    match node:
        case Scan():  # a 'postgres-cdc' or 'upsert-kafka' table is a changelog (weir.sql.cdc, weir.sql.upsert)
            return WITH_DELETES if is_changelog_source(node.table) else None
        case Join():
            return join_mode(node)
        case WindowTvf() | LookupJoin() | OverAggregate():
            return None
        case TopN():
            if node.slide_ms is not None:
                return None
            return RETRACT if node.input_mode is None else WITH_DELETES
        case Filter() | Project():
            return changelog_of(node.input)
        case Aggregate():
            if node.window is not None:
                return None
            if node.emits_changelog or not node.input_mode.appends:
                return aggregation_mode(node.input_mode, paired=node.pairs_updates)
            return None
        case _:
            assert_never(node)


@dataclass(frozen=True)
class InsertPlan:
    statement: Insert
    sink: Sink


_AGGREGATES: Final[dict[type[exp.Expr], AggregateName]] = {
    exp.Count: "COUNT",
    exp.Sum: "SUM",
    exp.Min: "MIN",
    exp.Max: "MAX",
    exp.Avg: "AVG",
}


@dataclass(frozen=True)
class Catalog:
    """The script's tables and views so far (a statement sees those created before it)."""

    tables: Mapping[str, Table]
    views: Mapping[str, CreateView]


@dataclass(frozen=True)
class Relation:
    """What a FROM item gives a SELECT: its plan, the columns it emits, and its event-time column."""

    node: Node
    scope: Scope
    time_column: str | None
    windowed: WindowedColumns | None = None
    proctime: str | None = None  # the column holding PROCTIME(): a lookup join's FOR SYSTEM_TIME AS OF


@dataclass(frozen=True)
class WindowedColumns:
    """A window aggregation's result as its readers see it: the columns holding its ``window_start``
    and ``window_end`` (each row stamped with the window's last millisecond), and the windows' slide.
    A GROUP BY of both columns is again a window aggregation, of the same windows (Flink's window
    propagation): a tumbling window of the slide holds exactly the rows of one window."""

    start: str
    end: str
    slide_ms: int


@dataclass(frozen=True)
class QueryPlan:
    """A SELECT whose rows a Python job reads as a stream (``weir.sql.query``)."""

    node: Project
    updating: bool


def plan_query(query: exp.Query, offset: int, catalog: Catalog, script: str) -> QueryPlan:
    locate = Locate(script, offset)
    if not isinstance(query, exp.Select):
        raise locate.refuse(query, f"{type(query).__name__.upper()} is not supported (one SELECT is)")
    planned = _plan_select(query, catalog, locate)
    if changelog_of(planned.node) is not None:
        raise locate.refuse(
            query,
            "a query whose result is a changelog (an aggregation of an updating result, a Top-N without a window) "
            "is not supported: INSERT it into an upsert sink",
        )
    return QueryPlan(planned.node, planned.updating)


def plan_insert(
    insert: Insert, catalog: Catalog, script: str, materialize: UpsertMaterialize = UpsertMaterialize.AUTO
) -> InsertPlan:
    """``materialize``: ``SET 'table.exec.sink.upsert-materialize'`` before the statement."""
    locate = Locate(script, insert.offset)
    tables = catalog.tables
    sink_table = tables.get(insert.sink)
    if sink_table is None:
        raise SqlError(f"INSERT INTO {insert.sink}: no such table (CREATE TABLE it first)", insert.position)
    if sink_table.computed:
        raise SqlError(
            f"INSERT INTO {insert.sink}: a sink table with computed columns is not supported", insert.position
        )
    query = insert.query
    if not isinstance(query, exp.Select):
        raise locate.refuse(query, f"{type(query).__name__.upper()} is not supported (one SELECT is)")
    planned = _plan_select(query, catalog, locate)
    node, updating, outputs = planned.node, planned.updating, planned.outputs
    if len(outputs) != len(sink_table.columns):
        raise locate.refuse(
            query,
            f"INSERT INTO {insert.sink}: the SELECT gives {len(outputs)} columns, the table has "
            f"{len(sink_table.columns)} ({', '.join(c.name for c in sink_table.columns)})",
        )
    own_key = True  # the sink's key is the result's own: each -U's +U has the same sink key
    # a 'debezium-json' sink writes every change as it comes (Flink's: its changelog mode takes all
    # four kinds, so no -U is dropped and no materializer is put before it, whatever its key)
    changelog_sink = is_debezium(sink_table)
    if changelog_sink:
        _check_debezium_sink(sink_table, insert)
    scanned = _changelog_scan(node)
    sink_names = [c.name for c in sink_table.columns]
    keys = {frozenset(sink_names[i] for i in key) for key in _positions(node)}
    primary_key = frozenset(sink_table.primary_key)
    materializer = None
    if updating or scanned is not None or _changelog_join(node.input) is not None:
        _check_upserts(sink_table, node, scanned, locate, query)
        if (
            primary_key
            and not changelog_sink
            and (
                materialize is UpsertMaterialize.FORCE
                or (materialize is UpsertMaterialize.AUTO and not any(key <= primary_key for key in keys))
            )
        ):
            smallest = min(keys, key=lambda key: (len(key), sorted(sink_names.index(c) for c in key)), default=None)
            materializer = Materializer(None if smallest is None else tuple(c for c in sink_names if c in smallest))
    if updating:
        own_key = primary_key in keys
        if changelog_sink or not own_key or materializer is not None:  # the aggregate's -U delete the old
            node = _emitting_changelog(node)  # sink rows, leave the materializer's rows of the key, or are written
    elif scanned is not None:
        own_key = primary_key in keys
    elif isinstance(node.input, TopN) and node.input.slide_ms is None:
        if not changelog_sink:
            _check_ranked_sink(sink_table, node.input, outputs, locate, query)
        if materialize is UpsertMaterialize.FORCE and primary_key and not changelog_sink:
            materializer = Materializer(None)
    elif _changelog_join(node.input) is not None:
        own_key = False  # a joined row's -U and its +U may be at two sink keys: the -U deletes its key
    assert isinstance(node, Project)
    keeps_update_before = changelog_of(node) is not None and (
        changelog_sink or not own_key or _filtered_changelog(node)
    )
    if materializer is not None:
        keeps_update_before = False  # the materializer writes +I/+U of a key's last row or -D of the key
    # INSERT fills the sink's columns by position: the last projection names its values as the sink's
    # columns, each converted to the column's type (CAST's rules: a value that does not convert fails)
    renamed = tuple(
        NamedExpression(column.name, output.sql, _converted(output.evaluate, column.type.kind))
        for output, column in zip(outputs, sink_table.columns, strict=True)
    )
    sink = Sink(Project(node.input, renamed), sink_table, updating, keeps_update_before, materializer)
    return InsertPlan(insert, sink)


def _positions(node: Project) -> frozenset[frozenset[int]]:
    """The upsert keys of a SELECT's result (:func:`upsert_keys`) as sets of its outputs' positions."""
    names = [o.name for o in node.outputs]
    return frozenset(frozenset(names.index(c) for c in key) for key in upsert_keys(node))


def _changelog_join(node: Node) -> Join | None:
    """The regular join emitting a changelog that a WHERE (or its ON's other conditions) reads directly."""
    while isinstance(node, Filter):
        node = node.input
    return node if isinstance(node, Join) and join_mode(node) is not None else None


def _changelog_scan(node: Node) -> Scan | None:
    """The changelog source a projection (and WHERE) reads directly, if it does."""
    while isinstance(node, Project | Filter):
        node = node.input
    return node if isinstance(node, Scan) and is_changelog_source(node.table) else None


def _filtered_changelog(node: Node) -> bool:
    """Whether a WHERE or HAVING filters the changelog between its producer and the sink: it may pass a
    -U and drop its +U (Flink applies a filter to each change on its own), so the -U must delete."""
    while isinstance(node, Project | Filter):
        if isinstance(node, Filter):
            return True
        node = node.input
    return False


def _emitting_changelog(node: Project) -> Project:
    """The updating result with its aggregate emitting a changelog (-U/+U), not updated rows."""
    inner = node.input
    if isinstance(inner, Aggregate):
        return dataclasses.replace(node, input=dataclasses.replace(inner, emits_changelog=True))
    assert isinstance(inner, Filter) and isinstance(inner.input, Aggregate), inner
    aggregate = dataclasses.replace(inner.input, emits_changelog=True)
    return dataclasses.replace(node, input=dataclasses.replace(inner, input=aggregate))


def _converted(evaluate: Evaluate, kind: Kind) -> Evaluate:
    def convert(row: Mapping[str, Any]) -> Any:
        return coerce(evaluate(row), kind)

    return convert


def _check_debezium_sink(table: Table, insert: Insert) -> None:
    """Flink's debezium-json serializer writes no schema: refused as Flink's format factory words it."""
    connector = table.connector
    assert isinstance(connector, KafkaTable) and connector.debezium is not None
    if connector.debezium.schema_include:
        raise SqlError(
            f"INSERT INTO {table.name}: Debezium JSON serialization doesn't support "
            "'debezium-json.schema-include' option been set to true.",
            insert.position,
        )


def _check_upserts(table: Table, node: Project, scanned: Scan | None, locate: Locate, query: exp.Select) -> None:
    """An updating result (a GROUP BY without a window, a projection of a changelog source, an outer
    join or a join of an updating result) needs a sink that upserts and deletes by its key, or a
    'debezium-json' one, which writes each change."""
    upserts = isinstance(table.connector, JdbcTable) or (
        isinstance(table.connector, KafkaTable) and table.connector.upsert
    )
    if upserts or is_debezium(table):
        return
    refusal = None if scanned is None else projection_refusal(scanned.table, table, query)
    if refusal is not None:
        raise locate.refuse(*refusal)
    what = (
        "GROUP BY without a window"
        if _changelog_join(node.input) is None
        else "an outer join, or a join of an updating result,"
    )
    raise locate.refuse(
        query,
        f"INSERT INTO {table.name}: {what} gives updating results; the sink must be "
        "'upsert-kafka' or 'jdbc' with a PRIMARY KEY, or 'kafka' of 'debezium-json' (its connector appends)",
    )


# -- upsert keys (Flink's FlinkRelMdUpsertKeys) --------------------------------------------------------

Key = tuple[str, ...]
"""One upsert key of a node's rows: names of columns as the node's rows hold them (each row's own
names, in their own case: a table's declared columns, a projection's output names, a GROUP BY's key
names, a regular join's ``qualifier.column``, a Top-N's input columns and its row number), in the
key's own order (the PRIMARY KEY's, the GROUP BY's; a join's: its left key's columns, then its
right key's). Names are matched to SQL text (a projection's outputs, a join's ON, a Top-N's
PARTITION BY) case-insensitively, as SQL's identifiers are."""


def upsert_keys(node: Node) -> tuple[Key, ...]:
    """The upsert keys of ``node``'s rows (Flink's ``FlinkRelMdUpsertKeys``), the one derivation the
    planner has: column sets whose values identify one row among those the node holds at any time,
    each of whose changes (of one key's value) comes through one path, in order. Empty: none known.
    Two things are decided by them: how a changelog join keeps a side's rows
    (``weir.sql.changelog_join.sides_kept``, Flink's ``JoinInputSideSpec``), and whether an upsert
    sink gets a :class:`Materializer` (``plan_insert``, Flink's SinkUpsertMaterializer).

    - a scan: a changelog source's ('upsert-kafka', 'postgres-cdc') primary key; an append table
      has none (its rows may repeat, whatever key it declares);
    - a WHERE: its input's;
    - a projection: each of its input's keys whose every column an output passes through as it is
      (the first output of each, by its name; a key with a column dropped or computed is lost);
    - a GROUP BY without a window: its keys (without keys, the empty key: one row); a window
      aggregate's result appends, none;
    - a regular join: as Flink's ``getJoinUpsertKeys`` (:func:`_join_keys`); an interval join
      appends, none;
    - a Top-N without a window: its PARTITION BY columns with the row number, and the PARTITION BY
      columns alone when N = 1 (deduplication); a PARTITION BY of an expression, none; a window
      Top-N appends, none;
    - a window TVF, a lookup join, an OVER aggregate: append results, none.

    The keys come in a stable order (a node's own first, then a side's); none repeats."""
    match node:
        case Scan():
            if not is_changelog_source(node.table) or not node.table.primary_key:
                return ()
            return (tuple(node.table.primary_key),)
        case Filter():
            return upsert_keys(node.input)
        case Aggregate():
            return () if node.window is not None else (tuple(k.name for k in node.keys),)
        case Project():
            return _projected_keys(node)
        case Join():
            return _join_keys(node) if node.interval is None else ()
        case TopN():
            return _ranked_keys(node) if node.slide_ms is None else ()
        case WindowTvf() | LookupJoin() | OverAggregate():
            return ()
        case _:
            assert_never(node)


def _distinct(keys: list[Key]) -> tuple[Key, ...]:
    """``keys`` in order, each set of columns once (the first spelling of it)."""
    seen: set[frozenset[str]] = set()
    out: list[Key] = []
    for key in keys:
        if frozenset(key) not in seen:
            seen.add(frozenset(key))
            out.append(key)
    return tuple(out)


def _projected_keys(node: Project) -> tuple[Key, ...]:
    """The input's keys whose every column an output passes through (the first output of each),
    named as the outputs are."""
    below: Node = node.input
    while isinstance(below, Filter):
        below = below.input
    passed: dict[str, str] = {}  # input column, case-folded -> the output's name
    for output in node.outputs:
        column = _referenced(output, below)
        if column is not None:
            passed.setdefault(column, output.name)
    kept = [
        tuple(passed[c.casefold()] for c in key)
        for key in upsert_keys(node.input)
        if all(c.casefold() in passed for c in key)
    ]
    return _distinct(kept)


def _referenced(output: NamedExpression, below: Node) -> str | None:
    """The column of ``below``'s rows an output passes through as it is (case-folded), or None."""
    text = _bare(output.sql)
    match below:
        case Aggregate():
            return next((k.name.casefold() for k in below.keys if _bare(k.sql) == text), None)
        case Join():
            qualifier, _, column = text.rpartition(".")
            left = {c.casefold() for c in below.left_columns}
            right = {c.casefold() for c in below.right_columns}
            if qualifier == below.left_qualifier.casefold() and column in left:
                return f"{qualifier}.{column}"
            if qualifier == below.right_qualifier.casefold() and column in right:
                return f"{qualifier}.{column}"
            if not qualifier and (column in left) != (column in right):
                side = below.left_qualifier if column in left else below.right_qualifier
                return f"{side.casefold()}.{column}"
            return None
        case _:
            column = text.rpartition(".")[2]
            return column if column.replace("_", "").isalnum() else None


def _join_keys(join: Join) -> tuple[Key, ...]:
    """A regular join's upsert keys (Flink's ``getJoinUpsertKeys`` and ``getJoinUniqueKeys``), as
    joined-row columns ``qualifier.column``: of each side's keys, those holding its join key columns
    (its changes of one key meet in one subtask; the others may cross between two); a left key with
    a right one; a side's keys alone when the other side's join key columns hold one of the other
    side's keys (at most one match) and the join does not pad the side with NULLs (a LEFT JOIN's
    left side, a RIGHT JOIN's right). A side's key of a column the joined row does not name by the
    side's columns (a qualified column of a join below) is not carried."""

    def side(
        node: Node, on: tuple[NamedExpression, ...], qualifier: str, columns: tuple[str, ...]
    ) -> tuple[list[Key], bool]:
        joined = {_bare(k.sql) for k in on}
        named = {c.casefold(): c for c in columns}
        keys = upsert_keys(node)
        kept = [
            tuple(f"{qualifier}.{named[c.casefold()]}" for c in key)
            for key in keys
            if joined <= {c.casefold() for c in key} and all(c.casefold() in named for c in key)
        ]
        return kept, any({c.casefold() for c in key} <= joined for key in keys)

    left, left_unique = side(join.left, join.left_keys, join.left_qualifier, join.left_columns)
    right, right_unique = side(join.right, join.right_keys, join.right_qualifier, join.right_columns)
    keys = [lk + rk for lk in left for rk in right]
    if right_unique and join.kind in ("INNER", "LEFT"):
        keys += left
    if left_unique and join.kind in ("INNER", "RIGHT"):
        keys += right
    return _distinct(keys)


def _ranked_keys(top: TopN) -> tuple[Key, ...]:
    """A Top-N's keys (Flink's for a Rank): its PARTITION BY columns with the row number (one row
    per row number of a partition), and the PARTITION BY columns alone when N = 1 (one row per
    partition); none when the PARTITION BY holds an expression. A key of its input is not one of
    its result: a row moving to another row number is retracted at the old one after it is written
    at the new one."""
    inputs = _row_names(top.input)
    if inputs is None:
        return ()
    partition: list[str] = []
    for p in top.partition:
        name = inputs.get(_bare(p.sql))
        if name is None:
            return ()
        partition.append(name)
    ranked = (*partition, top.rank)
    return _distinct([tuple(partition), ranked] if top.limit == 1 else [ranked])


def _row_names(node: Node) -> dict[str, str] | None:
    """The column names of a projection's rows (through WHEREs), by their case-folded spelling."""
    while isinstance(node, Filter):
        node = node.input
    return {o.name.casefold(): o.name for o in node.outputs} if isinstance(node, Project) else None


def _check_ranked_sink(
    table: Table, top: TopN, outputs: tuple[NamedExpression, ...], locate: Locate, query: exp.Select
) -> None:
    """A Top-N without a window updates the row at each row number of each partition: its sink
    upserts, keyed by exactly the PARTITION BY columns and the row number (the partition alone when
    N = 1 and the row number is not selected: deduplication)."""
    upserts = isinstance(table.connector, JdbcTable) or (
        isinstance(table.connector, KafkaTable) and table.connector.upsert
    )
    if not upserts:
        raise locate.refuse(
            query,
            f"INSERT INTO {table.name}: a Top-N without a window gives updating results; the sink must be "
            "'upsert-kafka' or 'jdbc' with a PRIMARY KEY (its connector appends)",
        )
    selected = {_bare(o.sql) for o in outputs}
    partition = {_bare(p.sql) for p in top.partition}
    if _bare(top.rank) not in selected and top.limit > 1:
        raise locate.refuse(
            query, f"a Top-N without a window and N > 1 needs its row number {top.rank} in the SELECT (the sink's key)"
        )
    wanted = partition | ({_bare(top.rank)} if _bare(top.rank) in selected else set())
    sink_names = [c.name for c in table.columns]
    at_key = {_bare(outputs[sink_names.index(k)].sql) for k in table.primary_key}
    if at_key != wanted:
        raise locate.refuse(
            query,
            f"INSERT INTO {table.name}: its PRIMARY KEY ({', '.join(table.primary_key)}) must hold exactly the "
            f"Top-N's PARTITION BY columns and its row number ({', '.join(sorted(wanted))})",
        )


def _bare(sql: str) -> str:
    return sql.replace("`", "").lower()


@dataclass(frozen=True)
class PlannedSelect:
    node: Project
    updating: bool
    outputs: tuple[NamedExpression, ...]
    relation: Relation  # as a view's readers see it


def _plan_select(select: exp.Select, catalog: Catalog, locate: Locate, *, ranked: bool = False) -> PlannedSelect:
    """``ranked``: the SELECT is a Top-N's input (its ROW_NUMBER() taken out), which may read a changelog."""
    for key, what in (
        ("order", "ORDER BY"),
        ("limit", "LIMIT"),
        ("offset", "OFFSET"),
        ("with_", "WITH (common table expressions)"),
        ("windows", "WINDOW"),
        ("qualify", "QUALIFY"),
        ("laterals", "LATERAL"),
        ("distinct", "SELECT DISTINCT"),
    ):
        value = select.args.get(key)
        if value:
            first = value[0] if isinstance(value, list) else value
            raise locate.refuse(first if isinstance(first, exp.Expr) else select, f"{what} is not supported")
    source = select.args.get("from_") or select.args.get("from")
    if source is None:
        raise locate.refuse(select, "a SELECT without FROM is not supported")
    where = select.args.get("where")
    condition = where.this if where is not None else None
    if _ranking(source.this) is not None:
        relation, condition = _plan_top_n(source.this, condition, catalog, locate)
    else:
        relation = _plan_from(source.this, catalog, locate)
    joins = select.args.get("joins") or []
    if len(joins) > 1:
        raise locate.refuse(joins[1], "a second JOIN is not supported (one two-way join is)")
    if joins:
        comma = (joins[0].args.get("kind") or "").upper() == "CROSS" and joins[0].args.get("on") is None
        if comma and condition is not None:  # FROM a, b WHERE ...: the WHERE is the join's condition
            relation = _plan_join(relation, source.this, joins[0], catalog, locate, condition)
            condition = None
        else:
            relation = _plan_join(relation, source.this, joins[0], catalog, locate)
    node: Node = relation.node
    scope = relation.scope
    window = node if isinstance(node, WindowTvf) else None
    group = select.args.get("group")
    having = select.args.get("having")
    calls = _aggregate_calls(select, having, locate)
    if group is not None or calls:
        for projection in select.expressions:
            if _is_star(projection):
                raise locate.refuse(projection, f"SELECT {projection.sql(dialect='spark')} with GROUP BY")
    input_mode = changelog_of(node)
    if input_mode is not None:  # a changelog: a GROUP BY reads it, or a projection a Top-N's or a source's
        if condition is not None and isinstance(node, TopN):
            raise locate.refuse(
                condition, "WHERE over an updating result (the changelog of a Top-N without a window) is not supported"
            )
        over = next((w for p in select.expressions for w in p.find_all(exp.Window)), None)
        if over is not None and group is None and not calls:
            raise locate.refuse(
                over,
                "an OVER aggregation of an updating result (a changelog: of a GROUP BY, a Top-N or a 'postgres-cdc' "
                "or 'upsert-kafka' table) is not supported (Flink's does not take retractions either: Nexmark q6)",
            )
        if (
            group is None
            and not calls
            and not isinstance(node, TopN)
            and not _changelog_source(node)
            and _changelog_join(node) is None
            and not ranked
        ):
            raise locate.refuse(
                select, "a SELECT of an updating result (a GROUP BY without a window) without GROUP BY is not supported"
            )
    if condition is not None:
        _refuse_nested(condition, locate)
        node = Filter(node, _named(condition, "where", scope, locate))
    updating = False
    propagated = _propagated_window(group, relation, node) if window is None else None
    group_window = _group_window(group, relation, node, window, locate)
    overs = _over_windows(select, locate)
    if overs:
        if group is not None or calls or window is not None:
            raise locate.refuse(overs[0], "an OVER aggregation with GROUP BY, other aggregates or a window TVF")
        node, scope = _plan_over(overs, node, scope, relation.time_column, locate)
    elif group is not None or calls:
        node, scope, updating = _plan_aggregate(
            select,
            group,
            calls,
            node,
            scope,
            window or propagated or (group_window[1] if group_window else None),
            locate,
            propagated=propagated is not None,
            group_window=group_window[0] if group_window else None,
            input_mode=input_mode or APPEND,
        )
        if having is not None and updating:  # a key leaves the result: its changelog's -U/-D delete it
            assert isinstance(node, Aggregate)
            node = dataclasses.replace(node, emits_changelog=True)
        if having is not None:
            node = Filter(node, _named(having.this, "having", scope, locate))
    elif having is not None:
        raise locate.refuse(having, "HAVING without GROUP BY or an aggregate")
    elif window is not None and window.partition:
        raise locate.refuse(
            select, "a SESSION TVF's rows are aggregated: GROUP BY window_start, window_end and its PARTITION BY keys"
        )
    outputs: list[NamedExpression] = []
    types: dict[str, SqlType | None] = {}
    time_column = None
    proctime = None
    window_outputs: dict[str, str] = {}  # window_start/window_end (or the relation's) -> output name
    for i, projection in enumerate(select.expressions):
        side = _side_star(projection, scope, locate)
        if side is not None:  # A.* of a join: that side's columns, each by its own name (Flink's)
            if group is not None or calls:
                raise locate.refuse(projection, f"SELECT {projection.table}.* with GROUP BY")
            for key, column in side:
                taken = {o.name for o in outputs}
                name = column if column not in taken else _renamed(column, taken)
                sql = normalized(exp.column(column, table=projection.table))
                outputs.append(NamedExpression(name, sql, itemgetter(key)))
                types[name] = scope.columns[key]
            continue
        if isinstance(projection, exp.Star) or _is_star(projection):
            if group is not None or calls:
                raise locate.refuse(projection, "SELECT * with GROUP BY")
            if any("." in name for name in scope.columns):
                raise locate.refuse(projection, "SELECT * over a JOIN is not supported: list the columns")
            for name in scope.columns:
                if name not in WINDOW_COLUMNS or window is None:
                    outputs.append(NamedExpression(name, name, itemgetter(name)))
                    types[name] = scope.columns[name]
                    if name == relation.time_column and not updating and window is None:
                        time_column = name
                    if name == relation.proctime and not (group or calls):
                        proctime = name
                    if relation.windowed is not None and name == relation.windowed.start:
                        window_outputs.setdefault("window_start", name)
                    elif relation.windowed is not None and name == relation.windowed.end:
                        window_outputs.setdefault("window_end", name)
            continue
        _refuse_nested(projection, locate, planned=scope.computed)
        name = (
            projection.alias
            if isinstance(projection, exp.Alias)
            else projection.name
            if isinstance(projection, exp.Column)
            else f"EXPR${i}"
        )
        taken = {o.name for o in outputs}
        if name in taken:  # a name given twice: the later one renamed as Flink does (dateTime, dateTime0)
            name = _renamed(name, taken)
        value = projection.this if isinstance(projection, exp.Alias) else projection
        outputs.append(_named(value, name, scope, locate))
        passes = isinstance(value, exp.Column) and normalized(value) not in scope.computed
        types[name] = scope.columns.get(value.name) if isinstance(value, exp.Column) else None
        if passes and value.name == relation.time_column and window is None and not (group or calls):
            time_column = name  # a column passing the event time through keeps it (a view's rowtime)
        if not (group or calls) and (_is_proctime(value) or (passes and value.name == relation.proctime)):
            proctime = name  # PROCTIME() AS p_time: the processing time a lookup join reads at
        if isinstance(value, exp.Column) and not value.table:
            aggregated = group is not None or bool(calls)
            if window is not None and aggregated and value.name in ("window_start", "window_end"):
                window_outputs.setdefault(value.name, name)
            elif relation.windowed is not None and not (group or calls):
                if value.name == relation.windowed.start:
                    window_outputs.setdefault("window_start", name)
                elif value.name == relation.windowed.end:
                    window_outputs.setdefault("window_end", name)
    project = Project(node, tuple(outputs))
    windowed = None
    slide = window.slide_ms if window is not None else relation.windowed.slide_ms if relation.windowed else None
    if window is not None and window.processing_time:
        slide = None  # wall-clock windows' rows carry no event time: no window of them follows
    if slide is not None and {"window_start", "window_end"} <= window_outputs.keys() and not updating:
        windowed = WindowedColumns(window_outputs["window_start"], window_outputs["window_end"], slide)
    out = Relation(project, Scope(types, frozenset(), {}), time_column, windowed, proctime)
    return PlannedSelect(project, updating, tuple(outputs), out)


def _is_proctime(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).upper() == "PROCTIME" and not node.expressions


def _renamed(name: str, taken: set[str]) -> str:
    """A name given twice in one SELECT, the later one renamed as Flink does (dateTime, dateTime0)."""
    return next(f"{name}{k}" for k in itertools.count() if f"{name}{k}" not in taken)


def _is_star(projection: exp.Expr) -> bool:
    return isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)


def _side_star(projection: exp.Expr, scope: Scope, locate: Locate) -> list[tuple[str, str]] | None:
    """``A.*`` over a join: (the joined row's column ``A.c``, ``c``) for each column of side ``A``, in
    its order; None for anything else (``t.*`` of a single table is ``*``)."""
    if not _is_star(projection):
        return None
    assert isinstance(projection, exp.Column)
    qualifier = projection.table
    if qualifier not in scope.qualifiers:
        raise locate.refuse(projection, f"{qualifier}.*: no table or alias {qualifier} in FROM")
    if not any("." in name for name in scope.columns):
        return None
    prefix = f"{qualifier}."
    side = [(key, key[len(prefix) :]) for key in scope.columns if key.startswith(prefix)]
    if not side:  # the side's table name where the join names it by its alias
        raise locate.refuse(projection, f"{qualifier}.*: name the JOIN's side by its alias")
    return side


def _ranking(source: exp.Expr) -> exp.Alias | None:
    """The ``ROW_NUMBER() OVER (...) AS name`` projection of a subquery in FROM, if it has one."""
    if not isinstance(source, exp.Subquery) or not isinstance(source.this, exp.Select):
        return None
    for projection in source.this.expressions:
        if isinstance(projection, exp.Alias) and isinstance(projection.this, exp.Window):
            return projection
    return None


def _plan_top_n(
    source: exp.Subquery, condition: exp.Expr | None, catalog: Catalog, locate: Locate
) -> tuple[Relation, exp.Expr | None]:
    """Flink's window Top-N: ``(SELECT ..., ROW_NUMBER() OVER (PARTITION BY window_start, window_end
    [, k] ORDER BY ...) AS rownum FROM <window aggregation>) WHERE rownum <= N``. Answers the ranked
    relation and what is left of the outer WHERE (filtering the ranked rows)."""
    inner = source.this
    assert isinstance(inner, exp.Select)
    ranking = _ranking(source)
    assert ranking is not None
    over = ranking.this
    assert isinstance(over, exp.Window)
    projections = list(inner.expressions)
    if sum(isinstance(p, exp.Alias) and isinstance(p.this, exp.Window) for p in projections) > 1:
        raise locate.refuse(inner, "one ROW_NUMBER() OVER (...) per window Top-N")
    if not isinstance(over.this, exp.RowNumber):
        raise locate.refuse(over, f"{over.this.sql_name()}() OVER (...) is not supported (ROW_NUMBER() is)")
    if over.args.get("spec") is not None:
        raise locate.refuse(over, "a window frame (ROWS/RANGE BETWEEN) is not supported in a Top-N")
    later = projections[projections.index(ranking) + 1 :]
    if any(isinstance(p, exp.Star) or _is_star(p) for p in later):
        raise locate.refuse(ranking, "ROW_NUMBER() OVER (...) before * is not supported: put it after")
    rest = inner.copy()
    rest.set("expressions", [p.copy() for p in projections if p is not ranking])
    planned = _plan_select(rest, catalog, locate, ranked=True)
    windowed = planned.relation.windowed
    shape = "PARTITION BY window_start, window_end (and keys) over a window aggregation's result"
    ranked_node: Node = planned.node
    if windowed is None and planned.updating:  # its GROUP BY's result read as a changelog
        ranked_node = _as_changelog(planned.node)
    input_mode = changelog_of(ranked_node) if windowed is None else None
    if windowed is None and _reads_tvf_rows(planned.node):
        raise locate.refuse(over, f"a Top-N directly over a window TVF's rows is not supported: {shape}")
    scope = Scope(planned.relation.scope.columns, frozenset(), {})
    partition_nodes = [_as_output(p, planned.outputs, scope, locate) for p in over.args.get("partition_by") or []]
    names = {p.name for p in partition_nodes if isinstance(p, exp.Column) and not p.table}
    if windowed is not None and not {windowed.start, windowed.end} <= names:
        raise locate.refuse(over, f"window Top-N: {shape} (both window columns)")
    partition: list[NamedExpression] = []
    for p in partition_nodes:
        _refuse_nested(p, locate)
        partition.append(_named(p, f"$partition{len(partition)}", scope, locate))
    order_by = over.args.get("order")
    if order_by is None or not order_by.expressions:
        raise locate.refuse(over, "window Top-N needs ORDER BY in OVER (...)")
    order: list[OrderKey] = []
    for item in order_by.expressions:
        assert isinstance(item, exp.Ordered)
        _refuse_nested(item.this, locate)
        descending = bool(item.args.get("desc"))
        nulls_first = bool(item.args.get("nulls_first"))
        value = _as_output(item.this, planned.outputs, scope, locate)
        order.append(OrderKey(_named(value, f"$order{len(order)}", scope, locate), descending, nulls_first))
    rank = ranking.alias
    limit: int | None = None
    left: list[exp.Expr] = []
    for conjunct in _conjuncts(condition) if condition is not None else []:
        bound = _rank_bound(conjunct, rank)
        if bound is not None and limit is None:
            limit = bound
        else:
            left.append(conjunct)
    if limit is None or limit < 1:
        raise locate.refuse(
            condition if condition is not None else source,
            f"window Top-N needs WHERE {rank} <= N (or {rank} < N, {rank} = 1) with N a positive integer",
        )
    columns = dict(planned.relation.scope.columns)
    ordered = list(columns.items())
    at = len(ordered) - len(later)
    ordered.insert(at, (rank, BIGINT))
    alias = source.alias or None
    node = TopN(
        ranked_node, tuple(partition), tuple(order), limit, rank, windowed.slide_ms if windowed is not None else None,
        input_mode,
    )  # fmt: skip
    out_scope = Scope(dict(ordered), frozenset({alias}) if alias else frozenset(), {})
    remaining: exp.Expr | None = None
    for conjunct in left:
        remaining = conjunct if remaining is None else exp.And(this=remaining, expression=conjunct)
    return Relation(node, out_scope, None, windowed), remaining


def _as_output(node: exp.Expr, outputs: tuple[NamedExpression, ...], scope: Scope, locate: Locate) -> exp.Expr:
    """A Top-N's PARTITION BY or ORDER BY expression over the inner SELECT's input (``A.id``,
    ``B.dateTime`` of a join) read from the inner SELECT's columns: each column the SELECT does not
    give by that name, and each qualified one, becomes the output that selects it (``B.`dateTime` AS
    bid_dateTime``: ``bid_dateTime``); a column no output selects is refused (the ranked rows are
    the SELECT's). Backquotes and case are ignored when the exact text selects nothing."""
    by_sql: dict[str, str] = {}
    by_bare: dict[str, set[str]] = {}
    for output in outputs:
        by_sql.setdefault(output.sql, output.name)
        by_bare.setdefault(_bare(output.sql), set()).add(output.name)
    copy = node.copy()
    for column in list(copy.find_all(exp.Column)):
        if not column.table and column.name in scope.columns:
            continue
        sql = normalized(column)
        name = by_sql.get(sql)
        if name is None and len(by_bare.get(_bare(sql), ())) == 1:
            (name,) = by_bare[_bare(sql)]
        if name is None:
            raise locate.refuse(
                column,
                f"{column.sql(dialect='spark')} in a Top-N's OVER (...) is not a column of its SELECT: select it "
                "(the Top-N ranks the SELECT's rows)",
            )
        replacement = exp.column(name)
        if column is copy:
            return replacement
        column.replace(replacement)
    return copy


def _reads_tvf_rows(node: Node) -> bool:
    """Whether a SELECT's rows are a window TVF's (filtered and projected), not its aggregation's."""
    while isinstance(node, Filter | Project):
        node = node.input
    return isinstance(node, WindowTvf)


def _rank_bound(conjunct: exp.Expr, rank: str) -> int | None:
    """N of ``rank <= N``, ``rank < N + 1``, ``rank = 1`` (or mirrored); None for another condition."""
    if not isinstance(conjunct, exp.LTE | exp.LT | exp.EQ | exp.GTE | exp.GT):
        return None
    a, b = conjunct.this, conjunct.expression
    mirrored = isinstance(b, exp.Column)
    column, literal = (b, a) if mirrored else (a, b)
    if not (isinstance(column, exp.Column) and column.name == rank and not column.table):
        return None
    if not (isinstance(literal, exp.Literal) and not literal.is_string and literal.this.isdigit()):
        return None
    n = int(literal.this)
    match conjunct:
        case exp.EQ():
            return 1 if n == 1 else None
        case exp.LTE() if not mirrored:
            return n
        case exp.LT() if not mirrored:
            return n - 1
        case exp.GTE() if mirrored:
            return n
        case exp.GT() if mirrored:
            return n - 1
    return None


_GROUP_WINDOWS: Final = {"TUMBLE": 1, "HOP": 2, "SESSION": 1}  # a group window function: its intervals


def _group_window(
    group: exp.Group | None, relation: Relation, node: Node, window: WindowTvf | None, locate: Locate
) -> tuple[exp.Anonymous, WindowTvf] | None:
    """Flink's group window functions: ``GROUP BY k, TUMBLE(ts, size)`` / ``HOP(ts, slide, size)`` /
    ``SESSION(ts, gap)`` over the input's event time, read by ``*_START``, ``*_END``, ``*_ROWTIME``."""
    if group is None:
        return None
    found = [g for g in group.expressions if isinstance(g, exp.Anonymous) and str(g.this).upper() in _GROUP_WINDOWS]
    if not found:
        return None
    function = found[0]
    name = str(function.this).upper()
    if len(found) > 1 or window is not None:
        raise locate.refuse(found[-1], "one window per GROUP BY (a group window or a window TVF)")
    args = function.expressions
    if len(args) != 1 + _GROUP_WINDOWS[name] or not isinstance(args[0], exp.Column):
        shape = {"TUMBLE": "ts, size", "HOP": "ts, slide, size", "SESSION": "ts, gap"}[name]
        raise locate.refuse(function, f"{name}({shape}) takes the event time column and INTERVAL literals")
    processing_time = relation.proctime is not None and args[0].name == relation.proctime
    if processing_time and name != "TUMBLE":
        raise locate.refuse(
            args[0],
            f"{name}({args[0].name}, ...) over a PROCTIME() column is not supported (a processing-time TUMBLE is)",
        )
    if not processing_time and args[0].name != relation.time_column:
        raise locate.refuse(
            args[0],
            f"{name}({args[0].name}, ...): not the input's event time "
            f"({relation.time_column + ' is' if relation.time_column else 'it has none'})",
        )
    durations = []
    for arg in args[1:]:
        ms = interval_ms(arg) if isinstance(arg, exp.Interval) else None
        if ms is None or ms <= 0:
            raise locate.refuse(arg, f"{name} takes positive INTERVAL literals (MILLISECOND to DAY)")
        durations.append(ms)
    match name:
        case "HOP":
            slide, size = durations
            if size % slide != 0:
                raise locate.refuse(function, f"HOP's size ({size} ms) must be a multiple of its slide ({slide} ms)")
            return function, WindowTvf(node, "HOP", args[0].name, size, slide)
        case "SESSION":
            return function, WindowTvf(node, "SESSION", args[0].name, durations[0], durations[0])
        case _:
            tumble = WindowTvf(node, "TUMBLE", args[0].name, durations[0], durations[0])
            return function, dataclasses.replace(tumble, processing_time=processing_time)


def _propagated_window(group: exp.Group | None, relation: Relation, node: Node) -> WindowTvf | None:
    """A GROUP BY of a window aggregation's window_start and window_end columns (renamed or not):
    a window aggregation again, as a tumbling window of the slide over the rows' timestamps."""
    windowed = relation.windowed
    if group is None or windowed is None:
        return None
    names = {g.name for g in group.expressions if isinstance(g, exp.Column)}
    if not {windowed.start, windowed.end} <= names:
        return None
    return WindowTvf(node, "TUMBLE", windowed.end, windowed.slide_ms, windowed.slide_ms)


def _refuse_nested(node: exp.Expr, locate: Locate, planned: Mapping[str, str] | None = None) -> None:
    """A subquery or a window function in ``node`` is refused; ``planned``: expressions computed
    upstream (an OVER aggregation's window is one)."""
    for inner in node.walk():
        if isinstance(inner, exp.Subquery | exp.Select | exp.Exists):
            raise locate.refuse(inner, "a subquery is not supported")
        if isinstance(inner, exp.Window) and normalized(inner) not in (planned or {}):
            raise locate.refuse(
                inner,
                "OVER (...) is not supported (except window Top-N: SELECT ... FROM (SELECT ..., ROW_NUMBER() "
                "OVER (PARTITION BY window_start, window_end ... ORDER BY ...) AS rownum FROM ...) WHERE rownum <= N)",
            )


def _named(node: exp.Expr, name: str, scope: Scope, locate: Locate) -> NamedExpression:
    return NamedExpression(name, normalized(node), compile_expression(node, scope, locate))


def _table_scope(table: Table, alias: str | None) -> Scope:
    columns: dict[str, SqlType | None] = {c.name: c.type for c in table.columns}
    columns.update({c.name: None for c in table.computed})
    qualifiers = {table.name} | ({alias} if alias else set())
    return Scope(columns, frozenset(qualifiers), {})


def _plan_subquery(source: exp.Subquery, catalog: Catalog, locate: Locate) -> Relation:
    """``(SELECT ...) AS alias`` in FROM: planned as a view of that name would be."""
    query = source.this
    if not isinstance(query, exp.Select):
        raise locate.refuse(source, f"{type(query).__name__.upper()} in FROM is not supported (a SELECT is)")
    planned = _plan_select(query, catalog, locate)
    alias = source.alias or None
    qualifiers = frozenset({alias}) if alias else frozenset()
    scope = Scope(planned.relation.scope.columns, qualifiers, {})
    if planned.updating:  # read by another operator: its result as a changelog
        return Relation(_as_changelog(planned.node), scope, None)
    relation = planned.relation
    return Relation(planned.node, scope, relation.time_column, relation.windowed, relation.proctime)


def _as_changelog(node: Project) -> Project:
    """An updating SELECT (a GROUP BY without a window, with its HAVING) read by another operator: its
    aggregate emits a changelog, which its projection maps row by row."""
    return _emitting_changelog(node)


def _named_relation(name: str, alias: str | None, at: exp.Expr, catalog: Catalog, locate: Locate) -> Relation:
    """A table's scan, or a view's plan (planned where it is read: its errors point into its text)."""
    table = catalog.tables.get(name)
    if table is not None:
        if isinstance(table.connector, FilesystemTable):
            raise locate.refuse(
                at,
                f"table {name} ('filesystem') is read only as a lookup join's side input "
                f"(JOIN {name} FOR SYSTEM_TIME AS OF p.proc_time ON ...), not scanned",
            )
        if is_changelog_source(table) and table.watermark is not None:  # upsert-kafka ('postgres-cdc': at CREATE)
            raise locate.refuse(
                at,
                f"reading table {name} with a WATERMARK is not supported (Weir's changelog sources have no event time)",
            )
        return Relation(Scan(table), _table_scope(table, alias), table.watermark.column if table.watermark else None)
    view = catalog.views.get(name)
    if view is None:
        raise locate.refuse(at, f"no table {name} (CREATE TABLE it first)")
    if not isinstance(view.query, exp.Select):
        kind = type(view.query).__name__.upper()
        raise SqlError(f"view {name}: {kind} is not supported (one SELECT is)", view.position)
    inner = Catalog(catalog.tables, {n: v for n, v in catalog.views.items() if n != name})  # no view reads itself
    planned = _plan_select(view.query, inner, Locate(locate.script, view.offset))
    if planned.updating:
        raise SqlError(f"view {name}: GROUP BY without a window in a view is not supported", view.position)
    qualifiers = frozenset({name} | ({alias} if alias else set()))
    scope = Scope(planned.relation.scope.columns, qualifiers, {})
    relation = planned.relation
    return Relation(planned.node, scope, relation.time_column, relation.windowed, relation.proctime)


def _qualifier(source: exp.Expr) -> str:
    return source.alias or (source.name if isinstance(source, exp.Table) else "")


def _plan_join(
    left: Relation,
    left_source: exp.Expr,
    join: exp.Join,
    catalog: Catalog,
    locate: Locate,
    where: exp.Expr | None = None,
) -> Relation:
    """``where``: the WHERE of ``FROM a, b WHERE ...`` (a comma join), the join's condition."""
    kind, side = (join.args.get("kind") or "").upper(), (join.args.get("side") or "").upper()
    if where is not None and kind == "CROSS" and not side:
        kind = ""
    if kind not in ("", "INNER", "OUTER") or (kind == "OUTER" and not side) or (side and kind == "INNER"):
        written = " ".join(filter(None, (side, kind)))
        raise locate.refuse(join, f"{written} JOIN is not supported (INNER, LEFT, RIGHT and FULL [OUTER] JOIN are)")
    join_kind: JoinKind = "INNER"
    match side:
        case "":
            join_kind = "INNER"
        case "LEFT":
            join_kind = "LEFT"
        case "RIGHT":
            join_kind = "RIGHT"
        case "FULL":
            join_kind = "FULL"
        case _:
            raise locate.refuse(join, f"{side} JOIN is not supported (INNER, LEFT, RIGHT and FULL [OUTER] JOIN are)")
    for key in ("using", "method"):
        if join.args.get(key):
            raise locate.refuse(join, f"JOIN ... {key.upper()} is not supported (ON left.k = right.k is)")
    condition = join.args.get("on") if where is None else where
    if condition is None:
        raise locate.refuse(join, "a JOIN without ON (a cross join) is not supported")
    right_source = join.this
    if isinstance(right_source, exp.Table) and right_source.args.get("version") is not None:
        if join_kind != "INNER":
            raise locate.refuse(join, f"a {join_kind} JOIN ... FOR SYSTEM_TIME AS OF (a lookup join) is not supported")
        return _plan_lookup_join(left, left_source, right_source, condition, catalog, locate)
    right = _plan_from(right_source, catalog, locate)
    left_mode, right_mode = changelog_of(left.node), changelog_of(right.node)
    if isinstance(left.node, WindowTvf) or isinstance(right.node, WindowTvf):
        raise locate.refuse(join, "a JOIN of a window TVF is not supported (join its aggregation's result)")
    lq, rq = _qualifier(left_source), _qualifier(right_source)
    if not lq or not rq or lq == rq:
        raise locate.refuse(join, "each side of a JOIN needs its own name or alias")
    left_names = tuple(c for c in left.scope.columns if "." not in c)
    right_names = tuple(c for c in right.scope.columns if "." not in c)
    columns: dict[str, SqlType | None] = {}
    for q, names, scope in ((lq, left_names, left.scope), (rq, right_names, right.scope)):
        for name in names:
            columns[f"{q}.{name}"] = scope.columns[name]
    for name in left_names:
        if name not in right_names:
            columns[name] = left.scope.columns[name]
    for name in right_names:
        if name not in left_names:
            columns[name] = right.scope.columns[name]
    joined = Scope(columns, left.scope.qualifiers | right.scope.qualifiers, {})
    left_keys: list[NamedExpression] = []
    right_keys: list[NamedExpression] = []
    residual: list[exp.Expr] = []
    times = _JoinTimes(lq, rq, left_names, right_names, left.time_column, right.time_column)
    bounds: list[tuple[exp.Expr, Bound]] = []
    for conjunct in _conjuncts(condition):
        found = times.bounds(conjunct)
        if found:
            bounds.extend((conjunct, b) for b in found)
            continue
        if isinstance(conjunct, exp.EQ):
            sides = (
                _side_of(conjunct.this, lq, rq, left_names, right_names),
                _side_of(conjunct.expression, lq, rq, left_names, right_names),
            )
            if sides in (("left", "right"), ("right", "left")):
                swapped = sides == ("right", "left")
                a, b = (conjunct.expression, conjunct.this) if swapped else (conjunct.this, conjunct.expression)
                left_keys.append(_named(_unqualified(a, lq), f"$lk{len(left_keys)}", left.scope, locate))
                right_keys.append(_named(_unqualified(b, rq), f"$rk{len(right_keys)}", right.scope, locate))
                continue
        residual.append(conjunct)
    if not left_keys:
        raise locate.refuse(condition, "a JOIN needs an equality of a column of each side in ON")
    interval = _interval(bounds, condition, locate) if bounds else None
    if interval is not None and (join_kind != "INNER" or left_mode is not None or right_mode is not None):
        raise locate.refuse(
            condition,
            "an interval join (ON bounding one side's event time by the other's) is INNER and of append inputs; "
            f"this one is {'a ' + join_kind + ' JOIN' if join_kind != 'INNER' else 'of an updating result'}",
        )
    if join_kind != "INNER" and residual:
        raise locate.refuse(
            residual[0],
            f"a {join_kind} JOIN's ON is equalities of a column of each side only (filter in WHERE, or above)",
        )
    node: Node = Join(
        left.node, right.node, tuple(left_keys), tuple(right_keys), lq, rq, left_names, right_names, interval,
        join_kind, left_mode, right_mode,
    )  # fmt: skip
    for conjunct in residual:
        _refuse_nested(conjunct, locate)
        node = Filter(node, _named(conjunct, "on", joined, locate))
    return Relation(node, joined, None)


def _plan_lookup_join(
    left: Relation,
    left_source: exp.Expr,
    right_source: exp.Table,
    condition: exp.Expr,
    catalog: Catalog,
    locate: Locate,
) -> Relation:
    """``left JOIN t FOR SYSTEM_TIME AS OF left.proc_time AS S ON expr = S.column [AND ...]``: a
    processing-time lookup join of a 'filesystem' table (its file read by each subtask at its first
    lookup). An event-time temporal join (AS OF an event time) and any other table are refused."""
    version = right_source.args["version"]
    lq, rq = _qualifier(left_source), _qualifier(right_source)
    if not lq or not rq or lq == rq:
        raise locate.refuse(right_source, "each side of a JOIN needs its own name or alias")
    if changelog_of(left.node) is not None:
        raise locate.refuse(left_source, "a lookup join of an updating result (a changelog) is not supported")
    left_names = tuple(c for c in left.scope.columns if "." not in c)
    at = version.expression
    if str(version.this).upper() != "TIMESTAMP" or str(version.args.get("kind", "")).upper() != "AS OF":
        raise locate.refuse(right_source, "a temporal table is read FOR SYSTEM_TIME AS OF a column (nothing else)")
    side = _side_of(at, lq, "", left_names, ()) if isinstance(at, exp.Column) else None
    if side != "left" or not isinstance(at, exp.Column) or at.name != left.proctime:
        if isinstance(at, exp.Column) and at.name == left.time_column:
            raise locate.refuse(
                at,
                f"FOR SYSTEM_TIME AS OF {at.sql(dialect='spark')}: an event-time temporal join (a versioned table) "
                "is not supported; a processing-time lookup join (AS OF a PROCTIME() column) is",
            )
        raise locate.refuse(
            at,
            f"FOR SYSTEM_TIME AS OF {at.sql(dialect='spark')}: a lookup join reads at the left side's processing "
            "time (a column PROCTIME() gives: SELECT *, PROCTIME() AS p_time FROM t)",
        )
    name = right_source.name
    table = catalog.tables.get(name)
    if table is None or not isinstance(table.connector, FilesystemTable):
        what = (
            "a view"
            if name in catalog.views
            else f"'{dict(table.options).get('connector')}'"
            if table is not None
            else "no such table"
        )
        raise locate.refuse(
            right_source,
            f"a lookup join's table is a 'filesystem' table (Weir's lookup source); {name} is {what}",
        )
    if table.connector.path.startswith("s3://"):
        raise locate.refuse(
            right_source,
            f"a lookup join reads a local file; {name}'s 'path' = '{table.connector.path}' is in S3, "
            "where a 'filesystem' table can only be written",
        )
    right_names = table.column_names
    right_scope = _table_scope(table, rq)
    columns: dict[str, SqlType | None] = {}
    for q, names, scope in ((lq, left_names, left.scope), (rq, right_names, right_scope)):
        for column in names:
            columns[f"{q}.{column}"] = scope.columns[column]
    for column in left_names:
        if column not in right_names:
            columns[column] = left.scope.columns[column]
    for column in right_names:
        if column not in left_names:
            columns[column] = right_scope.columns[column]
    joined = Scope(columns, left.scope.qualifiers | right_scope.qualifiers, {})
    keys: list[NamedExpression] = []
    key_columns: list[str] = []
    residual: list[exp.Expr] = []
    for conjunct in _conjuncts(condition):
        if isinstance(conjunct, exp.EQ):
            a, b = conjunct.this, conjunct.expression
            if isinstance(a, exp.Column) and _side_of(a, lq, rq, left_names, right_names) == "right":
                a, b = b, a
            if (
                isinstance(b, exp.Column)
                and _side_of(b, lq, rq, left_names, right_names) == "right"
                and _side_of(a, lq, rq, left_names, right_names) == "left"
            ):
                _refuse_nested(a, locate)
                keys.append(_named(_unqualified(a, lq), f"$lk{len(keys)}", left.scope, locate))
                key_columns.append(b.name)
                continue
        residual.append(conjunct)
    if not keys:
        raise locate.refuse(
            condition, f"a lookup join needs an equality of an expression of the left side and a column of {rq} in ON"
        )
    node: Node = LookupJoin(left.node, table, tuple(keys), tuple(key_columns), lq, rq, left_names, tuple(right_names))
    for conjunct in residual:
        _refuse_nested(conjunct, locate)
        node = Filter(node, _named(conjunct, "on", joined, locate))
    return Relation(node, joined, None)


@dataclass(frozen=True)
class Bound:
    """A bound of (right event time - left event time): ``lower`` (>=, or > if exclusive) or ``upper``."""

    lower: bool
    ms: int
    exclusive: bool


_FLIPPED: Final[dict[type[exp.Expr], type[exp.Expr]]] = {
    exp.GTE: exp.LTE,
    exp.GT: exp.LT,
    exp.LTE: exp.GTE,
    exp.LT: exp.GT,
}


@dataclass(frozen=True)
class _JoinTimes:
    """The two sides' event-time columns, to read an interval join's conditions."""

    lq: str
    rq: str
    left_names: tuple[str, ...]
    right_names: tuple[str, ...]
    left_time: str | None
    right_time: str | None

    def bounds(self, conjunct: exp.Expr) -> list[Bound]:
        """The bounds ``conjunct`` puts on (right time - left time): ``l.ts BETWEEN r.ts - INTERVAL ...
        AND r.ts + INTERVAL ...``, ``l.ts >= r.ts - INTERVAL ...`` and the like (either side first);
        none for any other condition."""
        if isinstance(conjunct, exp.Between):
            low = self._bound(exp.GTE, conjunct.this, conjunct.args["low"])
            high = self._bound(exp.LTE, conjunct.this, conjunct.args["high"])
            return [low, high] if low is not None and high is not None else []
        if type(conjunct) in _FLIPPED:
            found = self._bound(type(conjunct), conjunct.this, conjunct.expression)
            return [found] if found is not None else []
        return []

    def _bound(self, op: type[exp.Expr], a: exp.Expr, b: exp.Expr) -> Bound | None:
        ta, tb = self._time(a), self._time(b)
        if ta is None or tb is None or ta[0] == tb[0]:
            return None
        # right + x op left + y  <=>  right - left op y - x ; left + x op right + y <=> right - left op' x - y
        if ta[0] == "right":
            ms = tb[1] - ta[1]
        else:
            op, ms = _FLIPPED[op], ta[1] - tb[1]
        return Bound(op in (exp.GTE, exp.GT), ms, op in (exp.GT, exp.LT))

    def _time(self, node: exp.Expr) -> tuple[str, int] | None:
        """(side, offset ms) of ``side.time [+- INTERVAL ...]``, or None."""
        if isinstance(node, exp.Paren):
            return self._time(node.this)
        if isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
            inner, ms = self._time(node.this), interval_ms(node.expression)
            if inner is None or ms is None:
                return None
            return inner[0], inner[1] + (ms if isinstance(node, exp.Add) else -ms)
        if not isinstance(node, exp.Column):
            return None
        side = _side_of(node, self.lq, self.rq, self.left_names, self.right_names)
        if side == "left" and self.left_time is not None and node.name == self.left_time:
            return side, 0
        if side == "right" and self.right_time is not None and node.name == self.right_time:
            return side, 0
        return None


def _interval(bounds: list[tuple[exp.Expr, Bound]], condition: exp.Expr, locate: Locate) -> Interval:
    lower = [(c, b) for c, b in bounds if b.lower]
    upper = [(c, b) for c, b in bounds if not b.lower]
    shape = "l.ts BETWEEN r.ts - INTERVAL ... AND r.ts + INTERVAL ..., over each side's event time"
    if len(lower) != 1 or len(upper) != 1:
        extra = lower[1:] or upper[1:]
        at = extra[0][0] if extra else condition
        raise locate.refuse(at, f"an interval join takes one lower and one upper bound ({shape})")
    low, high = lower[0][1], upper[0][1]
    if low.ms > high.ms or (low.ms == high.ms and (low.exclusive or high.exclusive)):
        raise locate.refuse(lower[0][0], "an interval join's bounds are empty: no row can match")
    return Interval(low.ms, high.ms, low.exclusive, high.exclusive)


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    return [node]


def _side_of(
    node: exp.Expr, lq: str, rq: str, left_names: tuple[str, ...], right_names: tuple[str, ...]
) -> Literal["left", "right"] | None:
    """``left``/``right`` when every column of ``node`` is of that side, else None."""
    sides: set[Literal["left", "right"]] = set()
    for column in node.find_all(exp.Column):
        if column.table == lq or (not column.table and column.name in left_names and column.name not in right_names):
            sides.add("left")
        elif column.table == rq or (not column.table and column.name in right_names and column.name not in left_names):
            sides.add("right")
        else:
            return None
    return sides.pop() if len(sides) == 1 else None


def _unqualified(node: exp.Expr, qualifier: str) -> exp.Expr:
    """A side's key expression with its qualifier dropped: evaluated on that side's own rows."""
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        if column.table == qualifier:
            column.set("table", None)
    return copy


def _plan_from(source: exp.Expr, catalog: Catalog, locate: Locate) -> Relation:
    if isinstance(source, exp.Subquery):
        return _plan_subquery(source, catalog, locate)
    if not isinstance(source, exp.Table):
        raise locate.refuse(source, f"FROM {type(source).__name__.upper()} is not supported")
    alias = source.alias or None
    if source.args.get("version") is not None:
        raise locate.refuse(
            source, "FOR SYSTEM_TIME AS OF is supported only on a lookup join's right side (a 'filesystem' table)"
        )
    if isinstance(source.this, exp.Identifier):
        if source.args.get("db") or source.args.get("catalog"):
            raise locate.refuse(source, "a qualified table name (catalog.db.table) is not supported")
        return _named_relation(source.name, alias, source, catalog, locate)
    function = source.this
    if not (
        isinstance(function, exp.Anonymous) and str(function.this).upper() == "TABLE" and len(function.expressions) == 1
    ):
        raise locate.refuse(source, "FROM takes a table or TABLE(TUMBLE(...)) / TABLE(HOP(...))")
    tvf = function.expressions[0]
    name = str(tvf.this).upper() if isinstance(tvf, exp.Anonymous) else type(tvf).__name__.upper()
    if not isinstance(tvf, exp.Anonymous) or name not in ("TUMBLE", "HOP", "CUMULATE", "SESSION"):
        raise locate.refuse(tvf, f"table function {name} is not supported (TUMBLE, HOP, CUMULATE and SESSION are)")
    args = list(tvf.expressions)
    partition = _partition_keys(name, args, tvf, locate)
    expected = 3 if name in ("TUMBLE", "SESSION") else 4
    if len(args) != expected:
        shape = {"TUMBLE": "size", "HOP": "slide, size", "CUMULATE": "step, size", "SESSION": "gap"}[name]
        table = "TABLE t PARTITION BY keys" if name == "SESSION" else "TABLE t"
        raise locate.refuse(tvf, f"{name} takes ({table}, DESCRIPTOR(time column), {shape})")
    table_arg, descriptor = args[0], args[1]
    if not isinstance(table_arg, exp.Column) or table_arg.table:
        raise locate.refuse(table_arg, f"{name}'s first argument is TABLE name")
    read = _named_relation(table_arg.name, alias, table_arg, catalog, locate)
    if not (
        isinstance(descriptor, exp.Anonymous)
        and str(descriptor.this).upper() == "DESCRIPTOR"
        and len(descriptor.expressions) == 1
        and isinstance(descriptor.expressions[0], exp.Column)
    ):
        raise locate.refuse(descriptor, f"{name}'s second argument is DESCRIPTOR(time column)")
    time_column = descriptor.expressions[0].name
    processing_time = read.proctime is not None and time_column == read.proctime
    if processing_time and name != "TUMBLE":
        raise locate.refuse(
            descriptor,
            f"{name} over {table_arg.name}.{time_column}: a processing-time {name} (over a PROCTIME() column) is not "
            "supported; a processing-time TUMBLE and event-time windows are",
        )
    if not processing_time and read.time_column != time_column:
        raise locate.refuse(
            descriptor,
            f"{name} over {table_arg.name}.{time_column}: not its event time "
            f"({read.time_column + ' is' if read.time_column else 'it has none: no WATERMARK is declared'})",
        )
    durations = []
    for arg in args[2:]:
        ms = interval_ms(arg) if isinstance(arg, exp.Interval) else None
        if ms is None or ms <= 0:
            raise locate.refuse(arg, f"{name} takes positive INTERVAL literals (MILLISECOND to DAY)")
        durations.append(ms)
    size, slide = (durations[0], durations[0]) if name in ("TUMBLE", "SESSION") else (durations[1], durations[0])
    if size % slide != 0:
        step = "slide" if name == "HOP" else "step"
        raise locate.refuse(tvf, f"{name}'s size ({size} ms) must be a multiple of its {step} ({slide} ms)")
    kind: Literal["TUMBLE", "HOP", "CUMULATE", "SESSION"] = (
        "TUMBLE" if name == "TUMBLE" else "HOP" if name == "HOP" else "SESSION" if name == "SESSION" else "CUMULATE"
    )
    for key in partition:
        if key not in read.scope.columns:
            raise locate.refuse(tvf, f"SESSION's PARTITION BY {key}: no column {key} in {table_arg.name}")
    tvf_node = WindowTvf(read.node, kind, time_column, size, slide, partition, processing_time)
    columns = dict(read.scope.columns)
    columns.update({c: TIMESTAMP for c in WINDOW_COLUMNS})
    return Relation(tvf_node, Scope(columns, read.scope.qualifiers, {}), None)


def _partition_keys(name: str, args: list[exp.Expr], tvf: exp.Expr, locate: Locate) -> tuple[str, ...]:
    """``SESSION(TABLE t PARTITION BY k | (k1, k2), ...)``'s keys, taken out of ``args`` (the script
    reader gives them as the argument ``_PARTITION = keys``); another TVF's PARTITION BY is refused,
    and so is a SESSION without one (Flink's sessions of the whole stream, not run here)."""
    marked = [
        a for a in args if isinstance(a, exp.EQ) and isinstance(a.this, exp.Column) and a.this.name == PARTITION_MARK
    ]
    if name != "SESSION":
        if marked:
            mark = locate(marked[0].this)  # its comma stands where PARTITION began
            raise SqlError(f"{name} takes no PARTITION BY (SESSION does)", Position(mark.line, mark.column - 1))
        return ()
    if len(marked) != 1 or len(args) < 2 or args[1] is not marked[0]:
        raise locate.refuse(tvf, "SESSION takes (TABLE t PARTITION BY keys, DESCRIPTOR(time column), gap)")
    args.remove(marked[0])
    keys = marked[0].expression
    columns = list(keys.expressions) if isinstance(keys, exp.Tuple | exp.Paren) else [keys]
    if isinstance(keys, exp.Paren):
        columns = [keys.this]
    if not all(isinstance(c, exp.Column) and not c.table for c in columns):
        raise locate.refuse(keys, "SESSION's PARTITION BY takes column names")
    return tuple(c.name for c in columns)


def _python_aggregate(node: exp.Anonymous) -> Any | None:
    fn = functions.lookup(str(node.this))
    return fn if fn is not None and functions.is_aggregate(fn) else None


def _aggregate_calls(
    select: exp.Select, having: exp.Having | None, locate: Locate
) -> list[exp.AggFunc | exp.Anonymous | exp.Filter]:
    """The SELECT's and HAVING's aggregate calls, each once; a call with ``FILTER (WHERE ...)`` is
    the Filter node (its aggregate not a call of its own)."""
    calls: list[exp.AggFunc | exp.Anonymous | exp.Filter] = []
    seen: set[str] = set()
    filtered: set[int] = set()  # the aggregates under a FILTER
    roots: list[exp.Expr] = list(select.expressions) + ([having] if having is not None else [])
    for root in roots:
        for node in root.walk():
            if id(node) in filtered:
                continue
            if isinstance(node, exp.Window) and isinstance(node.this, exp.AggFunc | exp.Filter):
                filtered.update(id(n) for n in node.this.walk())  # an OVER aggregation (_over_windows)
                continue
            if isinstance(node, exp.Filter):
                inner = node.this
                if not isinstance(inner, exp.AggFunc) and not (
                    isinstance(inner, exp.Anonymous) and _python_aggregate(inner) is not None
                ):
                    raise locate.refuse(node, "FILTER (WHERE ...) follows an aggregate call")
                if isinstance(inner, exp.AggFunc) and type(inner) not in _AGGREGATES:
                    raise locate.refuse(
                        inner, f"aggregate {inner.sql_name()} is not supported (COUNT, SUM, MIN, MAX, AVG)"
                    )
                for condition_node in node.expression.walk():
                    if isinstance(condition_node, exp.AggFunc | exp.Filter) or (
                        isinstance(condition_node, exp.Anonymous) and _python_aggregate(condition_node)
                    ):
                        raise locate.refuse(condition_node, "an aggregate in FILTER (WHERE ...)")
                filtered.add(id(inner))
                key = normalized(node)
                if key not in seen:
                    seen.add(key)
                    calls.append(node)
            elif isinstance(node, exp.Anonymous) and _python_aggregate(node) is not None:
                key = normalized(node)
                if key not in seen:
                    seen.add(key)
                    calls.append(node)
            elif isinstance(node, exp.AggFunc):
                if type(node) not in _AGGREGATES:
                    raise locate.refuse(
                        node, f"aggregate {node.sql_name()} is not supported (COUNT, SUM, MIN, MAX, AVG)"
                    )
                key = normalized(node)
                if key not in seen:
                    seen.add(key)
                    calls.append(node)
    where = select.args.get("where")
    if where is not None:
        for node in where.walk():
            if isinstance(node, exp.AggFunc) or (isinstance(node, exp.Anonymous) and _python_aggregate(node)):
                raise locate.refuse(node, "an aggregate in WHERE (HAVING filters on aggregates)")
    return calls


def _plan_aggregate(
    select: exp.Select,
    group: exp.Group | None,
    calls: list[exp.AggFunc | exp.Anonymous | exp.Filter],
    node: Node,
    scope: Scope,
    window: WindowTvf | None,
    locate: Locate,
    *,
    propagated: bool = False,
    group_window: exp.Anonymous | None = None,
    input_mode: ChangelogMode = APPEND,
) -> tuple[Node, Scope, bool]:
    """``propagated``: ``window`` is a window aggregation's result grouped again by its window
    columns (ordinary keys here; no window_start/window_end of its own)."""
    group_nodes = list(group.expressions) if group is not None else []
    for key in ("grouping_sets", "cube", "rollup"):
        if group is not None and group.args.get(key):
            raise locate.refuse(group, f"GROUP BY {key.upper().replace('_', ' ')} is not supported")
    window_keys: list[exp.Expr] = [g for g in group_nodes if isinstance(g, exp.Column) and g.name in WINDOW_COLUMNS]
    computed: dict[str, str] = {}
    if propagated:
        window_keys = []
    elif group_window is not None:
        window_keys = [group_window]
        auxiliaries = _window_auxiliaries(select, group_window, locate)
        if window is not None and window.processing_time and "window_time" in auxiliaries.values():
            name = str(group_window.this).upper()
            raise locate.refuse(
                group_window,
                f"{name}_ROWTIME of a processing-time window: it has no event time ({name}_START, _END do)",
            )
        computed.update(auxiliaries)
    elif window is not None:
        names = {g.name for g in window_keys}
        if not {"window_start", "window_end"} <= names:
            raise locate.refuse(
                group or select, "a window aggregation groups by window_start, window_end (both) and its keys"
            )
    elif window_keys:
        raise locate.refuse(window_keys[0], f"{window_keys[0].name} without a window TVF in FROM")
    keys: list[NamedExpression] = []
    columns: dict[str, SqlType | None] = {}
    for g in group_nodes:
        if g in window_keys:
            continue
        _refuse_nested(g, locate)
        if isinstance(g, exp.Literal):
            raise locate.refuse(g, "GROUP BY a position or literal is not supported")
        name = g.name if isinstance(g, exp.Column) else f"$key{len(keys)}"
        if name in columns:
            continue
        keys.append(_named(g, name, scope, locate))
        computed[normalized(g)] = name
        columns[name] = scope.columns.get(name) if isinstance(g, exp.Column) else None
    if window is not None and window.partition and not propagated:
        grouped = [g for g in group_nodes if g not in window_keys]
        if sorted(normalized(g) for g in grouped) != sorted(window.partition):
            raise locate.refuse(
                group or select,
                f"a SESSION window aggregation groups by window_start, window_end and exactly its PARTITION BY "
                f"columns ({', '.join(window.partition)})",
            )
    aggregates = []
    for i, written in enumerate(calls):
        if not input_mode.appends:
            if isinstance(written, exp.Anonymous):
                raise locate.refuse(
                    written,
                    f"Python aggregate {written.this} over an updating result (it has no retract) is not supported",
                )
        call = _aggregate_call(written, i, scope, locate)
        aggregates.append(call)
        computed[normalized(written)] = call.name
        columns[call.name] = BIGINT if call.function == "COUNT" else None
    if window is not None and not propagated:
        columns.update({c: TIMESTAMP for c in WINDOW_COLUMNS})
    out_scope = Scope(columns, scope.qualifiers, computed)
    # every projected column outside an aggregate must be a group key (SQL's rule)
    for projection in select.expressions:
        _check_grouped(projection, out_scope, locate)
    holds_input_key = not input_mode.appends and _holds_input_key(group_nodes, node)
    aggregate = Aggregate(node, tuple(keys), tuple(aggregates), window, input_mode, holds_input_key=holds_input_key)
    return aggregate, out_scope, window is None


def _changelog_source(node: Node) -> bool:
    """A scan of a 'postgres-cdc' or 'upsert-kafka' table: its changelog's rows are whole rows."""
    return isinstance(node, Scan) and is_changelog_source(node.table)


def _holds_input_key(group_nodes: list[exp.Expr], node: Node) -> bool:
    """Whether each GROUP BY key is a column the input changelog's projection passes through from
    its aggregate's own keys (Nexmark q4's ``Q.category`` of ``GROUP BY A.id, A.category``)."""
    if not isinstance(node, Project) or not isinstance(node.input, Aggregate):
        return False
    inner_keys = {k.sql for k in node.input.keys}
    passed = {o.name for o in node.outputs if o.sql in inner_keys}
    return bool(group_nodes) and all(isinstance(g, exp.Column) and g.name in passed for g in group_nodes)


def _aggregate_call(
    written: exp.AggFunc | exp.Anonymous | exp.Filter, i: int, scope: Scope, locate: Locate
) -> AggregateCall:
    """One aggregate call (``$agg<i>``), with its ``FILTER (WHERE ...)`` if written with one."""
    call, condition = written, None
    if isinstance(written, exp.Filter):
        call = written.this
        _refuse_nested(written.expression.this, locate)
        condition = _named(written.expression.this, f"$filter{i}", scope, locate)
    if isinstance(call, exp.Anonymous):
        return replace(_python_call(call, f"$agg{i}", i, scope, locate), condition=condition)
    assert isinstance(call, exp.AggFunc)
    function = _AGGREGATES[type(call)]
    argument = call.this
    distinct = isinstance(argument, exp.Distinct)
    if distinct:
        assert isinstance(argument, exp.Distinct)
        if len(argument.expressions) != 1:
            raise locate.refuse(call, f"{function}(DISTINCT ...) takes one argument")
        argument = argument.expressions[0]
    if isinstance(call, exp.Count) and (argument is None or isinstance(argument, exp.Star)):
        if distinct:
            raise locate.refuse(call, "COUNT(DISTINCT *) is not supported")
        named_argument = None
    else:
        if argument is None or isinstance(argument, exp.Star):
            raise locate.refuse(call, f"{function}(*) is not supported")
        _refuse_nested(argument, locate)
        for inner in argument.walk():
            if isinstance(inner, exp.AggFunc):
                raise locate.refuse(inner, "an aggregate inside an aggregate")
        named_argument = _named(argument, f"$arg{i}", scope, locate)
    return AggregateCall(f"$agg{i}", function, distinct, named_argument, normalized(written), condition=condition)


def _over_windows(select: exp.Select, locate: Locate) -> list[exp.Window]:
    """The SELECT list's OVER aggregations (``SUM(x) OVER (...)``); one in WHERE or HAVING is refused."""
    found = [
        n
        for projection in select.expressions
        for n in projection.walk()
        if isinstance(n, exp.Window) and isinstance(n.this, exp.AggFunc | exp.Filter)
    ]
    for key in ("where", "having"):
        clause = select.args.get(key)
        for n in clause.walk() if clause is not None else ():
            if isinstance(n, exp.Window):
                raise locate.refuse(n, f"an OVER aggregation in {key.upper()}")
    return found


def _frame(window: exp.Window, locate: Locate) -> tuple[Literal["ROWS", "RANGE"], int | None]:
    """The frame of ``OVER (... ORDER BY ts [ROWS|RANGE BETWEEN p PRECEDING AND CURRENT ROW])``:
    its kind and how far back (rows or ms; None: UNBOUNDED). No frame is Flink's default, RANGE
    UNBOUNDED PRECEDING."""
    spec = window.args.get("spec")
    if spec is None:
        return "RANGE", None
    kind, start, side = spec.args.get("kind"), spec.args.get("start"), spec.args.get("start_side")
    end, end_side = spec.args.get("end"), spec.args.get("end_side")
    shape = "ROWS|RANGE BETWEEN ... PRECEDING AND CURRENT ROW"
    bounded = str(side).upper() == "PRECEDING" and str(end).upper() == "CURRENT ROW" and not end_side
    if kind not in ("ROWS", "RANGE") or not bounded:
        raise locate.refuse(window, f"an OVER frame other than {shape}")
    if isinstance(start, str) and start.upper() == "UNBOUNDED":
        return kind, None
    if kind == "ROWS":
        if not (isinstance(start, exp.Literal) and not start.is_string and start.this.isdigit()):
            raise locate.refuse(window, "ROWS BETWEEN n PRECEDING takes a whole number n")
        return "ROWS", int(start.this)
    ms = interval_ms(start) if isinstance(start, exp.Interval) else None
    if ms is None or ms < 0:
        raise locate.refuse(
            window, "RANGE BETWEEN INTERVAL ... PRECEDING takes an INTERVAL literal (MILLISECOND to DAY)"
        )
    return "RANGE", ms


def _window_shape(window: exp.Window) -> str:
    """An OVER clause's text without its aggregate."""
    bare = window.copy()
    bare.set("this", exp.Null())
    return normalized(bare)


def _plan_over(
    windows: list[exp.Window], node: Node, scope: Scope, time_column: str | None, locate: Locate
) -> tuple[Node, Scope]:
    """The SELECT's OVER aggregations, all over one window (as Flink requires), as one operator."""
    first = windows[0]
    if changelog_of(node) is not None:
        raise locate.refuse(first, "an OVER aggregation over an updating result (a changelog) is not supported")
    shape = _window_shape(first)
    for other in windows[1:]:
        if _window_shape(other) != shape:
            raise locate.refuse(other, "OVER aggregations over different windows in one SELECT")
    if first.alias and not first.args.get("order"):
        raise locate.refuse(first, "a named WINDOW is not supported (write OVER (...))")
    order = first.args.get("order")
    ordered = order.expressions if order is not None else []
    if len(ordered) != 1 or not isinstance(ordered[0].this, exp.Column) or ordered[0].args.get("desc"):
        raise locate.refuse(first, "an OVER aggregation takes ORDER BY its input's event time, ascending")
    if time_column is None or ordered[0].this.name != time_column:
        raise locate.refuse(
            ordered[0],
            f"OVER ... ORDER BY {ordered[0].this.name}: not the input's event time "
            f"({time_column + ' is' if time_column else 'it has none'})",
        )
    frame, preceding = _frame(first, locate)
    partition = []
    for i, key in enumerate(first.args.get("partition_by") or []):
        _refuse_nested(key, locate)
        partition.append(_named(key, f"$partition{i}", scope, locate))
    calls, computed = [], dict(scope.computed)
    columns = dict(scope.columns)
    for i, window in enumerate(windows):
        for inner in window.this.walk():
            if inner is not window.this and isinstance(inner, exp.Window):
                raise locate.refuse(inner, "an OVER aggregation inside another")
        call = replace(_aggregate_call(window.this, i, scope, locate), name=f"$over{i}", sql=normalized(window))
        calls.append(call)
        computed[normalized(window)] = call.name
        columns[call.name] = BIGINT if call.function == "COUNT" else None
    over = OverAggregate(node, tuple(partition), time_column, frame, preceding, tuple(calls))
    return over, Scope(columns, scope.qualifiers, computed)


def _python_call(call: exp.Anonymous, name: str, i: int, scope: Scope, locate: Locate) -> AggregateCall:
    """A registered Python aggregate function's call: its arguments' values as a tuple for ``add``."""
    fn = _python_aggregate(call)
    for argument in call.expressions:
        if isinstance(argument, exp.Distinct | exp.Star):
            raise locate.refuse(call, f"{call.this}(DISTINCT ...) / {call.this}(*) is not supported")
        _refuse_nested(argument, locate)
        for inner in argument.walk():
            if isinstance(inner, exp.AggFunc) or (isinstance(inner, exp.Anonymous) and _python_aggregate(inner)):
                raise locate.refuse(inner, "an aggregate inside an aggregate")
    parts = tuple(compile_expression(a, scope, locate) for a in call.expressions)
    arguments = NamedExpression(f"$arg{i}", normalized(call), lambda row: tuple(f(row) for f in parts))
    return AggregateCall(name, "PYTHON", False, arguments, normalized(call), fn)


_AUXILIARIES: Final = {"_START": "window_start", "_END": "window_end", "_ROWTIME": "window_time"}


def _window_auxiliaries(select: exp.Select, group_window: exp.Anonymous, locate: Locate) -> dict[str, str]:
    """``SESSION_START(ts, gap)`` and its kind: the window's columns, with the group window's arguments."""
    name = str(group_window.this).upper()
    arguments = [normalized(a) for a in group_window.expressions]
    found: dict[str, str] = {}
    roots: list[exp.Expr] = list(select.expressions)
    having = select.args.get("having")
    if having is not None:
        roots.append(having)
    for root in roots:
        for node in root.walk():
            if not isinstance(node, exp.Anonymous):
                continue
            called = str(node.this).upper()
            for suffix, column in _AUXILIARIES.items():
                if called == name + suffix:
                    if [normalized(a) for a in node.expressions] != arguments:
                        raise locate.refuse(node, f"{called} takes the arguments of the GROUP BY's {name}(...)")
                    found[normalized(node)] = column
    return found


def _check_grouped(node: exp.Expr, scope: Scope, locate: Locate) -> None:
    if normalized(node) in scope.computed:
        return
    if isinstance(node, exp.Column):
        if node.name not in scope.columns or node.name.startswith("$"):
            raise locate.refuse(node, f"column {node.name} is neither grouped nor aggregated")
        return
    for child in node.iter_expressions():
        _check_grouped(child, scope, locate)


__all__ = [
    "Aggregate",
    "OverAggregate",
    "Catalog",
    "QueryPlan",
    "plan_query",
    "AggregateCall",
    "Filter",
    "InsertPlan",
    "Interval",
    "NamedExpression",
    "Node",
    "Project",
    "Scan",
    "OrderKey",
    "Sink",
    "TopN",
    "WindowTvf",
    "plan_insert",
    "Key",
    "upsert_keys",
]
