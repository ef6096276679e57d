"""Restart strategies and their parsing from job config."""

from __future__ import annotations

import random

import pytest

from weir.core.errors import Fault
from weir.core.failures import Failure
from weir.jobmanager.errors import ConfigError
from weir.jobmanager.restart import (
    ExponentialDelayRestartStrategy,
    FailureRateRestartStrategy,
    FixedDelayRestartStrategy,
    GiveUp,
    NoRestartStrategy,
    RestartAfter,
    parse_duration,
    parse_restart_strategy,
)

CAUSE = Failure("TaskFailure", "boom", Fault.INTERNAL, retriable=True)


class FixedRandom:
    """A random source that always answers the same value."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def delays(strategy: ExponentialDelayRestartStrategy, times: list[float]) -> list[float]:
    out = []
    for now in times:
        decision = strategy.on_failure(now, CAUSE)
        assert isinstance(decision, RestartAfter)
        out.append(decision.delay_s)
    return out


# ---------------------------------------------------------------------------------------------------
# Exponential delay


def test_backoff_grows_by_the_multiplier_up_to_the_cap() -> None:
    s = ExponentialDelayRestartStrategy(1.0, 10.0, multiplier=2.0, jitter_factor=0.0, reset_after_s=1000.0)
    assert delays(s, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert s.restart_count == 7
    assert s.current_backoff_s == 10.0


def test_attempt_numbers_and_counters() -> None:
    s = ExponentialDelayRestartStrategy(2.0, 60.0, jitter_factor=0.0)
    first = s.on_failure(100.0, CAUSE)
    second = s.on_failure(103.0, CAUSE)
    assert first == RestartAfter(2.0, 1)
    assert second == RestartAfter(4.0, 2)
    assert s.last_failure_at == 103.0
    assert s.last_restart_at == 107.0
    stats = s.stats()
    assert (stats.strategy, stats.restart_count, stats.gave_up) == ("exponential-delay", 2, False)


@pytest.mark.parametrize("u", [0.0, 0.25, 0.5, 0.999999])
def test_jitter_stays_within_its_bounds(u: float) -> None:
    s = ExponentialDelayRestartStrategy(4.0, 100.0, multiplier=2.0, jitter_factor=0.5, rng=FixedRandom(u))
    (delay,) = delays(s, [0.0])
    assert 2.0 <= delay <= 6.0
    assert delay == pytest.approx(4.0 + 4.0 * 0.5 * (2 * u - 1))


def test_jitter_with_a_seeded_source_spreads_within_bounds() -> None:
    s = ExponentialDelayRestartStrategy(
        1.0, 8.0, multiplier=2.0, jitter_factor=0.2, reset_after_s=1e9, rng=random.Random(7)
    )
    bases = [1.0, 2.0, 4.0, 8.0] + [8.0] * 40
    got = delays(s, [float(i) for i in range(len(bases))])
    for base, delay in zip(bases, got, strict=True):
        assert base * 0.8 <= delay <= min(base * 1.2, 8.0)
    capped = got[4:]
    assert len(set(capped)) > 10, "jitter varies the delay"
    assert max(capped) <= 8.0, "jitter never exceeds the max backoff"


def test_backoff_and_attempts_reset_after_a_quiet_period() -> None:
    s = ExponentialDelayRestartStrategy(1.0, 60.0, jitter_factor=0.0, reset_after_s=100.0, max_attempts=3)
    assert delays(s, [0.0, 2.0, 5.0]) == [1.0, 2.0, 4.0]  # last restart at 9.0
    assert s.on_failure(108.9, CAUSE) == GiveUp(
        "restarted 3 times without 100s of running free of failures (restart.max-attempts)"
    )

    s = ExponentialDelayRestartStrategy(1.0, 60.0, jitter_factor=0.0, reset_after_s=100.0, max_attempts=3)
    delays(s, [0.0, 2.0, 5.0])
    assert s.on_failure(109.0, CAUSE) == RestartAfter(1.0, 4), "quiet for 100s since the restart at 9.0"
    assert s.restart_count == 4


def test_max_attempts_gives_up_for_good() -> None:
    s = ExponentialDelayRestartStrategy(1.0, 60.0, jitter_factor=0.0, max_attempts=2)
    delays(s, [0.0, 1.0])
    give_up = s.on_failure(2.0, CAUSE)
    assert isinstance(give_up, GiveUp)
    assert s.on_failure(1e6, CAUSE) == give_up, "giving up is final"
    assert s.restart_count == 2
    assert s.stats().gave_up


def test_zero_max_attempts_never_restarts() -> None:
    s = ExponentialDelayRestartStrategy(max_attempts=0)
    assert isinstance(s.on_failure(0.0, CAUSE), GiveUp)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"initial_backoff_s": -1.0}, "restart.initial-backoff"),
        ({"initial_backoff_s": 10.0, "max_backoff_s": 5.0}, "restart.max-backoff"),
        ({"multiplier": 0.5}, "restart.backoff-multiplier"),
        ({"jitter_factor": 1.5}, "restart.jitter-factor"),
        ({"jitter_factor": float("nan")}, "restart.jitter-factor"),
        ({"reset_after_s": 0.0}, "restart.reset-backoff-after"),
        ({"max_attempts": -1}, "restart.max-attempts"),
    ],
)
def test_exponential_rejects_bad_settings(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        ExponentialDelayRestartStrategy(**kwargs)  # type: ignore[arg-type]
    assert raised.value.key == key


# ---------------------------------------------------------------------------------------------------
# Failure rate, fixed delay, none


def test_failure_rate_gives_up_beyond_the_allowed_failures_in_the_window() -> None:
    s = FailureRateRestartStrategy(max_failures=3, interval_s=60.0, delay_s=5.0)
    assert s.on_failure(0.0, CAUSE) == RestartAfter(5.0, 1)
    assert s.on_failure(10.0, CAUSE) == RestartAfter(5.0, 2)
    assert s.on_failure(20.0, CAUSE) == RestartAfter(5.0, 3)
    decision = s.on_failure(59.0, CAUSE)
    assert isinstance(decision, GiveUp)
    assert "4 failures within 60s" in decision.reason


def test_failure_rate_window_slides() -> None:
    s = FailureRateRestartStrategy(max_failures=2, interval_s=60.0, delay_s=1.0)
    assert isinstance(s.on_failure(0.0, CAUSE), RestartAfter)
    assert isinstance(s.on_failure(30.0, CAUSE), RestartAfter)
    assert isinstance(s.on_failure(60.0, CAUSE), RestartAfter), "the failure at 0 left the window"
    assert isinstance(s.on_failure(89.0, CAUSE), GiveUp), "30, 60 and 89 are within 60s"


def test_failure_rate_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="max-failures-per-interval"):
        FailureRateRestartStrategy(0, 60.0, 1.0)
    with pytest.raises(ConfigError, match="failure-rate-interval"):
        FailureRateRestartStrategy(1, 0.0, 1.0)


def test_fixed_delay() -> None:
    s = FixedDelayRestartStrategy(delay_s=3.0, max_attempts=2)
    assert s.on_failure(0.0, CAUSE) == RestartAfter(3.0, 1)
    assert s.on_failure(10.0, CAUSE) == RestartAfter(3.0, 2)
    assert isinstance(s.on_failure(20.0, CAUSE), GiveUp)


def test_no_restart() -> None:
    s = NoRestartStrategy()
    assert s.on_failure(0.0, CAUSE) == GiveUp("the restart strategy is 'none'")
    assert s.restart_count == 0
    assert s.last_failure_at == 0.0


def test_a_non_retriable_cause_gives_up_whatever_the_strategy() -> None:
    s = ExponentialDelayRestartStrategy()
    decision = s.on_failure(0.0, Failure("JobDefinitionError", "bad job", Fault.USER, retriable=False))
    assert decision == GiveUp("the failure is not retriable: bad job")


# ---------------------------------------------------------------------------------------------------
# Parsing


def test_parse_defaults_to_exponential_delay() -> None:
    s = parse_restart_strategy({"checkpointing.interval": "10s"})
    assert isinstance(s, ExponentialDelayRestartStrategy)
    assert (s.initial_backoff_s, s.max_backoff_s, s.multiplier, s.jitter_factor) == (1.0, 60.0, 2.0, 0.1)
    assert s.max_attempts is None


def test_parse_exponential_delay() -> None:
    s = parse_restart_strategy(
        {
            "restart.strategy": "exponential-delay",
            "restart.max-attempts": "10",
            "restart.initial-backoff": "500ms",
            "restart.max-backoff": "2min",
            "restart.backoff-multiplier": "1.5",
            "restart.jitter-factor": 0,
            "restart.reset-backoff-after": "1h",
        },
        rng=FixedRandom(0.5),
    )
    assert isinstance(s, ExponentialDelayRestartStrategy)
    assert (s.initial_backoff_s, s.max_backoff_s, s.multiplier) == (0.5, 120.0, 1.5)
    assert (s.jitter_factor, s.reset_after_s, s.max_attempts) == (0.0, 3600.0, 10)
    assert s.on_failure(0.0, CAUSE) == RestartAfter(0.5, 1)


def test_parse_failure_rate_fixed_delay_and_none() -> None:
    s = parse_restart_strategy(
        {
            "restart.strategy": "Failure-Rate",
            "restart.max-failures-per-interval": 5,
            "restart.failure-rate-interval": "5min",
            "restart.delay": "10s",
        }
    )
    assert isinstance(s, FailureRateRestartStrategy)
    assert (s.max_failures, s.interval_s, s.delay_s) == (5, 300.0, 10.0)
    fixed = parse_restart_strategy({"restart.strategy": "fixed-delay", "restart.max-attempts": "unlimited"})
    assert isinstance(fixed, FixedDelayRestartStrategy) and fixed.max_attempts is None
    assert isinstance(parse_restart_strategy({"restart.strategy": "none"}), NoRestartStrategy)


@pytest.mark.parametrize(
    ("config", "key", "text"),
    [
        ({"restart.strategy": "forever"}, "restart.strategy", "unknown strategy 'forever'"),
        ({"restart.max-attempts": "ten"}, "restart.max-attempts", "whole number, got 'ten'"),
        ({"restart.max-attempts": "-2"}, "restart.max-attempts", "0 or more"),
        ({"restart.max-attempts": True}, "restart.max-attempts", "whole number"),
        ({"restart.initial-backoff": "soon"}, "restart.initial-backoff", "expected a duration"),
        ({"restart.initial-backoff": "5 weeks"}, "restart.initial-backoff", "expected a duration"),
        ({"restart.jitter-factor": "lots"}, "restart.jitter-factor", "expected a number"),
        ({"restart.jitter-factor": "2"}, "restart.jitter-factor", "between 0 and 1"),
        ({"restart.backoff-multipler": "2"}, "restart.backoff-multipler", "unknown setting"),
        ({"restart.delay": "1s"}, "restart.delay", "not used by the 'exponential-delay'"),
        ({"restart.strategy": "none", "restart.max-attempts": "3"}, "restart.max-attempts", "not used"),
    ],
)
def test_parse_errors_name_the_key(config: dict[str, object], key: str, text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_restart_strategy(config)
    assert raised.value.key == key
    assert text in str(raised.value)
    assert raised.value.fault == "user" and not raised.value.retriable


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("250ms", 0.25), ("10s", 10.0), ("10", 10.0), (" 2 min ", 120.0), ("3m", 180.0), ("1.5h", 5400.0), (7, 7.0)],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration("k", value) == seconds


def test_max_delay_bounds_every_strategy_wait() -> None:
    assert parse_restart_strategy({"restart.max-backoff": "30s"}).max_delay_s() == 30.0
    assert parse_restart_strategy({"restart.strategy": "fixed-delay", "restart.delay": "2s"}).max_delay_s() == 2.0
    assert parse_restart_strategy({"restart.strategy": "none"}).max_delay_s() == 0.0
