"""A 'kafka' table's ``'format' = 'debezium-json'`` (Flink's ``debezium-json``), read as a changelog
and written from one.

- :class:`DebeziumRecords`: a record's value, Debezium's change envelope ``{"before": row | null,
  "after": row | null, "op": ...}`` (with ``'debezium-json.schema-include'``: the ``payload`` of
  ``{"schema": ..., "payload": envelope}``), as the changes Flink's ``DebeziumJsonDeserializationSchema``
  emits: ``c`` (create) and ``r`` (a snapshot read) ``+I`` of ``after``; ``u`` ``-U`` of ``before``
  then ``+U`` of ``after``; ``d`` ``-D`` of ``before``; a tombstone (a null or empty value, which
  Debezium writes after a delete for compaction) nothing. An update or delete without ``before``
  (Debezium's PostgreSQL connector sends it only under ``REPLICA IDENTITY FULL``), another ``op``, a
  value that is not such an envelope or a row that does not decode raises, with Flink's words (the
  source's dead letters or the job's failure, as a 'json' row); with
  ``'debezium-json.ignore-parse-errors'`` the message is skipped instead, and a field of the wrong
  type is NULL in its row, as Flink's JSON converter makes it.
- :class:`DebeziumEncoder`: a change as Flink's ``DebeziumJsonSerializationSchema`` writes it, byte
  for byte: ``+I`` and ``+U`` ``{"before":null,"after":row,"op":"c"}``, ``-U`` and ``-D``
  ``{"before":row,"after":null,"op":"d"}`` (no ``"u"``: an update is a delete and a create), the row
  the JSON format's object of the table's columns in order.

Every decision is a ``match`` ending in ``assert_never`` (the ``op`` a closed set of strings)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, assert_never

from weir.core import json_codec
from weir.core.descriptors import KafkaRecord
from weir.sql.changelog import Change, RowKind

Decode = Callable[[Mapping[str, Any]], dict[str, Any]]

NOTHING: Final[tuple[Change, ...]] = ()

REPLICA_IDENTITY: Final = (
    'The "before" field of {what} message is null, if you are using Debezium Postgres Connector, please check '
    "the Postgres table has been set REPLICA IDENTITY to FULL level."
)
"""Flink's words for an update or delete without its old row (``IllegalStateException``)."""


class DebeziumRecords:
    """A 'debezium-json' table's record as its changes (0, 1 or 2), one decode of the value.
    ``decode`` makes a row of the envelope's ``before``/``after`` object (the table's
    ``RowDecoder.row``); ``lenient`` does it with a field that does not decode NULL (its
    ``lenient_row``), used after ``decode`` raised, under ``ignore_parse_errors``."""

    def __init__(
        self, table: str, decode: Decode, lenient: Decode, *, schema_include: bool, ignore_parse_errors: bool
    ) -> None:
        self.table, self.decode, self.lenient = table, decode, lenient
        self.schema_include, self.ignore_parse_errors = schema_include, ignore_parse_errors

    def __call__(self, record: KafkaRecord) -> tuple[Change, ...]:
        raw = record.value
        if not raw:  # a tombstone (Flink's: a null or empty message)
            return NOTHING
        try:
            return self._changes(raw)
        except (ValueError, TypeError) as exc:
            if self.ignore_parse_errors:
                return NOTHING
            raise ValueError(f"Corrupt Debezium JSON message of table {self.table}: {exc}") from None

    def _changes(self, raw: bytes) -> tuple[Change, ...]:
        envelope = json_codec.decode(raw)
        if self.schema_include:
            if not isinstance(envelope, dict):
                raise ValueError(f"a message is a JSON object, not {type(envelope).__name__}")
            envelope = envelope.get("payload")
        if not isinstance(envelope, dict):
            raise ValueError(f"a Debezium envelope is a JSON object, not {type(envelope).__name__}")
        op = envelope.get("op")
        match op:
            case "c" | "r":
                return (Change(RowKind.INSERT, self._row(envelope.get("after"), "after")),)
            case "u":
                before = envelope.get("before")
                if before is None:
                    raise ValueError(REPLICA_IDENTITY.format(what="UPDATE"))
                return (
                    Change(RowKind.UPDATE_BEFORE, self._row(before, "before")),
                    Change(RowKind.UPDATE_AFTER, self._row(envelope.get("after"), "after")),
                )
            case "d":
                before = envelope.get("before")
                if before is None:
                    raise ValueError(REPLICA_IDENTITY.format(what="DELETE"))
                return (Change(RowKind.DELETE, self._row(before, "before")),)
            case _:
                raise ValueError(f'Unknown "op" value "{op}"')

    def _row(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            what = "null" if value is None else type(value).__name__
            raise ValueError(f'the "{field}" row is a JSON object, not {what}')
        try:
            return self.decode(value)
        except ValueError:
            if not self.ignore_parse_errors:
                raise
            return self.lenient(value)


_CREATE_HEAD: Final = b'{"before":null,"after":'
_CREATE_TAIL: Final = b',"op":"c"}'
_DELETE_HEAD: Final = b'{"before":'
_DELETE_TAIL: Final = b',"after":null,"op":"d"}'


class DebeziumEncoder:
    """A change (or an appended row, ``+I``) as Flink's debezium-json serializer writes it: ``row``
    encodes the row's JSON object as the table's 'json' format does (its columns in order)."""

    def __init__(self, row: Callable[[Mapping[str, Any]], bytes]) -> None:
        self.row = row

    def change(self, change: Change) -> bytes:
        kind = change.kind
        match kind:
            case RowKind.INSERT | RowKind.UPDATE_AFTER:
                return _CREATE_HEAD + self.row(change.row) + _CREATE_TAIL
            case RowKind.UPDATE_BEFORE | RowKind.DELETE:
                return _DELETE_HEAD + self.row(change.row) + _DELETE_TAIL
            case _:
                assert_never(kind)

    def appended(self, row: Mapping[str, Any]) -> bytes:
        return _CREATE_HEAD + self.row(row) + _CREATE_TAIL


__all__ = ["REPLICA_IDENTITY", "DebeziumEncoder", "DebeziumRecords"]
