"""Inputs of the Nexmark example jobs in reference mode, shared by their tests: a topic loaded by
``weir.tools.nexmark_load`` over partitions (injected: no broker), a topic of crafted events, and a
Kafka input that must not be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weir import nexmark as nx
from weir.tools.nexmark_load import records
from weir.tools.reference import KafkaInput, KafkaRecord, run_reference

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "nexmark"


def loaded_topic(events: int, partitions: int, config: nx.NexmarkConfig) -> KafkaInput:
    """Topic ``nexmark`` as the loader writes ``events`` events over ``partitions``, read partition by
    partition."""
    by_partition: dict[int, list[KafkaRecord]] = {}
    for r in records(0, events, partitions, config):
        offsets = by_partition.setdefault(r.partition, [])
        offsets.append(KafkaRecord(r.partition, len(offsets), r.key, r.value, 0))

    def read(topic: str) -> list[KafkaRecord]:
        assert topic == "nexmark"
        return [record for p in sorted(by_partition) for record in by_partition[p]]

    return read


def no_kafka(topic: str) -> list[KafkaRecord]:
    raise AssertionError(f"the job read Kafka topic {topic!r}")


def run_on_topic(query: str, events: list[nx.Event], params: dict[str, str] | None = None) -> Any:
    """The reference run of ``examples/nexmark/<query>.py`` over ``events`` read in this order from a
    one-partition topic (no record dead-lettered)."""

    def topic(name: str) -> list[KafkaRecord]:
        return [KafkaRecord(0, offset, None, nx.encode_event(e), 0) for offset, e in enumerate(events)]

    result = run_reference(EXAMPLES / f"{query}.py", {"source": "kafka", **(params or {})}, kafka_input=topic)
    assert result.dead_lettered == 0
    return result
