"""Streaming SQL: a script of Flink SQL statements compiled to an ordinary Weir job (docs/sql.md).

``sql(env, script)`` in a job's ``build(env)`` adds the script's INSERT statements to the job (with
whatever else the job builds in Python) and answers a :class:`SqlJob`, whose ``query(select)`` gives
the rows of a SELECT over the script's tables as a ``DataStream`` of dicts, for the job to go on with
in Python; ``weir sql FILE.sql`` / ``weir sql -e "..."`` submits a job
of that script alone; ``explain(script)`` answers what EXPLAIN prints: each statement's operators
with their uids.

The layers: ``script`` (statements, sqlglot's tokenizer and parser), ``catalog`` (tables and their
connectors), ``expressions`` (scalar SQL as Python functions of a row), ``plan`` (the logical plan of
an INSERT, frozen values), ``compile`` (the plan as job API calls)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sqlglot import exp

from weir.api import DataStream, Environment
from weir.sql.catalog import Table, flink_duration_ms
from weir.sql.compile import Operator, RowDecoder, compile_insert, compile_query, source_uid, statement_digest
from weir.sql.errors import Position, SqlError
from weir.sql.functions import registered, registry, resolve
from weir.sql.minibatch import MiniBatchConfig
from weir.sql.plan import Catalog, InsertPlan, UpsertMaterialize, plan_insert, plan_query
from weir.sql.script import (
    CreateFunction,
    CreateTable,
    CreateView,
    Explain,
    Insert,
    SetOption,
    Statement,
    StatementSet,
    Text,
    parse_expression,
    parse_script,
)

SETTINGS: Final = {
    "pipeline.name": "the job's name (weir sql)",
    "parallelism.default": "the job's parallelism (weir sql)",
    "table.local-time-zone": "UTC only: timestamps are UTC",
    "table.exec.state.ttl": "the state TTL of the INSERTs after it: regular joins' and GROUP BY without a window",
    "table.exec.mini-batch.enabled": (
        "'true': each GROUP BY without a window and regular join of the INSERTs after it applies its input "
        "in mini-batches, a GROUP BY one change per key and batch"
    ),
    "table.exec.mini-batch.allow-latency": "the longest a row waits in a mini-batch (a duration above 0)",
    "table.exec.mini-batch.size": "the most rows a mini-batch holds (above 0)",
    "table.exec.sink.upsert-materialize": (
        "'AUTO' (the default), 'FORCE' or 'NONE': whether an upsert sink of the INSERTs after it keeps every row "
        "of each of its keys (Flink's SinkUpsertMaterializer): AUTO when its PRIMARY KEY holds no upsert key of "
        "the changelog written"
    ),
    "weir.columnar": (
        "'true': the INSERTs after it run a scan -> filter/projection chain and TUMBLE/HOP window aggregates "
        "on Arrow batches"
    ),
}


def duration_ms(value: str, position: Position, key: str = "table.exec.state.ttl") -> int:
    """Flink's duration text (``'1 h'``, ``'30 min'``, ``'90s'``, ``'3600000'``: milliseconds) in ms."""
    ms = flink_duration_ms(value)
    if ms is None:
        raise SqlError(
            f"SET '{key}': {value!r} is not a duration (like '1 h', '30 min', '90 s')", position
        )
    return ms


class _MiniBatchSettings:
    """The ``table.exec.mini-batch.*`` settings so far, as Flink reads them: off unless enabled, and
    enabled only with an allow-latency and a size above 0 (Flink's defaults, 0 ms and -1, refuse it)."""

    def __init__(self) -> None:
        self.enabled, self.latency_ms, self.size = False, 0, -1

    def set(self, option: SetOption) -> None:
        value = option.value.strip()
        match option.key:
            case "table.exec.mini-batch.enabled":
                if value.lower() not in ("true", "false"):
                    raise SqlError(f"SET '{option.key}': {option.value!r} is not 'true' or 'false'", option.position)
                self.enabled = value.lower() == "true"
            case "table.exec.mini-batch.allow-latency":
                self.latency_ms = duration_ms(value, option.position, option.key)
            case "table.exec.mini-batch.size":
                if not value.lstrip("-").isdigit():
                    raise SqlError(f"SET '{option.key}': {option.value!r} is not a whole number", option.position)
                self.size = int(value)
            case _:
                raise AssertionError(option.key)  # SETTINGS names no other

    def config(self, position: Position) -> MiniBatchConfig | None:
        """The mini-batch of an INSERT planned now (at ``position``); None: off."""
        if not self.enabled:
            return None
        if self.latency_ms <= 0 or self.size <= 0:
            raise SqlError(
                "SET 'table.exec.mini-batch.enabled' = 'true' needs 'table.exec.mini-batch.allow-latency' "
                f"above 0 and 'table.exec.mini-batch.size' above 0 (now {self.latency_ms} ms and {self.size}), "
                "as Flink does",
                position,
            )
        return MiniBatchConfig(self.latency_ms, self.size)


@dataclass(frozen=True)
class PlannedStatement:
    insert: Insert
    plan: InsertPlan
    uid_prefix: str
    state_ttl_ms: int = 0  # SET 'table.exec.state.ttl' before it; 0: state kept
    columnar: bool = False  # SET 'weir.columnar' = 'true' before it
    mini_batch: MiniBatchConfig | None = None  # SET 'table.exec.mini-batch.enabled' = 'true' before it


def upsert_materialize(option: SetOption) -> UpsertMaterialize:
    """``SET 'table.exec.sink.upsert-materialize'``'s value (Flink's names, any case)."""
    try:
        return UpsertMaterialize[option.value.strip().upper()]
    except KeyError:
        raise SqlError(
            f"SET '{option.key}': {option.value!r} is not 'NONE', 'AUTO' or 'FORCE'", option.position
        ) from None


@dataclass(frozen=True)
class Script:
    """A script read and planned: its tables, its SET options, the INSERTs to run, the EXPLAINs."""

    tables: dict[str, Table]
    views: dict[str, CreateView]
    settings: dict[str, str]
    inserts: tuple[PlannedStatement, ...]
    explains: tuple[tuple[Position, tuple[PlannedStatement, ...]], ...]
    functions: Mapping[str, Any] = field(default_factory=dict)  # by upper-case name


def plan_script(text: str, functions: Mapping[str, Any] | None = None) -> Script:
    """Read and plan every statement; the first one Weir does not run raises SqlError (one line, ``line:column``).
    ``functions``: Python functions the script calls, by name (weir.sql.functions)."""
    statements: tuple[Statement, ...] = parse_script(text)
    python = registry(functions or {})
    with registered(python):
        script = _plan_statements(text, statements, python)
    return script


def _plan_statements(text: str, statements: tuple[Statement, ...], python: dict[str, Any]) -> Script:
    tables: dict[str, Table] = {}
    views: dict[str, CreateView] = {}
    settings: dict[str, str] = {}
    inserts: list[PlannedStatement] = []
    explains: list[tuple[Position, tuple[PlannedStatement, ...]]] = []
    seen: Counter[str] = Counter()
    state_ttl_ms = 0
    columnar = False
    mini_batch = _MiniBatchSettings()
    materialize = UpsertMaterialize.AUTO

    def planned(insert: Insert, *, count: bool = True) -> PlannedStatement:
        digest = statement_digest(insert.normalized)
        if count:
            seen[digest] += 1
            n = seen[digest]
        else:
            n = seen[digest] + 1
        prefix = f"sql-{digest}" + ("" if n == 1 else f"-{n}")
        plan = plan_insert(insert, Catalog(dict(tables), dict(views)), text, materialize)
        return PlannedStatement(insert, plan, prefix, state_ttl_ms, columnar, mini_batch.config(insert.position))

    for statement in statements:
        match statement:
            case CreateTable():
                name = statement.table.name
                if name in tables or name in views:
                    raise SqlError(f"table {name} is created twice", statement.position)
                tables[name] = statement.table
            case CreateView():
                if statement.name in tables or statement.name in views:
                    raise SqlError(f"view {statement.name}: the name is taken", statement.position)
                views[statement.name] = statement
            case CreateFunction() if statement.language != "PYTHON":
                if statement.name.upper() not in python:  # a JVM class: given as Python, or refused
                    raise SqlError(
                        f"CREATE FUNCTION {statement.name}: {statement.language} classes do not run on Weir; give "
                        f"a Python function named {statement.name} (weir sql --functions FILE.py) or declare "
                        "it AS 'module.attr' LANGUAGE PYTHON",
                        statement.position,
                    )
            case CreateFunction():
                if statement.name.upper() in python:
                    raise SqlError(f"function {statement.name} is created twice", statement.position)
                fn = resolve(statement.name, statement.target, statement.position)
                python.update(registry({statement.name: fn}, statement.position))
            case SetOption():
                if statement.key not in SETTINGS:
                    raise SqlError(
                        f"SET '{statement.key}' is not supported (supported: {', '.join(SETTINGS)})", statement.position
                    )
                if statement.key == "table.local-time-zone" and statement.value != "UTC":
                    raise SqlError("SET 'table.local-time-zone': only 'UTC'", statement.position)
                if statement.key == "table.exec.state.ttl":
                    state_ttl_ms = duration_ms(statement.value, statement.position)
                if statement.key == "weir.columnar":
                    if statement.value.lower() not in ("true", "false"):
                        raise SqlError(
                            f"SET 'weir.columnar': {statement.value!r} is not 'true' or 'false'", statement.position
                        )
                    columnar = statement.value.lower() == "true"
                if statement.key.startswith("table.exec.mini-batch."):
                    mini_batch.set(statement)
                if statement.key == "table.exec.sink.upsert-materialize":
                    materialize = upsert_materialize(statement)
                settings[statement.key] = statement.value
            case Insert():
                inserts.append(planned(statement))
            case StatementSet():
                inserts.extend(planned(i) for i in statement.inserts)
            case Explain():
                explains.append((statement.position, tuple(planned(i, count=False) for i in statement.inserts)))
    return Script(tables, views, settings, tuple(inserts), tuple(explains), python)


class SqlJob:
    """The SQL of a job: its script planned, its INSERTs added to ``env``'s job, and the tables' sources
    (one per table in the job) that :meth:`query` reads too."""

    def __init__(self, env: Environment, text: str, functions: Mapping[str, Any] | None = None) -> None:
        self.env, self.text = env, text
        self.script = plan_script(text, functions)
        self.sources: dict[str, DataStream] = {}
        self.decoders: dict[str, RowDecoder] = {}  # the sources' decoders: a later statement widens their columns
        for statement in self.script.inserts:
            compile_insert(
                env,
                statement.plan,
                statement.uid_prefix,
                text,
                self.sources,
                statement.state_ttl_ms,
                statement.columnar,
                self.decoders,
                statement.mini_batch,
            )

    def query(self, select: str) -> DataStream:
        """The rows of ``select`` (a SELECT over the script's tables and views) as a stream of dicts,
        column name -> value, for the job to go on with in Python. A GROUP BY without a window gives
        each key's updated row after each input row. Its operators' uids are
        ``sql-<digest of the SELECT>-<n>-<kind>``; its positions count from the SELECT's first line."""
        parsed = parse_expression(Text(select), select, 0)
        if not isinstance(parsed, exp.Query):
            raise SqlError("query() takes a SELECT", Position(1, 1))
        catalog = Catalog(self.script.tables, self.script.views)
        with registered(self.script.functions):
            plan = plan_query(parsed, 0, catalog, select)
        prefix = f"sql-{statement_digest(parsed.sql(dialect='spark'))}"
        return compile_query(self.env, plan.node, prefix, select, self.sources, self.decoders)


def sql(env: Environment, text: str, functions: Mapping[str, Any] | None = None) -> SqlJob:
    """Add the script's INSERT statements to the job ``env`` builds; answers the job's SQL, whose
    :meth:`SqlJob.query` gives a SELECT's rows as a stream. ``functions``: Python scalar functions
    (callables) and aggregate functions (``create``, ``add(acc, *values)``, ``merge``, ``result``)
    the script calls, by name."""
    return SqlJob(env, text, functions)


def operators_of(statement: PlannedStatement, text: str) -> list[Operator]:
    return compile_insert(
        None,
        statement.plan,
        statement.uid_prefix,
        text,
        state_ttl_ms=statement.state_ttl_ms,
        columnar=statement.columnar,
        mini_batch=statement.mini_batch,
    )


def explain(text: str, functions: Mapping[str, Any] | None = None) -> str:
    """What EXPLAIN prints for each EXPLAIN statement of the script (or, without one, for each INSERT):
    the statement, then each operator's uid, kind and what it does, from source to sink."""
    script = plan_script(text, functions)
    groups = [list(statements) for _, statements in script.explains] or [[s] for s in script.inserts]
    lines: list[str] = []
    for group in groups:
        for statement in group:
            lines.append(f"== {statement.insert.normalized} (at {statement.insert.position})")
            for operator in operators_of(statement, text):
                lines.append(f"{operator.uid}  {operator.kind}: {operator.detail}")
    return "\n".join(lines)


__all__ = ["PlannedStatement", "Script", "SqlError", "SqlJob", "explain", "plan_script", "source_uid", "sql"]
