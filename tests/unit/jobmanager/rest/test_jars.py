"""Job submission over REST in Flink's shapes (``/jars/upload``, ``/jars``, ``/jars/{id}/run``, ``DELETE
/jars/{id}``) with Weir's job artifact for Flink's jar, on the JobManager of the unit harness."""

from __future__ import annotations

import io
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.unit.jobmanager.conftest import JOB, Harness
from weir.api.artifacts import build_artifact
from weir.jobmanager.rest.ids import flink_vertex_id, weir_job_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # Starlette would rather have httpx2 under it
    from fastapi.testclient import TestClient


MAX_BYTES = 1 << 20


def artifact_of(tmp_path: Path, source: bytes = JOB, name: str = "numbers.py") -> bytes:
    job_file = tmp_path / name
    job_file.write_bytes(source)
    return build_artifact(job_file=job_file, py_module=None, max_bytes=MAX_BYTES).data


def upload(client: TestClient, data: bytes, name: str = "numbers.zip") -> Any:
    return client.post("/jars/upload", files={"jarfile": (name, data, "application/x-java-archive")})


def errors_of(response: Any, status: int) -> list[str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"errors"} and body["errors"], body
    return list(body["errors"])


def test_an_uploaded_artifact_is_listed_and_runs_as_a_submitted_job(
    harness: Harness, client: TestClient, tmp_path: Path
) -> None:
    data = artifact_of(tmp_path)
    response = upload(client, data)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "success"
    jar_id = answer["filename"].rsplit("/", 1)[-1]  # as Flink's web UI takes it
    assert jar_id.endswith("_numbers.zip")
    (listed,) = client.get("/v1/jars").json()["files"]
    assert (listed["id"], listed["name"]) == (jar_id, "numbers.zip")
    assert listed["entry"] == [{"name": "numbers.py", "description": None}]
    assert abs(listed["uploaded"] - time.time() * 1000) < 60_000  # epoch ms
    run = client.post(
        f"/jars/{jar_id}/run",
        json={"programArgs": "-D rate=5 -Dlabel='two words'", "parallelism": 1, "flinkConfiguration": {"x": "y"}},
    )
    assert run.status_code == 200, run.text
    flink_id = run.json()["jobid"]
    assert len(flink_id) == 32
    job = harness.jm.jobs[weir_job_id(flink_id)]
    assert job.submission.artifact_id and job.submission.job_file_name == "numbers.py"
    assert {k: job.submission.parameters[k] for k in ("rate", "label", "x")} == {
        "rate": "5",
        "label": "two words",
        "x": "y",
    }
    assert harness.storage.exists(harness.jm.paths.job_artifact(job.job_id))  # stored as weir run stores it


def test_program_args_as_a_list_and_a_jar_runs_again(harness: Harness, client: TestClient, tmp_path: Path) -> None:
    jar_id = upload(client, artifact_of(tmp_path)).json()["filename"]
    first = client.post(f"/jars/{jar_id}/run", json={"programArgsList": ["-D", "rate=7"]}).json()["jobid"]
    second = client.post(f"/jars/{jar_id}/run").json()["jobid"]
    assert first != second
    assert harness.jm.jobs[weir_job_id(first)].submission.parameters["rate"] == "7"


def test_a_deleted_jar_is_gone(client: TestClient, tmp_path: Path) -> None:
    jar_id = upload(client, artifact_of(tmp_path)).json()["filename"]
    assert client.delete(f"/jars/{jar_id}").status_code == 200
    assert client.get("/jars").json()["files"] == []
    errors_of(client.delete(f"/jars/{jar_id}"), 404)
    errors_of(client.post(f"/jars/{jar_id}/run", json={}), 404)


def test_jars_are_newest_first_and_the_oldest_go_beyond_the_bound(client: TestClient, tmp_path: Path) -> None:
    from weir.jobmanager.rest.jars import JARS_KEPT

    data = artifact_of(tmp_path)
    ids = [upload(client, data, f"j{n}.zip").json()["filename"] for n in range(JARS_KEPT + 2)]
    listed = [f["id"] for f in client.get("/jars").json()["files"]]
    assert listed == ids[::-1][:JARS_KEPT]


def zip_of(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "data",
    [
        b"print('a job file, not an artifact')\n",
        zip_of({"job/job.py": JOB}),  # no manifest
        zip_of({"weir-artifact.json": b'{"format": 99}'}),
        zip_of({"weir-artifact.json": b"{}", "../evil.py": b""}),
    ],
)
def test_a_bad_artifact_is_a_bad_request_and_is_not_kept(client: TestClient, data: bytes) -> None:
    errors_of(upload(client, data), 400)
    assert client.get("/jars").json()["files"] == []


def test_an_upload_without_the_jarfile_field_or_not_multipart_is_a_bad_request(client: TestClient) -> None:
    assert "jarfile" in errors_of(client.post("/jars/upload", files={"other": ("a.zip", b"x")}), 400)[0]
    errors_of(client.post("/jars/upload", content=b"zip", headers={"content-type": "application/zip"}), 400)


def test_an_artifact_over_the_limit_is_refused(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_JOB_ARTIFACT_MAX_BYTES", "64")
    assert "over the limit" in errors_of(upload(client, artifact_of(tmp_path)), 400)[0]


@pytest.mark.parametrize(
    "body",
    [
        {"programArgs": "--rate 5"},  # Weir's jobs take -D key=value
        {"programArgs": "-D rate"},
        {"programArgs": "-D 'unclosed"},
        {"programArgsList": ["-D"]},
        {"parallelism": "two"},
        {"entryClass": "com.example.Job"},  # not the artifact's entry
        {"unknown": 1},
    ],
)
def test_a_bad_run_request_is_a_bad_request(client: TestClient, tmp_path: Path, body: dict[str, Any]) -> None:
    jar_id = upload(client, artifact_of(tmp_path)).json()["filename"]
    errors_of(client.post(f"/jars/{jar_id}/run", json=body), 400)


def test_a_job_that_does_not_load_is_refused_at_run_with_its_error(
    harness: Harness, client: TestClient, tmp_path: Path
) -> None:
    broken = (
        b"from weir.api import Environment\n\ndef build(env: Environment) -> None:\n    raise ValueError('no input')\n"
    )
    jar_id = upload(client, artifact_of(tmp_path, broken, "broken.py")).json()["filename"]
    (message,) = errors_of(client.post(f"/jars/{jar_id}/run", json={}), 400)
    assert "no input" in message
    assert harness.jm.list_jobs() == ()


def test_the_entry_class_may_name_the_artifact_s_entry(harness: Harness, client: TestClient, tmp_path: Path) -> None:
    jar_id = upload(client, artifact_of(tmp_path)).json()["filename"]
    assert client.post(f"/jars/{jar_id}/run", json={"entryClass": "numbers.py"}).status_code == 200


KEYED = b"""
from weir.api import Environment


def build(env: Environment) -> None:
    numbers = env.from_generator(lambda i: {"k": i % 3}, uid="numbers", count=10)
    label = env.params.get_str("label", "identity")
    numbers.key_by(lambda r: r["k"]).map(lambda r: r, uid="mapped", name=label).print(uid="out")
"""


def test_a_jars_plan_is_its_vertices_without_running_it(harness: Harness, client: TestClient, tmp_path: Path) -> None:
    jar_id = upload(client, artifact_of(tmp_path, KEYED, "keyed.py")).json()["filename"]
    answer = client.get(f"/v1/jars/{jar_id}/plan", params={"parallelism": "3", "entry-class": "keyed.py"})
    assert answer.status_code == 200, answer.text
    plan = answer.json()["plan"]
    assert len(plan["jid"]) == 32 and weir_job_id(plan["jid"]) not in harness.jm.jobs
    assert [n["uid"] for n in plan["nodes"]] == ["numbers", "mapped"]
    assert [n["id"] for n in plan["nodes"]] == [flink_vertex_id("numbers"), flink_vertex_id("mapped")]
    numbers, mapped = plan["nodes"]
    assert (numbers["parallelism"], numbers["inputs"]) == (3, [])
    assert [o["uid"] for o in mapped["operators"]] == ["mapped", "out"]
    assert mapped["description"].startswith("identity -> ")
    assert mapped["inputs"] == [
        {
            "num": 0,
            "id": flink_vertex_id("numbers"),
            "ship_strategy": "HASH",
            "exchange": "pipelined_bounded",
            "side_output": None,
        }
    ]
    assert harness.jm.list_jobs() == (), "the plan runs nothing"
    # Flink's body form, with -D parameters the job reads
    body = {"programArgsList": ["-D", "label=renamed"], "parallelism": 2}
    posted = client.post(f"/jars/{jar_id}/plan", json=body).json()["plan"]
    assert [n["parallelism"] for n in posted["nodes"]] == [2, 2]
    assert posted["nodes"][1]["description"].startswith("renamed -> ")


def test_a_jars_plan_refuses_what_run_refuses(client: TestClient, tmp_path: Path) -> None:
    broken = (
        b"from weir.api import Environment\n\ndef build(env: Environment) -> None:\n    raise ValueError('no plan')\n"
    )
    jar_id = upload(client, artifact_of(tmp_path, broken, "broken.py")).json()["filename"]
    assert "no plan" in errors_of(client.get(f"/jars/{jar_id}/plan"), 400)[0]
    assert "entryClass" in errors_of(client.get(f"/jars/{jar_id}/plan", params={"entry-class": "other.py"}), 400)[0]
    errors_of(client.get("/jars/no-such-jar/plan"), 404)
    errors_of(client.get(f"/jars/{jar_id}/plan", params={"programArg": "--not-a-parameter"}), 400)
