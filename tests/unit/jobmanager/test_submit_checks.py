"""Submit-time rules over a job's descriptors (no external system): exactly-once sinks that could
never commit, Kafka transaction timeouts; the dead-letter topics a job's operators need (Kafka
faked)."""

from __future__ import annotations

import pytest

from weir.api import DeadLetterOnError, Environment, FailOnError
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.descriptors import validate_transaction_timeout
from weir.core.errors import JobDefinitionError
from weir.core.kafka_config import KafkaClientConfig
from weir.jobmanager.checkpointing.config import parse_checkpoint_settings
from weir.jobmanager.submit_checks import check_job_at_submit, check_job_rules, dead_letter_topics, job_is_bounded

# transaction.timeout.ms -------------------------------------------------------------------------


def test_a_timeout_covering_interval_and_restart_is_accepted() -> None:
    validate_transaction_timeout(900_000, checkpoint_interval_s=60, restart_allowance_s=300)
    validate_transaction_timeout(360_000, checkpoint_interval_s=60, restart_allowance_s=300)


def test_a_timeout_shorter_than_interval_plus_restart_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match=r"cannot cover a checkpoint interval of 60s plus a restart"):
        validate_transaction_timeout(300_000, checkpoint_interval_s=60, restart_allowance_s=300)


def test_a_timeout_above_the_broker_maximum_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match="transaction.max.timeout.ms"):
        validate_transaction_timeout(3_600_000, checkpoint_interval_s=10, restart_allowance_s=10)
    validate_transaction_timeout(
        3_600_000, checkpoint_interval_s=10, restart_allowance_s=10, broker_max_timeout_ms=3_600_000
    )
    with pytest.raises(JobDefinitionError, match="positive"):
        validate_transaction_timeout(0, checkpoint_interval_s=10, restart_allowance_s=10)


def test_the_graph_check_names_the_sink() -> None:
    env = Environment("j", parallelism=1)
    source = env.from_collection([1, 2], uid="src")
    source.sink_to_kafka("ok", uid="fine")
    source.sink_to_kafka("short", uid="too-short", transaction_timeout_ms=30_000)
    source.sink_to_kafka("plain", uid="plain", delivery="at_least_once")
    settings = parse_checkpoint_settings({"checkpointing.interval": "10s"})
    check_job_rules(env.graph, settings, restart_allowance_s=10)
    with pytest.raises(JobDefinitionError, match="kafka sink 'too-short'"):
        check_job_rules(env.graph, settings, restart_allowance_s=60)


def unbounded_job(delivery: str) -> Environment:
    env = Environment("j", parallelism=1)
    numbers = env.from_generator(lambda i: i, uid="numbers")  # no count: unbounded
    numbers.sink_to_kafka("out", uid="kafka-sink", delivery=delivery)  # type: ignore[arg-type]
    return env


def test_an_exactly_once_sink_on_an_unbounded_job_without_checkpoints_is_refused() -> None:
    env = unbounded_job("exactly_once")
    assert not job_is_bounded(env.graph)
    with pytest.raises(JobDefinitionError, match="would never commit"):
        check_job_rules(env.graph, parse_checkpoint_settings({}), restart_allowance_s=10)
    check_job_rules(unbounded_job("at_least_once").graph, parse_checkpoint_settings({}), restart_allowance_s=10)


def test_a_bounded_job_may_run_exactly_once_sinks_without_periodic_checkpoints() -> None:
    env = Environment("j", parallelism=1)
    env.from_collection([1, 2], uid="numbers").sink_to_kafka("out", uid="kafka-sink")
    assert job_is_bounded(env.graph)
    check_job_rules(env.graph, parse_checkpoint_settings({}), restart_allowance_s=10)


@pytest.mark.parametrize("mode", ["at_least_once", "AT-LEAST-ONCE"])
def test_exactly_once_sinks_are_refused_under_at_least_once_checkpoints(mode: str) -> None:
    settings = parse_checkpoint_settings({"checkpointing.interval": "1s", "checkpointing.mode": mode})
    with pytest.raises(JobDefinitionError, match="cannot run with checkpointing.mode=at_least_once"):
        check_job_rules(unbounded_job("exactly_once").graph, settings, restart_allowance_s=10)
    check_job_rules(unbounded_job("at_least_once").graph, settings, restart_allowance_s=10)


# Dead-letter topics -----------------------------------------------------------------------------


def dead_lettering_job() -> Environment:
    env = Environment("j", parallelism=1)
    numbers = env.from_kafka("events", uid="src", dead_letter_topic="malformed")
    parsed = numbers.map(lambda v: v, uid="parse").filter(bool, uid="keep", on_error=FailOnError())
    parsed.key_by(lambda v: v).reduce(lambda a, b: b, uid="latest", on_error=DeadLetterOnError("latest-dlq")).print(
        uid="out"
    )
    parsed.sink_to_kafka("out", uid="sink", delivery="at_least_once")
    env.on_record_error(DeadLetterOnError("job-dlq"))  # the operators without their own read it at submit
    return env


def test_the_dead_letter_topics_are_the_operators_on_error_topics_with_who_sends_there() -> None:
    assert dead_letter_topics(dead_lettering_job().graph) == {"job-dlq": ("parse", "sink"), "latest-dlq": ("latest",)}


def test_a_missing_dead_letter_topic_refuses_the_job_at_submit_naming_topic_and_operators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    existing = {"events", "malformed", "out", "latest-dlq"}
    looked_up: list[str] = []

    def partition_count(_endpoints: Endpoints, topic: str, timeout_s: float = 10.0) -> int | None:
        looked_up.append(topic)
        return 1 if topic in existing else None

    monkeypatch.setattr(kafka, "topic_partition_count", partition_count)
    monkeypatch.setattr(kafka, "require_topic", lambda _endpoints, _topic: None)
    settings = parse_checkpoint_settings({"checkpointing.interval": "10s"})
    endpoints = Endpoints.from_env()
    with pytest.raises(JobDefinitionError) as raised:
        check_job_at_submit(dead_lettering_job().graph, settings, 10, endpoints)
    assert str(raised.value) == (
        f"dead-letter topic 'job-dlq' of 'parse', 'sink' does not exist at {endpoints.kafka_bootstrap}: a rejected "
        "record could not be kept; create it before the job runs"
    )
    existing.add("job-dlq")
    check_job_at_submit(dead_lettering_job().graph, settings, 10, endpoints)
    assert {"job-dlq", "latest-dlq"} <= set(looked_up)


# The job's Kafka settings --------------------------------------------------------------------------


def test_every_submit_check_reaches_kafka_with_the_jobs_settings_and_each_connectors_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = Environment("j", parallelism=1)
    events = env.from_kafka("events", uid="src", properties={"sasl.username": "reader"})
    parsed = events.map(lambda v: v, uid="parse", on_error=DeadLetterOnError("parse-dlq"))
    parsed.sink_to_kafka("out", uid="sink", properties={"sasl.username": "writer", "client.id": "sink"})
    parsed.sink_to_kafka("plain", uid="plain", delivery="at_least_once")
    asked: list[tuple[str, KafkaClientConfig]] = []

    def partition_count(cluster: KafkaClientConfig, topic: str, timeout_s: float = 10.0) -> int:
        asked.append((topic, cluster))
        return 1

    def require_topic(cluster: KafkaClientConfig, topic: str, timeout_s: float = 10.0) -> kafka.TopicLookup:
        asked.append((topic, cluster))
        return kafka.TopicLookup(1, kafka.TopicLayout(topic, 1, 1))

    monkeypatch.setattr(kafka, "topic_partition_count", partition_count)
    monkeypatch.setattr(kafka, "require_topic", require_topic)
    parameters = {
        "kafka.bootstrap.servers": "secured:9093",
        "kafka.sasl.username": "job",
        "kafka.sasl.password": "${env:KAFKA_PASSWORD}",
        "checkpointing.interval": "10s",
    }
    settings = parse_checkpoint_settings(parameters)
    check_job_at_submit(env.graph, settings, 10, Endpoints.from_env(), parameters)

    job = KafkaClientConfig("secured:9093", (("sasl.password", "${env:KAFKA_PASSWORD}"), ("sasl.username", "job")))
    assert sorted(asked, key=lambda a: a[0]) == [
        ("events", job.merged([("sasl.username", "reader")])),
        ("out", job.merged([("client.id", "sink"), ("sasl.username", "writer")])),
        ("parse-dlq", job),
        ("plain", job),
    ]


def test_a_cluster_refusing_the_sources_settings_refuses_the_job_naming_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(cluster: KafkaClientConfig, topic: str, timeout_s: float = 10.0) -> int:
        raise JobDefinitionError(f"kafka at {cluster.bootstrap_servers} refused the client's login: SASL failed")

    monkeypatch.setattr(kafka, "topic_partition_count", refused)
    env = Environment("j", parallelism=1)
    env.from_kafka("events", uid="src").print(uid="out")
    parameters = {"kafka.bootstrap.servers": "secured:9093"}
    with pytest.raises(JobDefinitionError) as raised:
        check_job_at_submit(env.graph, parse_checkpoint_settings({}), 10, Endpoints.from_env(), parameters)
    assert str(raised.value) == "kafka source 'src': kafka at secured:9093 refused the client's login: SASL failed"
