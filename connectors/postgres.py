"""PostgreSQL adapter: the one module that talks to psycopg."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from weir.config import Endpoints
from weir.errors import JobDefinitionError, ServiceUnavailableError


def connect(endpoints: Endpoints, autocommit: bool = False) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(endpoints.postgres_dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailableError(f"postgres: cannot connect to {endpoints.postgres_dsn}: {exc}") from exc


def table_columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


def require_table(conn: psycopg.Connection[Any], table: str, columns: Sequence[str]) -> None:
    """Fail clearly when the sink's table or one of its columns is missing."""
    present = set(table_columns(conn, table))
    if not present:
        raise JobDefinitionError(f"postgres sink: table {table!r} does not exist; create it before the job runs")
    missing = [c for c in columns if c not in present]
    if missing:
        raise JobDefinitionError(f"postgres sink: table {table!r} has no column(s) {missing}")


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


def upsert_rows(conn: psycopg.Connection[Any], statement: sql.Composed, rows: Iterable[Sequence[Any]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(statement, rows)


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
    return [tuple(row) for row in conn.execute(statement, (list(operator_uids),)).fetchall()]  # type: ignore[misc]


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
    """How a batch of rows is upserted: one statement over one array per column (``unnest``), or the
    one-row statement executed per row when a column is itself an array (``unnest`` would flatten it)."""

    statement: sql.Composed
    columnar: bool


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


def ensure_commit_proof_table(conn: psycopg.Connection[Any]) -> None:
    """Create ``weir_sink_commits`` if missing (concurrent subtasks serialize on an advisory lock)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_COMMIT_PROOF_LOCK,))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (job_id text NOT NULL, operator_uid text NOT NULL, "
                "subtask int NOT NULL, checkpoint_id bigint NOT NULL, rows bigint NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (job_id, operator_uid, subtask, checkpoint_id))"
            ).format(sql.Identifier(COMMIT_PROOF_TABLE))
        )


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
        return UpsertPlan(upsert_statement(table, columns, key_columns, version_column), columnar=False)
    statement = (
        sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ").format(
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.SQL("%s::" + types[c][0] + "[]") for c in columns),
        )
        + action
    )
    return UpsertPlan(statement, columnar=True)


def _write(conn: psycopg.Connection[Any], plan: UpsertPlan, rows: Sequence[Sequence[Any]], proof: ProofRow) -> None:
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
    rows: Sequence[Sequence[Any]],
    proof: ProofRow,
    *,
    prepare_as: str | None,
    lock_timeout_s: float,
    what: str,
) -> None:
    """One transaction on an autocommit connection: the rows and the proof row, then ``PREPARE
    TRANSACTION prepare_as`` (or ``COMMIT`` when None). On any error the transaction is rolled back and
    ServiceUnavailableError names ``what``."""
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(lock_timeout_s * 1000))}ms",))
        _write(conn, plan, rows, proof)
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
        if isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.table_name == COMMIT_PROOF_TABLE:
            raise ServiceUnavailableError(
                f"{what}: {COMMIT_PROOF_TABLE} already holds a commit of checkpoint {proof.checkpoint_id} for this "
                "sink subtask: checkpoint ids were reused for the same job id",
                fault="internal",
            ) from exc
        raise ServiceUnavailableError(f"{what}: {type(exc).__name__}: {exc}") from exc


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
        raise ServiceUnavailableError(f"postgres: COMMIT PREPARED {gid!r}: {exc}") from exc
    return True


def rollback_prepared(conn: psycopg.Connection[Any], gid: str) -> bool:
    """``ROLLBACK PREPARED gid``; False when no transaction is prepared under that gid."""
    try:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    except psycopg.errors.UndefinedObject:
        return False
    except psycopg.Error as exc:
        raise ServiceUnavailableError(f"postgres: ROLLBACK PREPARED {gid!r}: {exc}") from exc
    return True


def prepared_gids(conn: psycopg.Connection[Any], prefix: str) -> list[str]:
    """The gids of this database's prepared transactions that start with ``prefix``."""
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s) ORDER BY gid",
        (prefix,),
    ).fetchall()
    return [gid for (gid,) in rows]


def committed_rows(
    conn: psycopg.Connection[Any], job_id: str, operator_uid: str, subtask: int, checkpoint_id: int
) -> int | None:
    """The row count ``weir_sink_commits`` holds for this sink subtask's commit at ``checkpoint_id``;
    None when it holds no such commit."""
    row = conn.execute(
        sql.SQL(
            "SELECT rows FROM {} WHERE job_id = %s AND operator_uid = %s AND subtask = %s AND checkpoint_id = %s"
        ).format(sql.Identifier(COMMIT_PROOF_TABLE)),
        (job_id, operator_uid, subtask, checkpoint_id),
    ).fetchone()
    return None if row is None else int(row[0])
