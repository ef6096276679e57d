"""A bounded generator into a slow task holding both exactly-once sinks: backpressure at the end of input.

``-D source.count=`` events ``{"id": i, "key": "k<i % 100>", "value": i % 97}`` from an unthrottled
generator, rebalanced into one task (``-D sink.records_per_second=`` per subtask, default 4000) that
paces them and writes each to topic ``-D sink.topic=`` (exactly-once, keyed by ``key``) and to table
``-D sink.table=`` (two-phase commit, columns id, key, value, primary key id). The pacer fills the
task's input queue and the generator's output queue, so when the generator ends, records are still
in flight ahead of the final checkpoint's barrier.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from weir.api import Environment


def event(i: int) -> dict[str, Any]:
    return {"id": i, "key": f"k{i % 100}", "value": i % 97}


class Pace:
    """At most ``rate`` records per second per task thread, as a slow external system would take them."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next: dict[int, float] = {}
        self._lock = threading.Lock()

    def __call__(self, value: dict[str, Any]) -> dict[str, Any]:
        if self._interval:
            thread, now = threading.get_ident(), time.monotonic()
            with self._lock:
                slot = max(self._next.get(thread, now), now)
                self._next[thread] = slot + self._interval
            if slot > now:
                time.sleep(slot - now)  # the slow external system's write time
        return value


def build(env: Environment) -> None:
    p = env.params
    events = env.from_generator(event, uid="events", count=p.get_int("source.count", 20_000))
    paced = events.rebalance().map(Pace(p.get_int("sink.records_per_second", 4000)), uid="pace", name="slow write")
    paced.sink_to_kafka(p.get_str("sink.topic", "slow-results"), uid="kafka-sink", key=lambda e: e["key"])
    paced.sink_to_postgres(
        p.get_str("sink.table", "slow_results"),
        uid="postgres-sink",
        columns=("id", "key", "value"),
        key_columns=("id",),
    )
