"""Jobs of many files (issue 31, item 1, "Proven by"): a job of three modules plus one third-party
requirement shipped as a wheel, submitted as ``weir run`` submits it (``--py-files``,
``--py-requirements``), exact in both sinks through a TaskManager kill and a JobManager kill (the
artifact comes back from checkpoint storage); two jobs whose ``helpers`` modules share a name but
differ, on the same TaskManagers at once, both exact."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster, create_topics, create_window_table
from tests.python_jobs import write_job, write_scale_wheel
from weir.api import LoadedJob
from weir.api.artifacts import JobArtifact, build_artifact
from weir.api.job_code import load_job, prepare_artifact
from weir.connectors.object_storage import open_storage
from weir.core.config import PythonJobSettings, checkpoint_dir
from weir.core.ids import JobId
from weir.core.paths import CheckpointPaths
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import kill_process
from weir.tools.verify import verify_job

pytestmark = pytest.mark.integration

PARALLELISM = 3


def make_artifact(directory: Path, tag: str) -> JobArtifact:
    """As ``weir run job.py --py-files src/ --py-requirements requirements.txt#wheels/`` packs it."""
    job, src = write_job(directory, tag)
    write_scale_wheel(directory / "wheels")
    requirements = directory / "requirements.txt"
    requirements.write_text("tinyscale==1.0\n", encoding="utf-8")
    return build_artifact(
        job_file=job,
        py_module=None,
        py_files=[src],
        requirements=f"{requirements}#{directory / 'wheels'}",
        max_bytes=PythonJobSettings.from_env().job_artifact_max_bytes,
    )


def inputs(cluster: WeirCluster, unique: str, events: int, rate: int) -> dict[str, str]:
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(cluster.endpoints, {source: 6, sink: 3, dlq: 1})
    create_window_table(cluster.endpoints, table)
    produce_events(cluster.endpoints, source, EventSpec(count=events, keys=300))
    return {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "source.records_per_second": str(rate),
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }


def submit(cluster: WeirCluster, artifact: JobArtifact, parameters: dict[str, str]) -> str:
    cluster.wait_for_taskmanagers()
    job_id = cluster.client.submit_job(None, parameters, PARALLELISM, artifact=artifact)
    cluster.submitted.append(job_id)
    return job_id


def reference_job(artifact: JobArtifact, parameters: dict[str, str]) -> LoadedJob:
    return load_job(prepare_artifact(artifact.data), parameters, 1)


def assert_exact(cluster: WeirCluster, artifact: JobArtifact, parameters: dict[str, str], job_id: str) -> None:
    report = verify_job(
        "job.py", parameters, job_id=job_id, endpoints=cluster.endpoints, loaded=reference_job(artifact, parameters)
    )
    assert report.ok, json.dumps(report.to_json(), indent=1)[:4000]
    assert report.sinks, "no Kafka or PostgreSQL sink verified"


def test_a_job_of_many_files_with_a_wheel_survives_a_taskmanager_and_a_jobmanager_kill_exactly(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    artifact = make_artifact(tmp_path, "a")
    params = inputs(weir_cluster, unique, 60_000, 5000)
    job_id = submit(weir_cluster, artifact, params)
    stored = open_storage(checkpoint_dir()).get_bytes(CheckpointPaths().job_artifact(JobId(job_id)))
    assert stored == artifact.data  # beside the job record, byte for byte
    for victim in ("taskmanager-2", "jobmanager"):
        status = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "RUNNING", "the job to run")
        target = (status.last_completed_checkpoint or 0) + 1
        status = wait_until(
            weir_cluster,
            job_id,
            lambda s, t=target, v=victim: (
                s.summary.status == "RUNNING"
                and (s.last_completed_checkpoint or 0) >= t
                and process_running(weir_cluster, v)
            ),
            f"checkpoint {target} before killing {victim}",
        )
        kill_process(weir_cluster.directory, victim)
        killed_at = status.last_completed_checkpoint or 0
        wait_until(
            weir_cluster,
            job_id,
            lambda s, k=killed_at: (
                s.summary.status == "RUNNING"
                and s.last_restore_at is not None
                and (s.last_completed_checkpoint or 0) >= k
                and s.last_restore_at > time.time() - 60
            ),
            f"recovery after killing {victim}",
        )
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.restarts >= 1
    assert_exact(weir_cluster, artifact, params, job_id)


def test_two_jobs_whose_helper_modules_share_a_name_run_side_by_side_exactly(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    jobs = []
    for tag in ("a", "b"):
        artifact = make_artifact(tmp_path / tag, tag)
        params = inputs(weir_cluster, f"{unique}{tag}", 20_000, 4000)
        jobs.append((artifact, params, submit(weir_cluster, artifact, params)))
    assert jobs[0][0].artifact_id != jobs[1][0].artifact_id
    # Both run at once: every TaskManager holds subtasks of each.
    for _artifact, _params, job_id in jobs:
        wait_until(weir_cluster, job_id, lambda s: s.summary.status in ("RUNNING", "FINISHED"), "both jobs to run")
    for artifact, params, job_id in jobs:
        final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
        assert final.summary.status == "FINISHED"
        assert_exact(weir_cluster, artifact, params, job_id)
