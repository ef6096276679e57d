"""PostgreSQL logical replication for the CDC source: the one module that talks to the server for it.

Mechanism: the SQL functions of logical decoding over psycopg 3 (no second driver). psycopg 3 has
no streaming replication protocol, but a ``replication=database`` session runs replication
commands through the simple query protocol, which is all the snapshot needs:

- ``CREATE_REPLICATION_SLOT slot LOGICAL pgoutput EXPORT_SNAPSHOT`` answers the slot's consistent
  point and a snapshot of exactly the database state at it; a second session reads the tables in a
  ``REPEATABLE READ`` transaction with ``SET TRANSACTION SNAPSHOT``, so each row committed before
  the consistent point is in the snapshot and each change after it is decoded from the slot, once;
- changes are read from a *temporary copy* of the slot (``pg_copy_logical_replication_slot``, made
  at the slot's confirmed position when the reader opens), consumed with
  ``pg_logical_slot_get_binary_changes`` (which returns whole transactions), so that each poll
  decodes only new WAL; the copy goes with its session;
- the slot itself moves only when a checkpoint completes (``pg_replication_slot_advance`` to the
  checkpoint's LSN): it keeps the WAL after the last completed checkpoint, and a restore decodes
  again from there (the source skips the transactions before its restored position).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.adapt import Transformer
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from weir.connectors.postgres import connect
from weir.core.cdc import CdcSourceError, SlotFound, format_lsn, parse_lsn
from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError, ServiceUnavailableError


@dataclass(frozen=True)
class CapturedTable:
    """A table the source captures: ``schema.name``, its columns in order, its primary key."""

    schema: str
    name: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"


def captured_tables(conn: psycopg.Connection[Any], tables: Sequence[str]) -> list[CapturedTable]:
    """The tables as the server resolves them (``search_path``), each checked: it exists, and its
    updates and deletes can be decoded (a replica identity: a primary key, an index, or FULL).
    One JobDefinitionError line otherwise."""
    found = []
    for table in tables:
        row = conn.execute(
            "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s) AND c.relkind IN ('r', 'p')",
            (table,),
        ).fetchone()
        if row is None:
            raise JobDefinitionError(
                f"postgres cdc source: table {table!r} does not exist; create it or fix the tables"
            )
        oid, schema, name, identity = row
        key = [
            r[0]
            for r in conn.execute(
                "SELECT a.attname FROM pg_index i "
                "JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) ON true "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n",
                (oid,),
            ).fetchall()
        ]
        if identity == "n" or (identity == "d" and not key):
            reason = "REPLICA IDENTITY NOTHING" if identity == "n" else "no primary key (REPLICA IDENTITY DEFAULT)"
            raise JobDefinitionError(
                f"postgres cdc source: table {schema}.{name} has no replica identity ({reason}), so its updates "
                f"and deletes cannot be captured; ALTER TABLE {schema}.{name} REPLICA IDENTITY FULL, or give it a "
                "primary key"
            )
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
                "ORDER BY attnum",
                (oid,),
            ).fetchall()
        ]
        found.append(CapturedTable(schema, name, tuple(columns), tuple(key)))
    return found


def slot_found(conn: psycopg.Connection[Any], slot: str) -> SlotFound | None:
    """The logical slot ``slot`` of this database, or None; a slot of that name that is not a
    pgoutput slot of this database is refused (JobDefinitionError): it is not the source's."""
    row = conn.execute(
        "SELECT plugin, database, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if row is None:
        return None
    plugin, database, confirmed = row
    here = conn.execute("SELECT current_database()").fetchone()
    if plugin != "pgoutput" or database != (here[0] if here else None) or confirmed is None:
        raise JobDefinitionError(
            f"postgres cdc source: replication slot {slot!r} exists but is not a pgoutput slot of this database "
            f"(plugin {plugin!r}, database {database!r}); name another slot"
        )
    return SlotFound(confirmed_flush=parse_lsn(confirmed))


def ensure_publication(conn: psycopg.Connection[Any], publication: str, tables: Sequence[CapturedTable]) -> None:
    """The publication of the tables' inserts, updates and deletes: created when missing; an existing
    one must publish every table (JobDefinitionError otherwise)."""
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if exists is None:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, update, delete')").format(
                sql.Identifier(publication),
                sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in tables),
            )
        )
        return
    published = {
        f"{r[0]}.{r[1]}"
        for r in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
        ).fetchall()
    }
    missing = [t.qualified_name for t in tables if t.qualified_name not in published]
    if missing:
        raise JobDefinitionError(
            f"postgres cdc source: publication {publication!r} does not publish {missing}; "
            f"ALTER PUBLICATION {publication} ADD TABLE {', '.join(missing)}, or name another publication"
        )


def drop_slot(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Drop the slot if it is there (it must not be in use); True when one was dropped."""
    row = conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return row is not None


class Snapshot:
    """A new slot and the tables read at its consistent point (see the module's docstring). Close it
    after the rows are read: the exported snapshot lives as long as the replication session."""

    def __init__(self, endpoints: Endpoints, slot: str) -> None:
        conninfo = make_conninfo(endpoints.postgres_dsn, replication="database")
        try:
            self._replication = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise ServiceUnavailableError(f"postgres cdc source: cannot open a replication session: {exc}") from exc
        command = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT").format(sql.Identifier(slot))
        result = self._replication.pgconn.exec_(command.as_bytes(self._replication))
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            self._replication.close()
            raise ServiceUnavailableError(f"postgres cdc source: cannot create replication slot {slot!r}: {message}")
        self.consistent_point = parse_lsn(_text(result.get_value(0, 1)))
        self._snapshot_name = _text(result.get_value(0, 2))
        self._reader = connect(endpoints)
        self._reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        self._reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(self._snapshot_name)))

    def rows(self, table: CapturedTable, batch: int = 2000) -> Iterator[dict[str, Any]]:
        """Every row of ``table`` at the snapshot, read in batches through a server-side cursor."""
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in table.columns), sql.Identifier(table.schema, table.name)
        )
        with self._reader.cursor(name=f"weir_cdc_{uuid.uuid4().hex[:12]}", row_factory=dict_row) as cursor:
            cursor.itersize = batch
            yield from cursor.execute(query)

    def close(self) -> None:
        try:
            self._reader.rollback()
        finally:
            self._reader.close()
            self._replication.close()


def _text(value: bytes | None) -> str:
    assert value is not None, "CREATE_REPLICATION_SLOT answers a slot, an LSN and a snapshot name"
    return value.decode()


@dataclass(frozen=True)
class DecodedChange:
    lsn: int
    xid: int
    data: bytes


class ChangeReader:
    """Decodes the slot's changes from a temporary copy of it (one session), and advances the slot
    itself when told (:meth:`advance_slot`)."""

    def __init__(self, endpoints: Endpoints, slot: str, publication: str) -> None:
        self._slot = slot
        self._publication = publication
        self._conn = connect(endpoints, autocommit=True, retry_for_s=10.0)
        self._copy = f"{slot[:40]}_w{uuid.uuid4().hex[:12]}"
        try:
            self._conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (slot, self._copy))
        except psycopg.errors.UndefinedObject as exc:
            self._conn.close()
            raise CdcSourceError(
                f"postgres cdc source: replication slot {slot!r} is gone, so the changes after the checkpoint are "
                "lost; start the job without its checkpoint to take a new snapshot"
            ) from exc
        self._transformer = Transformer(self._conn)
        self._loaders: dict[int, Callable[[bytes], Any]] = {}

    def changes(self, max_changes: int) -> list[DecodedChange]:
        """The next changes, whole transactions (pgoutput messages, at least ``max_changes`` unless
        fewer are committed), consumed from the copy."""
        rows = self._conn.execute(
            "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_get_binary_changes(%s, NULL, %s, "
            "'proto_version', '1', 'publication_names', %s)",
            (self._copy, max_changes, self._publication),
        ).fetchall()
        return [DecodedChange(parse_lsn(lsn), xid, bytes(data)) for lsn, xid, data in rows]

    def decoded_through(self) -> int:
        """The copy's confirmed position: every transaction committed before it was returned."""
        row = self._conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (self._copy,)
        ).fetchone()
        assert row is not None and row[0] is not None, "the session's temporary slot is there"
        return parse_lsn(row[0])

    def load(self, type_oid: int, text: str) -> Any:
        """A column's text as psycopg reads a value of its type (as the snapshot's rows are read)."""
        loader = self._loaders.get(type_oid)
        if loader is None:
            loader = self._loaders[type_oid] = self._transformer.get_loader(type_oid, pq.Format.TEXT).load
        return loader(text.encode())

    def advance_slot(self, lsn: int) -> None:
        """Move the slot to ``lsn`` (it then keeps only the WAL after it). Raises CdcSourceError when
        the slot is gone."""
        found = slot_found(self._conn, self._slot)
        if found is None:
            raise CdcSourceError(
                f"postgres cdc source: replication slot {self._slot!r} is gone (dropped while the job ran), so the "
                f"changes after LSN {format_lsn(lsn)} cannot be kept for a restore; start the job without its "
                "checkpoint to take a new snapshot"
            )
        if found.confirmed_flush < lsn:
            self._conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self._slot, format_lsn(lsn)))

    def close(self) -> None:
        self._conn.close()  # the temporary copy goes with the session


__all__ = [
    "CapturedTable",
    "ChangeReader",
    "DecodedChange",
    "Snapshot",
    "captured_tables",
    "drop_slot",
    "ensure_publication",
    "slot_found",
]
