"""The upgrade scenario's rules, without a cluster: the result each window must have given the cut,
the comparison of what a sink holds with it, and the two job versions it runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from weir.api import load_job_file
from weir.core.keygroups import KeyGroupRange, key_group_for_key
from weir.core.state_schema import StoredSchema, Verdict, check_compatible
from weir.scenarios.keyed_job import Event, InputRecord, SavepointCut, WindowWatermark
from weir.scenarios.upgrade import (
    V1_FILE,
    V2_FILE,
    UpgradeConfig,
    UpgradeRun,
    check,
    check_sink,
    expected_results,
    postgres_expectation,
)

ALL_GROUPS = KeyGroupRange(0, 127)  # type: ignore[arg-type]


def cut(next_offsets: dict[int, int], watermark: int) -> SavepointCut:
    return SavepointCut(next_offsets=next_offsets, window_watermarks=(WindowWatermark(0, ALL_GROUPS, watermark),))


def test_windows_fired_before_the_savepoint_are_v1s_and_the_rest_v2s() -> None:
    events = [
        InputRecord(0, 0, Event("a", 5, 100)),  # window [0, 1000): fired by v1 (its watermark 999)
        InputRecord(0, 1, Event("a", -3, 500)),  # v1 counts negative values: it has no filter
        InputRecord(0, 2, Event("a", 4, 1200)),  # window [1000, 2000): open at the cut, v1's part
        InputRecord(0, 3, Event("a", -1, 1500)),  # after the cut: dropped by v2's filter
        InputRecord(0, 4, Event("a", 7, 1600)),  # after the cut, into the migrated window
        InputRecord(0, 5, Event("a", 3, 2100)),  # window [2000, 3000): v2's alone
        InputRecord(0, 6, Event("a", 9, 2200)),
        InputRecord(0, 7, Event("a", -2, 3100)),  # window [3000, 4000): nothing but a filtered event, no result
    ]
    expectation = expected_results(events, cut({0: 3}, 999), 1000)
    assert expectation.results == {
        ("a", 0): {"key": "a", "window_start": 0, "window_end": 1000, "count": 2, "sum": 2, "v": 1},
        ("a", 1000): {"key": "a", "window_start": 1000, "window_end": 2000, "count": 2, "sum": 11, "max": None, "v": 2},
        ("a", 2000): {"key": "a", "window_start": 2000, "window_end": 3000, "count": 2, "sum": 12, "max": 9, "v": 2},
    }
    assert (expectation.events_before, expectation.events_after, expectation.filtered) == (3, 5, 2)
    assert (expectation.migrated, expectation.late, expectation.count(1), expectation.count(2)) == (1, 0, 1, 2)


def test_an_event_after_the_cut_for_a_window_v1_fired_is_late_and_dropped() -> None:
    events = [
        InputRecord(1, 0, Event("b", 5, 100)),
        InputRecord(2, 0, Event("c", 6, 200)),
    ]  # partition 1 read by v1, 2 not at all
    expectation = expected_results(events, cut({1: 1}, 999), 1000)
    assert expectation.results == {
        ("b", 0): {"key": "b", "window_start": 0, "window_end": 1000, "count": 1, "sum": 5, "v": 1}
    }
    assert expectation.late == 1


def test_the_watermark_is_that_of_the_window_subtask_holding_the_key() -> None:
    # Two v1 window subtasks at different watermarks: a key's window fired only where its key group was.
    groups = {key: key_group_for_key(key, 128) for key in (f"key-{i:04d}" for i in range(20))}
    assert {g <= 63 for g in groups.values()} == {True, False}
    low = KeyGroupRange(0, 63)  # type: ignore[arg-type]
    high = KeyGroupRange(64, 127)  # type: ignore[arg-type]
    two = SavepointCut({0: 10}, (WindowWatermark(0, low, 999), WindowWatermark(1, high, -1)))
    events = [InputRecord(0, i, Event(key, 1, 10)) for i, key in enumerate(groups)]
    results = expected_results(events, two, 1000).results
    for key, group in groups.items():
        assert results[(key, 0)]["v"] == (1 if group <= 63 else 2)


def result(key: str, start: int, v: int, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "window_start": start,
        "window_end": start + 1000,
        "count": count,
        "sum": count,
        "v": v,
        **extra,
    }


def test_a_sink_holding_exactly_the_expected_results_is_ok() -> None:
    expected = {("a", 0): result("a", 0, 1), ("a", 1000): result("a", 1000, 2, max=1)}
    check = check_sink("kafka t", expected, list(expected.values()))
    c = check.comparison
    assert c.exact and check.by_version == {1: 1, 2: 1} and c.found == 2 and len(c.windows) == 2
    assert check.interleaved == 0 and not check.open_transactions


def test_each_discrepancy_is_counted() -> None:
    expected = {
        ("a", 0): result("a", 0, 1),
        ("a", 1000): result("a", 1000, 2, max=1),
        ("b", 0): result("b", 0, 1),
        ("c", 0): result("c", 0, 2, max=1),
    }
    found = [
        result("a", 0, 1),
        result("a", 0, 1),  # a duplicate
        result("a", 1000, 2, count=5, max=1),  # other values
        result("c", 0, 1),  # the wrong version
        result("d", 0, 2, max=1),  # not in the input
        None,  # unreadable
    ]
    c = check_sink("kafka t", expected, found).comparison
    assert (c.duplicates, c.missing, c.unexpected, c.mismatched) == (1, 1, 2, 2)
    assert not c.exact and len(c.samples) == 5


def test_a_v2_window_before_a_v1_window_of_the_same_key_is_interleaved() -> None:
    expected = {("a", 0): result("a", 0, 2, max=1), ("a", 1000): result("a", 1000, 1)}
    check = check_sink("postgres t", expected, list(expected.values()), ["prepared transaction weir:x"])
    assert check.interleaved == 1 and check.open_transactions == ("prepared transaction weir:x",)
    assert check.comparison.exact  # the values are right: the order and the transaction are not


def _upgrade_run(records: tuple[InputRecord, ...], at_cut: SavepointCut, **changes: object) -> UpgradeRun:
    """A run whose sinks hold exactly what the input and the cut say."""
    e = expected_results(records, at_cut, 1000)
    run = UpgradeRun(
        "v1",
        "v2",
        at_cut,
        records,
        kafka=tuple(e.results.values()),
        postgres=tuple(postgres_expectation(e).values()),
        kafka_open=(),
        postgres_prepared=(),
    )
    return replace(run, **changes)  # type: ignore[arg-type]


UPGRADED = (
    InputRecord(0, 0, Event("a", 5, 100)),  # fired by v1
    InputRecord(0, 1, Event("a", 4, 1200)),  # open at the cut
    InputRecord(0, 2, Event("a", -1, 1500)),  # filtered by v2
    InputRecord(0, 3, Event("a", 7, 1600)),  # into the migrated window
)


def test_a_run_that_exercises_the_upgrade_with_exact_sinks_passes_every_check() -> None:
    report = check(UpgradeConfig(), _upgrade_run(UPGRADED, cut({0: 2}, 999)))
    assert report.ok, report.failed
    assert len(report.checks) == 11
    numbers = report.check("sink-exact:postgres-sink").numbers
    assert (numbers["v1"], numbers["v2"], numbers["found"]) == (1, 1, 2)
    assert report.check("windows-migrated").numbers == {"migrated": 1}


def test_a_sink_with_a_wrong_result_or_a_prepared_transaction_fails_its_checks() -> None:
    good = _upgrade_run(UPGRADED, cut({0: 2}, 999))
    wrong = ({**good.kafka[0], "count": 9}, *good.kafka[1:])  # type: ignore[dict-item]
    failed = {c.name for c in check(UpgradeConfig(), replace(good, kafka=wrong)).failed}
    assert failed == {"sink-exact:kafka-sink"}
    failed = {c.name for c in check(UpgradeConfig(), replace(good, postgres_prepared=("weir:v1:...",))).failed}
    assert failed == {"nothing-open:postgres-sink"}


def test_a_run_that_does_not_exercise_the_upgrade_fails() -> None:
    everything_before = (InputRecord(0, 0, Event("a", 1, 10)),)
    report = check(UpgradeConfig(), _upgrade_run(everything_before, cut({0: 1}, -1)))
    assert [c.name for c in report.failed] == ["v1-fired-windows", "v2-read-after-cut", "v2-filter-dropped"]


# The two versions of the job ---------------------------------------------------------------------------


def test_v2_keeps_the_stateful_uids_of_v1_and_adds_only_a_stateless_filter() -> None:
    v1 = load_job_file(V1_FILE).graph.transformations
    v2 = load_job_file(V2_FILE).graph.transformations
    assert set(v1) == {"events-source", "key-value", "window-count-sum", "kafka-sink", "postgres-sink"}
    assert set(v2) == set(v1) | {"drop-negative"}
    (v2_window,) = v2["window-count-sum"].factory().state_schemas()
    (v1_window,) = v1["window-count-sum"].factory().state_schemas()
    assert (v1_window.version, v2_window.version) == (1, 2)
    assert check_compatible("window-count-sum", StoredSchema("win", "pickle", 1), v2_window).verdict is Verdict.MIGRATE


def test_v2_migrates_v1s_accumulator_and_keeps_its_max_unknown() -> None:
    module = load_job_file(V2_FILE).module
    fn = module.CountSumMax()
    migrated = module.from_v1(1, (3, 12))
    assert migrated == (3, 12, None)
    assert fn.add(migrated, ("k", 50)) == (4, 62, None)  # the max of v1's part is unknown: it stays unknown
    fresh = fn.add(fn.add(fn.create(), ("k", 4)), ("k", 9))
    assert fresh == (2, 13, 9)
    assert fn.result("k", 0, 1000, fresh) == {
        "key": "k",
        "window_start": 0,
        "window_end": 1000,
        "count": 2,
        "sum": 13,
        "max": 9,
        "v": 2,
    }
    assert module.keep({"value": 0}) and not module.keep({"value": -1})
    with pytest.raises(ValueError, match="no migration from accumulator version 2"):
        module.from_v1(2, (1, 1))
