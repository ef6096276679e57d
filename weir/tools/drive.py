"""Driving the local cluster from a tool: what ``make demo`` and the scenarios (``make scenario-upgrade``)
share. Checkpoints go to the S3 bucket, the cluster is started (or found running), the inputs are
recreated, and a job is followed until a condition holds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from rich.console import Console

from weir.connectors import kafka, postgres
from weir.core.config import LOCAL_MODE, Endpoints
from weir.core.errors import WeirError
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.supervisor import cluster_dir, start_cluster

JOB_POLL_S = 0.3


class DriveError(WeirError):
    """A job a tool drives ended or stalled where the tool needed it to go on."""


def s3_endpoints() -> Endpoints:
    """The endpoints of the local mode, with checkpoints in the S3 bucket unless ``WEIR_CHECKPOINT_DIR``
    says otherwise (the local mode's default is a local folder; the demos show S3)."""
    os.environ.setdefault(LOCAL_MODE, "true")
    os.environ.setdefault("WEIR_CHECKPOINT_DIR", f"s3://{Endpoints.from_env().s3_bucket}/checkpoints")
    return Endpoints.from_env()


def start_local_cluster(console: Console, endpoints: Endpoints) -> None:
    """Start the local cluster (JobManager + 3 TaskManagers), or use the one already up."""
    started = start_cluster(cluster_dir(), endpoints)
    console.print("cluster: " + ("already up" if started.already_running else "started") + f" ({cluster_dir()})")


def recreate_inputs(endpoints: Endpoints, topics: Mapping[str, int], table: str, definition: str) -> None:
    """Recreate the topics (name -> partitions), empty, and the table as ``CREATE TABLE table (definition)``."""
    kafka.create_topics(endpoints, topics, replace=True)
    postgres.replace_table(endpoints, table, definition)


def wait_for_job(
    client: JobManagerClient,
    job_id: str,
    done: Callable[[JobDetails], bool],
    timeout_s: float,
    what: str,
    on_poll: Callable[[JobDetails], None] | None = None,
) -> JobDetails:
    """Poll the job until ``done(status)``; DriveError when it ends FAILED or CANCELED first, or after
    ``timeout_s``. A JobManager that does not answer (restarting) is polled again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = client.job_status(job_id)
        except WeirError:
            time.sleep(JOB_POLL_S)
            continue
        if on_poll is not None:
            on_poll(status)
        if done(status):
            return status
        if status.summary.status in ("FAILED", "CANCELED"):
            raise DriveError(f"job {job_id} ended {status.summary.status} before {what}: {status.failure}")
        time.sleep(JOB_POLL_S)
    raise DriveError(f"job {job_id} did not get to {what} within {timeout_s:.0f}s")
