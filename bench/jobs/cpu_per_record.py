"""A CPU-bound job without external systems: generator -> map with a fixed amount of Python work per
record -> key_by -> 1 s tumbling count+sum -> discard.

``make bench-slots`` runs it on one TaskManager with 1 slot at parallelism 1 and with 2 slots at
parallelism 2 (``bench/slots_bench.py``). The map's work is a loop of ``-D work=`` (default 300)
integer steps, about 10-20 us of one core per record here, so the job's rate is bound by the cores
its slots get; the key_by crosses between the slots (between slot workers, with slot processes).
Parameters: ``-D events=`` (default 400000), ``-D work=``, ``-D keys=`` (1000).
"""

from __future__ import annotations

from typing import Any

from weir.api import Environment, TumblingEventTimeWindows

START_MS = 1_700_000_000_000
EVENTS_PER_MS = 10


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
    work = p.get_int("work", 300)

    def generate(i: int) -> dict[str, Any]:
        return {"id": i, "key": f"key-{i % keys:04d}", "value": i % 97, "ts": START_MS + i // EVENTS_PER_MS}

    def burn(event: dict[str, Any]) -> dict[str, Any]:
        x = event["id"]
        for _ in range(work):
            x = (x * 31 + 7) % 1_000_003
        return {**event, "value": event["value"] + x % 2}

    events = env.from_generator(generate, uid="generator", count=p.get_int("events", 400_000), timestamp=_ts)
    (
        events.map(burn, uid="work")
        .key_by(_key)
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
