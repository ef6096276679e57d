"""How the Kafka adapter makes its clients from a job's configuration: Weir's defaults under the job's
settings, what Weir needs over them, secrets resolved only for the client, and a cluster's refusal told
apart from an outage. No broker: clients are made but never connect."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError, ServiceUnavailableError
from weir.core.kafka_config import KafkaClientConfig

SECURED = KafkaClientConfig(
    "broker:9093",
    (
        ("linger.ms", "50"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.password", "${env:WEIR_TEST_KAFKA_PASSWORD}"),
        ("sasl.username", "weir"),
        ("security.protocol", "SASL_SSL"),
    ),
)


def test_the_endpoints_are_their_broker_with_no_setting_of_its_own() -> None:
    endpoints = Endpoints.from_env({"WEIR_KAFKA_BOOTSTRAP": "local:9092"})
    assert kafka.cluster_config(endpoints) == KafkaClientConfig("local:9092")
    assert kafka.client_config(endpoints, linger_ms=5) == {"linger.ms": 5, "bootstrap.servers": "local:9092"}


def test_a_client_gets_the_jobs_settings_resolved_over_weirs_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_TEST_KAFKA_PASSWORD", "s3cret")
    config = kafka.client_config(SECURED, linger_ms=5, batch_num_messages=10)
    assert config == {
        "linger.ms": "50",  # the job's tuning wins over Weir's default
        "batch.num.messages": 10,
        "bootstrap.servers": "broker:9093",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": "s3cret",
        "sasl.username": "weir",
        "security.protocol": "SASL_SSL",
    }


def test_a_client_cannot_be_made_without_its_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEIR_TEST_KAFKA_PASSWORD", raising=False)
    with pytest.raises(JobDefinitionError, match=r"\$\{env:WEIR_TEST_KAFKA_PASSWORD\} is not set"):
        kafka.producer(SECURED)


def test_the_transactional_producer_keeps_what_it_needs_over_the_jobs_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[dict[str, Any]] = []

    class Recording:
        def __init__(self, config: dict[str, Any]) -> None:
            made.append(config)

    monkeypatch.setenv("WEIR_TEST_KAFKA_PASSWORD", "s3cret")
    monkeypatch.setattr(kafka, "Producer", Recording)
    kafka.TransactionalProducer(SECURED, "weir-tx-1", 60_000)
    (config,) = made
    assert config["transactional.id"] == "weir-tx-1" and config["transaction.timeout.ms"] == 60_000
    assert config["sasl.password"] == "s3cret" and config["security.protocol"] == "SASL_SSL"
    assert config["linger.ms"] == "50" and callable(config["error_cb"])


def test_settings_librdkafka_refuses_are_the_jobs_error_without_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_TEST_KAFKA_PASSWORD", "s3cret")
    bad = SECURED.merged((("security.protocol", "bogus"),))
    with pytest.raises(JobDefinitionError) as raised:
        kafka.producer(bad)
    assert str(raised.value) == (
        'kafka: the client settings for broker:9093 are refused: Invalid value "bogus" for configuration property '
        "\"security.protocol\" (check the job's -D kafka.* parameters and the connector's properties=)"
    )

    def echoing(config: dict[str, Any]) -> Producer:
        raise ValueError(f"cannot use {config['sasl.password']!r} with {config['sasl.username']!r}")

    with pytest.raises(JobDefinitionError) as echoed:
        kafka._new(echoing, SECURED, kafka.client_config(SECURED))  # type: ignore[arg-type]
    assert "s3cret" not in str(echoed.value) and "'<redacted>' with 'weir'" in str(echoed.value)


def test_a_refused_login_ends_a_request_at_once_a_tls_failure_only_when_nothing_answered() -> None:
    errors = kafka.ClientErrors()
    errors(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    assert errors.refusal() is None
    errors(KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed"))
    assert errors.refusal(final=False) is None  # a handshake may fail in passing: keep asking
    assert errors.refusal() is not None and errors.refusal().code() == KafkaError._SSL  # type: ignore[union-attr]
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    assert errors.refusal(final=False).code() == KafkaError._AUTHENTICATION  # type: ignore[union-attr]


def test_a_refusal_names_the_brokers_error_and_the_settings_as_given() -> None:
    errors = kafka.ClientErrors()
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed"))
    failure = kafka.unreachable(SECURED, errors, "no answer from broker:9093 within 10.0s", "timed out")
    assert isinstance(failure, JobDefinitionError) and not failure.retriable and failure.fault.value == "user"
    assert str(failure) == (
        "kafka at broker:9093 refused the client's login: SASL authentication error: Authentication failed (with "
        "sasl.mechanism=SCRAM-SHA-512, sasl.password=${env:WEIR_TEST_KAFKA_PASSWORD}, sasl.username=weir, "
        "security.protocol=SASL_SSL; check the job's -D kafka.* parameters and the connector's properties=)"
    )
    outage = kafka.unreachable(SECURED, kafka.ClientErrors(), "no answer from broker:9093 within 10.0s", "timed out")
    assert isinstance(outage, ServiceUnavailableError) and outage.retriable
    assert str(outage) == "kafka: no answer from broker:9093 within 10.0s: timed out"


def test_no_answer_names_the_clients_last_error_such_as_a_broker_refusing_the_certificate() -> None:
    """A broker that requires a client certificate and gets none answers TLS 1.3's handshake, then
    closes the connection with an alert: librdkafka reports a transport error, not a refusal, so the
    request ends in no answer; the message says what the client saw (the summary of brokers down is
    no cause and is passed over)."""
    errors = kafka.ClientErrors()
    alert = (
        "ssl://127.0.0.1:9094/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: "
        "SSL alert number 42 (after 12ms in state APIVERSION_QUERY)"
    )
    errors(KafkaError(KafkaError._TRANSPORT, alert))
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    outage = kafka.unreachable(SECURED, errors, "no answer from broker:9093 within 10.0s", "timed out")
    assert isinstance(outage, ServiceUnavailableError) and outage.retriable
    assert str(outage) == (
        f"kafka: no answer from broker:9093 within 10.0s: timed out (the client's last error: {alert})"
    )
    only_down = kafka.ClientErrors()
    only_down(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert str(kafka.unreachable(SECURED, only_down, "no answer", "timed out")) == "kafka: no answer: timed out"


def test_a_tls_failure_is_still_the_reason_after_the_brokers_down_summaries_that_follow_it() -> None:
    """librdkafka follows each failed connection with 'brokers are down' summaries, many to one
    (seen against a broker whose certificate the client's CA did not sign): they must not push the
    handshake failure out of the errors kept."""
    errors = kafka.ClientErrors()
    errors(KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed"))
    errors(KafkaError(KafkaError._TRANSPORT, "certificate verify failed"))
    for _ in range(20):
        errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert errors.refusal() is not None and errors.refusal().code() == KafkaError._SSL  # type: ignore[union-attr]
