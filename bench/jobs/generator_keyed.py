"""The keyed job without external systems: generator -> key_by -> 1 s tumbling count+sum -> discard.

``make bench-exchange`` runs it at parallelism 3 to see what the whole data plane (source, hash
exchange between TaskManagers, keyed window state in RocksDB) sustains. Parameters:
``-D events=`` (default 300000), ``-D keys=`` (1000), ``-D events_per_ms=`` (10: 10,000 events per
second of event time, so each key's window holds 10 events).
"""

from __future__ import annotations

from typing import Any

from weir.api import Environment, TumblingEventTimeWindows

START_MS = 1_700_000_000_000


class CountAndSum:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], event: dict[str, Any]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + event["value"])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


def build(env: Environment) -> None:
    p = env.params
    keys = p.get_int("keys", 1000)
    per_ms = p.get_int("events_per_ms", 10)

    def generate(i: int) -> dict[str, Any]:
        return {"id": f"e{i}", "key": f"key-{i % keys:04d}", "value": i % 97, "ts": START_MS + i // per_ms}

    events = env.from_generator(generate, uid="generator", count=p.get_int("events", 300_000), timestamp=_ts)
    (
        events.key_by(_key)
        .window(TumblingEventTimeWindows(1000))
        .aggregate(CountAndSum(), uid="window-count-sum")
        .filter(_discard, uid="discard")
        .print(uid="sink")
    )


def _ts(event: dict[str, Any]) -> int:
    return int(event["ts"])


def _key(event: dict[str, Any]) -> str:
    return str(event["key"])


def _discard(_result: Any) -> bool:
    return False
