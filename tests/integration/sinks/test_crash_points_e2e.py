"""Each crash point on a real cluster: run, crash, recover, finish; then `weir verify` finds both sinks
exact (0 duplicates, 0 missing) and no transaction left prepared or open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import (
    REPO_ROOT,
    assert_sinks_exact,
    create_topics,
    create_window_table,
    path_parameters,
    wait_for_job,
)
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.tools.client import JobManagerClient
from weir.tools.events import EventSpec, produce_events

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
CRASH_POINTS = [
    "after_pre_commit@taskmanager-2:3",
    "after_checkpoint_complete_before_commit@taskmanager-2:3",
    "between_sink_commits@taskmanager-2:3",
    "during_snapshot_upload@taskmanager-2:3",
]


@pytest.mark.parametrize(
    ("crash_cluster", "path"),
    [(point, "records") for point in CRASH_POINTS]
    + [(point, "columnar") for point in ("after_pre_commit@taskmanager-2:3", "between_sink_commits@taskmanager-2:3")],
    indirect=["crash_cluster"],
)
def test_crash_point_recovers_to_exact_sinks(
    crash_cluster: tuple[Endpoints, JobManagerClient], unique: str, path: str
) -> None:
    endpoints, client = crash_cluster
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 6, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    produce_events(endpoints, source, EventSpec(count=45_000, keys=500))  # 7.5 s at the throttle: the crash is mid-run
    params = {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "source.bounded": "true",
        "source.records_per_second": "6000",
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        **path_parameters(path),
    }
    job_id = client.submit_job(JOB, params, 3)
    status = wait_for_job(client, job_id, timeout_s=240)
    assert status.summary.status == "FINISHED", status.failure

    fired = list(Path(os.environ["WEIR_CRASH_ONCE_DIR"]).glob("*"))
    assert fired, "the crash point never fired: the test would prove nothing"
    assert status.summary.restarts >= 1

    assert_sinks_exact(JOB, params, job_id, endpoints)

    if os.environ["WEIR_CRASH_POINT"].startswith("after_pre_commit"):
        # The crash left a flushed, uncommitted Kafka transaction: recovery's fencing aborted it, so a
        # read_uncommitted consumer sees those records and a read_committed one does not.
        committed = kafka.read_all(endpoints, sink, "read_committed")
        uncommitted = kafka.read_all(endpoints, sink, "read_uncommitted")
        assert len(uncommitted) > len(committed)
