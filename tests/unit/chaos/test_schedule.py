"""The chaos schedule: seeded, every kind before any repeats, faults apart, refused when they cannot fit."""

from __future__ import annotations

from typing import assert_never

import pytest

from tests.chaos.driver import expected_last_seq
from tests.chaos.schedule import ALL_KINDS, TASKMANAGERS, FaultKind, make_schedule, parse_kinds

HEARTBEAT_S = 6.0


def schedule(seed: int = 1, count: int = 7, run_s: float = 900.0, gap: float = 20.0, kinds=ALL_KINDS):  # type: ignore[no-untyped-def]
    return make_schedule(
        seed=seed, count=count, kinds=kinds, run_s=run_s, min_gap_s=gap, heartbeat_timeout_s=HEARTBEAT_S
    )


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert schedule(seed=3) == schedule(seed=3)
    assert schedule(seed=3) != schedule(seed=4)


def test_every_kind_appears_once_before_any_appears_twice() -> None:
    faults = schedule(count=len(ALL_KINDS) * 2 - 1, run_s=2000.0)
    first_cycle = [f.kind for f in faults[: len(ALL_KINDS)]]
    assert sorted(first_cycle, key=lambda k: k.value) == sorted(ALL_KINDS, key=lambda k: k.value)


def test_faults_are_in_time_order_apart_by_the_gap_and_inside_the_run() -> None:
    for seed in range(20):
        faults = schedule(seed=seed, count=6, run_s=600.0, gap=25.0)
        assert faults[0].at_s >= 5.0
        for before, after in zip(faults, faults[1:], strict=False):
            assert after.at_s >= before.at_s + before.duration_s + 25.0 - 0.11  # rounded to 0.1 s
        last = faults[-1]
        assert last.at_s + last.duration_s + 25.0 <= 600.0 + 0.11


def test_targets_and_durations_fit_each_kind() -> None:
    for f in schedule(count=21, run_s=5000.0):
        match f.kind:
            case FaultKind.KILL_TASKMANAGER:
                assert f.target in TASKMANAGERS and f.duration_s == 0
            case FaultKind.PAUSE_TASKMANAGER:
                assert f.target in TASKMANAGERS and f.duration_s > HEARTBEAT_S  # long enough to be declared lost
            case FaultKind.KILL_JOBMANAGER:
                assert f.target == "jobmanager" and f.duration_s == 0
            case FaultKind.RESTART_KAFKA | FaultKind.RESTART_POSTGRES:
                assert f.target in ("kafka", "postgres") and 1.0 <= f.duration_s <= 5.0
            case FaultKind.RESTART_S3 | FaultKind.PAUSE_S3:
                assert f.target == "s3" and f.duration_s >= 1.0
            case FaultKind.SLOW_S3:
                assert f.target == "s3" and 8.0 <= f.duration_s <= 20.0
            case FaultKind.FILL_DISK:
                assert f.target in TASKMANAGERS and 5.0 <= f.duration_s <= 15.0
            case _ as unreachable:
                assert_never(unreachable)


def test_a_schedule_that_cannot_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError, match="faults need at least"):
        schedule(count=10, run_s=100.0, gap=20.0)
    assert schedule(count=0, run_s=10.0) == ()
    with pytest.raises(ValueError, match="no fault kinds"):
        schedule(count=1, kinds=())


def test_kinds_parse_by_name_and_unknown_ones_are_named() -> None:
    assert parse_kinds("all") == ALL_KINDS
    assert parse_kinds("kill-taskmanager, restart-kafka") == (FaultKind.KILL_TASKMANAGER, FaultKind.RESTART_KAFKA)
    with pytest.raises(ValueError, match="unknown fault kind 'reboot'"):
        parse_kinds("reboot")


def test_the_input_gives_each_key_its_last_seq() -> None:
    # 10 events over 4 keys: k0 gets events 0, 4, 8 (seq 1..3), k1 1, 5, 9, k2 2, 6, k3 3, 7.
    assert expected_last_seq(10, 4) == {"k0": 3, "k1": 3, "k2": 2, "k3": 2}
    assert expected_last_seq(3, 5) == {"k0": 1, "k1": 1, "k2": 1}
