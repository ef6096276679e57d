"""The local PostgreSQL cluster keeps prepared transactions across a lost connection."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from weir.core.config import Endpoints

pytestmark = pytest.mark.integration


def test_prepared_transaction_survives_killed_connection(services: Endpoints) -> None:
    table = f"infra_2pc_{uuid.uuid4().hex[:8]}"
    gid = f"weir-infra-test-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        assert int(admin.execute("SHOW max_prepared_transactions").fetchone()[0]) >= 64
        admin.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")

        doomed = psycopg.connect(services.postgres_dsn, autocommit=True)
        pid = doomed.info.backend_pid
        doomed.execute("BEGIN")
        doomed.execute(f"INSERT INTO {table} VALUES (1), (2)")
        doomed.execute(f"PREPARE TRANSACTION '{gid}'")
        # Kill the backend that prepared the transaction, as a crashed TaskManager would leave it.
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            doomed.execute("SELECT 1")

        assert admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
        prepared = admin.execute("SELECT gid FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchall()
        assert prepared == [(gid,)]

        admin.execute(f"COMMIT PREPARED '{gid}'")
        rows = admin.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()
        assert rows == [(1,), (2,)]
        assert admin.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone()[0] == 0
        admin.execute(f"DROP TABLE {table}")
