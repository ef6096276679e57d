"""PostgreSQL logical replication for the CDC source: the one module that talks to the server for it.

Mechanism: the SQL functions of logical decoding over psycopg 3 (no second driver; psycopg 3 has no
streaming replication protocol):

- the slot is created with ``pg_create_logical_replication_slot``, which answers its consistent
  point: every transaction committing after it is decoded from the slot;
- the snapshot is read in chunks by primary key (keyset pagination: ``WHERE key > last ORDER BY key
  LIMIT n``), each in its own ``REPEATABLE READ`` transaction that also answers its MVCC snapshot
  (``pg_current_snapshot()``) and, after it, the WAL insert position: the source then knows, for
  each decoded transaction, whether a chunk saw it (``weir.core.cdc``, Flink CDC's and Debezium's
  incremental snapshot, with PostgreSQL's own visibility in place of their watermark windows);
- changes are read from a *temporary copy* of the slot (``pg_copy_logical_replication_slot``, made
  at the slot's confirmed position when the reader opens), consumed with
  ``pg_logical_slot_get_binary_changes`` (which returns whole transactions), so that each poll
  decodes only new WAL; the copy goes with its session;
- the slot itself moves only when a checkpoint completes (``pg_replication_slot_advance`` to the
  checkpoint's LSN): it keeps the WAL after the last completed checkpoint, and a restore decodes
  again from there (the source skips the transactions before its restored position);
- a parallel snapshot's chunk query takes the rows of one key partition
  (:func:`key_partition_sql`, the server's ``weir.core.cdc.key_partition``); its readers wait for
  subtask 0's session mark (:func:`mark_session`) and announce their chunks as logical decoding
  messages (:func:`emit_message`), which subtask 0 decodes with the ``messages`` option;
- a publication the source creates carries the comment :data:`PUBLICATION_COMMENT_PREFIX` and its
  slot's name, so the job's end drops only a publication Weir created.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import pq, sql
from psycopg.adapt import Transformer
from psycopg.rows import dict_row

from weir.connectors.postgres import connect
from weir.core.cdc import (
    KEY_TEXT_SEPARATOR,
    CdcSourceError,
    ChunkRead,
    Key,
    KeyKind,
    SlotFound,
    XidSnapshot,
    format_lsn,
    parse_lsn,
)
from weir.core.config import Endpoints
from weir.core.errors import Fault, JobDefinitionError, WeirError

PUBLICATION_COMMENT_PREFIX: Final = "weir cdc source, slot "
"""The comment on a publication the source created, followed by its slot's name."""

KEY_KINDS: Final = {
    "int2": KeyKind.INTEGER,
    "int4": KeyKind.INTEGER,
    "int8": KeyKind.INTEGER,
    "text": KeyKind.TEXT,
    "varchar": KeyKind.TEXT,
    "uuid": KeyKind.UUID,
}
"""Primary-key column types a snapshot is chunked by (``weir.core.cdc.KeyKind``)."""


class SlotDropError(WeirError):
    """The slot could not be dropped at the job's end (in use, or the server down): retried."""

    fault: Fault = Fault.EXTERNAL
    retriable = True


@dataclass(frozen=True)
class CapturedTable:
    """A table the source captures: ``schema.name``, its columns in order, its primary key, and
    the kinds of its key columns when the snapshot is chunked by them (None: a table without a
    primary key, or with a key column of another type, is read in one chunk)."""

    schema: str
    name: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    key_kinds: tuple[KeyKind, ...] | None

    @property
    def chunked(self) -> bool:
        return self.key_kinds is not None

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
        key_types = conn.execute(
            "SELECT a.attname, a.atttypid::regtype::text, t.typname FROM pg_index i "
            "JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) ON true "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n",
            (oid,),
        ).fetchall()
        key = [r[0] for r in key_types]
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
        kinds = [KEY_KINDS.get(typname) for _, _, typname in key_types]
        key_kinds = tuple(k for k in kinds if k is not None) if key and None not in kinds else None
        found.append(CapturedTable(schema, name, tuple(columns), tuple(key), key_kinds))
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


def ensure_publication(
    conn: psycopg.Connection[Any], publication: str, tables: Sequence[CapturedTable], slot: str
) -> None:
    """The publication of the tables' inserts, updates and deletes: created when missing (commented
    as the source's, :data:`PUBLICATION_COMMENT_PREFIX`); an existing one must publish every table
    (JobDefinitionError otherwise)."""
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if exists is None:
        with conn.transaction():
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, update, delete')").format(
                    sql.Identifier(publication),
                    sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in tables),
                )
            )
            conn.execute(
                sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                    sql.Identifier(publication), sql.Literal(PUBLICATION_COMMENT_PREFIX + slot)
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


def publication_created_for(conn: psycopg.Connection[Any], publication: str) -> str | None:
    """The slot whose source created ``publication`` (its comment), or None: not the source's, or none."""
    row = conn.execute(
        "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s", (publication,)
    ).fetchone()
    comment = row[0] if row is not None else None
    if comment is None or not comment.startswith(PUBLICATION_COMMENT_PREFIX):
        return None
    return str(comment[len(PUBLICATION_COMMENT_PREFIX) :])


@dataclass(frozen=True)
class SlotReleased:
    slot_dropped: bool  # False: there was none
    publication_dropped: bool  # False: none, or not created by the source of this slot


def release_slot(endpoints: Endpoints, slot: str, publication: str) -> SlotReleased:
    """Drop the slot, and the publication if the source of this slot created it. Raises
    SlotDropError, naming the slot, when the slot is in use or the server cannot be reached."""
    try:
        with connect(endpoints, autocommit=True, retry_for_s=5.0) as conn:
            dropped = drop_slot(conn, slot)
            ours = publication_created_for(conn, publication) == slot
            if ours:
                conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
            return SlotReleased(dropped, ours)
    except psycopg.errors.ObjectInUse as exc:
        raise SlotDropError(
            f"postgres cdc source: replication slot {slot!r} is still in use ({str(exc).strip()}); "
            "its job ended, so the drop is retried until its session is gone"
        ) from exc
    except (psycopg.Error, WeirError) as exc:
        raise SlotDropError(
            f"postgres cdc source: replication slot {slot!r} could not be dropped: {str(exc).strip()}; "
            "retried (a slot left behind keeps the server's WAL)"
        ) from exc


@dataclass(frozen=True)
class LeftoverSlot:
    """A logical slot of this database (``weir cdc slots``)."""

    slot: str
    active: bool
    retained_wal_bytes: int | None
    weir_publication: str | None  # the publication a Weir source created for this slot, if any


def list_slots(conn: psycopg.Connection[Any]) -> list[LeftoverSlot]:
    """Every pgoutput slot of this database, with the publication Weir created for it (if any)."""
    rows = conn.execute(
        "SELECT s.slot_name, s.active, pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint, "
        "(SELECT p.pubname FROM pg_publication p WHERE obj_description(p.oid, 'pg_publication') = %s || s.slot_name "
        "ORDER BY p.pubname LIMIT 1) "
        "FROM pg_replication_slots s WHERE s.plugin = 'pgoutput' AND s.database = current_database() "
        "AND NOT s.temporary ORDER BY s.slot_name",
        (PUBLICATION_COMMENT_PREFIX,),
    ).fetchall()
    return [LeftoverSlot(name, bool(active), wal, publication) for name, active, wal, publication in rows]


def create_slot(conn: psycopg.Connection[Any], slot: str) -> int:
    """Create the logical slot (pgoutput); answers its consistent point."""
    try:
        row = conn.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
        ).fetchone()
    except psycopg.errors.DuplicateObject as exc:
        raise CdcSourceError(
            f"postgres cdc source: replication slot {slot!r} was created by someone else meanwhile; name another slot"
        ) from exc
    assert row is not None, "pg_create_logical_replication_slot answers a row"
    return parse_lsn(row[0])


def _key_order(table: CapturedTable) -> list[sql.Composable]:
    assert table.key_kinds is not None
    return [
        sql.SQL('{} COLLATE "C"').format(sql.Identifier(c)) if kind is KeyKind.TEXT else sql.Identifier(c)
        for c, kind in zip(table.key_columns, table.key_kinds, strict=True)
    ]


def key_partition_sql(table: CapturedTable, partitions: int) -> sql.Composable:
    """The server's :func:`weir.core.cdc.key_partition` of a row of ``table``: the first 32 bits of
    the MD5 of its key columns' texts joined by U+001F, modulo ``partitions``."""
    texts = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in table.key_columns)
    return sql.SQL("mod(('x' || substr(md5(concat_ws({}, {})), 1, 8))::bit(32)::bigint, {})").format(
        sql.Literal(KEY_TEXT_SEPARATOR), texts, sql.Literal(partitions)
    )


def mark_session(conn: psycopg.Connection[Any], mark: str) -> None:
    """Show ``mark`` as the session's ``application_name`` (``weir.core.cdc.slot_mark``): the parallel
    snapshot's readers wait for it before their first chunk."""
    conn.execute("SELECT set_config('application_name', %s, false)", (mark,))


def session_marked(conn: psycopg.Connection[Any], mark: str) -> bool:
    """Whether a session shows ``mark`` (:func:`mark_session`)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %s)", (mark,)).fetchone()
    return bool(row and row[0])


def emit_message(conn: psycopg.Connection[Any], prefix: str, content: bytes) -> int:
    """Write a logical decoding message into the WAL at once (not transactional): decoded from the
    slot with the ``messages`` option. Answers its LSN."""
    row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s::bytea)::text", (prefix, content)).fetchone()
    assert row is not None, "pg_logical_emit_message answers its LSN"
    return parse_lsn(row[0])


class ChunkReader:
    """Reads the snapshot's chunks over one session (not in autocommit: the rows come through a
    server-side cursor), each chunk in its own transaction."""

    def __init__(self, endpoints: Endpoints) -> None:
        self._conn = connect(endpoints, retry_for_s=10.0)

    def read(
        self,
        table: CapturedTable,
        after: Key | None,
        chunk_size: int,
        emit: Callable[[dict[str, Any]], None],
        partition: int = 0,
        partitions: int = 1,
    ) -> ChunkRead:
        """One chunk of ``table``: the ``chunk_size`` rows of partition ``partition`` (of
        ``partitions``, :func:`weir.core.cdc.key_partition`) with the lowest keys above ``after``
        (a table not chunked: all its rows), each handed to ``emit``, in one ``REPEATABLE READ``
        transaction; answers what the chunk read (its key range, its snapshot, the WAL position
        after it). A chunk with fewer rows than ``chunk_size`` is the partition's last (no upper bound)."""
        conn = self._conn
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in table.columns)
        relation = sql.Identifier(table.schema, table.name)
        query: sql.Composable
        params: list[Any] = []
        limit: int | None = None
        if table.chunked:
            order = sql.SQL(", ").join(_key_order(table))
            conditions: list[sql.Composable] = []
            if after is not None:
                placeholders = sql.SQL(", ").join(sql.Placeholder() * len(after))
                conditions.append(sql.SQL("({}) > ({})").format(order, placeholders))
                params = list(after)
            if partitions > 1:
                conditions.append(
                    sql.SQL("{} = {}").format(key_partition_sql(table, partitions), sql.Literal(partition))
                )
            where: sql.Composable = sql.SQL("")
            if conditions:
                where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)
            limit = chunk_size
            query = sql.SQL("SELECT {} FROM {}{} ORDER BY {} LIMIT {}").format(
                columns, relation, where, order, sql.Literal(limit)
            )
        else:
            query = sql.SQL("SELECT {} FROM {}").format(columns, relation)
        try:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            snapshot_row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            assert snapshot_row is not None
            count = 0
            last: dict[str, Any] | None = None
            with conn.cursor(name=f"weir_cdc_{uuid.uuid4().hex[:12]}", row_factory=dict_row) as cursor:
                cursor.itersize = 2000
                for row in cursor.execute(query, params):
                    emit(row)
                    count += 1
                    last = row
            wal_row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert wal_row is not None
        finally:
            conn.rollback()
        upper: Key | None = None
        if limit is not None and count == limit and last is not None:
            upper = tuple(last[c] for c in table.key_columns)
        snapshot = XidSnapshot.parse(snapshot_row[0])
        return ChunkRead(table.qualified_name, upper, snapshot, parse_lsn(wal_row[0]), partition)

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True)
class DecodedChange:
    lsn: int
    xid: int
    data: bytes


class ChangeReader:
    """Decodes the slot's changes from a temporary copy of it (one session), and advances the slot
    itself when told (:meth:`advance_slot`)."""

    def __init__(self, endpoints: Endpoints, slot: str, publication: str, *, messages: bool = False) -> None:
        """``messages``: decode the logical decoding messages too (``pg_logical_emit_message``)."""
        self._slot = slot
        self._publication = publication
        self._messages = "true" if messages else "false"
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
            "'proto_version', '1', 'publication_names', %s, 'messages', %s)",
            (self._copy, max_changes, self._publication, self._messages),
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
    "KEY_KINDS",
    "PUBLICATION_COMMENT_PREFIX",
    "CapturedTable",
    "ChangeReader",
    "ChunkReader",
    "DecodedChange",
    "LeftoverSlot",
    "SlotDropError",
    "SlotReleased",
    "captured_tables",
    "create_slot",
    "drop_slot",
    "emit_message",
    "ensure_publication",
    "key_partition_sql",
    "list_slots",
    "mark_session",
    "publication_created_for",
    "release_slot",
    "session_marked",
    "slot_found",
]
