"""The PostgreSQL sinks and their builder (Flink's ``JdbcSink.exactlyOnceSink(...)`` and ``JdbcSink.sink(...)``).

::

    sink = (
        PostgresSink.builder()
        .table("window_results")
        .columns(["key", "window_start", "count"])
        .key_columns(["key", "window_start"])
        .build()
    )
    results.key_by("key").sink_to(sink, uid="postgres-sink")

``two_phase`` (the default) upserts each checkpoint's rows in one prepared transaction, committed when
the checkpoint completes (exactly once; the server needs ``max_prepared_transactions`` > 0); ``upsert``
commits batches as they fill (idempotent by key, at least once). ``stream.sink_to_postgres(table,
uid=..., **options)`` is this builder with the same option names. See docs/sinks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, assert_never

from weir.api.connector import OperatorFactory, Options, Sink, WithOnError, required
from weir.core.changelog import Delete
from weir.core.descriptors import SinkDelivery, SinkSpec, SinkSystem
from weir.core.rejections import OnRecordError

if TYPE_CHECKING:
    from weir.operators.sinks import PostgresUpsertSinkOperator
    from weir.operators.transactional_sinks import TwoPhasePostgresSinkOperator

PostgresDelivery = Literal["two_phase", "upsert"]

OPTIONS = Options("postgres sink")


class ColumnValues:
    """A PostgreSQL sink's default ``row``: the value's items named by the columns, in their order."""

    __slots__ = ("columns",)

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def __call__(self, value: Any) -> tuple[Any, ...]:
        return tuple(value[c] for c in self.columns)


@dataclass(frozen=True)
class PostgresSink(Sink):
    """Upserts each value into a table by its key columns, or deletes a key (``row`` returns
    ``Delete(key)``). Made by :meth:`builder`."""

    table: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    row: Callable[[Any], tuple[Any, ...] | Delete]
    delivery: PostgresDelivery
    version_column: str | None

    @staticmethod
    def builder() -> PostgresSinkBuilder:
        return PostgresSinkBuilder()

    def descriptor(self) -> SinkSpec:
        match self.delivery:
            case "two_phase":
                return SinkSpec(SinkSystem.POSTGRES, self.table, SinkDelivery.EXACTLY_ONCE)
            case "upsert":
                return SinkSpec(SinkSystem.POSTGRES, self.table, SinkDelivery.AT_LEAST_ONCE)
            case _:
                assert_never(self.delivery)

    def operator(self) -> OperatorFactory:
        return WithOnError(self._create)

    def _create(self, on_error: OnRecordError) -> TwoPhasePostgresSinkOperator | PostgresUpsertSinkOperator:
        # The operator runs in the TaskManager: imported there, so a client builds the job without the server install.
        from weir.operators.sinks import PostgresUpsertSinkOperator
        from weir.operators.transactional_sinks import TwoPhasePostgresSinkOperator

        match self.delivery:
            case "two_phase":
                sink: type[TwoPhasePostgresSinkOperator | PostgresUpsertSinkOperator] = TwoPhasePostgresSinkOperator
            case "upsert":
                sink = PostgresUpsertSinkOperator
            case _:
                assert_never(self.delivery)
        return sink(
            self.table, self.columns, self.key_columns, self.row, version_column=self.version_column, on_error=on_error
        )

    def default_name(self) -> str:
        return f"postgres-sink:{self.table}"


@dataclass(frozen=True)
class _Settings:
    table: str | None = None
    columns: tuple[str, ...] | None = None
    key_columns: tuple[str, ...] | None = None
    row: Callable[[Any], tuple[Any, ...] | Delete] | None = None
    delivery: PostgresDelivery = "two_phase"
    version_column: str | None = None


class PostgresSinkBuilder:
    """Sets a PostgreSQL sink's options one by one; :meth:`build` makes the :class:`PostgresSink`."""

    __slots__ = ("_settings",)

    def __init__(self, settings: _Settings | None = None) -> None:
        self._settings = settings or _Settings()

    def _with(self, **options: Any) -> PostgresSinkBuilder:
        return PostgresSinkBuilder(replace(self._settings, **options))

    def table(self, table: str) -> PostgresSinkBuilder:
        """The table written (required); it must exist, with a unique index on the key columns."""
        return self._with(table=OPTIONS.text("table", table))

    def columns(self, columns: Sequence[str]) -> PostgresSinkBuilder:
        """The columns a row fills, in the order of the row's values (required)."""
        return self._with(columns=_names("columns", columns))

    def key_columns(self, key_columns: Sequence[str]) -> PostgresSinkBuilder:
        """The columns of the table's key, among :meth:`columns` (required): a row replaces the
        stored row of its key."""
        return self._with(key_columns=_names("key_columns", key_columns))

    def row(self, row: Callable[[Any], tuple[Any, ...] | Delete] | None) -> PostgresSinkBuilder:
        """A value to what it does to the table: its row, one item per column, to upsert by the key
        columns, or ``Delete(key)`` (the key columns' values, in their order) to delete the row of
        that key (None, the default: ``value[column]`` for each column)."""
        return self._with(row=OPTIONS.function("row", row))

    def delivery(self, delivery: PostgresDelivery) -> PostgresSinkBuilder:
        """``two_phase`` (default): one prepared transaction per checkpoint, exactly once; rows of a
        key must always reach the same sink subtask (key the stream by the table's key, or use
        parallelism 1). ``upsert``: batches committed as they fill, replays rewrite the same rows."""
        if delivery not in ("two_phase", "upsert"):
            raise OPTIONS.refuse("delivery", "'two_phase' or 'upsert'", delivery)
        return self._with(delivery=delivery)

    def version_column(self, column: str | None) -> PostgresSinkBuilder:
        """An int column among :meth:`columns`: a row never replaces a stored row of a higher version."""
        return self._with(version_column=OPTIONS.optional_text("version_column", column))

    def build(self) -> PostgresSink:
        """The sink, once the options are checked together."""
        s = self._settings
        table = required(OPTIONS, "table", s.table, "give the table to write (.table(name))")
        columns = required(OPTIONS, "columns", s.columns, "give the columns a row fills (.columns([...]))")
        key_columns = required(OPTIONS, "key_columns", s.key_columns, "give the table's key (.key_columns([...]))")
        missing = [c for c in key_columns if c not in columns]
        if missing:
            raise OPTIONS.error(
                f"key_columns {list(key_columns)} must be among the columns {list(columns)}; missing: {missing}"
            )
        if s.version_column is not None and s.version_column not in columns:
            raise OPTIONS.error(f"version_column {s.version_column!r} is missing from the columns {list(columns)}")
        row = s.row or ColumnValues(columns)
        return PostgresSink(table, columns, key_columns, row, s.delivery, s.version_column)


def _names(option: str, given: object) -> tuple[str, ...]:
    """Column names: a non-empty sequence of distinct non-empty strings (a bare string is refused:
    ``"id"`` would be the columns i and d)."""
    if isinstance(given, str) or not isinstance(given, Sequence) or not given:
        raise OPTIONS.refuse(option, "a non-empty sequence of column names, e.g. ('id', 'total')", given)
    names = tuple(given)
    for name in names:
        if not isinstance(name, str) or not name:
            raise OPTIONS.refuse(option, "a sequence of non-empty column names", given)
    if len(set(names)) != len(names):
        raise OPTIONS.refuse(option, "distinct column names", given)
    return names


__all__ = ["ColumnValues", "PostgresDelivery", "PostgresSink", "PostgresSinkBuilder"]
