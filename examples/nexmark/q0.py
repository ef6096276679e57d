"""Nexmark q0, pass-through: every bid's ``auction, bidder, price, dateTime, extra``.

Input, ``-D source=``:

- ``generator`` (default): the Nexmark generator in the job (``weir.nexmark``), ``-D events=``
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

from weir import nexmark
from weir.api import Environment
from weir.nexmark import Bid
from weir.tools.nexmark_jobs import events, sink

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
    sink(env, events(env).filter(nexmark.is_bid, uid="bids").map(project, uid=f"{QUERY}-project"), QUERY)
