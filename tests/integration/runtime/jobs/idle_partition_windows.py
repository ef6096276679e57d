"""Event-time windows over an unbounded Kafka source whose partitions may be empty (source idleness).

Input: topic ``-D source.topic=``, JSON ``{"key": str, "ts": int}`` with ``ts`` the event time in
epoch ms. Output: ``{"key", "window_start", "window_end", "count"}`` per key and tumbling window of
``-D window.size_ms=`` (default 1000) to topic ``-D sink.topic=``, at least once: each result is
produced as its window fires, with no checkpoint or transaction to wait for.

``-D source.idle_timeout_ms=`` (default 1000; 0: no idleness) marks a partition idle after that long
without records, so an empty partition does not hold the watermark (and every window) back.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import Environment, TumblingEventTimeWindows


class Count:
    def create(self) -> int:
        return 0

    def add(self, acc: int, _event: dict[str, Any]) -> int:
        return acc + 1

    def result(self, key: str, window_start: int, window_end: int, acc: int) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc}


def build(env: Environment) -> None:
    p = env.params
    idle_timeout_ms = p.get_int("source.idle_timeout_ms", 1000)
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        uid="events-source",
        deserializer=json.loads,
        timestamp=lambda e: e["ts"],
        idle_timeout_ms=idle_timeout_ms or None,
    )
    counts = (
        events.key_by(lambda e: e["key"])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)))
        .aggregate(Count(), uid="window-count")
    )
    counts.sink_to_kafka(
        p.get_str("sink.topic", "window-counts"), uid="kafka-sink", key=lambda r: r["key"], delivery="at_least_once"
    )
