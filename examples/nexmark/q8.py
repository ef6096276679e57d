"""Nexmark q8, monitor new users: ``id, name, stime`` for each person who, in one tumbling window of
10 s (starting at ``stime``), registered and opened an auction as its seller; once per window.

As the SQL: each side grouped per window first (people by ``id, name``, auctions by ``seller``: a
reduce per key and tumbling window keeps one record, emitted at the window's end and stamped with its
last millisecond), then a window join of the two on ``person id = seller`` over the same tumbling
windows (the grouped records, stamped within their window, fall into it again). A seller with
several auctions in a window is thus reported once.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q8``. ``weir.tools.nexmark_reference.q8`` is what the job must output (a multiset).
"""

from __future__ import annotations

from typing import Any

from weir.api import DataStream, Environment, TumblingEventTimeWindows
from weir.core import nexmark
from weir.core.nexmark import Auction, NexmarkConfig, Person

QUERY = "q8"
SIZE_MS = 10_000

OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``."""


def first(a: Any, b: Any) -> Any:
    return a


def new_user(person: Person, auction: Auction) -> dict[str, Any]:
    return {"id": person.id, "name": person.name, "stime": person.date_time - person.date_time % SIZE_MS}


def build(env: Environment) -> None:
    stream = events(env)
    windows = TumblingEventTimeWindows(SIZE_MS)
    people = (
        stream.filter(nexmark.is_person, uid="people")
        .key_by(lambda p: (p.id, p.name))
        .window(windows)
        .reduce(first, uid=f"{QUERY}-people-per-window")
    )
    sellers = (
        stream.filter(nexmark.is_auction, uid="auctions")
        .key_by(lambda a: a.seller)
        .window(windows)
        .reduce(first, uid=f"{QUERY}-sellers-per-window")
    )
    joined = (
        people.join(sellers)
        .where(lambda p: p.id)
        .equal_to(lambda a: a.seller)
        .window(windows)
        .apply(new_user, uid=f"{QUERY}-join")
    )
    sink(env, joined)


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
