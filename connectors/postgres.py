"""PostgreSQL adapter: the one module that talks to psycopg."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
        raise JobDefinitionError(
            f"postgres sink: table {table!r} does not exist; create it before the job runs"
        )
    missing = [c for c in columns if c not in present]
    if missing:
        raise JobDefinitionError(f"postgres sink: table {table!r} has no column(s) {missing}")


def upsert_statement(table: str, columns: Sequence[str], key_columns: Sequence[str]) -> sql.Composed:
    updates = [c for c in columns if c not in key_columns]
    action = (
        sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in updates
        )
        if updates
        else sql.SQL("DO NOTHING")
    )
    return (
        sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) ").format(
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns)),
            sql.SQL(", ").join(map(sql.Identifier, key_columns)),
        )
        + action
    )


def upsert_rows(
    conn: psycopg.Connection[Any], statement: sql.Composed, rows: Iterable[Sequence[Any]]
) -> None:
    with conn.cursor() as cur:
        cur.executemany(statement, rows)
