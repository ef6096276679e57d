"""Keyed state written at one schema version and restored by an operator that declares another: a
window's accumulators, a reduce's value and a KeyedProcessFunction's states migrate once, at open;
a restore that cannot read them fails with one line naming the operator, the state and the versions."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.core.state_schema import StateSchema, StateSchemaError, StoredSchema
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import TumblingEventTimeWindows
from weir.operators.base import StreamOperator
from weir.operators.keyed import KeyedOperator, KeyedProcessOperator, ReduceOperator
from weir.operators.windows import WindowAggregateOperator
from weir.taskmanager.state import StateBackend

UID = "window-count-sum"


class CountSum:
    """Version 1 of the job: the accumulator is (count, sum)."""

    def create(self) -> tuple[int, int]:
        return 0, 0

    def add(self, acc: tuple[int, int], value: tuple[str, int]) -> tuple[int, int]:
        return acc[0] + 1, acc[1] + value[1]

    def result(self, key: str, start: int, end: int, acc: tuple[int, int]) -> tuple[Any, ...]:
        return key, start, *acc


class CountSumMax:
    """Version 2: (count, sum, max); a migrated accumulator's max is unknown (None) until its next value."""

    def create(self) -> tuple[int, int, int | None]:
        return 0, 0, None

    def add(self, acc: tuple[int, int, int | None], value: tuple[str, int]) -> tuple[int, int, int | None]:
        count, total, high = acc
        return count + 1, total + value[1], value[1] if high is None else max(high, value[1])

    def result(self, key: str, start: int, end: int, acc: tuple[int, int, int | None]) -> tuple[Any, ...]:
        return key, start, *acc


def add_max(stored_version: int, acc: tuple[int, int]) -> tuple[int, int, None]:
    assert stored_version == 1
    count, total = acc
    return count, total, None


def windows(fn: Any, schema: StateSchema | None = None) -> WindowAggregateOperator:
    return WindowAggregateOperator(fn, lambda v: v[0], TumblingEventTimeWindows(10), 0, state_schema=schema)


def restore(
    op: KeyedOperator, make_context: MakeContext, stored: dict[str, StoredSchema], uid: str = UID
) -> CollectingOutput:
    """As a task restores: set up, told what the snapshot holds, then opened."""
    output = CollectingOutput()
    op.setup(make_context(uid), output)
    op.migrate_from(stored)
    op.open()
    return output


def start(op: StreamOperator, make_context: MakeContext, uid: str = UID) -> CollectingOutput:
    output = CollectingOutput()
    op.setup(make_context(uid), output)
    op.open()
    return output


def write_version_1(make_context: MakeContext) -> bytes:
    """Three (key, window) accumulators written at version 1; returns the operator state."""
    op = windows(CountSum())
    start(op, make_context)
    for value, ts in [(("a", 1), 1), (("a", 5), 2), (("b", 4), 3), (("a", 7), 12)]:
        op.process(value, ts)
    return op.snapshot_state(1) or b""


def stored_accumulators(backend: StateBackend, uid: str = UID) -> list[Any]:
    store = backend.keyed_store(uid)
    return sorted(entry for kg in range(128) for _key, entry in store.items("win", kg))


def test_window_accumulators_written_at_version_1_are_migrated_to_version_2_at_open(
    make_context: MakeContext, state_backend: StateBackend
) -> None:
    watermark_state = write_version_1(make_context)
    op = windows(CountSumMax(), StateSchema("win", version=2, migrate=add_max))
    assert [s.stored() for s in op.state_schemas()] == [StoredSchema("win", "pickle", 2)]
    output = CollectingOutput()
    op.setup(make_context(UID), output)
    op.migrate_from({"win": StoredSchema("win", "pickle", 1)})
    op.restore_state(watermark_state)
    op.open()
    # Every restored entry is rewritten in the database before the first record: runtime reads pay nothing.
    assert stored_accumulators(state_backend) == [("a", (1, 7, None)), ("a", (2, 6, None)), ("b", (1, 4, None))]
    op.process(("a", 3), 4)  # into a migrated accumulator
    op.process_watermark(MAX_WATERMARK)
    assert sorted(output.values) == [("a", 0, 3, 9, 3), ("a", 10, 1, 7, None), ("b", 0, 1, 4, None)]


def test_a_document_without_schemas_counts_as_version_1(make_context: MakeContext, state_backend: StateBackend) -> None:
    write_version_1(make_context)
    restore(windows(CountSumMax(), StateSchema("win", version=2, migrate=add_max)), make_context, {})
    assert len(stored_accumulators(state_backend)) == 3
    assert all(len(acc) == 3 for _key, acc in stored_accumulators(state_backend))


def test_version_2_without_a_migration_fails_the_restore_naming_uid_state_and_versions(
    make_context: MakeContext,
) -> None:
    write_version_1(make_context)
    op = windows(CountSumMax(), StateSchema("win", version=2))
    op.setup(make_context(UID), CollectingOutput())
    with pytest.raises(StateSchemaError) as failure:
        op.migrate_from({"win": StoredSchema("win", "pickle", 1)})
    assert str(failure.value) == (
        "operator 'window-count-sum' state 'win': the restored snapshot holds version 1 (pickle), the job "
        "declares version 2 (pickle) and no migration: pass migrate=fn(stored_version, value) along with "
        "state_version=2, or declare state_version=1 to restore it as it is"
    )
    assert not failure.value.retriable and failure.value.fault == "user"


def test_an_older_version_than_the_snapshots_is_refused(make_context: MakeContext) -> None:
    op = windows(CountSum())
    op.setup(make_context(UID), CollectingOutput())
    with pytest.raises(StateSchemaError, match="holds version 2 \\(pickle\\), the job declares version 1 \\(pickle\\)"):
        op.migrate_from({"win": StoredSchema("win", "pickle", 2)})


def test_the_same_version_restores_the_values_untouched(make_context: MakeContext, state_backend: StateBackend) -> None:
    write_version_1(make_context)
    restore(windows(CountSum()), make_context, {"win": StoredSchema("win")})
    assert stored_accumulators(state_backend) == [("a", (1, 7)), ("a", (2, 6)), ("b", (1, 4))]


def test_a_failing_migration_fails_the_restore_with_the_state_and_the_error(make_context: MakeContext) -> None:
    write_version_1(make_context)

    def broken(stored_version: int, acc: Any) -> Any:
        return acc["count"]

    op = windows(CountSumMax(), StateSchema("win", version=2, migrate=broken))
    with pytest.raises(
        StateSchemaError,
        match="operator 'window-count-sum' state 'win': migrate from version 1 to 2 failed on a restored value: "
        "TypeError: tuple indices must be integers",
    ):
        restore(op, make_context, {})


class Gone:
    """A class a version-1 value is pickled as; the new job no longer has it."""

    def __init__(self, n: int) -> None:
        self.n = n


def test_a_value_the_serializer_cannot_read_fails_the_restore(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = ReduceOperator(lambda a, b: Gone(a.n + b.n), lambda v: "k")
    start(op, make_context, uid="sum")
    op.process(Gone(2), None)
    op.snapshot_state(1)
    monkeypatch.delattr(sys.modules[__name__], "Gone")
    migrated = ReduceOperator(
        lambda a, b: a + b, lambda v: "k", StateSchema("reduce", version=2, migrate=lambda v, x: x.n)
    )
    with pytest.raises(
        StateSchemaError,
        match="operator 'sum' state 'reduce': the pickle serializer cannot read a value stored at version 1: "
        "AttributeError: .*; restore it with the code that wrote it",
    ):
        restore(migrated, make_context, {}, uid="sum")


def test_a_reduce_value_is_migrated(make_context: MakeContext) -> None:
    seconds = ReduceOperator(lambda a, b: (a[0], a[1] + b[1]), lambda v: v[0])
    start(seconds, make_context, uid="total")
    for value in [("a", 1), ("b", 2), ("a", 3)]:
        seconds.process(value, None)
    seconds.snapshot_state(1)

    def to_millis(stored_version: int, total: tuple[str, int]) -> tuple[str, int]:
        return total[0], total[1] * 1000

    millis = ReduceOperator(
        lambda a, b: (a[0], a[1] + b[1] * 1000),
        lambda v: v[0],
        StateSchema("reduce", version=2, migrate=to_millis),
    )
    output = restore(millis, make_context, {"reduce": StoredSchema("reduce")}, uid="total")
    millis.process(("a", 1), None)
    millis.process(("b", 1), None)
    assert output.values == [("a", 5000), ("b", 3000)]


class Counting:
    """Counts each key's values in ValueState ``count`` and remembers them in MapState ``seen``."""

    def process_element(self, value: tuple[str, int], ctx: Any, out: Any) -> None:
        count = ctx.value_state("count")
        count.update((count.value() or 0) + 1)
        ctx.map_state("seen").put(value[1], True)
        out.collect((value[0], count.value(), ctx.map_state("seen").get(value[1])))


def test_a_keyed_process_functions_declared_state_is_migrated_and_the_others_kept(make_context: MakeContext) -> None:
    v1 = KeyedProcessOperator(Counting(), lambda v: v[0])
    start(v1, make_context, uid="counter")
    v1.process(("a", 1), None)
    v1.process(("a", 2), None)
    v1.snapshot_state(1)

    class CountingV2:
        def process_element(self, value: tuple[str, int], ctx: Any, out: Any) -> None:
            count = ctx.value_state("count")
            count.update({"n": count.value()["n"] + 1})
            out.collect((value[0], count.value(), ctx.map_state("seen").get(1)))

    v2 = KeyedProcessOperator(
        CountingV2(), lambda v: v[0], [StateSchema("count", version=2, migrate=lambda _v, n: {"n": n})]
    )
    output = restore(v2, make_context, {"count": StoredSchema("count")}, uid="counter")
    v2.process(("a", 3), None)
    assert output.values == [("a", {"n": 3}, True)]
