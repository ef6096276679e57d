"""Nexmark q4, average closing price per category: ``id`` (the category) and ``final``, the average
(an integer, as Flink's AVG of BIGINT) over the category's auctions of each auction's closing price,
its highest bid with a time between the auction's ``dateTime`` and its ``expires``, both inclusive
(the SQL's BETWEEN). An auction without such a bid has no closing price.

Two stages. A keyed co-process function keyed by auction id (auctions, and bids by ``auction``)
keeps the auction and the highest bid within its lifetime; an event-time timer at ``expires`` fires
once the watermark has passed it, when every bid up to and including that millisecond has been read:
it emits ``(category, closing price)`` and drops the key's state. A bid read before its auction (other
partitions) waits in the key's state; a timer at the bid's time drops it if the watermark passes that
time with no auction (an auction opens no later than its bids: it would have been read). Then per
category the sum and the count of the closing prices; ``final`` is emitted once event time is
complete (an event-time timer at the end of input's watermark), so that a bounded run outputs one row
per category, the plain-Python query's. ``-D q4.updates=true`` emits the running average at every
closing instead: the SQL's changelog, whose last row per category is that result, keyed in Kafka by
``{"id": category}`` as Flink's upsert-kafka sink keys it (``make bench-nexmark`` compares the two).

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q4``. ``weir.tools.nexmark_reference.q4`` is what the job must output (a multiset).
"""

from __future__ import annotations

from weir import nexmark
from weir.api import (
    Collector,
    Environment,
    KeyedCoProcessFunction,
    KeyedProcessContext,
    KeyedProcessFunction,
    OnTimerContext,
)
from weir.core.watermarks import MAX_WATERMARK
from weir.nexmark import Auction, Bid
from weir.tools.nexmark_jobs import events, sink

QUERY = "q4"

OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``: the closing timers
wait that long for the bids of other partitions."""


class ClosingPrice(KeyedCoProcessFunction):
    """Input 1: auctions, keyed by id; input 2: bids, keyed by auction. State: ``auction``, ``(category,
    dateTime, expires)``; ``highest``, the highest price within its lifetime; ``early``, the
    ``(dateTime, price)`` of bids read before the auction."""

    def process_element1(self, auction: Auction, ctx: KeyedProcessContext, out: Collector) -> None:
        known = ctx.value_state("auction")
        if known.value() is not None:
            return  # ids are unique
        known.update((auction.category, auction.date_time, auction.expires))
        early = ctx.list_state("early")
        prices = [p for t, p in early.get() if auction.date_time <= t <= auction.expires]
        if prices:
            ctx.value_state("highest").update(max(prices))
        early.clear()
        ctx.timer_service().register_event_time_timer(auction.expires)

    def process_element2(self, bid: Bid, ctx: KeyedProcessContext, out: Collector) -> None:
        known = ctx.value_state("auction").value()
        if known is None:
            ctx.list_state("early").add((bid.date_time, bid.price))
            ctx.timer_service().register_event_time_timer(bid.date_time)
            return
        _, opened, expires = known
        if opened <= bid.date_time <= expires:
            highest = ctx.value_state("highest")
            price = highest.value()
            if price is None or bid.price > price:
                highest.update(bid.price)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        known = ctx.value_state("auction")
        auction = known.value()
        if auction is None:  # bids with no auction by their time: none will come
            early = ctx.list_state("early")
            waiting = [(t, p) for t, p in early.get() if t > timestamp]
            if waiting:
                early.update(waiting)
            else:
                early.clear()
            return
        category, _, expires = auction
        if timestamp != expires:
            return
        highest = ctx.value_state("highest")
        price = highest.value()
        if price is not None:
            out.collect((category, price))
        known.clear()
        highest.clear()


class AveragePrice(KeyedProcessFunction):
    """Per category (the key): ``sum`` and ``count`` of its closing prices and ``latest``, the time of
    the last closing; ``final`` at the end of event time, or at every closing with ``updates``."""

    def __init__(self, updates: bool) -> None:
        self.updates = updates

    def process_element(self, closing: tuple[int, int], ctx: KeyedProcessContext, out: Collector) -> None:
        total, count = ctx.value_state("sum"), ctx.value_state("count")
        total.update((total.value() or 0) + closing[1])
        count.update((count.value() or 0) + 1)
        if self.updates:
            out.collect({"id": ctx.key, "final": total.value() // count.value()})
            return
        latest = ctx.value_state("latest")
        if ctx.timestamp is not None and ctx.timestamp > (latest.value() or 0):
            latest.update(ctx.timestamp)
        ctx.timer_service().register_event_time_timer(MAX_WATERMARK)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        """The end of event time: ``final``, stamped with the category's latest closing (not the
        end-of-input watermark's time, which a Kafka sink would write as the record's timestamp)."""
        final = ctx.value_state("sum").value() // ctx.value_state("count").value()
        out.collect({"id": ctx.key, "final": final}, ctx.value_state("latest").value())


def build(env: Environment) -> None:
    stream = events(env, OUT_OF_ORDERNESS_MS)
    auctions = stream.filter(nexmark.is_auction, uid="auctions")
    bids = stream.filter(nexmark.is_bid, uid="bids")
    closings = (
        auctions.connect(bids)
        .key_by(lambda a: a.id, lambda b: b.auction)
        .process(ClosingPrice(), uid=f"{QUERY}-closing-price")
    )
    updates = env.params.get_bool("q4.updates", False)
    averages = closings.key_by(lambda c: c[0]).process(AveragePrice(updates), uid=f"{QUERY}-average")
    sink(env, averages, QUERY, key=row_key if updates else None)


def row_key(row: dict[str, int]) -> bytes:
    """The Kafka key of an update: the row's primary key as JSON, ``{"id":10}``."""
    return b'{"id":%d}' % row["id"]
