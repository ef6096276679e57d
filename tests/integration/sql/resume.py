"""A SQL job stopped with a savepoint mid-input and resumed from it on the session cluster, its
PostgreSQL sink table read at the stop and at the end (the SQL state savepoint tests' one flow)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster

PARAMS = {"checkpointing.interval": "500ms"}
PARALLELISM = 2


@dataclass(frozen=True)
class Resumed:
    savepoint: str
    """The stop's savepoint, as the second job was resumed from it."""
    at_stop: Counter[tuple[Any, ...]]
    """The sink table's rows when the first job had stopped."""
    at_end: Counter[tuple[Any, ...]]
    """The sink table's rows when the resumed job had finished."""


def stop_and_resume(
    cluster: WeirCluster, first_job: str, resumed_job: str, folder: Path, name: str, rows_query: str, dsn: str
) -> Resumed:
    """``first_job`` (a job file's source) run until three checkpoints completed, stopped with a
    savepoint, then ``resumed_job`` submitted from it and run to its end; ``rows_query`` reads the
    sink table at both points."""
    first_file, resumed_file = folder / f"{name}.py", folder / f"{name}_again.py"
    first_file.write_text(first_job)
    resumed_file.write_text(resumed_job)
    first = cluster.submit(str(first_file), PARAMS, parallelism=PARALLELISM)
    wait_until(
        cluster,
        first,
        lambda s: s.summary.status == "RUNNING" and (s.last_completed_checkpoint or 0) >= 3,
        "three completed checkpoints",
    )
    savepoint = cluster.client.trigger_savepoint(first, stop=True)
    path = cluster.client.wait_for_savepoint(first, savepoint, 120).external_path
    wait_until(cluster, first, lambda s: s.summary.status == "FINISHED", "the stop", 120)
    at_stop = _rows(dsn, rows_query)

    cluster.wait_for_taskmanagers()
    second = cluster.client.submit_job(resumed_file, PARAMS, PARALLELISM, from_checkpoint=path)
    cluster.submitted.append(second)
    final = wait_until(cluster, second, lambda s: s.summary.status == "FINISHED", "the resumed job", 300)
    assert final.summary.status == "FINISHED", final.failure
    return Resumed(path, at_stop, _rows(dsn, rows_query))


def _rows(dsn: str, query: str) -> Counter[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return Counter(tuple(row) for row in conn.execute(query).fetchall())
