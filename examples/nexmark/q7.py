"""Nexmark q7, highest bid: per tumbling window of 10 s, its highest price and every bid of that
price between the window's end - 10 s and its end, both inclusive (the SQL's BETWEEN: a bid at
exactly the end, the first millisecond of the next window, matches too when its price equals the
maximum, without counting towards it): ``auction, price, bidder, dateTime, extra``.

The SQL joins the bids with their windows' maxima; this job does it in one keyed process function,
keyed by window end. Each bid goes to its own window's end, and a bid at a window boundary also
to the end it sits on. Per end the function keeps the maximum of the window's bids and the bids at
that price, and the boundary bids apart; an event-time timer at the end fires once the watermark
has passed it, when every bid up to and including that millisecond has been seen.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q7``. ``weir.tools.nexmark_reference.q7`` is what the job must output (a multiset).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from weir.api import Collector, DataStream, Environment, KeyedProcessContext, KeyedProcessFunction, OnTimerContext
from weir.core import nexmark
from weir.core.nexmark import Bid, NexmarkConfig

QUERY = "q7"
SIZE_MS = 10_000


def window_ends(bid: Bid) -> Iterator[tuple[int, Bid]]:
    """``(end, bid)`` for each window end the bid may be reported at: its own window's, and the
    previous window's when the bid is at exactly that window's end."""
    t = bid.date_time
    yield t - t % SIZE_MS + SIZE_MS, bid
    if t % SIZE_MS == 0:
        yield t, bid


OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``. Not 0: a watermark
right behind the latest event closes a window as soon as an event at its end is read, before the
other events of that same millisecond, which may belong to the window's result (q7's BETWEEN, q11's
touching sessions)."""


class HighestBids(KeyedProcessFunction):
    """Per window end (the key): ``highest``, the window's maximum price; ``top``, the window's
    bids at that price; ``edge``, the bids at exactly the end. At the end's timer: the bids of
    ``top`` and ``edge`` at the maximum."""

    def process_element(self, value: tuple[int, Bid], ctx: KeyedProcessContext, out: Collector) -> None:
        end, bid = value
        ctx.timer_service().register_event_time_timer(end)
        if bid.date_time == end:
            ctx.list_state("edge").add(bid)
            return
        highest, top = ctx.value_state("highest"), ctx.list_state("top")
        price = highest.value()
        if price is None or bid.price > price:
            highest.update(bid.price)
            top.update([bid])
        elif bid.price == price:
            top.add(bid)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        highest, top, edge = ctx.value_state("highest"), ctx.list_state("top"), ctx.list_state("edge")
        price = highest.value()
        if price is not None:  # none: the window had no bid, only a next window's first millisecond
            for bid in [*top.get(), *edge.get()]:
                if bid.price == price:
                    out.collect(row(bid))
        highest.clear()
        top.clear()
        edge.clear()


def row(bid: Bid) -> dict[str, Any]:
    return {
        "auction": bid.auction,
        "price": bid.price,
        "bidder": bid.bidder,
        "dateTime": bid.date_time,
        "extra": bid.extra,
    }


def build(env: Environment) -> None:
    bids = events(env).filter(nexmark.is_bid, uid="bids")
    by_end = bids.flat_map(window_ends, uid=f"{QUERY}-window-ends").key_by(lambda tagged: tagged[0])
    sink(env, by_end.process(HighestBids(), uid=f"{QUERY}-highest"))


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
