"""PostgreSQL adapter: the one module that talks to psycopg."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import structlog
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError, ServiceUnavailableError

RECONNECT_WAIT_MAX_S = 2.0


def connect(
    endpoints: Endpoints, autocommit: bool = False, *, read_only: bool = False, retry_for_s: float = 0.0
) -> psycopg.Connection[Any]:
    """A new session; ``read_only``: PostgreSQL refuses every write in it (submit-time checks).

    ``retry_for_s``: while the server cannot be reached or is starting up (a restart), try again with
    exponential back-off (0.2 s doubling to 2 s) for up to that long before giving up; opening a
    session is safe to repeat. Refusals that another try cannot change (a wrong password, a missing
    database) fail at once. 0: one try."""
    dsn = endpoints.postgres_dsn
    conninfo = make_conninfo(dsn, options="-c default_transaction_read_only=on") if read_only else dsn
    retrying = Retrying(
        stop=stop_after_delay(retry_for_s),
        wait=wait_exponential(multiplier=0.2, max=RECONNECT_WAIT_MAX_S),
        retry=retry_if_exception(_worth_another_try),
        before_sleep=lambda state: _log_retry(state, endpoints),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                return psycopg.connect(conninfo, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailableError(
            f"postgres: cannot connect to {redacted_dsn(endpoints.postgres_dsn)}: {str(exc).strip()}; "
            "start PostgreSQL or fix WEIR_POSTGRES_DSN"
        ) from exc
    raise AssertionError("unreachable: Retrying returns or raises")


def _worth_another_try(exc: BaseException) -> bool:
    """Unreachable (no SQLSTATE: refused, reset, timed out), starting up or shutting down (57P0x),
    or a connection failure (08xxx); not an authentication or configuration refusal."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(("57P", "08"))


def _log_retry(state: RetryCallState, endpoints: Endpoints) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    structlog.get_logger("weir.connectors.postgres").warning(
        "postgres_connect_retry",
        dsn=redacted_dsn(endpoints.postgres_dsn),
        attempt=state.attempt_number,
        wait_s=round(state.upcoming_sleep, 2),
        error=str(exc).strip() if exc is not None else "",
    )


def redacted_dsn(dsn: str) -> str:
    """The dsn without its password, for messages and logs (URL or ``key=value`` form)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            netloc = f"{userinfo.partition(':')[0]}@{hostinfo}"
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    params.pop("password", None)
    return make_conninfo(**params)  # type: ignore[arg-type]


def table_columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


def replace_table(endpoints: Endpoints, table: str, definition: str) -> None:
    """Drop ``table`` if it exists and create it anew as ``CREATE TABLE table (definition)`` (tools
    that set up a demo or a scenario)."""
    with connect(endpoints, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.execute(sql.SQL("CREATE TABLE {} (" + definition + ")").format(sql.Identifier(table)))


def create_table_if_missing(endpoints: Endpoints, table: str, definition: str) -> bool:
    """``CREATE TABLE table (definition)`` unless it exists (an existing table is kept as it is, rows
    and all); True when it was created. Safe to run again (the compose init step)."""
    with connect(endpoints, autocommit=True) as conn:
        existed = conn.execute("SELECT to_regclass(quote_ident(%s)) IS NOT NULL", (table,)).fetchone()
        _create_table_once(conn, table, definition)
    return not (existed and existed[0])


def require_table(
    conn: psycopg.Connection[Any], table: str, columns: Sequence[str], key_columns: Sequence[str]
) -> None:
    """Fail clearly, in one line naming the table and columns, when the sink's table is missing, lacks
    one of its columns or key columns, or has no PRIMARY KEY or UNIQUE constraint (or unique index)
    on exactly the key columns, which ``INSERT ... ON CONFLICT (key columns)`` needs. The table is
    resolved as the sink's statements resolve it (``search_path``)."""
    present = column_types(conn, table)
    if not present:
        raise JobDefinitionError(
            f"postgres sink: table {table!r} does not exist; create it with the columns {list(columns)} and a "
            f"PRIMARY KEY ({', '.join(key_columns)}) before the job runs"
        )
    missing = [c for c in dict.fromkeys((*columns, *key_columns)) if c not in present]
    if missing:
        raise JobDefinitionError(
            f"postgres sink: table {table!r} has no column(s) {missing} (the sink writes {list(columns)} keyed by "
            f"{list(key_columns)}); add them to the table or fix the sink's columns"
        )
    keys = unique_keys(conn, table)
    if not any(set(key) == set(key_columns) for key in keys):
        raise JobDefinitionError(
            f"postgres sink: table {table!r} has no PRIMARY KEY or UNIQUE constraint on exactly {list(key_columns)} "
            f"(INSERT ... ON CONFLICT needs one; unique keys found: {keys or 'none'}); add one, e.g. "
            f"ALTER TABLE {table} ADD PRIMARY KEY ({', '.join(key_columns)}), or set key_columns to a unique key"
        )


def unique_keys(conn: psycopg.Connection[Any], table: str) -> list[list[str]]:
    """The column lists of the table's unique indexes that ``ON CONFLICT (columns)`` can use as its
    arbiter: valid, not partial, no expressions, not deferrable (primary keys and UNIQUE constraints
    are such indexes); ``INCLUDE`` columns are not part of a key."""
    rows = conn.execute(
        "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE k.n <= i.indnkeyatts ORDER BY k.n) "
        "FROM pg_index i WHERE i.indrelid = to_regclass(quote_ident(%s)) AND i.indisunique AND i.indisvalid "
        "AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL ORDER BY i.indisprimary DESC, i.indexrelid",
        (table,),
    ).fetchall()
    return [list(key) for (key,) in rows]


def _conflict_action(
    table: str, columns: Sequence[str], key_columns: Sequence[str], version_column: str | None
) -> sql.Composable:
    """``ON CONFLICT (keys) DO UPDATE SET ...``; with a version column the update only applies when
    the incoming row's version is at least the stored one, so replaying older rows changes nothing."""
    updates = [c for c in columns if c not in key_columns]
    conflict = sql.SQL("ON CONFLICT ({}) ").format(sql.SQL(", ").join(map(sql.Identifier, key_columns)))
    if not updates:
        return conflict + sql.SQL("DO NOTHING")
    action = sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in updates
    )
    if version_column is not None:
        action += sql.SQL(" WHERE {}.{} <= EXCLUDED.{}").format(
            sql.Identifier(table), sql.Identifier(version_column), sql.Identifier(version_column)
        )
    return conflict + action


def upsert_statement(
    table: str, columns: Sequence[str], key_columns: Sequence[str], version_column: str | None = None
) -> sql.Composed:
    """One row per execution: ``INSERT ... VALUES (%s, ...) ON CONFLICT ...`` (see ``_conflict_action``)."""
    return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    ) + _conflict_action(table, columns, key_columns, version_column)


def delete_statement(table: str, key_columns: Sequence[str]) -> sql.Composed:
    """One key per execution: ``DELETE FROM table WHERE k1 = %s AND ...``."""
    return sql.SQL("DELETE FROM {} WHERE ").format(sql.Identifier(table)) + sql.SQL(" AND ").join(
        sql.SQL("{} = %s").format(sql.Identifier(c)) for c in key_columns
    )


def upsert_rows(conn: psycopg.Connection[Any], statement: sql.Composed, rows: Iterable[Sequence[Any]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(statement, rows)


def delete_keys(conn: psycopg.Connection[Any], statement: sql.Composed, keys: Sequence[Sequence[Any]]) -> None:
    """Delete the rows of these keys (``delete_statement``); a key the table does not hold is no error."""
    if keys:
        with conn.cursor() as cur:
            cur.executemany(statement, keys)


# Read-only inspection (weir verify) ---------------------------------------------------------------


def fetch_rows(conn: psycopg.Connection[Any], table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """Every row of ``table``, as tuples of ``columns``."""
    statement = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(table)
    )
    return [tuple(row) for row in conn.execute(statement).fetchall()]


def prepared_transactions(conn: psycopg.Connection[Any]) -> list[tuple[str, Any, str]]:
    """Every transaction prepared and not yet committed or rolled back: ``(gid, prepared at, database)``."""
    rows = conn.execute("SELECT gid, prepared, database FROM pg_prepared_xacts ORDER BY gid").fetchall()
    return [(gid, prepared, database) for gid, prepared, database in rows]


def sink_commit_rows(
    conn: psycopg.Connection[Any], table: str, operator_uids: Sequence[str]
) -> list[tuple[str, str, int, int, int, Any]] | None:
    """The commit proof rows ``(job_id, operator_uid, subtask, checkpoint_id, rows, committed_at)`` of
    these sink operators, or None when the proof table does not exist."""
    if not table_columns(conn, table):
        return None
    columns = ("job_id", "operator_uid", "subtask", "checkpoint_id", "rows", "committed_at")
    statement = sql.SQL("SELECT {} FROM {} WHERE operator_uid = ANY(%s)").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(table)
    )
    return [tuple(row) for row in conn.execute(statement, (list(operator_uids),)).fetchall()]


# Two-phase commit (the exactly-once sink) ---------------------------------------------------------

COMMIT_PROOF_TABLE = "weir_sink_commits"
_COMMIT_PROOF_LOCK = 0x77656972  # advisory lock key serializing the proof table's creation ("weir")


@dataclass(frozen=True)
class ProofRow:
    """The row a sink transaction writes into ``weir_sink_commits``: committed with the data, or not at all."""

    job_id: str
    operator_uid: str
    subtask: int
    checkpoint_id: int
    rows: int


@dataclass(frozen=True)
class UpsertPlan:
    """How a batch of rows is upserted and a batch of keys deleted: one statement over one array per
    column (``unnest``), or the one-row statement executed per row when a column is itself an array
    (``unnest`` would flatten it)."""

    statement: sql.Composed
    columnar: bool
    delete: sql.Composed


def max_prepared_transactions(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    assert row is not None
    return int(row[0])


def check_prepared_transactions(setting: int, *, sink: str, server: str) -> None:
    """Fail clearly when the server cannot prepare transactions (``PREPARE TRANSACTION`` would fail
    at the first checkpoint with a bare 'prepared transactions are disabled')."""
    if setting <= 0:
        raise JobDefinitionError(
            f"{sink}: PostgreSQL at {server} has max_prepared_transactions = {setting}, so it cannot prepare "
            "transactions and the two-phase sink cannot run; set max_prepared_transactions in postgresql.conf "
            "to at least the number of two-phase sink subtasks (each holds at most one prepared transaction) and "
            "restart PostgreSQL, or use sink_to_postgres(..., delivery='upsert') (idempotent, at-least-once)",
            fault="external",
        )


def server_name(conn: psycopg.Connection[Any]) -> str:
    return f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"


def _create_table_once(conn: psycopg.Connection[Any], table: str, definition: str) -> None:
    """``CREATE TABLE IF NOT EXISTS table (definition)``; concurrent subtasks serialize on an advisory
    lock (two concurrent CREATE ... IF NOT EXISTS can still collide on the catalog)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_COMMIT_PROOF_LOCK,))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + definition + ")").format(sql.Identifier(table)))


def ensure_commit_proof_table(conn: psycopg.Connection[Any]) -> None:
    """Create ``weir_sink_commits`` if missing."""
    _create_table_once(
        conn,
        COMMIT_PROOF_TABLE,
        "job_id text NOT NULL, operator_uid text NOT NULL, subtask int NOT NULL, checkpoint_id bigint NOT NULL, "
        "rows bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (job_id, operator_uid, subtask, checkpoint_id)",
    )


# Ownership of a sink subtask (fencing older attempts) ------------------------------------------------

SINK_OWNER_TABLE = "weir_sink_owners"
_OWNER_LOCK_NAMESPACE = b"weir-sink-owner"


def sink_owner_lock_key(job_id: str, operator_uid: str, subtask: int) -> int:
    """The session-level advisory lock (one bigint) a sink subtask's owning session holds: the first
    8 bytes of blake2b over the three ids, signed. Stable across versions and processes; never change
    it (two versions would then not exclude each other)."""
    text = b"\x00".join((_OWNER_LOCK_NAMESPACE, job_id.encode(), operator_uid.encode(), str(subtask).encode()))
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big", signed=True)


@dataclass(frozen=True)
class SinkOwner:
    """An attempt of a job that wants to own one sink subtask's transactions."""

    job_id: str
    operator_uid: str
    subtask: int
    attempt: int

    @property
    def lock_key(self) -> int:
        return sink_owner_lock_key(self.job_id, self.operator_uid, self.subtask)

    @property
    def _key(self) -> tuple[str, str, int]:
        return (self.job_id, self.operator_uid, self.subtask)


@dataclass(frozen=True)
class OwnerClaim:
    """What ``claim_sink_owner`` found and did."""

    recorded_attempt: int | None
    """The attempt ``weir_sink_owners`` recorded before the claim; None on the subtask's first claim."""
    fenced: bool
    """A newer attempt owns the subtask: the claim changed nothing."""
    ended_sessions: tuple[int, ...] = ()
    """Backend pids of older owners' sessions the claim terminated."""


def ensure_sink_owner_table(conn: psycopg.Connection[Any]) -> None:
    """Create ``weir_sink_owners`` if missing."""
    _create_table_once(
        conn,
        SINK_OWNER_TABLE,
        "job_id text NOT NULL, operator_uid text NOT NULL, subtask int NOT NULL, attempt bigint NOT NULL, "
        "backend_pid int, claimed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, operator_uid, subtask)",
    )


def _split_lock_key(key: int) -> tuple[int, int]:
    """``(classid, objid)`` under which ``pg_locks`` shows a bigint advisory lock (objsubid 1)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def _lock_owner_row(conn: psycopg.Connection[Any], owner: SinkOwner) -> int | None:
    """Insert the owner row if missing (with the claimer's attempt) and lock it: claimers of one
    subtask queue here, one at a time. The attempt it recorded before (None: this is the first claim)."""
    inserted = conn.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, operator_uid, subtask, attempt) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (job_id, operator_uid, subtask) DO NOTHING RETURNING attempt"
        ).format(sql.Identifier(SINK_OWNER_TABLE)),
        (*owner._key, owner.attempt),
    ).fetchone()
    if inserted is not None:
        return None  # the row is new, and locked by this transaction until it ends
    row = conn.execute(
        sql.SQL("SELECT attempt FROM {} WHERE job_id = %s AND operator_uid = %s AND subtask = %s FOR UPDATE").format(
            sql.Identifier(SINK_OWNER_TABLE)
        ),
        owner._key,
    ).fetchone()
    assert row is not None
    return int(row[0])


def _end_lock_holders(conn: psycopg.Connection[Any], owner: SinkOwner) -> tuple[int, ...]:
    """Terminate every other session holding the subtask's advisory lock (older owners, alive or
    stuck); the pids signalled. Their prepared transactions survive them."""
    classid, objid = _split_lock_key(owner.lock_key)
    rows = conn.execute(
        "SELECT l.pid, pg_terminate_backend(l.pid) FROM pg_locks l "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid::bigint = %s "
        "AND l.objid::bigint = %s AND l.pid <> pg_backend_pid() "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (classid, objid),
    ).fetchall()
    return tuple(int(pid) for pid, _signalled in rows)


def claim_sink_owner(conn: psycopg.Connection[Any], owner: SinkOwner, *, timeout_s: float, what: str) -> OwnerClaim:
    """Make this session the owner of the sink subtask, in one transaction: lock the owner row; if it
    records a newer attempt, change nothing (``fenced``); else terminate the sessions holding the
    subtask's advisory lock, wait for the lock (they release it as they exit, after their open
    transaction rolled back), take it for the rest of this session, and record the attempt.

    From then on no other session can complete a claim without ending this one first, so every
    statement this session runs is run by the owner; an older attempt's session, ended, fails on its
    next statement. Waits (the row lock, the advisory lock) are bounded by ``timeout_s``."""
    ended: tuple[int, ...] = ()
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(timeout_s * 1000))}ms",))
            recorded = _lock_owner_row(conn, owner)
            if recorded is not None and recorded > owner.attempt:
                return OwnerClaim(recorded, fenced=True)
            ended = _end_lock_holders(conn, owner)
            conn.execute("SELECT pg_advisory_lock(%s)", (owner.lock_key,))
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET attempt = %s, backend_pid = pg_backend_pid(), claimed_at = now() "
                    "WHERE job_id = %s AND operator_uid = %s AND subtask = %s"
                ).format(sql.Identifier(SINK_OWNER_TABLE)),
                (owner.attempt, *owner._key),
            )
            return OwnerClaim(recorded, fenced=False, ended_sessions=ended)
    except psycopg.errors.LockNotAvailable as exc:
        raise ServiceUnavailableError(
            f"{what}: attempt {owner.attempt} could not take ownership within {timeout_s:g}s: another claim of "
            f"this sink subtask, or the session of its previous owner (pids {list(ended) or 'none found'}), held "
            f"on; it retries with the task's restart (see pg_stat_activity if this repeats)"
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ServiceUnavailableError(
            f"{what}: attempt {owner.attempt} may not end the session of the subtask's previous owner ({exc}); "
            "run every attempt as the same PostgreSQL role, or grant the role pg_signal_backend",
            fault="user",
        ) from exc
    except psycopg.Error as exc:
        raise _failed(conn, exc, f"{what}: claiming ownership for attempt {owner.attempt}") from exc


def sink_owner_attempt(conn: psycopg.Connection[Any], job_id: str, operator_uid: str, subtask: int) -> int | None:
    """The attempt ``weir_sink_owners`` records as the owner of this sink subtask; None when none does
    (or the table does not exist yet)."""
    if not table_columns(conn, SINK_OWNER_TABLE):
        return None
    row = conn.execute(
        sql.SQL("SELECT attempt FROM {} WHERE job_id = %s AND operator_uid = %s AND subtask = %s").format(
            sql.Identifier(SINK_OWNER_TABLE)
        ),
        (job_id, operator_uid, subtask),
    ).fetchone()
    return None if row is None else int(row[0])


def session_lost(conn: psycopg.Connection[Any]) -> bool:
    """The session ended under the connection: terminated (a newer attempt took ownership of the
    sink subtask), or PostgreSQL restarted, or the network failed."""
    return bool(conn.closed or conn.broken)


def _failed(conn: psycopg.Connection[Any], exc: psycopg.Error, what: str) -> ServiceUnavailableError:
    """The ServiceUnavailableError for a failed statement; a lost session is named as such."""
    if session_lost(conn):
        return ServiceUnavailableError(
            f"{what}: the PostgreSQL session ended ({str(exc).strip()}): a newer attempt of this sink subtask took "
            "ownership, or PostgreSQL restarted; the statement's outcome is the new owner's to resolve"
        )
    return ServiceUnavailableError(f"{what}: {type(exc).__name__}: {str(exc).strip()}")


def column_types(conn: psycopg.Connection[Any], table: str) -> dict[str, tuple[str, bool]]:
    """``column -> (SQL type, is an array)`` of a table."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory = 'A' "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(quote_ident(%s)) AND a.attnum > 0 AND NOT a.attisdropped",
        (table,),
    ).fetchall()
    return {name: (type_name, bool(is_array)) for name, type_name, is_array in rows}


def upsert_plan(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    key_columns: Sequence[str],
    version_column: str | None = None,
) -> UpsertPlan:
    """The fastest upsert of a batch that the table's column types allow."""
    types = column_types(conn, table)
    action = _conflict_action(table, columns, key_columns, version_column)
    if any(types[c][1] for c in columns):
        return UpsertPlan(
            upsert_statement(table, columns, key_columns, version_column),
            columnar=False,
            delete=delete_statement(table, key_columns),
        )
    delete = sql.SQL("DELETE FROM {} AS t USING unnest({}) AS d({}) WHERE ").format(
        sql.Identifier(table),
        sql.SQL(", ").join(sql.SQL("%s::" + types[c][0] + "[]") for c in key_columns),
        sql.SQL(", ").join(map(sql.Identifier, key_columns)),
    ) + sql.SQL(" AND ").join(sql.SQL("t.{} = d.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in key_columns)
    statement = (
        sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ").format(
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.SQL("%s::" + types[c][0] + "[]") for c in columns),
        )
        + action
    )
    return UpsertPlan(statement, columnar=True, delete=delete)


def _write(
    conn: psycopg.Connection[Any],
    plan: UpsertPlan,
    deletes: Sequence[Sequence[Any]],
    rows: Sequence[Sequence[Any]],
    proof: ProofRow,
) -> None:
    """The deletes first, then the upserts (a transaction's changes are collapsed per key, so a key is
    in both only when its upsert replaces the stored row), then the proof row."""
    if deletes:
        if plan.columnar:
            conn.execute(plan.delete, [list(column) for column in zip(*deletes, strict=True)])
        else:
            delete_keys(conn, plan.delete, deletes)
    if rows:
        if plan.columnar:
            conn.execute(plan.statement, [list(column) for column in zip(*rows, strict=True)])
        else:
            with conn.cursor() as cur:
                cur.executemany(plan.statement, rows)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, operator_uid, subtask, checkpoint_id, rows) VALUES (%s, %s, %s, %s, %s)"
        ).format(sql.Identifier(COMMIT_PROOF_TABLE)),
        (proof.job_id, proof.operator_uid, proof.subtask, proof.checkpoint_id, proof.rows),
    )


def write_transaction(
    conn: psycopg.Connection[Any],
    plan: UpsertPlan,
    deletes: Sequence[Sequence[Any]],
    rows: Sequence[Sequence[Any]],
    proof: ProofRow,
    *,
    prepare_as: str | None,
    lock_timeout_s: float,
    what: str,
) -> None:
    """One transaction on an autocommit connection: the deleted keys, the upserted rows and the proof
    row (``proof.rows`` counts both), then ``PREPARE
    TRANSACTION prepare_as`` (or ``COMMIT`` when None). On any error the transaction is rolled back and
    the error names ``what``: JobDefinitionError (not retriable) when the rows do not fit the table,
    ServiceUnavailableError otherwise."""
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(lock_timeout_s * 1000))}ms",))
        _write(conn, plan, deletes, rows, proof)
        if prepare_as is None:
            conn.execute("COMMIT")
        else:
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(prepare_as)))
    except psycopg.Error as exc:
        _rollback_quietly(conn)
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            raise ServiceUnavailableError(
                f"{what}: a row lock was not granted within {lock_timeout_s:.0f}s: another transaction holds rows "
                "of the same keys, e.g. a prepared transaction of another sink subtask or job (the same key must "
                "always reach the same sink subtask: key the stream by the table's key), or another client"
            ) from exc
        if isinstance(
            exc,
            psycopg.errors.UndefinedTable
            | psycopg.errors.UndefinedColumn
            | psycopg.errors.DatatypeMismatch
            | psycopg.errors.InvalidTextRepresentation
            | psycopg.errors.NotNullViolation,
        ):
            # The table or the rows do not fit what the job says (a table dropped or altered under a
            # running job, a value of the wrong type): every attempt would fail the same way.
            raise JobDefinitionError(
                f"{what}: the rows do not fit the table: {type(exc).__name__}: {str(exc).strip()}; fix the table or "
                "the sink's columns and row function, then resubmit"
            ) from exc
        if isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.table_name == COMMIT_PROOF_TABLE:
            raise ServiceUnavailableError(
                f"{what}: {COMMIT_PROOF_TABLE} already holds a commit of checkpoint {proof.checkpoint_id} for this "
                "sink subtask: checkpoint ids were reused for the same job id",
                fault="internal",
            ) from exc
        raise _failed(conn, exc, what) from exc


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    if conn.closed:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass


def commit_prepared(conn: psycopg.Connection[Any], gid: str) -> bool:
    """``COMMIT PREPARED gid``; False when no transaction is prepared under that gid."""
    try:
        conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
    except psycopg.errors.UndefinedObject:
        return False
    except psycopg.Error as exc:
        raise _failed(conn, exc, f"postgres: COMMIT PREPARED {gid!r}") from exc
    return True


def rollback_prepared(conn: psycopg.Connection[Any], gid: str) -> bool:
    """``ROLLBACK PREPARED gid``; False when no transaction is prepared under that gid."""
    try:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    except psycopg.errors.UndefinedObject:
        return False
    except psycopg.Error as exc:
        raise _failed(conn, exc, f"postgres: ROLLBACK PREPARED {gid!r}") from exc
    return True


def prepared_gids(conn: psycopg.Connection[Any], prefix: str) -> list[str]:
    """The gids of this database's prepared transactions that start with ``prefix``."""
    try:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s) "
            "ORDER BY gid",
            (prefix,),
        ).fetchall()
    except psycopg.Error as exc:
        raise _failed(conn, exc, f"postgres: listing the prepared transactions {prefix}*") from exc
    return [gid for (gid,) in rows]


def committed_rows(
    conn: psycopg.Connection[Any], job_id: str, operator_uid: str, subtask: int, checkpoint_id: int
) -> int | None:
    """The row count ``weir_sink_commits`` holds for this sink subtask's commit at ``checkpoint_id``;
    None when it holds no such commit."""
    try:
        row = conn.execute(
            sql.SQL(
                "SELECT rows FROM {} WHERE job_id = %s AND operator_uid = %s AND subtask = %s AND checkpoint_id = %s"
            ).format(sql.Identifier(COMMIT_PROOF_TABLE)),
            (job_id, operator_uid, subtask, checkpoint_id),
        ).fetchone()
    except psycopg.Error as exc:
        raise _failed(conn, exc, f"postgres: reading {COMMIT_PROOF_TABLE} for checkpoint {checkpoint_id}") from exc
    return None if row is None else int(row[0])
