"""Async I/O under test: each event is enriched by an HTTP lookup (``stream.async_map``), then
counted and summed per key in tumbling event-time windows into both exactly-once sinks.

Input: topic ``-D source.topic=`` of examples/keyed_aggregation.py's events. The lookup
``GET {enrich.url}/weight?key=K`` answers the key's weight (the test's service, with random latency);
the window sums ``value * weight``. ``-D enrich.ordered=false`` runs the lookups unordered.
"""

from __future__ import annotations

from typing import Any

import httpx

from weir.api import Environment, TumblingEventTimeWindows, json_deserializer


class CountAndSum:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], pair: tuple[str, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + pair[1])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


class WeightLookup:
    """The key's weight from the service. Each subtask runs its own copy; its HTTP client is made in
    ``open`` and closed in ``close``, on the subtask's event loop."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        self._client = httpx.AsyncClient(base_url=self._url, timeout=10.0)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def __call__(self, event: dict[str, Any]) -> tuple[str, int]:
        assert self._client is not None, "open() makes the client"
        response = await self._client.get("/weight", params={"key": event["key"], "id": event["id"]})
        response.raise_for_status()
        return (event["key"], event["value"] * int(response.text))


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        uid="events-source",
        deserializer=json_deserializer,
        timestamp=lambda e: e["ts"],
        bounded=p.get_bool("source.bounded", False),
        records_per_second=p.get_int("source.records_per_second", 0) or None,
    )
    results = (
        events.async_map(
            WeightLookup(p.get_str("enrich.url", "http://127.0.0.1:8080")),
            uid="enrich",
            capacity=p.get_int("enrich.capacity", 32),
            timeout_ms=p.get_int("enrich.timeout_ms", 60_000),
            ordered=p.get_bool("enrich.ordered", True),
        )
        .key_by(lambda pair: pair[0])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)))
        .aggregate(CountAndSum(), uid="window-count-sum")
    )
    results.sink_to_kafka(p.get_str("sink.topic", "window-results"), uid="kafka-sink", key=lambda r: r["key"])
    results.sink_to_postgres(
        p.get_str("sink.table", "window_results"),
        uid="postgres-sink",
        columns=("key", "window_start", "window_end", "count", "sum"),
        key_columns=("key", "window_start"),
    )
