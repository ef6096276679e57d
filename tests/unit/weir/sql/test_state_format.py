"""The SQL operators' versioned state (docs/formats.md, "SQL operator state"): ``changelog-aggregate``,
``top-n`` and ``changelog-normalize`` write ``(1, body)``; the untagged values a savepoint of an
earlier Weir holds (``changelog-aggregate``'s triple, ``top-n``'s list) restore, and another format
fails the job in one line naming the operator's format, never a record's dead letter.

Each restore goes through the state backend as a task's does: the operator's keyed state in RocksDB,
``snapshot_state``, then a new operator instance of the same uid opened over it. The state before the
tag is made exactly as an earlier Weir wrote it: the operator's own body, stored without the tag."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.core.errors import SerializationError
from weir.core.rejections import FAIL
from weir.operators.keyed import KeyedProcessContext, KeyedProcessOperator
from weir.sql.changelog import Change, RowKind
from weir.sql.minibatch import MiniBatchConfig
from weir.sql.plan import AggregateCall, NamedExpression
from weir.sql.ranking import RankedRows
from weir.sql.retract import ChangelogAggregate, ChangelogBatch, MiniBatchGroupAggregate, RetractingAccumulators
from weir.sql.state_format import (
    CHANGELOG_AGGREGATE_STATE,
    CHANGELOG_NORMALIZE_STATE,
    GROUP_AGGREGATE_STATE,
    JOIN_STATE,
    TOP_N_STATE,
    SqlStateFormat,
)
from weir.sql.upsert import ChangelogNormalize

UID = "sql-0123456789-0-changelog-aggregate"
PRICE = NamedExpression("price", "price", lambda row: row["price"])
CALLS = (
    AggregateCall("n", "COUNT", False, None, "COUNT(*)"),
    AggregateCall("total", "SUM", False, PRICE, "SUM(price)"),
    AggregateCall("high", "MAX", False, PRICE, "MAX(price)"),
    AggregateCall("prices", "COUNT", True, PRICE, "COUNT(DISTINCT price)"),
)


def _bucket(change: Change) -> tuple[Any, ...]:
    return (change.row["bucket"],)


def _changes(seed: int, n: int) -> list[Change]:
    """Inserts, and -U/+U and -D of rows present, over three buckets."""
    rng = random.Random(seed)
    present: list[dict[str, Any]] = []
    out: list[Change] = []
    for _ in range(n):
        roll = rng.random()
        if present and roll < 0.3:
            old = present.pop(rng.randrange(len(present)))
            new = {"bucket": old["bucket"], "price": rng.randint(0, 6)}
            out += [Change(RowKind.UPDATE_BEFORE, old), Change(RowKind.UPDATE_AFTER, new)]
            present.append(new)
        elif present and roll < 0.45:
            out.append(Change(RowKind.DELETE, present.pop(rng.randrange(len(present)))))
        else:
            row = {"bucket": rng.randint(0, 2), "price": rng.randint(0, 6)}
            out.append(Change(RowKind.INSERT, row))
            present.append(row)
    return out


def _aggregate() -> KeyedProcessOperator:
    fn = ChangelogAggregate(("bucket",), RetractingAccumulators(CALLS), input_changelog=True, paired=True)
    return KeyedProcessOperator(fn, _bucket)


def _mini_batch() -> MiniBatchGroupAggregate:
    batch = ChangelogBatch(("bucket",), RetractingAccumulators(CALLS), input_changelog=True, paired=True)
    return MiniBatchGroupAggregate(_bucket, batch, MiniBatchConfig(60_000, 4), "group", clock=lambda: 0, on_error=FAIL)


def _top_n() -> KeyedProcessOperator:
    return KeyedProcessOperator(RankedRows(lambda row: (-row["price"], row["seq"]), 3, "rownum"), _bucket_of_row)


def _bucket_of_row(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["bucket"],)


class Rewrite:
    """A function over the operator's keyed state, as a KeyedProcessFunction of the same uid: each
    record names a key, whose value state ``name`` is replaced by ``rewrite`` of it."""

    def __init__(self, name: str, rewrite: Callable[[Any], Any]) -> None:
        self.name, self.rewrite = name, rewrite

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Any) -> None:
        state = ctx.value_state(self.name)
        held = state.value()
        if held is not None:
            state.update(self.rewrite(held))
        out.collect(held)


def _rewrite_keys(
    start_operator: StartOperator, uid: str, name: str, keys: Sequence[Any], rewrite: Callable[[Any], Any]
) -> list[Any]:
    """Replace each key's stored value by ``rewrite`` of it and snapshot; answers the values read."""
    op = KeyedProcessOperator(Rewrite(name, rewrite), lambda key: key)
    out = start_operator(op, uid=uid)
    for key in keys:
        op.process(key, None)
    op.snapshot_state(2)
    return out.values


def _run(op: Any, out: CollectingOutput, values: Sequence[Any], checkpoint: int) -> list[Any]:
    for value in values:
        op.process(value, None)
    op.snapshot_state(checkpoint)
    return out.values


# The tag ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state_format", "body", "before"),
    [
        (CHANGELOG_AGGREGATE_STATE, (2, (2, (None, 0)), {"k": 1}), (2, (2, (None, 0)), {"k": 1})),
        (TOP_N_STATE, [{"a": 1}, {"a": 2}], [{"a": 1}, {"a": 2}]),
        (CHANGELOG_NORMALIZE_STATE, {"id": 1, "v": "x"}, None),
    ],
)
def test_a_value_is_its_format_and_body_and_the_untagged_shape_reads_as_format_1(
    state_format: SqlStateFormat, body: Any, before: Any
) -> None:
    assert state_format.tagged(body) == (1, body)
    assert state_format.body(state_format.tagged(body)) == body
    if before is not None:
        assert state_format.body(before) == body


@pytest.mark.parametrize(
    ("state_format", "held", "message"),
    [
        (
            CHANGELOG_AGGREGATE_STATE,
            (2, (1, (3,), None)),
            "changelog-aggregate state has format 2; this Weir reads format 1",
        ),
        (TOP_N_STATE, (7, [{"a": 1}]), "top-n state has format 7; this Weir reads format 1"),
        (TOP_N_STATE, (True, []), "top-n state has format True; this Weir reads format 1"),
        (CHANGELOG_NORMALIZE_STATE, ("v2", {}), "changelog-normalize state has format 'v2'; this Weir reads format 1"),
        (CHANGELOG_NORMALIZE_STATE, [{"id": 1}], "changelog-normalize state is not a \\(1, ...\\) pair but a list"),
        (TOP_N_STATE, {"a": 1}, "top-n state is not a \\(1, ...\\) pair but a dict"),
    ],
)
def test_another_format_is_refused_in_one_line_naming_the_operator(
    state_format: SqlStateFormat, held: Any, message: str
) -> None:
    with pytest.raises(SerializationError, match=message) as raised:
        state_format.body(held)
    assert "\n" not in str(raised.value)


# changelog-aggregate ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("operator", [_aggregate, _mini_batch], ids=["per-record", "mini-batch"])
def test_a_changelog_aggregate_restores_the_untagged_state_of_an_earlier_savepoint(
    start_operator: StartOperator, make_context: MakeContext, seed: int, operator: Callable[[], Any]
) -> None:
    changes = _changes(seed, 60)
    half = len(changes) // 2
    whole = operator()  # the same input and checkpoint without a restore: a mini-batch is cut at both
    out = start_operator(whole, uid="reference")
    _run(whole, out, changes[:half], 1)
    reference = _run(whole, out, changes[half:], 3)

    first = operator()
    before = _run(first, start_operator(first, uid=UID), changes[:half], 1)
    stored = _rewrite_keys(start_operator, UID, "group", [(b,) for b in range(3)], CHANGELOG_AGGREGATE_STATE.body)
    assert [s[0] for s in stored if s is not None] == [1] * sum(s is not None for s in stored)  # written tagged
    untagged = _rewrite_keys(start_operator, UID, "group", [(b,) for b in range(3)], lambda held: held)
    assert untagged and all(isinstance(s, tuple) and len(s) == 3 for s in untagged if s is not None)
    assert any(s is not None for s in untagged)  # a key held a triple, as an earlier Weir wrote it

    second = operator()
    after = _run(second, start_operator(second, uid=UID), changes[half:], 3)
    assert before + after == reference
    retagged = _rewrite_keys(start_operator, UID, "group", [(b,) for b in range(3)], lambda held: held)
    assert all(s[0] == 1 and len(s) == 2 for s in retagged if s is not None)  # written back tagged


@pytest.mark.parametrize("operator", [_aggregate, _mini_batch], ids=["per-record", "mini-batch"])
@pytest.mark.parametrize("dead_letters", [False, True])
def test_a_changelog_aggregate_state_of_a_newer_format_fails_the_job_not_the_record(
    start_operator: StartOperator, make_context: MakeContext, operator: Callable[[], Any], dead_letters: bool
) -> None:
    from tests.unit.operators.test_rejections import DLQ, start_with_letters

    first = operator()
    _run(first, start_operator(first, uid=UID), [Change(RowKind.INSERT, {"bucket": 0, "price": 3})], 1)
    _rewrite_keys(start_operator, UID, "group", [(0,)], lambda held: (2, held[1]))
    second = operator()
    if dead_letters:
        second.on_error = DLQ
        _out, letters = start_with_letters(second, make_context, UID)
    else:
        start_operator(second, uid=UID)
    with pytest.raises(SerializationError, match="^changelog-aggregate state has format 2; this Weir reads format 1"):
        _run(second, CollectingOutput(), [Change(RowKind.INSERT, {"bucket": 0, "price": 4})], 3)
    if dead_letters:
        assert letters.letters == []


# top-n -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_a_top_n_restores_the_untagged_rows_of_an_earlier_savepoint(start_operator: StartOperator, seed: int) -> None:
    rng = random.Random(seed)
    rows = [{"bucket": rng.randint(0, 2), "price": rng.randint(0, 20), "seq": n} for n in range(50)]
    whole = _top_n()
    reference = _run(whole, start_operator(whole, uid="reference"), rows, 1)
    uid = "sql-0123456789-1-top-n"
    first = _top_n()
    before = _run(first, start_operator(first, uid=uid), rows[:25], 1)
    tagged = _rewrite_keys(start_operator, uid, "top", [(b,) for b in range(3)], TOP_N_STATE.body)
    assert all(s[0] == 1 for s in tagged if s is not None) and any(s is not None for s in tagged)
    stored = _rewrite_keys(start_operator, uid, "top", [(b,) for b in range(3)], lambda held: held)
    assert all(isinstance(s, list) for s in stored if s is not None)  # a list of rows, as an earlier Weir's
    second = _top_n()
    after = _run(second, start_operator(second, uid=uid), rows[25:], 3)
    assert before + after == reference
    assert any(c.kind is RowKind.UPDATE_BEFORE for c in after)  # the restored rows were ranked against


def test_a_top_n_state_of_a_newer_format_fails_the_job(start_operator: StartOperator) -> None:
    uid = "sql-0123456789-1-top-n"
    first = _top_n()
    _run(first, start_operator(first, uid=uid), [{"bucket": 0, "price": 1, "seq": 0}], 1)
    _rewrite_keys(start_operator, uid, "top", [(0,)], lambda held: (2, held[1]))
    second = _top_n()
    start_operator(second, uid=uid)
    with pytest.raises(SerializationError, match="^top-n state has format 2; this Weir reads format 1"):
        second.process({"bucket": 0, "price": 2, "seq": 1}, None)


# changelog-normalize ---------------------------------------------------------------------------------------


def test_a_changelog_normalize_state_of_a_newer_format_fails_the_job(start_operator: StartOperator) -> None:
    uid = "sql-source-t-normalize"
    first = KeyedProcessOperator(ChangelogNormalize(), _id)
    _run(first, start_operator(first, uid=uid), [Change(RowKind.UPDATE_AFTER, {"id": 1, "v": "a"})], 1)
    stored = _rewrite_keys(start_operator, uid, "last", [(1,)], lambda held: (2, held[1]))
    assert stored == [(1, {"id": 1, "v": "a"})]
    second = KeyedProcessOperator(ChangelogNormalize(), _id)
    start_operator(second, uid=uid)
    with pytest.raises(SerializationError, match="^changelog-normalize state has format 2; this Weir reads format 1"):
        second.process(Change(RowKind.UPDATE_AFTER, {"id": 1, "v": "b"}), None)


def _id(change: Change) -> tuple[Any, ...]:
    return (change.row["id"],)


# group-aggregate (a GROUP BY written straight to an upsert sink) -------------------------------------------

APPEND_CALLS = (  # COUNT(*) and AVG: an untagged (1, (sum, count)) is a pair too, told apart by its type
    AggregateCall("n", "COUNT", False, None, "COUNT(*)"),
    AggregateCall("mean", "AVG", False, PRICE, "AVG(price)"),
)


def _ttl_group() -> KeyedProcessOperator:
    from weir.core.process_functions import StateTtlConfig
    from weir.sql.compile import Accumulators, GroupAggregateWithTtl

    fn = GroupAggregateWithTtl(("bucket",), Accumulators(APPEND_CALLS), StateTtlConfig(3_600_000))
    return KeyedProcessOperator(fn, _bucket_of_row, clock=lambda: 0)


def _batched_group() -> MiniBatchGroupAggregate:
    from weir.sql.compile import Accumulators
    from weir.sql.retract import UpsertBatch

    batch = UpsertBatch(("bucket",), Accumulators(APPEND_CALLS))
    return MiniBatchGroupAggregate(
        _bucket_of_row, batch, MiniBatchConfig(60_000, 3), "accumulators", clock=lambda: 0, on_error=FAIL
    )


def _rows(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"bucket": rng.randint(0, 2), "price": rng.randint(0, 6)} for _ in range(n)]


def _untag_ttl(held: Any) -> Any:
    """A value of a state with a TTL is a TtlValue: its value untagged, as an earlier Weir wrote it."""
    from weir.operators.process_state import TtlValue

    if isinstance(held, TtlValue):
        return TtlValue(GROUP_AGGREGATE_STATE.body(held.value), held.last_access_ms)
    return GROUP_AGGREGATE_STATE.body(held)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("operator", [_ttl_group, _batched_group], ids=["ttl", "mini-batch"])
def test_a_group_aggregate_restores_the_untagged_accumulators_of_an_earlier_savepoint(
    start_operator: StartOperator, seed: int, operator: Callable[[], Any]
) -> None:
    rows = _rows(seed, 40)
    uid = "sql-0123456789-0-group-aggregate"
    whole = operator()
    out = start_operator(whole, uid="reference")
    _run(whole, out, rows[:20], 1)
    reference = _run(whole, out, rows[20:], 3)
    first = operator()
    before = _run(first, start_operator(first, uid=uid), rows[:20], 1)
    keys = [(b,) for b in range(3)]
    stored = _rewrite_keys(start_operator, uid, "accumulators", keys, _untag_ttl)
    tags = [getattr(s, "value", s) for s in stored if s is not None]
    assert tags and all(isinstance(t, list) and t[0] == 1 for t in tags)  # written as [1, accumulators]
    untagged = _rewrite_keys(start_operator, uid, "accumulators", keys, lambda held: held)
    assert all(isinstance(getattr(s, "value", s), tuple) for s in untagged if s is not None)
    second = operator()
    after = _run(second, start_operator(second, uid=uid), rows[20:], 3)
    assert before + after == reference


@pytest.mark.parametrize("operator", [_ttl_group, _batched_group], ids=["ttl", "mini-batch"])
def test_a_group_aggregate_state_of_a_newer_format_fails_the_job(
    start_operator: StartOperator, operator: Callable[[], Any]
) -> None:
    from weir.operators.process_state import TtlValue

    uid = "sql-0123456789-0-group-aggregate"
    first = operator()
    _run(first, start_operator(first, uid=uid), [{"bucket": 0, "price": 3}], 1)

    def newer(held: Any) -> Any:
        if isinstance(held, TtlValue):
            return TtlValue([2, held.value[1]], held.last_access_ms)
        return [2, held[1]]

    _rewrite_keys(start_operator, uid, "accumulators", [(0,)], newer)
    second = operator()
    start_operator(second, uid=uid)
    with pytest.raises(SerializationError, match="^group-aggregate state has format 2; this Weir reads format 1"):
        _run(second, CollectingOutput(), [{"bucket": 0, "price": 4}], 3)


def test_the_group_aggregate_s_reduce_value_is_tagged_and_reads_its_untagged_pair() -> None:
    accs = (1, (5, 1))  # COUNT 1, AVG (5, 1): a pair itself
    assert GROUP_AGGREGATE_STATE.tagged(((7,), accs)) == [1, ((7,), accs)]
    assert GROUP_AGGREGATE_STATE.body(((7,), accs)) == ((7,), accs)  # the reduce's value before the tag
    assert GROUP_AGGREGATE_STATE.body(accs) == accs  # a tuple is never a tag
    assert GROUP_AGGREGATE_STATE.body([1, accs]) == accs


# join (a regular join of append inputs: list states of rows) -----------------------------------------------


def _join(kind: str) -> Any:
    from weir.operators.keyed import KeyedCoProcessOperator
    from weir.sql.join import JoinedRow, MiniBatchRegularJoin, RegularJoin

    joined = JoinedRow("A", "B", ("id", "a"), ("id", "b"))
    keys = (_id_of, _id_of)
    if kind == "record":
        return KeyedCoProcessOperator(RegularJoin(joined), keys)
    return MiniBatchRegularJoin(keys, joined, MiniBatchConfig(60_000, 3), clock=lambda: 0)


def _id_of(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["id"],)


class RewriteList:
    """As :class:`Rewrite`, of the list states ``left`` and ``right``: each element replaced by ``rewrite`` of it."""

    def __init__(self, rewrite: Callable[[Any], Any]) -> None:
        self.rewrite = rewrite

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Any) -> None:
        for name in ("left", "right"):
            state = ctx.list_state(name)
            held = state.get()
            state.update([self.rewrite(h) for h in held])
            out.collect(held)


def _rewrite_lists(start_operator: StartOperator, uid: str, keys: Sequence[Any], rewrite: Callable[[Any], Any]) -> Any:
    op = KeyedProcessOperator(RewriteList(rewrite), lambda key: key)
    out = start_operator(op, uid=uid)
    for key in keys:
        op.process(key, None)
    op.snapshot_state(2)
    return [element for held in out.values for element in held]


def _sides(seed: int, n: int) -> list[tuple[int, dict[str, Any]]]:
    rng = random.Random(seed)
    return [
        (0, {"id": rng.randint(0, 2), "a": i}) if rng.random() < 0.5 else (1, {"id": rng.randint(0, 2), "b": i})
        for i in range(n)
    ]


def _feed(op: Any, out: CollectingOutput, values: Sequence[tuple[int, dict[str, Any]]], checkpoint: int) -> Any:
    for index, row in values:
        op.process_input(index, row, None)
    op.snapshot_state(checkpoint)
    return sorted(str(v) for v in out.values)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("before_kind", "after_kind"), [("record", "record"), ("batched", "record"), ("record", "batched")]
)
def test_a_regular_join_restores_the_untagged_rows_of_an_earlier_savepoint(
    start_operator: StartOperator, seed: int, before_kind: str, after_kind: str
) -> None:
    rows = _sides(seed, 40)
    uid = "sql-0123456789-2-join"
    whole = _join("record")
    reference = _feed(whole, start_operator(whole, uid="reference"), rows, 1)
    first = _join(before_kind)
    before = start_operator(first, uid=uid)
    _feed(first, before, rows[:20], 1)
    keys = [(i,) for i in range(3)]
    stored = _rewrite_lists(start_operator, uid, keys, JOIN_STATE.body)
    assert stored and all(isinstance(s, tuple) and s[0] == 1 for s in stored)  # each row written as (1, row)
    assert all(isinstance(s, dict) for s in _rewrite_lists(start_operator, uid, keys, lambda held: held))
    second = _join(after_kind)
    after = start_operator(second, uid=uid)
    _feed(second, after, rows[20:], 3)
    assert sorted(str(v) for v in before.values + after.values) == reference
    assert after.values  # rows after the restore joined the restored ones


def test_a_regular_join_row_of_a_newer_format_fails_the_job(start_operator: StartOperator) -> None:
    uid = "sql-0123456789-2-join"
    first = _join("record")
    _feed(first, start_operator(first, uid=uid), [(0, {"id": 1, "a": 0})], 1)
    _rewrite_lists(start_operator, uid, [(1,)], lambda held: (2, held[1]))
    second = _join("record")
    start_operator(second, uid=uid)
    with pytest.raises(SerializationError, match="^join state has format 2; this Weir reads format 1"):
        second.process_input(1, {"id": 1, "b": 1}, None)


def _reduce_group() -> Any:
    from weir.operators.keyed import ReduceOperator
    from weir.sql.compile import Accumulators, GroupReduce

    group = GroupReduce(("bucket",), _bucket_of_row, Accumulators(APPEND_CALLS))
    return group, ReduceOperator(group.merge, group.key)


@pytest.mark.parametrize("seed", range(3))
def test_the_group_aggregate_s_reduce_restores_its_untagged_value_of_an_earlier_savepoint(
    start_operator: StartOperator, seed: int
) -> None:
    from weir.core.state_layout import REDUCE_STATE

    rows = _rows(seed, 40)
    uid = "sql-0123456789-1-group-aggregate"
    group, whole = _reduce_group()
    reference = _run(whole, start_operator(whole, uid="reference"), [group.accumulate(r) for r in rows], 1)
    group, first = _reduce_group()
    before = _run(first, start_operator(first, uid=uid), [group.accumulate(r) for r in rows[:20]], 1)
    keys = [(b,) for b in range(3)]
    stored = _rewrite_keys(start_operator, uid, REDUCE_STATE, keys, GROUP_AGGREGATE_STATE.body)
    assert all(isinstance(s, list) and s[0] == 1 for s in stored if s is not None)  # written as [1, (key, accs)]
    untagged = _rewrite_keys(start_operator, uid, REDUCE_STATE, keys, lambda held: held)
    assert any(isinstance(s, tuple) for s in untagged)  # (key, accumulators), as an earlier Weir wrote it
    group, second = _reduce_group()
    after = _run(second, start_operator(second, uid=uid), [group.accumulate(r) for r in rows[20:]], 3)
    assert [group.result(v) for v in before + after] == [group.result(v) for v in reference]
