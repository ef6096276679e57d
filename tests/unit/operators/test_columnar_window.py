"""ColumnarWindowAggregateOperator against the per-record WindowAggregateOperator it must match: the
same randomized event stream (random keys, out-of-order timestamps, interleaved watermarks, late
rows) fed one record at a time to the per-record operator and as record batches of random sizes to
the columnar one gives the same results, the same late drops and the same window state."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

import weir.operators.columnar as columnar_ops
from tests.unit.conftest import CollectingOutput, StartOperator
from weir.core.columnar import BuiltinAggregates, Count, FieldKey, Max, Mean, Min, Schema, Sum, decode_pending_windows
from weir.core.errors import SerializationError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import KeyEncoder, key_group_for_key, key_group_range_for_subtask
from weir.core.state_layout import window_bounds, window_key
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.base import InheritedState
from weir.operators.columnar import ColumnarWindowAggregateOperator, ToRecordsOperator
from weir.operators.windows import (
    WINDOW_STATE,
    WindowAggregateOperator,
    decode_window_document,
    pending_window_state,
    pending_windows_of,
)

MAX_PARALLELISM = 128
SCHEMA = Schema.of({"key": str, "value": int, "ts": int})
DECODER = SCHEMA.decoder("ts")
INT_KEYS = Schema.of({"key": int, "value": int, "ts": int}).decoder("ts")

Event = tuple[Any, int, int]  # key, value, ts
Step = tuple[str, Any]  # ("batch", [Event, ...]) or ("watermark", int)


def count_sum() -> dict[str, Any]:
    return {"count": Count(), "sum": Sum("value")}


class CountAndSum:
    """A hand-written (count, sum) AggregateFunction over records (dicts), as a per-record job has."""

    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], record: dict[str, Any]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + record["value"])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


def batch_of(events: list[Event], decoder: Any = DECODER) -> pa.RecordBatch:
    return decoder.batch([[e[0] for e in events], [e[1] for e in events], [e[2] for e in events]])


def record_of(event: Event) -> dict[str, Any]:
    return {"key": event[0], "value": event[1], "ts": event[2]}


def random_steps(
    rng: random.Random,
    n: int,
    *,
    keys: int = 9,
    bound: int = 60,
    watermark_lag: int = 20,
    very_late: float = 0.05,
    int_keys: bool = False,
) -> list[Step]:
    """Events out of order by up to ``bound`` (some far more), starting at a negative time, cut into
    batches of random sizes (some empty), with a watermark ``watermark_lag`` behind the highest
    timestamp every few batches: rows more than that out of order are late for some windows."""
    steps: list[Step] = []
    max_ts = None
    i = 0
    while i < n:
        size = rng.choice([0, 1, 2, 5, 13, 40, 90])
        events = []
        for _ in range(min(size, n - i)):
            ts = -400 + 2 * i - rng.randrange(bound)
            if rng.random() < very_late:
                ts -= rng.randrange(400)
            key: Any = rng.randrange(keys) if int_keys else f"k{rng.randrange(keys)}"
            events.append((key, rng.randrange(-50, 100), ts))
            max_ts = ts if max_ts is None else max(max_ts, ts)
            i += 1
        steps.append(("batch", events))
        if max_ts is not None and rng.random() < 0.4:
            steps.append(("watermark", max_ts - watermark_lag))
    return steps


def feed_records(op: WindowAggregateOperator, steps: list[Step]) -> None:
    for kind, item in steps:
        if kind == "batch":
            for event in item:
                op.process(record_of(event), event[2])
        else:
            op.process_watermark(item)


def feed_batches(op: ColumnarWindowAggregateOperator, steps: list[Step], decoder: Any = DECODER) -> None:
    for kind, item in steps:
        if kind == "batch":
            op.process(batch_of(item, decoder), None)
        else:
            op.process_watermark(item)


def finish(op: WindowAggregateOperator) -> None:
    op.process_watermark(MAX_WATERMARK)
    op.end_input()


def segments(out: CollectingOutput) -> list[Counter[tuple[Any, ...]]]:
    """The results between consecutive watermarks, each as a multiset (results are dicts)."""
    found: list[Counter[tuple[Any, ...]]] = [Counter()]
    for kind, value in out.events:
        if kind == "watermark":
            found.append(Counter())
        else:
            found[-1][tuple(sorted(value.items()))] += 1
    return found


def state_of(op: WindowAggregateOperator) -> dict[tuple[int, bytes], Any]:
    return {(kg, sk): value for kg in op.ctx.key_group_range for sk, value in op.store.items(WINDOW_STATE, kg)}


def pending_windows(snapshot: bytes | None) -> list[tuple[Any, int, tuple[Any, ...]]]:
    """The pending windows a columnar window's snapshot holds (format 3), sorted."""
    assert snapshot is not None
    rows = pending_windows_of(snapshot)
    return sorted(decode_pending_windows(rows)) if rows is not None else []


def logical_state(op: WindowAggregateOperator, snapshot: bytes | None) -> dict[tuple[int, bytes], Any]:
    """What a snapshot of ``op`` restores as ``win`` entries: its state entries and the pending
    windows its operator state holds (each written as its entry by a restore)."""
    state = state_of(op)
    encoder, size = KeyEncoder(MAX_PARALLELISM), op._assigner.size_ms
    for key, start, acc in pending_windows(snapshot):
        _kb, kg, prefix = encoder.encode(key)
        address = (kg, window_key(prefix, start, start + size))
        assert address not in state, "a pending window also has a state entry"
        state[address] = (key, acc)
    return state


def expected_results(events: list[Event], assigner: Any) -> Counter[tuple[Any, ...]]:
    """Every window's (count, sum) computed plainly (for streams without late rows)."""
    acc: dict[tuple[Any, int, int], tuple[int, int]] = {}
    for key, value, ts in events:
        for w in assigner.assign(ts):
            c, s = acc.get((key, w.start, w.end), (0, 0))
            acc[(key, w.start, w.end)] = (c + 1, s + value)
    return Counter(
        tuple(sorted({"key": k, "window_start": s, "window_end": e, "count": c, "sum": total}.items()))
        for (k, s, e), (c, total) in acc.items()
    )


@dataclass
class Pair:
    """The per-record operator and the columnar one, started on one state backend."""

    records: WindowAggregateOperator
    batches: ColumnarWindowAggregateOperator
    records_out: CollectingOutput
    batches_out: CollectingOutput

    def assert_same(self) -> None:
        assert segments(self.batches_out) == segments(self.records_out)
        assert self.batches_out.watermarks == self.records_out.watermarks
        assert self.batches.late_records_dropped == self.records.late_records_dropped
        assert [ts for _, ts in self.batches_out.records] == [v["window_end"] - 1 for v, _ in self.batches_out.records]


def start_pair(
    start_operator: StartOperator,
    assigner_of: Callable[[], Any],
    lateness: int,
    *,
    per_record_fn: Callable[[], Any] = CountAndSum,
    aggregates: Callable[[], dict[str, Any]] = count_sum,
    restore: bytes | None = None,
    uids: tuple[str, str] = ("records", "batches"),
) -> Pair:
    records = WindowAggregateOperator(per_record_fn(), FieldKey("key"), assigner_of(), lateness)
    batches = ColumnarWindowAggregateOperator(BuiltinAggregates(aggregates(), "key"), "key", assigner_of(), lateness)
    records_out = start_operator(records, uid=uids[0], restore=restore)
    batches_out = start_operator(batches, uid=uids[1], restore=restore)
    return Pair(records, batches, records_out, batches_out)


ASSIGNERS: dict[str, Callable[[], Any]] = {
    "tumbling": lambda: TumblingEventTimeWindows(100),
    "tumbling-offset": lambda: TumblingEventTimeWindows(100, offset_ms=-30),
    "sliding-multiple": lambda: SlidingEventTimeWindows(90, 30),
    "sliding-uneven": lambda: SlidingEventTimeWindows(100, 30, offset_ms=7),
}


# Equivalence -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_record_fn", [CountAndSum, lambda: BuiltinAggregates(count_sum(), "key")])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("assigner", list(ASSIGNERS))
def test_without_lateness_the_columnar_window_emits_what_the_per_record_one_does(
    start_operator: StartOperator, assigner: str, seed: int, per_record_fn: Callable[[], Any]
) -> None:
    steps = random_steps(random.Random(seed), 1500)
    pair = start_pair(start_operator, ASSIGNERS[assigner], 0, per_record_fn=per_record_fn)
    feed_records(pair.records, steps)
    feed_batches(pair.batches, steps)
    assert pair.records.late_records_dropped > 0  # the stream does have late rows
    snapshot = pair.batches.snapshot_state(1)  # the pending windows: in the snapshot, as one row each
    pair.records.snapshot_state(1)
    if pair.records._slice_ms:  # built-in aggregates merge: the per-record window keeps slices
        widths = {end - start for start, end in (window_bounds(sk) for _kg, sk in state_of(pair.records))}
        assert widths == {pair.records._slice_ms} and logical_state(pair.batches, snapshot) != {}
    else:
        assert logical_state(pair.batches, snapshot) == state_of(pair.records) != {}
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    assert sum(segments(pair.records_out), Counter())  # something fired
    assert state_of(pair.batches) == state_of(pair.records) == {}


@pytest.mark.parametrize("seed", [4, 5, 6])
@pytest.mark.parametrize("assigner", ["tumbling", "tumbling-offset"])
def test_with_lateness_the_late_firings_are_the_per_record_ones(
    start_operator: StartOperator, assigner: str, seed: int
) -> None:
    steps = random_steps(random.Random(seed), 1500, very_late=0.1)
    pair = start_pair(start_operator, ASSIGNERS[assigner], 150)
    feed_records(pair.records, steps)
    feed_batches(pair.batches, steps)
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    fired = sum(segments(pair.records_out), Counter())
    windows = Counter((dict(r)["key"], dict(r)["window_start"]) for r in fired.elements())
    assert max(windows.values()) > 1  # late firings did happen
    assert pair.records.late_records_dropped > 0  # and rows beyond the lateness were dropped


@pytest.mark.parametrize("assigner", ["sliding-multiple", "sliding-uneven"])
def test_with_lateness_sliding_late_firings_are_the_per_record_ones(
    start_operator: StartOperator, assigner: str
) -> None:
    steps = random_steps(random.Random(7), 1500, very_late=0.1)
    pair = start_pair(start_operator, ASSIGNERS[assigner], 150)
    feed_records(pair.records, steps)
    feed_batches(pair.batches, steps)
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()


def test_two_late_rows_of_one_batch_refire_a_sliding_window_in_row_order(start_operator: StartOperator) -> None:
    """Rows at 12 (windows [10, 20) then [5, 15)) and 7 ([5, 15) then [0, 10)), both late for the
    fired window [5, 15): per record, [5, 15) fires again with 12's value, then with both."""
    pair = start_pair(start_operator, lambda: SlidingEventTimeWindows(10, 5), 100)
    for op in (pair.records, pair.batches):
        op.process_watermark(14)
    pair.records.process({"key": "a", "value": 1, "ts": 12}, 12)
    pair.records.process({"key": "a", "value": 10, "ts": 7}, 7)
    pair.batches.process(batch_of([("a", 1, 12), ("a", 10, 7)]), None)
    assert [(v["window_start"], v["sum"]) for v, _ in pair.records_out.records] == [(5, 1), (5, 11), (0, 10)]
    assert [(v["window_start"], v["sum"]) for v, _ in pair.batches_out.records] == [(5, 1), (5, 11), (0, 10)]


def test_the_sliding_late_firings_end_in_the_per_record_state(start_operator: StartOperator) -> None:
    """Whatever the order of a batch's late firings, each window's last result and state agree."""
    steps = random_steps(random.Random(7), 1500, very_late=0.1)
    pair = start_pair(start_operator, ASSIGNERS["sliding-uneven"], 150)
    feed_records(pair.records, steps)
    feed_batches(pair.batches, steps)
    pair.batches.snapshot_state(1)
    pair.records.snapshot_state(1)
    assert state_of(pair.batches) == state_of(pair.records) != {}
    finish(pair.records)
    finish(pair.batches)
    assert pair.batches.late_records_dropped == pair.records.late_records_dropped > 0

    def last_results(out: CollectingOutput) -> dict[tuple[str, int], dict[str, Any]]:
        return {(v["key"], v["window_start"]): v for v, _ in out.records}

    assert last_results(pair.batches_out) == last_results(pair.records_out)


def test_int_keys_and_every_builtin_aggregate_match_the_per_record_window(start_operator: StartOperator) -> None:
    def aggregates() -> dict[str, Any]:
        return {"n": Count(), "total": Sum("value"), "lo": Min("value"), "hi": Max("value"), "avg": Mean("value")}

    steps = random_steps(random.Random(11), 1200, int_keys=True)
    records = WindowAggregateOperator(
        BuiltinAggregates(aggregates(), "key"), FieldKey("key"), TumblingEventTimeWindows(50), 40
    )
    batches = ColumnarWindowAggregateOperator(
        BuiltinAggregates(aggregates(), "key"), "key", TumblingEventTimeWindows(50), 40
    )
    pair = Pair(records, batches, start_operator(records, uid="r"), start_operator(batches, uid="b"))
    feed_records(records, steps)
    feed_batches(batches, steps, INT_KEYS)
    finish(records)
    finish(batches)
    pair.assert_same()
    first = pair.batches_out.records[0][0]
    assert set(first) == {"key", "window_start", "window_end", "n", "total", "lo", "hi", "avg"}
    assert type(first["key"]) is int
    assert all(v["lo"] <= v["avg"] <= v["hi"] and v["avg"] == v["total"] / v["n"] for v, _ in pair.batches_out.records)


def test_without_late_rows_the_results_are_the_plain_window_sums(start_operator: StartOperator) -> None:
    rng = random.Random(21)
    events = [(f"k{rng.randrange(5)}", rng.randrange(100), rng.randrange(-500, 500)) for _ in range(2000)]
    op = ColumnarWindowAggregateOperator(
        BuiltinAggregates(count_sum(), "key"), "key", SlidingEventTimeWindows(100, 40), 0
    )
    out = start_operator(op, uid="win")
    for start in range(0, len(events), 333):
        op.process(batch_of(events[start : start + 333]), None)
    finish(op)
    assert op.late_records_dropped == 0
    assert sum(segments(out), Counter()) == expected_results(events, SlidingEventTimeWindows(100, 40))


def test_a_sum_beyond_int64_is_the_per_record_sum(start_operator: StartOperator) -> None:
    pair = start_pair(start_operator, lambda: TumblingEventTimeWindows(10), 0)
    events = [("a", 2**62, 1), ("a", 2**62, 2)]
    feed_records(pair.records, [("batch", events)])
    pair.batches.process(batch_of(events), None)
    finish(pair.records)
    finish(pair.batches)
    assert pair.records_out.values[0]["sum"] == 2**63
    assert pair.batches_out.values[0]["sum"] == 2**63


# Lateness ------------------------------------------------------------------------------------------


def test_late_rows_are_dropped_and_counted_per_window_as_per_record(start_operator: StartOperator) -> None:
    pair = start_pair(start_operator, lambda: SlidingEventTimeWindows(10, 5), 0)
    for op in (pair.records, pair.batches):
        op.process_watermark(9)
    events = [("a", 1, 3), ("a", 2, 7), ("b", 3, 12), ("a", 4, 9)]  # 3: two late windows; 7, 9: one each
    feed_records(pair.records, [("batch", events)])
    pair.batches.process(batch_of(events), None)
    assert pair.records.late_records_dropped == pair.batches.late_records_dropped == 4
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    assert sorted((v["key"], v["window_start"], v["count"]) for v, _ in pair.batches_out.records) == [
        ("a", 5, 2),
        ("b", 5, 1),
        ("b", 10, 1),
    ]


def test_a_batch_of_only_late_rows_leaves_nothing_pending(start_operator: StartOperator) -> None:
    op = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", TumblingEventTimeWindows(10), 0)
    out = start_operator(op, uid="win")
    op.process_watermark(100)
    op.process(batch_of([("a", 1, 5), ("b", 1, 50)]), None)
    assert op.late_records_dropped == 2 and op._pending == []
    finish(op)
    assert out.records == []


# Compaction, snapshots, end of input -------------------------------------------------------------


def test_rows_wait_until_a_watermark_fires_their_window(start_operator: StartOperator) -> None:
    op = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", TumblingEventTimeWindows(10), 0)
    out = start_operator(op, uid="win")
    op.process(batch_of([("a", 1, 1), ("a", 2, 15), ("b", 4, 3)]), None)
    assert op._pending_rows == 3 and state_of(op) == {}
    op.process_watermark(5)  # no pending window fires yet: nothing is grouped
    assert op._pending_rows == 3 and out.records == []
    op.process_watermark(9)  # [0, 10) fires from its rows; [10, 20)'s row waits on, pending
    assert op._pending_rows == 1 and state_of(op) == {}
    assert sorted((v["key"], v["window_start"], v["count"], v["sum"]) for v, _ in out.take()) == [
        ("a", 0, 1, 1),
        ("b", 0, 1, 4),
    ]
    op.process_watermark(19)
    assert out.take() == [({"key": "a", "window_start": 10, "window_end": 20, "count": 1, "sum": 2}, 19)]
    assert op._pending_rows == 0 and state_of(op) == {}


@pytest.mark.parametrize("assigner", list(ASSIGNERS))
def test_without_lateness_windows_fire_from_pending_rows_and_never_touch_the_state(
    start_operator: StartOperator, assigner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = random_steps(random.Random(61), 1500)
    pair = start_pair(start_operator, ASSIGNERS[assigner], 0)
    writes: list[tuple[Any, ...]] = []
    monkeypatch.setattr(pair.batches.store, "put", lambda *entry: writes.append(entry))
    feed_records(pair.records, steps)
    feed_batches(pair.batches, steps)
    pair.batches.process_watermark(MAX_WATERMARK)
    pair.records.process_watermark(MAX_WATERMARK)
    assert writes == [] and pair.batches._pending_rows == 0
    pair.assert_same()


def test_a_snapshot_keeps_the_pending_windows_grouped_in_its_operator_state_and_they_fire_with_later_rows(
    start_operator: StartOperator,
) -> None:
    op = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", TumblingEventTimeWindows(10), 0)
    out = start_operator(op, uid="win")
    op.process(batch_of([("a", 1, 1), ("b", 4, 3), ("a", 5, 12), ("a", 3, 2)]), None)
    snapshot = op.snapshot_state(1)  # the pending windows grouped, in the snapshot, not in the state
    assert pending_windows(snapshot) == [("a", 0, (2, 4)), ("a", 10, (1, 5)), ("b", 0, (1, 4))]
    assert decode_window_document(snapshot) == (op._watermark, None)
    assert state_of(op) == {} and op._pending_rows == 3  # one row per window, still pending
    op.process(batch_of([("a", 2, 2), ("c", 7, 8), ("a", 6, 13), ("d", 9, 21)]), None)
    op.process_watermark(9)
    assert sorted((v["key"], v["window_start"], v["count"], v["sum"]) for v, _ in out.take()) == [
        ("a", 0, 3, 6),
        ("b", 0, 1, 4),
        ("c", 0, 1, 7),
    ]
    assert state_of(op) == {} and op._pending_rows == 3  # the rows of later windows wait
    assert pending_windows(op.snapshot_state(2)) == [("a", 10, (2, 11)), ("d", 20, (1, 9))]
    op.process_watermark(29)
    assert out.take() == [
        ({"key": "a", "window_start": 10, "window_end": 20, "count": 2, "sum": 11}, 19),
        ({"key": "d", "window_start": 20, "window_end": 30, "count": 1, "sum": 9}, 29),
    ]
    assert state_of(op) == {} and op._pending_rows == 0 and op._fire_groups == {}
    assert op.snapshot_state(3) == json.dumps({"format": 1, "watermark": 29}).encode()  # none pending: format 1


def test_a_snapshot_in_the_middle_compacts_the_pending_rows_and_the_job_goes_on(start_operator: StartOperator) -> None:
    steps = random_steps(random.Random(31), 1600)
    middle = len(steps) // 2
    while steps[middle - 1][0] != "batch" or not steps[middle - 1][1]:
        middle += 1
    pair = start_pair(start_operator, ASSIGNERS["sliding-uneven"], 0)
    feed_records(pair.records, steps[:middle])
    feed_batches(pair.batches, steps[:middle])
    pending = pair.batches._pending_rows
    assert pending > 0
    snapshot = pair.batches.snapshot_state(1)
    assert 0 < pair.batches._pending_rows < pending  # grouped, one row per window, kept to fire from
    records_snapshot = pair.records.snapshot_state(1)
    assert records_snapshot is not None and decode_window_document(snapshot) == decode_window_document(records_snapshot)
    assert logical_state(pair.batches, snapshot) == state_of(pair.records) != {}
    feed_records(pair.records, steps[middle:])
    feed_batches(pair.batches, steps[middle:])
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()


@pytest.mark.parametrize("assigner", list(ASSIGNERS))
def test_snapshots_at_random_points_keep_the_results_and_state_of_the_per_record_window(
    start_operator: StartOperator, assigner: str
) -> None:
    rng = random.Random(83)
    steps = random_steps(rng, 1500)
    pair = start_pair(start_operator, ASSIGNERS[assigner], 0)
    checkpoint = 0
    for n, step in enumerate(steps):
        feed_records(pair.records, [step])
        feed_batches(pair.batches, [step])
        if rng.random() < 0.1:
            checkpoint += 1
            snapshot = pair.batches.snapshot_state(checkpoint)
            records_snapshot = pair.records.snapshot_state(checkpoint)
            assert snapshot is not None and records_snapshot is not None
            assert decode_window_document(snapshot)[0] == decode_window_document(records_snapshot)[0], n
            if not pair.records._slice_ms:
                assert logical_state(pair.batches, snapshot) == state_of(pair.records), n
    assert checkpoint > 5
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    assert state_of(pair.batches) == state_of(pair.records) == {}


@pytest.mark.parametrize("assigner", list(ASSIGNERS))
def test_without_lateness_compaction_on_size_groups_the_pending_rows_in_arrow_not_into_the_state(
    start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch, assigner: str
) -> None:
    """Rows over COMPACT_ROWS are grouped into one pending row per (key, window): nothing reaches the
    state before a checkpoint, and the results, drops and watermarks stay the per-record window's."""
    monkeypatch.setattr(columnar_ops, "COMPACT_ROWS", 150)
    steps = random_steps(random.Random(17), 1500, watermark_lag=150, keys=2)
    pair = start_pair(start_operator, ASSIGNERS[assigner], 0)
    feed_records(pair.records, steps)
    grouped = 0
    for kind, item in steps:
        if kind == "batch":
            before = pair.batches._pending_rows + len(item)
            pair.batches.process(batch_of(item), None)
            grouped += pair.batches._pending_rows < before
            assert state_of(pair.batches) == {} and pair.batches._fire_groups == {}
        else:
            pair.batches.process_watermark(item)
    assert grouped > 5  # the limit was reached, and grouping made room, again and again
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    assert state_of(pair.batches) == {}


def test_compaction_in_arrow_keeps_every_builtin_aggregate_and_a_snapshot_reads_as_per_record(
    start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columnar_ops, "COMPACT_ROWS", 30)

    def aggregates() -> dict[str, Any]:
        return {"n": Count(), "total": Sum("value"), "lo": Min("value"), "hi": Max("value"), "avg": Mean("value")}

    steps = random_steps(random.Random(19), 1200, int_keys=True, watermark_lag=120, keys=3)
    pair = start_pair(
        start_operator,
        lambda: TumblingEventTimeWindows(50),
        0,
        per_record_fn=lambda: BuiltinAggregates(aggregates(), "key"),
        aggregates=aggregates,
    )
    for n, step in enumerate(steps):
        feed_records(pair.records, [step])
        feed_batches(pair.batches, [step], INT_KEYS)
        if n % 97 == 0:
            snapshot = pair.batches.snapshot_state(n)
            assert decode_window_document(snapshot) == decode_window_document(pair.records.snapshot_state(n)), n
            assert logical_state(pair.batches, snapshot) == state_of(pair.records), n
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()


def test_a_sum_beyond_int64_at_compaction_goes_to_the_state_and_stays_exact(
    start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columnar_ops, "COMPACT_ROWS", 4)
    pair = start_pair(start_operator, lambda: TumblingEventTimeWindows(10), 0)
    events = [("a", 2**62, 1), ("a", 2**62, 2), ("a", 2**62, 3), ("b", 1, 4)]
    feed_records(pair.records, [("batch", events)])
    pair.batches.process(batch_of(events), None)
    assert pair.batches._pending == [] and [v for v in state_of(pair.batches).values()] != []
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    assert {v["key"]: v["sum"] for v in pair.batches_out.values} == {"a": 3 * 2**62, "b": 1}


def test_compaction_on_size_groups_rows_before_any_watermark(
    start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columnar_ops, "COMPACT_ROWS", 7)
    pair = start_pair(start_operator, ASSIGNERS["sliding-multiple"], 60)
    op = pair.batches
    op.process(batch_of([("a", 1, 1), ("b", 2, 2), ("a", 3, 3)]), None)  # 9 rows: 3 windows each
    assert op._pending == [] and op._pending_rows == 0
    assert sorted(v for v in state_of(op).values()) == [
        ("a", (2, 4)),
        ("a", (2, 4)),
        ("a", (2, 4)),
        ("b", (1, 2)),
        ("b", (1, 2)),
        ("b", (1, 2)),
    ]
    op.process(batch_of([("a", 10, 4)]), None)  # 3 rows wait
    assert op._pending_rows == 3
    op.process(batch_of([("a", 10, 4), ("a", 10, 5)]), None)  # 6 more rows, in 3 windows of 2
    assert op._pending_rows == 2  # all grouped when the second window's rows made 7; the third's wait
    assert sorted(v for v in state_of(op).values())[:3] == [("a", (3, 14)), ("a", (5, 34)), ("a", (5, 34))]
    op.snapshot_state(1)
    assert sorted(v for v in state_of(op).values())[:3] == [("a", (5, 34))] * 3

    first = [("a", 1, 1), ("b", 2, 2), ("a", 3, 3), ("a", 10, 4), ("a", 10, 4), ("a", 10, 5)]
    feed_records(pair.records, [("batch", first)])  # the per-record one takes the same rows
    steps = random_steps(random.Random(41), 1500, very_late=0.0)
    feed_records(pair.records, steps)
    for kind, item in steps:
        if kind == "batch":
            op.process(batch_of(item), None)
            assert op._pending_rows < 7
        else:
            op.process_watermark(item)
    finish(pair.records)
    finish(op)
    pair.assert_same()


def test_end_input_groups_pending_rows_and_a_max_watermark_fires_everything(start_operator: StartOperator) -> None:
    op = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", TumblingEventTimeWindows(10), 5)
    out = start_operator(op, uid="win")
    op.process(batch_of([("a", 1, 1), ("a", 2, 25), ("b", 4, 13)]), None)
    op.end_input()  # e.g. a final savepoint: nothing left pending, nothing fired yet
    assert op._pending == [] and out.records == []
    assert sorted(state_of(op).values()) == [("a", (1, 1)), ("a", (1, 2)), ("b", (1, 4))]
    op.process(batch_of([("b", 6, 14)]), None)
    op.process_watermark(MAX_WATERMARK)
    op.end_input()
    assert sorted((v["key"], v["window_start"], v["count"], v["sum"]) for v, _ in out.records) == [
        ("a", 0, 1, 1),
        ("a", 20, 1, 2),
        ("b", 10, 2, 10),
    ]
    assert out.watermarks == [MAX_WATERMARK] and state_of(op) == {}


def test_records_and_batches_mix_in_one_columnar_window(start_operator: StartOperator) -> None:
    steps = random_steps(random.Random(51), 1200, very_late=0.1)
    pair = start_pair(start_operator, ASSIGNERS["tumbling"], 80)
    feed_records(pair.records, steps)
    for n, (kind, item) in enumerate(steps):
        if kind == "watermark":
            pair.batches.process_watermark(item)
        elif n % 3 == 0:  # every third batch comes as records (e.g. after a restore of in-flight data)
            for event in item:
                pair.batches.process(record_of(event), event[2])
        else:
            pair.batches.process(batch_of(item), None)
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()


# Restores across the two paths -------------------------------------------------------------------


@pytest.mark.parametrize("lateness", [0, 90])
def test_state_of_the_per_record_window_restores_into_the_columnar_one(
    start_operator: StartOperator, lateness: int
) -> None:
    """Two per-record windows take the first half; at a snapshot one goes on per record, the other
    is restored as the columnar window (same state layout) and goes on with batches."""
    steps = random_steps(random.Random(61), 1600, very_late=0.05)
    middle = len(steps) // 2
    assigner = ASSIGNERS["tumbling"]
    reference = WindowAggregateOperator(CountAndSum(), lambda r: r["key"], assigner(), lateness)
    before = WindowAggregateOperator(CountAndSum(), lambda r: r["key"], assigner(), lateness)
    reference_out = start_operator(reference, uid="reference")
    before_out = start_operator(before, uid="migrated")
    feed_records(reference, steps[:middle])
    feed_records(before, steps[:middle])
    assert segments(before_out) == segments(reference_out)
    snapshot = before.snapshot_state(1)
    assert snapshot is not None and state_of(before) != {}
    reference_out.events.clear()
    reference_out.records.clear()

    after = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", assigner(), lateness)
    after_out = start_operator(after, uid="migrated", restore=snapshot)
    feed_records(reference, steps[middle:])
    feed_batches(after, steps[middle:])
    finish(reference)
    finish(after)
    assert segments(after_out) == segments(reference_out)
    assert after.late_records_dropped == reference.late_records_dropped - before.late_records_dropped
    assert after_out.records  # the restored windows and the new ones fired


@pytest.mark.parametrize("lateness", [0, 30])
@pytest.mark.parametrize("into", ["per-record", "columnar"])
def test_state_of_the_columnar_window_restores_into_the_per_record_one_and_itself(
    start_operator: StartOperator, lateness: int, into: str
) -> None:
    """Without lateness a snapshot keeps the pending windows in its operator state (format 3); with
    it, it groups them into the state. Either state restores into either path."""
    steps = random_steps(random.Random(71), 1600, very_late=0.05)
    middle = len(steps) // 2
    assigner = ASSIGNERS["sliding-uneven"]
    reference = WindowAggregateOperator(CountAndSum(), FieldKey("key"), assigner(), lateness)
    before = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", assigner(), lateness)
    reference_out = start_operator(reference, uid="reference")
    start_operator(before, uid="migrated")
    feed_records(reference, steps[:middle])
    feed_batches(before, steps[:middle])
    snapshot = before.snapshot_state(1)
    assert before._pending_rows > 0 if not lateness else before._pending_rows == 0
    reference_out.events.clear()

    after: WindowAggregateOperator
    if into == "per-record":
        after = WindowAggregateOperator(CountAndSum(), FieldKey("key"), assigner(), lateness)
        after_out = start_operator(after, uid="migrated", restore=snapshot)
        feed_records(after, steps[middle:])
    else:
        after = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", assigner(), lateness)
        after_out = start_operator(after, uid="migrated", restore=snapshot)
        feed_batches(after, steps[middle:])  # type: ignore[arg-type]
    feed_records(reference, steps[middle:])
    finish(reference)
    finish(after)
    assert segments(after_out) == segments(reference_out)
    assert sum(segments(after_out), Counter())


@pytest.mark.parametrize("into", ["per-record", "columnar"])
def test_a_columnar_snapshot_of_the_earlier_format_pending_windows_as_state_entries_still_restores(
    start_operator: StartOperator, into: str
) -> None:
    """Before format 3, a snapshot wrote each pending window's aggregate as its ``win`` entry beside a
    format-1 document: such a state restores into either path as it did."""
    steps = random_steps(random.Random(73), 1600, very_late=0.05)
    middle = len(steps) // 2
    assigner = ASSIGNERS["tumbling-offset"]
    reference = WindowAggregateOperator(CountAndSum(), FieldKey("key"), assigner(), 0)
    before = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", assigner(), 0)
    reference_out = start_operator(reference, uid="reference")
    start_operator(before, uid="migrated")
    feed_records(reference, steps[:middle])
    feed_batches(before, steps[:middle])
    snapshot = before.snapshot_state(1)
    earlier = logical_state(before, snapshot)  # what the earlier format wrote into the state
    assert len(earlier) > len(state_of(before)) == 0
    for (kg, sk), entry in earlier.items():
        before.store.put(WINDOW_STATE, kg, sk, entry)
    before.store.flush()
    old_format = json.dumps({"format": 1, "watermark": before._watermark}).encode()
    reference_out.events.clear()

    after: WindowAggregateOperator
    if into == "per-record":
        after = WindowAggregateOperator(CountAndSum(), FieldKey("key"), assigner(), 0)
        after_out = start_operator(after, uid="migrated", restore=old_format)
        feed_records(after, steps[middle:])
    else:
        after = ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", assigner(), 0)
        after_out = start_operator(after, uid="migrated", restore=old_format)
        feed_batches(after, steps[middle:])  # type: ignore[arg-type]
    feed_records(reference, steps[middle:])
    finish(reference)
    finish(after)
    assert segments(after_out) == segments(reference_out)
    assert sum(segments(after_out), Counter())


def test_pending_windows_restored_at_another_parallelism_go_to_the_subtasks_of_their_key_groups(
    start_operator: StartOperator, make_context: Any
) -> None:
    """Two columnar subtasks snapshot their pending windows (format 3); restored into three, each new
    subtask writes those of its own key groups into its state and fires them: every window's result,
    before and after, is the per-record window's over the whole stream, once."""
    steps = random_steps(random.Random(79), 1600, very_late=0.0, keys=30)
    middle = len(steps) // 2

    def own(steps: list[Step], subtask: int, parallelism: int) -> list[Step]:
        kgs = key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(subtask))
        return [
            (kind, [e for e in item if key_group_for_key(e[0], MAX_PARALLELISM) in kgs] if kind == "batch" else item)
            for kind, item in steps
        ]

    def columnar() -> ColumnarWindowAggregateOperator:
        return ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", ASSIGNERS["tumbling"](), 0)

    reference = WindowAggregateOperator(CountAndSum(), FieldKey("key"), ASSIGNERS["tumbling"](), 0)
    reference_out = start_operator(reference, uid="reference")
    feed_records(reference, steps)
    finish(reference)

    fired: Counter[tuple[Any, ...]] = Counter()
    states = []
    for subtask in range(2):
        old = columnar()
        out = start_operator(old, uid="old", subtask=subtask, parallelism=2)
        feed_batches(old, own(steps[:middle], subtask, 2))
        snapshot = old.snapshot_state(1)
        assert snapshot is not None and pending_windows(snapshot) and state_of(old) == {}
        kgs = key_group_range_for_subtask(MAX_PARALLELISM, 2, SubtaskIndex(subtask))
        states.append(InheritedState(subtask, 2, kgs, snapshot))
        fired += sum(segments(out), Counter())
    restored = 0
    for subtask in range(3):
        new = columnar()
        out = CollectingOutput()
        new.setup(make_context("new", subtask=subtask, parallelism=3), out)
        new.restore_inherited_state(states)
        new.open()
        restored += len(state_of(new))
        feed_batches(new, own(steps[middle:], subtask, 3))
        finish(new)
        fired += sum(segments(out), Counter())
    assert restored == sum(len(pending_windows(s.data)) for s in states) > 0  # each in one new subtask
    assert fired == sum(segments(reference_out), Counter())


def test_a_pending_window_state_that_is_malformed_is_refused_in_one_line(start_operator: StartOperator) -> None:
    def columnar() -> ColumnarWindowAggregateOperator:
        return ColumnarWindowAggregateOperator(BuiltinAggregates(count_sum(), "key"), "key", ASSIGNERS["tumbling"](), 0)

    header = json.dumps({"format": 3, "watermark": 5, "pending_windows": 1}).encode()
    with pytest.raises(SerializationError, match="format 3 is malformed: no rows after its document"):
        start_operator(columnar(), uid="a", restore=header)
    with pytest.raises(SerializationError, match="format 1 is malformed: bytes after its document"):
        start_operator(columnar(), uid="b", restore=json.dumps({"format": 1, "watermark": 5}).encode() + b"\nxx")
    with pytest.raises(SerializationError, match="not an Arrow IPC stream"):
        start_operator(columnar(), uid="c", restore=pending_window_state(5, 1, b"not arrow"))
    other = pa.table({"k": ["a"], "start": [0], "n": [1]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_table(other)
    with pytest.raises(SerializationError, match="have columns \\['k', 'start', 'n'\\]"):
        start_operator(columnar(), uid="d", restore=pending_window_state(5, 1, sink.getvalue().to_pybytes()))


def test_a_sum_beyond_int64_at_a_snapshot_goes_to_the_state_and_the_snapshot_has_no_pending_windows(
    start_operator: StartOperator,
) -> None:
    pair = start_pair(start_operator, lambda: TumblingEventTimeWindows(10), 0)
    events = [("a", 2**62, 1), ("a", 2**62, 2), ("a", 2**62, 3), ("b", 1, 4)]
    feed_records(pair.records, [("batch", events)])
    pair.batches.process(batch_of(events), None)
    snapshot = pair.batches.snapshot_state(1)
    assert snapshot == pair.records.snapshot_state(1) and pending_windows_of(snapshot) is None
    assert pair.batches._pending == [] and state_of(pair.batches) != {}
    finish(pair.records)
    finish(pair.batches)
    pair.assert_same()
    assert {v["key"]: v["sum"] for v in pair.batches_out.values} == {"a": 3 * 2**62, "b": 1}


def inherited(subtask: int, parallelism: int, watermark: int) -> InheritedState:
    kg = key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(subtask))
    return InheritedState(subtask, parallelism, kg, json.dumps({"format": 1, "watermark": watermark}).encode())


def test_after_a_restore_at_another_parallelism_each_key_group_keeps_its_old_watermark(
    start_operator: StartOperator, make_context: Any
) -> None:
    """Old subtask 0 had reached watermark 300, old subtask 1 only 100: until the watermark passes
    300, a row is late (or fires again) against its key group's old subtask's watermark."""
    states = [inherited(0, 2, 300), inherited(1, 2, 100)]
    owned = [key_group_range_for_subtask(MAX_PARALLELISM, 2, SubtaskIndex(s)) for s in range(2)]
    keys = [f"k{i}" for i in range(12)]  # k10, k11: key groups of old subtask 1
    assert {any(key_group_for_key(k, MAX_PARALLELISM) in owned[s] for k in keys) for s in range(2)} == {True}
    ops: list[WindowAggregateOperator] = [
        WindowAggregateOperator(CountAndSum(), FieldKey("key"), TumblingEventTimeWindows(100), 50),
        ColumnarWindowAggregateOperator(
            BuiltinAggregates(count_sum(), "key"), "key", TumblingEventTimeWindows(100), 50
        ),
    ]
    outs = []
    for uid, op in zip(("records", "batches"), ops, strict=True):
        out = CollectingOutput()
        op.setup(make_context(uid), out)
        op.restore_inherited_state(states)
        op.open()
        outs.append(out)
    rng = random.Random(81)
    steps: list[Step] = []
    for start in range(0, 400, 20):
        steps.append(("batch", [(rng.choice(keys), rng.randrange(50), rng.randrange(100, 420)) for _ in range(15)]))
        steps.append(("watermark", 100 + start))
    feed_records(ops[0], steps)
    feed_batches(ops[1], steps)  # type: ignore[arg-type]
    for op in ops:
        finish(op)
    assert segments(outs[1]) == segments(outs[0])
    assert ops[1].late_records_dropped == ops[0].late_records_dropped > 0


# ToRecordsOperator -------------------------------------------------------------------------------


def test_to_records_turns_a_batch_into_dicts_stamped_with_their_event_time(start_operator: StartOperator) -> None:
    op = ToRecordsOperator()
    out = start_operator(op, uid="src-records")
    op.process(batch_of([("a", 1, 10), ("b", 2, 5)]), None)
    op.process(batch_of([]), None)
    op.process("already a record", 7)  # a value that is not a batch passes as it is
    no_time = Schema.of({"key": str}).decoder(None)
    op.process(no_time.batch([["x"]]), None)
    assert out.records == [
        ({"key": "a", "value": 1, "ts": 10}, 10),
        ({"key": "b", "value": 2, "ts": 5}, 5),
        ("already a record", 7),
        ({"key": "x"}, None),
    ]
