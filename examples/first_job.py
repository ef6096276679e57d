"""A first job: per key and one-second window of event time, the count and sum of the events' values,
written exactly once to Kafka and to PostgreSQL.

Input: topic ``events``, JSON ``{"id": str, "key": str, "value": int, "ts": int}`` with ``ts`` the
event time in epoch milliseconds; a record that is not JSON goes to ``events-dlq`` with the reason.
Output: ``{"key", "window_start", "window_end", "count", "sum"}`` to topic ``window-results`` and to
the table ``window_results`` keyed by ``(key, window_start)``: the demo's topics and table, which
``docker compose up``, ``make demo`` and ``python -m weir.tools.prepare`` create.
``-D source.bounded=true`` reads up to the end offsets present at the start, fires every window and
finishes.
"""

from __future__ import annotations

from typing import Any

from weir.api import Environment, TumblingEventTimeWindows


class CountAndSum:
    """An aggregate function (Flink's ``AggregateFunction``): one accumulator per key and window,
    updated by each event, turned into the window's result when the watermark passes its end."""

    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], event: dict[str, Any]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + event["value"])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


def build(env: Environment) -> None:
    events = env.from_kafka(
        "events",
        uid="events-source",
        timestamp=lambda e: e["ts"],
        dead_letter_topic="events-dlq",
        bounded=env.params.get_bool("source.bounded", False),
    )
    results = (
        events.key_by(lambda e: e["key"])
        .window(TumblingEventTimeWindows(1000))
        .aggregate(CountAndSum(), uid="window-count-sum")
    )
    results.sink_to_kafka("window-results", uid="kafka-sink", key=lambda r: r["key"])
    results.sink_to_postgres(
        "window_results",
        uid="postgres-sink",
        columns=("key", "window_start", "window_end", "count", "sum"),
        key_columns=("key", "window_start"),
    )
