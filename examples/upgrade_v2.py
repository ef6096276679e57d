"""Version 2 of the upgrade scenario's job (``make scenario-upgrade``): examples/upgrade_v1.py, changed,
resumed from a savepoint of version 1 (``weir run examples/upgrade_v2.py --from-savepoint PATH -p 3``).

What changed, and how it stays restorable:

- **The aggregate adds a max**: the window accumulator is (count, sum, max), declared
  ``state_version=2`` with a migration from version 1's (count, sum): ``(count, sum) -> (count, sum,
  None)``. Version 1 kept no max, so the max of a window it had begun is unknown, and stays unknown:
  ``max`` is null in the result of every window that holds events version 1 aggregated (a window
  open at the savepoint), and the max of its values in every window version 2 aggregated alone. (An
  accumulator with a count above 0 and no max is exactly one migrated from version 1.)
- **A filter**: events with a negative ``value`` are dropped before the window (new uid
  ``drop-negative``; a filter has no state, so nothing of it is in the savepoint). It applies to what
  version 2 reads, after the savepoint; what version 1 counted before it stays counted.
- **Results say ``"v": 2``** and carry ``max``; the PostgreSQL table has both columns from the start
  (see examples/upgrade_v1.py), so the rows of both versions sit in one table.
- The uids of the source (``events-source``, its Kafka positions), the projection, the window
  (``window-count-sum``, its accumulators and watermark) and both sinks are version 1's. The
  parallelism may differ: keyed state moves by key group.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import Environment, TumblingEventTimeWindows

VERSION = 2
COLUMNS = ("key", "window_start", "window_end", "count", "sum", "max", "v")

Accumulator = tuple[int, int, int | None]


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


def keep(event: dict[str, Any]) -> bool:
    """Version 2's filter: negative values are not counted any more."""
    return event["value"] >= 0  # type: ignore[no-any-return]


class CountSumMax:
    """(count, sum, max) per key and window; max None with a count above 0: not known (migrated)."""

    def create(self) -> Accumulator:
        return (0, 0, None)

    def add(self, acc: Accumulator, pair: tuple[str, int]) -> Accumulator:
        count, total, top = acc
        value = pair[1]
        if count == 0:
            top = value
        elif top is not None:
            top = max(top, value)
        return (count + 1, total + value, top)

    def result(self, key: str, window_start: int, window_end: int, acc: Accumulator) -> dict[str, Any]:
        return {
            "key": key,
            "window_start": window_start,
            "window_end": window_end,
            "count": acc[0],
            "sum": acc[1],
            "max": acc[2],
            "v": VERSION,
        }


def from_v1(stored_version: int, acc: Any) -> Accumulator:
    """Version 1's (count, sum) accumulator as version 2's, its max unknown."""
    if stored_version != 1:
        raise ValueError(f"no migration from accumulator version {stored_version}")
    count, total = acc
    return (count, total, None)


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
        events.filter(keep, uid="drop-negative", name="drop negative values")
        .map(lambda e: (e["key"], e["value"]), uid="key-value", name="project")
        .key_by(lambda pair: pair[0])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)))
        .aggregate(CountSumMax(), uid="window-count-sum", state_version=2, migrate=from_v1)
    )
    results.sink_to_kafka(p.get_str("sink.topic", "upgrade-results"), uid="kafka-sink", key=lambda r: r["key"])
    results.sink_to_postgres(
        p.get_str("sink.table", "upgrade_results"),
        uid="postgres-sink",
        columns=COLUMNS,
        key_columns=("key", "window_start"),
    )
