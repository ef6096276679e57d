"""A two-input keyed job with state: orders and payments counted per key and per input (``weir scenario barriers``).

Two generator sources, one subtask each: ``orders`` (``-D orders.rate``, records/s) and ``payments``
(``-D payments.rate``), which delivers in bursts: it stops for ``payments.pause_ms`` every
``payments.pause_every`` records, as an upstream that answers slowly, so a checkpoint trigger that finds
it paused injects its barrier late and the two-input operator holds its orders channels until the
payments barrier arrives (aligned checkpoints, the default). Record ``seq`` of an input is its
generator index; its key is ``k{seq % keys}`` (``-D keys``).

The keyed two-input operator ``counts`` keeps per key one ValueState per input, ``orders`` and
``payments``: ``(records counted, last seq)``. Each record goes on, with its count and the time the
operator processed it (``processed_ms``; ``created_ms`` is when its source generated it), to the
exactly-once Kafka sink on ``-D sink.topic`` (keyed by key).

``-D payments.gate=DIR`` (a directory on the TaskManagers' host) lets a driver hold the payments source
at will: while ``DIR/closed`` exists the source waits before its next record (and says so by creating
``DIR/waiting``), so a checkpoint triggered meanwhile finds it blocked and its barrier comes when the
driver removes ``closed`` (``weir scenario barriers`` forces its alignment holds so in its tests).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from weir.api import Collector, Environment, KeyedCoProcessFunction, KeyedProcessContext

ORDERS = "orders"
PAYMENTS = "payments"


def now_ms() -> float:
    return time.time() * 1000.0


class CountPerInput(KeyedCoProcessFunction):
    """Per key and per input: how many records it processed and the last one's ``seq``."""

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._count(ORDERS, value, ctx, out)

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        self._count(PAYMENTS, value, ctx, out)

    def _count(self, name: str, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        state = ctx.value_state(name)
        count, _last = state.value() or (0, -1)
        state.update((count + 1, value["seq"]))
        out.collect({**value, "count": count + 1, "processed_ms": now_ms()})


def wait_at_gate(gate: Path) -> None:
    """Wait while ``gate/closed`` exists, having said so in ``gate/waiting``: the source task takes no
    trigger meanwhile."""
    closed = gate / "closed"
    if not closed.exists():
        return
    (gate / "waiting").touch()
    while closed.exists():
        time.sleep(0.002)


def build(env: Environment) -> None:
    p = env.params
    keys = p.get_int("keys", 20)
    pause_s = p.get_int("payments.pause_ms", 350) / 1000.0
    pause_every = max(1, p.get_int("payments.pause_every", 20))
    gate = Path(p.get_str("payments.gate", "")) if p.get_str("payments.gate", "") else None

    def order(i: int) -> dict[str, Any]:
        return {"input": ORDERS, "seq": i, "key": f"k{i % keys}", "created_ms": now_ms()}

    def payment(i: int) -> dict[str, Any]:
        if pause_s and i % pause_every == 0:
            time.sleep(pause_s)  # the slow upstream: the source task takes no trigger meanwhile
        if gate is not None:
            wait_at_gate(gate)
        return {"input": PAYMENTS, "seq": i, "key": f"k{i % keys}", "created_ms": now_ms()}

    orders = env.from_generator(order, uid=ORDERS, records_per_second=p.get_int("orders.rate", 1000), parallelism=1)
    payments = env.from_generator(
        payment, uid=PAYMENTS, records_per_second=p.get_int("payments.rate", 50), parallelism=1
    )
    counted = (
        orders.key_by(lambda e: e["key"])
        .connect(payments.key_by(lambda e: e["key"]))
        .process(CountPerInput(), uid="counts")
    )
    counted.sink_to_kafka(p.get_str("sink.topic", "barriers-output"), uid="kafka-sink", key=lambda r: r["key"])
