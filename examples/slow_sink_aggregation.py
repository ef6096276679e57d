"""The keyed aggregation with a slow transactional sink: what ``make scenario-backpressure`` runs.

The same pipeline as examples/keyed_aggregation.py (Kafka events -> keyed tumbling event-time windows,
count and sum per key and window) into the exactly-once Kafka sink (``-D sink.topic=``), but the sink
writes at most ``-D sink.records_per_second=`` results per second per sink subtask (default 50; 0: no
limit), as a slow external system would. The limit is a pacer chained in front of the sink, in the
sink's own task (window -> pacer -> sink is one chain): the task thread spends the write time there,
so the input channels fill, credits run out and the sources are backpressured, exactly as if the
sink's writes were slow; the sink's transactions (one per checkpoint, committed on completion) are
not touched, so the sink stays exactly once. Each result carries ``written_ms``, the wall-clock time
the sink took it, from which the scenario measures the sink's rate and each result's latency
(``written_ms - window_end``: the input's event time is the time it was produced).

Input: topic ``events`` (``-D source.topic=``), JSON ``{"id", "key", "value", "ts"}`` as the keyed
aggregation's. ``-D window.size_ms=`` (default 1000).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from weir.api import Environment, TumblingEventTimeWindows


def parse_event(raw: bytes) -> dict[str, Any]:
    event = json.loads(raw.decode("utf-8"))
    if not isinstance(event, dict) or type(event.get("key")) is not str or type(event.get("value")) is not int:
        raise ValueError("event must be a JSON object with str key and int value")
    if type(event.get("ts")) is not int:
        raise ValueError("field 'ts' must be int")
    return event


class CountAndSum:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], pair: tuple[str, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + pair[1])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


class SlowWrite:
    """At most ``rate`` records per second per task thread (each subtask runs on its own thread, so
    one instance shared by the subtasks of a process still paces each alone); stamps ``written_ms``."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next: dict[int, float] = {}
        self._lock = threading.Lock()

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        if self._interval:
            thread = threading.get_ident()
            now = time.monotonic()
            with self._lock:
                slot = max(self._next.get(thread, now), now)
                self._next[thread] = slot + self._interval
            if slot > now:
                time.sleep(slot - now)  # the slow external system's write time
        return {**result, "written_ms": int(time.time() * 1000)}


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
        events.map(lambda e: (e["key"], e["value"]), uid="key-value", name="project")
        .key_by(lambda pair: pair[0])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)))
        .aggregate(CountAndSum(), uid="window-count-sum")
        .map(SlowWrite(p.get_int("sink.records_per_second", 50)), uid="slow-write", name="slow sink write")
        .sink_to_kafka(p.get_str("sink.topic", "window-results"), uid="kafka-sink", key=lambda r: r["key"])
    )
