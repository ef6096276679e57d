"""Nexmark q11, user sessions: per bidder and session window (gap 10 s), ``bidder, bid_count,
starttime, endtime``: the number of bids, the first bid's time and the last bid's time + 10 s.

A session window per bid, ``[dateTime, dateTime + 10 s)``, merged with the bidder's windows it
overlaps or touches (Flink's session windows; a bid exactly 10 s after the previous one continues
its session); the count is emitted when the watermark passes the session's end.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q11``. ``weir.tools.nexmark_reference.q11`` is what the job must output (a multiset).
"""

from __future__ import annotations

from typing import Any

from weir.api import DataStream, Environment, EventTimeSessionWindows
from weir.core import nexmark
from weir.core.nexmark import Bid, NexmarkConfig

QUERY = "q11"
GAP_MS = 10_000

OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``. Not 0: a watermark
right behind the latest event closes a window as soon as an event at its end is read, before the
other events of that same millisecond, which may belong to the window's result (q7's BETWEEN, q11's
touching sessions)."""


class CountSession:
    """Bids per bidder and session: ``bidder, bid_count, starttime, endtime``."""

    def create(self) -> int:
        return 0

    def add(self, count: int, bid: Bid) -> int:
        return count + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, bidder: int, start: int, end: int, count: int) -> dict[str, Any]:
        return {"bidder": bidder, "bid_count": count, "starttime": start, "endtime": end}


def build(env: Environment) -> None:
    bids = events(env).filter(nexmark.is_bid, uid="bids")
    sessions = (
        bids.key_by(lambda bid: bid.bidder)
        .window(EventTimeSessionWindows(GAP_MS))
        .aggregate(CountSession(), uid=f"{QUERY}-sessions")
    )
    sink(env, sessions)


def events(env: Environment) -> DataStream:
    """The Nexmark events, from the generator or a Kafka topic (``-D source=``), with watermarks
    ``-D source.max_out_of_orderness_ms=`` behind the latest event (:data:`OUT_OF_ORDERNESS_MS`)."""
    p = env.params
    source = p.get_str("source", "generator")
    delay = p.get_int("source.max_out_of_orderness_ms", OUT_OF_ORDERNESS_MS)
    if source == "kafka":
        return env.from_kafka(
            p.get_str("source.topic", "nexmark"),
            uid="nexmark-source",
            bounded=p.get_bool("source.bounded", False),
            deserializer=nexmark.decode_event,
            timestamp=nexmark.event_time,
            max_out_of_orderness_ms=delay,
            dead_letter_topic=p.get_str("source.dlq_topic", "nexmark-dlq"),
            records_per_second=p.get_int("source.records_per_second", 0) or None,
        )
    if source != "generator":
        raise ValueError(f"-D source= is generator or kafka, not {source!r}")
    config = NexmarkConfig(events_per_second=p.get_int("events_per_second", 10_000), seed=p.get_int("seed", 0))
    return env.from_generator(
        lambda n: nexmark.event(n, config),
        uid="nexmark-source",
        count=p.get_int("events", 1_000_000) or None,
        timestamp=nexmark.event_time,
        max_out_of_orderness_ms=delay,
        records_per_second=p.get_int("source.records_per_second", 0) or None,
    )


def sink(env: Environment, results: DataStream) -> None:
    """To a Kafka topic or a file (``-D sink=``)."""
    p = env.params
    if p.get_str("sink", "kafka") == "file":
        results.sink_to_file(p.get_str("sink.path", f"nexmark-{QUERY}.jsonl"), uid="file-sink")
    else:
        results.sink_to_kafka(p.get_str("sink.topic", f"nexmark-{QUERY}"), uid="kafka-sink")
