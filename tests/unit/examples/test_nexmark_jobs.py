"""examples/nexmark/q0-q2 in reference mode output exactly what the plain-Python queries output, from
the generator and from a topic loaded by weir.tools.nexmark_load (injected: no broker)."""

from __future__ import annotations

import json

import pytest

from tests.unit.examples.nexmark_inputs import EXAMPLES, loaded_topic, no_kafka
from weir import nexmark as nx
from weir.core import json_codec
from weir.core.errors import JobDefinitionError
from weir.tools import nexmark_reference as ref
from weir.tools.reference import KafkaRecord, ReferenceModeError, run_reference

EVENTS = 5_000  # 4,600 bids; q2 keeps those on auctions 1107, 1230, ...
QUERIES = {"q0": ref.q0, "q1": ref.q1, "q2": ref.q2}


@pytest.fixture(scope="module")
def events() -> list[nx.Event]:
    return [nx.event(n) for n in range(EVENTS)]


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_generator_job_outputs_the_reference(query: str, events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / f"{query}.py", {"events": str(EVENTS)}, kafka_input=no_kafka)
    expected = QUERIES[query](events)
    assert expected
    assert result["kafka-sink"] == expected
    capture = result.sinks["kafka-sink"]
    assert capture.description.target == f"nexmark-{query}"
    assert capture.serialized_values() == [json_codec.encode(row) for row in expected]
    assert result.sources["nexmark-source"].records == EVENTS


def test_q1_writes_euros_as_the_exact_decimal(events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / "q1.py", {"events": "500"}, kafka_input=no_kafka)
    written = [json.loads(v, parse_float=str)["price"] for v in result.sinks["kafka-sink"].serialized_values()]
    cents = [b.price for b in ref.bids(events[:500])]
    assert written == [_decimal(c * 908) for c in cents]


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_kafka_job_outputs_the_reference(query: str, events: list[nx.Event]) -> None:
    topic = loaded_topic(EVENTS, 1, nx.DEFAULT_CONFIG)
    result = run_reference(EXAMPLES / f"{query}.py", {"source": "kafka", "source.bounded": "true"}, kafka_input=topic)
    assert result["kafka-sink"] == QUERIES[query](events)
    assert result.dead_lettered == 0


def test_the_kafka_job_over_partitions_outputs_the_reference_multiset(events: list[nx.Event]) -> None:
    result = run_reference(
        EXAMPLES / "q2.py", {"source": "kafka"}, kafka_input=loaded_topic(EVENTS, 3, nx.DEFAULT_CONFIG)
    )
    assert ref.multiset(result["kafka-sink"]) == ref.multiset(ref.q2(events))


def test_a_record_that_is_not_an_event_is_dead_lettered() -> None:
    def topic(name: str) -> list[KafkaRecord]:
        good = nx.event_json(4)
        return [KafkaRecord(0, 0, None, b'{"event_type": 7}', 0), KafkaRecord(0, 1, None, good, 0)]

    result = run_reference(EXAMPLES / "q0.py", {"source": "kafka"}, kafka_input=topic)
    assert result["kafka-sink"] == ref.q0([nx.event(4)])
    assert result.dead_lettered == 1


def test_the_file_sink_variant() -> None:
    result = run_reference(EXAMPLES / "q2.py", {"events": "2000", "sink": "file", "sink.path": "/tmp/q2"})
    capture = result.sinks["file-sink"]
    assert (capture.description.kind, capture.description.target) == ("file", "/tmp/q2")
    assert capture.values == ref.q2([nx.event(n) for n in range(2000)])


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(JobDefinitionError, match="generator or kafka"):
        run_reference(EXAMPLES / "q0.py", {"source": "files"})


def test_an_unbounded_generator_cannot_run_in_reference_mode() -> None:
    with pytest.raises(ReferenceModeError, match="count"):
        run_reference(EXAMPLES / "q0.py", {"events": "0"})


def _decimal(thousandths: int) -> str:
    """A JSON number with up to 3 decimals, as the shortest form writes it."""
    whole, frac = divmod(thousandths, 1000)
    return f"{whole}.{f'{frac:03d}'.rstrip('0') or '0'}"
