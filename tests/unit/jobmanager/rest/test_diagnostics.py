"""Flink's logs, thread dumps and accumulators over a JobManager built without network."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.jobmanager.conftest import Harness
from tests.unit.jobmanager.rest.test_app import errors_of, running_job
from weir.core.roles import access_table, parse_tokens_file
from weir.core.thread_dump import thread_dump
from weir.jobmanager.rest import diagnostics
from weir.jobmanager.rest.app import create_app
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient


@pytest.fixture
def client(harness: Harness) -> Iterator[TestClient]:
    with TestClient(create_app(harness.jm, log_files=lambda: diagnostics.LogFiles(None, None))) as client:
        yield client


# Thread dumps -----------------------------------------------------------------------------------------


def test_a_thread_dump_names_every_thread_with_its_stack_innermost_frame_first() -> None:
    parked = threading.Event()
    done = threading.Event()

    def waiting_in_a_named_function() -> None:
        parked.set()
        done.wait(60)

    worker = threading.Thread(target=waiting_in_a_named_function, name="parked-worker", daemon=True)
    worker.start()
    parked.wait(60)
    try:
        dump = {t.name: t.stack for t in thread_dump(prefix="p/")}
    finally:
        done.set()
        worker.join(60)
    assert next(iter(dump)) == "p/MainThread"
    stack = dump["p/parked-worker"]
    assert stack.startswith(f'"parked-worker" Id={worker.ident} daemon')
    lines = stack.splitlines()
    assert lines[1].startswith("\tat wait(")  # Event.wait is innermost, its caller after it
    assert any(line.startswith("\tat waiting_in_a_named_function(") and __file__ in line for line in lines)


def test_the_jobmanagers_thread_dump_is_flinks_shape(client: TestClient) -> None:
    answer = client.get("/v1/jobmanager/thread-dump")
    assert answer.status_code == 200
    infos = answer.json()["threadInfos"]
    assert set(answer.json()) == {"threadInfos"}
    assert all(set(i) == {"threadName", "stringifiedThreadInfo"} for i in infos)
    assert "MainThread" in [i["threadName"] for i in infos]
    main = next(i for i in infos if i["threadName"] == "MainThread")
    assert main["stringifiedThreadInfo"].startswith('"MainThread" Id=')


def test_a_taskmanagers_thread_dump_is_asked_over_its_grpc_service(harness: Harness, client: TestClient) -> None:
    answer = client.get("/taskmanagers/tm-a/thread-dump")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "threadInfos": [
            {
                "threadName": "MainThread",
                "stringifiedThreadInfo": '"MainThread" Id=1 RUNNABLE\n\tat serve(tm-a:6124:1)\n',
            }
        ]
    }
    assert harness.gateway.named("thread_dump") == [("tm-a:6124",)]
    assert "no TaskManager 'nope'" in errors_of(client.get("/taskmanagers/nope/thread-dump"), 404)[0]
    harness.gateway.failing["tm-a:6124"] = "UNAVAILABLE"
    assert "UNAVAILABLE" in errors_of(client.get("/taskmanagers/tm-a/thread-dump"), 503)[0]


# Logs ------------------------------------------------------------------------------------------------


def test_without_a_log_file_the_list_is_empty_and_the_files_are_404(client: TestClient) -> None:
    assert client.get("/jobmanager/logs").json() == {"logs": []}
    for path in ("/jobmanager/log", "/jobmanager/stdout", "/jobmanager/logs/jobmanager.log"):
        assert "no" in errors_of(client.get(path), 404)[0]


def test_the_log_file_is_listed_and_served_and_no_other_file(harness: Harness, tmp_path: Path) -> None:
    log = tmp_path / "jobmanager.log"
    log.write_text('{"event": "jobmanager_started"}\n')
    os.utime(log, (1_700_000_000, 1_700_000_000))
    (tmp_path / "taskmanager-1.log").write_text("not the JobManager's\n")
    files = diagnostics.LogFiles(log=log, stdout=log)
    with TestClient(create_app(harness.jm, log_files=lambda: files)) as client:
        assert client.get("/jobmanager/logs").json() == {
            "logs": [{"name": "jobmanager.log", "size": log.stat().st_size, "mtime": 1_700_000_000_000}]
        }
        for path in ("/jobmanager/log", "/jobmanager/stdout", "/jobmanager/logs/jobmanager.log"):
            answer = client.get(path)
            assert answer.status_code == 200 and answer.text == '{"event": "jobmanager_started"}\n', path
            assert answer.headers["content-type"].startswith("text/plain")
        errors_of(client.get("/jobmanager/logs/taskmanager-1.log"), 404)
        errors_of(client.get("/jobmanager/logs/..%2Ftaskmanager-1.log"), 404)


def test_a_file_descriptor_names_its_file_only_when_it_is_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "out.log"
    with open(target, "w") as f:
        assert diagnostics.file_of(f.fileno()) == target
    read_end, write_end = os.pipe()
    try:
        assert diagnostics.file_of(write_end) is None
    finally:
        os.close(read_end)
        os.close(write_end)


# Accumulators ----------------------------------------------------------------------------------------


def test_accumulators_are_flinks_shapes_and_empty(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    assert client.get(f"/jobs/{flink_job_id(job.job_id)}/accumulators?includeSerializedValue=true").json() == {
        "job-accumulators": [],
        "user-task-accumulators": [],
        "serialized-user-task-accumulators": {},
    }
    vertex_id = flink_vertex_id("gen")
    assert client.get(f"/jobs/{job.job_id}/vertices/gen/accumulators").json() == {
        "id": vertex_id,
        "user-accumulators": [],
    }
    assert client.get(f"/jobs/{job.job_id}/vertices/{vertex_id}/subtasks/accumulators").json() == {
        "id": vertex_id,
        "parallelism": 1,
        "subtasks": [{"subtask": 0, "attempt": job.attempt, "host": "tm-a:6124", "user-accumulators": []}],
    }
    errors_of(client.get("/jobs/nope/accumulators"), 404)
    errors_of(client.get(f"/jobs/{job.job_id}/vertices/nope/accumulators"), 404)


def test_a_read_token_reads_logs_dumps_and_accumulators(harness: Harness) -> None:
    job = running_job(harness)
    table = access_table(None, parse_tokens_file("read reader\noperate operator\n", "tokens"), None)
    files = diagnostics.LogFiles(None, None)
    with TestClient(create_app(harness.jm, access=table, log_files=lambda: files)) as client:
        for path in (
            "/jobmanager/logs",
            "/jobmanager/thread-dump",
            "/taskmanagers/tm-a/thread-dump",
            f"/jobs/{job.job_id}/accumulators",
            f"/jobs/{job.job_id}/vertices/gen/accumulators",
            f"/jobs/{job.job_id}/vertices/gen/subtasks/accumulators",
        ):
            assert client.get(path, headers={"Authorization": "Bearer reader"}).status_code == 200, path
            errors_of(client.get(path), 401)
        assert (
            "submit" in errors_of(client.delete("/jars/some-jar", headers={"Authorization": "Bearer reader"}), 403)[0]
        )


# A TaskManager's logs, asked over its gRPC service ---------------------------------------------------


def test_a_taskmanagers_logs_are_listed_and_read_over_its_grpc_service(harness: Harness, client: TestClient) -> None:
    listed = client.get("/v1/taskmanagers/tm-a/logs")
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"logs": [{"name": "tm-a.log", "size": 11, "mtime": 1_700_000_000_500}]}
    for path in ("/taskmanagers/tm-a/log", "/v1/taskmanagers/tm-a/logs/tm-a.log"):
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.text == "line 1\nline 2\n" and answer.headers["content-type"].startswith("text/plain")
    # No such file on the TaskManager (its standard output is a pipe; a name it does not list): 404.
    assert "no such log file" in errors_of(client.get("/taskmanagers/tm-a/stdout"), 404)[0]
    assert "no such log file" in errors_of(client.get("/taskmanagers/tm-a/logs/other.log"), 404)[0]
    assert harness.gateway.named("list_logs") == [("tm-a:6124",)]
    assert harness.gateway.named("read_log") == [
        ("tm-a:6124", diagnostics.LogSelector.LOG, ""),
        ("tm-a:6124", diagnostics.LogSelector.NAMED, "tm-a.log"),
        ("tm-a:6124", diagnostics.LogSelector.STDOUT, ""),
        ("tm-a:6124", diagnostics.LogSelector.NAMED, "other.log"),
    ]
    for path in ("/taskmanagers/nope/logs", "/taskmanagers/nope/log", "/taskmanagers/nope/logs/x.log"):
        assert "no TaskManager 'nope'" in errors_of(client.get(path), 404)[0]
    harness.gateway.failing["tm-a:6124"] = "UNAVAILABLE"
    assert "UNAVAILABLE" in errors_of(client.get("/taskmanagers/tm-a/logs"), 503)[0]
    assert "UNAVAILABLE" in errors_of(client.get("/taskmanagers/tm-a/log"), 503)[0]
