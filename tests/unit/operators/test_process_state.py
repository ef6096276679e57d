"""A KeyedProcessFunction's state kinds (ValueState, ListState, MapState, ReducingState,
AggregatingState) per key, through the keyed store and a restore, with their schemas and TTL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.api import StateTtlConfig, TtlUpdateType
from weir.core.errors import JobDefinitionError
from weir.core.keygroups import key_group_for_key
from weir.core.state_schema import StateSchema, StoredSchema
from weir.operators.keyed import KeyedProcessContext, KeyedProcessOperator
from weir.operators.process_state import MapEntry, TtlValue


class FakeClock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


Step = Callable[[KeyedProcessContext], Any]


class Steps:
    """Runs the function a record carries, ``(key, fn)``, and emits what it returns."""

    def process_element(self, value: tuple[Any, Step], ctx: KeyedProcessContext, out: Any) -> None:
        out.collect(value[1](ctx))


class Harness:
    """One KeyedProcessOperator over the test's backend: ``run(key, fn)`` is ``fn(ctx)`` for ``key``."""

    def __init__(self, start_operator: StartOperator, clock: FakeClock | None = None, **schemas: Any) -> None:
        self.clock = clock or FakeClock()
        self.op = KeyedProcessOperator(Steps(), lambda v: v[0], schemas.get("schemas", ()), clock=self.clock)
        self.out = start_operator(self.op, uid="states")

    def run(self, key: Any, fn: Step) -> Any:
        self.op.process((key, fn), None)
        return self.out.take()[-1][0]

    def raw(self, name: str, key: Any, entry: bytes = b"") -> Any:
        """What the store holds at ``key``'s address (with ``entry``: a map entry's) of state ``name``."""
        op = self.op
        op.switch_to_key(key)
        address = op.current_key_prefix + entry if entry else op.current_key_bytes
        return op.store.get(name, key_group_for_key(key, 128), address)


@pytest.fixture
def harness(start_operator: StartOperator) -> Harness:
    return Harness(start_operator)


# ValueState -------------------------------------------------------------------------------------------


def test_value_state_per_key(harness: Harness) -> None:
    assert harness.run("a", lambda c: c.value_state("v").value()) is None
    harness.run("a", lambda c: c.value_state("v").update(1))
    harness.run("b", lambda c: c.value_state("v").update(2))
    assert harness.run("a", lambda c: c.value_state("v").value()) == 1
    harness.run("a", lambda c: c.value_state("v").clear())
    assert harness.run("a", lambda c: c.value_state("v").value()) is None
    assert harness.run("b", lambda c: c.value_state("v").value()) == 2


# ListState --------------------------------------------------------------------------------------------


def test_list_state_add_add_all_update_clear(harness: Harness) -> None:
    assert harness.run("a", lambda c: c.list_state("l").get()) == []
    harness.run("a", lambda c: c.list_state("l").add(1))
    harness.run("a", lambda c: c.list_state("l").add_all([2, 3]))
    harness.run("a", lambda c: c.list_state("l").add_all([]))
    harness.run("b", lambda c: c.list_state("l").add("x"))
    assert harness.run("a", lambda c: c.list_state("l").get()) == [1, 2, 3]
    harness.run("a", lambda c: c.list_state("l").update([9, None]))
    assert harness.run("a", lambda c: c.list_state("l").get()) == [9, None]
    harness.run("a", lambda c: c.list_state("l").update([]))
    assert harness.run("a", lambda c: c.list_state("l").get()) == []
    assert harness.raw("l", "a") is None  # an emptied list is no stored value
    harness.run("b", lambda c: c.list_state("l").add_all(iter(("y", "z"))))
    assert harness.run("b", lambda c: c.list_state("l").get()) == ["x", "y", "z"]
    harness.run("b", lambda c: c.list_state("l").clear())
    assert harness.run("b", lambda c: c.list_state("l").get()) == []


def test_list_state_get_is_a_copy(harness: Harness) -> None:
    harness.run("a", lambda c: c.list_state("l").add(1))
    got = harness.run("a", lambda c: c.list_state("l").get())
    got.append(2)
    assert harness.run("a", lambda c: c.list_state("l").get()) == [1]
    harness.run("a", lambda c: c.list_state("l").add(3))  # the stored list grows: the copy read does not
    assert got == [1, 2]
    assert harness.run("a", lambda c: c.list_state("l").get()) == [1, 3]


def test_a_list_grown_after_each_snapshot_restores_whole(start_operator: StartOperator) -> None:
    """The stored list grows in place between snapshots (the store's cached value): each snapshot
    writes the list as it is then, and a new instance reads every element back."""
    h = Harness(start_operator)
    h.run("a", lambda c: c.list_state("l").add(1))
    h.op.snapshot_state(1)  # written; the cached list stays the store's
    h.run("a", lambda c: c.list_state("l").add_all([2, 3]))
    h.run("b", lambda c: c.list_state("l").add("x"))
    h.op.snapshot_state(2)
    h.run("a", lambda c: c.list_state("l").add(4))
    h.op.snapshot_state(3)
    restored = Harness(start_operator)
    assert restored.run("a", lambda c: c.list_state("l").get()) == [1, 2, 3, 4]
    assert restored.run("b", lambda c: c.list_state("l").get()) == ["x"]


# MapState ---------------------------------------------------------------------------------------------


def test_map_state_entries_per_key(harness: Harness) -> None:
    def fill(c: KeyedProcessContext) -> None:
        m = c.map_state("m")
        m.put("x", 1)
        m.put("y", None)
        m.put_all([(3, "three"), (("t", 1), [1])])

    harness.run("a", fill)
    harness.run("b", lambda c: c.map_state("m").put("x", "b's"))
    assert harness.run("a", lambda c: c.map_state("m").get("x")) == 1
    assert harness.run("a", lambda c: c.map_state("m").contains("y"))  # a None value is an entry
    assert not harness.run("a", lambda c: c.map_state("m").contains("z"))
    assert harness.run("a", lambda c: c.map_state("m").get("z")) is None
    assert sorted(map(repr, harness.run("a", lambda c: c.map_state("m").items()))) == sorted(
        map(repr, [("x", 1), ("y", None), (3, "three"), (("t", 1), [1])])
    )
    assert harness.run("b", lambda c: c.map_state("m").items()) == [("x", "b's")]
    harness.run("a", lambda c: c.map_state("m").remove("x"))
    harness.run("a", lambda c: c.map_state("m").remove("never"))
    assert not harness.run("a", lambda c: c.map_state("m").contains("x"))
    assert sorted(map(repr, harness.run("a", lambda c: c.map_state("m").keys()))) == sorted(
        map(repr, ["y", 3, ("t", 1)])
    )
    assert harness.run("b", lambda c: c.map_state("m").values()) == ["b's"]


def test_map_state_iteration_sees_cached_and_stored_entries_and_clear_removes_only_the_key(
    harness: Harness,
) -> None:
    harness.run("a", lambda c: c.map_state("m").put("stored", 1))
    harness.op.store.flush()
    harness.run("a", lambda c: c.map_state("m").put("cached", 2))
    harness.run("a", lambda c: c.map_state("m").remove("stored"))
    harness.run("ab", lambda c: c.map_state("m").put("other key", 3))  # a key whose bytes start like "a"'s
    assert harness.run("a", lambda c: c.map_state("m").items()) == [("cached", 2)]
    harness.run("a", lambda c: c.map_state("m").clear())
    assert harness.run("a", lambda c: c.map_state("m").is_empty())
    assert harness.run("ab", lambda c: c.map_state("m").items()) == [("other key", 3)]


def test_a_map_entry_stores_its_key(harness: Harness) -> None:
    harness.run("a", lambda c: c.map_state("m").put("x", 1))
    assert harness.raw("m", "a", b"x") == MapEntry("x", 1)


# ReducingState, AggregatingState ----------------------------------------------------------------------


def test_reducing_state_folds_each_keys_values(harness: Harness) -> None:
    def add(c: KeyedProcessContext, v: int) -> Any:
        state = c.reducing_state("max", max)
        state.add(v)
        return state.get()

    assert harness.run("a", lambda c: c.reducing_state("max", max).get()) is None
    assert [harness.run("a", lambda c, v=v: add(c, v)) for v in (3, 1, 7, 2)] == [3, 3, 7, 7]
    assert harness.run("b", lambda c: add(c, -5)) == -5
    harness.run("a", lambda c: c.reducing_state("max", max).clear())
    assert harness.run("a", lambda c: add(c, 0)) == 0


class Mean:
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], value: int) -> tuple[int, int]:
        return acc[0] + value, acc[1] + 1

    def result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]


def test_aggregating_state_keeps_an_accumulator_and_reads_its_result(harness: Harness) -> None:
    assert harness.run("a", lambda c: c.aggregating_state("mean", Mean()).get()) is None
    for v in (1, 2, 6):
        harness.run("a", lambda c, v=v: c.aggregating_state("mean", Mean()).add(v))
    harness.run("b", lambda c: c.aggregating_state("mean", Mean()).add(10))
    assert harness.run("a", lambda c: c.aggregating_state("mean", Mean()).get()) == 3.0
    assert harness.raw("mean", "a") == (9, 3)  # the accumulator is what is stored
    assert harness.run("b", lambda c: c.aggregating_state("mean", Mean()).get()) == 10.0
    harness.run("a", lambda c: c.aggregating_state("mean", Mean()).clear())
    assert harness.run("a", lambda c: c.aggregating_state("mean", Mean()).get()) is None


# One kind per name ------------------------------------------------------------------------------------


def test_a_state_name_has_one_kind_and_one_ttl(harness: Harness) -> None:
    harness.run("a", lambda c: c.value_state("s"))
    assert harness.run("b", lambda c: c.value_state("s")) is harness.run("a", lambda c: c.value_state("s"))
    with pytest.raises(JobDefinitionError, match="state 's' is a ValueState with ttl None, asked for as a ListState"):
        harness.run("a", lambda c: c.list_state("s"))
    with pytest.raises(JobDefinitionError, match="asked for as a ValueState with ttl StateTtlConfig"):
        harness.run("a", lambda c: c.value_state("s", ttl=StateTtlConfig(10)))


@pytest.mark.parametrize("name", ["", "a\x00b", "timers.event_time", "timers.processing_time", 3])
def test_a_state_name_must_be_usable(harness: Harness, name: Any) -> None:
    with pytest.raises(JobDefinitionError, match="state name"):
        harness.run("a", lambda c: c.value_state(name))


def test_ttl_must_be_a_ttl_config(harness: Harness) -> None:
    with pytest.raises(JobDefinitionError, match="ttl must be a StateTtlConfig"):
        harness.run("a", lambda c: c.value_state("v", ttl=1000))  # type: ignore[arg-type]


# Restore and migration ----------------------------------------------------------------------------------


def test_every_state_kind_survives_a_snapshot_and_a_new_instance(start_operator: StartOperator) -> None:
    def write(c: KeyedProcessContext) -> None:
        c.value_state("v").update("value")
        c.list_state("l").add_all([1, 2])
        c.map_state("m").put("k", "entry")
        c.reducing_state("r", lambda a, b: a + b).add(5)
        c.aggregating_state("g", Mean()).add(4)

    def read(c: KeyedProcessContext) -> Any:
        return (
            c.value_state("v").value(),
            c.list_state("l").get(),
            c.map_state("m").items(),
            c.reducing_state("r", lambda a, b: a + b).get(),
            c.aggregating_state("g", Mean()).get(),
        )

    before = Harness(start_operator)
    before.run("a", write)
    before.op.snapshot_state(1)
    after = Harness(start_operator)
    assert after.run("a", read) == ("value", [1, 2], [("k", "entry")], 5, 4.0)
    assert after.run("b", read) == (None, [], [], None, None)


def test_a_declared_schema_migrates_list_map_and_ttl_values(make_context: MakeContext) -> None:
    clock = FakeClock(1_000)
    ttl = StateTtlConfig(timedelta(hours=1))

    def write(c: KeyedProcessContext) -> None:
        c.list_state("l").add_all([1, 2])
        c.map_state("m").put("k", 3)
        c.value_state("t", ttl=ttl).update(4)

    v1 = KeyedProcessOperator(Steps(), lambda v: v[0], clock=clock)
    v1.setup(make_context("states"), CollectingOutput())
    v1.open()
    v1.process(("a", write), None)
    v1.snapshot_state(1)

    def double(_version: int, value: Any) -> Any:
        return [x * 2 for x in value] if isinstance(value, list) else value * 2

    schemas = [StateSchema(n, version=2, migrate=double) for n in ("l", "m", "t")]
    v2 = KeyedProcessOperator(Steps(), lambda v: v[0], schemas, clock=clock)
    out = CollectingOutput()
    v2.setup(make_context("states"), out)
    v2.migrate_from({n: StoredSchema(n) for n in ("l", "m", "t")})
    v2.open()
    v2.process(
        ("a", lambda c: (c.list_state("l").get(), c.map_state("m").items(), c.value_state("t", ttl=ttl).value())),
        None,
    )
    assert out.values == [([2, 4], [("k", 6)], 8)]
    v2.switch_to_key("a")
    assert v2.store.get("t", v2.current_key_group, v2.current_key_bytes) == TtlValue(8, 1_000)  # its time kept


# TTL --------------------------------------------------------------------------------------------------


def test_ttl_config_takes_milliseconds_or_a_timedelta() -> None:
    assert StateTtlConfig(1500).ttl_ms == 1500
    assert StateTtlConfig(timedelta(seconds=2, microseconds=999)).ttl_ms == 2000
    assert StateTtlConfig(10).update_type is TtlUpdateType.ON_CREATE_AND_WRITE
    for bad in (0, -1, timedelta(0), 1.5, "10", True):
        with pytest.raises(JobDefinitionError, match="ttl"):
            StateTtlConfig(bad)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="update_type must be a TtlUpdateType"):
        StateTtlConfig(10, "OnReadAndWrite")  # type: ignore[arg-type]


def ttl_harness(
    start_operator: StartOperator, update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE
) -> Harness:
    return Harness(start_operator, FakeClock(1_000))


TTL = StateTtlConfig(100)
TTL_READ = StateTtlConfig(100, TtlUpdateType.ON_READ_AND_WRITE)


def test_an_expired_value_is_invisible_and_removed_when_read(start_operator: StartOperator) -> None:
    h = ttl_harness(start_operator)
    h.run("a", lambda c: c.value_state("v", ttl=TTL).update("x"))
    assert h.raw("v", "a") == TtlValue("x", 1_000)
    h.clock.now = 1_099
    assert h.run("a", lambda c: c.value_state("v", ttl=TTL).value()) == "x"
    h.clock.now = 1_100
    assert h.run("a", lambda c: c.value_state("v", ttl=TTL).value()) is None
    assert h.raw("v", "a") is None  # removed on access


def test_on_create_and_write_a_read_does_not_extend_the_ttl_but_a_write_does(start_operator: StartOperator) -> None:
    h = ttl_harness(start_operator)
    h.run("a", lambda c: c.value_state("v", ttl=TTL).update(1))
    h.clock.now = 1_050
    assert h.run("a", lambda c: c.value_state("v", ttl=TTL).value()) == 1
    h.clock.now = 1_090
    h.run("b", lambda c: c.value_state("v", ttl=TTL).update(2))
    h.run("b", lambda c: c.value_state("v", ttl=TTL).update(3))  # written again: lives until 1_190
    h.clock.now = 1_100
    assert h.run("a", lambda c: c.value_state("v", ttl=TTL).value()) is None
    h.clock.now = 1_189
    assert h.run("b", lambda c: c.value_state("v", ttl=TTL).value()) == 3
    h.clock.now = 1_190
    assert h.run("b", lambda c: c.value_state("v", ttl=TTL).value()) is None


def test_on_read_and_write_a_read_extends_the_ttl(start_operator: StartOperator) -> None:
    h = ttl_harness(start_operator)
    h.run("a", lambda c: c.value_state("v", ttl=TTL_READ).update(1))
    for now in (1_050, 1_140, 1_230):
        h.clock.now = now
        assert h.run("a", lambda c: c.value_state("v", ttl=TTL_READ).value()) == 1
    h.clock.now = 1_330
    assert h.run("a", lambda c: c.value_state("v", ttl=TTL_READ).value()) is None


def test_expired_values_of_keys_not_accessed_are_removed_by_a_snapshot(start_operator: StartOperator) -> None:
    h = ttl_harness(start_operator)
    h.run("old", lambda c: c.map_state("m", ttl=TTL).put("e", 1))
    h.run("old", lambda c: c.value_state("v", ttl=TTL).update(1))
    h.run("kept", lambda c: c.value_state("plain").update(1))  # no TTL: never expires
    h.clock.now = 1_060
    h.run("new", lambda c: c.value_state("v", ttl=TTL).update(2))
    h.clock.now = 1_100
    h.op.snapshot_state(1)
    assert h.raw("v", "old") is None
    assert h.raw("m", "old", b"e") is None
    assert h.raw("v", "new") == TtlValue(2, 1_060)
    assert h.raw("plain", "kept") == 1
    h.clock.now = 5_000
    after = Harness(start_operator, FakeClock(5_000))  # a value written before a restore expires as well
    assert after.run("new", lambda c: c.value_state("v", ttl=TTL).value()) is None


def test_map_entries_expire_one_by_one(start_operator: StartOperator) -> None:
    h = ttl_harness(start_operator)
    h.run("a", lambda c: c.map_state("m", ttl=TTL).put("early", 1))
    h.clock.now = 1_050
    h.run("a", lambda c: c.map_state("m", ttl=TTL).put("late", 2))
    h.clock.now = 1_100
    assert h.run("a", lambda c: c.map_state("m", ttl=TTL).items()) == [("late", 2)]
    assert not h.run("a", lambda c: c.map_state("m", ttl=TTL).contains("early"))
    assert h.run("a", lambda c: c.map_state("m", ttl=TTL).get("late")) == 2
    h.clock.now = 1_150
    assert h.run("a", lambda c: c.map_state("m", ttl=TTL).is_empty())


def test_list_reducing_and_aggregating_state_expire_as_one_value(start_operator: StartOperator) -> None:
    h = ttl_harness(start_operator)

    def add(c: KeyedProcessContext) -> Any:
        c.list_state("l", ttl=TTL).add(1)
        c.reducing_state("r", lambda a, b: a + b, ttl=TTL).add(1)
        c.aggregating_state("g", Mean(), ttl=TTL).add(1)

    def read(c: KeyedProcessContext) -> Any:
        return (
            c.list_state("l", ttl=TTL).get(),
            c.reducing_state("r", lambda a, b: a + b, ttl=TTL).get(),
            c.aggregating_state("g", Mean(), ttl=TTL).get(),
        )

    h.run("a", add)
    h.clock.now = 1_080
    h.run("a", add)  # a write restarts the whole value's TTL
    h.clock.now = 1_179
    assert h.run("a", read) == ([1, 1], 2, 1.0)
    h.clock.now = 1_180
    assert h.run("a", read) == ([], None, None)
    h.run("a", add)  # starts anew after expiry
    assert h.run("a", read) == ([1], 1, 1.0)


def test_a_value_written_without_ttl_never_expires_and_one_with_ttl_is_visible_without(
    start_operator: StartOperator,
) -> None:
    before = ttl_harness(start_operator)
    before.run("a", lambda c: c.value_state("plain").update(1))
    before.run("a", lambda c: c.value_state("ttl", ttl=TTL).update(2))
    before.op.snapshot_state(1)
    after = Harness(start_operator, FakeClock(10**9))
    assert after.run("a", lambda c: c.value_state("plain", ttl=TTL).value()) == 1
    assert after.run("a", lambda c: c.value_state("ttl").value()) == 2
