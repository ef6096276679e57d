"""Keyed state only: a running count per key in RocksDB, nothing emitted. The checkpoint benchmark
loads it with as many distinct keys as it wants checkpointed (1M in the full run).

``-D source.topic=`` (JSON events with a ``key``), unbounded; ``checkpointing.interval`` as usual.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import Environment, KeyedProcessFunction


class CountPerKey(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        state = ctx.value_state("count")
        state.update((state.value() or 0) + 1)


def build(env: Environment) -> None:
    events = env.from_kafka(
        env.params.get_str("source.topic", "state-events"), uid="events-source", deserializer=json.loads
    )
    events.key_by(_key).process(CountPerKey(), uid="count-per-key").print(uid="sink")


def _key(event: dict[str, Any]) -> str:
    return str(event["key"])
