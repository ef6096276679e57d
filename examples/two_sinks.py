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

from weir.api import Environment


def event(i: int) -> dict[str, Any]:
    return {"id": i, "key": f"k{i % 100}", "value": i % 97}


def build(env: Environment) -> None:
    p = env.params
    events = env.from_generator(
        event,
        uid="events",
        count=p.get_int("source.count", 0) or None,
        records_per_second=p.get_int("source.rate", 200),
    )
    events.sink_to_kafka(p.get_str("sink.topic", "tpc-results"), uid="kafka-sink", key=lambda e: e["key"])
    events.sink_to_postgres(
        p.get_str("sink.table", "tpc_results"), uid="postgres-sink", columns=("id", "key", "value"), key_columns=("id",)
    )
