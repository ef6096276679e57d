"""The mini-batch buffer of a GROUP BY without a window (weir.sql.minibatch, pure): what it holds, in
which order it hands it out, when it must be flushed (size, latency) and which watermark it holds;
and the per-key batch steps (weir.sql.retract.ChangelogBatch, UpsertBatch) against the per-record
operator's steps over every split of random inputs into batches."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.unit.conftest import MakeContext, StartOperator
from weir.sql.changelog import Change, RowKind
from weir.sql.compile import Accumulators
from weir.sql.minibatch import Drained, MiniBatchBuffer, MiniBatchConfig
from weir.sql.plan import AggregateCall, NamedExpression
from weir.sql.retract import (
    ChangelogBatch,
    MiniBatchGroupAggregate,
    RetractingAccumulators,
    UpsertBatch,
    group_changes,
)
from weir.sql.state_format import CHANGELOG_AGGREGATE_STATE


class Clock:
    """A processing-time clock the test moves; counts how often it is read."""

    def __init__(self, now: int = 1_000) -> None:
        self.now, self.reads = now, 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now


def test_a_config_needs_a_latency_and_a_size_above_zero() -> None:
    for latency, size in ((0, 10), (10, 0), (-1, 10), (10, -1)):
        with pytest.raises(ValueError, match="above 0"):
            MiniBatchConfig(latency, size)
    assert str(MiniBatchConfig(2_000, 50_000)) == "mini-batch 2000 ms / 50000 rows"


def test_the_buffer_is_full_at_its_size_and_hands_out_keys_in_first_arrival_order() -> None:
    buffer: MiniBatchBuffer[str, int] = MiniBatchBuffer(MiniBatchConfig(1_000, 5))
    clock = Clock()
    answers = [buffer.add(key, value, clock) for key, value in [("b", 1), ("a", 2), ("b", 3), ("c", 4)]]
    assert answers == [False, False, False, False] and len(buffer) == 4
    assert buffer.add("a", 5, clock) is True  # the 5th row: full
    assert buffer.drain() == Drained((("b", (1, 3)), ("a", (2, 5)), ("c", (4,))), None)
    assert len(buffer) == 0 and buffer.due_at() is None
    assert buffer.drain() == Drained((), None)  # an empty flush holds nothing


def test_the_latency_deadline_starts_at_the_first_row_of_each_buffer() -> None:
    buffer: MiniBatchBuffer[str, int] = MiniBatchBuffer(MiniBatchConfig(250, 100))
    clock = Clock(1_000)
    assert buffer.due_at() is None
    buffer.add("k", 1, clock)
    clock.now = 1_200
    buffer.add("k", 2, clock)  # a later row does not move the deadline, nor read the clock
    assert buffer.due_at() == 1_250 and clock.reads == 1
    buffer.drain()
    assert buffer.due_at() is None
    clock.now = 5_000
    buffer.add("j", 3, clock)
    assert buffer.due_at() == 5_250 and clock.reads == 2


def test_a_watermark_passes_an_empty_buffer_and_waits_behind_a_full_one() -> None:
    buffer: MiniBatchBuffer[str, int] = MiniBatchBuffer(MiniBatchConfig(1_000, 100))
    clock = Clock()
    assert buffer.watermark(10) == 10
    buffer.add("k", 1, clock)
    assert buffer.watermark(20) is None
    assert buffer.watermark(40) is None
    assert buffer.watermark(30) is None  # a lower one never lowers what is held
    assert buffer.drain() == Drained((("k", (1,)),), 40)
    assert buffer.watermark(50) == 50  # empty again: passes
    buffer.add("k", 2, clock)
    assert buffer.drain().watermark is None  # none arrived meanwhile


@pytest.mark.parametrize("seed", range(20))
def test_every_row_added_is_drained_once_in_order_per_key_whatever_the_flush_points(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.randint(1, 6)
    buffer: MiniBatchBuffer[int, int] = MiniBatchBuffer(MiniBatchConfig(100, size))
    clock = Clock()
    rows = [(rng.randint(0, 3), n) for n in range(rng.randint(0, 40))]
    drained: list[tuple[int, int]] = []
    for key, value in rows:
        if buffer.add(key, value, clock):
            assert len(buffer) == size
            drained.extend((k, v) for k, values in buffer.drain().groups for v in values)
        elif rng.random() < 0.2:  # a latency deadline, a barrier or the end of input: flush anyway
            drained.extend((k, v) for k, values in buffer.drain().groups for v in values)
        assert len(buffer) < size
    drained.extend((k, v) for k, values in buffer.drain().groups for v in values)
    assert sorted(drained, key=lambda kv: kv[1]) == rows  # each row once
    for key in range(4):
        assert [v for k, v in drained if k == key] == [v for k, v in rows if k == key]  # in order per key


# The batch steps against the per-record steps -----------------------------------------------------------


PRICE = NamedExpression("price", "price", lambda row: row["price"])
BIDDER = NamedExpression("bidder", "bidder", lambda row: row["bidder"])
CHEAP = NamedExpression("cheap", "price < 3", lambda row: None if row["price"] is None else row["price"] < 3)


def _calls() -> tuple[AggregateCall, ...]:
    return (
        AggregateCall("n", "COUNT", False, None, "COUNT(*)"),
        AggregateCall("total", "SUM", False, PRICE, "SUM(price)"),
        AggregateCall("low", "MIN", False, PRICE, "MIN(price)"),
        AggregateCall("high", "MAX", False, PRICE, "MAX(price)"),
        AggregateCall("mean", "AVG", False, PRICE, "AVG(price)"),
        AggregateCall("bidders", "COUNT", True, BIDDER, "COUNT(DISTINCT bidder)"),
    )


def _split(items: Sequence[Any], rng: random.Random) -> list[list[Any]]:
    """``items`` cut into consecutive batches at random points (some of one item)."""
    cuts = sorted(rng.sample(range(1, len(items)), rng.randint(0, max(0, len(items) - 1)))) if len(items) > 1 else []
    bounds = [0, *cuts, len(items)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def _table(changes: Sequence[Change]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The result table a changelog of one key ends with (an upsert view: -U/-D remove, +I/+U set)."""
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for change in changes:
        match change.kind:
            case RowKind.INSERT | RowKind.UPDATE_AFTER:
                table[("k",)] = dict(change.row)
            case RowKind.UPDATE_BEFORE | RowKind.DELETE:
                assert table.pop(("k",)) == dict(change.row), "a retraction of a row not in the table"
    return table


def _per_record(
    batch: Callable[[Any, Sequence[Any]], tuple[Any, list[Any]]], inputs: Sequence[Any]
) -> tuple[Any, list[Any]]:
    held, out = None, []
    for value in inputs:
        held, changes = batch(held, [value])
        out.extend(changes)
    return held, out


def _batched(
    batch: Callable[[Any, Sequence[Any]], tuple[Any, list[Any]]], batches: Sequence[Sequence[Any]]
) -> tuple[Any, list[Any]]:
    held, out = None, []
    for inputs in batches:
        held, changes = batch(held, inputs)
        out.extend(changes)
    return held, out


def _changelog(rng: random.Random, n: int) -> list[Change]:
    """Inserts and retractions of rows present (a -U followed by its +U), and a few retractions of
    rows never inserted while the key is empty (dropped, as a state TTL's)."""
    present: list[dict[str, Any]] = []
    out: list[Change] = []
    for _ in range(n):
        roll = rng.random()
        if present and roll < 0.25:
            old = present.pop(rng.randrange(len(present)))
            new = {"price": rng.choice([None, *range(5)]), "bidder": rng.randint(0, 3)}
            out += [Change(RowKind.UPDATE_BEFORE, old), Change(RowKind.UPDATE_AFTER, new)]
            present.append(new)
        elif present and roll < 0.4:
            out.append(Change(RowKind.DELETE, present.pop(rng.randrange(len(present)))))
        elif not present and roll < 0.5:
            out.append(Change(RowKind.DELETE, {"price": 9, "bidder": 9}))
        else:
            row = {"price": rng.choice([None, *range(5)]), "bidder": rng.randint(0, 3)}
            out.append(Change(rng.choice([RowKind.INSERT, RowKind.UPDATE_AFTER]), row))
            present.append(row)
    return out


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("paired", [False, True])
def test_a_changelog_batch_ends_in_the_per_record_state_and_table(seed: int, paired: bool) -> None:
    rng = random.Random(seed)
    step = ChangelogBatch(("key",), RetractingAccumulators(_calls()), input_changelog=True, paired=paired)
    inputs = _changelog(rng, rng.randint(0, 30))

    def apply(held: Any, values: Sequence[Any]) -> tuple[Any, list[Any]]:
        return step.apply(("k",), held, values)

    record_state, record_out = _per_record(apply, inputs)
    batch_state, batch_out = _batched(apply, _split(inputs, rng))
    assert batch_state == record_state  # rows, accumulators and the row emitted
    assert _table(batch_out) == _table(record_out)
    assert len(batch_out) <= len(record_out)


@pytest.mark.parametrize("seed", range(30))
def test_an_append_batch_ends_in_the_accumulators_of_its_rows_added_one_by_one(seed: int) -> None:
    """An append input's batches (one pass over each key's rows: MIN/MAX at once) against ``add`` row
    by row: the same accumulators, of the same types (MAX of 2 and 2.0 keeps the first), and row."""
    rng = random.Random(seed)
    accumulators = Accumulators(_calls())
    step = ChangelogBatch(("key",), accumulators, input_changelog=False, paired=True)
    rows = [
        {"price": rng.choice([None, *range(5), 2.0, 3.0]), "bidder": rng.randint(0, 3)}
        for _ in range(rng.randint(1, 30))
    ]

    def apply(held: Any, values: Sequence[Any]) -> tuple[Any, list[Any]]:
        return step.apply(("k",), held, values)

    state, out = _batched(apply, _split(rows, rng))
    expected = accumulators.create()
    for row in rows:
        expected = accumulators.add(expected, row)
    rows_held, accs, _emitted = CHANGELOG_AGGREGATE_STATE.body(state)
    assert rows_held == len(rows)
    assert [(type(a), a) for a in accs] == [(type(a), a) for a in expected]
    assert _table(out) == {("k",): {"key": "k", **accumulators.results(expected)}}


def test_a_batch_emits_one_change_for_the_whole_batch() -> None:
    step = ChangelogBatch(("key",), Accumulators(_calls()), input_changelog=False, paired=True)
    rows = [{"price": p, "bidder": b} for p, b in [(3, 1), (1, 1), (4, 2)]]
    state, out = step.apply(("k",), None, rows)
    first = {"key": "k", "n": 3, "total": 8, "low": 1, "high": 4, "mean": 2, "bidders": 2}
    assert out == [Change(RowKind.INSERT, first)]
    state, out = step.apply(("k",), state, [{"price": 5, "bidder": 3}, {"price": None, "bidder": None}])
    second = {"key": "k", "n": 5, "total": 13, "low": 1, "high": 5, "mean": 3, "bidders": 3}
    assert out == [Change(RowKind.UPDATE_BEFORE, first), Change(RowKind.UPDATE_AFTER, second)]
    assert state[0] == 1 and state[1][0] == 5 and state[1][2] == second  # (format, (rows, accumulators, emitted))


def test_a_batch_of_retractions_of_nothing_leaves_the_key_as_it_was() -> None:
    step = ChangelogBatch(("key",), RetractingAccumulators(_calls()), input_changelog=True, paired=False)
    assert step.apply(("k",), None, [Change(RowKind.DELETE, {"price": 1, "bidder": 1})]) == (None, [])


def test_a_key_emptied_by_its_batch_is_deleted_unless_its_last_change_is_a_paired_update_before() -> None:
    accs = RetractingAccumulators(_calls())
    row = {"price": 2, "bidder": 1}
    for paired, expected_kinds in ((False, [RowKind.DELETE]), (True, [])):
        step = ChangelogBatch(("key",), accs, input_changelog=True, paired=paired)
        held, out = step.apply(("k",), None, [Change(RowKind.INSERT, row)])
        assert [c.kind for c in out] == [RowKind.INSERT]
        state, out = step.apply(("k",), held, [Change(RowKind.UPDATE_BEFORE, row)])
        assert [c.kind for c in out] == expected_kinds
        assert group_changes(held[1][2], None, RowKind.UPDATE_BEFORE, paired=paired).changes == tuple(out)
        assert (state is None) == (not paired)  # a held -U keeps the row it emitted until its +U


@pytest.mark.parametrize("seed", range(30))
def test_an_upsert_batch_ends_in_the_per_record_row_and_emits_at_most_once_per_batch(seed: int) -> None:
    rng = random.Random(seed)
    cheap = AggregateCall(
        "cheap", "COUNT", True, BIDDER, "COUNT(DISTINCT bidder) FILTER (WHERE price < 3)", None, CHEAP
    )
    calls = (*_calls(), cheap)
    step = UpsertBatch(("key",), Accumulators(calls))
    rows = [{"price": rng.choice([None, *range(5)]), "bidder": rng.randint(0, 3)} for _ in range(rng.randint(1, 25))]

    def apply(held: Any, values: Sequence[Any]) -> tuple[Any, list[Any]]:
        return step.apply(("k",), held, values)

    record_state, record_out = _per_record(apply, rows)
    batches = _split(rows, rng)
    batch_state, batch_out = _batched(apply, batches)
    assert batch_state == record_state
    assert batch_out[-1] == record_out[-1]  # the key's last row: the final table
    assert len(batch_out) <= len(batches)
    assert all(a != b for a, b in itertools.pairwise(batch_out))  # an unchanged row is not emitted again


# The settings: Flink's names, for the INSERTs after them ----------------------------------------------


def test_the_mini_batch_settings_apply_to_the_inserts_after_them_and_explain_shows_them() -> None:
    from tests.unit.weir.sql.test_script import ORDERS, SINKS
    from weir.sql import explain, plan_script

    insert = "INSERT INTO totals SELECT `user`, COUNT(*) FROM orders GROUP BY `user`;\n"
    text = (
        ORDERS
        + SINKS
        + insert
        + "SET 'table.exec.mini-batch.enabled' = 'true';\nSET 'table.exec.mini-batch.allow-latency' = '2 s';\n"
        + "SET 'table.exec.mini-batch.size' = '50000';\n"
        + insert
        + "SET 'table.exec.mini-batch.enabled' = 'false';\n"
        + insert
    )
    before, batched, after = plan_script(text).inserts
    assert (before.mini_batch, batched.mini_batch, after.mini_batch) == (None, MiniBatchConfig(2_000, 50_000), None)
    lines = explain(text).splitlines()
    kinds = [line.split()[1].rstrip(":") for line in lines if line.startswith("sql-") and "-source-" not in line]
    # per row: accumulate, group-aggregate, aggregate-result; in mini-batches: one operator
    assert kinds == [
        *("accumulate", "group-aggregate", "aggregate-result", "project", "sink"),
        *("group-aggregate", "project", "sink"),
        *("accumulate", "group-aggregate", "aggregate-result", "project", "sink"),
    ]
    assert sum("mini-batch 2000 ms / 50000 rows" in line for line in lines) == 1


# The operator: when it applies its buffer, what it emits, a row that raises ----------------------------


def _operator(clock: Clock, size: int = 100, latency: int = 500, on_error: Any = None) -> MiniBatchGroupAggregate:
    from weir.core.rejections import FAIL

    step = UpsertBatch(("bidder",), Accumulators(_calls()))
    return MiniBatchGroupAggregate(
        lambda row: (row["bidder"],),
        step,
        MiniBatchConfig(latency, size),
        "accumulators",
        clock=clock,
        on_error=FAIL if on_error is None else on_error,
    )


def _bid(bidder: int, price: Any) -> dict[str, Any]:
    return {"bidder": bidder, "price": price}


def test_the_operator_applies_its_buffer_at_a_snapshot_at_its_deadline_at_its_size_and_at_the_end(
    start_operator: StartOperator,
) -> None:
    clock = Clock(10_000)
    op = _operator(clock, size=4, latency=500)
    out = start_operator(op)
    op.process(_bid(1, 5), 100)
    op.process(_bid(2, 7), 101)
    op.process(_bid(1, 3), 102)
    op.process_watermark(90)  # held behind the buffer
    assert out.events == [] and op.next_processing_time() == 10_500
    op.snapshot_state(1)  # a checkpoint: applied before the barrier, the watermark after its rows
    rows = [(v["bidder"], v["n"], v["total"]) for v in out.values]
    assert rows == [(1, 2, 8), (2, 1, 7)] and [t for _, t in out.records] == [102, 101]
    assert out.events[-1] == ("watermark", 90) and op.next_processing_time() is None
    out.events.clear(), out.take()
    op.process_watermark(95)  # an empty buffer: it passes
    assert out.events == [("watermark", 95)]
    clock.now = 20_000
    op.process(_bid(1, 1), 200)
    assert op.next_processing_time() == 20_500
    op.on_processing_time(20_500)  # the latency deadline
    assert [(v["bidder"], v["n"]) for v, _ in out.take()] == [(1, 3)]
    for price in (1, 2, 3):
        op.process(_bid(3, price), 300)
    assert out.records == []
    op.process(_bid(3, 4), 301)  # the 4th row: full
    assert [(v["bidder"], v["n"], v["total"]) for v, _ in out.take()] == [(3, 4, 10)]
    op.process(_bid(2, None), 400)  # a NULL price: COUNT(*) moves, the rest not
    op.end_input()
    assert [(v["bidder"], v["n"], v["total"]) for v, _ in out.take()] == [(2, 2, 7)]


def test_a_row_that_raises_is_rejected_alone_and_the_rest_of_its_batch_applied(make_context: MakeContext) -> None:
    from tests.unit.operators.test_rejections import DLQ, start_with_letters

    clock = Clock()
    op = _operator(clock, on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "agg")
    for bid in (_bid(1, 5), _bid(1, "five"), _bid(1, 2), _bid(2, 1)):  # "five" + 5: a TypeError in SUM
        op.process(bid, 10)
    op.snapshot_state(1)
    assert [(v["bidder"], v["n"], v["total"]) for v in out.values] == [(1, 2, 7), (2, 1, 1)]
    assert len(letters.letters) == 1 and "five" in str(letters.letters[0])


def test_a_row_that_raises_fails_the_job_naming_it_under_the_fail_policy(start_operator: StartOperator) -> None:
    from weir.core.rejections import UserFunctionError

    op = _operator(Clock())
    start_operator(op, uid="agg")
    op.process(_bid(1, 5), 10)
    op.process(_bid(1, "five"), 11)
    with pytest.raises(UserFunctionError) as raised:
        op.snapshot_state(1)
    assert raised.value.rejected.operator_uid == "agg" and "five" in raised.value.rejected.record


@pytest.mark.parametrize("seed", range(10))
def test_add_gives_each_calls_accumulator_as_the_call_by_call_rule_does(seed: int) -> None:
    """``Accumulators.add`` (each call's adder chosen once; a single call without FILTER on its own
    path) against ``_add`` applied call by call: the same values of the same types, NULLs and
    FILTER included, for the calls together and for each alone."""
    rng = random.Random(seed)
    calls = (*_calls(), AggregateCall("cheap", "COUNT", False, None, "COUNT(*) FILTER (WHERE price < 3)", None, CHEAP))
    rows = [
        {"price": rng.choice([None, *range(5), 2.0, 3.0]), "bidder": rng.choice([None, 0, 1, 2])}
        for _ in range(rng.randint(1, 40))
    ]
    for chosen in (calls, *((c,) for c in calls)):
        accumulators = Accumulators(chosen)
        got, expected = accumulators.create(), accumulators.create()
        for row in rows:
            got = accumulators.add(got, row)
            expected = tuple(
                a
                if c.condition is not None and c.condition.evaluate(row) is not True
                else Accumulators._add(c, a, None if c.argument is None else c.argument.evaluate(row))
                for c, a in zip(chosen, expected, strict=True)
            )
            assert [(type(a), a) for a in got] == [(type(a), a) for a in expected], (chosen, row)
