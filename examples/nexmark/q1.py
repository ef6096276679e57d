"""Nexmark q1, currency conversion: every bid with its price in euros, ``0.908 * price`` exact to
three decimals as the reference's DECIMAL(23, 3) (``weir.tools.nexmark_reference.euros``):
``auction, bidder, price, dateTime, extra``.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q1``. ``weir.tools.nexmark_reference.q1`` is what the job must output.
"""

from __future__ import annotations

from typing import Any

from weir.api import DataStream, Environment
from weir.core import nexmark
from weir.core.nexmark import Bid, NexmarkConfig

QUERY = "q1"


def in_euros(bid: Bid) -> dict[str, Any]:
    price = bid.price * 908 / 1000  # not bid.price * 0.908: the double nearest the exact decimal
    return {"auction": bid.auction, "bidder": bid.bidder, "price": price, "dateTime": bid.date_time, "extra": bid.extra}


def build(env: Environment) -> None:
    sink(env, events(env).filter(nexmark.is_bid, uid="bids").map(in_euros, uid=f"{QUERY}-euros"))


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
