"""The Kafka sink's builder: each option checked where it is given, the transactional sink's own
options refused with ``at_least_once``, and ``stream.sink_to(KafkaSink.builder()...build())`` adding
what ``stream.sink_to_kafka(topic, ...)`` adds."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from weir.api import DeadLetterOnError, Environment, FailOnError, KafkaSink, OptionError, json_serializer
from weir.core.descriptors import DEFAULT_TRANSACTION_TIMEOUT_MS, SinkDelivery, SinkSpec, SinkSystem
from weir.core.errors import JobDefinitionError
from weir.graph import OperatorKind
from weir.operators.epoch_spill import DEFAULT_EPOCH_MEMORY_BYTES
from weir.operators.sinks import KafkaSinkOperator
from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator

DLQ = DeadLetterOnError("dlq")


def key_of(value: dict[str, Any]) -> str:
    return str(value["key"])


def test_exactly_once_is_the_default_with_its_defaults() -> None:
    sink = KafkaSink.builder().topic("out").build()
    assert (sink.delivery, sink.serializer, sink.key) == ("exactly_once", json_serializer, None)
    assert (sink.transaction_timeout_ms, sink.epoch_memory_bytes, sink.marker_replication_factor) == (
        DEFAULT_TRANSACTION_TIMEOUT_MS,
        DEFAULT_EPOCH_MEMORY_BYTES,
        None,
    )
    assert sink.descriptor() == SinkSpec(
        SinkSystem.KAFKA,
        "out",
        SinkDelivery.EXACTLY_ONCE,
        transaction_timeout_ms=DEFAULT_TRANSACTION_TIMEOUT_MS,
        epoch_memory_bytes=DEFAULT_EPOCH_MEMORY_BYTES,
    )
    assert sink.default_name() == "kafka-sink:out"


def test_the_options_reach_the_operator(tmp_path: Path) -> None:
    sink = (
        KafkaSink.builder()
        .topic("out")
        .key(key_of)
        .serializer(str.encode)
        .transaction_timeout_ms(timedelta(minutes=10))
        .marker_replication_factor(2)
        .epoch_memory_bytes(0)
        .spill_directory(tmp_path)
        .build()
    )
    env = Environment("j")
    env.from_collection([{"key": 1}], uid="src").sink_to(sink, uid="sink", on_error=DLQ)
    operator = env.graph.transformations["sink"].factory()
    assert isinstance(operator, TransactionalKafkaSinkOperator)
    assert (operator.epoch_memory_bytes, operator.spill_directory, operator.on_error) == (0, tmp_path, DLQ)
    spec = env.graph.transformations["sink"].sink_spec
    assert spec is not None and (spec.transaction_timeout_ms, spec.epoch_memory_bytes) == (600_000, 0)


def test_at_least_once_builds_the_plain_sink() -> None:
    sink = KafkaSink.builder().topic("out").delivery("at_least_once").key(key_of).build()
    assert sink.descriptor() == SinkSpec(SinkSystem.KAFKA, "out", SinkDelivery.AT_LEAST_ONCE)
    env = Environment("j")
    env.from_collection([1], uid="src").sink_to(sink, uid="sink")
    assert isinstance(env.graph.transformations["sink"].factory(), KafkaSinkOperator)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("transaction_timeout_ms", 60_000),
        ("marker_replication_factor", 1),
        ("epoch_memory_bytes", 1024),
        ("spill_directory", "/tmp/spill"),
    ],
)
def test_the_transactional_options_are_refused_with_at_least_once(option: str, value: object) -> None:
    builder = getattr(KafkaSink.builder().topic("out").delivery("at_least_once"), option)(value)
    with pytest.raises(OptionError) as refused:
        builder.build()
    assert str(refused.value) == f"kafka sink: {option} applies to delivery='exactly_once' only"


@pytest.mark.parametrize(
    ("option", "value", "complaint"),
    [
        ("topic", "", "kafka sink: topic must be a non-empty string, got ''"),
        ("serializer", "json", "kafka sink: serializer must be a function or None, got 'json'"),
        ("key", "key", "kafka sink: key must be a function or None, got 'key'"),
        (
            "delivery",
            "exactly-once",
            "kafka sink: delivery must be 'exactly_once' or 'at_least_once', got 'exactly-once'",
        ),
        (
            "transaction_timeout_ms",
            0,
            "kafka sink: transaction_timeout_ms must be a positive int (milliseconds), a datetime.timedelta or None, "
            "got 0",
        ),
        (
            "marker_replication_factor",
            0,
            "kafka sink: marker_replication_factor must be at least 1, got 0; leave it unset for min(3, brokers)",
        ),
        (
            "marker_replication_factor",
            2.0,
            "kafka sink: marker_replication_factor must be at least 1, got 2.0; leave it unset for min(3, brokers)",
        ),
        (
            "epoch_memory_bytes",
            -1,
            "kafka sink: epoch_memory_bytes must be an int of at least 0 (0: every record on disk), got -1; leave it "
            f"unset for {DEFAULT_EPOCH_MEMORY_BYTES} bytes (64 MiB)",
        ),
        ("spill_directory", 3, "kafka sink: spill_directory must be a path, got 3"),
        (
            "properties",
            [("client.id", "x")],
            "kafka sink: properties must be a mapping of client setting to string value, got [('client.id', 'x')]",
        ),
        (
            "properties",
            {"transactional.id": "mine"},
            "kafka sink: kafka producer property 'transactional.id' is set by Weir and cannot be overridden: each "
            "exactly-once sink subtask has its own, derived from the job and the sink",
        ),
        (
            "properties",
            {"sasl.password": "hunter2"},
            "kafka sink: kafka producer property 'sasl.password' holds a literal secret: give ${env:NAME} (an "
            "environment variable of the JobManager and every TaskManager) or ${file:/absolute/path} (a file on each "
            "of them) instead, so that it stays out of the job record and the logs",
        ),
        (
            "spill_directory",
            "spill",
            "kafka sink: spill_directory 'spill' must be an absolute path: each TaskManager would resolve a relative "
            "one against its own working directory",
        ),
    ],
)
def test_a_bad_option_is_refused_where_it_is_given_in_one_line(option: str, value: object, complaint: str) -> None:
    with pytest.raises(OptionError) as refused:
        getattr(KafkaSink.builder(), option)(value)
    assert str(refused.value) == complaint


def test_a_sink_without_a_topic_is_not_built() -> None:
    with pytest.raises(
        OptionError, match=r"^kafka sink: topic is not set: give the topic to write \(.topic\(name\)\)$"
    ):
        KafkaSink.builder().key(key_of).build()


def test_sink_to_and_sink_to_kafka_add_the_same_sink() -> None:
    env = Environment("j", parallelism=2)
    source = env.from_collection([{"key": 1}], uid="src")
    source.sink_to_kafka("out", uid="by-keywords", key=key_of, parallelism=3, on_error=FailOnError())
    source.sink_to(
        KafkaSink.builder().topic("out").key(key_of).build(), uid="by-builder", parallelism=3, on_error=FailOnError()
    )
    made, given = env.graph.transformations["by-keywords"], env.graph.transformations["by-builder"]
    assert (made.kind, made.name, made.parallelism, made.sink_spec) == (
        given.kind,
        given.name,
        given.parallelism,
        given.sink_spec,
    )
    assert (given.kind, given.name, given.parallelism) == (OperatorKind.SINK, "kafka-sink:out", 3)
    assert made.on_error is not None and given.on_error is not None and made.on_error() == given.on_error()


def test_the_convenience_form_names_the_operator() -> None:
    source = Environment("j").from_collection([1], uid="src")
    with pytest.raises(OptionError, match=r"^kafka sink 'out': epoch_memory_bytes must be an int of at least 0"):
        source.sink_to_kafka("t", uid="out", epoch_memory_bytes=True)  # type: ignore[arg-type]


def test_sink_to_refuses_what_is_not_a_sink() -> None:
    env = Environment("j")
    source = env.from_collection([1], uid="src")
    with pytest.raises(JobDefinitionError, match=r"^operator 'out': sink_to takes a sink built by its connector"):
        source.sink_to(KafkaSink.builder().topic("t"), uid="out")  # type: ignore[arg-type]
    assert list(env.graph.transformations) == ["src"]


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_the_sinks_own_kafka_settings_reach_its_operator_sorted(delivery: str) -> None:
    env = Environment("j")
    source = env.from_collection([{"key": 1}], uid="src")
    properties = {"sasl.username": "writer", "client.id": "results", "sasl.password": "${env:WRITER_PASSWORD}"}
    source.sink_to_kafka("out", uid="by-keywords", delivery=delivery, properties=properties)  # type: ignore[arg-type]
    source.sink_to(
        KafkaSink.builder().topic("out").delivery(delivery).properties(properties).build(),  # type: ignore[arg-type]
        uid="by-builder",
    )
    expected = (("client.id", "results"), ("sasl.password", "${env:WRITER_PASSWORD}"), ("sasl.username", "writer"))
    for uid in ("by-keywords", "by-builder"):
        operator = env.graph.transformations[uid].factory()
        assert isinstance(operator, KafkaSinkOperator | TransactionalKafkaSinkOperator)
        assert operator.properties == expected
