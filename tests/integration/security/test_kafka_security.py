"""A job on a Kafka that takes secured clients only (the session's second broker:
``tests/integration/secured_kafka.py``), on each of its listeners: SASL_SSL with SCRAM-SHA-512, and
SSL with a client certificate (mutual TLS, the client key encrypted). The job is configured with
``-D kafka.*`` parameters alone, its secret (the SCRAM password, the key's password) by
``${file:...}`` reference: the JobManager's checks at submit, the source, both sinks, the Kafka sink's
marker topic, the recovery after a TaskManager is killed and ``weir verify`` all reach it with those
settings; the secret shows in no log file, job record, status or REST answer; a wrong password, a
missing client certificate or a literal secret is one line at submit and starts nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.certificates import CertificateAuthority
from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import REPO_ROOT, WeirCluster, assert_sinks_exact, create_window_table
from tests.integration.secured_kafka import LISTENERS, Listener, SecuredKafka
from weir.connectors import kafka
from weir.connectors.object_storage import open_storage
from weir.core.config import checkpoint_dir
from weir.core.errors import JobDefinitionError, ServiceUnavailableError
from weir.core.ids import JobId
from weir.core.kafka_config import KafkaClientConfig
from weir.core.paths import CheckpointPaths
from weir.operators.transactional_sinks import marker_topic_name
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import kill_process, local_status

pytestmark = pytest.mark.integration

JOB = "examples/keyed_aggregation.py"
EVENTS = 40_000


def job_parameters(secured: SecuredKafka, unique: str, listener: Listener = "scram") -> dict[str, str]:
    return {
        "source.topic": f"events-{unique}",
        "sink.topic": f"results-{unique}",
        "sink.table": f"window_results_{unique}",
        "source.dlq_topic": f"dlq-{unique}",
        "source.bounded": "true",
        "source.records_per_second": "3000",
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        **secured.parameters(listener=listener),
    }


def prepare_inputs(weir_cluster: WeirCluster, secured: SecuredKafka, unique: str, listener: Listener = "scram") -> None:
    """The topics on the secured broker (none on the plaintext one), the table, the input events."""
    config = secured.client_config(listener)
    kafka.create_topics(config, {f"events-{unique}": 6, f"results-{unique}": 3, f"dlq-{unique}": 1})
    create_window_table(weir_cluster.endpoints, f"window_results_{unique}")
    produce_events(config, f"events-{unique}", EventSpec(count=EVENTS, keys=400))


def taskmanager_running(weir_cluster: WeirCluster, name: str) -> bool:
    status = local_status(weir_cluster.directory)
    return status is not None and any(p.name == name and p.alive for p in status.processes)


def files_holding(root: Path, secret: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def assert_logs_hold_the_reference_alone(cluster_directory: Path, job_id: str, secret_file: Path) -> None:
    """Every log file the cluster's processes wrote, read whole: the JobManager's and the
    TaskManagers' logs tell of the job and show its Kafka settings with the secret as its reference
    (so the check below reads the logs that would have held it), and no file holds the secret."""
    logs = sorted(cluster_directory.glob("*.log"))
    names = {p.name for p in logs}
    assert {"jobmanager.log", "taskmanager-1.log", "taskmanager-2.log", "taskmanager-3.log"} <= names, names
    texts = {p.name: p.read_bytes() for p in logs}
    assert job_id.encode() in texts["jobmanager.log"]
    reference = f"${{file:{secret_file}}}".encode()
    assert [n for n, text in texts.items() if job_id.encode() in text and reference in text], (
        "no log shows the job's Kafka settings with the reference"
    )
    secret = secret_file.read_text().strip().encode()
    assert [n for n, text in texts.items() if secret in text] == []


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_job_on_a_secured_kafka_runs_exactly_once_through_a_taskmanager_kill(
    weir_cluster: WeirCluster,
    secured_kafka: SecuredKafka,
    unique: str,
    listener: Listener,
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoints, secured = weir_cluster.endpoints, secured_kafka.client_config(listener)
    prepare_inputs(weir_cluster, secured_kafka, unique, listener)
    params = job_parameters(secured_kafka, unique, listener)
    job_id = weir_cluster.submit(JOB, params)

    # The TaskManager of a Kafka sink subtask killed once the job has completed checkpoints: the job
    # recovers from one of them, the sink's recovery reading its marker topic on the secured broker.
    status = wait_until(
        weir_cluster,
        job_id,
        lambda s: s.summary.status == "RUNNING" and (s.last_completed_checkpoint or 0) >= 2,
        "two completed checkpoints",
        180,
    )
    killed_at = status.last_completed_checkpoint or 0
    victim = next(str(t.taskmanager_id) for t in status.tasks if "kafka-sink" in t.operator_names)
    assert taskmanager_running(weir_cluster, victim)
    kill_process(weir_cluster.directory, victim)
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status in ("RUNNING", "FINISHED")
            and s.last_restore_at is not None
            and (s.last_completed_checkpoint or 0) >= killed_at
        ),
        f"the recovery after killing {victim}",
        180,
    )
    final = weir_cluster.wait_for(job_id, timeout_s=300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None, "the job never restored: the kill came after it finished"

    # Exactly once on the secured broker (Kafka read_committed and PostgreSQL, whole records as
    # multisets, commit proofs from the sink's marker topic), verified with the job's parameters.
    report = assert_sinks_exact(JOB, params, job_id, endpoints)
    assert {s.kind for s in report.sinks} == {"kafka", "postgres"}
    assert sum(s.records for s in report.sources) == EVENTS
    args = ["verify", str(REPO_ROOT / JOB), "--job-id", job_id]
    for key, value in params.items():
        args += ["-D", f"{key}={value}"]
    assert run_cli(args) == EXIT_OK, capsys.readouterr().err

    # Everything went to the secured broker: the sink's marker topic is there, the plaintext broker
    # never saw a topic of the job.
    assert marker_topic_name(job_id, "kafka-sink") in kafka.list_topic_names(secured, "weir-sink-commits.")
    for topic in (f"events-{unique}", f"results-{unique}", marker_topic_name(job_id, "kafka-sink")):
        assert kafka.topic_partition_count(endpoints, topic) is None, topic

    # The secret (the SCRAM password, the client key's password) shows nowhere: not in the job record
    # (which keeps the reference), any file of the run directory (the cluster's logs read whole among
    # them), the status or the REST API.
    secret_file = secured_kafka.secret_file(listener)
    password = secret_file.read_text().strip().encode()
    record = open_storage(checkpoint_dir()).get_bytes(CheckpointPaths().job_record(JobId(job_id)))
    assert password not in record
    assert f"${{file:{secret_file}}}".encode() in record
    assert_logs_hold_the_reference_alone(weir_cluster.directory, job_id, secret_file)
    assert files_holding(Path(os.environ["WEIR_RUN_DIR"]), password) == []
    assert password.decode() not in repr(weir_cluster.client.job_status(job_id))
    rest = f"http://127.0.0.1:{endpoints.jobmanager_rest_port}"
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/exceptions", f"/jobs/{job_id}/plan", "/jobs"):
        answer = httpx.get(rest + path, timeout=10.0)
        assert answer.status_code == 200 and password not in answer.content, path


def weir_run(params: dict[str, str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = ["run", str(REPO_ROOT / JOB), "-p", "2", "--detach"]
    for key, value in params.items():
        args += ["-D", f"{key}={value}"]
    code = run_cli(args)
    return code, capsys.readouterr().err


def test_a_wrong_password_is_one_line_at_submit_naming_the_brokers_error_and_nothing_starts(
    weir_cluster: WeirCluster, secured_kafka: SecuredKafka, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_inputs(weir_cluster, secured_kafka, unique)
    wrong = secured_kafka.directory / f"wrong-password-{unique}"
    wrong.write_text("not-the-password\n")
    params = {**job_parameters(secured_kafka, unique), "kafka.sasl.password": f"${{file:{wrong}}}"}
    before = {j.job_id for j in weir_cluster.client.list_jobs()}
    started = time.monotonic()
    code, err = weir_run(params, capsys)
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"weir: error: kafka source 'events-source': kafka at {secured_kafka.bootstrap} refused the client's login: "
    ), lines[0]
    assert "SASL authentication error" in lines[0] and "SCRAM-SHA-512" in lines[0], lines[0]
    assert f"sasl.password=${{file:{wrong}}}" in lines[0]  # the settings as given: the reference
    assert time.monotonic() - started < 30, "the refusal waited for a timeout instead of the broker's answer"
    assert {j.job_id for j in weir_cluster.client.list_jobs()} == before  # nothing started
    assert not [t for t in kafka.list_topic_names(secured_kafka.client_config(), "weir-sink-commits.") if unique in t]


def test_a_missing_client_certificate_is_one_line_at_submit_naming_the_tls_handshake_and_nothing_starts(
    weir_cluster: WeirCluster, secured_kafka: SecuredKafka, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_inputs(weir_cluster, secured_kafka, unique, "mtls")
    without = {
        k: v
        for k, v in job_parameters(secured_kafka, unique, "mtls").items()
        if k not in ("kafka.ssl.certificate.location", "kafka.ssl.key.location", "kafka.ssl.key.password")
    }
    before = {j.job_id for j in weir_cluster.client.list_jobs()}
    code, err = weir_run(without, capsys)
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # Under TLS 1.3 the broker refuses the client's (missing) certificate after the handshake, with
    # an alert librdkafka reports as a transport error: no answer within the request's time, and the
    # line says what the client saw.
    assert lines[0].startswith(
        f"weir: error: kafka: no metadata for topic 'events-{unique}' from {secured_kafka.mtls_bootstrap} within "
    ), lines[0]
    assert "(the client's last error: ssl://" in lines[0], lines[0]
    assert "alert bad certificate" in lines[0] or "alert certificate required" in lines[0], lines[0]
    assert {j.job_id for j in weir_cluster.client.list_jobs()} == before  # nothing started


def test_a_ca_that_did_not_sign_the_brokers_certificate_is_one_line_at_submit_naming_the_handshake(
    weir_cluster: WeirCluster,
    secured_kafka: SecuredKafka,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prepare_inputs(weir_cluster, secured_kafka, unique)
    other = CertificateAuthority.create(tmp_path, "another-ca")
    params = {**job_parameters(secured_kafka, unique), "kafka.ssl.ca.location": str(other.certificate_file)}
    before = {j.job_id for j in weir_cluster.client.list_jobs()}
    code, err = weir_run(params, capsys)
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"weir: error: kafka source 'events-source': kafka at {secured_kafka.bootstrap} failed the TLS handshake: "
    ), lines[0]
    assert "certificate verify failed" in lines[0] and f"ssl.ca.location={other.certificate_file}" in lines[0]
    assert {j.job_id for j in weir_cluster.client.list_jobs()} == before


def test_a_wrong_client_key_password_is_one_line_at_submit_without_the_password(
    weir_cluster: WeirCluster, secured_kafka: SecuredKafka, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_inputs(weir_cluster, secured_kafka, unique, "mtls")
    wrong = secured_kafka.directory / f"wrong-key-password-{unique}"
    wrong.write_text(f"not-the-key-password-{unique}\n")
    params = {**job_parameters(secured_kafka, unique, "mtls"), "kafka.ssl.key.password": f"${{file:{wrong}}}"}
    before = {j.job_id for j in weir_cluster.client.list_jobs()}
    code, err = weir_run(params, capsys)
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"weir: error: kafka source 'events-source': kafka: the client settings for {secured_kafka.mtls_bootstrap} "
        "are refused: "
    ), lines[0]
    assert "ssl.key.location failed" in lines[0], lines[0]
    assert f"not-the-key-password-{unique}" not in lines[0]
    assert {j.job_id for j in weir_cluster.client.list_jobs()} == before


def test_a_literal_password_is_refused_at_submit_and_kept_nowhere(
    weir_cluster: WeirCluster, secured_kafka: SecuredKafka, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    password = secured_kafka.password_file.read_text().strip()
    params = {**job_parameters(secured_kafka, unique), "kafka.sasl.password": password}
    before = {j.job_id for j in weir_cluster.client.list_jobs()}
    code, err = weir_run(params, capsys)
    assert code == EXIT_USAGE, err
    assert err.strip().splitlines() == [
        "weir: error: job parameter kafka.sasl.password holds a literal secret: give ${env:NAME} (an environment "
        "variable of the JobManager and every TaskManager) or ${file:/absolute/path} (a file on each of them) "
        "instead, so that it stays out of the job record and the logs"
    ]
    assert {j.job_id for j in weir_cluster.client.list_jobs()} == before
    assert files_holding(weir_cluster.directory, password.encode()) == []


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_plaintext_client_of_the_secured_broker_gets_nothing(secured_kafka: SecuredKafka, listener: Listener) -> None:
    """The broker is secured indeed: without the job's settings a client learns nothing of it on
    either listener (so a job that passes above did reach it with them)."""
    with pytest.raises((ServiceUnavailableError, JobDefinitionError)):
        kafka.list_topic_names(KafkaClientConfig(secured_kafka.bootstrap_of(listener)), timeout_s=3.0)
