"""The plain-Python Nexmark queries on tiny hand-made inputs."""

from __future__ import annotations

import json

from weir import nexmark as nx
from weir.nexmark import Auction, Bid, Person
from weir.tools import nexmark_reference as ref
from weir.tools.nexmark_reference import multiset


def person(pid: int, t: int, state: str = "OR", name: str = "Kate Smith", city: str = "Bend") -> Person:
    return Person(pid, name, "a@b.com", "0000 0000 0000 0000", city, state, t, "")


def auction(aid: int, t: int, seller: int = 1000, category: int = 10, expires: int | None = None) -> Auction:
    return Auction(aid, "item", "desc", 100, 200, t, t + 1000 if expires is None else expires, seller, category, "")


def bid(aid: int, price: int, t: int, bidder: int = 1001, extra: str = "") -> Bid:
    return Bid(aid, bidder, price, "Google", "https://x", t, extra)


def test_q0_passes_every_bid_through() -> None:
    events = [person(1000, 0), bid(1000, 5, 1, extra="x"), auction(1000, 2), bid(1001, 7, 3)]
    assert ref.q0(events) == [
        {"auction": 1000, "bidder": 1001, "price": 5, "dateTime": 1, "extra": "x"},
        {"auction": 1001, "bidder": 1001, "price": 7, "dateTime": 3, "extra": ""},
    ]


def test_q1_converts_to_euros_exactly_to_three_decimals() -> None:
    out = ref.q1([bid(1000, 100, 1), bid(1000, 3, 2), bid(1000, 123_456_789, 3)])
    assert [r["price"] for r in out] == [90.8, 2.724, 112098764.412]
    assert json.dumps([r["price"] for r in out]) == "[90.8, 2.724, 112098764.412]"
    assert 15 * 0.908 != 13.62 and ref.euros(15) == 13.62  # why euros() multiplies by 908 and divides


def test_q2_keeps_bids_on_auctions_divisible_by_123() -> None:
    events = [bid(1107, 1, 0), bid(1108, 2, 1), bid(1230, 3, 2), auction(1230, 3)]
    assert ref.q2(events) == [{"auction": 1107, "price": 1}, {"auction": 1230, "price": 3}]


def test_q3_joins_category_10_auctions_with_sellers_in_or_id_ca() -> None:
    events = [
        person(1000, 0, "OR", "Kate Smith", "Bend"),
        person(1001, 0, "WA", "Paul White", "Kent"),
        auction(1000, 1, seller=1000),
        auction(1001, 1, seller=1001),  # seller in WA
        auction(1002, 1, seller=1000, category=11),
        auction(1003, 1, seller=1002),  # seller registers afterwards: still joins
        person(1002, 2, "CA", "John Jones", "Los Angeles"),
    ]
    assert multiset(ref.q3(events)) == multiset(
        [
            {"name": "Kate Smith", "city": "Bend", "state": "OR", "id": 1000},
            {"name": "John Jones", "city": "Los Angeles", "state": "CA", "id": 1003},
        ]
    )


def test_q4_averages_each_category_s_closing_prices() -> None:
    events = [
        auction(1000, 0, category=10, expires=100),
        auction(1001, 0, category=10, expires=100),
        auction(1002, 0, category=11, expires=100),
        auction(1003, 0, category=12, expires=100),  # no bid: no closing price
        bid(1000, 10, 50),
        bid(1000, 30, 100),  # at expiry: inclusive
        bid(1000, 99, 101),  # after expiry
        bid(1001, 5, 0),  # at opening: inclusive
        bid(1002, 7, 1),
        bid(1004, 1000, 1),  # no such auction
    ]
    assert ref.q4(events) == [{"id": 10, "final": (30 + 5) // 2}, {"id": 11, "final": 7}]


def test_hop_windows() -> None:
    assert ref.hop_windows(5_000, 10_000, 2_000) == [-4_000, -2_000, 0, 2_000, 4_000]
    assert ref.hop_windows(4_000, 10_000, 2_000) == [-4_000, -2_000, 0, 2_000, 4_000]
    assert ref.hop_windows(3_999, 10_000, 2_000) == [-6_000, -4_000, -2_000, 0, 2_000]


def test_q5_finds_the_auctions_with_most_bids_per_sliding_window() -> None:
    events = [bid(1, 1, 1_000), bid(1, 1, 1_500), bid(2, 1, 2_500), bid(2, 1, 11_000), bid(2, 1, 11_500)]
    out = ref.q5(events, size_ms=4_000, slide_ms=2_000)
    # windows starting at -2000 and 0 hold auction 1 twice, auction 2 once (0 only); 2000: 2 once;
    # 8000 and 10000: auction 2 twice.
    assert out == [
        {"auction": 1, "num": 2},
        {"auction": 1, "num": 2},
        {"auction": 2, "num": 1},
        {"auction": 2, "num": 2},
        {"auction": 2, "num": 2},
    ]
    tie = ref.q5([bid(1, 1, 0), bid(2, 1, 0)], size_ms=2_000, slide_ms=2_000)
    assert tie == [{"auction": 1, "num": 1}, {"auction": 2, "num": 1}]


def test_q7_finds_the_highest_bids_per_window_including_one_at_the_end() -> None:
    events = [bid(1, 5, 0), bid(2, 9, 3_000), bid(3, 9, 9_999), bid(4, 9, 10_000), bid(5, 4, 12_000)]
    out = ref.q7(events)
    row = {"bidder": 1001, "extra": ""}
    assert out == [
        {"auction": 2, "price": 9, "dateTime": 3_000, **row},
        {"auction": 3, "price": 9, "dateTime": 9_999, **row},
        {"auction": 4, "price": 9, "dateTime": 10_000, **row},  # the next window's, at this one's end
        {"auction": 4, "price": 9, "dateTime": 10_000, **row},  # and its own window's highest
    ]


def test_q8_finds_people_who_sold_in_the_window_they_registered() -> None:
    events = [
        person(1000, 1_000, name="Kate Smith"),
        person(1001, 2_000, name="Paul White"),
        auction(1000, 3_000, seller=1000),
        auction(1001, 4_000, seller=1000),  # twice in one window: once in the output
        auction(1002, 12_000, seller=1001),  # the next window
        person(1002, 15_000, name="John Jones"),
        auction(1003, 16_000, seller=1002),
    ]
    assert ref.q8(events) == [
        {"id": 1000, "name": "Kate Smith", "stime": 0},
        {"id": 1002, "name": "John Jones", "stime": 10_000},
    ]


def test_q11_counts_bids_per_bidder_session() -> None:
    events = [
        bid(1, 1, 0, bidder=7),
        bid(1, 1, 10_000, bidder=7),  # exactly the gap later: the windows touch and merge
        bid(1, 1, 20_001, bidder=7),  # more than the gap: a new session
        bid(1, 1, 5_000, bidder=8),
    ]
    assert ref.q11(events) == [
        {"bidder": 7, "bid_count": 2, "starttime": 0, "endtime": 20_000},
        {"bidder": 7, "bid_count": 1, "starttime": 20_001, "endtime": 30_001},
        {"bidder": 8, "bid_count": 1, "starttime": 5_000, "endtime": 15_000},
    ]


def test_the_queries_find_results_on_generated_events() -> None:
    """The reference generator keeps ids and categories small so the queries match on small inputs."""
    events = [nx.event(n) for n in range(20_000)]
    for name, query in ref.QUERIES.items():
        assert query(events), name
    assert len(ref.q0(events)) == 46 * 20_000 // 50
