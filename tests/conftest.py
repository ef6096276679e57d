"""Session-wide fixtures: the real local services are started once per test session."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.connectors import kafka
from weir.core.config import Endpoints

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def endpoints() -> Endpoints:
    return Endpoints.from_env()


@pytest.fixture(scope="session")
def services(endpoints: Endpoints) -> Iterator[Endpoints]:
    """Kafka, PostgreSQL, the S3 server and Prometheus, up and healthy (idempotent start).

    The topics the session creates (its own and those its jobs create) are deleted when it ends:
    the local Kafka outlives sessions, and a broker holding thousands of partitions from earlier
    sessions takes minutes to start after an unclean shutdown."""
    result = subprocess.run(
        [str(REPO_ROOT / "deploy/local/infra.sh"), "up"], capture_output=True, text=True, timeout=1800
    )
    if result.returncode != 0:
        pytest.fail(f"local services did not start:\n{result.stderr[-3000:]}", pytrace=False)
    _roll_back_leftover_transactions(endpoints)
    topics_before = set(kafka.list_topic_names(endpoints, timeout_s=30.0))
    yield endpoints
    created = sorted(set(kafka.list_topic_names(endpoints, timeout_s=30.0)) - topics_before)
    kafka.delete_topics(endpoints, created, timeout_s=120.0)


def _roll_back_leftover_transactions(endpoints: Endpoints) -> None:
    """Jobs cancelled by earlier test sessions leave prepared transactions (no recovery follows a
    cancel); the local cluster keeps them across sessions, so clear Weir's before this one starts."""
    import psycopg

    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'weir:%'").fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
