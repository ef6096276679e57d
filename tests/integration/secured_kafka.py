"""A second, secured Kafka broker for the tests, as a managed Kafka is: clients reach it on a SASL_SSL
listener only, logging in with SCRAM-SHA-512 over TLS with a certificate of a CA made here.

It runs from the jars ``deploy/local/kafka.sh install`` resolved (the local Kafka's version), as one
KRaft node (broker and controller) with its own ports and directory, the SCRAM user created when its
storage is formatted (``kafka-storage format --add-scram``). The broker itself keeps a plaintext
listener on 127.0.0.1 for its own inter-broker traffic (the transaction coordinator writing markers):
nothing of Weir's is told about it. Started once per test session (``tests/integration/conftest.py``)."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.certificates import CertificateAuthority
from weir.connectors import kafka
from weir.core.config import cache_dir
from weir.core.errors import WeirError
from weir.core.kafka_config import JOB_PARAMETER_PREFIX, KafkaClientConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_FILES = REPO_ROOT / "deploy" / "local" / "kafka"
MECHANISM = "SCRAM-SHA-512"
USER = "weir-job"
READY_WITHIN_S = 180.0
STOPPED_WITHIN_S = 30.0


def kafka_version() -> str:
    """The Kafka version deploy/local pins (``deploy/local/kafka/pom.xml``)."""
    found = re.search(r"<kafka.version>(.+?)</kafka.version>", (KAFKA_FILES / "pom.xml").read_text(encoding="utf-8"))
    if found is None:
        raise AssertionError("deploy/local/kafka/pom.xml pins no kafka.version")
    return found.group(1)


def kafka_libs() -> Path:
    """Where ``deploy/local/kafka.sh install`` put the broker's jars."""
    libs = cache_dir() / "kafka" / kafka_version() / "libs"
    if not (libs.parent / ".installed").is_file():
        raise AssertionError(f"Kafka is not installed in {libs.parent}: run deploy/local/kafka.sh install")
    return libs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class SecuredKafka:
    """A running secured broker and how a job reaches it."""

    directory: Path
    bootstrap: str
    ca_file: Path
    password_file: Path
    process: subprocess.Popen[bytes]

    def parameters(self, password_file: Path | None = None) -> dict[str, str]:
        """The ``-D kafka.*`` parameters of a job on this broker (the password by reference)."""
        return {
            f"{JOB_PARAMETER_PREFIX}bootstrap.servers": self.bootstrap,
            f"{JOB_PARAMETER_PREFIX}security.protocol": "SASL_SSL",
            f"{JOB_PARAMETER_PREFIX}sasl.mechanism": MECHANISM,
            f"{JOB_PARAMETER_PREFIX}sasl.username": USER,
            f"{JOB_PARAMETER_PREFIX}sasl.password": f"${{file:{password_file or self.password_file}}}",
            f"{JOB_PARAMETER_PREFIX}ssl.ca.location": str(self.ca_file),
        }

    def client_config(self) -> KafkaClientConfig:
        """The tests' own clients: as a job's with these parameters."""
        settings = {k[len(JOB_PARAMETER_PREFIX) :]: v for k, v in self.parameters().items()}
        return KafkaClientConfig(settings.pop("bootstrap.servers"), tuple(sorted(settings.items())))

    @property
    def log(self) -> Path:
        return self.directory / "kafka.log"


def _server_properties(directory: Path, ports: dict[str, int], keystore: Path) -> str:
    shared = (KAFKA_FILES / "broker.properties").read_text(encoding="utf-8")
    return f"""# written by tests/integration/secured_kafka.py
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{ports["controller"]}
listeners=INTERNAL://127.0.0.1:{ports["internal"]},SECURED://127.0.0.1:{ports["secured"]},CONTROLLER://127.0.0.1:{ports["controller"]}
advertised.listeners=INTERNAL://127.0.0.1:{ports["internal"]},SECURED://127.0.0.1:{ports["secured"]}
listener.security.protocol.map=INTERNAL:PLAINTEXT,SECURED:SASL_SSL,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
sasl.enabled.mechanisms={MECHANISM}
listener.name.secured.sasl.enabled.mechanisms={MECHANISM}
listener.name.secured.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.secured.ssl.keystore.type=PEM
listener.name.secured.ssl.keystore.location={keystore}
log.dirs={directory / "data"}
{shared}
"""


def start_secured_kafka(directory: Path, password: str) -> SecuredKafka:
    """Make the certificates, format the storage with the SCRAM user, start the broker and wait (with
    a deadline) until a SASL_SSL client logged in with ``password`` gets its metadata."""
    directory.mkdir(parents=True, exist_ok=True)
    certificates = directory / "certificates"
    ca = CertificateAuthority.create(certificates, "kafka-test-ca")
    broker = ca.issue(certificates, "kafka-broker")
    keystore = certificates / "broker-keystore.pem"  # the private key, then the certificate chain
    keystore.write_bytes(broker.key.read_bytes() + broker.certificate.read_bytes())
    keystore.chmod(0o600)
    password_file = directory / "password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)

    ports = {"internal": free_port(), "secured": free_port(), "controller": free_port()}
    config = directory / "server.properties"
    config.write_text(_server_properties(directory, ports, keystore), encoding="utf-8")
    libs = kafka_libs()
    java = [
        "java",
        "-Xms128m",
        "-Xmx384m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={KAFKA_FILES / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
    ]
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    scram = f"{MECHANISM}=[name={USER},password={password}]"
    formatted = subprocess.run(
        [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config), "--add-scram", scram],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if formatted.returncode != 0:
        raise AssertionError(f"kafka-storage format failed: {formatted.stdout[-2000:]}{formatted.stderr[-2000:]}")
    log = (directory / "kafka.log").open("ab")
    process = subprocess.Popen(
        [*java, "kafka.Kafka", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    secured = SecuredKafka(directory, f"127.0.0.1:{ports['secured']}", ca.certificate_file, password_file, process)
    try:
        _wait_until_ready(secured)
    except BaseException:
        stop_secured_kafka(secured)
        raise
    return secured


def _wait_until_ready(secured: SecuredKafka) -> None:
    """Poll, with a deadline, until a logged-in client gets the cluster's metadata."""
    deadline = time.monotonic() + READY_WITHIN_S
    why = "no answer yet"
    while time.monotonic() < deadline:
        if secured.process.poll() is not None:
            raise AssertionError(
                f"the secured Kafka exited with {secured.process.returncode}: {secured.log.read_text()[-3000:]}"
            )
        try:
            kafka.list_topic_names(secured.client_config(), timeout_s=5.0)
            return
        except WeirError as exc:
            why = str(exc)
        time.sleep(0.5)
    raise AssertionError(
        f"the secured Kafka at {secured.bootstrap} did not answer within {READY_WITHIN_S:g}s: {why}; see {secured.log}"
    )


def stop_secured_kafka(secured: SecuredKafka) -> None:
    """Stop the broker this module started (its own process, by its handle)."""
    if secured.process.poll() is not None:
        return
    secured.process.terminate()
    try:
        secured.process.wait(STOPPED_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(secured.process.pid, 9)
        secured.process.wait(STOPPED_WITHIN_S)
