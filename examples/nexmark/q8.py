"""Nexmark q8, monitor new users: ``id, name, stime`` for each person who, in one tumbling window of
10 s (starting at ``stime``), registered and opened an auction as its seller; once per window.

As the SQL: each side grouped per window first (people by ``id, name``, auctions by ``seller``: a
reduce per key and tumbling window keeps one record, emitted at the window's end and stamped with its
last millisecond), then a window join of the two on ``person id = seller`` over the same tumbling
windows (the grouped records, stamped within their window, fall into it again). A seller with
several auctions in a window is thus reported once.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q8``. ``weir.tools.nexmark_reference.q8`` is what the job must output (a multiset).
"""

from __future__ import annotations

from typing import Any

from weir import nexmark
from weir.api import Environment, TumblingEventTimeWindows
from weir.nexmark import Auction, Person
from weir.tools.nexmark_jobs import events, sink

QUERY = "q8"
SIZE_MS = 10_000

OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``."""


def first(a: Any, b: Any) -> Any:
    return a


def new_user(person: Person, auction: Auction) -> dict[str, Any]:
    return {"id": person.id, "name": person.name, "stime": person.date_time - person.date_time % SIZE_MS}


def build(env: Environment) -> None:
    stream = events(env, OUT_OF_ORDERNESS_MS)
    windows = TumblingEventTimeWindows(SIZE_MS)
    people = (
        stream.filter(nexmark.is_person, uid="people")
        .key_by(lambda p: (p.id, p.name))
        .window(windows)
        .reduce(first, uid=f"{QUERY}-people-per-window")
    )
    sellers = (
        stream.filter(nexmark.is_auction, uid="auctions")
        .key_by(lambda a: a.seller)
        .window(windows)
        .reduce(first, uid=f"{QUERY}-sellers-per-window")
    )
    joined = (
        people.join(sellers)
        .where(lambda p: p.id)
        .equal_to(lambda a: a.seller)
        .window(windows)
        .apply(new_user, uid=f"{QUERY}-join")
    )
    sink(env, joined, QUERY)
