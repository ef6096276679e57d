"""A Weir cluster (JobManager + 3 TaskManagers as processes) started once per test session."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors import kafka
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import start_cluster, stop_cluster
from weir.tools.verify import VerifyReport, verify_job

REPO_ROOT = Path(__file__).resolve().parents[2]


TASKMANAGERS = 3
REGISTERED_WITHIN_S = 90.0


@dataclass
class WeirCluster:
    endpoints: Endpoints
    directory: Path
    client: JobManagerClient
    submitted: list[str] = field(default_factory=list)  # every job submitted through submit, in order

    def submit(self, job_file: str, parameters: dict[str, str], parallelism: int = 3) -> str:
        """Submit once every TaskManager is registered: a test before this one may have killed the
        JobManager or a TaskManager of the session's cluster, which the supervisor restarts."""
        self.wait_for_taskmanagers()
        job_id = self.client.submit_job(REPO_ROOT / job_file, parameters, parallelism)
        self.submitted.append(job_id)
        return job_id

    def wait_for_taskmanagers(self, timeout_s: float = REGISTERED_WITHIN_S) -> None:
        deadline = time.monotonic() + timeout_s
        alive = -1
        while time.monotonic() < deadline:
            try:
                alive = len(self.client.cluster_status().alive_taskmanagers)
            except WeirError:
                alive = -1  # the JobManager is starting again
            if alive == TASKMANAGERS:
                return
            time.sleep(0.2)
        raise AssertionError(f"{alive} of {TASKMANAGERS} TaskManagers registered after {timeout_s:g} s")

    def wait_for(self, job_id: str, statuses: tuple[str, ...] = ("FINISHED",), timeout_s: float = 300.0) -> JobDetails:
        """Poll the job until it reaches one of ``statuses`` (or any terminal status)."""
        deadline = time.monotonic() + timeout_s
        status = self.client.job_status(job_id)
        while time.monotonic() < deadline:
            status = self.client.job_status(job_id)
            if status.summary.status in statuses or status.summary.status in ("FINISHED", "FAILED", "CANCELED"):
                break
            time.sleep(0.2)
        return status


@pytest.fixture(scope="session")
def weir_cluster(services: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirCluster]:
    run_dir = tmp_path_factory.mktemp("weir-run")
    os.environ["WEIR_RUN_DIR"] = str(run_dir)
    os.environ.setdefault("WEIR_CHECKPOINT_DIR", f"s3://{services.s3_bucket}/test-{uuid.uuid4().hex[:8]}")
    directory = run_dir / "cluster"
    start_cluster(directory, services, restart=True, restart_delay_s=1.0, timeout_s=90)
    client = JobManagerClient(services.jobmanager_address)
    try:
        yield WeirCluster(services, directory, client)
    finally:
        client.close()
        stop_cluster(directory)


@pytest.fixture(autouse=True)
def cancel_leftover_jobs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Cancel what a test submitted and left running (it failed half way, say), so that its slots
    do not fail the tests after it. Jobs of module-scoped fixtures are theirs to cancel."""
    if "weir_cluster" not in request.fixturenames:
        yield
        return
    cluster: WeirCluster = request.getfixturevalue("weir_cluster")
    before = len(cluster.submitted)
    yield
    for job_id in cluster.submitted[before:]:
        try:
            if cluster.client.job_status(job_id).summary.status not in ("FINISHED", "FAILED", "CANCELED"):
                cluster.client.cancel_job(job_id)
        except WeirError:
            pass  # gone, or the JobManager is down: nothing holds slots for it then


def assert_sinks_exact(
    job_file: str | Path,
    parameters: dict[str, str],
    job_id: str,
    endpoints: Endpoints,
    earlier_job_ids: tuple[str, ...] = (),
) -> VerifyReport:
    """Both sinks of a bounded job that FINISHED hold exactly what its reference run writes: Kafka
    read_committed as a multiset of whole records, PostgreSQL's rows, each sink's commit proofs
    counting what it committed (a row committed twice, which the upsert hides, shows there), and no
    transaction left prepared or open (``weir.tools.verify.verify_job``)."""
    path = job_file if isinstance(job_file, Path) else REPO_ROOT / job_file
    report = verify_job(path, parameters, job_id=job_id, earlier_job_ids=earlier_job_ids, endpoints=endpoints)
    assert report.ok, json.dumps(report.to_json(), indent=1)[:4000]
    assert report.sinks, "the job has no Kafka or PostgreSQL sink to verify"
    return report


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


RECORD_PATHS = ("records", "columnar")

LONG = pytest.mark.long
"""A test `make test` leaves out (`make test-long` runs them, `make test-all` everything): each one
covers what a test of `make test` covers too, along another axis (the other record path, another
parallelism pair, another Nexmark query) or at the size of a card scenario."""


def long_variant(*values: object) -> Any:
    """One parameter set of a parametrized test, marked ``long``."""
    return pytest.param(*values, marks=LONG)


"""The two paths of examples/keyed_aggregation.py (``-D columnar=``): tests of the operators the
columnar path covers run on both."""


def path_parameters(path: str) -> dict[str, str]:
    """The -D parameters that put examples/keyed_aggregation.py on ``path``."""
    assert path in RECORD_PATHS, path
    return {"columnar": "true" if path == "columnar" else "false"}


def create_window_table(endpoints: Endpoints, table: str) -> None:
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(
            f"CREATE TABLE {table} (key text, window_start bigint, window_end bigint, count bigint, sum bigint, "
            "PRIMARY KEY (key, window_start))"
        )


def create_topics(endpoints: Endpoints, topics: dict[str, int]) -> None:
    kafka.create_topics(endpoints, topics)


def keyed_aggregation_inputs(
    endpoints: Endpoints,
    unique: str,
    events: int,
    *,
    records_per_second: int,
    checkpoint_interval: str,
    spec: EventSpec | None = None,
) -> dict[str, str]:
    """Topics, table and bounded input of one run of examples/keyed_aggregation.py (6 source
    partitions, 400 keys, or ``spec``: a test computing a reference from the events must pass the
    spec it computes from, since a spec's event time starts at the second it was made); answers its
    -D parameters."""
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 6, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    produce_events(endpoints, source, spec if spec is not None else EventSpec(count=events, keys=400))
    return {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "source.bounded": "true",
        "source.records_per_second": str(records_per_second),
        "checkpointing.interval": checkpoint_interval,
    }
