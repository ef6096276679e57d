"""The Nexmark queries in plain Python: what each query outputs for a finite list of events.

Each function takes the events in stream order (``weir.nexmark`` values) and returns the
query's result as a list of dicts, named as the output columns of the query's SQL in the
nexmark/nexmark repository (``nexmark-flink/src/main/resources/queries/q*.sql``), timestamps as epoch
ms. q0-q2 are per-record and ordered as their input; the others are multisets (compare them with
:func:`multiset`): a join's or a window's result as it stands once every input was read and every
window closed, with no late events (the generator's event time is monotone).

Windows are aligned to the epoch, as Flink's TUMBLE and HOP: ``[start, start + size)``.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from weir.nexmark import Auction, Bid, Event, Person
from weir.tools.nexmark_functions import count_char

Row = dict[str, Any]


def multiset(rows: Iterable[Mapping[str, Any]]) -> collections.Counter[tuple[tuple[str, Any], ...]]:
    """Rows as a multiset (order and dict key order ignored), to compare a query's output."""
    return collections.Counter(tuple(sorted(row.items())) for row in rows)


def bids(events: Iterable[Event]) -> list[Bid]:
    return [e for e in events if type(e) is Bid]


def q0(events: Sequence[Event]) -> list[Row]:
    """Pass-through: every bid's ``auction, bidder, price, dateTime, extra``."""
    return [
        {"auction": b.auction, "bidder": b.bidder, "price": b.price, "dateTime": b.date_time, "extra": b.extra}
        for b in bids(events)
    ]


def euros(price_cents: int) -> float:
    """``0.908 * price`` as the reference's DECIMAL(23, 3): exact to 3 decimals, no rounding to an
    integer. ``price * 908 / 1000`` is the double nearest that decimal (Python's int true division
    rounds correctly), which JSON writes as the decimal itself; ``price * 0.908`` would not be."""
    return price_cents * 908 / 1000


def q1(events: Sequence[Event]) -> list[Row]:
    """Currency conversion: every bid with its price in euros (:func:`euros`)."""
    return [
        {"auction": b.auction, "bidder": b.bidder, "price": euros(b.price), "dateTime": b.date_time, "extra": b.extra}
        for b in bids(events)
    ]


def q2(events: Sequence[Event], modulus: int = 123) -> list[Row]:
    """Selection: ``auction, price`` of the bids on auctions whose id is a multiple of 123."""
    return [{"auction": b.auction, "price": b.price} for b in bids(events) if b.auction % modulus == 0]


Q3_STATES = frozenset({"OR", "ID", "CA"})
Q3_CATEGORY = 10


def q3(events: Sequence[Event]) -> list[Row]:
    """Local item suggestion: ``name, city, state, id`` for each auction of category 10 joined with
    its seller when the seller lives in OR, ID or CA (an inner join on ``seller = person.id``, over
    the whole stream: a person after its auctions joins too)."""
    people = {e.id: e for e in events if type(e) is Person and e.state in Q3_STATES}
    return [
        {"name": p.name, "city": p.city, "state": p.state, "id": a.id}
        for a in events
        if type(a) is Auction and a.category == Q3_CATEGORY and (p := people.get(a.seller)) is not None
    ]


def q4(events: Sequence[Event]) -> list[Row]:
    """Average closing price per category: ``id`` (the category) and ``final``, the average over the
    category's auctions of each auction's highest bid between its opening and its expiry (both
    inclusive: SQL's BETWEEN). An auction without such a bid has no closing price and does not count.
    The average is of BIGINTs, so an integer truncated as Flink's AVG of BIGINT is."""
    auctions = {e.id: e for e in events if type(e) is Auction}
    highest: dict[int, int] = {}
    for b in bids(events):
        a = auctions.get(b.auction)
        if a is not None and a.date_time <= b.date_time <= a.expires:
            highest[a.id] = max(highest.get(a.id, b.price), b.price)
    totals: dict[int, list[int]] = {}
    for auction_id, price in highest.items():
        total = totals.setdefault(auctions[auction_id].category, [0, 0])
        total[0] += price
        total[1] += 1
    return [{"id": category, "final": s // c} for category, (s, c) in sorted(totals.items())]  # prices > 0


def _bid_row(b: Bid) -> Row:
    return {
        "auction": b.auction,
        "bidder": b.bidder,
        "price": b.price,
        "channel": b.channel,
        "url": b.url,
        "dateTime": b.date_time,
        "extra": b.extra,
    }


def q18(events: Sequence[Event]) -> list[Row]:
    """Last bid: per bidder and auction the bid with the latest ``dateTime`` (of two at the same
    millisecond, the later in the stream), all its columns."""
    last: dict[tuple[int, int], Bid] = {}
    for b in bids(events):
        held = last.get((b.bidder, b.auction))
        if held is None or b.date_time >= held.date_time:
            last[(b.bidder, b.auction)] = b
    return [_bid_row(b) for b in last.values()]


def q18_ties(events: Sequence[Event]) -> list[list[Row]]:
    """The rows q18 chooses among where its choice is undefined: per bidder and auction with two or
    more bids at its latest ``dateTime``, those bids (Flink SQL keeps the last to arrive, which differs
    with the order partitions are read in; at the benchmark's 10M events/s of event time a hot bidder
    bids on a hot auction many times in one millisecond)."""
    latest: dict[tuple[int, int], list[Bid]] = {}
    for b in bids(events):
        held = latest.get((b.bidder, b.auction))
        if held is None or b.date_time > held[0].date_time:
            latest[(b.bidder, b.auction)] = [b]
        elif b.date_time == held[0].date_time:
            held.append(b)
    return [[_bid_row(b) for b in tied] for tied in latest.values() if len(tied) > 1]


def _top_bids(events: Sequence[Event]) -> list[list[Bid]]:
    """Each auction's bids, highest price first (of bids at the same price, the earlier in the
    stream first)."""
    per_auction: dict[int, list[Bid]] = collections.defaultdict(list)
    for b in bids(events):
        per_auction[b.auction].append(b)
    return [sorted(auction_bids, key=lambda b: -b.price) for auction_bids in per_auction.values()]  # stable


def _ranked_bid_row(b: Bid, number: int) -> Row:
    return {**_bid_row(b), "rank_number": number}


def q19(events: Sequence[Event], n: int = 10) -> list[Row]:
    """Auction top-10 price: per auction its ``n`` highest bids (of bids at the same price, the
    earlier in the stream first), each with its row number ``rank_number`` (1 the highest)."""
    return [
        _ranked_bid_row(b, number)
        for ranked in _top_bids(events)
        for number, b in enumerate(ranked[:n], start=1)
    ]


def q19_ties(events: Sequence[Event], n: int = 10) -> list[list[Row]]:
    """The rows q19 chooses among where its choice is undefined: per auction whose ``n``-th and
    ``n+1``-th highest bids have one price, every bid at that price, each numbered as the first of
    them (which of them make the top ``n`` is arrival order on Flink, the rows' values on Weir)."""
    groups: list[list[Row]] = []
    for ranked in _top_bids(events):
        if len(ranked) > n and ranked[n - 1].price == ranked[n].price:
            price = ranked[n].price
            first = next(i for i, b in enumerate(ranked) if b.price == price) + 1
            groups.append([_ranked_bid_row(b, first) for b in ranked if b.price == price])
    return groups


def hop_windows(timestamp: int, size_ms: int, slide_ms: int) -> list[int]:
    """The starts of the sliding windows ``[start, start + size)`` containing ``timestamp``."""
    last = timestamp - timestamp % slide_ms
    return list(range(last, timestamp - size_ms, -slide_ms))[::-1]


def q5(events: Sequence[Event], size_ms: int = 10_000, slide_ms: int = 2_000) -> list[Row]:
    """Hot items: per sliding window (10 s every 2 s) the auction(s) with the most bids:
    ``auction, num``; ties all appear."""
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for b in bids(events):
        for start in hop_windows(b.date_time, size_ms, slide_ms):
            counts[start][b.auction] += 1
    out: list[Row] = []
    for start in sorted(counts):
        most = max(counts[start].values())
        out.extend({"auction": a, "num": n} for a, n in sorted(counts[start].items()) if n >= most)
    return out


def q7(events: Sequence[Event], size_ms: int = 10_000) -> list[Row]:
    """Highest bid: per tumbling window of 10 s its highest price, and every bid of that price with a
    time between the window's end - 10 s and its end, both inclusive (the query's BETWEEN: a bid at
    exactly the end, in the next window, matches too): ``auction, price, bidder, dateTime, extra``.

    The reference SQL selects ``auction, price, bidder`` into columns ``auction, bidder, price``;
    here the values keep their own names."""
    all_bids = bids(events)
    highest: dict[int, int] = {}
    for b in all_bids:
        end = b.date_time - b.date_time % size_ms + size_ms
        highest[end] = max(highest.get(end, b.price), b.price)
    out: list[Row] = []
    for end, price in sorted(highest.items()):
        out.extend(
            {"auction": b.auction, "price": b.price, "bidder": b.bidder, "dateTime": b.date_time, "extra": b.extra}
            for b in all_bids
            if b.price == price and end - size_ms <= b.date_time <= end
        )
    return out


def q8(events: Sequence[Event], size_ms: int = 10_000) -> list[Row]:
    """Monitor new users: ``id, name, stime`` for each person who, in the same tumbling window of
    10 s (starting at ``stime``), registered and opened an auction as seller; once per window."""
    people: set[tuple[int, str, int]] = set()
    sellers: set[tuple[int, int]] = set()
    for e in events:
        start = e.date_time - e.date_time % size_ms
        if type(e) is Person:
            people.add((e.id, e.name, start))
        elif type(e) is Auction:
            sellers.add((e.seller, start))
    return [
        {"id": pid, "name": name, "stime": start}
        for pid, name, start in sorted(people, key=lambda p: (p[2], p[0], p[1]))
        if (pid, start) in sellers
    ]


def q11(events: Sequence[Event], gap_ms: int = 10_000) -> list[Row]:
    """User sessions: per bidder and session window (a new session when a bid comes more than 10 s
    after the bidder's previous one; Flink merges windows that touch), ``bidder, bid_count,
    starttime, endtime``: the first bid's time and the last bid's time + 10 s."""
    times: dict[int, list[int]] = collections.defaultdict(list)
    for b in bids(events):
        times[b.bidder].append(b.date_time)
    out: list[Row] = []
    for bidder in sorted(times):
        ordered = sorted(times[bidder])
        start = last = ordered[0]
        count = 0
        for t in ordered:
            if t - last > gap_ms:
                out.append({"bidder": bidder, "bid_count": count, "starttime": start, "endtime": last + gap_ms})
                start, count = t, 0
            last = t
            count += 1
        out.append({"bidder": bidder, "bid_count": count, "starttime": start, "endtime": last + gap_ms})
    return out


def day_of(ms: int) -> str:
    """``DATE_FORMAT(dateTime, 'yyyy-MM-dd')`` (UTC)."""
    return time.strftime("%Y-%m-%d", time.gmtime(ms // 1000))


def minute_of(ms: int) -> str:
    """``DATE_FORMAT(dateTime, 'HH:mm')`` (UTC)."""
    return time.strftime("%H:%M", time.gmtime(ms // 1000))


def q14(events: Sequence[Event]) -> list[Row]:
    """Calculation: the bids whose price in euros (``0.908 * price``, exact) is above 1,000,000 and
    below 50,000,000, with the hour of their time as ``bidTimeType`` (8-18 ``dayTime``, up to 6 or
    from 20 ``nightTime``, else ``otherTime``) and ``c_counts``, the ``c`` in ``extra``."""
    out: list[Row] = []
    for b in bids(events):
        if not 1_000_000_000 < b.price * 908 < 50_000_000_000:  # 0.908 * price in thousandths
            continue
        hour = b.date_time // 3_600_000 % 24
        kind = "dayTime" if 8 <= hour <= 18 else "nightTime" if hour <= 6 or hour >= 20 else "otherTime"
        out.append(
            {
                "auction": b.auction,
                "bidder": b.bidder,
                "price": euros(b.price),
                "bidTimeType": kind,
                "dateTime": b.date_time,
                "extra": b.extra,
                "c_counts": count_char(b.extra, "c"),
            }
        )
    return out


RANKS: Final = ((None, None), (None, 10_000), (10_000, 1_000_000), (1_000_000, None))
"""q15-q17's price ranks: all bids, then ``price < 10000``, ``10000 <= price < 1000000``, ``price >= 1000000``."""


def _in_rank(price: int, rank: tuple[int | None, int | None]) -> bool:
    low, high = rank
    return (low is None or price >= low) and (high is None or price < high)


def _rank_statistics(group: Sequence[Bid], *, distinct: bool) -> Row:
    """``total_bids, rank1_bids, ...`` (and, ``distinct``, the distinct bidders and auctions) of a group."""
    names = ("total", "rank1", "rank2", "rank3")
    row: Row = {f"{n}_bids": sum(1 for b in group if _in_rank(b.price, r)) for n, r in zip(names, RANKS, strict=True)}
    if distinct:
        for what in ("bidder", "auction"):
            for n, r in zip(names, RANKS, strict=True):
                row[f"{n}_{what}s"] = len({getattr(b, what) for b in group if _in_rank(b.price, r)})
    return row


def _grouped(events: Sequence[Event], key: Callable[[Bid], tuple[Any, ...]]) -> dict[tuple[Any, ...], list[Bid]]:
    groups: dict[tuple[Any, ...], list[Bid]] = collections.defaultdict(list)
    for b in bids(events):
        groups[key(b)].append(b)
    return groups


def q15(events: Sequence[Event]) -> list[Row]:
    """Bidding statistics per day: the bids, distinct bidders and distinct auctions, in all and per
    price rank (:data:`RANKS`). An updating result: this is its final table, one row per day."""
    return [
        {"day": day, **_rank_statistics(group, distinct=True)}
        for (day,), group in sorted(_grouped(events, lambda b: (day_of(b.date_time),)).items())
    ]


def q16(events: Sequence[Event]) -> list[Row]:
    """Channel statistics per channel and day: q15's figures and ``minute``, the latest ``HH:mm`` of
    the group's bids (a string maximum). The final table, one row per channel and day."""
    return [
        {
            "channel": channel,
            "day": day,
            "minute": max(minute_of(b.date_time) for b in group),
            **_rank_statistics(group, distinct=True),
        }
        for (channel, day), group in sorted(_grouped(events, lambda b: (b.channel, day_of(b.date_time))).items())
    ]


def q17(events: Sequence[Event]) -> list[Row]:
    """Auction statistics per auction and day: the bids in all and per price rank, and the minimum,
    maximum, average (of BIGINTs: truncated, as Flink's AVG) and sum of their prices. The final
    table, one row per auction and day."""
    out: list[Row] = []
    for (auction, day), group in sorted(_grouped(events, lambda b: (b.auction, day_of(b.date_time))).items()):
        prices = [b.price for b in group]
        out.append(
            {
                "auction": auction,
                "day": day,
                **_rank_statistics(group, distinct=False),
                "min_price": min(prices),
                "max_price": max(prices),
                "avg_price": sum(prices) // len(prices),  # prices > 0
                "sum_price": sum(prices),
            }
        )
    return out


Q21_CHANNELS: Final = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}
_CHANNEL_ID: Final = re.compile("(&|^)channel_id=([^&]*)")


def q21(events: Sequence[Event]) -> list[Row]:
    """Add channel id: the bids of the four named channels (``channel_id`` their number) and those
    whose URL has a ``channel_id=`` parameter (its value): ``auction, bidder, price, channel,
    channel_id``."""
    out: list[Row] = []
    for b in bids(events):
        found = _CHANNEL_ID.search(b.url)
        named = Q21_CHANNELS.get(b.channel.lower())
        if named is None and found is None:
            continue
        channel_id = named if named is not None else found.group(2) if found is not None else None
        out.append(
            {"auction": b.auction, "bidder": b.bidder, "price": b.price, "channel": b.channel, "channel_id": channel_id}
        )
    return out


def q22(events: Sequence[Event]) -> list[Row]:
    """URL directories: every bid with the 4th, 5th and 6th pieces of its URL split at ``/`` (empty
    pieces count; NULL past the end): ``auction, bidder, price, channel, dir1, dir2, dir3``."""
    out: list[Row] = []
    for b in bids(events):
        pieces = b.url.split("/")
        dirs = [pieces[i] if i < len(pieces) else None for i in (3, 4, 5)]
        out.append(
            {
                "auction": b.auction,
                "bidder": b.bidder,
                "price": b.price,
                "channel": b.channel,
                "dir1": dirs[0],
                "dir2": dirs[1],
                "dir3": dirs[2],
            }
        )
    return out


Q20_CATEGORY: Final = 10


def q20(events: Sequence[Event]) -> list[Row]:
    """Expand bid with auction: every bid joined with its auction when the auction is of category 10
    (an inner join over the whole stream: an auction after its bids joins too), the bid's and the
    auction's columns (``bid_dateTime``, ``bid_extra``, ``auction_dateTime``, ``auction_extra``)."""
    auctions = {e.id: e for e in events if type(e) is Auction and e.category == Q20_CATEGORY}
    return [
        {
            "auction": b.auction,
            "bidder": b.bidder,
            "price": b.price,
            "channel": b.channel,
            "url": b.url,
            "bid_dateTime": b.date_time,
            "bid_extra": b.extra,
            "itemName": a.item_name,
            "description": a.description,
            "initialBid": a.initial_bid,
            "reserve": a.reserve,
            "auction_dateTime": a.date_time,
            "expires": a.expires,
            "seller": a.seller,
            "category": a.category,
            "auction_extra": a.extra,
        }
        for b in bids(events)
        if (a := auctions.get(b.auction)) is not None
    ]


def q9(events: Sequence[Event]) -> list[Row]:
    """Winning bids: per auction, of its bids between its opening and its expiry (both inclusive:
    SQL's BETWEEN; a bid read before its auction counts too, the join being over the whole stream),
    the one with the highest price, of those the earliest (of two at the same millisecond the
    earlier in the stream: Flink's arrival order), with every column of the auction (``dateTime`` its
    opening) and the bid's ``auction``, ``bidder``, ``price``, ``bid_dateTime``, ``bid_extra``. An
    auction without such a bid is not in the result."""
    auctions = {e.id: e for e in events if type(e) is Auction}
    winning: dict[int, Bid] = {}
    for b in bids(events):
        a = auctions.get(b.auction)
        if a is None or not a.date_time <= b.date_time <= a.expires:
            continue
        held = winning.get(a.id)
        if held is None or (-b.price, b.date_time) < (-held.price, held.date_time):
            winning[a.id] = b
    return [
        {
            "id": a.id,
            "itemName": a.item_name,
            "description": a.description,
            "initialBid": a.initial_bid,
            "reserve": a.reserve,
            "dateTime": a.date_time,
            "expires": a.expires,
            "seller": a.seller,
            "category": a.category,
            "extra": a.extra,
            "auction": b.auction,
            "bidder": b.bidder,
            "price": b.price,
            "bid_dateTime": b.date_time,
            "bid_extra": b.extra,
        }
        for auction_id, b in winning.items()
        if (a := auctions[auction_id]) is not None
    ]


def q10(events: Sequence[Event]) -> list[Row]:
    """Log to file system: every bid with ``dt`` its day and ``hm`` its hour and minute (UTC), the
    table's partition columns."""
    return [
        {
            "auction": b.auction,
            "bidder": b.bidder,
            "price": b.price,
            "dateTime": b.date_time,
            "extra": b.extra,
            "dt": day_of(b.date_time),
            "hm": minute_of(b.date_time),
        }
        for b in bids(events)
    ]


SIDE_INPUT_ROWS: Final = 10_000
"""The Nexmark suite's side input (its ``SideInputGenerator --num 10000``): line ``i`` is ``i,i``."""


def side_input_text(rows: int = SIDE_INPUT_ROWS) -> str:
    """The suite's side input file, as its generator writes it: ``i,i`` for i in [0, rows)."""
    return "".join(f"{i},{i}\n" for i in range(rows))


def q13(events: Sequence[Event], rows: int = SIDE_INPUT_ROWS) -> list[Row]:
    """Bounded side input join: every bid with the side input's ``value`` of key ``auction % rows``
    (the side input holds every key in [0, rows), its value the key as text)."""
    return [
        {
            "auction": b.auction,
            "bidder": b.bidder,
            "price": b.price,
            "dateTime": b.date_time,
            "value": str(b.auction % rows),
        }
        for b in bids(events)
    ]


QUERIES = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q4": q4,
    "q5": q5,
    "q7": q7,
    "q8": q8,
    "q9": q9,
    "q10": q10,
    "q11": q11,
    "q13": q13,
    "q14": q14,
    "q15": q15,
    "q16": q16,
    "q17": q17,
    "q18": q18,
    "q19": q19,
    "q20": q20,
    "q21": q21,
    "q22": q22,
}

TIES: dict[str, Callable[[Sequence[Event]], list[list[Row]]]] = {"q18": q18_ties, "q19": q19_ties}
"""Per query whose choice of row is undefined where rows tie: the groups of rows it may choose among."""
