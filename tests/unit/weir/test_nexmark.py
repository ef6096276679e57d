"""The Nexmark generator: deterministic by event number, the reference's proportions, id and time
rules, and its JSON form."""

from __future__ import annotations

import collections
import copyreg
import dataclasses
import hashlib
import io
import json
import pickle
import random
from typing import Any

import pytest

from weir import nexmark as nx
from weir.core import json_codec, serde
from weir.nexmark import Auction, Bid, NexmarkConfig, Person

N = 10_000


@pytest.fixture(scope="module")
def events() -> list[nx.Event]:
    return [nx.event(i) for i in range(N)]


def test_event_n_is_the_same_bytes_in_any_order_and_replay() -> None:
    numbers = list(range(2_000))
    forward = {n: nx.event_json(n) for n in numbers}
    shuffled = numbers[:]
    random.Random(7).shuffle(shuffled)
    assert {n: nx.event_json(n) for n in shuffled} == forward
    assert [nx.event_json(n) for n in range(1_999, 999, -1)] == [forward[n] for n in range(1_999, 999, -1)]
    assert nx.event(12_345_678) == nx.event(12_345_678)


def test_the_seed_and_first_event_id_change_the_stream() -> None:
    other_seed = NexmarkConfig(seed=1)
    assert [nx.event_json(n) for n in range(50)] != [nx.event_json(n, other_seed) for n in range(50)]
    shifted = NexmarkConfig(first_event_id=50)
    assert nx.event(0, shifted) == dataclasses.replace(nx.event(50), date_time=nx.event_timestamp(0))


def test_proportions_are_one_person_three_auctions_46_bids_per_50(events: list[nx.Event]) -> None:
    assert [type(e) for e in events[:50]] == [Person] + [Auction] * 3 + [Bid] * 46
    counts = collections.Counter(type(e) for e in events)
    assert counts == {Person: N // 50, Auction: 3 * N // 50, Bid: 46 * N // 50}


def test_person_and_auction_ids_are_dense_from_1000(events: list[nx.Event]) -> None:
    assert [e.id for e in events if isinstance(e, Person)] == list(range(1000, 1000 + N // 50))
    assert [e.id for e in events if isinstance(e, Auction)] == list(range(1000, 1000 + 3 * N // 50))


def test_references_point_at_existing_ids_or_at_most_the_lead_ahead(events: list[nx.Event]) -> None:
    last_person = last_auction = -1
    for e in events:
        if isinstance(e, Person):
            last_person = e.id
        elif isinstance(e, Auction):
            last_auction = e.id
            assert nx.FIRST_PERSON_ID <= e.seller <= last_person + nx.PERSON_ID_LEAD
            assert nx.FIRST_CATEGORY_ID <= e.category < nx.FIRST_CATEGORY_ID + nx.NUM_CATEGORIES
            assert e.reserve >= e.initial_bid
        else:
            assert nx.FIRST_AUCTION_ID <= e.auction <= last_auction + nx.AUCTION_ID_LEAD
            assert nx.FIRST_PERSON_ID <= e.bidder <= last_person + nx.PERSON_ID_LEAD


def test_hot_ratios_are_roughly_as_configured(events: list[nx.Event]) -> None:
    """P(hot) = 1 - 1/ratio: hot auctions 1/2, hot bidders and sellers 3/4 (defaults)."""
    bids = [(n, e) for n, e in enumerate(events) if isinstance(e, Bid)]
    hot_auction = sum(e.auction - nx.FIRST_AUCTION_ID == nx.last_base0_auction_id(n) // 100 * 100 for n, e in bids)
    hot_bidder = sum(e.bidder - nx.FIRST_PERSON_ID == nx.last_base0_person_id(n) // 100 * 100 + 1 for n, e in bids)
    # A cold choice can land on the hot id too, so the share is at least the configured one.
    assert 0.5 <= hot_auction / len(bids) <= 0.53
    assert 0.75 <= hot_bidder / len(bids) <= 0.78
    auctions = [(n, e) for n, e in enumerate(events) if isinstance(e, Auction)]
    hot_seller = sum(e.seller - nx.FIRST_PERSON_ID == nx.last_base0_person_id(n) // 100 * 100 for n, e in auctions)
    assert 0.72 <= hot_seller / len(auctions) <= 0.80


def test_more_hot_bids_with_a_higher_ratio() -> None:
    config = NexmarkConfig(hot_auction_ratio=10)
    bids = [(n, e) for n in range(5_000) if isinstance(e := nx.event(n, config), Bid)]
    hot = sum(e.auction - nx.FIRST_AUCTION_ID == nx.last_base0_auction_id(n, config) // 100 * 100 for n, e in bids)
    assert 0.88 <= hot / len(bids) <= 0.93


def test_timestamps_are_monotone_at_the_configured_rate(events: list[nx.Event]) -> None:
    times = [e.date_time for e in events]
    assert times == sorted(times)
    assert times[0] == nx.DEFAULT_BASE_TIME_MS
    assert times[-1] - times[0] == (N - 1) * 1000 // 10_000  # 10,000 events per second
    assert times == [nx.event_timestamp(n) for n in range(N)]
    slow = NexmarkConfig(events_per_second=3, base_time_ms=0)
    assert [nx.event_timestamp(n, slow) for n in range(7)] == [0, 333, 666, 1000, 1333, 1666, 2000]
    assert nx.event(4, slow).date_time == 1333


def test_auctions_expire_after_they_open_within_twice_the_horizon(events: list[nx.Event]) -> None:
    auctions = [e for e in events if isinstance(e, Auction)]
    # 100 in-flight auctions take 1,666 events = 166 ms at 10,000 events/s: lengths average ~166 ms.
    assert all(e.date_time < e.expires <= e.date_time + 2 * 167 for e in auctions)
    mean = sum(e.expires - e.date_time for e in auctions) / len(auctions)
    assert 140 <= mean <= 195


def test_prices_are_log_uniform_between_one_and_a_million_dollars(events: list[nx.Event]) -> None:
    prices = [e.price for e in events if isinstance(e, Bid)]
    assert all(100 <= p <= 100_000_000 for p in prices)
    below_100_dollars = sum(p < 10_000 for p in prices) / len(prices)  # 10**(6u) < 100: u < 1/3
    assert 0.30 <= below_100_dollars <= 0.37


def test_sizes_are_about_the_configured_averages(events: list[nx.Event]) -> None:
    bids = [e for e in events if isinstance(e, Bid)]
    mean_extra = sum(len(e.extra) for e in bids) / len(bids)
    assert 63 <= mean_extra <= 73  # 100 - 32 bytes of numbers
    auctions = [e for e in events if isinstance(e, Auction)]
    assert all(len(e.item_name) < 20 and len(e.description) < 100 for e in auctions)
    larger = NexmarkConfig(avg_bid_size=100_000)
    assert 79_000 <= len(nx.event(10, larger).extra) <= 120_000  # beyond the reusable padding text


def test_person_fields_come_from_the_reference_lists(events: list[nx.Event]) -> None:
    people = [e for e in events if isinstance(e, Person)]
    assert {p.state for p in people} == set(nx.US_STATES)
    assert {p.city for p in people} == set(nx.US_CITIES)
    for p in people:
        first, last = p.name.split(" ")
        assert first in nx.FIRST_NAMES and last in nx.LAST_NAMES
        assert p.email_address.endswith(".com") and "@" in p.email_address
        assert [len(g) for g in p.credit_card.split(" ")] == [4, 4, 4, 4]


def test_bid_channels_are_hot_half_the_time_with_stable_urls(events: list[nx.Event]) -> None:
    bids = [e for e in events if isinstance(e, Bid)]
    hot = [b for b in bids if b.channel in nx.HOT_CHANNELS]
    assert 0.47 <= len(hot) / len(bids) <= 0.53
    url_of: dict[str, str] = {}
    for b in bids:
        assert url_of.setdefault(b.channel, b.url) == b.url
        assert b.url.startswith("https://www.nexmark.com/")


def test_json_round_trip(events: list[nx.Event]) -> None:
    for n in range(200):
        raw = nx.event_json(n)
        assert nx.decode_event(raw) == events[n]
        assert json.loads(raw) == nx.to_dict(events[n])
    bid = json.loads(nx.event_json(10))
    assert bid["event_type"] == nx.BID
    assert set(bid) == {"event_type", "auction", "bidder", "price", "channel", "url", "dateTime", "extra"}
    person = json.loads(nx.event_json(0))
    assert person["event_type"] == nx.PERSON and {"emailAddress", "creditCard", "dateTime"} <= set(person)
    auction = json.loads(nx.event_json(1))
    assert auction["event_type"] == nx.AUCTION and {"itemName", "initialBid", "expires"} <= set(auction)
    assert b" " not in raw and raw == json.dumps(json.loads(raw), separators=(",", ":"), sort_keys=True).encode()


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"not json",
        b"[1]",
        b'{"event_type": 3}',
        b'{"event_type": "bid"}',
        b'{"event_type": 2, "auction": 1}',
        b'{"event_type":2,"auction":"1","bidder":1,"price":1,"channel":"c","url":"u","dateTime":1,"extra":""}',
    ],
)
def test_decoding_refuses_what_is_not_an_event(raw: bytes | None) -> None:
    with pytest.raises(ValueError):
        nx.decode_event(raw)


def _general_decode(raw: bytes | None) -> nx.Event:
    """What decode_event did before its typed decoder: the JSON codec's dict, then from_dict."""
    if raw is None:
        raise ValueError("record has no value")
    record = json_codec.decode(raw)
    if not isinstance(record, dict):
        raise ValueError("a Nexmark event is a JSON object")
    return nx.from_dict(record)


def _outcome(decode: Any, raw: bytes | None) -> tuple[str, Any]:
    try:
        return "event", decode(raw)
    except Exception as exc:
        return type(exc).__name__, str(exc)


BID_FIELDS = b'"auction":1,"bidder":2,"price":3,"channel":"c","url":"u","dateTime":4,"extra":"x"'


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"not json",
        b"[1]",
        b"null",
        b'{"event_type": 3}',
        b'{"event_type": "bid"}',
        b'{"event_type": 2.0,' + BID_FIELDS + b"}",
        b'{"event_type": true,' + BID_FIELDS + b"}",
        b'{"event_type": 2, "auction": 1}',
        b'{"event_type":2,' + BID_FIELDS.replace(b'"price":3', b'"price":true') + b"}",
        b'{"event_type":2,' + BID_FIELDS.replace(b'"price":3', b'"price":3.0') + b"}",
        b'{"event_type":2,' + BID_FIELDS.replace(b'"price":3', b'"price":1e2') + b"}",
        b'{"event_type":2,' + BID_FIELDS.replace(b'"price":3', b'"price":NaN') + b"}",
        b'{"event_type":2,' + BID_FIELDS.replace(b'"price":3', b'"price":123456789012345678901234567890') + b"}",
        b'{"event_type":2,' + BID_FIELDS.replace(b'"url":"u"', b'"url":null') + b"}",
        b'{"event_type":2,' + BID_FIELDS + b',"price":"three"}',  # a duplicate key: the last one counts
        b'{"event_type":2,"price":"three",' + BID_FIELDS + b"}",
        b'{"event_type":2,' + BID_FIELDS + b',"unknown":[1,{"a":2}]}',
        b'{"event_type":2,' + BID_FIELDS + b"}",
        b'{"event_type":2,' + BID_FIELDS + b"} trailing",
        b'{"event_type":2,' + BID_FIELDS + b"}" + b'{"event_type":2}',
        b'\xef\xbb\xbf{"event_type":2,' + BID_FIELDS + b"}",  # a UTF-8 byte order mark: json.loads takes it
        b'{"event_type":2,' + BID_FIELDS.replace(b'"x"', b'"\\ud800"') + b"}",  # a lone surrogate escape
        b'{"event_type":2,' + BID_FIELDS.replace(b'"x"', b'"\xff"') + b"}",  # not UTF-8
    ],
)
def test_the_typed_decoder_answers_as_the_general_path(raw: bytes | None) -> None:
    """decode_event's one-pass typed decoder must accept exactly the events the dict path accepts,
    with equal values, and leave every refusal (and its message) to that path."""
    assert _outcome(nx.decode_event, raw) == _outcome(_general_decode, raw)


def test_the_typed_decoder_reads_every_kind_of_event(events: list[nx.Event]) -> None:
    raws = [nx.event_json(n) for n in range(N)]
    assert [nx.decode_event(raw) for raw in raws] == [_general_decode(raw) for raw in raws] == events


def test_events_pickled_before_their_reduce_still_load(events: list[nx.Event]) -> None:
    """Keyed state in a savepoint holds events pickled by the slots dataclass's own protocol
    (``copyreg.__newobj__`` and the ``__setstate__`` state): they still load, equal."""

    class DataclassProtocol(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) in (Person, Auction, Bid):
                return copyreg.__newobj__, (type(obj),), obj.__getstate__()
            return NotImplemented

    sample = [events[0], events[1], events[4]]
    assert {type(e) for e in sample} == {Person, Auction, Bid}
    for event in sample:
        out = io.BytesIO()
        DataclassProtocol(out, protocol=5).dump(event)
        old = out.getvalue()
        assert old != pickle.dumps(event, protocol=5)  # the old form, not today's
        assert serde.loads_value(old) == event


def test_helpers_for_job_files(events: list[nx.Event]) -> None:
    assert nx.is_person(events[0]) and nx.is_auction(events[1]) and nx.is_bid(events[4])
    assert not nx.is_bid(events[0])
    assert nx.event_time(events[4]) == events[4].date_time


def test_a_config_refuses_meaningless_values() -> None:
    with pytest.raises(ValueError, match="events_per_second"):
        NexmarkConfig(events_per_second=0)
    with pytest.raises(ValueError, match="event number"):
        nx.event(-1)


def test_events_cross_the_data_plane(events: list[nx.Event]) -> None:
    """Records between TaskManagers are pickled (weir.core.serde)."""
    assert [serde.loads_value(serde.dumps_value(e)) for e in events[:50]] == events[:50]


def test_the_stream_is_pinned() -> None:
    """The first 1,000 events' bytes: a change here changes every stored topic and result (make it
    on purpose, with a new digest)."""
    digest = hashlib.sha256(b"".join(nx.event_json(n) for n in range(1000))).hexdigest()
    assert digest == "31ccb48ff6e5d293d8dc9e6c47ceade90e5d4f4cc9ca944737879caaee767e8e"
