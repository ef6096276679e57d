"""Nexmark q2, selection: ``auction, price`` of the bids on auctions whose id is a multiple of 123.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q2``. ``weir.tools.nexmark_reference.q2`` is what the job must output.
"""

from __future__ import annotations

from weir.api import Environment
from weir.nexmark import Bid, Event
from weir.tools.nexmark_jobs import events, sink

QUERY = "q2"


def selected(event: Event) -> bool:
    return isinstance(event, Bid) and event.auction % 123 == 0


def build(env: Environment) -> None:
    selection = events(env).filter(selected, uid=f"{QUERY}-select")
    sink(env, selection.map(lambda bid: {"auction": bid.auction, "price": bid.price}, uid=f"{QUERY}-project"), QUERY)
