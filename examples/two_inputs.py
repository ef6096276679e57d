"""A two-input job: orders and payments joined by key in a CoProcessFunction (aligned checkpoints).

Two generator sources at different rates feed one two-input operator, so its barriers arrive at
different times on its two inputs and it must align them; ``weir checkpoints`` reports the alignment.
The matches go to a file (``-D output=``, a debugging sink), or with ``-D sink.topic=T`` to the
exactly-once Kafka sink and, with ``-D sink.table=TABLE`` as well, to the PostgreSQL two-phase sink
(columns kind, key, id; primary key kind, id), which ``weir verify`` checks.
"""

from __future__ import annotations

from typing import Any

from weir.api import Collector, CoProcessFunction, Environment, ProcessContext


class MatchOrdersAndPayments(CoProcessFunction):
    """Tags each value with its input; a keyed join would keep state, this shows the two inputs."""

    def process_element1(self, value: Any, ctx: ProcessContext, out: Collector) -> None:
        out.collect({"kind": "order", **value})

    def process_element2(self, value: Any, ctx: ProcessContext, out: Collector) -> None:
        out.collect({"kind": "payment", **value})


def build(env: Environment) -> None:
    p = env.params
    count = p.get_int("count", 0) or None
    orders = env.from_generator(
        lambda i: {"order": i, "key": f"k{i % 100}"},
        uid="orders",
        count=count,
        records_per_second=p.get_int("orders.rate", 2000),
    )
    payments = env.from_generator(
        lambda i: {"payment": i, "key": f"k{i % 100}"},
        uid="payments",
        count=count,
        records_per_second=p.get_int("payments.rate", 200),
    )
    joined = (
        orders.key_by(lambda e: e["key"])
        .connect(payments.key_by(lambda e: e["key"]))
        .process(MatchOrdersAndPayments(), uid="match")
    )
    topic = p.get_str("sink.topic", "")
    if not topic:
        joined.sink_to_file(p.get_str("output", "/tmp/weir-two-inputs"), uid="file-sink")
        return
    rows = joined.map(
        lambda m: {"kind": m["kind"], "key": m["key"], "id": m.get("order", m.get("payment"))}, uid="as-row"
    )
    rows.sink_to_kafka(topic, uid="kafka-sink", key=lambda r: r["key"])
    table = p.get_str("sink.table", "")
    if table:
        rows.sink_to_postgres(table, uid="postgres-sink", columns=("kind", "key", "id"), key_columns=("kind", "id"))
