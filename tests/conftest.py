"""Session-wide fixtures: the real local services are started once per test session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from weir.core.config import Endpoints

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def endpoints() -> Endpoints:
    return Endpoints.from_env()


@pytest.fixture(scope="session")
def services(endpoints: Endpoints) -> Endpoints:
    """Kafka, PostgreSQL, the S3 server and Prometheus, up and healthy (idempotent start)."""
    result = subprocess.run(
        [str(REPO_ROOT / "deploy/local/infra.sh"), "up"], capture_output=True, text=True, timeout=1800
    )
    if result.returncode != 0:
        pytest.fail(f"local services did not start:\n{result.stderr[-3000:]}", pytrace=False)
    _roll_back_leftover_transactions(endpoints)
    return endpoints


def _roll_back_leftover_transactions(endpoints: Endpoints) -> None:
    """Jobs cancelled by earlier test sessions leave prepared transactions (no recovery follows a
    cancel); the local cluster keeps them across sessions, so clear Weir's before this one starts."""
    import psycopg

    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'weir:%'").fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
