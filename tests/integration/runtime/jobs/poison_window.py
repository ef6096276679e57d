"""A window whose result function raises (a poison window), for the poison-record test.

Input: topic ``-D source.topic=``, JSON ``{"key": str, "seq": int}``, read to the end offsets present
at submit (bounded); a record's event time is ``BASE_MS + 10 * seq``. Per key and tumbling window of
``-D window.size_ms=`` (default 200) the count and sum of the seqs; the result function raises
``ValueError`` on the window that holds ``-D poison.seq=``, so that window's firing is rejected
(``-D dlq.topic=``: dead-lettered, the default; ``-D on_error=fail``: the job fails). The other
windows' ``{"key", "start", "count", "sum"}`` go to ``-D sink.topic=`` exactly once.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import DeadLetterOnError, Environment, FailOnError, OnRecordError, TumblingEventTimeWindows

BASE_MS = 1_700_000_000_000


class PoisonResult:
    """Count and sum of the window's seqs; ``result`` raises on the window holding ``poison``."""

    def __init__(self, poison: int) -> None:
        self.poison = poison

    def create(self) -> dict[str, Any]:
        return {"count": 0, "sum": 0, "poison": False}

    def add(self, acc: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        seq = event["seq"]
        return {"count": acc["count"] + 1, "sum": acc["sum"] + seq, "poison": acc["poison"] or seq == self.poison}

    def result(self, key: str, window_start: int, window_end: int, acc: dict[str, Any]) -> dict[str, Any]:
        if acc["poison"]:
            raise ValueError(f"window of {key} at {window_start} holds poison seq {self.poison}")
        return {"key": key, "start": window_start, "count": acc["count"], "sum": acc["sum"]}


def build(env: Environment) -> None:
    p = env.params
    handling: OnRecordError = FailOnError()
    if p.get_str("on_error", "dead-letter") == "dead-letter":
        handling = DeadLetterOnError(p.get_str("dlq.topic", "poison-dlq"))
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        uid="events-source",
        deserializer=json.loads,
        timestamp=lambda e: BASE_MS + 10 * e["seq"],
        bounded=True,
    )
    sums = (
        events.key_by(lambda e: e["key"])
        .window(TumblingEventTimeWindows(p.get_int("window.size_ms", 200)))
        .aggregate(PoisonResult(p.get_int("poison.seq", -1)), uid="window-sum", on_error=handling)
    )
    sums.sink_to_kafka(
        p.get_str("sink.topic", "window-sums"), uid="kafka-sink", key=lambda r: r["key"], delivery="exactly_once"
    )
