"""A ``'connector' = 'postgres-cdc'`` table read as a changelog (Flink CDC's ``postgres-cdc``
connector, its ``changelog-mode`` ``all``).

The job API's PostgreSQL CDC source (``weir.api.postgres_cdc_source``) emits one
``weir.core.cdc.ChangeEvent`` per row change; :class:`CdcChanges` turns each into the
``weir.sql.changelog.Change`` values the SQL operators read, as Flink CDC's deserializer stamps
``RowData``: a snapshot read or an insert is ``+I`` of the new row; an update ``-U`` of the old row
then ``+U`` of the new one (an update that changes the primary key: ``-D`` of the old row, ``+I`` of
the new one, so an upsert sink deletes the old key); a delete ``-D`` of the old row. The old row is
the whole row only under ``REPLICA IDENTITY FULL`` (as Flink CDC needs for ``-U``): a change without
it is refused with one line naming the table.

With ``'changelog-mode' = 'upsert'`` (Flink CDC's) no old row is needed: :class:`CdcUpserts` gives
each change as an upsert changelog (a read, insert or update ``+U`` of the new row; a delete ``-D``
of the key, as the default replica identity sends it; an update that changes the key ``-D`` of the
old key first), and the table's ``changelog-normalize`` (``weir.sql.upsert``) turns it into whole-row
changes from the last row it keeps per key, as Flink's ChangelogNormalize does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, assert_never

from sqlglot import exp

from weir.core.cdc import ChangeEvent, ChangeOp
from weir.sql.catalog import JdbcTable, KafkaTable, PostgresCdcTable, Table
from weir.sql.changelog import Change, RowKind

Decode = Callable[[Mapping[str, Any]], dict[str, Any]]


class CdcChanges:
    """The changes of one ChangeEvent of ``table`` (its columns decoded by ``decode``)."""

    def __init__(self, table: Table, decode: Decode) -> None:
        self.table = table
        self.decode = decode
        self.columns = tuple(c.name for c in table.columns)
        self.key = table.primary_key

    def __call__(self, event: ChangeEvent) -> list[Change]:
        match event.op:
            case ChangeOp.READ | ChangeOp.INSERT:
                assert event.after is not None
                return [Change(RowKind.INSERT, self.decode(event.after))]
            case ChangeOp.UPDATE:
                assert event.after is not None
                before = self._old_row(event)
                # an unchanged TOASTed value is absent from `after`: the old row holds it
                old, new = self.decode(before), self.decode({**before, **event.after})
                if all(old[k] == new[k] for k in self.key):
                    return [Change(RowKind.UPDATE_BEFORE, old), Change(RowKind.UPDATE_AFTER, new)]
                return [Change(RowKind.DELETE, old), Change(RowKind.INSERT, new)]
            case ChangeOp.DELETE:
                return [Change(RowKind.DELETE, self.decode(self._old_row(event)))]
            case _:
                assert_never(event.op)

    def _old_row(self, event: ChangeEvent) -> Mapping[str, Any]:
        before = event.before
        if before is None or any(c not in before for c in self.columns):
            raise ValueError(
                f"table {self.table.name}: an {event.op.value} of {event.table} without its whole old row: "
                f"the 'postgres-cdc' connector needs ALTER TABLE {event.table} REPLICA IDENTITY FULL"
            )
        return before


class CdcUpserts:
    """The upsert changes of one ChangeEvent of ``table`` (``'changelog-mode' = 'upsert'``): no old row
    needed but the key of a delete (and of an update that changes the key), which every replica
    identity but NOTHING sends. An update whose new row lacks a column (an unchanged TOASTed value,
    which only the old row holds) is refused with one line: it needs the old row (REPLICA IDENTITY
    FULL and ``changelog-mode`` ``all``)."""

    def __init__(self, table: Table, decode: Decode) -> None:
        self.table = table
        self.decode = decode
        self.columns = tuple(c.name for c in table.columns)
        self.key = table.primary_key

    def __call__(self, event: ChangeEvent) -> list[Change]:
        match event.op:
            case ChangeOp.READ | ChangeOp.INSERT:
                assert event.after is not None
                return [Change(RowKind.UPDATE_AFTER, self.decode(event.after))]
            case ChangeOp.UPDATE:
                assert event.after is not None
                missing = [c for c in self.columns if c not in event.after]
                if missing:
                    raise ValueError(
                        f"table {self.table.name}: an update of {event.table} without column(s) {', '.join(missing)} "
                        "(unchanged TOASTed values): 'changelog-mode' = 'upsert' needs every column of the new row; "
                        f"use 'changelog-mode' = 'all' with ALTER TABLE {event.table} REPLICA IDENTITY FULL"
                    )
                new = self.decode(event.after)
                out = []
                if event.before is not None:  # the key changed: the old key's row is deleted
                    old = self.decode(self._key_of(event))
                    if any(old[k] != new[k] for k in self.key):
                        out.append(Change(RowKind.DELETE, old))
                out.append(Change(RowKind.UPDATE_AFTER, new))
                return out
            case ChangeOp.DELETE:
                return [Change(RowKind.DELETE, self.decode(self._key_of(event)))]
            case _:
                assert_never(event.op)

    def _key_of(self, event: ChangeEvent) -> dict[str, Any]:
        before = event.before
        if before is None or any(k not in before for k in self.key):
            raise ValueError(
                f"table {self.table.name}: an {event.op.value} of {event.table} without the old row's primary key "
                f"({', '.join(self.key)}): its replica identity must hold the primary key (DEFAULT or FULL)"
            )
        return {k: before[k] for k in self.key}


def is_cdc_scan(table: Table) -> bool:
    return isinstance(table.connector, PostgresCdcTable)


def is_changelog_source(table: Table) -> bool:
    """A table read as a changelog of whole rows: 'postgres-cdc', 'upsert-kafka' (its records
    normalized: weir.sql.upsert), and a 'kafka' table of 'debezium-json' (weir.sql.debezium)."""
    connector = table.connector
    return isinstance(connector, PostgresCdcTable) or (
        isinstance(connector, KafkaTable) and (connector.upsert or connector.debezium is not None)
    )


def is_debezium(table: Table) -> bool:
    """A 'kafka' table of ``'format' = 'debezium-json'``: read as a changelog, written from any."""
    connector = table.connector
    return isinstance(connector, KafkaTable) and connector.debezium is not None


def _connector_name(table: Table) -> str:
    if is_cdc_scan(table):
        return "'postgres-cdc'"
    return "'kafka' ('debezium-json')" if is_debezium(table) else "'upsert-kafka'"


def projection_refusal(source: Table, sink: Table, select: exp.Select) -> tuple[exp.Expr, str] | None:
    """Why a projection of the changelog source ``source`` (a 'postgres-cdc' or 'upsert-kafka' table)
    cannot go into ``sink`` (the node to point at and the message), or None: the sink must upsert and
    delete by its key ('jdbc' or 'upsert-kafka'). A sink keyed otherwise than by the source's primary
    key gets the planner's upsert materializer (``weir.sql.plan.UpsertMaterialize``)."""
    connector = sink.connector
    if is_debezium(sink):
        return None  # written as a changelog, each change as it is
    if not isinstance(connector, JdbcTable) and not (isinstance(connector, KafkaTable) and connector.upsert):
        return select, (
            f"INSERT INTO {sink.name}: a projection of the changelog of {_connector_name(source)} table "
            f"{source.name} needs a 'jdbc' or 'upsert-kafka' sink (it upserts and deletes by the primary key), "
            "or a 'kafka' sink of 'debezium-json' (it writes each change)"
        )
    return None


__all__ = ["CdcChanges", "CdcUpserts", "is_cdc_scan", "is_changelog_source", "is_debezium", "projection_refusal"]
