"""The `weir` command line: every error is one `weir: error:` line on stderr with its exit code.

No cluster is needed: "no cluster" points the CLI at a closed port, and the JobManager's answers come
from an in-process fake gRPC server that implements only what each test asks for.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from weir.api import load_job_source
from weir.core.checkpointing import ChannelBarrierTime, SubtaskCheckpointTimeline
from weir.core.codec import job_status_to_proto, timeline_to_proto
from weir.core.errors import CommandLineError
from weir.core.states import JobStatus
from weir.sql import explain, plan_script
from weir.tools.cli import (
    EXIT_FAILURE,
    EXIT_NO_CLUSTER,
    EXIT_OK,
    EXIT_USAGE,
    parse_parameters,
    run_cli,
    sql_job_source,
)
from weir.tools.client import JobManagerClient
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc

VALID_JOB = """
def build(env):
    env.from_collection([1, 2, 3], uid="numbers").print(uid="out")
"""


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str


Weir = Callable[..., Result]
JobFile = Callable[[str], Path]


@pytest.fixture
def weir(capsys: pytest.CaptureFixture[str]) -> Weir:
    """Run `weir ARGS...` in this process; answers exit code, stdout and stderr."""

    def invoke(*args: str) -> Result:
        code = run_cli(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


def assert_error(result: Result, exit_code: int, message: str) -> None:
    assert result.stderr == f"weir: error: {message}\n"
    assert result.exit_code == exit_code


@dataclass
class FakeJobManager(jobmanager_pb2_grpc.JobManagerServiceServicer):
    """A JobManager knowing only the jobs in ``jobs``; SubmitJob fails with ``submit_error`` if set."""

    jobs: dict[str, jobmanager_pb2.GetJobStatusResponse] = field(default_factory=dict)
    submit_error: tuple[grpc.StatusCode, str] | None = None
    submitted: list[jobmanager_pb2.SubmitJobRequest] = field(default_factory=list)
    checkpoints: dict[str, jobmanager_pb2.ListCheckpointsResponse] = field(default_factory=dict)
    savepoints: list[jobmanager_pb2.TriggerSavepointRequest] = field(default_factory=list)
    details: dict[tuple[str, int], jobmanager_pb2.GetCheckpointDetailResponse] = field(default_factory=dict)
    checkpoint_requests: list[jobmanager_pb2.TriggerJobCheckpointRequest] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each ListJobs call's `authorization`

    def TriggerJobCheckpoint(  # noqa: N802
        self, request: jobmanager_pb2.TriggerJobCheckpointRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.TriggerJobCheckpointResponse:
        """Checkpoint 7 completes at once; a job the fake does not know is NOT_FOUND."""
        self.checkpoint_requests.append(request)
        if request.job_id not in self.jobs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id}")
        self.checkpoints[request.job_id] = jobmanager_pb2.ListCheckpointsResponse(
            checkpoints=[
                jobmanager_pb2.CheckpointInfo(
                    checkpoint_id=7,
                    status=jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED,
                    kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
                    size_bytes=2048,
                    external_path=f"s3://weir/{request.job_id}/checkpoints/chk-7",
                )
            ]
        )
        return jobmanager_pb2.TriggerJobCheckpointResponse(checkpoint_id=7)

    def GetCheckpointDetail(  # noqa: N802
        self, request: jobmanager_pb2.GetCheckpointDetailRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetCheckpointDetailResponse:
        """NOT_FOUND with the reason in its status details, as the JobManager's servicer answers."""
        found = self.details.get((request.job_id, request.checkpoint_id))
        if found is None:
            known = any(job == request.job_id for job, _ in self.details)
            reason = (
                jobmanager_pb2.ERROR_REASON_UNKNOWN_CHECKPOINT if known else jobmanager_pb2.ERROR_REASON_UNKNOWN_JOB
            )
            detail = any_pb2.Any()
            detail.Pack(jobmanager_pb2.ErrorDetail(reason=reason))
            status = status_pb2.Status(code=grpc.StatusCode.NOT_FOUND.value[0], message="not found", details=[detail])
            context.abort_with_status(rpc_status.to_status(status))
        return found

    def TriggerSavepoint(  # noqa: N802
        self, request: jobmanager_pb2.TriggerSavepointRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.TriggerSavepointResponse:
        """Savepoint 9 completes at once under the request's directory; a stop ends the job FINISHED."""
        self.savepoints.append(request)
        path = f"{request.target_directory or 's3://weir/jobs'}/savepoint-{request.job_id}-9/"
        self.checkpoints[request.job_id] = jobmanager_pb2.ListCheckpointsResponse(
            checkpoints=[
                jobmanager_pb2.CheckpointInfo(
                    checkpoint_id=9,
                    status=jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED,
                    kind=common_pb2.CHECKPOINT_KIND_SAVEPOINT,
                    external_path=path,
                )
            ]
        )
        if request.stop:
            self.jobs[request.job_id] = job_status(request.job_id, "FINISHED")
        return jobmanager_pb2.TriggerSavepointResponse(savepoint_id=9)

    def ListCheckpoints(  # noqa: N802
        self, request: jobmanager_pb2.ListCheckpointsRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.ListCheckpointsResponse:
        if request.job_id not in self.checkpoints:  # as a JobManager without the RPC would answer
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        return self.checkpoints[request.job_id]

    def SubmitJob(  # noqa: N802
        self, request: jobmanager_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.SubmitJobResponse:
        self.submitted.append(request)
        if self.submit_error is not None:
            context.abort(*self.submit_error)
        return jobmanager_pb2.SubmitJobResponse(job_id="job-1")

    def ListJobs(  # noqa: N802
        self, request: jobmanager_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.ListJobsResponse:
        self.authorizations.append(dict(context.invocation_metadata()).get("authorization"))
        return jobmanager_pb2.ListJobsResponse(jobs=[j.summary for j in self.jobs.values()])

    def GetJobStatus(  # noqa: N802
        self, request: jobmanager_pb2.GetJobStatusRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetJobStatusResponse:
        if request.job_id not in self.jobs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id}")
        return self.jobs[request.job_id]

    def CancelJob(  # noqa: N802
        self, request: jobmanager_pb2.CancelJobRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.CancelJobResponse:
        if request.job_id not in self.jobs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id}")
        return jobmanager_pb2.CancelJobResponse(status=jobmanager_pb2.JOB_STATUS_CANCELLING)


def job_status(
    job_id: str, status: str, failure: common_pb2.Failure | None = None
) -> jobmanager_pb2.GetJobStatusResponse:
    return jobmanager_pb2.GetJobStatusResponse(
        summary=jobmanager_pb2.JobSummary(
            job_id=job_id, job_name="numbers", status=job_status_to_proto(JobStatus(status)), parallelism=1
        ),
        tasks=[
            jobmanager_pb2.TaskStatus(
                task=common_pb2.TaskRef(job_id=job_id, vertex_uid="numbers", subtask=0),
                operator_names="generator -> print",
                state=common_pb2.TASK_STATE_FINISHED,
                taskmanager_id="taskmanager-1",
                records_in=3,
                records_out=3,
            )
        ],
        failure=failure,
    )


@pytest.fixture
def fake_jobmanager(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeJobManager]:
    fake = FakeJobManager()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", f"127.0.0.1:{port}")
    yield fake
    server.stop(grace=None)


@pytest.fixture
def no_jobmanager(monkeypatch: pytest.MonkeyPatch) -> str:
    """An address where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", address)
    return address


@pytest.fixture
def job_file(tmp_path: Path) -> JobFile:
    def write(source: str) -> Path:
        path = tmp_path / "job.py"
        path.write_text(source, encoding="utf-8")
        return path

    return write


# No cluster, unknown job -------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("status", "job-x"), ("cancel", "job-x"), ("list",), ("checkpoints", "job-x")])
def test_no_jobmanager_is_exit_3(weir: Weir, no_jobmanager: str, args: tuple[str, ...]) -> None:
    result = weir(*args)
    assert_error(result, EXIT_NO_CLUSTER, f"no JobManager at {no_jobmanager}: start the cluster with `weir cluster up`")
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["status", "cancel"])
def test_unknown_job_is_exit_2(weir: Weir, fake_jobmanager: FakeJobManager, command: str) -> None:
    assert_error(weir(command, "job-x"), EXIT_USAGE, "unknown job job-x")


def test_a_failed_grpc_call_reaching_the_cli_is_one_line_naming_its_status(
    weir: Weir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC failure the client did not translate still ends as one line with its status code (the
    CLI module does not import grpc itself: it looks the error up where the call raised it)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(jobmanager_pb2_grpc.JobManagerServiceServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as failed:
                jobmanager_pb2_grpc.JobManagerServiceStub(channel).ListJobs(jobmanager_pb2.ListJobsRequest())
    finally:
        server.stop(grace=None)

    def client() -> JobManagerClient:
        raise failed.value

    monkeypatch.setattr("weir.tools.cli._client", client)
    assert_error(weir("list"), EXIT_FAILURE, "a JobManager call failed with UNIMPLEMENTED")


# Job files that do not load: refused before the cluster is asked ---------------------------------


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("import no_such_module_anywhere\n", "does not import: ModuleNotFoundError"),
        ("def build(env)\n", "does not compile"),
        ("x = 1\n", "defines no build(env) function"),
        ("def build(env):\n    raise RuntimeError('boom')\n", "build(env) failed: RuntimeError: boom"),
    ],
)
def test_bad_job_file_is_one_line_exit_2(
    weir: Weir, job_file: JobFile, no_jobmanager: str, source: str, reason: str
) -> None:
    path = job_file(source)
    result = weir("run", str(path))
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith(f"weir: error: job file {path}")
    assert reason in result.stderr
    assert result.stderr.count("\n") == 1


def test_missing_job_file_is_exit_2(weir: Weir, tmp_path: Path, no_jobmanager: str) -> None:
    path = tmp_path / "missing.py"
    assert_error(weir("run", str(path)), EXIT_USAGE, f"job file {path} does not exist")


def test_parameter_without_equals_is_exit_2(weir: Weir, job_file: JobFile, no_jobmanager: str) -> None:
    assert_error(weir("run", str(job_file(VALID_JOB)), "-D", "rate"), EXIT_USAGE, "-D 'rate': expected key=value")


def test_parse_parameters() -> None:
    assert parse_parameters(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(CommandLineError):
        parse_parameters(["=1"])


def test_bad_option_value_is_exit_2(weir: Weir, job_file: JobFile) -> None:
    result = weir("run", str(job_file(VALID_JOB)), "--parallelism", "0")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("weir: error: Invalid value for '--parallelism'")
    assert result.stderr.count("\n") == 1


# Answers of the JobManager -----------------------------------------------------------------------


def test_not_enough_slots_is_exit_1(weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.submit_error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "the job needs 8 slots, 6 are free")
    result = weir("run", str(job_file(VALID_JOB)), "-p", "4", "-D", "rate=10")
    assert_error(result, EXIT_FAILURE, "the job needs 8 slots, 6 are free")
    [request] = fake_jobmanager.submitted
    assert (request.parallelism, dict(request.parameters), request.job_name) == (4, {"rate": "10"}, "job")
    assert request.job_source == VALID_JOB.encode()


def test_job_rejected_by_the_jobmanager_is_exit_2(
    weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager
) -> None:
    fake_jobmanager.submit_error = (grpc.StatusCode.INVALID_ARGUMENT, "operator 'out': no such sink")
    assert_error(weir("run", str(job_file(VALID_JOB))), EXIT_USAGE, "operator 'out': no such sink")


def test_run_follows_the_job_to_finished(weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "FINISHED")
    result = weir("run", str(job_file(VALID_JOB)))
    assert result.exit_code == EXIT_OK
    assert "job job-1 FINISHED: records in 3, out 3" in result.stdout


def test_run_of_a_failing_job_is_exit_1_with_the_reason(
    weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager
) -> None:
    failure = common_pb2.Failure(
        type="ValueError",
        message="task numbers#0 failed: bad\nrecord",
        fault=common_pb2.FAULT_USER,
        retriable=False,
    )
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "FAILED", failure)
    result = weir("run", str(job_file(VALID_JOB)), "--json")
    assert_error(
        result,
        EXIT_FAILURE,
        "job job-1 FAILED: ValueError: task numbers#0 failed: bad record (user fault, not retriable)",
    )
    assert json.loads(result.stdout)["summary"]["status"] == "FAILED"


def test_run_detached_prints_the_job_id(weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager) -> None:
    result = weir("run", str(job_file(VALID_JOB)), "--detach", "--json")
    assert (result.exit_code, json.loads(result.stdout)) == (EXIT_OK, {"job_id": "job-1"})


def test_run_from_a_retained_checkpoint_sends_its_path(
    weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager
) -> None:
    path = "s3://weir/jobs/old-job/checkpoints/chk-00000000000000000007/"
    skip = "--skip-upgrade-check"  # no such checkpoint in storage: this is about what is sent
    result = weir("run", str(job_file(VALID_JOB)), "--from-checkpoint", path, "-p", "2", "--detach", skip)
    assert result.exit_code == EXIT_OK, result.stderr
    request = fake_jobmanager.submitted[-1]
    assert (request.from_checkpoint, request.parallelism, request.allow_non_restored_state) == (path, 2, False)
    weir("run", str(job_file(VALID_JOB)), "-s", path, "--allow-non-restored-state", "--detach", skip)
    assert fake_jobmanager.submitted[-1].allow_non_restored_state


def test_checkpoints_lists_the_external_path_of_each_retained_checkpoint(
    weir: Weir, fake_jobmanager: FakeJobManager
) -> None:
    path = "s3://weir/jobs/job-1/checkpoints/chk-00000000000000000007/"
    fake_jobmanager.checkpoints["job-1"] = jobmanager_pb2.ListCheckpointsResponse(
        checkpoints=[
            jobmanager_pb2.CheckpointInfo(
                checkpoint_id=8,
                status=jobmanager_pb2.CHECKPOINT_STATUS_FAILED,
                kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
                failure="declined",
            ),
            jobmanager_pb2.CheckpointInfo(
                checkpoint_id=7,
                status=jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED,
                kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
                external_path=path,
            ),
        ]
    )
    result = weir("checkpoints", "job-1")
    assert result.exit_code == EXIT_OK, result.stderr
    assert f"  7  {path}" in result.stdout
    listed = json.loads(weir("checkpoints", "job-1", "--json").stdout)["checkpoints"]
    assert {c["checkpoint_id"]: c["external_path"] for c in listed} == {8: "", 7: path}


def task_stats(
    vertex: str, subtask: int, alignment_s: float, start_delay_s: float, inflight_bytes: int = 0
) -> jobmanager_pb2.TaskCheckpointStats:
    return jobmanager_pb2.TaskCheckpointStats(
        task=common_pb2.TaskRef(job_id="job-1", vertex_uid=vertex, subtask=subtask),
        alignment_duration_s=alignment_s,
        start_delay_s=start_delay_s,
        state_size_bytes=100,
        unaligned=inflight_bytes > 0,
        inflight_bytes=inflight_bytes,
    )


def rows(output: str) -> dict[str, list[str]]:
    """The table rows of `weir checkpoints`, by their first cell."""
    cells = [[c.strip() for c in line.strip("│┃ ").split("│")] for line in output.splitlines() if "│" in line]
    return {r[0]: r[1:] for r in cells if r[0]}


def test_checkpoints_show_aligned_or_unaligned_with_inflight_bytes_and_per_task_timings(
    weir: Weir, fake_jobmanager: FakeJobManager
) -> None:
    fake_jobmanager.checkpoints["job-1"] = jobmanager_pb2.ListCheckpointsResponse(
        checkpoints=[
            jobmanager_pb2.CheckpointInfo(
                checkpoint_id=8,
                status=jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED,
                kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
                tasks=[task_stats("src", 0, 0.0, 0.002), task_stats("win", 1, 0.004, 0.003)],
            ),
            jobmanager_pb2.CheckpointInfo(
                checkpoint_id=7,
                status=jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED,
                kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
                tasks=[task_stats("src", 0, 0.0, 0.005), task_stats("win", 1, 1.5, 0.25, inflight_bytes=1792)],
            ),
            jobmanager_pb2.CheckpointInfo(
                checkpoint_id=9,
                status=jobmanager_pb2.CHECKPOINT_STATUS_IN_PROGRESS,
                kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
            ),
        ]
    )
    result = weir("checkpoints", "job-1", "--checkpoint", "7")
    assert result.exit_code == EXIT_OK, result.stderr
    listed = rows(result.stdout)
    # id, kind, status, triggered, duration, size, mode, in flight, failure
    assert [listed[i][5:7] for i in ("7", "8", "9")] == [["unaligned", "1.8 KiB"], ["aligned", "-"], ["-", "-"]]
    assert "checkpoint 7: tasks (unaligned, 1.8 KiB in flight)" in result.stdout
    # task, mode, alignment, start delay, state size, in flight
    assert listed["src#0"] == ["aligned", "0 ms", "5 ms", "100 B", "-"]
    assert listed["win#1"] == ["unaligned", "1.50 s", "250 ms", "100 B", "1.8 KiB"]
    latest = rows(weir("checkpoints", "job-1").stdout)
    assert latest["win#1"] == ["aligned", "4 ms", "3 ms", "100 B", "-"]
    documents = json.loads(weir("checkpoints", "job-1", "--json").stdout)["checkpoints"]
    assert {c["checkpoint_id"]: (c["unaligned"], c["inflight_bytes"]) for c in documents} == {
        8: (False, 0),
        7: (True, 1792),
        9: (False, 0),
    }
    (window,) = [t for t in documents[1]["tasks"] if t["vertex_uid"] == "win"]
    assert (window["unaligned"], window["inflight_bytes"], window["alignment_duration_s"]) == (True, 1792, 1.5)


def test_savepoint_prints_the_path_once_it_completed(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    result = weir("savepoint", "job-1", "--path", "s3://user/sp")
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip() == "savepoint 9 of job job-1: s3://user/sp/savepoint-job-1-9/"
    request = fake_jobmanager.savepoints[-1]
    assert (request.target_directory, request.stop, request.drain) == ("s3://user/sp", False, False)


def test_stop_takes_a_savepoint_and_waits_for_the_job_to_finish(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    result = weir("stop", "job-1", "--drain", "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    assert json.loads(result.stdout) == {
        "job_id": "job-1",
        "savepoint_id": 9,
        "path": "s3://weir/jobs/savepoint-job-1-9/",
        "status": "FINISHED",
    }
    request = fake_jobmanager.savepoints[-1]
    assert (request.stop, request.drain) == (True, True)


def test_cancel_prints_the_status_the_jobmanager_answers(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    result = weir("cancel", "job-1")
    assert result.exit_code == EXIT_OK
    assert result.stdout.strip() == "job job-1: CANCELLING"


def test_status_and_list_as_json(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    status = json.loads(weir("status", "job-1", "--json").stdout)
    assert status["tasks"][0] == {
        "vertex_uid": "numbers",
        "subtask": 0,
        "operator_names": "generator -> print",
        "state": "FINISHED",
        "taskmanager_id": "taskmanager-1",
        "failure": None,
        "records_in": 3,
        "records_out": 3,
        "records_in_all_attempts": 0,
    }
    assert status["last_completed_checkpoint"] is None
    listed = json.loads(weir("list", "--json").stdout)
    assert [j["job_id"] for j in listed["jobs"]] == ["job-1"]


def test_unexpected_error_is_one_line_with_the_debug_hint(
    weir: Weir, fake_jobmanager: FakeJobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: JobManagerClient) -> None:
        raise RuntimeError("something broke")

    monkeypatch.setattr(JobManagerClient, "list_jobs", broken)
    assert_error(weir("list"), EXIT_FAILURE, "RuntimeError: something broke (set WEIR_DEBUG=1 for the traceback)")


def test_unimplemented_rpc_is_exit_1(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    result = weir("checkpoints", "job-1")
    assert result.exit_code == EXIT_FAILURE
    assert result.stderr.startswith("weir: error: the JobManager at 127.0.0.1:")
    assert "answered UNIMPLEMENTED" in result.stderr


def test_cluster_kill_without_a_cluster_is_exit_3(weir: Weir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path))
    result = weir("cluster", "kill", "taskmanager-1")
    assert_error(
        result, EXIT_NO_CLUSTER, f"no local cluster runs in {tmp_path / 'cluster'}: start it with `weir cluster up`"
    )


def test_the_installed_entry_point_prints_one_line(tmp_path: Path) -> None:
    weir_bin = Path(sys.executable).parent / "weir"
    assert weir_bin.exists(), f"the weir entry point is not installed beside {sys.executable}: run `make setup`"
    completed = subprocess.run(
        [str(weir_bin), "run", str(tmp_path / "job.py"), "-D", "novalue"], capture_output=True, text=True, timeout=30
    )
    assert (completed.returncode, completed.stderr) == (EXIT_USAGE, "weir: error: -D 'novalue': expected key=value\n")


def test_version_prints_the_installed_distributions_version(weir: Weir) -> None:
    from importlib import metadata

    result = weir("--version")
    assert result.exit_code == EXIT_OK
    # The distribution's name ("weir" on PyPI is another project): metadata of "weir" was found only
    # where a stale weir.egg-info lay in the working directory.
    assert result.stdout == f"weir {metadata.version('weir-streaming')}\n"
    assert result.stderr == ""


def test_a_bad_weir_variable_is_one_line_and_exit_2(weir: Weir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", "jobmanager")
    assert_error(
        weir("list"),
        EXIT_USAGE,
        "bad configuration: WEIR_JOBMANAGER_ADDRESS='jobmanager': expected host:port with a port in 1..65535",
    )


def test_checkpoints_detail_prints_each_subtasks_timeline(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    trigger = 1_700_000_000.0
    window = task_stats("win", 1, 0.2, 0.01)
    window.acked_at = trigger + 0.5
    window.timeline.CopyFrom(
        timeline_to_proto(
            SubtaskCheckpointTimeline(
                first_barrier_at=trigger + 0.01,
                channels=(
                    ChannelBarrierTime(0, "src", 0, trigger + 0.01),
                    ChannelBarrierTime(1, "src", 1, trigger + 0.2),
                ),
                alignment_end_at=trigger + 0.2,
                sync_end_at=trigger + 0.25,
                async_end_at=trigger + 0.45,
            )
        )
    )
    fake_jobmanager.details["job-1", 7] = jobmanager_pb2.GetCheckpointDetailResponse(
        checkpoint=jobmanager_pb2.CheckpointInfo(
            checkpoint_id=7,
            status=jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED,
            kind=common_pb2.CHECKPOINT_KIND_CHECKPOINT,
            trigger_time=trigger,
            duration_s=0.5,
            tasks=[window],
        ),
        pending_tasks=[common_pb2.TaskRef(job_id="job-1", vertex_uid="sink", subtask=0)],
    )
    result = weir("checkpoints", "job-1", "--detail", "7")
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.startswith("checkpoint 7 of job job-1: COMPLETED, aligned")
    (line,) = [row for row in result.stdout.splitlines() if row.startswith("win#1")]
    assert line.split()[1:6] == ["10", "200", "250", "450", "500"]
    assert "slowest" in next(row for row in result.stdout.splitlines() if "ch 1 src#1" in row)
    assert "not acknowledged: sink#0" in result.stdout
    document = json.loads(weir("checkpoints", "job-1", "--detail", "7", "--json").stdout)
    (task,) = document["checkpoint"]["tasks"]
    assert task["timeline"]["channels"][1] == {
        "channel": 1,
        "upstream_vertex": "src",
        "upstream_subtask": 1,
        "barrier_at": trigger + 0.2,
    }
    assert document["pending"] == [["sink", 0]]


def test_checkpoints_detail_of_an_unknown_checkpoint_or_job_is_exit_2(
    weir: Weir, fake_jobmanager: FakeJobManager
) -> None:
    fake_jobmanager.details["job-1", 7] = jobmanager_pb2.GetCheckpointDetailResponse()
    assert_error(
        weir("checkpoints", "job-1", "--detail", "8"),
        EXIT_USAGE,
        "job job-1 has no checkpoint 8 (`weir checkpoints job-1` lists the recent and the retained ones)",
    )
    assert_error(weir("checkpoints", "job-2", "--detail", "8"), EXIT_USAGE, "unknown job job-2")


# The options a Flink user types ------------------------------------------------------------------


def test_run_takes_flinks_long_and_short_option_names(
    weir: Weir, job_file: JobFile, fake_jobmanager: FakeJobManager
) -> None:
    path = job_file(VALID_JOB)
    skip = "--skip-upgrade-check"  # no such savepoint in storage: this is about the option names
    result = weir("run", "--detached", "-n", "--fromSavepoint", "s3://w/sp", "-p", "2", "-D", "a=b", str(path), skip)
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip() == "job-1"
    request = fake_jobmanager.submitted[-1]
    assert (request.from_checkpoint, request.allow_non_restored_state, request.parallelism) == ("s3://w/sp", True, 2)
    assert dict(request.parameters) == {"a": "b"}
    weir("run", "-d", "--allowNonRestoredState", "-s", "s3://w/sp2", str(path), skip)
    assert (fake_jobmanager.submitted[-1].from_checkpoint, fake_jobmanager.submitted[-1].allow_non_restored_state) == (
        "s3://w/sp2",
        True,
    )


def test_jobmanager_option_wins_over_the_environment(
    weir: Weir, fake_jobmanager: FakeJobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    address = __import__("os").environ["WEIR_JOBMANAGER_ADDRESS"]
    with socket.socket() as sock:  # nothing listens where the environment points
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", f"127.0.0.1:{sock.getsockname()[1]}")
    for args in (("list", "-m", address), ("-m", address, "list"), ("status", "job-1", "--jobmanager", address)):
        result = weir(*args)
        assert result.exit_code == EXIT_OK, (args, result.stderr)
        assert "job-1" in result.stdout
    assert weir("list").exit_code == EXIT_NO_CLUSTER
    assert_error(weir("list", "-m", "nohost"), EXIT_USAGE, "-m 'nohost': expected host:port with a port in 1..65535")


def test_list_filters_running_scheduled_or_all_as_flink(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    for job_id, job_state in (("j-run", "RUNNING"), ("j-new", "CREATED"), ("j-restart", "RESTARTING")):
        fake_jobmanager.jobs[job_id] = job_status(job_id, job_state)
    fake_jobmanager.jobs["j-done"] = job_status("j-done", "FINISHED")

    def listed(*flags: str) -> list[str]:
        result = weir("list", *flags, "--json")
        assert result.exit_code == EXIT_OK, result.stderr
        return sorted(j["job_id"] for j in json.loads(result.stdout)["jobs"])

    everything = ["j-done", "j-new", "j-restart", "j-run"]
    assert listed() == everything
    assert listed("-a") == listed("--all") == everything
    assert listed("-r") == listed("--running") == ["j-restart", "j-run"]
    assert listed("-s") == listed("--scheduled") == ["j-new"]
    assert listed("-r", "-s") == ["j-new", "j-restart", "j-run"]
    text = weir("list", "-r").stdout
    assert "j-run" in text and "j-done" not in text


def test_savepoint_takes_the_target_directory_as_flinks_second_argument(
    weir: Weir, fake_jobmanager: FakeJobManager
) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    result = weir("savepoint", "job-1", "s3://user/sp")
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip() == "savepoint 9 of job job-1: s3://user/sp/savepoint-job-1-9/"
    assert fake_jobmanager.savepoints[-1].target_directory == "s3://user/sp"
    assert_error(
        weir("savepoint", "job-1", "s3://a", "--path", "s3://b"),
        EXIT_USAGE,
        "give the savepoint's directory once: as DIR or as --path",
    )


def test_stop_takes_flinks_savepoint_path_and_drain_names(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    result = weir("stop", "job-1", "-p", "s3://user/sp", "-d")
    assert result.exit_code == EXIT_OK, result.stderr
    request = fake_jobmanager.savepoints[-1]
    assert (request.target_directory, request.stop, request.drain) == ("s3://user/sp", True, True)
    weir("stop", "job-1", "--savepointPath", "s3://x")
    assert fake_jobmanager.savepoints[-1].target_directory == "s3://x"


def test_checkpoint_triggers_one_and_prints_it_once_it_completed(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    result = weir("checkpoint", "job-1")
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip() == "checkpoint 7 of job job-1 completed (2.0 KiB): s3://weir/job-1/checkpoints/chk-7"
    assert [(r.job_id, r.full) for r in fake_jobmanager.checkpoint_requests] == [("job-1", False)]
    document = json.loads(weir("checkpoint", "job-1", "--json").stdout)
    assert document == {
        "job_id": "job-1",
        "checkpoint_id": 7,
        "size_bytes": 2048,
        "path": "s3://weir/job-1/checkpoints/chk-7",
        "full": False,
    }
    assert_error(weir("checkpoint", "job-x"), EXIT_USAGE, "unknown job job-x")


def test_checkpoint_full_asks_the_jobmanager_for_a_full_one(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    fake_jobmanager.jobs["job-1"] = job_status("job-1", "RUNNING")
    for flag in ("--full", "-full"):
        result = weir("checkpoint", "job-1", flag)
        assert result.exit_code == EXIT_OK, result.stderr
    assert [r.full for r in fake_jobmanager.checkpoint_requests] == [True, True]


def test_info_prints_the_plan_without_submitting(weir: Weir, job_file: JobFile, no_jobmanager: str) -> None:
    path = job_file(
        """
def build(env):
    numbers = env.from_collection([1, 2, 3], uid="numbers")
    numbers.key_by(lambda x: x % 2).map(lambda x: x, uid="double").print(uid="out")
"""
    )
    result = weir("info", str(path), "-p", "2", "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    plan = json.loads(result.stdout)
    assert plan["name"] == "job"
    nodes = {n["id"]: n for n in plan["nodes"]}
    assert list(nodes) == ["numbers", "double", "out"]
    assert nodes["numbers"]["type"] == "source" and nodes["numbers"]["predecessors"] == []
    assert nodes["double"]["predecessors"] == [{"id": "numbers", "ship_strategy": "HASH", "side": "first"}]
    assert nodes["out"]["predecessors"] == [{"id": "double", "ship_strategy": "FORWARD", "side": "first"}]
    assert {n["parallelism"] for n in nodes.values()} == {2}
    assert [v["operators"] for v in plan["vertices"]] == [["numbers"], ["double", "out"]]
    text = weir("info", str(path)).stdout
    assert "numbers" in text and "HASH" in text and "double -> out" in text


def test_info_of_a_job_that_does_not_load_is_exit_2(weir: Weir, job_file: JobFile, no_jobmanager: str) -> None:
    result = weir("info", str(job_file("def build(env):\n    raise ValueError('no plan')\n")))
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("weir: error: ") and "no plan" in result.stderr


def test_completion_is_installed_and_completes_commands(tmp_path: Path) -> None:
    import os

    weir_bin = Path(sys.executable).parent / "weir"
    # Typer detects the shell from the process tree (shellingham); under make or CI there may be none
    # to find ("Shell  not supported."), so the shell is named, as Typer's own tests do.
    named_shell = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    shown = subprocess.run(
        [str(weir_bin), "--show-completion", "bash"], capture_output=True, text=True, timeout=30, env=named_shell
    )
    assert shown.returncode == EXIT_OK, shown.stderr
    assert "_WEIR_COMPLETE" in shown.stdout
    env = {**os.environ, "_WEIR_COMPLETE": "complete_bash", "COMP_WORDS": "weir checkp", "COMP_CWORD": "1"}
    completed = subprocess.run([str(weir_bin)], capture_output=True, text=True, timeout=30, env=env)
    assert completed.returncode == EXIT_OK, completed.stderr
    assert sorted(completed.stdout.split()) == ["checkpoint", "checkpoints"]


# Profiles ----------------------------------------------------------------------------------------


def _config(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_a_profile_gives_the_address_and_the_token(
    weir: Weir, fake_jobmanager: FakeJobManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    address = os.environ["WEIR_JOBMANAGER_ADDRESS"]
    monkeypatch.delenv("WEIR_JOBMANAGER_ADDRESS")
    (tmp_path / "token").write_text("s3cret\n", encoding="utf-8")
    config = _config(
        tmp_path,
        f'default_profile = "dev"\n[profiles.dev]\naddress = "{address}"\ntoken_file = "token"\n'
        '[profiles.other]\naddress = "127.0.0.1:1"\n',
    )
    monkeypatch.setenv("WEIR_CONFIG", str(config))
    assert weir("list").exit_code == EXIT_OK  # the default profile, its token file relative to the config file
    assert weir("--profile", "dev", "list").exit_code == EXIT_OK
    assert fake_jobmanager.authorizations == ["Bearer s3cret", "Bearer s3cret"]
    monkeypatch.setenv("WEIR_PROFILE", "other")
    assert weir("list").exit_code == EXIT_NO_CLUSTER  # WEIR_PROFILE picks another
    assert weir("list", "--profile", "dev").exit_code == EXIT_OK  # the flag wins over WEIR_PROFILE
    monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", address)
    assert weir("list").exit_code == EXIT_OK  # the environment wins over the profile


def test_a_token_from_an_environment_variable_the_profile_names(
    weir: Weir, fake_jobmanager: FakeJobManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, '[profiles.p]\ntoken_env = "MY_CLUSTER_TOKEN"\n', mode=0o644)
    monkeypatch.setenv("WEIR_CONFIG", str(config))
    monkeypatch.setenv("MY_CLUSTER_TOKEN", "from-env")
    assert weir("--profile", "p", "list").exit_code == EXIT_OK
    assert fake_jobmanager.authorizations == ["Bearer from-env"]
    monkeypatch.setenv("WEIR_AUTH_TOKEN", "wins")
    assert weir("--profile", "p", "list").exit_code == EXIT_OK
    assert fake_jobmanager.authorizations[-1] == "Bearer wins"
    monkeypatch.delenv("WEIR_AUTH_TOKEN")
    monkeypatch.delenv("MY_CLUSTER_TOKEN")
    assert_error(
        weir("--profile", "p", "list"),
        EXIT_USAGE,
        f"profile 'p' of {config}: token_env names MY_CLUSTER_TOKEN, which is unset",
    )


def test_a_literal_token_needs_a_config_file_only_its_owner_reads(
    weir: Weir, fake_jobmanager: FakeJobManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, '[profiles.p]\ntoken = "literal"\n', mode=0o644)
    monkeypatch.setenv("WEIR_CONFIG", str(config))
    assert_error(
        weir("--profile", "p", "list"),
        EXIT_USAGE,
        f"profile 'p' of {config} holds a token but the file is readable by others (mode 0644): "
        f"chmod 600 {config}, or use token_file or token_env",
    )
    assert fake_jobmanager.authorizations == []
    config.chmod(0o600)
    assert weir("--profile", "p", "list").exit_code == EXIT_OK
    assert fake_jobmanager.authorizations == ["Bearer literal"]


def test_bad_profiles_are_one_line(weir: Weir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, '[profiles.p]\naddress = "127.0.0.1:1"\nadress = "typo"\n')
    monkeypatch.setenv("WEIR_CONFIG", str(config))
    result = weir("--profile", "p", "list")
    assert result.exit_code == EXIT_USAGE
    assert (
        result.stderr.startswith(f"weir: error: config file {config}: profiles.p.adress: ")
        and result.stderr.count("\n") == 1
    )
    _config(tmp_path, '[profiles.p]\naddress = "127.0.0.1:1"\n')
    assert_error(
        weir("--profile", "nope", "list"), EXIT_USAGE, f"config file {config} has no profile 'nope' (it has: p)"
    )
    monkeypatch.setenv("WEIR_CONFIG", str(tmp_path / "missing.toml"))
    assert_error(
        weir("--profile", "p", "list"),
        EXIT_USAGE,
        f"profile 'p': no config file {tmp_path / 'missing.toml'} (WEIR_CONFIG)",
    )
    _config(tmp_path, "[profiles.p\n")
    monkeypatch.setenv("WEIR_CONFIG", str(config))
    result = weir("list")
    assert result.exit_code == EXIT_USAGE and result.stderr.startswith(f"weir: error: config file {config}: ")


# weir package ------------------------------------------------------------------------------------


def test_package_writes_the_artifact_weir_run_would_send(weir: Weir, job_file: JobFile, tmp_path: Path) -> None:
    from weir.api.artifacts import artifact_id, read_manifest

    path = job_file("def build(env):\n    pass\n")
    helper = tmp_path / "helpers.py"
    helper.write_text("X = 1\n", encoding="utf-8")
    out = tmp_path / "job.zip"
    result = weir("package", str(path), "-o", str(out), "--py-files", str(helper), "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    data = out.read_bytes()
    assert json.loads(result.stdout) == {"path": str(out), "artifact_id": artifact_id(data), "entry": "job.py"}
    assert read_manifest(data, str(out)).entry_file == "job/job.py"
    with zipfile.ZipFile(out) as archive:
        assert archive.read("py/helpers.py") == b"X = 1\n"


def test_package_of_a_missing_job_file_is_one_line_exit_2(weir: Weir, tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    result = weir("package", str(missing), "-o", str(tmp_path / "job.zip"))
    assert_error(result, EXIT_USAGE, f"job file {missing} does not exist")
    assert not (tmp_path / "job.zip").exists()


# weir sql: a script refused before anything is submitted (one line with its position, exit 2),
# --explain without submitting, and a script submitted as the job file sql_job_source writes.

SQL_SCRIPT = """SET 'pipeline.name' = 'lower-b';
CREATE TABLE t (a BIGINT, b STRING) WITH ('connector' = 'kafka', 'topic' = 't', 'format' = 'json');
CREATE TABLE s (a BIGINT, b STRING) WITH ('connector' = 'kafka', 'topic' = 's', 'format' = 'json');
INSERT INTO s SELECT a, LOWER(b) FROM t WHERE a > 0;
"""


def test_a_refused_construct_is_one_line_with_its_position_and_nothing_is_submitted(
    weir: Weir, fake_jobmanager: FakeJobManager
) -> None:
    result = weir("sql", "-e", SQL_SCRIPT + "INSERT INTO s SELECT a, b FROM t ORDER BY a;")
    assert_error(result, EXIT_USAGE, "SQL 5:43: ORDER BY is not supported")
    assert fake_jobmanager.submitted == []


def test_a_file_or_e_one_of_them(weir: Weir, tmp_path: Path, no_jobmanager: str) -> None:
    assert_error(weir("sql"), EXIT_USAGE, 'give a SQL file or -e "SQL", one of them')
    missing = tmp_path / "nope.sql"
    assert_error(weir("sql", str(missing)), EXIT_USAGE, f"SQL file {missing} does not exist")


def test_explain_prints_the_uids_and_submits_nothing(weir: Weir, fake_jobmanager: FakeJobManager) -> None:
    result = weir("sql", "--explain", "-e", SQL_SCRIPT)
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip() == explain(SQL_SCRIPT)
    uids = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert uids[0] == "sql-source-t" and [u.rsplit("-", 1)[1] for u in uids[1:]] == ["filter", "project", "sink"]
    assert fake_jobmanager.submitted == []


def test_the_script_is_submitted_as_a_job_named_by_pipeline_name(
    weir: Weir, fake_jobmanager: FakeJobManager, tmp_path: Path
) -> None:
    path = tmp_path / "orders.sql"
    path.write_text(SQL_SCRIPT)
    result = weir("sql", str(path), "-d", "-p", "2", "-D", "checkpointing.interval=1s")
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip() == "job-1"
    (request,) = fake_jobmanager.submitted
    assert request.job_name == "lower_b" and request.parallelism == 2
    assert dict(request.parameters) == {"checkpointing.interval": "1s"}
    assert request.job_source.decode() == sql_job_source(SQL_SCRIPT)
    graph = load_job_source(request.job_source, request.job_file_name, {}, 2).graph
    (statement,) = plan_script(SQL_SCRIPT).inserts
    kinds = ("filter", "project", "sink")
    assert sorted(graph.transformations) == sorted(
        ["sql-source-t"] + [f"{statement.uid_prefix}-{n}-{kind}" for n, kind in enumerate(kinds)]
    )


FUNCTIONS_FILE = '''
def shout(s):
    return None if s is None else s.upper() + "!"


class Longest:
    def create(self):
        return None

    def add(self, acc, s):
        return s if acc is None or (s is not None and len(s) > len(acc)) else acc

    def merge(self, a, b):
        return self.add(a, b)

    def result(self, acc):
        return acc


def _private(s):
    return s
'''

FUNCTIONS_SCRIPT = SQL_SCRIPT.replace("LOWER(b)", "SHOUT(b)") + (
    "CREATE TABLE longest (a BIGINT, b STRING, PRIMARY KEY (a) NOT ENFORCED) WITH ('connector' = 'upsert-kafka', "
    "'topic' = 'l', 'key.format' = 'json', 'value.format' = 'json');\n"
    "INSERT INTO longest SELECT a, longest(b) FROM t GROUP BY a;\n"
)


def test_functions_file_explained_and_shipped_with_the_job(
    weir: Weir, fake_jobmanager: FakeJobManager, tmp_path: Path
) -> None:
    from weir.api.artifacts import read_manifest

    functions = tmp_path / "sqlfns.py"
    functions.write_text(FUNCTIONS_FILE, encoding="utf-8")
    private = FUNCTIONS_SCRIPT.replace("SHOUT(b)", "_private(b)")
    refused = weir("sql", "--explain", "-e", private, "--functions", str(functions))
    assert_error(refused, EXIT_USAGE, "SQL 4:25: function _PRIVATE is not supported")
    unregistered = weir("sql", "--explain", "-e", FUNCTIONS_SCRIPT)
    assert_error(unregistered, EXIT_USAGE, "SQL 4:25: function SHOUT is not supported")
    explained = weir("sql", "--explain", "-e", FUNCTIONS_SCRIPT, "--functions", str(functions))
    assert explained.exit_code == EXIT_OK, explained.stderr
    assert "SHOUT(b) AS b" in explained.stdout and "LONGEST(b) AS b" in explained.stdout
    result = weir("sql", "-e", FUNCTIONS_SCRIPT, "-d", "--functions", str(functions))
    assert result.exit_code == EXIT_OK, result.stderr
    (request,) = fake_jobmanager.submitted
    data = request.job_artifact
    manifest = read_manifest(data, "submitted")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.read("py/sqlfns.py").decode() == FUNCTIONS_FILE
        assert archive.read(manifest.entry_file).decode() == sql_job_source(FUNCTIONS_SCRIPT, "sqlfns")
