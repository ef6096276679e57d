"""The Kafka source's builder: each option checked where it is given (one line naming the option and
the value), the options checked together at build(), and the two forms, ``env.from_source(KafkaSource
.builder()...build())`` and ``env.from_kafka(topic, ...)``, making the same source."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from weir.api import (
    COMMITTED,
    LATEST,
    ColumnarStream,
    Committed,
    Environment,
    KafkaSource,
    OffsetReset,
    OptionError,
    Schema,
    Timestamp,
    json_deserializer,
)
from weir.core.descriptors import KafkaSourceSpec
from weir.core.errors import Fault, JobDefinitionError
from weir.graph import OperatorKind
from weir.operators.sources import KafkaSourceOperator


def event_time(e: dict[str, Any]) -> int:
    return int(e["ts"])


def test_the_builder_makes_the_spec_of_every_option() -> None:
    source = (
        KafkaSource.builder()
        .topic("orders")
        .bounded()
        .deserializer(json.loads)
        .timestamp(event_time)
        .max_out_of_orderness_ms(timedelta(seconds=5))
        .idle_timeout_ms(30_000)
        .dead_letter_topic("orders-dlq")
        .max_record_bytes(1 << 20)
        .records_per_second(250.5)
        .starting_offsets(Timestamp(1_764_000_000_000))
        .properties({"security.protocol": "SASL_SSL", "client.id": "orders"})
        .commit_offsets_on_checkpoint(False)
        .group_id("orders-reader")
        .build()
    )
    assert source.descriptor() == KafkaSourceSpec(
        topic="orders",
        bounded=True,
        deserializer=json.loads,
        timestamp=event_time,
        max_out_of_orderness_ms=5_000,
        dead_letter_topic="orders-dlq",
        records_per_second=250.5,
        idle_timeout_ms=30_000,
        starting_offsets=Timestamp(1_764_000_000_000),
        properties=(("client.id", "orders"), ("security.protocol", "SASL_SSL")),
        commit_offsets_on_checkpoint=False,
        group_id="orders-reader",
        max_record_bytes=1 << 20,
    )
    assert source.default_name() == "kafka:orders" and source.columnar_schema() is None
    operator = source.create_operator()
    assert isinstance(operator, KafkaSourceOperator) and operator is not source.create_operator()


def test_the_defaults_are_those_of_from_kafka() -> None:
    spec = KafkaSource.builder().topic("events").build().descriptor()
    assert spec == KafkaSourceSpec(
        topic="events",
        bounded=False,
        deserializer=json_deserializer,
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic=None,
    )


def test_a_builder_is_immutable_so_one_can_be_the_base_of_several_sources() -> None:
    base = KafkaSource.builder().starting_offsets(LATEST).dead_letter_topic("dlq")
    orders, payments = base.topic("orders").build(), base.topic("payments").build()
    assert (orders.spec.topic, payments.spec.topic) == ("orders", "payments")
    assert orders.spec.starting_offsets is payments.spec.starting_offsets is LATEST
    with pytest.raises(OptionError, match="topic is not set"):
        base.build()


def test_from_source_and_from_kafka_add_the_same_source() -> None:
    options: dict[str, Any] = {
        "bounded": True,
        "timestamp": event_time,
        "max_out_of_orderness_ms": 200,
        "dead_letter_topic": "dlq",
        "starting_offsets": COMMITTED,
        "group_id": "g",
    }
    by_keywords = Environment("j")
    by_keywords.from_kafka("events", uid="events", parallelism=2, **options)
    by_builder = Environment("j")
    builder = KafkaSource.builder().topic("events")
    for option, value in options.items():
        builder = getattr(builder, option)(value)
    stream = by_builder.from_source(builder.build(), uid="events", parallelism=2)
    made, given = by_keywords.graph.transformations["events"], by_builder.graph.transformations["events"]
    assert made.source_spec == given.source_spec
    assert made.source_spec is not None and made.source_spec.starting_offsets is COMMITTED
    for t in (made, given):
        assert (t.kind, t.name, t.parallelism, t.on_error, t.columnar) == (
            OperatorKind.SOURCE,
            "kafka:events",
            2,
            None,
            False,
        )
        assert isinstance(t.factory(), KafkaSourceOperator)
    assert stream.uid == "events"


def test_a_columnar_source_gives_a_columnar_stream() -> None:
    env = Environment("j")
    source = KafkaSource.builder().topic("events").schema({"key": str, "ts": int}).timestamp_field("ts").build()
    stream = env.from_source(source, uid="events", name="columnar events")
    assert isinstance(stream, ColumnarStream) and stream.schema == Schema.of({"key": str, "ts": int})
    t = env.graph.transformations["events"]
    assert t.columnar and t.name == "columnar events" and t.source_spec.schema == stream.schema


@pytest.mark.parametrize(
    ("option", "value", "complaint"),
    [
        ("topic", "", "kafka source: topic must be a non-empty string, got ''"),
        ("topic", 7, "kafka source: topic must be a non-empty string, got 7"),
        ("bounded", "yes", "kafka source: bounded must be True or False, got 'yes'"),
        ("deserializer", b"json", "kafka source: deserializer must be a function or None, got b'json'"),
        ("record_deserializer", 3, "kafka source: record_deserializer must be a function or None, got 3"),
        ("timestamp", "ts", "kafka source: timestamp must be a function or None, got 'ts'"),
        (
            "max_out_of_orderness_ms",
            -1,
            "kafka source: max_out_of_orderness_ms must be an int of at least 0 (milliseconds) or "
            "datetime.timedelta, got -1",
        ),
        (
            "max_out_of_orderness_ms",
            1.5,
            "kafka source: max_out_of_orderness_ms must be an int of at least 0 (milliseconds) or "
            "datetime.timedelta, got 1.5",
        ),
        (
            "idle_timeout_ms",
            timedelta(microseconds=10),
            "kafka source: idle_timeout_ms must be a positive int (milliseconds), a datetime.timedelta or None, "
            "got datetime.timedelta(microseconds=10)",
        ),
        (
            "idle_timeout_ms",
            True,
            "kafka source: idle_timeout_ms must be a positive int (milliseconds), a datetime.timedelta or None, "
            "got True",
        ),
        ("dead_letter_topic", "", "kafka source: dead_letter_topic must be a non-empty string, got ''"),
        ("max_record_bytes", 0, "kafka source: max_record_bytes must be a positive int or None, got 0"),
        (
            "records_per_second",
            0,
            "kafka source: records_per_second must be a positive number (records per second) or None, got 0",
        ),
        (
            "records_per_second",
            "fast",
            "kafka source: records_per_second must be a positive number (records per second) or None, got 'fast'",
        ),
        (
            "schema",
            ["ts"],
            "kafka source: schema must be a Schema or a mapping of field name to str, int, float or bool, got ['ts']",
        ),
        ("timestamp_field", "", "kafka source: timestamp_field must be a non-empty string, got ''"),
        (
            "starting_offsets",
            "earliest",
            "kafka source: starting_offsets must be EARLIEST, LATEST, Timestamp(ms) or Committed(...), got 'earliest'",
        ),
        (
            "starting_offsets",
            Timestamp(1.5),  # type: ignore[arg-type]
            "kafka source: starting_offsets Timestamp(ms) takes epoch milliseconds (an int >= 0), got 1.5",
        ),
        (
            "starting_offsets",
            Committed("latest"),  # type: ignore[arg-type]
            "kafka source: starting_offsets Committed(reset) takes OffsetReset.EARLIEST or LATEST, got 'latest'",
        ),
        (
            "properties",
            [("client.id", "x")],
            "kafka source: properties must be a mapping of consumer setting to string value, got [('client.id', 'x')]",
        ),
        (
            "partition_discovery_interval_ms",
            -5,
            "kafka source: partition_discovery_interval_ms must be a positive int (milliseconds), a "
            "datetime.timedelta or None, got -5",
        ),
        (
            "commit_offsets_on_checkpoint",
            None,
            "kafka source: commit_offsets_on_checkpoint must be True or False, got None",
        ),
        ("group_id", "", "kafka source: group_id must be a non-empty string, got ''"),
        (
            "properties",
            {"ssl.key.password": "hunter2"},
            "kafka source: kafka consumer property 'ssl.key.password' holds a literal secret: give ${env:NAME} (an "
            "environment variable of the JobManager and every TaskManager) or ${file:/absolute/path} (a file on each "
            "of them) instead, so that it stays out of the job record and the logs",
        ),
        (
            "properties",
            {"sasl.password": "${file:relative/path}"},
            "kafka source: kafka consumer property 'sasl.password': ${file:relative/path} must name an absolute "
            "path: each process resolves it on its own host, from its own working directory",
        ),
    ],
)
def test_a_bad_option_is_refused_where_it_is_given_in_one_line(option: str, value: object, complaint: str) -> None:
    builder = KafkaSource.builder()
    with pytest.raises(OptionError) as refused:
        getattr(builder, option)(value)
    assert str(refused.value) == complaint and "\n" not in complaint
    assert isinstance(refused.value, JobDefinitionError) and refused.value.fault is Fault.USER


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"partition_discovery_interval_ms": 1000, "bounded": True}, "a bounded source reads the partitions"),
        ({"deserializer": json.loads, "record_deserializer": lambda r: r}, "not both"),
        ({"schema": {"ts": int}}, "a columnar source needs timestamp_field"),
        ({"schema": {"ts": int}, "timestamp_field": "ts", "timestamp": event_time}, "leave deserializer"),
        ({"timestamp_field": "ts"}, "timestamp_field needs a schema"),
        ({"schema": {"ts": int, "key": str}, "timestamp_field": "key"}, "timestamp_field: .*must be an int field"),
    ],
)
def test_options_that_do_not_go_together_are_refused_at_build(options: dict[str, Any], complaint: str) -> None:
    builder = KafkaSource.builder().topic("events")
    for option, value in options.items():
        builder = getattr(builder, option)(value)
    with pytest.raises(OptionError, match=f"^kafka source: .*{complaint}"):
        builder.build()


def test_the_convenience_form_names_the_operator_instead() -> None:
    env = Environment("j")
    with pytest.raises(OptionError) as refused:
        env.from_kafka("events", uid="events-source", idle_timeout_ms=-1)
    assert str(refused.value) == (
        "kafka source 'events-source': idle_timeout_ms must be a positive int (milliseconds), a datetime.timedelta "
        "or None, got -1"
    )
    assert "events-source" not in env.graph.transformations


def test_durations_may_be_timedeltas() -> None:
    spec = (
        KafkaSource.builder()
        .topic("t")
        .idle_timeout_ms(timedelta(seconds=2))
        .partition_discovery_interval_ms(timedelta(minutes=1))
        .starting_offsets(Committed(OffsetReset.LATEST))
        .build()
        .spec
    )
    assert (spec.idle_timeout_ms, spec.partition_discovery_interval_ms) == (2_000, 60_000)


def test_from_source_refuses_what_is_not_a_source() -> None:
    env = Environment("j")
    with pytest.raises(JobDefinitionError, match=r"^operator 'src': from_source takes a source built by its connector"):
        env.from_source(KafkaSource.builder().topic("t"), uid="src")  # type: ignore[arg-type]
    assert not env.graph.transformations
