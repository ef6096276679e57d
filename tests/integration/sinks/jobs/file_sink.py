"""A bounded Kafka topic of events written into the exactly-once file sink.

Input: topic ``-D source.topic=`` of JSON events (``weir.tools.events``), read at
``-D source.records_per_second=`` per subtask (0: as fast as it can). Output: every event as it is,
one row per event, into ``sink_to_files(-D sink.path=, format=-D sink.format=)`` with part files
rolled at ``-D sink.max_part_bytes=`` and, by default, one bucket per hour of the event's time.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import Environment


def parse_event(raw: bytes) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(raw)
    return event


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        uid="events-source",
        bounded=p.get_bool("source.bounded", True),
        deserializer=parse_event,
        timestamp=lambda e: e["ts"],
        records_per_second=p.get_int("source.records_per_second", 0) or None,
    )
    events.sink_to_files(
        p.get_str("sink.path", "/tmp/weir-files"),
        uid="file-sink",
        format="parquet" if p.get_str("sink.format", "parquet") == "parquet" else "jsonl",
        max_part_bytes=p.get_int("sink.max_part_bytes", 64 * 1024 * 1024),
    )
