"""Nexmark q1, currency conversion: every bid with its price in euros, ``0.908 * price`` exact to
three decimals as the reference's DECIMAL(23, 3) (``weir.tools.nexmark_reference.euros``):
``auction, bidder, price, dateTime, extra``.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q1``. ``weir.tools.nexmark_reference.q1`` is what the job must output.
"""

from __future__ import annotations

from typing import Any

from weir import nexmark
from weir.api import Environment
from weir.nexmark import Bid
from weir.tools.nexmark_jobs import events, sink

QUERY = "q1"


def in_euros(bid: Bid) -> dict[str, Any]:
    price = bid.price * 908 / 1000  # not bid.price * 0.908: the double nearest the exact decimal
    return {"auction": bid.auction, "bidder": bid.bidder, "price": price, "dateTime": bid.date_time, "extra": bid.extra}


def build(env: Environment) -> None:
    sink(env, events(env).filter(nexmark.is_bid, uid="bids").map(in_euros, uid=f"{QUERY}-euros"), QUERY)
