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

from weir import nexmark
from weir.api import Collector, Environment, KeyedProcessContext, KeyedProcessFunction, OnTimerContext
from weir.nexmark import Bid
from weir.tools.nexmark_jobs import events, sink

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
    bids = events(env, OUT_OF_ORDERNESS_MS).filter(nexmark.is_bid, uid="bids")
    by_end = bids.flat_map(window_ends, uid=f"{QUERY}-window-ends").key_by(lambda tagged: tagged[0])
    sink(env, by_end.process(HighestBids(), uid=f"{QUERY}-highest"), QUERY)
