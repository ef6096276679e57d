"""The Nexmark benchmark's events: people, auctions and bids, generated from the event number alone.

Pure values and rules, no I/O. ``event(n, config)`` is the n-th event of the stream; it depends only
on ``n`` and the config, never on which events were generated before it, so a replay (or another
subtask, or another process) gets the same event, and ``event_json(n, config)`` the same bytes.

The rules follow the reference generator (the nexmark/nexmark repository's ``NexmarkGenerator`` and
its ``PersonGenerator``, ``AuctionGenerator``, ``BidGenerator``, ``PriceGenerator``,
``StringsGenerator``; Apache Beam's Nexmark is the same generator):

- the event id is ``first_event_id + n``; of every 50 ids (``person:auction:bid = 1:3:46``) the first
  is a person, the next 3 are auctions, the other 46 bids;
- person and auction ids are dense, counted from the event id (``last_person_id``,
  ``last_auction_id``) and start at 1000; a new auction's seller and a bid's bidder are, with
  probability ``1 - 1/hot_sellers_ratio`` (``hot_bidders_ratio``), a "hot" person (the first, resp.
  second, of the latest batch of 100 people), otherwise one of the ``num_active_people`` latest people
  or up to 10 ids ahead; a bid's auction is, with probability ``1 - 1/hot_auction_ratio``, the first
  of the latest batch of 100 auctions, otherwise one of the ``in_flight_auctions`` latest auctions or
  up to 10 ids ahead (ids ahead: the reference's way of letting a bid come before its auction);
- event time is ``base_time_ms + n * 1000 // events_per_second`` (one timeline, no out-of-order
  groups); an auction expires a random time after it opens, averaging the time the next
  ``in_flight_auctions`` auctions take to be created;
- a price is ``round(10 ** (6u) * 100)`` cents for u uniform in [0, 1);
- each event's ``extra`` pads it to about the average size (``avg_*_size``, ±20%).

Deviations from the reference, each for determinism or a reference bug:

- randomness: the reference draws from one ``SplittableRandom`` shared by the whole stream (so
  event n depends on the events before it, and its channel URLs on the JVM run). Here each event
  has its own counter-based stream (BLAKE2b of ``(seed, event id, block)``), each channel's URL
  one keyed by the channel number, and the reusable padding text is a fixed SHAKE-256 output.
  ``next_int`` is unbiased for every bound (the reference's ``LongGenerator`` is skewed above
  2**31). A random string takes its characters and "special character" decisions from one
  SHAKE-128 output keyed by one draw (about the reference's distribution, at a fraction of the
  cost);
- the reference (nexmark/nexmark) adds ``FIRST_PERSON_ID`` to a bid's bidder twice; Beam's
  generator, and this one, once, so bidders are people ids;
- timestamps are computed in integers (the reference multiplies by a double inter-event delay).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from weir.core import json_codec

PERSON: Final = 0
AUCTION: Final = 1
BID: Final = 2
"""The ``event_type`` values of the JSON form (as in the reference's Kafka table)."""

FIRST_PERSON_ID: Final = 1000
FIRST_AUCTION_ID: Final = 1000
FIRST_CATEGORY_ID: Final = 10
NUM_CATEGORIES: Final = 5
PERSON_ID_LEAD: Final = 10
AUCTION_ID_LEAD: Final = 10
HOT_BATCH: Final = 100
"""Hot sellers, bidders and auctions are chosen among the latest batch of this many ids."""

US_STATES: Final = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES: Final = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
FIRST_NAMES: Final = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES: Final = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
HOT_CHANNELS: Final = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS: Final = 10_000
HOT_CHANNELS_RATIO: Final = 2
DEFAULT_BASE_TIME_MS: Final = 1_700_000_000_000  # 2023-11-14T22:13:20Z


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's parameters; the defaults are the reference's (``NexmarkConfiguration``),
    except the base time, which the reference takes from the clock at start."""

    events_per_second: int = 10_000
    first_event_id: int = 0
    base_time_ms: int = DEFAULT_BASE_TIME_MS
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    num_active_people: int = 1000
    in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    avg_person_size: int = 200
    avg_auction_size: int = 500
    avg_bid_size: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        positive = (
            "events_per_second",
            "person_proportion",
            "auction_proportion",
            "bid_proportion",
            "num_active_people",
            "in_flight_auctions",
            "hot_auction_ratio",
            "hot_sellers_ratio",
            "hot_bidders_ratio",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"NexmarkConfig.{name} must be at least 1, not {getattr(self, name)}")
        if self.first_event_id < 0:
            raise ValueError(f"NexmarkConfig.first_event_id must not be negative, not {self.first_event_id}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion


DEFAULT_CONFIG: Final = NexmarkConfig()


# The events are pickled as their constructor's arguments (``__reduce__``), on the data plane between
# subtasks and in keyed state: a slots dataclass's own pickling goes through ``__setstate__`` and
# ``fields()``, about 3x the CPU per event. Pickles written before (keyed state in a savepoint) still
# load through that ``__setstate__``.


@dataclass(frozen=True, slots=True)
class Person:
    id: int
    name: str
    email_address: str
    credit_card: str
    city: str
    state: str
    date_time: int  # epoch ms
    extra: str

    def __reduce__(self) -> tuple[type[Person], tuple[Any, ...]]:
        return Person, (
            self.id, self.name, self.email_address, self.credit_card, self.city, self.state, self.date_time, self.extra
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Auction:
    id: int
    item_name: str
    description: str
    initial_bid: int  # cents
    reserve: int
    date_time: int  # epoch ms
    expires: int  # epoch ms
    seller: int  # Person.id
    category: int
    extra: str

    def __reduce__(self) -> tuple[type[Auction], tuple[Any, ...]]:
        return Auction, (
            self.id, self.item_name, self.description, self.initial_bid, self.reserve, self.date_time, self.expires,
            self.seller, self.category, self.extra,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bid:
    auction: int  # Auction.id
    bidder: int  # Person.id
    price: int  # cents
    channel: str
    url: str
    date_time: int  # epoch ms
    extra: str

    def __reduce__(self) -> tuple[type[Bid], tuple[Any, ...]]:
        return Bid, (self.auction, self.bidder, self.price, self.channel, self.url, self.date_time, self.extra)


Event = Person | Auction | Bid


# Ids and time, from the event id / number -------------------------------------------------------


def event_type(event_id: int, config: NexmarkConfig = DEFAULT_CONFIG) -> int:
    """PERSON, AUCTION or BID: what the event with this id is."""
    rem = event_id % config.total_proportion
    if rem < config.person_proportion:
        return PERSON
    return AUCTION if rem < config.person_proportion + config.auction_proportion else BID


def last_base0_person_id(event_id: int, config: NexmarkConfig = DEFAULT_CONFIG) -> int:
    """The latest person id (from 0) created at or before this event id: this event's own if it is a
    person."""
    epoch, offset = divmod(event_id, config.total_proportion)
    return epoch * config.person_proportion + min(offset, config.person_proportion - 1)


def last_base0_auction_id(event_id: int, config: NexmarkConfig = DEFAULT_CONFIG) -> int:
    """The latest auction id (from 0) created at or before this event id: this event's own if it is
    an auction (-1 before the first auction)."""
    epoch, offset = divmod(event_id, config.total_proportion)
    if offset < config.person_proportion:  # a person: the last auction of the previous epoch
        epoch -= 1
        offset = config.auction_proportion - 1
    elif offset >= config.person_proportion + config.auction_proportion:  # a bid: this epoch's last
        offset = config.auction_proportion - 1
    else:
        offset -= config.person_proportion
    return epoch * config.auction_proportion + offset


def event_timestamp(n: int, config: NexmarkConfig = DEFAULT_CONFIG) -> int:
    """Event time (epoch ms) of event number ``n``: the base time plus n inter-event delays."""
    return config.base_time_ms + n * 1000 // config.events_per_second


# Randomness: a counter-based stream per event ------------------------------------------------

_MASK64: Final = (1 << 64) - 1
_WORDS: Final = struct.Struct("<8Q")
_EVENT_DOMAIN: Final = b"weir.core.nexmark event"  # the stream's key: unchanged since the module moved
_CHANNEL_DOMAIN: Final = b"weir.core.nexmark channel"


class _Random:
    """A random stream from a key: 64-bit words from BLAKE2b of (key, block counter), 8 per block.
    A counter-based generator: the stream of a key needs no state but the key, so event n's draws
    need no earlier event's. One hash call gives a bid's draws (a draw in pure Python arithmetic,
    as SplitMix64, costs ~4x more)."""

    __slots__ = ("_key", "_block", "_words")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._block = 0
        self._words: list[int] = []

    def next_u64(self) -> int:
        words = self._words
        if not words:
            digest = hashlib.blake2b(self._key + self._block.to_bytes(4, "little"), digest_size=64).digest()
            words.extend(_WORDS.unpack(digest))
            self._block += 1
        return words.pop()

    def next_int(self, bound: int) -> int:
        """Uniform in [0, bound) (Lemire's multiply-shift with rejection: unbiased)."""
        m = self.next_u64() * bound
        low = m & _MASK64
        if low < bound:
            threshold = ((1 << 64) - bound) % bound
            while low < threshold:
                m = self.next_u64() * bound
                low = m & _MASK64
        return m >> 64

    def next_double(self) -> float:
        """Uniform in [0, 1), 53 random bits."""
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))


def _key(domain: bytes, seed: int, number: int) -> bytes:
    return b"%s %d %d:" % (domain, seed, number)


def _event_random(event_id: int, config: NexmarkConfig) -> _Random:
    return _Random(_key(_EVENT_DOMAIN, config.seed, event_id))


_LETTERS: Final = bytes(ord("a") + i % 26 for i in range(256))
_REUSABLE_EXTRA: Final = hashlib.shake_256(b"weir.core.nexmark extra").digest(1 << 16).translate(_LETTERS).decode()


_SPECIAL_BYTES: Final = 20  # of 256: the "special character" one time in 12.8 (the reference: 1 in 13)


def _string_table(special: str) -> bytes:
    return bytes(ord(special) if b < _SPECIAL_BYTES else ord("a") + (b - _SPECIAL_BYTES) % 26 for b in range(256))


_STRING_TABLES: Final = {" ": _string_table(" "), "_": _string_table("_")}


def _next_string(rnd: _Random, max_length: int, special: str = " ") -> str:
    """A random string of 3 to ``max_length - 1`` characters: letters and, about one in 13,
    ``special``; trimmed of spaces at both ends (as the reference's ``trim``). The characters come
    from one SHAKE-128 output keyed by one draw (one C call, where a draw per character costs ~30x)."""
    length = 3 + rnd.next_int(max_length - 3)
    raw = hashlib.shake_128(rnd.next_u64().to_bytes(8, "little")).digest(length)
    return raw.translate(_STRING_TABLES[special]).decode().strip(" ")


def _next_exact_string(rnd: _Random, length: int) -> str:
    if length < len(_REUSABLE_EXTRA) // 2:
        offset = rnd.next_int(len(_REUSABLE_EXTRA) - length)
        return _REUSABLE_EXTRA[offset : offset + length]
    key = rnd.next_u64().to_bytes(8, "big")
    return hashlib.shake_256(key).digest(length).translate(_LETTERS).decode()


def _next_extra(rnd: _Random, current_size: int, average_size: int) -> str:
    """Padding such that ``current_size`` plus its length averages ``average_size`` (±20%)."""
    if current_size > average_size:
        return ""
    wanted = average_size - current_size
    delta = int(wanted * 0.2 + 0.5)  # Java's Math.round: half up
    size = wanted - delta + (rnd.next_int(2 * delta) if delta else 0)
    return _next_exact_string(rnd, size)


def _next_price(rnd: _Random) -> int:
    """A price in cents, log-uniform from $1 to $1,000,000 (Java's Math.round: half up)."""
    return int(10.0 ** (rnd.next_double() * 6.0) * 100.0 + 0.5)


def _next_base0_person_id(event_id: int, rnd: _Random, config: NexmarkConfig) -> int:
    """One of the active people (the latest ``num_active_people``) or up to PERSON_ID_LEAD ahead."""
    people = last_base0_person_id(event_id, config) + 1
    active = min(people, config.num_active_people)
    return people - active + rnd.next_int(active + PERSON_ID_LEAD)


def _next_base0_auction_id(event_id: int, rnd: _Random, config: NexmarkConfig) -> int:
    """One of the auctions likely in flight (the latest ``in_flight_auctions``) or up to
    AUCTION_ID_LEAD ahead."""
    last = last_base0_auction_id(event_id, config)
    first = max(last - config.in_flight_auctions, 0)
    return first + rnd.next_int(last - first + 1 + AUCTION_ID_LEAD)


def _base_url(rnd: _Random) -> str:
    parts = "/".join(_next_string(rnd, 5, "_") for _ in range(3))
    return f"https://www.nexmark.com/{parts}/item.htm?query=1"


@functools.cache
def _hot_url(index: int) -> str:
    return _base_url(_Random(_key(_CHANNEL_DOMAIN, -1, index)))


@functools.lru_cache(maxsize=CHANNELS)
def _channel_url(channel: int) -> str:
    rnd = _Random(_key(_CHANNEL_DOMAIN, 0, channel))
    url = _base_url(rnd)
    if rnd.next_int(10) > 0:
        reversed_bits = int(f"{channel:032b}"[::-1], 2)  # Java's Integer.reverse, then abs
        url += f"&channel_id={abs(reversed_bits - (1 << 32) if reversed_bits >= 1 << 31 else reversed_bits)}"
    return url


# The events -----------------------------------------------------------------------------------


def event(n: int, config: NexmarkConfig = DEFAULT_CONFIG) -> Event:
    """The event number ``n`` (from 0) of the stream: the same value for the same ``n`` and config."""
    if n < 0:
        raise ValueError(f"a Nexmark event number is not negative, not {n}")
    event_id = config.first_event_id + n
    rnd = _event_random(event_id, config)
    timestamp = event_timestamp(n, config)
    kind = event_type(event_id, config)
    if kind == PERSON:
        return _person(event_id, rnd, timestamp, config)
    if kind == AUCTION:
        return _auction(n, event_id, rnd, timestamp, config)
    return _bid(event_id, rnd, timestamp, config)


def _person(event_id: int, rnd: _Random, timestamp: int, config: NexmarkConfig) -> Person:
    name = f"{FIRST_NAMES[rnd.next_int(len(FIRST_NAMES))]} {LAST_NAMES[rnd.next_int(len(LAST_NAMES))]}"
    email = f"{_next_string(rnd, 7)}@{_next_string(rnd, 5)}.com"
    card = " ".join(f"{rnd.next_int(10_000):04d}" for _ in range(4))
    city = US_CITIES[rnd.next_int(len(US_CITIES))]
    state = US_STATES[rnd.next_int(len(US_STATES))]
    size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
    return Person(
        id=last_base0_person_id(event_id, config) + FIRST_PERSON_ID,
        name=name,
        email_address=email,
        credit_card=card,
        city=city,
        state=state,
        date_time=timestamp,
        extra=_next_extra(rnd, size, config.avg_person_size),
    )


def _auction(n: int, event_id: int, rnd: _Random, timestamp: int, config: NexmarkConfig) -> Auction:
    if rnd.next_int(config.hot_sellers_ratio) > 0:
        seller = last_base0_person_id(event_id, config) // HOT_BATCH * HOT_BATCH
    else:
        seller = _next_base0_person_id(event_id, rnd, config)
    category = FIRST_CATEGORY_ID + rnd.next_int(NUM_CATEGORIES)
    initial_bid = _next_price(rnd)
    # The auction lasts on average as long as the next in_flight_auctions auctions take to appear.
    events_for_auctions = config.in_flight_auctions * config.total_proportion // config.auction_proportion
    horizon_ms = event_timestamp(n + events_for_auctions, config) - timestamp
    expires = timestamp + 1 + rnd.next_int(max(horizon_ms * 2, 1))
    name = _next_string(rnd, 20)
    description = _next_string(rnd, 100)
    reserve = initial_bid + _next_price(rnd)
    size = 8 + len(name) + len(description) + 8 + 8 + 8 + 8 + 8
    return Auction(
        id=last_base0_auction_id(event_id, config) + FIRST_AUCTION_ID,
        item_name=name,
        description=description,
        initial_bid=initial_bid,
        reserve=reserve,
        date_time=timestamp,
        expires=expires,
        seller=seller + FIRST_PERSON_ID,
        category=category,
        extra=_next_extra(rnd, size, config.avg_auction_size),
    )


def _bid(event_id: int, rnd: _Random, timestamp: int, config: NexmarkConfig) -> Bid:
    if rnd.next_int(config.hot_auction_ratio) > 0:
        auction = last_base0_auction_id(event_id, config) // HOT_BATCH * HOT_BATCH
    else:
        auction = _next_base0_auction_id(event_id, rnd, config)
    if rnd.next_int(config.hot_bidders_ratio) > 0:  # the second of the batch: hot bidders are not hot sellers
        bidder = last_base0_person_id(event_id, config) // HOT_BATCH * HOT_BATCH + 1
    else:
        bidder = _next_base0_person_id(event_id, rnd, config)
    price = _next_price(rnd)
    if rnd.next_int(HOT_CHANNELS_RATIO) > 0:
        i = rnd.next_int(len(HOT_CHANNELS))
        channel, url = HOT_CHANNELS[i], _hot_url(i)
    else:
        number = rnd.next_int(CHANNELS)
        channel, url = f"channel-{number}", _channel_url(number)
    return Bid(
        auction=auction + FIRST_AUCTION_ID,
        bidder=bidder + FIRST_PERSON_ID,
        price=price,
        channel=channel,
        url=url,
        date_time=timestamp,
        extra=_next_extra(rnd, 8 + 8 + 8 + 8, config.avg_bid_size),
    )


# The JSON form --------------------------------------------------------------------------------

_FIELDS: Final[dict[type, tuple[tuple[str, str], ...]]] = {
    Person: (
        ("id", "id"),
        ("name", "name"),
        ("email_address", "emailAddress"),
        ("credit_card", "creditCard"),
        ("city", "city"),
        ("state", "state"),
        ("date_time", "dateTime"),
        ("extra", "extra"),
    ),
    Auction: (
        ("id", "id"),
        ("item_name", "itemName"),
        ("description", "description"),
        ("initial_bid", "initialBid"),
        ("reserve", "reserve"),
        ("date_time", "dateTime"),
        ("expires", "expires"),
        ("seller", "seller"),
        ("category", "category"),
        ("extra", "extra"),
    ),
    Bid: (
        ("auction", "auction"),
        ("bidder", "bidder"),
        ("price", "price"),
        ("channel", "channel"),
        ("url", "url"),
        ("date_time", "dateTime"),
        ("extra", "extra"),
    ),
}
_TYPE_OF: Final[dict[type, int]] = {Person: PERSON, Auction: AUCTION, Bid: BID}
_CLASS_OF: Final[dict[int, type]] = {PERSON: Person, AUCTION: Auction, BID: Bid}
_INT_FIELDS: Final = frozenset(
    {"id", "initialBid", "reserve", "dateTime", "expires", "seller", "category", "auction", "bidder", "price"}
)


def to_dict(value: Event) -> dict[str, Any]:
    """The event as a flat dict with the reference's field names (``dateTime``, ``itemName``, ...)
    and its ``event_type`` (PERSON, AUCTION or BID)."""
    out: dict[str, Any] = {"event_type": _TYPE_OF[type(value)]}
    for attribute, name in _FIELDS[type(value)]:
        out[name] = getattr(value, attribute)
    return out


def from_dict(record: Mapping[str, Any]) -> Event:
    """The event a :func:`to_dict` dict describes. Raises ValueError when it is not one: an unknown
    ``event_type``, a missing field or one of the wrong type."""
    kind = record.get("event_type")
    cls = _CLASS_OF.get(kind) if type(kind) is int else None
    if cls is None:
        raise ValueError(f"not a Nexmark event: event_type {kind!r} is not 0 (person), 1 (auction) or 2 (bid)")
    values: dict[str, Any] = {}
    for attribute, name in _FIELDS[cls]:
        value = record.get(name)
        wanted = int if name in _INT_FIELDS else str
        if type(value) is not wanted:
            raise ValueError(f"Nexmark {cls.__name__.lower()} field {name!r} must be {wanted.__name__}, not {value!r}")
        values[attribute] = value
    return cls(**values)


def event_json(n: int, config: NexmarkConfig = DEFAULT_CONFIG) -> bytes:
    """Event ``n`` as compact JSON with sorted keys (Weir's JSON codec): :func:`to_dict`'s fields."""
    return encode_event(event(n, config))


def encode_event(value: Event) -> bytes:
    return json_codec.encode(to_dict(value))


class _PersonRecord(msgspec.Struct, tag_field="event_type", tag=PERSON, rename="camel"):
    id: int
    name: str
    email_address: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str


class _AuctionRecord(msgspec.Struct, tag_field="event_type", tag=AUCTION, rename="camel"):
    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str


class _BidRecord(msgspec.Struct, tag_field="event_type", tag=BID, rename="camel"):
    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    date_time: int
    extra: str


_decode_typed: Final = msgspec.json.Decoder(_BidRecord | _PersonRecord | _AuctionRecord).decode
"""The JSON form of an event straight into a typed record, in one call: the ``event_type`` tag picks
the kind, every field is checked for its type (``int`` refuses a bool or a float, as ``from_dict``
does) and unknown fields are ignored. What it refuses is decided again by the general path, which
gives the error."""
_DecodeFailed: Final = (msgspec.DecodeError, UnicodeDecodeError, TypeError)


def decode_event(raw: bytes | None) -> Event:
    """A Kafka record's value as its event (a job's ``deserializer``): raises ValueError (the record
    is dead-lettered) when it is not JSON or not a Nexmark event.

    The typed decoder takes each valid event in one pass (about half the CPU of a dict and
    :func:`from_dict`); anything it refuses goes through :func:`json_codec.decode` and
    :func:`from_dict`, which accept the same events and name what is wrong with the others."""
    try:
        typed = _decode_typed(raw)  # type: ignore[arg-type]
    except _DecodeFailed:
        pass
    else:
        match typed:
            case _BidRecord():
                return Bid(
                    typed.auction, typed.bidder, typed.price, typed.channel, typed.url, typed.date_time, typed.extra
                )
            case _PersonRecord():
                return Person(
                    typed.id, typed.name, typed.email_address, typed.credit_card, typed.city, typed.state,
                    typed.date_time, typed.extra,
                )  # fmt: skip
            case _AuctionRecord():
                return Auction(
                    typed.id, typed.item_name, typed.description, typed.initial_bid, typed.reserve,
                    typed.date_time, typed.expires, typed.seller, typed.category, typed.extra,
                )  # fmt: skip
    if raw is None:
        raise ValueError("record has no value")
    record = json_codec.decode(raw)
    if not isinstance(record, dict):
        raise ValueError("a Nexmark event is a JSON object")
    return from_dict(record)


def event_time(value: Event) -> int:
    """The event's time, epoch ms (a source's ``timestamp``)."""
    return value.date_time


def is_bid(value: Event) -> bool:
    return type(value) is Bid


def is_person(value: Event) -> bool:
    return type(value) is Person


def is_auction(value: Event) -> bool:
    return type(value) is Auction
