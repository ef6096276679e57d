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

from weir.api import Collector, DataStream, Environment, KeyedCoProcessFunction, KeyedProcessContext
from weir.core import nexmark
from weir.core.nexmark import Auction, NexmarkConfig, Person

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
    stream = events(env)
    people = stream.filter(nexmark.is_person, uid="people")
    auctions = stream.filter(lambda e: nexmark.is_auction(e) and e.category == CATEGORY, uid="auctions")
    joined = (
        people.connect(auctions).key_by(lambda p: p.id, lambda a: a.seller).process(LocalItems(), uid=f"{QUERY}-join")
    )
    sink(env, joined)


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
