"""`weir cluster up --no-restart`: a killed TaskManager stays dead and the job finishes on the slots of
the two that remain (2 slots each, a parallelism-3 job needs 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, assert_sinks_exact, create_topics, create_window_table, wait_for_job
from tests.integration.ports import private_ports
from weir.core.config import Endpoints
from weir.tools.client import JobManagerClient
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import kill_process, local_status, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster_without_restarts(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, Endpoints, JobManagerClient]]:
    for name, value in private_ports(services).items():  # beside the session's cluster
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("WEIR_CHECKPOINT_DIR", f"s3://{services.s3_bucket}/no-restart-{tmp_path.name}")
    endpoints = Endpoints.from_env()
    directory = tmp_path / "run" / "cluster"
    start_cluster(directory, endpoints, restart=False, timeout_s=90)
    client = JobManagerClient(endpoints.jobmanager_address)
    try:
        yield directory, endpoints, client
    finally:
        client.close()
        stop_cluster(directory)


def test_job_finishes_on_the_two_remaining_taskmanagers(
    cluster_without_restarts: tuple[Path, Endpoints, JobManagerClient], unique: str
) -> None:
    directory, endpoints, client = cluster_without_restarts
    source, sink, table = f"events-{unique}", f"results-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 6, sink: 3, f"dlq-{unique}": 1})
    create_window_table(endpoints, table)
    spec = EventSpec(count=60_000, keys=300)
    produce_events(endpoints, source, spec)
    params = {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": f"dlq-{unique}",
        "source.bounded": "true",
        "source.records_per_second": "6000",
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = client.submit_job(REPO_ROOT / "examples" / "keyed_aggregation.py", params, 3)
    polling.until(
        "2 completed checkpoints", 120, lambda: (client.job_status(job_id).last_completed_checkpoint or 0) >= 2
    )
    kill_process(directory, "taskmanager-3")

    status = wait_for_job(client, job_id, timeout_s=240)
    assert status.summary.status == "FINISHED", status.failure

    processes = {p.name: p for p in local_status(directory).processes}  # type: ignore[union-attr]
    assert not processes["taskmanager-3"].alive  # left dead: --no-restart
    assert {t.taskmanager_id for t in status.tasks} <= {"taskmanager-1", "taskmanager-2"}

    assert_sinks_exact("examples/keyed_aggregation.py", params, job_id, endpoints)  # both sinks, whole records
