"""A private cluster with the credentials of ``python -m weir.tools.dev_credentials`` and the variables
compose and Kubernetes set (the token file, one certificate for every process, the fixed server name
``weir-cluster``): a small keyed job finishes across its TaskManagers, the HTTPS healthcheck of compose
passes, and a client without the token is refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.integration import polling
from tests.integration.conftest import (
    REPO_ROOT,
    assert_sinks_exact,
    create_topics,
    create_window_table,
    path_parameters,
)
from tests.integration.ports import private_ports
from weir.core.config import Endpoints
from weir.core.errors import AuthenticationError
from weir.core.transport_security import TransportSecurity
from weir.tools.client import JobManagerClient
from weir.tools.dev_credentials import CLUSTER_NAME, DevCredentials, generate
from weir.tools.events import EventSpec, produce_events
from weir.tools.probe import probe
from weir.tools.supervisor import start_cluster, stop_cluster

pytestmark = pytest.mark.integration

EVENTS = 4_000


@pytest.fixture(scope="module")
def dev_cluster(
    services: Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Endpoints, DevCredentials]]:
    root = tmp_path_factory.mktemp("dev-credentials")
    credentials = generate(root / "credentials").credentials
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            **private_ports(services),  # beside the session's cluster
            **credentials.environment(),
            "WEIR_RUN_DIR": str(root / "run"),
            "WEIR_CHECKPOINT_DIR": f"s3://{services.s3_bucket}/dev-credentials-{root.name}",
        }.items():
            env.setenv(name, value)
        endpoints = Endpoints.from_env()
        directory = root / "run" / "cluster"
        start_cluster(directory, endpoints, restart=False, timeout_s=90)
        try:
            yield endpoints, credentials
        finally:
            stop_cluster(directory)


def test_a_job_runs_with_the_generated_credentials(dev_cluster: tuple[Endpoints, DevCredentials]) -> None:
    endpoints, credentials = dev_cluster
    assert TransportSecurity.from_env().client_tls.server_name == CLUSTER_NAME  # type: ignore[union-attr]
    unique = uuid.uuid4().hex[:8]
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 3, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    spec = EventSpec(count=EVENTS, keys=50)
    produce_events(endpoints, source, spec)
    parameters = {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "source.bounded": "true",
        "checkpointing.interval": "2s",
        **path_parameters("records"),
    }
    with JobManagerClient(endpoints.jobmanager_address) as client:  # the generated files, from the environment
        assert len(client.cluster_status().alive_taskmanagers) == 3
        job_id = client.submit_job(REPO_ROOT / "examples/keyed_aggregation.py", parameters, 3)
        status = polling.settle(
            300, lambda: client.job_status(job_id), lambda s: s.summary.status in ("FINISHED", "FAILED")
        )
        assert status.summary.status == "FINISHED", status
    assert_sinks_exact("examples/keyed_aggregation.py", parameters, job_id, endpoints)  # both sinks, whole records


def test_composes_https_healthcheck_passes(dev_cluster: tuple[Endpoints, DevCredentials]) -> None:
    endpoints, credentials = dev_cluster
    url = f"https://127.0.0.1:{endpoints.jobmanager_rest_port}/healthz"
    assert probe(url, environ=credentials.environment()) is None
    assert probe(url, timeout_s=2, environ={}) is not None, "the development CA is no system CA"


def test_a_client_without_the_token_is_refused(dev_cluster: tuple[Endpoints, DevCredentials]) -> None:
    endpoints, credentials = dev_cluster
    env = {k: v for k, v in credentials.environment().items() if k != "WEIR_AUTH_TOKEN_FILE"}
    with (
        JobManagerClient(endpoints.jobmanager_address, security=TransportSecurity.from_env(env)) as client,
        pytest.raises(AuthenticationError),
    ):
        client.cluster_status()
