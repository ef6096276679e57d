"""examples/keyed_aggregation.py with the Kafka sink only: the Weir side of the fair pair with Quix
Streams (whose PostgreSQL sink is at-least-once, so both write to Kafka only).

Same parameters as the example: ``-D source.topic=``, ``source.bounded=``, ``source.dlq_topic=``,
``sink.topic=``, ``window.size_ms=``. The sink is ``sink_to_kafka``'s default (exactly-once).
"""

from __future__ import annotations

from typing import Any

from weir.api import Environment, TumblingEventTimeWindows


def parse_event(raw: bytes) -> dict[str, Any]:
    import json

    event = json.loads(raw)
    if not isinstance(event, dict):
        raise ValueError("event is not a JSON object")
    for field, kind in (("id", str), ("key", str), ("value", int), ("ts", int)):
        if not isinstance(event.get(field), kind) or isinstance(event.get(field), bool):
            raise ValueError(f"field {field!r} must be {kind.__name__}")
    return event


class CountAndSum:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], event: dict[str, Any]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + event["value"])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        uid="events-source",
        bounded=p.get_bool("source.bounded", False),
        deserializer=parse_event,
        timestamp=lambda e: e["ts"],
        dead_letter_topic=p.get_str("source.dlq_topic", "events-dlq"),
    )
    (
        events.key_by(lambda e: e["key"])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)))
        .aggregate(CountAndSum(), uid="window-count-sum")
        .sink_to_kafka(p.get_str("sink.topic", "window-results"), uid="kafka-sink", key=lambda r: r["key"])
    )
