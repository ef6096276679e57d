"""examples/nexmark/q3, q4 and q8 (the joins) in reference mode output exactly the multiset the
plain-Python queries output: from the generator, from a topic loaded by weir.tools.nexmark_load over
partitions (injected: no broker), and from crafted events on the edges (a seller read after its
auctions, a bid at an auction's opening or expiry or read before the auction, a seller with several
auctions in a window, window boundaries)."""

from __future__ import annotations

import pytest

from tests.unit.examples.nexmark_inputs import EXAMPLES, loaded_topic, no_kafka, run_on_topic
from weir import nexmark as nx
from weir.tools import nexmark_reference as ref
from weir.tools.reference import run_reference

EVENTS = 5_000
CONFIG = nx.NexmarkConfig(events_per_second=50)  # 100 s of event time: 10 tumbling windows
PARAMS = {"events": str(EVENTS), "events_per_second": str(CONFIG.events_per_second)}
QUERIES = {"q3": ref.q3, "q4": ref.q4, "q8": ref.q8}


@pytest.fixture(scope="module")
def events() -> list[nx.Event]:
    return [nx.event(n, CONFIG) for n in range(EVENTS)]


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_generator_job_outputs_the_reference(query: str, events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / f"{query}.py", PARAMS, kafka_input=no_kafka)
    expected = QUERIES[query](events)
    assert len(expected) >= 5
    assert ref.multiset(result["kafka-sink"]) == ref.multiset(expected)
    assert result.sinks["kafka-sink"].description.target == f"nexmark-{query}"
    assert result.sources["nexmark-source"].records == EVENTS
    assert not any(result.late_records.values())


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_kafka_job_over_partitions_outputs_the_reference(query: str, events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / f"{query}.py", {"source": "kafka"}, kafka_input=loaded_topic(EVENTS, 3, CONFIG))
    assert ref.multiset(result["kafka-sink"]) == ref.multiset(QUERIES[query](events))
    assert result.dead_lettered == 0


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_default_rate_over_more_events(query: str) -> None:
    """10,000 events per second of event time (the generator's default): many auctions in flight at
    once, 20 s of event time; q4's auctions expire within it."""
    count = 20_000
    result = run_reference(EXAMPLES / f"{query}.py", {"events": str(count)}, kafka_input=no_kafka)
    expected = QUERIES[query]([nx.event(n) for n in range(count)])
    assert expected
    assert ref.multiset(result["kafka-sink"]) == ref.multiset(expected)


def test_the_file_sink_variant(events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / "q8.py", {**PARAMS, "sink": "file", "sink.path": "/tmp/q8"})
    assert result.sinks["file-sink"].description.target == "/tmp/q8"
    assert ref.multiset(result["file-sink"]) == ref.multiset(ref.q8(events))


# q3 ----------------------------------------------------------------------------------------------


def test_q3_joins_a_seller_read_before_or_after_its_auctions_once_each() -> None:
    evs: list[nx.Event] = [
        _auction(1, seller=7, t=100),  # before its seller
        _auction(2, seller=7, t=200),
        _person(7, state="OR", t=300),
        _auction(3, seller=7, t=400),  # after
        _auction(4, seller=7, t=500, category=9),  # another category
        _person(8, state="WA", t=600),  # elsewhere
        _auction(5, seller=8, t=700),
        _auction(6, seller=9, t=800),  # its seller is never read
        _auction(7, seller=10, t=900),
        _person(10, state="CA", t=1_000),
    ]
    expected = ref.q3(evs)
    assert sorted((r["id"], r["state"]) for r in expected) == [(1, "OR"), (2, "OR"), (3, "OR"), (7, "CA")]
    assert ref.multiset(_run("q3", evs)) == ref.multiset(expected)


# q4 ----------------------------------------------------------------------------------------------


def test_q4_a_closing_price_counts_bids_at_the_opening_and_the_expiry_inclusive() -> None:
    evs: list[nx.Event] = [
        _auction(1, t=1_000, expires=5_000, category=10),
        _bid(1, t=1_000, price=30),  # at the opening
        _bid(1, t=5_000, price=40),  # at the expiry: the closing price
        _bid(1, t=5_001, price=90),  # after it: not counted
        _auction(2, t=2_000, expires=3_000, category=10),
        _bid(2, t=2_500, price=11),
        _auction(3, t=2_000, expires=9_000, category=11),  # no bid: no closing price
        _bid(4, t=3_000, price=500),  # no such auction
        _bid(1, t=20_000, price=1),
    ]
    expected = ref.q4(evs)
    assert expected == [{"id": 10, "final": 25}]  # (40 + 11) // 2: AVG of BIGINT truncates
    assert ref.multiset(_run("q4", evs)) == ref.multiset(expected)
    # The expiry timer waits for the whole millisecond whatever the out-of-orderness.
    assert ref.multiset(_run("q4", evs, {"source.max_out_of_orderness_ms": "0"})) == ref.multiset(expected)


def test_q4_a_bid_read_before_its_auction_counts_when_within_its_lifetime() -> None:
    # Out of order within the 4 s: bids of another partition read before the auction they bid on.
    evs: list[nx.Event] = [
        _bid(1, t=1_500, price=70),
        _bid(1, t=900, price=99),  # before the auction opened: not counted
        _auction(1, t=1_000, expires=4_000, category=3),
        _bid(1, t=2_000, price=60),
        _auction(2, t=1_200, expires=1_300, category=3),
        _bid(2, t=1_250, price=20),
        _bid(5, t=1_300, price=1),  # never gets an auction: dropped once the watermark passes it
        _bid(9, t=9_000, price=1),
    ]
    expected = ref.q4(evs)
    assert expected == [{"id": 3, "final": 45}]
    assert ref.multiset(_run("q4", evs)) == ref.multiset(expected)


def test_q4_stamps_each_category_with_its_latest_closing(events: list[nx.Event]) -> None:
    """Not the end-of-input watermark's time: a Kafka sink writes the stamp as the record's timestamp."""
    capture = run_reference(EXAMPLES / "q4.py", PARAMS, kafka_input=no_kafka).sinks["kafka-sink"]
    auctions = {e.id: e for e in events if isinstance(e, nx.Auction)}
    closings: dict[int, int] = {}
    for b in ref.bids(events):
        a = auctions.get(b.auction)
        if a is not None and a.date_time <= b.date_time <= a.expires:
            closings[a.category] = max(closings.get(a.category, 0), a.expires)
    assert {row["id"]: t for row, t in zip(capture.values, capture.timestamps, strict=True)} == closings


def test_q4_updates_emits_the_running_average_whose_last_row_is_the_result(events: list[nx.Event]) -> None:
    rows = run_reference(EXAMPLES / "q4.py", {**PARAMS, "q4.updates": "true"}, kafka_input=no_kafka)["kafka-sink"]
    expected = ref.q4(events)
    assert len(rows) > len(expected)
    last = {r["id"]: r for r in rows}  # one subtask per category: its updates in order
    assert ref.multiset(last.values()) == ref.multiset(expected)


# q8 ----------------------------------------------------------------------------------------------


def test_q8_reports_a_new_seller_once_per_window() -> None:
    evs: list[nx.Event] = [
        _auction(1, seller=5, t=500),  # before the person, same window
        _person(5, t=1_000),
        _auction(2, seller=5, t=2_000),
        _auction(3, seller=5, t=9_999),
        _person(6, t=9_999),
        _auction(4, seller=6, t=10_000),  # the next window: no match
        _person(7, t=12_000),
        _auction(5, seller=7, t=19_999),
        _person(8, t=13_000),  # no auction
        _auction(6, seller=9, t=14_000),  # no person
        _auction(7, seller=5, t=15_000),  # 5 registered in the previous window
        _bid(1, t=40_000, price=1),
    ]
    expected = ref.q8(evs)
    assert [(r["id"], r["stime"]) for r in expected] == [(5, 0), (7, 10_000)]
    assert ref.multiset(_run("q8", evs)) == ref.multiset(expected)


# Helpers -----------------------------------------------------------------------------------------


def _person(pid: int, *, t: int, state: str = "OR") -> nx.Person:
    return nx.Person(
        id=pid,
        name=f"p{pid}",
        email_address="e",
        credit_card="c",
        city="Bend",
        state=state,
        date_time=t,
        extra="",
    )


def _auction(aid: int, *, t: int, seller: int = 1, category: int = 10, expires: int | None = None) -> nx.Auction:
    return nx.Auction(
        id=aid,
        item_name="i",
        description="d",
        initial_bid=1,
        reserve=2,
        date_time=t,
        expires=t + 10_000 if expires is None else expires,
        seller=seller,
        category=category,
        extra="",
    )


def _bid(auction: int, *, t: int, price: int, bidder: int = 1) -> nx.Bid:
    return nx.Bid(auction=auction, bidder=bidder, price=price, channel="channel-1", url="u", date_time=t, extra="")


def _run(query: str, events: list[nx.Event], params: dict[str, str] | None = None) -> list[dict[str, object]]:
    """The job's output for ``events`` read in this order from a one-partition topic."""
    result = run_on_topic(query, events, params)
    assert not any(result.late_records.values())
    return result["kafka-sink"]
