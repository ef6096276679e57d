"""The periodic trigger decision and the checkpoint id counter."""

from __future__ import annotations

import math

import pytest

from weir.core.ids import CheckpointId
from weir.jobmanager.checkpointing.trigger import (
    Blocked,
    BlockReason,
    CheckpointConfig,
    CheckpointIdCounter,
    CheckpointTriggerDecider,
    TriggerLater,
    TriggerNow,
    TriggerState,
)
from weir.jobmanager.errors import CheckpointProtocolError, ConfigError


def decider(**config: float | int | None) -> CheckpointTriggerDecider:
    settings: dict[str, float | int | None] = {"interval_s": 10.0, "timeout_s": 60.0}
    settings.update(config)
    return CheckpointTriggerDecider(CheckpointConfig(**settings), CheckpointIdCounter())  # type: ignore[arg-type]


def state(**fields: object) -> TriggerState:
    values: dict[str, object] = {"running": True, "in_flight": 0, "savepoint_in_flight": False, "schedule_origin": 0.0}
    values.update(fields)
    return TriggerState(**values)  # type: ignore[arg-type]


def test_first_checkpoint_is_one_interval_after_the_start() -> None:
    d = decider()
    assert d.decide(5.0, state(schedule_origin=3.0)) == TriggerLater(13.0)
    assert d.decide(13.0, state(schedule_origin=3.0)) == TriggerNow(CheckpointId(1))


def test_next_checkpoint_is_one_interval_after_the_last_trigger() -> None:
    d = decider()
    s = state(last_periodic_trigger_at=20.0)
    assert d.decide(29.9, s) == TriggerLater(30.0)
    assert d.decide(30.0, s) == TriggerNow(CheckpointId(1))
    assert d.decide(95.0, s) == TriggerNow(CheckpointId(1)), "an overdue checkpoint triggers at once"


def test_a_restart_moves_the_schedule_origin_past_old_triggers() -> None:
    d = decider()
    assert d.decide(101.0, state(schedule_origin=100.0, last_periodic_trigger_at=95.0)) == TriggerLater(110.0)


def test_the_first_checkpoint_since_a_restore_is_due_as_soon_as_every_task_runs() -> None:
    d = decider(min_pause_s=2.0)
    restarted = state(schedule_origin=100.0, last_periodic_trigger_at=95.0, restored=True)
    assert d.decide(100.0, restarted) == TriggerNow(CheckpointId(1)), "the restored output waits for it"
    assert d.decide(100.0, state(schedule_origin=100.0, restored=True, last_end_at=99.0)) == TriggerLater(101.0)
    after_it = state(schedule_origin=100.0, last_periodic_trigger_at=100.5, restored=True)
    assert d.decide(101.0, after_it) == TriggerLater(110.5), "later ones keep the interval"
    assert d.decide(101.0, state(schedule_origin=100.0, last_periodic_trigger_at=95.0)) == TriggerLater(110.0)


def test_decide_does_not_take_the_id() -> None:
    counter = CheckpointIdCounter(first=5)
    d = CheckpointTriggerDecider(CheckpointConfig(interval_s=1.0), counter)
    assert d.decide(10.0, state()) == TriggerNow(CheckpointId(5))
    assert d.decide(10.0, state()) == TriggerNow(CheckpointId(5))
    assert counter.next()[0] == 5
    assert d.decide(10.0, state()) == TriggerNow(CheckpointId(6))


def test_not_running_or_disabled_blocks() -> None:
    assert decider().decide(100.0, state(running=False)) == Blocked(BlockReason.JOB_NOT_RUNNING)
    assert decider(interval_s=None).decide(100.0, state()) == Blocked(BlockReason.PERIODIC_DISABLED)


def test_max_concurrent_is_respected() -> None:
    assert decider().decide(100.0, state(in_flight=1)) == Blocked(BlockReason.TOO_MANY_CONCURRENT)
    assert decider(max_concurrent=2).decide(100.0, state(in_flight=1)) == TriggerNow(CheckpointId(1))
    assert decider(max_concurrent=2).decide(100.0, state(in_flight=2)) == Blocked(BlockReason.TOO_MANY_CONCURRENT)


def test_a_savepoint_in_flight_blocks_periodic_checkpoints() -> None:
    d = decider(max_concurrent=3)
    assert d.decide(100.0, state(in_flight=1, savepoint_in_flight=True)) == Blocked(BlockReason.SAVEPOINT_IN_PROGRESS)


def test_min_pause_counts_from_the_end_of_the_last_checkpoint() -> None:
    d = decider(min_pause_s=8.0)
    s = state(last_periodic_trigger_at=20.0, last_end_at=27.0)
    assert d.decide(30.0, s) == TriggerLater(35.0)
    assert d.decide(35.0, s) == TriggerNow(CheckpointId(1))
    # The pause does not delay a checkpoint that the interval places later anyway.
    assert d.decide(22.0, state(last_periodic_trigger_at=20.0, last_end_at=21.0)) == TriggerLater(30.0)


def test_min_pause_allows_no_concurrent_checkpoint() -> None:
    d = decider(min_pause_s=1.0, max_concurrent=3)
    assert d.decide(100.0, state(in_flight=1)) == Blocked(BlockReason.PAUSE_AFTER_IN_FLIGHT)
    assert d.decide(100.0, state(in_flight=0)) == TriggerNow(CheckpointId(1))


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"interval_s": 0.0}, "checkpointing.interval"),
        ({"interval_s": -1.0}, "checkpointing.interval"),
        ({"interval_s": math.inf}, "checkpointing.interval"),
        ({"interval_s": 1.0, "timeout_s": 0.0}, "checkpointing.timeout"),
        ({"interval_s": 1.0, "min_pause_s": -0.5}, "checkpointing.min-pause"),
        ({"interval_s": 1.0, "max_concurrent": 0}, "checkpointing.max-concurrent"),
    ],
)
def test_config_rejects_bad_values(settings: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        CheckpointConfig(**settings)  # type: ignore[arg-type]
    assert raised.value.key == key
    assert raised.value.fault == "user"
    assert str(raised.value).startswith(key)


def test_counter_is_monotonic() -> None:
    counter = CheckpointIdCounter()
    assert [counter.next()[0] for _ in range(3)] == [1, 2, 3]
    assert counter.peek() == 4


def test_counter_restores_after_an_id_but_never_moves_back() -> None:
    counter = CheckpointIdCounter()
    counter.restore_after(CheckpointId(41))
    assert counter.next()[0] == 42
    counter.restore_after(CheckpointId(10))
    assert counter.next()[0] == 43


def test_counter_starts_at_one_or_later() -> None:
    with pytest.raises(CheckpointProtocolError):
        CheckpointIdCounter(first=0)


def test_counter_reserves_ids_in_blocks_before_handing_them_out() -> None:
    counter = CheckpointIdCounter(reservation_block=3)
    handed = [counter.next() for _ in range(7)]
    assert handed == [
        (1, 3),
        (2, None),
        (3, None),
        (4, 6),
        (5, None),
        (6, None),
        (7, 9),
    ]
    assert counter.reserved_through == 9


def test_a_failed_reservation_is_made_again_by_the_next_id() -> None:
    counter = CheckpointIdCounter(reservation_block=10)
    assert counter.next() == (1, 10)
    counter.reservation_failed(CheckpointId(1))
    assert counter.next() == (2, 11)


def test_ids_are_never_reused_across_a_restart_that_read_back_the_reservation() -> None:
    """A JobManager that dies with ids triggered but not in any metadata: its successor, restored
    from the highest persisted reservation, hands out only ids above every id handed out before."""
    for block in (1, 2, 5, 100):
        first = CheckpointIdCounter(reservation_block=block)
        durable = 0
        handed: list[int] = []
        for _ in range(23):
            checkpoint_id, reserve = first.next()
            if reserve is not None:
                durable = reserve  # persisted before the id is used
            assert checkpoint_id <= durable
            handed.append(checkpoint_id)
        second = CheckpointIdCounter(reservation_block=block)
        second.restore_after(CheckpointId(durable))
        assert second.next()[0] > max(handed)
