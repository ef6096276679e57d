"""Nexmark q3, local item suggestion: ``name, city, state, id`` for each auction of category 10 whose
seller lives in OR, ID or CA (the SQL's inner join ``auction.seller = person.id``, over the whole
stream: a seller read after its auctions joins them too).

An incremental join in one keyed co-process function, keyed by person id (people) and seller
(auctions of category 10). Per key it keeps the person once read (``name, city, state`` when the
person qualifies, a marker when the person lives elsewhere) and, until then, the ids of the key's
auctions. An auction whose seller is known is emitted at once or dropped; the person, when read,
emits the auctions waiting for it and the list is cleared: each match is emitted once, and a key's
state is one small value once its person is known. People who live elsewhere go into the join too
(the SQL filters after the join), so that their auctions do not wait forever. Nexmark's person ids
are unique: a second person with the same id would not join the auctions already matched.

Parameters as ``q0.py`` (``-D source=generator|kafka``, ``-D sink=kafka|file``); the sink topic is
``nexmark-q3``. ``weir.tools.nexmark_reference.q3`` is what the job must output (a multiset).
"""

from __future__ import annotations

from weir import nexmark
from weir.api import Collector, Environment, KeyedCoProcessFunction, KeyedProcessContext
from weir.nexmark import Auction, Person
from weir.tools.nexmark_jobs import events, sink

QUERY = "q3"
STATES = frozenset({"OR", "ID", "CA"})
CATEGORY = 10

OUT_OF_ORDERNESS_MS = 4_000
"""The Nexmark DDL's ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND`` (q3 uses no event
time; kept so that every Nexmark job's source is the same)."""

ELSEWHERE = "elsewhere"
"""The ``person`` state of a seller who does not live in OR, ID or CA."""


class LocalItems(KeyedCoProcessFunction):
    """Input 1: people, keyed by id; input 2: auctions of category 10, keyed by seller."""

    def process_element1(self, person: Person, ctx: KeyedProcessContext, out: Collector) -> None:
        known = ctx.value_state("person")
        if known.value() is not None:
            return  # ids are unique; a repeated person changes nothing
        waiting = ctx.list_state("auctions")
        if person.state in STATES:
            seller = {"name": person.name, "city": person.city, "state": person.state}
            known.update(seller)
            for auction_id in waiting.get():
                out.collect({**seller, "id": auction_id})
        else:
            known.update(ELSEWHERE)
        waiting.clear()

    def process_element2(self, auction: Auction, ctx: KeyedProcessContext, out: Collector) -> None:
        seller = ctx.value_state("person").value()
        if seller is None:
            ctx.list_state("auctions").add(auction.id)
        elif seller != ELSEWHERE:
            out.collect({**seller, "id": auction.id})


def build(env: Environment) -> None:
    stream = events(env, OUT_OF_ORDERNESS_MS)
    people = stream.filter(nexmark.is_person, uid="people")
    auctions = stream.filter(lambda e: nexmark.is_auction(e) and e.category == CATEGORY, uid="auctions")
    joined = (
        people.connect(auctions).key_by(lambda p: p.id, lambda a: a.seller).process(LocalItems(), uid=f"{QUERY}-join")
    )
    sink(env, joined, QUERY)
