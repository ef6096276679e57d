"""Nexmark q2, selection: ``auction, price`` of the bids on auctions whose id is a multiple of 123.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q2``. ``weir.tools.nexmark_reference.q2`` is what the job must output.
"""

from __future__ import annotations

from weir.api import DataStream, Environment
from weir.core import nexmark
from weir.core.nexmark import Bid, Event, NexmarkConfig

QUERY = "q2"


def selected(event: Event) -> bool:
    return isinstance(event, Bid) and event.auction % 123 == 0


def build(env: Environment) -> None:
    selection = events(env).filter(selected, uid=f"{QUERY}-select")
    sink(env, selection.map(lambda bid: {"auction": bid.auction, "price": bid.price}, uid=f"{QUERY}-project"))


def events(env: Environment) -> DataStream:
    """The Nexmark events, from the generator or a Kafka topic (``-D source=``)."""
    p = env.params
    source = p.get_str("source", "generator")
    if source == "kafka":
        return env.from_kafka(
            p.get_str("source.topic", "nexmark"),
            uid="nexmark-source",
            bounded=p.get_bool("source.bounded", False),
            deserializer=nexmark.decode_event,
            timestamp=nexmark.event_time,
            dead_letter_topic=p.get_str("source.dlq_topic", "nexmark-dlq"),
        )
    if source != "generator":
        raise ValueError(f"-D source= is generator or kafka, not {source!r}")
    config = NexmarkConfig(events_per_second=p.get_int("events_per_second", 10_000), seed=p.get_int("seed", 0))
    return env.from_generator(
        lambda n: nexmark.event(n, config),
        uid="nexmark-source",
        count=p.get_int("events", 1_000_000) or None,
        timestamp=nexmark.event_time,
        records_per_second=p.get_int("source.records_per_second", 0) or None,
    )


def sink(env: Environment, results: DataStream) -> None:
    """To a Kafka topic or a file (``-D sink=``)."""
    p = env.params
    if p.get_str("sink", "kafka") == "file":
        results.sink_to_file(p.get_str("sink.path", f"nexmark-{QUERY}.jsonl"), uid="file-sink")
    else:
        results.sink_to_kafka(p.get_str("sink.topic", f"nexmark-{QUERY}"), uid="kafka-sink")
