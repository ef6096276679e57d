"""Factories for driving the transactional sinks directly: a real OperatorContext, no task around it.

A "crash" is either a real one (``driver.py`` run in a subprocess that a crash point kills) or an
abandoned operator instance whose producer or connection is never closed; recovery is always a new
instance given ``restore_state`` and ``open``, as a restarted task would. ``crash_cluster`` is a whole
private cluster with a crash point armed, for the end-to-end tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.ports import private_ports
from weir.connectors import kafka, postgres
from weir.core.changelog import Delete
from weir.core.config import Endpoints
from weir.core.keygroups import KeyGroupRange
from weir.core.metrics import TaskMetrics
from weir.core.serde import dumps_value
from weir.operators.base import OperatorContext, StreamOperator
from weir.operators.transactional_sinks import (
    CommitMarker,
    TransactionalKafkaSinkOperator,
    TwoPhasePostgresSinkOperator,
    marker_topic_name,
)
from weir.tools.client import JobManagerClient
from weir.tools.supervisor import start_cluster, stop_cluster

REPO_ROOT = Path(__file__).resolve().parents[3]
TASKMANAGER = "taskmanager-test"
TEST_TRANSACTION_TIMEOUT_MS = 60_000  # a transaction a test leaves open ends within a minute


class NoOutput:
    """Sinks emit nothing."""

    def emit(self, value: Any, timestamp: int | None) -> None:
        raise AssertionError(f"a sink emitted {value!r}")

    def emit_watermark(self, watermark: int) -> None:
        pass


def operator_context(job_id: str, uid: str, subtask: int = 0, parallelism: int = 1) -> OperatorContext:
    return OperatorContext(
        job_id=job_id,
        job_name="sink-test",
        uid=uid,
        subtask=subtask,
        parallelism=parallelism,
        max_parallelism=128,
        attempt=0,
        key_group_range=KeyGroupRange(0, 127),  # type: ignore[arg-type]
        parameters={},
        state=None,
        metrics=TaskMetrics(job_id, "sink-test", uid, subtask, TASKMANAGER),
    )


def set_up(operator: StreamOperator, job_id: str, uid: str, subtask: int = 0, parallelism: int = 1) -> StreamOperator:
    operator.setup(operator_context(job_id, uid, subtask, parallelism), NoOutput())
    return operator


def value_serializer(value: Any) -> bytes:
    return str(value).encode()


@dataclass
class KafkaSinkCase:
    """One test's topic, marker topic and job: builds sink instances of the same subtask. Without a
    ``marker_topic`` the sinks use their own (``marker_topic_name``), as in a job."""

    endpoints: Endpoints
    job_id: str
    uid: str
    topic: str
    marker_topic: str | None

    @property
    def markers_in(self) -> str:
        """The topic the sinks write their markers to."""
        return self.marker_topic or marker_topic_name(self.job_id, self.uid)

    def sink(self, subtask: int = 0, parallelism: int = 1, **options: Any) -> TransactionalKafkaSinkOperator:
        operator = TransactionalKafkaSinkOperator(
            self.topic,
            value_serializer,
            None,
            transaction_timeout_ms=TEST_TRANSACTION_TIMEOUT_MS,
            marker_topic=self.marker_topic,
            recovery_timeout_s=30.0,
            **options,
        )
        set_up(operator, self.job_id, self.uid, subtask, parallelism)
        return operator

    def recovered(self, snapshot: bytes, subtask: int = 0, parallelism: int = 1) -> TransactionalKafkaSinkOperator:
        operator = self.sink(subtask, parallelism)
        operator.restore_state(snapshot)
        operator.open()
        return operator

    def values(self, isolation: str) -> list[str]:
        return [(v or b"").decode() for _p, _o, _k, v in kafka.read_all(self.endpoints, self.topic, isolation)]

    def markers(self, isolation: str = "read_committed") -> list[CommitMarker]:
        records = kafka.read_all(self.endpoints, self.markers_in, isolation)
        found = [CommitMarker.parse(v) for _p, _o, _k, v in records]
        return [m for m in found if m is not None and m.job_id == self.job_id]


@pytest.fixture
def kafka_case(services: Endpoints) -> Iterator[KafkaSinkCase]:
    """Markers go to a topic of this test, created with the broker's default settings."""
    suffix = uuid.uuid4().hex[:8]
    case = KafkaSinkCase(services, f"job-{suffix}", "kafka-sink", f"sink-out-{suffix}", f"sink-commits-{suffix}")
    kafka.create_topics(services, {case.topic: 1, case.markers_in: 2})
    yield case
    kafka.delete_topics(services, [case.topic, case.markers_in])


@pytest.fixture
def kafka_job(services: Endpoints) -> Iterator[KafkaSinkCase]:
    """Markers go where a job's sink puts them: the sink's own marker topic, which the sink creates."""
    suffix = uuid.uuid4().hex[:8]
    case = KafkaSinkCase(services, f"job-{suffix}", "kafka-sink", f"sink-out-{suffix}", None)
    kafka.create_topics(services, {case.topic: 1})
    yield case
    kafka.delete_topics(services, [case.topic, case.markers_in])


@dataclass
class PostgresSinkCase:
    endpoints: Endpoints
    job_id: str
    uid: str
    table: str

    def sink(self, subtask: int = 0, **kwargs: Any) -> TwoPhasePostgresSinkOperator:
        operator = TwoPhasePostgresSinkOperator(self.table, ("id", "name", "amount"), ("id",), case_change, **kwargs)
        set_up(operator, self.job_id, self.uid, subtask)
        return operator

    def recovered(self, snapshot: bytes | None, subtask: int = 0) -> TwoPhasePostgresSinkOperator:
        operator = self.sink(subtask)
        if snapshot is not None:
            operator.restore_state(snapshot)
        operator.open()
        return operator

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.endpoints.postgres_dsn, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description is not None else []

    def rows(self) -> list[tuple[Any, ...]]:
        return self.query(f"SELECT id, name, amount FROM {self.table} ORDER BY id")

    def prepared(self) -> list[str]:
        return [gid for (gid,) in self.query("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", f"%{self.job_id}%")]

    def proofs(self) -> list[tuple[int, int, int]]:
        """``(subtask, checkpoint_id, rows)`` of this job's commits in weir_sink_commits."""
        return self.query(
            "SELECT subtask, checkpoint_id, rows FROM weir_sink_commits WHERE job_id = %s "
            "ORDER BY subtask, checkpoint_id",
            self.job_id,
        )


@pytest.fixture
def postgres_case(services: Endpoints) -> Iterator[PostgresSinkCase]:
    suffix = uuid.uuid4().hex[:8]
    case = PostgresSinkCase(services, f"job-{suffix}", "pg-sink", f"sink_out_{suffix}")
    case.query(f"CREATE TABLE {case.table} (id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12, 2))")
    with postgres.connect(services, autocommit=True) as conn:
        postgres.ensure_commit_proof_table(conn)  # the teardown cleans it even if no sink opened
    yield case
    for gid in case.prepared():
        case.query(f"ROLLBACK PREPARED '{gid}'")
    case.query(f"DROP TABLE {case.table}")
    case.query("DELETE FROM weir_sink_commits WHERE job_id = %s", case.job_id)


def case_change(value: dict[str, Any]) -> tuple[Any, ...] | Delete:
    """The cases' row function: ``{"delete": id}`` deletes the row of that id, any other value upserts."""
    if "delete" in value:
        return Delete((value["delete"],))
    return (value["id"], value["name"], value["amount"])


def delete(i: int) -> dict[str, Any]:
    return {"delete": i}


def row(i: int) -> dict[str, Any]:
    from decimal import Decimal

    return {"id": i, "name": f"name-{i}", "amount": Decimal(i) / 4}


@dataclass(frozen=True)
class CrashRun:
    returncode: int
    output: str  # stdout and stderr
    snapshots: dict[int, bytes]


def run_until_crash(tmp_path: Path, endpoints: Endpoints, crash_point: str, **arguments: Any) -> CrashRun:
    """Run ``driver.py`` in a fresh Python process with ``WEIR_CRASH_POINT`` armed; the snapshots it
    took before dying come back from ``tmp_path``."""
    env = {**os.environ, "WEIR_CRASH_POINT": crash_point, "PYTHONPATH": str(REPO_ROOT)}
    env.update({f"WEIR_{k.upper()}": v for k, v in _endpoint_env(endpoints).items()})
    arguments = {**arguments, "snapshot_dir": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "tests.integration.sinks.driver", dumps_value(arguments).hex()],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    snapshots = {int(p.stem): p.read_bytes() for p in tmp_path.glob("*.snapshot")}
    return CrashRun(result.returncode, result.stdout + result.stderr, snapshots)


def _endpoint_env(endpoints: Endpoints) -> dict[str, str]:
    return {"kafka_bootstrap": endpoints.kafka_bootstrap, "postgres_dsn": endpoints.postgres_dsn}


# A private cluster per test (``private_ports``): its processes carry the armed crash point
# (``request.param``) in their environment, and fire it once per cluster (a marker file in $WEIR_CRASH_ONCE_DIR).


@pytest.fixture
def crash_cluster(
    request: pytest.FixtureRequest, services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Endpoints, JobManagerClient]]:
    spec: str = request.param
    for name, value in private_ports(services).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path / "run"))
    # A prefix of its own: tmp_path's name repeats in every session, and a JobManager started on a used
    # prefix recovers the jobs an earlier cluster left there (and collects their orphans) before it answers.
    monkeypatch.setenv("WEIR_CHECKPOINT_DIR", f"s3://{services.s3_bucket}/crash-{tmp_path.name}-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("WEIR_CRASH_POINT", spec)
    monkeypatch.setenv("WEIR_CRASH_ONCE_DIR", str(tmp_path / "fired"))
    endpoints = Endpoints.from_env()
    directory = tmp_path / "run" / "cluster"
    start_cluster(directory, endpoints, restart=True, restart_delay_s=1.0, timeout_s=90)
    client = JobManagerClient(endpoints.jobmanager_address)
    try:
        yield endpoints, client
    finally:
        client.close()
        stop_cluster(directory)
