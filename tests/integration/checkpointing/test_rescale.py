"""Restore at another parallelism (Flink's resume-from-externalized-checkpoint matrix): the keyed
aggregation runs at parallelism P, is cancelled after a completed checkpoint, and a new job starts from
that retained checkpoint at parallelism N with `--from-checkpoint`. Both sinks end exact across the
two jobs (`weir verify`: nothing missing, duplicated or left prepared or open)."""

from __future__ import annotations

import pytest

from tests.integration import polling
from tests.integration.conftest import (
    RECORD_PATHS,
    REPO_ROOT,
    WeirCluster,
    assert_sinks_exact,
    keyed_aggregation_inputs,
    path_parameters,
)
from weir.core.checkpointing import CheckpointStatus
from weir.core.states import JobStatus
from weir.tools.client import CheckpointInfo, JobDetails

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
EVENTS = 30_000
UNTHROTTLED = {"source.records_per_second": "0"}


def events_read(status: JobDetails) -> int:
    """Events the source's chain passed to the window's vertex (a source task counts no input)."""
    return sum(t.records_in_all_attempts for t in status.tasks if t.vertex_uid != "events-source")


def retained(cluster: WeirCluster, job_id: str) -> list[CheckpointInfo]:
    infos = cluster.client.list_checkpoints(job_id)
    return sorted(
        (c for c in infos if c.status is CheckpointStatus.COMPLETED and c.external_path), key=lambda c: c.checkpoint_id
    )


@pytest.mark.parametrize(
    ("old_parallelism", "new_parallelism", "path"),
    [
        (3, 2, "records"),
        (2, 3, "records"),
        (3, 1, "records"),
        (3, 2, "columnar"),
        (2, 3, "columnar"),
    ],
)
def test_a_retained_checkpoint_restores_at_another_parallelism_with_exact_sinks(
    weir_cluster: WeirCluster, unique: str, old_parallelism: int, new_parallelism: int, path: str
) -> None:
    assert path in RECORD_PATHS
    endpoints = weir_cluster.endpoints
    client = weir_cluster.client
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=3000, checkpoint_interval="500ms")
    params |= path_parameters(path)

    old = client.submit_job(JOB, params, old_parallelism)
    # A completed checkpoint of the first job, part of the way through its input.
    first, status = polling.settle(
        120,
        lambda: (retained(weir_cluster, old), client.job_status(old)),
        lambda answer: bool(answer[0]) and events_read(answer[1]) > EVENTS // 4,
    )
    assert first and events_read(status) > EVENTS // 4, (status, client.list_checkpoints(old))
    assert client.job_status(old).summary.status is JobStatus.RUNNING, "the first job ended before it was cancelled"
    client.cancel_job(old)
    polling.until(
        "the first job to be CANCELED", 120, lambda: client.job_status(old).summary.status is JobStatus.CANCELED
    )
    read_by_old = events_read(client.job_status(old))
    assert read_by_old < EVENTS, "the first job read all its input: the restore would prove nothing"

    # Retained checkpoints of a cancelled job stay (RETAIN_ON_CANCELLATION), each with its path.
    checkpoints = retained(weir_cluster, old)
    assert checkpoints, "the cancelled job kept no retained checkpoint"
    latest = checkpoints[-1]
    assert latest.external_path.endswith(f"/{old}/checkpoints/chk-{latest.checkpoint_id:020d}/")

    # The restored job reads the rest at full speed: the throttle only kept the first one mid-run.
    new = client.submit_job(JOB, params | UNTHROTTLED, new_parallelism, from_checkpoint=latest.external_path)
    done = polling.settle(180, lambda: client.job_status(new), lambda s: s.summary.status.terminal)
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert done.summary.parallelism == new_parallelism
    sources = [t for t in done.tasks if t.vertex_uid == "events-source"]
    assert len(sources) == new_parallelism
    read_by_new = events_read(done)
    assert 0 < read_by_new < EVENTS, f"the restored job read {read_by_new} of {EVENTS} events: it did not resume"

    assert_sinks_exact(JOB, params, new, endpoints, earlier_job_ids=(old,))
