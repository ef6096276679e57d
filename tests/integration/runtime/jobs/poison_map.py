"""A map that raises on one record (a poison record), for the poison-record test.

Input: topic ``-D source.topic=``, JSON ``{"key": str, "seq": int}``, read to the end offsets present
at submit (bounded). The map ``parse`` raises ``ValueError`` on the record whose ``seq`` is
``-D poison.seq=`` and passes every other record; the results go to ``-D sink.topic=`` exactly once.
``-D on_error=fail`` (default) fails the record (the restart strategy decides how often the job
tries again); ``-D on_error=dead-letter`` sends it to ``-D dlq.topic=`` and goes on.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import DeadLetterOnError, Environment, FailOnError, OnRecordError


def build(env: Environment) -> None:
    p = env.params
    poison = p.get_int("poison.seq", -1)

    def parse(event: dict[str, Any]) -> dict[str, Any]:
        if event["seq"] == poison:
            raise ValueError(f"seq {poison} is poison")
        return {"key": event["key"], "seq": event["seq"]}

    handling: OnRecordError = FailOnError()
    if p.get_str("on_error", "fail") == "dead-letter":
        handling = DeadLetterOnError(p.get_str("dlq.topic", "poison-dlq"))
    env.on_record_error(handling)
    events = env.from_kafka(
        p.get_str("source.topic", "events"), uid="events-source", deserializer=json.loads, bounded=True
    )
    events.map(parse, uid="parse").sink_to_kafka(
        p.get_str("sink.topic", "parsed"), uid="kafka-sink", key=lambda r: r["key"], delivery="exactly_once"
    )
