"""One stream into both exactly-once sinks, unchanged: what ``weir scenario two-phase-commit`` watches.

A generator at ``-D source.rate=`` events per second (default 200, unbounded; ``-D source.count=`` to
bound it) produces ``{"id": i, "key": "k<i % 100>", "value": i % 97}``; every event goes to topic
``tpc-results`` (``-D sink.topic=``, keyed by ``key``) through the transactional Kafka sink and to
table ``tpc_results`` (``-D sink.table=``, columns id, key, value, primary key id) through the
two-phase PostgreSQL sink. Both sinks see the same records between the same barriers, so each
checkpoint's epoch holds the same events in both; their commits are still two separate commits.
"""

from __future__ import annotations

from typing import Any

from weir.api import Environment, GeneratorSource, KafkaSink, PostgresSink


def event(i: int) -> dict[str, Any]:
    return {"id": i, "key": f"k{i % 100}", "value": i % 97}


def event_key(e: dict[str, Any]) -> str:
    return str(e["key"])


def build(env: Environment) -> None:
    """With the connectors' builders (Flink's ``KafkaSink.builder()``); ``from_generator``,
    ``sink_to_kafka`` and ``sink_to_postgres`` with the same options make the same job."""
    p = env.params
    source = GeneratorSource(
        event, count=p.get_int("source.count", 0) or None, records_per_second=p.get_int("source.rate", 200)
    )
    events = env.from_source(source, uid="events")
    events.sink_to(
        KafkaSink.builder().topic(p.get_str("sink.topic", "tpc-results")).key(event_key).build(), uid="kafka-sink"
    )
    rows = (
        PostgresSink.builder()
        .table(p.get_str("sink.table", "tpc_results"))
        .columns(("id", "key", "value"))
        .key_columns(("id",))
        .build()
    )
    events.sink_to(rows, uid="postgres-sink")
