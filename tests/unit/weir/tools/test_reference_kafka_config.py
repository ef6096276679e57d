"""Reference mode (and so ``weir verify``) reads a Kafka source's topic as the job's tasks read it:
with the job's ``-D kafka.*`` settings and the source's own ``properties`` over them; and it knows
each Kafka sink's own settings, which ``weir verify`` reads the sink's topic with. Kafka faked."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from weir.connectors import kafka
from weir.core.kafka_config import KafkaClientConfig
from weir.tools.reference import run_reference_source

JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        events = env.from_kafka("events", uid="src", bounded=True, properties={"sasl.username": "reader"})
        events.sink_to_kafka("out", uid="sink", properties={"sasl.username": "writer"})
    """
)
PARAMETERS = {"kafka.bootstrap.servers": "secured:9093", "kafka.sasl.password": "${env:KAFKA_PASSWORD}"}


def test_a_source_topic_is_read_with_the_jobs_settings_and_the_sources_own(monkeypatch: pytest.MonkeyPatch) -> None:
    read_with: list[tuple[str, Any]] = []

    def partition_count(target: Any, topic: str, timeout_s: float = 10.0) -> int:
        read_with.append((topic, target))
        return 1

    def committed_records(target: Any, topic: str, timeout_s: float = 60.0) -> list[tuple[Any, ...]]:
        read_with.append((topic, target))
        return [(0, 0, None, json.dumps({"n": 1}).encode(), 5)]

    monkeypatch.setattr(kafka, "topic_partition_count", partition_count)
    monkeypatch.setattr(kafka, "read_committed_records", committed_records)
    result = run_reference_source(JOB, PARAMETERS)

    source = KafkaClientConfig(
        "secured:9093", (("sasl.password", "${env:KAFKA_PASSWORD}"), ("sasl.username", "reader"))
    )
    assert read_with == [("events", source), ("events", source)]
    assert result["sink"] == [{"n": 1}]
    assert result.sinks["sink"].description.kafka_properties == (("sasl.username", "writer"),)
