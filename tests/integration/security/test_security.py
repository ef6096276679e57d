"""A private cluster with TLS, client certificates and a bearer token on (certificates made here): a
keyed job across its 3 TaskManagers, strangers refused on gRPC and REST, a TaskManager holding a
certificate of another CA cannot join; and processes that refuse a non-loopback bind without a token."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from tests.certificates import CertificateAuthority, Issued, tls_environment
from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, assert_sinks_exact, keyed_aggregation_inputs, path_parameters
from tests.integration.ports import private_ports
from weir.core.config import Endpoints
from weir.core.grpc_security import open_channel
from weir.core.transport_security import TransportSecurity
from weir.tools.client import JobManagerClient
from weir.tools.supervisor import start_cluster, stop_cluster
from weir.wire import jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2, taskmanager_pb2_grpc

pytestmark = pytest.mark.integration

TOKEN = f"test-token-{uuid.uuid4().hex}"
EVENTS = 20_000


@dataclass(frozen=True)
class SecureCluster:
    endpoints: Endpoints
    directory: Path
    ca: CertificateAuthority
    node: Issued
    certificates: Path

    def security(self, **overrides: str | None) -> TransportSecurity:
        """The cluster's own security (its token, its certificate, its CA), some variables changed."""
        env = {**tls_environment(self.ca, self.node, client_ca=self.ca), "WEIR_AUTH_TOKEN": TOKEN}
        for name, value in overrides.items():
            env.pop(name, None) if value is None else env.__setitem__(name, value)
        return TransportSecurity.from_env(env)


@pytest.fixture(scope="module")
def secure_cluster(services: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("secure")
    certificates = root / "certificates"
    ca = CertificateAuthority.create(certificates, "weir-ca")
    node = ca.issue(certificates, "weir-node")
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            **private_ports(services),  # beside the session's cluster
            **tls_environment(ca, node, client_ca=ca),
            "WEIR_AUTH_TOKEN": TOKEN,
            "WEIR_RUN_DIR": str(root / "run"),
            "WEIR_CHECKPOINT_DIR": f"s3://{services.s3_bucket}/secure-{root.name}",
        }.items():
            env.setenv(name, value)
        endpoints = Endpoints.from_env()
        directory = root / "run" / "cluster"
        start_cluster(directory, endpoints, restart=False, timeout_s=90)  # its readiness check runs secured
        try:
            yield SecureCluster(endpoints, directory, ca, node, certificates)
        finally:
            stop_cluster(directory)


def test_a_keyed_job_runs_across_three_taskmanagers_with_tls_and_token(secure_cluster: SecureCluster) -> None:
    endpoints = secure_cluster.endpoints
    parameters = keyed_aggregation_inputs(
        endpoints, uuid.uuid4().hex[:8], EVENTS, records_per_second=0, checkpoint_interval="2s"
    ) | path_parameters("records")
    with JobManagerClient(endpoints.jobmanager_address) as client:  # security from the environment
        assert len(client.cluster_status().alive_taskmanagers) == 3
        job_id = client.submit_job(REPO_ROOT / "examples/keyed_aggregation.py", parameters, 3)
        status = polling.settle(
            300, lambda: client.job_status(job_id), lambda s: s.summary.status in ("FINISHED", "FAILED")
        )
        assert status.summary.status == "FINISHED", status
        taskmanagers = {t.taskmanager_id for t in status.tasks}
    assert len(taskmanagers) == 3, f"the job ran on {taskmanagers} only: the data plane between them went untested"
    assert_sinks_exact("examples/keyed_aggregation.py", parameters, job_id, endpoints)  # both sinks, whole records


def test_grpc_calls_without_the_token_or_with_a_wrong_one_are_unauthenticated(secure_cluster: SecureCluster) -> None:
    address = secure_cluster.endpoints.jobmanager_address
    with JobManagerClient(address, security=secure_cluster.security()) as client:
        taskmanager = client.cluster_status().alive_taskmanagers[0].address
    for security in (secure_cluster.security(WEIR_AUTH_TOKEN=None), secure_cluster.security(WEIR_AUTH_TOKEN="wrong")):
        with open_channel(address, security) as channel:
            jobmanager = jobmanager_pb2_grpc.JobManagerServiceStub(channel)
            list_jobs = jobmanager.ListJobs
            assert _code(lambda: list_jobs(jobmanager_pb2.ListJobsRequest(), timeout=10)) is (  # noqa: B023
                grpc.StatusCode.UNAUTHENTICATED
            )
        with open_channel(taskmanager, security) as channel:
            stub = taskmanager_pb2_grpc.TaskManagerServiceStub(channel)
            request = taskmanager_pb2.CancelJobTasksRequest(job_id="none", attempt=0, job_ended=False)
            assert _code(lambda: stub.CancelJobTasks(request, timeout=10)) is grpc.StatusCode.UNAUTHENTICATED  # noqa: B023


def test_rest_calls_without_the_token_or_with_a_wrong_one_answer_401(secure_cluster: SecureCluster) -> None:
    node = secure_cluster.node
    base = f"https://127.0.0.1:{secure_cluster.endpoints.jobmanager_rest_port}"
    trusting = ssl.create_default_context(cafile=secure_cluster.ca.certificate_file)
    member = ssl.create_default_context(cafile=secure_cluster.ca.certificate_file)
    member.load_cert_chain(node.certificate, node.key)
    with httpx.Client(base_url=base, timeout=10.0, verify=member) as http:
        assert http.get("/jobs").status_code == 401
        assert http.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert http.get("/healthz").status_code == 200
    with httpx.Client(base_url=base, timeout=10.0, verify=trusting) as http:
        with pytest.raises(httpx.TransportError):  # no client certificate: the handshake fails
            http.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"})


def test_a_taskmanager_with_a_certificate_of_another_ca_cannot_join(
    secure_cluster: SecureCluster, tmp_path: Path
) -> None:
    other = CertificateAuthority.create(tmp_path, "other-ca")
    stranger = other.issue(tmp_path, "stranger")
    env = {
        **os.environ,
        **tls_environment(secure_cluster.ca, stranger, client_ca=other),
        "WEIR_AUTH_TOKEN": TOKEN,  # even with the token
        "WEIR_RUN_DIR": str(tmp_path / "run"),
        "PYTHONPATH": str(REPO_ROOT),
        "WEIR_LOG_FORMAT": "json",
    }
    log = tmp_path / "intruder.log"
    with log.open("w") as output:
        intruder = subprocess.Popen(
            [sys.executable, "-m", "weir.taskmanager", "--id", "intruder", "--metrics-port", "0"],
            cwd=REPO_ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        refusal = polling.until("the intruder's registration refused", 60, lambda: _registration_failures(log))
        assert refusal[0]["code"] == "UNAVAILABLE", refusal
        with JobManagerClient(secure_cluster.endpoints.jobmanager_address) as client:
            assert "intruder" not in {tm.taskmanager_id for tm in client.cluster_status().taskmanagers}
    finally:
        intruder.terminate()
        intruder.wait(30)


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "weir.jobmanager", "--bind", "0.0.0.0", "--port", "26599", "--rest-port", "0", "--metrics-port", "0"],
        ["-m", "weir.taskmanager", "--bind", "0.0.0.0", "--port", "26598"],
    ],
    ids=["jobmanager", "taskmanager"],
)
def test_a_process_binding_a_non_loopback_address_without_a_token_refuses_to_start(
    argv: list[str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_AUTH_", "WEIR_TLS_"))}
    env |= {"PYTHONPATH": str(REPO_ROOT), "WEIR_RUN_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "0.0.0.0:" in lines[0] and "WEIR_AUTH_TOKEN" in lines[0], lines[0]


def _registration_failures(log: Path) -> list[dict[str, str]]:
    events = []
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "jobmanager_registration_failed":
            events.append(event)
    return events


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    assert isinstance(failed.value, grpc.Call)
    return failed.value.code()
