"""Least privilege on a real cluster (3 TaskManagers, checkpoints on the S3 server): tokens given per
client with roles (docs/security.md, "Roles"), the cluster's own internal token, and checkpoint objects
sealed with the cluster's storage MAC key.

- A read token lists and reads but cannot submit, cancel or savepoint (gRPC and REST); an operate
  token cancels but cannot submit; no client token, even a submit one, can register as a TaskManager
  or open a data channel; the internal token is no client's.
- A savepoint whose objects were changed on the S3 server is refused when a job is restored from it,
  with one line naming the object, and nothing in it is unpickled: its task states carry a pickle that
  would create a marker directory if it were ever loaded, in the JobManager or in a TaskManager.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, keyed_aggregation_inputs
from tests.integration.ports import private_ports
from weir.connectors.object_storage import S3CheckpointStorage, SealedStorage, open_storage
from weir.core.config import Endpoints
from weir.core.errors import Fault, PermissionDeniedError, StorageAuthenticationError, WeirError
from weir.core.grpc_security import open_channel
from weir.core.paths import locate_state
from weir.core.states import JobStatus
from weir.core.storage_mac import TRAILER_SIZE
from weir.core.transport_security import TransportSecurity
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.supervisor import start_cluster, stop_cluster
from weir.wire import jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2, taskmanager_pb2_grpc

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex
READ, OPERATE, SUBMIT, INTERNAL = (f"{role}-{RUN}" for role in ("read", "operate", "submit", "internal"))
MAC_KEY = f"storage-key-{RUN}"
JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
EVENTS = 30_000


@dataclass(frozen=True)
class RolesCluster:
    endpoints: Endpoints
    directory: Path

    def client(self, token: str) -> JobManagerClient:
        return JobManagerClient(self.endpoints.jobmanager_address, security=TransportSecurity(token=token))


@pytest.fixture(scope="module")
def roles_cluster(services: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolesCluster]:
    root = tmp_path_factory.mktemp("roles")
    tokens = root / "tokens"
    tokens.write_text(f"# one token per client\nread {READ}\noperate {OPERATE}\nsubmit {SUBMIT}\n")
    with pytest.MonkeyPatch.context() as env:
        for name, value in private_ports(services).items():  # beside the session's cluster
            env.setenv(name, value)
        for name, value in {
            "WEIR_AUTH_TOKENS_FILE": str(tokens),
            "WEIR_INTERNAL_TOKEN": INTERNAL,
            "WEIR_AUTH_TOKEN": READ,  # what the supervisor's readiness check sends: read is enough
            "WEIR_STORAGE_MAC_KEY": MAC_KEY,
            "WEIR_RUN_DIR": str(root / "run"),
            "WEIR_CHECKPOINT_DIR": f"s3://{services.s3_bucket}/leastpriv-{RUN[:8]}",
        }.items():
            env.setenv(name, value)
        endpoints = Endpoints.from_env()
        directory = root / "run" / "cluster"
        start_cluster(directory, endpoints, restart=False, timeout_s=90)
        try:
            yield RolesCluster(endpoints, directory)
        finally:
            stop_cluster(directory)


def test_a_read_token_cannot_submit_or_cancel_and_an_operate_token_cancels_but_cannot_submit(
    roles_cluster: RolesCluster,
) -> None:
    parameters = keyed_aggregation_inputs(
        roles_cluster.endpoints, uuid.uuid4().hex[:8], EVENTS, records_per_second=200, checkpoint_interval="1s"
    )
    with roles_cluster.client(SUBMIT) as submitter:
        job_id = submitter.submit_job(JOB, parameters, 2)
    with roles_cluster.client(READ) as reader:
        assert job_id in {j.job_id for j in reader.list_jobs()}
        polling.until("the job running", 120, lambda: reader.job_status(job_id).summary.status is JobStatus.RUNNING)
        assert len(reader.cluster_status().alive_taskmanagers) == 3
        with pytest.raises(PermissionDeniedError, match="SubmitJob needs the role 'submit'"):
            reader.submit_job(JOB, parameters, 2)
        with pytest.raises(PermissionDeniedError, match="CancelJob needs the role 'operate'"):
            reader.cancel_job(job_id)
        with pytest.raises(PermissionDeniedError, match="TriggerSavepoint needs the role 'operate'"):
            reader.trigger_savepoint(job_id, stop=True)
        assert reader.job_status(job_id).summary.status is JobStatus.RUNNING  # nothing the reader asked ran

    rest = f"http://127.0.0.1:{roles_cluster.endpoints.jobmanager_rest_port}"
    with httpx.Client(base_url=rest, timeout=10.0) as http:
        assert http.get("/jobs", headers=_bearer(READ)).status_code == 200
        refused = http.patch(f"/jobs/{job_id}", headers=_bearer(READ))
        assert refused.status_code == 403
        (message,) = refused.json()["errors"]
        assert "needs the role 'operate'" in message and READ not in message
        assert http.post(f"/jobs/{job_id}/stop", headers=_bearer(READ), json={}).status_code == 403
        assert http.get("/jobs", headers=_bearer(INTERNAL)).status_code == 403  # the cluster's token is no client's
        assert http.get("/jobs", headers=_bearer("stranger")).status_code == 401
    endpoints = roles_cluster.endpoints
    for port in (endpoints.jobmanager_metrics_port, endpoints.taskmanager_metrics_base_port + 1):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:  # loopback: open
            assert "weir_" in http.get("/metrics").text
            assert http.get("/healthz").text == "ok\n"

    with roles_cluster.client(OPERATE) as operator:
        with pytest.raises(PermissionDeniedError, match="'submit'"):
            operator.submit_job(JOB, parameters, 2)
        operator.cancel_job(job_id)
        status = polling.settle(120, lambda: operator.job_status(job_id), lambda s: s.summary.status.terminal)
        assert status.summary.status is JobStatus.CANCELED


def test_no_client_token_registers_as_a_taskmanager_or_opens_a_data_channel(roles_cluster: RolesCluster) -> None:
    address = roles_cluster.endpoints.jobmanager_address
    with roles_cluster.client(READ) as reader:
        taskmanager = reader.cluster_status().alive_taskmanagers[0].address
    for token in (READ, OPERATE, SUBMIT):
        with open_channel(address, TransportSecurity(token=token)) as channel:
            register = jobmanager_pb2_grpc.JobManagerServiceStub(channel).RegisterTaskManager
            request = jobmanager_pb2.RegisterTaskManagerRequest(taskmanager_id="impostor", address="127.0.0.1:1")
            assert _code(lambda: register(request, timeout=10)) is grpc.StatusCode.PERMISSION_DENIED  # noqa: B023
        with open_channel(taskmanager, TransportSecurity(token=token)) as channel:
            stub = taskmanager_pb2_grpc.TaskManagerServiceStub(channel)
            cancel = taskmanager_pb2.CancelJobTasksRequest(job_id="none", attempt=0, job_ended=False)
            assert _code(lambda: stub.CancelJobTasks(cancel, timeout=10)) is grpc.StatusCode.PERMISSION_DENIED  # noqa: B023
            data = stub.OpenChannel(iter([taskmanager_pb2.DataMessage()]), timeout=10)
            assert _code(lambda: list(data)) is grpc.StatusCode.PERMISSION_DENIED  # noqa: B023
    with open_channel(address, TransportSecurity(token=INTERNAL)) as channel:
        list_jobs = jobmanager_pb2_grpc.JobManagerServiceStub(channel).ListJobs
        assert _code(lambda: list_jobs(jobmanager_pb2.ListJobsRequest(), timeout=10)) is (
            grpc.StatusCode.PERMISSION_DENIED
        )


def test_a_tampered_savepoint_fails_the_restore_with_one_line_and_unpickles_nothing(
    roles_cluster: RolesCluster, tmp_path: Path
) -> None:
    parameters = keyed_aggregation_inputs(
        roles_cluster.endpoints, uuid.uuid4().hex[:8], EVENTS, records_per_second=2000, checkpoint_interval="1s"
    )
    with roles_cluster.client(SUBMIT) as client:
        old = client.submit_job(JOB, parameters, 2)
        polling.until("a quarter of the input read", 120, lambda: _events_read(client.job_status(old)) > EVENTS // 4)
        savepoint = client.wait_for_savepoint(old, client.trigger_savepoint(old, stop=True), timeout_s=120.0)
        polling.until("the stopped job to end", 120, lambda: client.job_status(old).summary.status.terminal)
        location = locate_state(savepoint.external_path)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("WEIR_STORAGE_MAC_KEY", MAC_KEY)
            sealed = open_storage(location.root_uri)
        assert isinstance(sealed, SealedStorage) and isinstance(sealed.inner, S3CheckpointStorage)
        raw = sealed.inner  # the S3 server's bytes as they are, trailers and all
        metadata_key = location.metadata_key
        original = raw.get_bytes(metadata_key)

        # 1. Every task's operator states replaced by a pickle that would run code, the MAC left as it was.
        marker = tmp_path / "unpickled"
        evil = pickle.dumps(_MakesMarker(str(marker)))
        tampered = _with_inline_states(sealed.get_bytes(metadata_key), evil)
        raw.put_bytes(metadata_key, tampered + original[-TRAILER_SIZE:])
        with pytest.raises(WeirError) as refused:
            client.submit_job(JOB, parameters, 2, from_checkpoint=savepoint.external_path)
        message = str(refused.value)
        assert f"{metadata_key} failed authentication" in message and "was not decoded" in message, message
        assert "\n" not in message
        assert not marker.exists(), "a pickle of the tampered savepoint was loaded"

        # 2. The metadata as it was, one byte of one of its RocksDB files flipped: the TaskManager refuses it.
        raw.put_bytes(metadata_key, original)
        sst = next(key for key, _size in raw.list("") if key.endswith(".sst"))
        flipped = bytearray(raw.get_bytes(sst))
        flipped[len(flipped) // 2] ^= 0x01
        raw.put_bytes(sst, bytes(flipped))
        new = client.submit_job(JOB, parameters, 2, from_checkpoint=savepoint.external_path)
        failed = polling.settle(180, lambda: client.job_status(new), lambda s: s.summary.status.terminal)
        assert failed.summary.status is JobStatus.FAILED
        assert failed.failure is not None
        assert failed.failure.type == StorageAuthenticationError.__name__, failed.failure
        assert not failed.failure.retriable and failed.failure.fault is Fault.EXTERNAL
        assert f"{sst} failed authentication" in failed.failure.message and "\n" not in failed.failure.message
        assert failed.summary.restarts == 0  # not retriable: failed at once
        assert not marker.exists()


class _MakesMarker:
    """Loaded, this pickle creates a directory: the proof that a refused object was never unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.path,))


def _with_inline_states(metadata: bytes, payload: bytes) -> bytes:
    """The metadata document with every inline operator state and sink pre-commit of every task
    replaced by ``payload`` (docs/formats.md: both are read back and decoded by an operator)."""
    document = json.loads(metadata)
    encoded = base64.b64encode(payload).decode("ascii")
    replaced = 0
    for task in document["tasks"]:
        handle = json.loads(base64.b64decode(task["state_handle"]))
        states = handle["operator_state"].get("inline", {})
        for uid in states:
            states[uid] = encoded
            replaced += 1
        task["state_handle"] = base64.b64encode(json.dumps(handle).encode()).decode("ascii")
        if task.get("sink_precommit"):
            task["sink_precommit"] = encoded
    assert replaced, "no inline operator state in the savepoint's metadata: the test would prove nothing"
    return json.dumps(document).encode()


def _events_read(status: JobDetails) -> int:
    return sum(t.records_in_all_attempts for t in status.tasks if t.vertex_uid != "events-source")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    error = failed.value
    assert isinstance(error, grpc.Call)
    return error.code()
