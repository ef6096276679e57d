"""A SQL regular join (weir.sql.join): row by row (RegularJoin in a KeyedCoProcessOperator) and in
mini-batches (MiniBatchRegularJoin), over random streams of both sides with NULL keys, watermarks,
random flush points (size, latency deadline, snapshot) and a restore from a snapshot taken in the
middle, into either operator: the joined rows are, as a multiset of whole rows, every pair of rows
of equal keys, once; and the joined row of only the columns read above the join."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from tests.unit.conftest import StartOperator
from weir.core.process_functions import StateTtlConfig
from weir.operators.keyed import KeyedCoProcessOperator
from weir.sql.join import JoinedRow, MiniBatchRegularJoin, RegularJoin
from weir.sql.minibatch import MiniBatchConfig

LEFT_COLUMNS = ("id", "category", "dateTime", "extra")
RIGHT_COLUMNS = ("auction", "price", "dateTime", "extra")


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def left_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["id"],)


def right_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["auction"],)


def joined_row(read: frozenset[str] | None = None) -> JoinedRow:
    return JoinedRow("A", "B", LEFT_COLUMNS, RIGHT_COLUMNS, read)


def per_record(clock: Clock, ttl: StateTtlConfig | None = None) -> KeyedCoProcessOperator:
    return KeyedCoProcessOperator(RegularJoin(joined_row(), ttl), (left_key, right_key), clock=clock)


def batched(clock: Clock, size: int, ttl: StateTtlConfig | None = None) -> MiniBatchRegularJoin:
    return MiniBatchRegularJoin((left_key, right_key), joined_row(), MiniBatchConfig(500, size), ttl, clock)


Event = tuple[str, int, Any, int]  # ("row", input, row, ts), ("watermark", -1, None, wm), ("tick", -1, None, ms)


def random_events(rng: random.Random, n: int) -> list[Event]:
    """Rows of both sides over a few keys (some NULL, some repeated whole), watermarks, clock ticks."""
    events: list[Event] = []
    ts = 0
    for i in range(n):
        ts += rng.randint(0, 5)
        key = rng.choice([None, *range(6)])
        if rng.random() < 0.35:
            row = {"id": key, "category": rng.randint(10, 12), "dateTime": ts, "extra": f"a{i % 4}"}
            events.append(("row", 0, row, ts))
        else:
            row = {"auction": key, "price": rng.randint(1, 4), "dateTime": ts, "extra": f"b{i % 3}"}
            events.append(("row", 1, row, ts))
        roll = rng.random()
        if roll < 0.08:
            events.append(("watermark", -1, None, ts - 3))
        elif roll < 0.15:
            events.append(("tick", -1, None, rng.randint(100, 700)))
    return events


def feed(op: KeyedCoProcessOperator | MiniBatchRegularJoin, clock: Clock, events: Iterable[Event]) -> None:
    for kind, index, value, ts in events:
        match kind:
            case "row":
                op.process_input(index, value, ts)
            case "watermark":
                op.process_watermark(ts)
            case "tick":  # processing time passes; a deadline that passed is acted on
                clock.now += ts
                due = op.next_processing_time()
                if due is not None and due <= clock.now:
                    op.on_processing_time(clock.now)


def expected_joins(events: Iterable[Event]) -> Counter[str]:
    """Every pair of a left and a right row of equal, non-NULL keys, joined once."""
    rows = [(index, value) for kind, index, value, _ in events if kind == "row"]
    lefts = [r for i, r in rows if i == 0 and r["id"] is not None]
    rights = [r for i, r in rows if i == 1 and r["auction"] is not None]
    joined = joined_row()
    return whole([joined(a, b) for a in lefts for b in rights if a["id"] == b["auction"]])


def whole(rows: Iterable[Mapping[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(dict(r), sort_keys=True) for r in rows)


@pytest.mark.parametrize("seed", range(30))
def test_the_batched_join_emits_every_pair_once_whatever_the_flush_points(
    start_operator: StartOperator, seed: int
) -> None:
    rng = random.Random(seed)
    events = random_events(rng, rng.randint(20, 160))
    clock = Clock()
    op = batched(clock, size=rng.randint(1, 12))
    out = start_operator(op, uid="join")
    for event in events:
        feed(op, clock, [event])
        if rng.random() < 0.05:
            op.snapshot_state(1)  # a barrier: the buffer applied before it
            assert len(op.buffer) == 0
    op.end_input()
    assert len(op.buffer) == 0
    assert whole(out.values) == expected_joins(events)
    given = [ts for kind, _, _, ts in events if kind == "watermark"]
    assert out.watermarks == sorted(out.watermarks) and set(out.watermarks) <= set(given)
    assert out.watermarks[-1:] == given[-1:]  # the last one given leaves, at the latest after the last batch


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize(
    "before_kind,after_kind", [("batched", "batched"), ("record", "batched"), ("batched", "record")]
)
def test_a_restore_from_a_snapshot_in_the_middle_joins_as_an_uninterrupted_run(
    start_operator: StartOperator, seed: int, before_kind: str, after_kind: str
) -> None:
    """A snapshot of either operator restores into either (the same state), and the joined rows of
    the run before it and after it are those of an uninterrupted row-by-row run."""
    rng = random.Random(seed)
    events = random_events(rng, rng.randint(20, 160))
    cut = rng.randint(0, len(events))
    size = rng.randint(1, 12)

    clock = Clock()
    whole_run = per_record(clock)
    uninterrupted = start_operator(whole_run, uid="whole")
    feed(whole_run, clock, events)

    def build(kind: str, clock: Clock) -> KeyedCoProcessOperator | MiniBatchRegularJoin:
        return batched(clock, size) if kind == "batched" else per_record(clock)

    clock = Clock()
    before = build(before_kind, clock)
    out_before = start_operator(before, uid="cut")
    feed(before, clock, events[:cut])
    before.snapshot_state(7)
    after = build(after_kind, clock)  # a new instance: its state read back from the store
    out_after = start_operator(after, uid="cut")
    feed(after, clock, events[cut:])
    after.end_input()
    got = whole(out_before.values) + whole(out_after.values)
    assert got == whole(uninterrupted.values) == expected_joins(events)


def test_a_batch_is_applied_at_its_size_its_deadline_a_snapshot_and_the_end_and_holds_the_watermark(
    start_operator: StartOperator,
) -> None:
    clock = Clock(10_000)
    op = batched(clock, size=3)
    out = start_operator(op)
    auction = {"id": 1, "category": 10, "dateTime": 5, "extra": "a"}
    bid = {"auction": 1, "price": 7, "dateTime": 6, "extra": "b"}
    op.process_input(0, auction, 5)
    op.process_input(1, bid, 6)
    op.process_watermark(4)
    assert out.events == [] and op.next_processing_time() == 10_500
    op.process_input(1, {**bid, "price": 8}, 7)  # the 3rd row: full; the auction joins both bids
    assert [(v["B.price"], t) for v, t in out.records] == [(7, 5), (8, 5)]
    assert out.events[-1] == ("watermark", 4) and op.next_processing_time() is None
    out.events.clear(), out.take()
    op.process_watermark(6)  # an empty buffer: it passes at once
    assert out.events == [("watermark", 6)]
    clock.now = 20_000
    op.process_input(1, {**bid, "price": 9}, 8)
    op.on_processing_time(20_500)  # the latency deadline: the bid joins the stored auction
    assert [(v["A.id"], v["B.price"], t) for v, t in out.take()] == [(1, 9, 8)]
    op.process_input(0, {**auction, "category": 11}, 9)  # a second auction row of key 1 joins all 3 bids
    op.snapshot_state(1)
    assert sorted(v["B.price"] for v, _ in out.take()) == [7, 8, 9]
    op.process_input(1, {**bid, "price": 2}, 10)
    op.process_input(1, {"auction": None, "price": 3, "dateTime": 11, "extra": "b"}, 11)  # a NULL key: dropped
    assert len(op.buffer) == 1
    op.end_input()
    assert sorted((v["A.category"], v["B.price"]) for v, _ in out.take()) == [(10, 2), (11, 2)]


def test_under_a_state_ttl_a_side_idle_for_the_ttl_is_forgotten_as_row_by_row(start_operator: StartOperator) -> None:
    ttl = StateTtlConfig(1_000)
    runs = []
    for kind in ("record", "batched"):
        clock = Clock(0)
        op = per_record(clock, ttl) if kind == "record" else batched(clock, 10, ttl)
        out = start_operator(op, uid=kind)
        op.process_input(0, {"id": 1, "category": 10, "dateTime": 0, "extra": "a"}, 0)
        op.snapshot_state(1)
        clock.now = 500
        op.process_input(1, {"auction": 1, "price": 1, "dateTime": 1, "extra": "b"}, 1)  # joins
        op.snapshot_state(2)
        clock.now = 2_000  # the auction's side: idle for 2 s, past its TTL
        op.process_input(1, {"auction": 1, "price": 2, "dateTime": 2, "extra": "b"}, 2)  # joins nothing
        op.end_input()
        runs.append(whole(out.values))
    record, batch = runs
    assert record == batch
    assert [json.loads(r)["B.price"] for r in record.elements()] == [1]


def test_the_joined_row_of_the_columns_read_above_is_the_whole_joined_row_restricted() -> None:
    rng = random.Random(3)
    for _ in range(50):
        read = frozenset(rng.sample(["id", "category", "datetime", "extra", "auction", "price", "nothing"], 3))
        left = {"id": rng.randint(0, 3), "category": 10, "dateTime": 5, "extra": "a"}
        right = {"auction": left["id"], "price": rng.randint(0, 9), "dateTime": 6, "extra": "b"}
        full = joined_row()(left, right)
        kept = joined_row(read)(left, right)
        assert kept == {k: v for k, v in full.items() if k.rsplit(".", 1)[-1].casefold() in read}
    assert joined_row(frozenset({"datetime", "price"}))(left, right) == {
        "A.dateTime": 5,
        "B.dateTime": 6,
        "B.price": right["price"],
        "price": right["price"],
    }
