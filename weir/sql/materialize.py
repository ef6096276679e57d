"""Flink's ``SinkUpsertMaterializer``: the rows of an updating result that share one upsert sink key,
so that the sink holds a row of that key while any is in the result (docs/sql.md, "Upsert sinks and
the materializer").

An upsert sink (``jdbc``, ``upsert-kafka``) keeps one row per ``PRIMARY KEY``. When the planner cannot
prove that key identifies a row of its input's changelog (a regular join written by one side's
column, a GROUP BY written to a key narrower than its own, ``weir.sql.plan.upsert_keys``), two rows
of the result may share a sink key: written as they come, the first one's ``-U``/``-D`` deletes the
key although the other is still in the result. The materializer, keyed by the sink key, keeps every
row of the key in order of arrival and turns the changelog into what the sink must hold:

- :func:`materialized`: the pure decision. A ``+I``/``+U`` joins the key's rows (replacing the row of
  the same upsert key when the input has one, else appended) and is written (``+I`` when the key
  held nothing, else ``+U``); a ``-U``/``-D`` removes the first row equal to it (by the upsert key
  when known, else whole): nothing is written when another row was the last, the now-last row is
  written (``+U``) when the last one left, and the key is deleted (``-D``) when none remain. A
  retraction of a row the key does not hold (its state expired) writes nothing, as Flink's.
- :class:`SinkUpsertMaterializer`: the thin keyed process function that applies it to value state
  ``rows``, ``(1, [row, ...])`` (``weir.sql.state_format.SINK_UPSERT_MATERIALIZER_STATE``,
  docs/formats.md), under the statement's ``table.exec.state.ttl``.

Every decision on a change's kind is a ``match`` ending in ``assert_never``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from weir.api import Collector, KeyedProcessContext, KeyedProcessFunction, StateTtlConfig
from weir.sql.changelog import Change, RowKind
from weir.sql.state_format import SINK_UPSERT_MATERIALIZER_STATE

Row = Mapping[str, Any]


@dataclass(frozen=True)
class MaterializeStep:
    """What one change does to a sink key: its rows afterwards (in order of arrival), the change the
    sink writes (None: nothing), and whether a retraction found no row to remove (``missing``)."""

    rows: tuple[Row, ...]
    written: Change | None
    missing: bool = False


def _same(a: Row, b: Row, upsert_key: tuple[str, ...] | None) -> bool:
    if upsert_key is None:
        return dict(a) == dict(b)
    return all(a[column] == b[column] for column in upsert_key)


def _first(rows: tuple[Row, ...], row: Row, upsert_key: tuple[str, ...] | None) -> int | None:
    return next((i for i, held in enumerate(rows) if _same(row, held, upsert_key)), None)


def materialized(rows: tuple[Row, ...], change: Change, upsert_key: tuple[str, ...] | None) -> MaterializeStep:
    """The sink key's rows after ``change`` and what the sink writes, when the key holds ``rows``
    (Flink's SinkUpsertMaterializer). ``upsert_key``: the input's upsert key columns (a row replaces
    and is retracted by the row of its key); None: rows are compared whole, each copy kept."""
    match change.kind:
        case RowKind.INSERT | RowKind.UPDATE_AFTER:
            row = dict(change.row)
            kind = RowKind.INSERT if not rows else RowKind.UPDATE_AFTER
            at = _first(rows, row, upsert_key) if upsert_key is not None else None
            after = (*rows, row) if at is None else (*rows[:at], row, *rows[at + 1 :])
            return MaterializeStep(after, Change(kind, row))
        case RowKind.UPDATE_BEFORE | RowKind.DELETE:
            at = _first(rows, change.row, upsert_key)
            if at is None:
                return MaterializeStep(rows, None, missing=True)
            after = (*rows[:at], *rows[at + 1 :])
            if not after:
                return MaterializeStep(after, Change(RowKind.DELETE, dict(change.row)))
            if at == len(rows) - 1:
                return MaterializeStep(after, Change(RowKind.UPDATE_AFTER, after[-1]))
            return MaterializeStep(after, None)
        case _:
            assert_never(change.kind)


def rows_of(stored: Any) -> tuple[Row, ...]:
    """A sink key's rows from its state value (None: none)."""
    if stored is None:
        return ()
    return tuple(SINK_UPSERT_MATERIALIZER_STATE.body(stored))


def stored_of(rows: tuple[Row, ...]) -> Any:
    """The state value of a sink key's rows (built-in values only: docs/formats.md)."""
    return SINK_UPSERT_MATERIALIZER_STATE.tagged([dict(row) for row in rows])


ROWS_STATE = "rows"


class SinkUpsertMaterializer(KeyedProcessFunction):
    """Keyed by the upsert sink's primary key: each change of the sink's input applied by
    :func:`materialized` to the key's rows in value state ``rows`` (under ``ttl``: a key untouched
    for that long forgets its rows, as Flink's, and a later retraction of them writes nothing), and
    what it writes emitted as a :class:`~weir.sql.changelog.Change` (``+I``, ``+U`` or ``-D``)."""

    def __init__(self, upsert_key: tuple[str, ...] | None, ttl: StateTtlConfig | None = None) -> None:
        self.upsert_key, self.ttl = upsert_key, ttl

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        assert isinstance(value, Change), f"sink-upsert-materializer got {value!r}"
        state = ctx.value_state(ROWS_STATE, self.ttl)
        rows = rows_of(state.value())
        step = materialized(rows, value, self.upsert_key)
        if step.written is not None:
            out.collect(step.written)
        if step.rows is rows:
            return
        if step.rows:
            state.update(stored_of(step.rows))
        else:
            state.clear()


__all__ = ["ROWS_STATE", "MaterializeStep", "SinkUpsertMaterializer", "materialized", "rows_of", "stored_of"]
