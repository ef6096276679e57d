"""The chaos run's job: sequence-numbered events through keyed state into both exactly-once sinks.

Input (``-D source.topic=``): JSON ``{"key": str, "seq": int, "ts": int}``, per key ``seq`` 1, 2, ...
in order (one key lives in one partition). The keyed state keeps the last ``seq`` of each key; each
event leaves as ``{"key", "seq", "prev"}`` with ``prev`` the state's last seq before it (exactly-once
state: ``prev == seq - 1``), to the Kafka sink (``-D sink.topic=``) and the PostgreSQL two-phase sink
(``-D sink.table=``, primary key ``(key, seq)``).
"""

from __future__ import annotations

from typing import Any

from weir.api import Collector, Environment, KeyedProcessContext, KeyedProcessFunction, json_deserializer


def parse(raw: bytes) -> dict[str, Any]:
    event = json_deserializer(raw)
    if not (isinstance(event, dict) and type(event.get("key")) is str and type(event.get("seq")) is int):
        raise ValueError("an event is a JSON object with str key and int seq")
    return event


class SemanticsCheck(KeyedProcessFunction):
    """Stamps each event with the state's last seq of its key, then remembers the event's seq."""

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        last = ctx.value_state("last-seq")
        prev = last.value() or 0
        last.update(value["seq"])
        out.collect({"key": value["key"], "seq": value["seq"], "prev": prev})


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "chaos-events"),
        deserializer=parse,
        timestamp=lambda e: e["ts"],
        uid="sequence-source",
        bounded=p.get_bool("source.bounded", True),
        dead_letter_topic=p.get_str("source.dlq_topic", "chaos-dlq"),
        records_per_second=p.get_int("source.records_per_second", 0) or None,
    )
    checked = events.key_by(lambda e: e["key"]).process(SemanticsCheck(), uid="semantics-check")
    checked.sink_to_kafka(p.get_str("sink.topic", "chaos-output"), uid="kafka-sink", key=lambda r: r["key"])
    checked.sink_to_postgres(
        p.get_str("sink.table", "chaos_output"),
        uid="postgres-sink",
        columns=("key", "seq", "prev"),
        key_columns=("key", "seq"),
    )
