"""Job submission over REST as Flink's clients do it, with a Weir artifact for the jar: ``weir
package`` writes it, a plain HTTP client uploads it (``POST /jars/upload``, multipart field
``jarfile``) and runs it (``POST /jars/{id}/run``) on the session's cluster; the job runs and writes
its output. A file that is no artifact is refused with Flink's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, WeirCluster
from weir.jobmanager.rest.ids import weir_job_id
from weir.tools.cli import EXIT_OK, run_cli

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "fail_on_request.py"
PARALLELISM = 2
DEADLINE_S = 90.0
POLL_S = 0.2


@pytest.fixture
def http(weir_cluster: WeirCluster) -> Iterator[httpx.Client]:
    base = f"http://127.0.0.1:{weir_cluster.endpoints.jobmanager_rest_port}"
    with httpx.Client(base_url=base, timeout=60.0) as client:
        yield client


def upload(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return http.post("/jars/upload", files={"jarfile": (name, data, "application/x-java-archive")})


def output_records(output: Path) -> list[dict[str, Any]]:
    records = []
    for subtask in range(PARALLELISM):
        part = output.with_name(f"{output.name}.{subtask}")
        if part.exists():
            records.extend(json.loads(line) for line in part.read_text().splitlines() if line.endswith("}"))
    return records


def test_an_artifact_uploaded_and_run_over_rest_runs_and_writes_its_output(
    weir_cluster: WeirCluster, http: httpx.Client, tmp_path: Path
) -> None:
    artifact = tmp_path / "fail_on_request.zip"
    assert run_cli(["package", str(JOB), "-o", str(artifact)]) == EXIT_OK
    uploaded = upload(http, artifact.name, artifact.read_bytes())
    assert uploaded.status_code == 200, uploaded.text
    jar_id = uploaded.json()["filename"].rsplit("/", 1)[-1]
    assert jar_id in [f["id"] for f in http.get("/jars").json()["files"]]
    output = tmp_path / "out"
    arguments = [
        "-D",
        f"fail_request={tmp_path / 'never'}",
        "-D",
        f"fail_done={tmp_path / 'done'}",
        "-D",
        f"output={output}",
        "-D",
        "rate=100",
    ]
    run = http.post(f"/jars/{jar_id}/run", json={"programArgsList": arguments, "parallelism": PARALLELISM})
    assert run.status_code == 200, run.text
    flink_id = run.json()["jobid"]
    job_id = weir_job_id(flink_id)
    try:
        polling.until(
            "the job RUNNING", DEADLINE_S, lambda: http.get(f"/jobs/{flink_id}").json()["state"] == "RUNNING", POLL_S
        )
        status = weir_cluster.client.job_status(job_id)
        assert status.summary.parallelism == PARALLELISM
        records = polling.until(
            "its output", DEADLINE_S, lambda: (r := output_records(output)) and len(r) >= 50 and r, POLL_S
        )
        assert all(set(r) == {"i", "key", "ts"} for r in records)
        ids = [r["i"] for r in records]
        assert len(ids) == len(set(ids)), "a record written twice"
    finally:
        weir_cluster.client.cancel_job(job_id)
    assert http.delete(f"/jars/{jar_id}").status_code == 200
    assert jar_id not in [f["id"] for f in http.get("/jars").json()["files"]]


def test_a_file_that_is_no_artifact_is_a_bad_request(http: httpx.Client) -> None:
    response = upload(http, "job.py", JOB.read_bytes())
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"errors"} and "not a Weir job artifact" in body["errors"][0]
