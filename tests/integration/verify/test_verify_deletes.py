"""``weir verify`` on a PostgreSQL sink that deletes: the reference applies the upserts and deletes in
order, and the commit proofs count deletes as changes, so a lost or replayed delete is reported
even where the table alone could not show it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.integration.verify.jobs.changelog_copy import COUNT, change, to_change
from weir.core.changelog import apply_changes, keys_changed
from weir.core.config import Endpoints
from weir.tools.cli import EXIT_OK, run_cli

pytestmark = pytest.mark.integration

JOB = "tests/integration/verify/jobs/changelog_copy.py"


@pytest.fixture
def tables(services: Endpoints) -> Iterator[tuple[str, str, str]]:
    suffix = uuid.uuid4().hex[:10]
    table, proofs, job_id = f"verify_copy_{suffix}", f"verify_commits_{suffix}", f"job-{suffix}"
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, last int)")
        conn.execute(
            f"CREATE TABLE {proofs} (job_id text, operator_uid text, subtask int, checkpoint_id bigint, "
            "rows bigint, committed_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (job_id, operator_uid, subtask, checkpoint_id))"
        )
    yield table, proofs, job_id
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP TABLE IF EXISTS {proofs}")


def verify(capsys: pytest.CaptureFixture[str], table: str, proofs: str) -> tuple[int, dict[str, Any]]:
    code = run_cli(["verify", JOB, "-D", f"sink.table={table}", "--commit-table", proofs, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_verify_counts_deletes_in_the_commit_proofs(
    services: Endpoints, tables: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    table, proofs, job_id = tables
    writes = [to_change(change(i)) for i in range(COUNT)]
    final = apply_changes(writes, (0,))
    changed = keys_changed(writes, (0,))
    assert 0 < len(final) < changed  # some ids end deleted
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} (id, last) VALUES (%s, %s)", list(final.values()))
        # As the sink commits: one epoch, one change per key changed (deletes included).
        conn.execute(f"INSERT INTO {proofs} VALUES (%s, 'copy', 0, 1, %s)", (job_id, changed))

    code, report = verify(capsys, table, proofs)
    assert code == EXIT_OK, report
    (sink,) = report["sinks"]
    assert (sink["duplicates"], sink["missing"], sink["unexpected"], sink["mismatched"]) == (0, 0, 0, 0)

    # Proofs that count the upserted keys only (the deletes lost, or not counted) are a discrepancy.
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {proofs} SET rows = %s", (len(final),))
    code, report = verify(capsys, table, proofs)
    assert code != EXIT_OK
    assert report["discrepancies"] == [
        f"copy: commit proofs count {len(final)} rows, the reference writes {COUNT} rows over {changed} keys"
    ]
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {proofs} SET rows = %s", (changed,))

    # A deleted row still in the table (a delete lost) is unexpected.
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        deleted = next(i for i in range(10) if (i,) not in final)
        conn.execute(f"INSERT INTO {table} (id, last) VALUES (%s, 0)", (deleted,))
    code, report = verify(capsys, table, proofs)
    assert code != EXIT_OK
    (sink,) = report["sinks"]
    assert sink["unexpected"] == 1, sink
    assert report["discrepancies"] == ["copy: 1 unexpected"]
