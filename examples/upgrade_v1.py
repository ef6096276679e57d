"""Version 1 of the upgrade scenario's job (``make scenario-upgrade``, examples/upgrade_v2.py is version 2).

The seed's keyed aggregation: events -> keyed tumbling event-time windows of (count, sum) -> a Kafka
transactional sink and a PostgreSQL two-phase-commit sink. Every result says which version of the job
produced it, ``"v": 1``. Every operator has a stable uid: version 2 keeps those of the source, the
window and both sinks, so it resumes from a savepoint of this job.

Input: topic ``upgrade-events`` (``-D source.topic=``), JSON ``{"id": str, "key": str, "value": int,
"ts": int}`` with ``ts`` in epoch milliseconds as event time; a record that is not such an event goes
to ``upgrade-dlq`` (``-D source.dlq_topic=``) with the reason.

Output, per key and window of ``-D window.size_ms=`` (default 1000): ``{"key", "window_start",
"window_end", "count", "sum", "v": 1}`` to topic ``upgrade-results`` (``-D sink.topic=``) and the same
columns to the PostgreSQL table ``upgrade_results`` (``-D sink.table=``), keyed by ``(key,
window_start)``. Both versions write the one table, created before version 1 runs with the columns
of both::

    CREATE TABLE upgrade_results (key text, window_start bigint, window_end bigint, count bigint,
        sum bigint, max bigint, v smallint NOT NULL, PRIMARY KEY (key, window_start))

Version 1 leaves ``max`` null; ``v`` tells the versions' rows apart.

``-D source.bounded=true`` reads up to the end offsets present at start, fires every window and
finishes; unbounded (the default), it runs until stopped (``weir stop JOB --savepoint-path DIR``).
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import Environment, TumblingEventTimeWindows

VERSION = 1
COLUMNS = ("key", "window_start", "window_end", "count", "sum", "v")


def parse_event(raw: bytes) -> dict[str, Any]:
    """One event, checked: a JSON object with a str ``key``, an int ``value`` and an int ``ts``."""
    event = json.loads(raw)
    if not (
        isinstance(event, dict)
        and type(event.get("key")) is str
        and type(event.get("value")) is int
        and type(event.get("ts")) is int
    ):
        raise ValueError("an event is a JSON object with a str key, an int value and an int ts")
    return event


class CountAndSum:
    """(count, sum) per key and window, over (key, value) pairs: the accumulator version 1 writes."""

    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], pair: tuple[str, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + pair[1])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {
            "key": key,
            "window_start": window_start,
            "window_end": window_end,
            "count": acc[0],
            "sum": acc[1],
            "v": VERSION,
        }


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "upgrade-events"),
        uid="events-source",
        bounded=p.get_bool("source.bounded", False),
        deserializer=parse_event,
        timestamp=lambda e: e["ts"],
        dead_letter_topic=p.get_str("source.dlq_topic", "upgrade-dlq"),
    )
    results = (
        events.map(lambda e: (e["key"], e["value"]), uid="key-value", name="project")
        .key_by(lambda pair: pair[0])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)))
        .aggregate(CountAndSum(), uid="window-count-sum")
    )
    results.sink_to_kafka(p.get_str("sink.topic", "upgrade-results"), uid="kafka-sink", key=lambda r: r["key"])
    results.sink_to_postgres(
        p.get_str("sink.table", "upgrade_results"),
        uid="postgres-sink",
        columns=COLUMNS,
        key_columns=("key", "window_start"),
    )
