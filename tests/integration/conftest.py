"""A Weir cluster (JobManager + 3 TaskManagers as processes) started once per test session."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import psycopg
import pytest

from tests.conftest import SESSION_TOPICS
from tests.integration import polling
from tests.integration.secured_kafka import SecuredKafka, start_secured_kafka, stop_secured_kafka
from tests.observability import cluster_metrics_targets, register_scrape_targets
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.core.states import JobStatus
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
    broken: str | None = None  # why the cluster could not be reached: every later test fails with it at once

    def submit(self, job_file: str, parameters: dict[str, str], parallelism: int = 3) -> str:
        """Submit once every TaskManager is registered: a test before this one may have killed the
        JobManager or a TaskManager of the session's cluster, which the supervisor restarts."""
        self.wait_for_taskmanagers()
        job_id = self.client.submit_job(REPO_ROOT / job_file, parameters, parallelism)
        self.submitted.append(job_id)
        return job_id

    def wait_for_taskmanagers(self, timeout_s: float = REGISTERED_WITHIN_S) -> None:
        """Every TaskManager registered with a JobManager that answers; after ``timeout_s`` the
        cluster is broken for the rest of the session (the supervisor restarts what a test killed
        within seconds: one that did not come back in ``timeout_s`` will not)."""
        if self.broken is not None:
            pytest.fail(self.broken, pytrace=False)

        def registered() -> tuple[int, str]:
            try:
                return len(self.client.cluster_status().alive_taskmanagers), ""
            except WeirError as exc:
                return -1, f" ({exc})"  # the JobManager is starting again

        alive, error = polling.settle(timeout_s, registered, lambda answer: answer[0] == TASKMANAGERS)
        if alive == TASKMANAGERS:
            return
        self.broken = (
            f"the session's Weir cluster is broken: {max(alive, 0)} of {TASKMANAGERS} TaskManagers registered "
            f"after {timeout_s:g} s{error}; see the supervisor's logs in {self.directory}"
        )
        pytest.fail(self.broken, pytrace=False)

    def wait_for(self, job_id: str, statuses: tuple[str, ...] = ("FINISHED",), timeout_s: float = 300.0) -> JobDetails:
        """Poll the job until it reaches one of ``statuses`` (or any terminal status)."""
        return wait_for_job(self.client, job_id, statuses, timeout_s)

    def running_jobs(self) -> set[str]:
        """The jobs the JobManager knows that have not ended (empty when it does not answer)."""
        try:
            return {j.job_id for j in self.client.list_jobs() if not j.is_terminal}
        except WeirError:
            return set()

    def cancel_jobs_except(self, keep: set[str], timeout_s: float = 30.0) -> list[str]:
        """Cancel every job that has not ended and is not in ``keep``, and wait until each is being
        cancelled or ended (its tasks go, and with them their slots); answers the jobs cancelled."""
        leftover = sorted(self.running_jobs() - keep)
        for job_id in leftover:
            try:
                self.client.cancel_job(job_id)
            except WeirError:
                pass  # ended meanwhile, or the JobManager is down: nothing holds slots for it then
        if leftover:
            polling.settle(timeout_s, lambda: self._not_cancelling(leftover), lambda busy: not busy)
        return leftover

    def _not_cancelling(self, job_ids: list[str]) -> bool:
        try:
            jobs = {j.job_id: j.status for j in self.client.list_jobs()}
        except WeirError:
            return False  # the JobManager is down: nothing runs
        return any(jobs.get(j) in (JobStatus.CREATED, JobStatus.RUNNING, JobStatus.RESTARTING) for j in job_ids)


def wait_for_job(
    client: JobManagerClient, job_id: str, statuses: tuple[str, ...] = ("FINISHED",), timeout_s: float = 300.0
) -> JobDetails:
    """The job's status once it reaches one of ``statuses`` or ends; its last status after ``timeout_s``
    (the caller asserts on it, naming the failure)."""
    return polling.settle(
        timeout_s,
        lambda: client.job_status(job_id),
        lambda status: status.summary.status in statuses or status.summary.is_terminal,
    )


SLOW_FILES: Final = {
    "checkpointing/test_unaligned.py": 230,
    "checkpointing/test_savepoints.py": 217,
    "sinks/test_crash_points_e2e.py": 171,
    "sql/test_nexmark_vs_flink.py": 130,
    "jobmanager/test_jobmanager_failover.py": 100,
    "security/test_kafka_security.py": 94,
    "sources/test_postgres_cdc.py": 77,
    "runtime/test_broadcast_state.py": 75,
    "packaging/test_wheel.py": 73,
    "checkpointing/test_recovery.py": 65,
    "checkpointing/test_rescale.py": 65,
    "sinks/test_file_sink.py": 63,
    "jobmanager/test_rescale.py": 61,
    "nexmark/test_nexmark_recovery.py": 59,
    "runtime/test_slot_processes.py": 58,
    "sql/test_changelog_join_vs_flink.py": 55,
    "tools/test_upgrade_matrix.py": 55,
    "scenarios/test_backpressure.py": 53,
    "scenarios/test_recovery.py": 52,
    "sql/test_debezium_vs_flink.py": 50,
    "ui/test_ui_cluster.py": 48,
    "sql/test_partition_commit.py": 47,
    "sources/test_postgres_cdc_parallel.py": 44,
    "jobmanager/test_flink_rest_client.py": 43,
    "sql/test_sql_state_savepoint.py": 42,
    "sinks/test_big_epoch.py": 37,
    "observability/test_prometheus.py": 36,
    "sources/test_postgres_cdc_rescale.py": 35,
    "sql/test_postgres_cdc_sql.py": 35,
    "runtime/test_python_files.py": 35,
    "sql/test_sql_jobs.py": 33,
    "sinks/test_kafka_transactional_sink.py": 33,
    "checkpointing/test_restore_chain.py": 33,
    "sql/test_outer_join_vs_flink.py": 30,
    "sql/test_updating_vs_flink.py": 28,
    "jobmanager/test_flink_cli.py": 28,
    "sql/test_upsert_materialize_savepoint.py": 28,
    "sql/test_nexmark_q12.py": 27,
    "jobmanager/test_rest_job_results.py": 27,
    "runtime/test_async_io.py": 27,
    "sql/test_sql_updating.py": 27,
    "jobmanager/test_job_end.py": 26,
    "sql/test_kafka_layout_vs_flink.py": 26,
    "sql/test_upsert_materialize_vs_flink.py": 26,
    "observability/test_alertmanager.py": 25,
}
"""Every integration file that took 25 s or more in make test, with its seconds: the sum of its tests'
times with their setup and teardown (pytest's junit report of make test at 45b7f7b, this machine,
two workers beside the unit tests); for the files made shorter since (branches wt-ttime2, wt-ttime3:
test_unaligned, test_flink_rest_client, test_changelog_join_vs_flink, test_nexmark_q12,
test_upgrade_matrix, test_sql_state_savepoint, test_job_end, test_restore_chain, test_slot_processes,
and the Flink comparisons whose JVM now compiles with C1 only) that figure times their after/before
ratio alone; test_debezium_vs_flink, new, its run alone. ``make test`` hands whole files to its two
workers in collection order (``--dist loadfile --no-loadscope-reorder``): these go first, longest
first, so that no long file starts last on one worker while the other has nothing left to run; the
other files follow, those of most tests first (pytest-xdist's own order). Refresh from a make test
run with ``PYTEST_ADDOPTS=--junitxml=FILE`` when it changes much; a stale figure only costs balance."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The integration tests in ``SLOW_FILES`` order, then their other files by test count; each
    file's tests keep their order, and every other test stays before them as collected."""
    root = Path(__file__).parent
    files = [Path(item.path).relative_to(root).as_posix() if item.path.is_relative_to(root) else "" for item in items]
    counts = Counter(files)

    def rank(index: int) -> tuple[bool, int, int, str]:
        file = files[index]
        return (file != "", -SLOW_FILES.get(file, 0), -counts[file] if file else 0, file)

    items[:] = [items[i] for i in sorted(range(len(items)), key=rank)]


_SESSION_CLUSTER: list[WeirCluster] = []  # the session's cluster once started, for the module teardown


@pytest.fixture(scope="session")
def weir_cluster(services: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirCluster]:
    """Started once; a failure to start fails every test that uses it at once (pytest keeps the
    fixture's error), and a cluster that stops answering later is marked broken (``wait_for_taskmanagers``)."""
    run_dir = tmp_path_factory.mktemp("weir-run")
    os.environ["WEIR_RUN_DIR"] = str(run_dir)
    os.environ.setdefault("WEIR_CHECKPOINT_DIR", f"s3://{services.s3_bucket}/test-{uuid.uuid4().hex[:8]}")
    directory = run_dir / "cluster"
    start_cluster(directory, services, restart=True, restart_delay_s=1.0, timeout_s=90)
    client = JobManagerClient(services.jobmanager_address)
    cluster = WeirCluster(services, directory, client)
    _SESSION_CLUSTER.append(cluster)
    target_file: Path | None = None
    try:  # the cluster is stopped whatever fails from here on
        # Prometheus' config lists the default ports only: a second xdist worker's cluster is added to it
        target_file = register_scrape_targets(
            services, cluster_metrics_targets(services, TASKMANAGERS), "session-cluster"
        )
        yield cluster
    finally:
        if target_file is not None:
            target_file.unlink(missing_ok=True)
        try:  # the marker topics of jobs submitted another way (the CLI) are the session's too
            SESSION_TOPICS.job_ids.update(j.job_id for j in client.list_jobs())
        except WeirError:
            pass
        _SESSION_CLUSTER.clear()
        client.close()
        stop_cluster(directory)


@pytest.fixture(scope="session")
def secured_kafka(services: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """A second Kafka broker that clients reach over SASL_SSL (SCRAM-SHA-512) or SSL with a client
    certificate only (certificates of a CA made for it), started once per session with its own ports
    and directory and polled ready with a deadline (``tests/integration/secured_kafka.py``); stopped
    when the session ends."""
    secured = start_secured_kafka(
        tmp_path_factory.mktemp("secured-kafka"), f"scram-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    )
    try:
        yield secured
    finally:
        stop_secured_kafka(secured)


@pytest.fixture(autouse=True)
def cancel_leftover_jobs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before a test of the session's cluster: the cluster answers with every TaskManager (or the test
    fails at once with why it does not). After it: every job it left running is cancelled, however it
    was submitted (``WeirCluster.submit``, the client, the CLI, a scenario), so that its slots do not
    fail the tests after it. Jobs of module-scoped fixtures started before the test are left to the
    module's teardown (``cancel_module_leftover_jobs``)."""
    if "weir_cluster" not in request.fixturenames:
        yield
        return
    cluster: WeirCluster = request.getfixturevalue("weir_cluster")
    cluster.wait_for_taskmanagers()
    before = cluster.running_jobs()
    yield
    cluster.cancel_jobs_except(before)


@pytest.fixture(scope="module", autouse=True)
def cancel_module_leftover_jobs() -> Iterator[None]:
    """After a module's fixtures ended: cancel every job still running on the session's cluster (a
    module-scoped fixture's job its teardown left behind)."""
    yield
    if _SESSION_CLUSTER and _SESSION_CLUSTER[0].broken is None:
        _SESSION_CLUSTER[0].cancel_jobs_except(set())


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


TOPIC_CONFIG = {"retention.ms": "-1"}
"""A test's topics keep their records for ever (the session deletes its topics when it ends). Weir's
Kafka sink writes each record with its event timestamp (docs/sinks.md), and tests with fixed event
times (2023, 2024, the first of 2026) are older than the broker's default 7-day time retention, whose
check (every 5 min) deletes such a topic's whole log: a job's committed output, or its input not read
yet, vanished mid-test (the upgrade matrix lost a variant's 192 records between its commit and the read)."""


def create_topics(endpoints: Endpoints, topics: dict[str, int]) -> None:
    """Each topic with its partition count and ``TOPIC_CONFIG``; an existing topic is kept."""
    for name, partitions in topics.items():
        kafka.create_topic(endpoints, name, partitions, 1, TOPIC_CONFIG)


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
