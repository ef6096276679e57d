"""Every Kafka client a job's operators make reaches the cluster with the job's settings (its
``-D kafka.*`` parameters, as ``ctx.parameters`` carries them) and the connector's own over them: the
source's consumer and dead-letter producer, the at-least-once sink's producer, the exactly-once
sink's clients (at run time and in the JobManager's end-of-job resolution), the operators' dead
letters. Kafka is faked: each client's maker records the configuration it was given."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import Environment
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.descriptors import KafkaSourceSpec
from weir.core.kafka_config import KafkaClientConfig
from weir.jobmanager.ending import resolve_sink_transactions
from weir.jobmanager.records import JobSubmission
from weir.operators import sinks, sources, transactional_sinks
from weir.operators.rejections import KafkaDeadLetters
from weir.operators.sinks import KafkaSinkOperator
from weir.operators.sources import KafkaSourceOperator
from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator
from weir.plan import build_plan

PARAMETERS = {
    "kafka.bootstrap.servers": "secured:9093",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.password": "${env:KAFKA_PASSWORD}",
    "source.topic": "events",  # not a Kafka setting
}
JOB = KafkaClientConfig("secured:9093", (("sasl.password", "${env:KAFKA_PASSWORD}"), ("security.protocol", "SASL_SSL")))


class Reached(Exception):
    """Raised by a faked client maker once it recorded what it was given: the test looks no further."""


class Recorder:
    def __init__(self) -> None:
        self.targets: list[tuple[str, Any]] = []

    def __call__(self, name: str, *, stop: bool = False, answer: Any = None) -> Any:
        def record(target: Any, *args: Any, **kwargs: Any) -> Any:
            self.targets.append((name, target))
            if stop:
                raise Reached(name)
            return answer

        return record


class FakeReader:
    def partition_count(self) -> int:
        return 1

    def end_offset(self, partition: int) -> int:
        return 0

    def assign(self, next_offsets: Any) -> None:
        pass

    def cached_high_watermark(self, partition: int) -> int:
        return 0


def test_the_source_reads_and_dead_letters_with_the_jobs_settings_and_its_own(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(sources.kafka, "partition_count", recorder("partition_count", answer=1))
    monkeypatch.setattr(sources.kafka, "PartitionReader", recorder("reader", answer=FakeReader()))
    monkeypatch.setattr(sources.kafka, "producer", recorder("dead-letter producer", answer=object()))
    spec = KafkaSourceSpec(
        topic="events",
        bounded=False,
        deserializer=json.loads,
        timestamp=None,
        max_out_of_orderness_ms=0,
        dead_letter_topic="events-dlq",
        properties=(("client.id", "events"), ("sasl.username", "reader")),
    )
    source = KafkaSourceOperator(spec)
    source.setup(dataclasses.replace(make_context("events-source"), parameters=PARAMETERS), CollectingOutput())
    source.open()
    own = JOB.merged([("client.id", "events"), ("sasl.username", "reader")])
    assert recorder.targets == [("partition_count", own), ("reader", own), ("dead-letter producer", own)]


def test_the_at_least_once_sink_produces_with_the_jobs_settings_and_its_own(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(sinks.kafka, "producer", recorder("producer", stop=True))
    sink = KafkaSinkOperator("out", str.encode, None, properties=(("client.id", "out"),))
    sink.setup(dataclasses.replace(make_context("sink"), parameters=PARAMETERS), CollectingOutput())
    with pytest.raises(Reached):
        sink.open()
    assert recorder.targets == [("producer", JOB.merged([("client.id", "out")]))]


def test_the_exactly_once_sink_and_its_marker_topic_use_the_jobs_settings_and_its_own(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(transactional_sinks.kafka, "partition_count", recorder("partition_count", answer=1))
    monkeypatch.setattr(transactional_sinks.kafka, "lookup_topic", recorder("marker topic lookup", stop=True))
    sink = TransactionalKafkaSinkOperator("out", str.encode, None, properties=(("sasl.username", "writer"),))
    sink.setup(dataclasses.replace(make_context("sink"), parameters=PARAMETERS), CollectingOutput())
    with pytest.raises(Reached):
        sink.open()
    own = JOB.merged([("sasl.username", "writer")])
    assert recorder.targets == [("partition_count", own), ("marker topic lookup", own)]


def test_the_end_of_job_resolution_builds_the_sinks_with_the_jobs_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    monkeypatch.setattr(transactional_sinks.kafka, "partition_count", recorder("partition_count", stop=True))
    env = Environment("j", PARAMETERS, parallelism=1)
    env.from_collection([1], uid="src").sink_to_kafka("out", uid="sink", properties={"client.id": "out"})
    submission = JobSubmission("job-1", "j", "j.py", b"", PARAMETERS, 1, 0.0)
    with pytest.raises(Reached):
        resolve_sink_transactions(env.graph, build_plan(env.graph), submission, 2, None)
    assert recorder.targets == [("partition_count", JOB.merged([("client.id", "out")]))]


def test_the_operators_dead_letters_go_to_the_jobs_cluster_with_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    monkeypatch.setattr(kafka, "topic_partition_count", recorder("topic lookup", answer=1))
    monkeypatch.setattr(kafka, "producer", recorder("producer", stop=True))
    letters = KafkaDeadLetters(PARAMETERS)
    with pytest.raises(Reached):
        letters.send("parse-dlq", None, b"{}")
    assert recorder.targets == [("topic lookup", JOB), ("producer", JOB)]
    assert kafka.cluster_config(Endpoints.from_env()) == KafkaClientConfig(Endpoints.from_env().kafka_bootstrap)
