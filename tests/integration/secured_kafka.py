"""A second, secured Kafka broker for the tests, as a managed Kafka is: clients reach it on two
listeners, each secured one way, with certificates of a CA made here: SASL_SSL (a login with
SCRAM-SHA-512 over TLS) and SSL with client certificates (mutual TLS: the client's certificate is its
identity, its private key encrypted with a password the job gives by reference).

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
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, assert_never

from cryptography.hazmat.primitives import serialization

from tests.certificates import CertificateAuthority
from tests.integration import polling
from weir.connectors import kafka
from weir.core.config import cache_dir
from weir.core.errors import WeirError
from weir.core.kafka_config import JOB_PARAMETER_PREFIX, KafkaClientConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_FILES = REPO_ROOT / "deploy" / "local" / "kafka"
MECHANISM = "SCRAM-SHA-512"
USER = "weir-job"
CLIENT_CERTIFICATE = "weir-job-client"
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


Listener = Literal["scram", "mtls"]
"""How a client reaches the broker: SASL_SSL with SCRAM-SHA-512, or SSL with a client certificate."""

LISTENERS: tuple[Listener, ...] = ("scram", "mtls")


@dataclass(frozen=True)
class SecuredKafka:
    """A running secured broker and how a job reaches it on each listener."""

    directory: Path
    bootstrap: str  # the SASL_SSL listener
    mtls_bootstrap: str  # the SSL listener that requires a client certificate
    ca_file: Path
    password_file: Path  # the SCRAM password
    client_certificate: Path
    client_key: Path  # encrypted with the password in key_password_file
    key_password_file: Path
    process: subprocess.Popen[bytes]

    def bootstrap_of(self, listener: Listener) -> str:
        match listener:
            case "scram":
                return self.bootstrap
            case "mtls":
                return self.mtls_bootstrap
            case _:
                assert_never(listener)

    def secret_file(self, listener: Listener) -> Path:
        """The file holding the one secret a job gives by reference on ``listener``."""
        match listener:
            case "scram":
                return self.password_file
            case "mtls":
                return self.key_password_file
            case _:
                assert_never(listener)

    def parameters(self, password_file: Path | None = None, listener: Listener = "scram") -> dict[str, str]:
        """The ``-D kafka.*`` parameters of a job on this broker (the secret by reference: the SCRAM
        password, or the client key's password)."""
        secret = f"${{file:{password_file or self.secret_file(listener)}}}"
        match listener:
            case "scram":
                settings = {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": MECHANISM,
                    "sasl.username": USER,
                    "sasl.password": secret,
                }
            case "mtls":
                settings = {
                    "security.protocol": "SSL",
                    "ssl.certificate.location": str(self.client_certificate),
                    "ssl.key.location": str(self.client_key),
                    "ssl.key.password": secret,
                }
            case _:
                assert_never(listener)
        settings |= {"bootstrap.servers": self.bootstrap_of(listener), "ssl.ca.location": str(self.ca_file)}
        return {f"{JOB_PARAMETER_PREFIX}{key}": value for key, value in settings.items()}

    def client_config(self, listener: Listener = "scram") -> KafkaClientConfig:
        """The tests' own clients: as a job's with these parameters."""
        settings = {k[len(JOB_PARAMETER_PREFIX) :]: v for k, v in self.parameters(listener=listener).items()}
        return KafkaClientConfig(settings.pop("bootstrap.servers"), tuple(sorted(settings.items())))

    @property
    def log(self) -> Path:
        return self.directory / "kafka.log"


def _server_properties(directory: Path, ports: dict[str, int], keystore: Path, ca_file: Path) -> str:
    shared = (KAFKA_FILES / "broker.properties").read_text(encoding="utf-8")
    internal, secured, mtls = (f"{name}://127.0.0.1:{ports[name.lower()]}" for name in ("INTERNAL", "SECURED", "MTLS"))
    return f"""# written by tests/integration/secured_kafka.py
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{ports["controller"]}
listeners={internal},{secured},{mtls},CONTROLLER://127.0.0.1:{ports["controller"]}
advertised.listeners={internal},{secured},{mtls}
listener.security.protocol.map=INTERNAL:PLAINTEXT,SECURED:SASL_SSL,MTLS:SSL,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
sasl.enabled.mechanisms={MECHANISM}
listener.name.secured.sasl.enabled.mechanisms={MECHANISM}
listener.name.secured.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.secured.ssl.keystore.type=PEM
listener.name.secured.ssl.keystore.location={keystore}
listener.name.mtls.ssl.keystore.type=PEM
listener.name.mtls.ssl.keystore.location={keystore}
listener.name.mtls.ssl.truststore.type=PEM
listener.name.mtls.ssl.truststore.location={ca_file}
listener.name.mtls.ssl.client.auth=required
log.dirs={directory / "data"}
{shared}
"""


def start_secured_kafka(directory: Path, password: str, key_password: str) -> SecuredKafka:
    """Make the certificates (the client's key encrypted with ``key_password``), format the storage
    with the SCRAM user (``password``), start the broker and wait (with a deadline) until a client
    gets its metadata on each listener."""
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
    client = ca.issue(certificates, CLIENT_CERTIFICATE)
    key_password_file = directory / "key-password"
    key_password_file.write_text(key_password + "\n")
    key_password_file.chmod(0o600)
    client_key = certificates / f"{CLIENT_CERTIFICATE}-encrypted.key"
    _encrypt_key(client.key, client_key, key_password)

    ports = {"internal": free_port(), "secured": free_port(), "mtls": free_port(), "controller": free_port()}
    config = directory / "server.properties"
    config.write_text(_server_properties(directory, ports, keystore, ca.certificate_file), encoding="utf-8")
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
    secured = SecuredKafka(
        directory,
        f"127.0.0.1:{ports['secured']}",
        f"127.0.0.1:{ports['mtls']}",
        ca.certificate_file,
        password_file,
        client.certificate,
        client_key,
        key_password_file,
        process,
    )
    try:
        _wait_until_ready(secured)
    except BaseException:
        stop_secured_kafka(secured)
        raise
    return secured


def _encrypt_key(plain: Path, encrypted: Path, password: str) -> None:
    """The client's private key as PKCS#8 encrypted with ``password`` (librdkafka's
    ``ssl.key.password`` opens it); the unencrypted one removed."""
    key = serialization.load_pem_private_key(plain.read_bytes(), password=None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    encrypted.chmod(0o600)
    plain.unlink()


def _wait_until_ready(secured: SecuredKafka) -> None:
    """Poll, with a deadline, until a client gets the cluster's metadata on each listener."""

    def unanswered(listener: Listener) -> str | None:
        """None once the listener answers; why it does not yet."""
        if secured.process.poll() is not None:
            raise AssertionError(
                f"the secured Kafka exited with {secured.process.returncode}: {secured.log.read_text()[-3000:]}"
            )
        try:
            kafka.list_topic_names(secured.client_config(listener), timeout_s=5.0)
        except WeirError as exc:
            return str(exc)
        return None

    for listener in LISTENERS:
        why = polling.settle(READY_WITHIN_S, partial(unanswered, listener), lambda reason: reason is None, 0.5)
        if why is not None:
            raise AssertionError(
                f"the secured Kafka at {secured.bootstrap_of(listener)} ({listener}) did not answer within "
                f"{READY_WITHIN_S:g}s: {why}; see {secured.log}"
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
