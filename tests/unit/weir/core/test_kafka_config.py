"""A job's Kafka client configuration (``weir.core.kafka_config``): the merge of the endpoints, the
job's ``-D kafka.*`` parameters and a connector's ``properties``; secret references checked, resolved
in the process that makes the client, and never shown resolved. No broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError
from weir.core.kafka_config import (
    REDACTED,
    KafkaClientConfig,
    check_properties,
    is_secret_key,
    job_properties,
    kafka_client_config,
    redacted,
    resolve_references,
)

ENDPOINTS = Endpoints.from_env({"WEIR_KAFKA_BOOTSTRAP": "local:9092"})
SECURED = {
    "kafka.bootstrap.servers": "broker-1:9093,broker-2:9093",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.username": "weir",
    "kafka.sasl.password": "${env:KAFKA_PASSWORD}",
    "kafka.ssl.ca.location": "/etc/kafka/ca.crt",
}


# The merge -----------------------------------------------------------------------------------------


def test_without_settings_a_job_reaches_the_endpoints_broker_with_nothing_else() -> None:
    config = kafka_client_config(ENDPOINTS, {"source.topic": "events", "checkpointing.interval": "1s"})
    assert config == KafkaClientConfig("local:9092")
    assert config.client_settings({}) == {"bootstrap.servers": "local:9092"}


def test_the_jobs_kafka_parameters_are_its_settings_and_may_name_another_cluster() -> None:
    config = kafka_client_config(ENDPOINTS, {**SECURED, "source.topic": "events"})
    assert config.bootstrap_servers == "broker-1:9093,broker-2:9093"
    assert dict(config.properties) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "weir",
        "sasl.password": "${env:KAFKA_PASSWORD}",
        "ssl.ca.location": "/etc/kafka/ca.crt",
    }


def test_a_connectors_properties_win_over_the_jobs_key_by_key() -> None:
    job = kafka_client_config(ENDPOINTS, SECURED)
    source = kafka_client_config(
        ENDPOINTS, SECURED, (("sasl.username", "reader"), ("sasl.password", "${file:/run/secrets/reader}"))
    )
    assert job.merged((("sasl.username", "reader"), ("sasl.password", "${file:/run/secrets/reader}"))) == source
    settings = dict(source.properties)
    assert settings["sasl.username"] == "reader" and settings["sasl.password"] == "${file:/run/secrets/reader}"
    assert settings["security.protocol"] == "SASL_SSL"  # the job's, kept
    assert source.bootstrap_servers == job.bootstrap_servers


def test_merging_is_deterministic_whatever_the_order_given() -> None:
    a = KafkaClientConfig("b:1").merged((("z.key", "1"), ("a.key", "2")))
    b = KafkaClientConfig("b:1").merged((("a.key", "2"), ("z.key", "1")))
    assert a == b and a.properties == (("a.key", "2"), ("z.key", "1"))


# What a layer may give -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("group.id", "group_id="),
        ("isolation.level", "read_committed"),
        ("transactional.id", "each exactly-once sink subtask"),
        ("transaction.timeout.ms", "transaction_timeout_ms="),
        ("enable.idempotence", "idempotent"),
        ("acks", "acks=all"),
        ("ENABLE.AUTO.COMMIT", "commit_offsets_on_checkpoint"),
    ],
)
def test_a_job_parameter_for_a_setting_weir_sets_itself_is_refused_with_what_to_do(key: str, hint: str) -> None:
    with pytest.raises(JobDefinitionError) as raised:
        job_properties({f"kafka.{key}": "x"})
    assert str(raised.value).startswith(f"job parameter kafka.{key} is set by Weir and cannot be overridden: ")
    assert hint in str(raised.value)


def test_bootstrap_servers_is_the_jobs_to_give_not_a_connectors() -> None:
    assert job_properties({"kafka.bootstrap.servers": "a:1,b:2"}) == (("bootstrap.servers", "a:1,b:2"),)
    with pytest.raises(JobDefinitionError, match=r"expected host:port\[,host:port...\]"):
        job_properties({"kafka.bootstrap.servers": "a:1,b"})
    with pytest.raises(JobDefinitionError, match=r"'bootstrap.servers' is set by Weir.*-D kafka.bootstrap.servers"):
        check_properties({"bootstrap.servers": "a:1"}, "kafka consumer property ", connector=True)


@pytest.mark.parametrize(
    "key",
    ["sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret", "ssl.key.pem"],
)
def test_a_literal_secret_is_refused_in_one_line_that_does_not_repeat_it(key: str) -> None:
    with pytest.raises(JobDefinitionError) as raised:
        job_properties({f"kafka.{key}": "hunter2"})
    message = str(raised.value)
    assert message == (
        f"job parameter kafka.{key} holds a literal secret: give ${{env:NAME}} (an environment variable of the "
        "JobManager and every TaskManager) or ${file:/absolute/path} (a file on each of them) instead, so that it "
        "stays out of the job record and the logs"
    )
    assert "hunter2" not in message and "\n" not in message
    with pytest.raises(JobDefinitionError, match="literal secret") as in_properties:
        check_properties({key: "hunter2"}, "kafka producer property ", connector=True)
    assert "hunter2" not in str(in_properties.value)


def test_a_secret_half_literal_half_reference_is_a_literal_secret() -> None:
    with pytest.raises(JobDefinitionError, match="literal secret"):
        job_properties({"kafka.sasl.password": "prefix-${env:KAFKA_PASSWORD}"})
    assert job_properties({"kafka.sasl.password": "${env:A}${file:/run/b}"}) == (
        ("sasl.password", "${env:A}${file:/run/b}"),
    )


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("${env:}", r"\$\{env:\} does not name an environment variable"),
        ("${env:KAFKA-PASSWORD}", "does not name an environment variable"),
        ("${file:secrets/password}", "must name an absolute path"),
        ("${vault:kv/kafka}", r"unknown reference \$\{vault:...\}"),
        ("${ENV:KAFKA_PASSWORD}", r"unknown reference \$\{ENV:...\}"),
    ],
)
def test_a_malformed_reference_is_refused_where_the_job_is_given(value: str, match: str) -> None:
    with pytest.raises(JobDefinitionError, match=match):
        job_properties({"kafka.sasl.password": value})
    with pytest.raises(JobDefinitionError, match=match):  # in any setting, not only a secret's
        job_properties({"kafka.client.id": value})


def test_keys_and_values_must_be_strings_and_a_secret_value_is_not_shown() -> None:
    with pytest.raises(JobDefinitionError, match="must be strings, got 1"):
        check_properties({"fetch.min.bytes": 1}, "kafka consumer property ", connector=True)  # type: ignore[dict-item]
    with pytest.raises(JobDefinitionError) as raised:
        check_properties({"sasl.password": b"hunter2"}, "kafka consumer property ", connector=True)  # type: ignore[dict-item]
    assert "hunter2" not in str(raised.value) and REDACTED in str(raised.value)


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.password", True),
        ("SASL.PASSWORD", True),
        ("ssl.key.password", True),
        ("ssl.keystore.password", True),
        ("ssl.truststore.password", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.oauthbearer.assertion.private.key.passphrase", True),
        ("ssl.key.pem", True),
        ("sasl.oauthbearer.assertion.private.key.pem", True),
        ("sasl.username", False),
        ("ssl.key.location", False),
        ("ssl.ca.pem", False),
        ("ssl.certificate.pem", False),
        ("sasl.oauthbearer.token.endpoint.url", False),
        ("security.protocol", False),
    ],
)
def test_which_settings_are_secrets(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


# Shown without secrets -----------------------------------------------------------------------------


def test_redaction_shows_references_and_hides_literal_secrets() -> None:
    shown = redacted(
        [("sasl.password", "${env:KAFKA_PASSWORD}"), ("ssl.key.password", "hunter2"), ("sasl.username", "weir")]
    )
    assert shown == {"sasl.password": "${env:KAFKA_PASSWORD}", "ssl.key.password": REDACTED, "sasl.username": "weir"}


def test_a_configuration_is_never_shown_with_a_literal_secret() -> None:
    """A configuration made in code (not through the checks) may hold one: its repr and its
    redacted form still do not show it."""
    config = KafkaClientConfig("b:1", (("sasl.password", "hunter2"), ("sasl.username", "weir")))
    assert "hunter2" not in repr(config) and "hunter2" not in str(config)
    assert config.redacted() == {"bootstrap.servers": "b:1", "sasl.password": REDACTED, "sasl.username": "weir"}


# Resolved where the client is made -----------------------------------------------------------------


def test_references_resolve_from_the_environment_and_files_of_the_process(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")  # as `echo s3cret > password` leaves it
    config = kafka_client_config(
        ENDPOINTS,
        {
            "kafka.sasl.username": "${env:KAFKA_USER}",
            "kafka.sasl.password": f"${{file:{password}}}",
            "kafka.client.id": "weir-${env:KAFKA_USER}-${env:HOSTNAME}",
        },
    )
    settings = config.client_settings({"KAFKA_USER": "weir", "HOSTNAME": "tm-1"})
    assert settings == {
        "bootstrap.servers": "local:9092",
        "sasl.username": "weir",
        "sasl.password": "s3cret",
        "client.id": "weir-weir-tm-1",
    }
    # the configuration itself keeps the references: what a job record or a log would hold
    assert dict(config.properties)["sasl.password"] == f"${{file:{password}}}"
    assert "s3cret" not in repr(config) and "s3cret" not in str(config.redacted())


def test_a_file_keeps_all_but_one_trailing_line_break(tmp_path: Path) -> None:
    pem = tmp_path / "key.pem"
    pem.write_text("-----BEGIN-----\nabc\n-----END-----\n\n")
    assert resolve_references("ssl.key.pem", f"${{file:{pem}}}", {}) == "-----BEGIN-----\nabc\n-----END-----\n"
    crlf = tmp_path / "crlf"
    crlf.write_bytes(b"pw\r\n")
    assert resolve_references("sasl.password", f"${{file:{crlf}}}", {}) == "pw"


def test_an_unset_variable_names_the_setting_and_the_variable_in_one_line() -> None:
    with pytest.raises(JobDefinitionError) as raised:
        resolve_references("sasl.password", "${env:KAFKA_PASSWORD}", {"OTHER": "x"})
    assert str(raised.value) == (
        "kafka setting 'sasl.password': ${env:KAFKA_PASSWORD} is not set in this process's environment: set "
        "KAFKA_PASSWORD for the JobManager and every TaskManager (and for weir verify)"
    )


def test_an_unreadable_file_names_the_setting_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(JobDefinitionError, match=rf"'sasl.password': \$\{{file:{missing}\}} cannot be read here: "):
        resolve_references("sasl.password", f"${{file:{missing}}}", {})
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(JobDefinitionError, match="is not UTF-8 text"):
        resolve_references("sasl.password", f"${{file:{binary}}}", {})


def test_a_value_without_references_is_kept_as_is() -> None:
    assert resolve_references("client.id", "plain-$HOME-{x}", {}) == "plain-$HOME-{x}"
