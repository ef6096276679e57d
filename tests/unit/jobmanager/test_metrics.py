"""The JobManager's per-job gauges, refreshed from a real JobMaster (no gRPC, no cluster)."""

from __future__ import annotations

import textwrap
import uuid

from prometheus_client import REGISTRY

from jobmanager import metrics
from jobmanager.checkpointing.coordinator import default_metadata_key
from jobmanager.jobs import JobMaster, JobSubmission
from weir.api import load_job_source

JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_generator(lambda i: i, uid="gen", count=10).print(uid="out")
    """
).encode()


def master(parameters: dict[str, str]) -> JobMaster:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    loaded = load_job_source(JOB, "numbers.py", parameters, parallelism=1)
    submission = JobSubmission(job_id, "numbers", "numbers.py", JOB, parameters, 1, submitted_at=100.0)
    return JobMaster.create(submission, loaded, default_metadata_key)


def gauge(name: str, job_id: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"job_id": job_id, **labels})


def test_job_status_exports_the_checkpoint_interval_status_and_restarts() -> None:
    job = master({"checkpointing.interval": "500ms"})
    metrics.job_status(job)
    assert gauge("weir_checkpoint_interval_seconds", job.job_id) == 0.5
    assert gauge("weir_job_status", job.job_id, status=job.status.value) == 1
    assert gauge("weir_job_restarts", job.job_id) == 0


def test_no_interval_series_when_periodic_checkpoints_are_off() -> None:
    job = master({})
    metrics.job_status(job)
    assert gauge("weir_checkpoint_interval_seconds", job.job_id) is None
