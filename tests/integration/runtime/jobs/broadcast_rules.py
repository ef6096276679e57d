"""Broadcast state under test: versioned factors per key, broadcast to every subtask from a bounded
rules stream, scale each event's value; the scaled values are counted and summed per key in
tumbling event-time windows into both exactly-once sinks.

A rule is ``(key, valid_from, factor)`` with event time ``valid_from``; the broadcast state keeps
every version of a key's factor, and an event takes the latest version valid at its timestamp. The
first batch (valid from 0) covers every key; with ``rules.change_at_ms`` > 0 a second batch, valid
from that event time, changes every fifth key's factor mid-run (``rules.records_per_second`` paces
the rules so that it arrives while events flow; ``rules.apply_delay_ms`` makes applying each rule slow,
so that rules queue in the channels and an unaligned barrier overtakes them; four times slower in the
subtask that handles ``rules.lagging_key``'s events, so that its copy lags behind the others').

Each event waits in its key's state for an event-time timer at its time: the timer fires once the
rules' watermark passed it too, so every rule valid at that time has arrived and the output does
not depend on how the two inputs interleave (the reference run's and the cluster's are the same).
The rules stream ends early: after a restore only the checkpointed broadcast state still knows the
factors.
"""

from __future__ import annotations

import time
from typing import Any

from weir.api import Environment, KeyedBroadcastProcessFunction, TumblingEventTimeWindows, json_deserializer

KEYS = 400


class CountAndSum:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], pair: tuple[str, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + pair[1])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


class ScaleByRule(KeyedBroadcastProcessFunction):
    def __init__(self, apply_delay_ms: int = 0, lagging_key: str = "") -> None:
        self._apply_delay_s = apply_delay_ms / 1000
        self._lagging_key = lagging_key
        self._lagging = False  # this subtask handles the lagging key's events: it applies rules 4x slower

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        if self._apply_delay_s:
            # A slow rule update: the rules queue in the channels behind it (timing only, never the result).
            time.sleep(self._apply_delay_s * (4 if self._lagging else 1))
        key, valid_from, factor = value
        factors = ctx.broadcast_state("factors")
        versions = [v for v in factors.get(key) or [] if v[0] != valid_from]
        factors.put(key, sorted([*versions, [valid_from, factor]]))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        self._lagging = self._lagging or value["key"] == self._lagging_key
        ctx.list_state("waiting").add((ctx.timestamp, value["key"], value["value"]))
        ctx.timer_service().register_event_time_timer(ctx.timestamp)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        """The events due by ``timestamp`` go out at their own time; later ones wait for their timer."""
        factors = ctx.broadcast_state("factors")
        waiting = ctx.list_state("waiting")
        later = []
        for ts, key, value in waiting.get():
            if ts > timestamp:
                later.append((ts, key, value))
                continue
            valid = [factor for valid_from, factor in factors.get(key) or [] if valid_from <= ts]
            if not valid:
                raise ValueError(f"no factor for {key!r} at {ts}: the broadcast state lost it")
            out.collect((key, value * valid[-1]), ts)
        waiting.update(later)


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
    change_at = p.get_int("rules.change_at_ms", 0)
    first = [(f"key-{k:04d}", 0, k % 7 + 1) for k in range(KEYS)]
    second = [(f"key-{k:04d}", change_at, k % 11 + 2) for k in range(0, KEYS, 5)] if change_at > 0 else []
    rules = env.from_collection(
        first + second,
        uid="rules",
        timestamp=lambda r: r[1],
        records_per_second=p.get_int("rules.records_per_second", 0) or None,
        parallelism=1,
    )
    results = (
        events.key_by(lambda e: e["key"])
        .connect(rules.broadcast())
        .process(
            ScaleByRule(p.get_int("rules.apply_delay_ms", 0), p.get_str("rules.lagging_key", "")), uid="scale-by-rule"
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
