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

from weir import nexmark
from weir.api import Environment, EventTimeSessionWindows
from weir.tools.nexmark_jobs import events, sink

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

    def add(self, count: int, bidder: int) -> int:
        return count + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, bidder: int, start: int, end: int, count: int) -> dict[str, Any]:
        return {"bidder": bidder, "bid_count": count, "starttime": start, "endtime": end}


def build(env: Environment) -> None:
    bids = events(env, OUT_OF_ORDERNESS_MS).filter(nexmark.is_bid, uid="bids")
    # Only the bidder crosses the network (the bid's time travels as the record's timestamp): a
    # whole bid is ~250 bytes to pickle and unpickle, for a count that reads none of it.
    bidders = bids.map(lambda bid: bid.bidder, uid=f"{QUERY}-bidder")
    sessions = (
        bidders.key_by(lambda bidder: bidder)
        .window(EventTimeSessionWindows(GAP_MS))
        .aggregate(CountSession(), uid=f"{QUERY}-sessions")
    )
    sink(env, sessions, QUERY)
