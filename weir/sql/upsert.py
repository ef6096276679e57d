"""Changelogs into and out of keyed ("upsert") tables: what an upsert sink writes for each change, and
how an upsert source's records become a changelog with whole old rows (Flink's upsert semantics).

- :func:`sink_write`: what an upsert sink (``upsert-kafka``, ``jdbc``) does with a change of its
  input: ``+I``/``+U`` upsert the row by the sink's primary key; ``-D`` deletes the key (upsert-kafka:
  a tombstone, the key with a null value; jdbc: ``DELETE``); ``-U`` deletes its key too when the plan
  keeps it (``keeps_update_before``: its ``+U`` may not follow with the same key, after a WHERE or
  when the sink's key is not the result's own; Flink's Kafka and JDBC sinks write an UPDATE_BEFORE
  that reaches them as a delete), else it is dropped (its ``+U`` overwrites the key, Flink's planner
  drops it before an upsert sink).
- :func:`normalized`: Flink's ``ChangelogNormalize``: an upsert changelog (each record a key's new row,
  ``+U``, or its delete, ``-D``, which may carry only the key) turned into ``+I``/``-U``/``+U``/``-D``
  of whole rows, from the row last seen per key. :class:`ChangelogNormalize` is the keyed operator
  that applies it; its state per key is ``(1, row)`` (``weir.sql.state_format``, docs/formats.md).
- :class:`UpsertKafkaRecords`: an ``upsert-kafka`` table's Kafka record (key and value JSON) as that
  upsert changelog: a value is ``+U`` of the row, a tombstone ``-D`` of the key's columns.

Every decision is a ``match`` ending in ``assert_never``."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from weir.api import Collector, KafkaRecord, KeyedProcessContext, KeyedProcessFunction
from weir.core import json_codec
from weir.sql.catalog import KafkaLayout
from weir.sql.changelog import Change, RowKind
from weir.sql.state_format import CHANGELOG_NORMALIZE_STATE

Row = Mapping[str, Any]


@enum.unique
class SinkWrite(enum.Enum):
    """What an upsert sink does with one change."""

    UPSERT = "upsert"  # write the row at its key
    DELETE = "delete"  # delete the key (a tombstone / DELETE)
    NOTHING = "nothing"  # write nothing


def sink_write(kind: RowKind, *, keeps_update_before: bool) -> SinkWrite:
    """An upsert sink's write of a change of ``kind``. ``keeps_update_before``: the plan cannot prove
    that each -U is followed by a +U of the same sink key (a WHERE between, or a sink key other than
    the result's), so a -U deletes its key; a +U of the same key, when it follows in the same
    checkpoint, writes the row again."""
    match kind:
        case RowKind.INSERT | RowKind.UPDATE_AFTER:
            return SinkWrite.UPSERT
        case RowKind.DELETE:
            return SinkWrite.DELETE
        case RowKind.UPDATE_BEFORE:
            return SinkWrite.DELETE if keeps_update_before else SinkWrite.NOTHING
        case _:
            assert_never(kind)


@dataclass(frozen=True)
class NormalizeStep:
    """What one upsert record emits, and the key's row afterwards (None: the key holds no row)."""

    changes: tuple[Change, ...]
    last: Row | None


def normalized(last: Row | None, change: Change) -> NormalizeStep:
    """The changes an upsert ``change`` of a key emits when the key's last row was ``last`` (None:
    none, or deleted): a new row is ``+I`` (the key had none), ``-U`` of the last and ``+U`` of it (it
    had another), nothing (the same row again: Flink's ChangelogNormalize without a state TTL); a
    delete is ``-D`` of the whole last row, nothing for a key without one. An ``-U`` of an upsert
    changelog (a source that sends its updates' old rows) is dropped: the key's last row is the old
    row, whatever the record holds."""
    match change.kind:
        case RowKind.INSERT | RowKind.UPDATE_AFTER:
            row = dict(change.row)
            if last is None:
                return NormalizeStep((Change(RowKind.INSERT, row),), row)
            if dict(last) == row:
                return NormalizeStep((), last)
            return NormalizeStep((Change(RowKind.UPDATE_BEFORE, last), Change(RowKind.UPDATE_AFTER, row)), row)
        case RowKind.DELETE:
            if last is None:
                return NormalizeStep((), None)
            return NormalizeStep((Change(RowKind.DELETE, last),), None)
        case RowKind.UPDATE_BEFORE:
            return NormalizeStep((), last)
        case _:
            assert_never(change.kind)


class ChangelogNormalize(KeyedProcessFunction):
    """Keyed by a table's primary key: each upsert record's changes as :func:`normalized` decides,
    the key's last row in value state ``last`` as ``(1, {column: value})`` (``CHANGELOG_NORMALIZE_STATE``)."""

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        assert isinstance(value, Change), f"changelog-normalize got {value!r}"
        state = ctx.value_state("last")
        held = state.value()
        last = None if held is None else CHANGELOG_NORMALIZE_STATE.body(held)
        step = normalized(last, value)
        for change in step.changes:
            out.collect(change)
        if step.last is None:
            if held is not None:
                state.clear()
        elif step.last is not last:
            state.update(CHANGELOG_NORMALIZE_STATE.tagged(dict(step.last)))


class UpsertKafkaRecords:
    """An ``upsert-kafka`` table's record as an upsert change: the record key is the JSON object of the
    primary key's columns (as the upsert-kafka sink writes it, Flink's ``'key.format' = 'json'``; each
    named without ``'key.fields-prefix'``, ``layout``); a value is the row (``+U``, decoded by
    ``decode``): every column, whose primary key columns must be the key's (``'value.fields-include'
    = 'ALL'``), or the columns but the key's, which come from the key (``'EXCEPT_KEY'``); a null value (a
    tombstone) is ``-D`` of a row holding only the key's columns. A record without a key, or whose key
    is not the primary key's JSON object, raises (the source's dead letters or the job's failure, as
    any row that does not decode)."""

    def __init__(
        self,
        table: str,
        layout: KafkaLayout,
        decode: Callable[[Mapping[str, Any]], dict[str, Any]],
        decode_key: Callable[[Mapping[str, Any]], dict[str, Any]],
    ) -> None:
        self.table, self.layout, self.decode, self.decode_key = table, layout, decode, decode_key
        self.primary_key = layout.key_columns
        self.names = sorted(name for _column, name in layout.key)

    def __call__(self, record: KafkaRecord) -> Change:
        if record.key is None:
            raise ValueError(f"upsert-kafka table {self.table}: a record without a key (it holds the primary key)")
        key = json_codec.decode(record.key)
        if not isinstance(key, dict) or sorted(key) != self.names:
            raise ValueError(
                f"upsert-kafka table {self.table}: the record key is not a JSON object of the primary key "
                f"({', '.join(self.names)})"
            )
        key_row = self.decode_key(self.layout.fields(key, None))
        if record.value is None:
            return Change(RowKind.DELETE, key_row)
        value = json_codec.decode(record.value)
        if not isinstance(value, dict):
            raise ValueError(f"a row is a JSON object, not {type(value).__name__}")
        row = self.decode(self.layout.fields(key, value))
        if any(row[k] != key_row[k] for k in self.primary_key):
            raise ValueError(
                f"upsert-kafka table {self.table}: the value's primary key columns are not the record key's"
            )
        return Change(RowKind.UPDATE_AFTER, row)


__all__ = [
    "ChangelogNormalize",
    "NormalizeStep",
    "SinkWrite",
    "UpsertKafkaRecords",
    "normalized",
    "sink_write",
]
