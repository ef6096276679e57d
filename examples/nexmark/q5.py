"""Nexmark q5, hot items: per sliding window of 10 s every 2 s, the auction(s) with the most bids,
``auction, num``; every auction tied for the most appears.

Two window stages: bids are counted per auction and sliding window (a count emitted when the
watermark passes the window's end, stamped with its last millisecond), then the counts of one
window, keyed by its start and grouped by a tumbling window of the slide (which holds that one
window's counts alone), give its maximum and the auctions that reach it.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q5``. ``weir.tools.nexmark_reference.q5`` is what the job must output (a multiset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from weir import nexmark
from weir.api import (
    Collector,
    Environment,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowContext,
)
from weir.tools.nexmark_jobs import events, sink

QUERY = "q5"
SIZE_MS = 10_000
SLIDE_MS = 2_000

OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``. Not 0: a watermark
right behind the latest event closes a window as soon as an event at its end is read, before the
other events of that same millisecond, which may belong to the window's result (q7's BETWEEN, q11's
touching sessions)."""


class CountBids:
    """Bids per auction and window: ``auction, num, starttime, endtime``."""

    def create(self) -> int:
        return 0

    def add(self, count: int, auction: int) -> int:
        return count + 1

    def merge(self, a: int, b: int) -> int:
        """Counts merge: the sliding windows are sliced (one count per auction and 2 s slice, each
        window's the sum of its five slices' when it fires), as Flink SQL slices a HOP window."""
        return a + b

    def result(self, auction: int, start: int, end: int, count: int) -> dict[str, Any]:
        return {"auction": auction, "num": count, "starttime": start, "endtime": end}


class HottestAuctions(ProcessWindowFunction):
    """The counts of one sliding window: those equal to the largest, as ``auction, num``."""

    def process(self, start: int, context: WindowContext, counts: Sequence[dict[str, Any]], out: Collector) -> None:
        most = max(c["num"] for c in counts)
        for c in counts:
            if c["num"] == most:
                out.collect({"auction": c["auction"], "num": c["num"]})


def build(env: Environment) -> None:
    bids = events(env, OUT_OF_ORDERNESS_MS).filter(nexmark.is_bid, uid="bids")
    # Only the auction crosses the network (the bid's time travels as the record's timestamp): a
    # whole bid is ~250 bytes to pickle and unpickle, for a count that reads none of it.
    auctions = bids.map(lambda bid: bid.auction, uid=f"{QUERY}-auction")
    counts = (
        auctions.key_by(lambda auction: auction)
        .window(SlidingEventTimeWindows(SIZE_MS, SLIDE_MS))
        .aggregate(CountBids(), uid=f"{QUERY}-count")
    )
    hottest = (
        counts.key_by(lambda count: count["starttime"])
        .window(TumblingEventTimeWindows(SLIDE_MS))
        .process(HottestAuctions(), uid=f"{QUERY}-hottest")
    )
    sink(env, hottest, QUERY)
