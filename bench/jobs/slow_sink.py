"""The keyed aggregation behind a slow stage: memory must stay flat while the sink backpressures.

Kafka source (unbounded, ``-D source.topic=``) -> key_by -> 1 s tumbling count+sum -> rebalance ->
a map sleeping ``-D sink.delay_ms=`` (default 2) per window result -> discard. Window results are an
eighth of the input here, so the source is held to a fraction of what it could read.
"""

from __future__ import annotations

import json
import time
from typing import Any

from weir.api import Environment, TumblingEventTimeWindows


class CountAndSum:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], event: dict[str, Any]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + event["value"])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "count": acc[0], "sum": acc[1]}


def build(env: Environment) -> None:
    p = env.params
    delay_s = p.get_int("sink.delay_ms", 2) / 1000.0

    def slow(result: dict[str, Any]) -> dict[str, Any]:
        time.sleep(delay_s)
        return result

    events = env.from_kafka(
        p.get_str("source.topic", "events"), uid="events-source", deserializer=json.loads, timestamp=lambda e: e["ts"]
    )
    (
        events.key_by(lambda e: e["key"])
        .window(TumblingEventTimeWindows(1000))
        .aggregate(CountAndSum(), uid="window-count-sum")
        .rebalance()
        .map(slow, uid="slow-sink")
        .filter(lambda _r: False, uid="discard")
        .print(uid="sink")
    )
