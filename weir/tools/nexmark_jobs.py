"""The input and output of the Nexmark example jobs (``examples/nexmark/``), in one place.

Input, ``-D source=``:

- ``generator`` (default): the Nexmark generator in the job (``weir.nexmark``), ``-D events=``
  events (default 1,000,000; 0: unbounded), ``-D events_per_second=`` of event time (10,000),
  ``-D seed=`` (0);
- ``kafka``: topic ``-D source.topic=`` (``nexmark``), loaded by ``python -m weir.tools.nexmark_load``;
  ``-D source.bounded=true`` reads up to the end offsets present at start; a record that is not a
  Nexmark event goes to ``-D source.dlq_topic=`` (``nexmark-dlq``).

Both: ``-D source.records_per_second=`` paces the source in wall time (default: as fast as it goes),
``-D source.max_out_of_orderness_ms=`` holds the watermark that far behind the latest event (each
query's default: 0 for the stateless ones, 4 s, Nexmark's ``WATERMARK ... - INTERVAL '4' SECOND``,
for the windowed and joined ones).

Output, ``-D sink=``: ``kafka`` (default, topic ``-D sink.topic=``, ``nexmark-<query>``) or ``file``
(``-D sink.path=``, ``nexmark-<query>.jsonl``), one JSON object per result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from weir import nexmark
from weir.api import DataStream, Environment
from weir.nexmark import NexmarkConfig


def events(env: Environment, out_of_orderness_ms: int = 0) -> DataStream:
    """The Nexmark events, from the generator or a Kafka topic (``-D source=``), with watermarks
    ``-D source.max_out_of_orderness_ms=`` (default ``out_of_orderness_ms``) behind the latest event."""
    p = env.params
    source = p.get_str("source", "generator")
    delay = p.get_int("source.max_out_of_orderness_ms", out_of_orderness_ms)
    pace = p.get_int("source.records_per_second", 0) or None
    if source == "kafka":
        return env.from_kafka(
            p.get_str("source.topic", "nexmark"),
            uid="nexmark-source",
            bounded=p.get_bool("source.bounded", False),
            deserializer=nexmark.decode_event,
            timestamp=nexmark.event_time,
            max_out_of_orderness_ms=delay,
            dead_letter_topic=p.get_str("source.dlq_topic", "nexmark-dlq"),
            records_per_second=pace,
        )
    if source != "generator":
        raise ValueError(f"-D source= is generator or kafka, not {source!r}")
    config = NexmarkConfig(events_per_second=p.get_int("events_per_second", 10_000), seed=p.get_int("seed", 0))
    return env.from_generator(
        lambda n: nexmark.event(n, config),
        uid="nexmark-source",
        count=p.get_int("events", 1_000_000) or None,
        timestamp=nexmark.event_time,
        max_out_of_orderness_ms=delay,
        records_per_second=pace,
    )


def sink(
    env: Environment, results: DataStream, query: str, key: Callable[[Any], bytes | str | None] | None = None
) -> None:
    """To a Kafka topic or a file (``-D sink=``). ``key``: the Kafka record key, for an updating
    query its row's key, so that each row's updates land in one partition, in order (as Flink's
    upsert-kafka sink writes them)."""
    p = env.params
    if p.get_str("sink", "kafka") == "file":
        results.sink_to_file(p.get_str("sink.path", f"nexmark-{query}.jsonl"), uid="file-sink")
    else:
        results.sink_to_kafka(p.get_str("sink.topic", f"nexmark-{query}"), uid="kafka-sink", key=key)
