"""Nexmark q0, pass-through: every bid's ``auction, bidder, price, dateTime, extra``.

Input, ``-D source=``:

- ``generator`` (default): the Nexmark generator in the job (``weir.core.nexmark``), ``-D events=``
  events (default 1,000,000; 0: unbounded), ``-D events_per_second=`` of event time (10,000),
  ``-D seed=`` (0), ``-D source.records_per_second=`` to pace it in wall time (default: as fast as
  it goes);
- ``kafka``: topic ``-D source.topic=`` (``nexmark``), loaded by ``python -m weir.tools.nexmark_load``;
  ``-D source.bounded=true`` reads up to the end offsets present at start. A record that is not a
  Nexmark event goes to ``nexmark-dlq``.

Output, ``-D sink=``: ``kafka`` (default, topic ``-D sink.topic=``, ``nexmark-q0``) or ``file``
(``-D sink.path=``, ``nexmark-q0.jsonl``), one JSON object per bid.
``weir.tools.nexmark_reference.q0`` is what the job must output.
"""

from __future__ import annotations

from typing import Any

from weir.api import DataStream, Environment
from weir.core import nexmark
from weir.core.nexmark import Bid, NexmarkConfig

QUERY = "q0"


def project(bid: Bid) -> dict[str, Any]:
    return {
        "auction": bid.auction,
        "bidder": bid.bidder,
        "price": bid.price,
        "dateTime": bid.date_time,
        "extra": bid.extra,
    }


def build(env: Environment) -> None:
    sink(env, events(env).filter(nexmark.is_bid, uid="bids").map(project, uid=f"{QUERY}-project"))


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
