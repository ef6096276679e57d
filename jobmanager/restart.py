"""Restart strategies: after a job failure, restart after some delay or give up.

Strategies are pure objects: the time comes in as ``now`` and randomness (jitter) from an injected
source. ``on_failure`` answers ``RestartAfter(delay_s, attempt)`` or ``GiveUp(reason)`` and keeps the
counters the status API and the metrics show. ``parse_restart_strategy`` builds one from job config.
"""

from __future__ import annotations

import abc
import math
import random
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from weir.core.failures import Failure
from weir.jobmanager.errors import ConfigError


class RandomSource(Protocol):
    def random(self) -> float:
        """A float in [0, 1)."""
        ...


@dataclass(frozen=True)
class RestartAfter:
    delay_s: float
    attempt: int  # 1 for the job's first restart


@dataclass(frozen=True)
class GiveUp:
    reason: str


RestartDecision = RestartAfter | GiveUp


@dataclass(frozen=True)
class RestartStats:
    strategy: str
    restart_count: int
    last_failure_at: float | None
    last_restart_at: float | None  # when the latest restart was scheduled to happen
    gave_up: bool


class RestartStrategy(abc.ABC):
    """Common bookkeeping; subclasses decide in ``_decide``. Giving up is final."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._restart_count = 0
        self._last_failure_at: float | None = None
        self._last_restart_at: float | None = None
        self._gave_up: GiveUp | None = None

    @property
    def restart_count(self) -> int:
        return self._restart_count

    @property
    def last_failure_at(self) -> float | None:
        return self._last_failure_at

    @property
    def last_restart_at(self) -> float | None:
        return self._last_restart_at

    def max_delay_s(self) -> float:
        """The longest wait before a restart this strategy can choose (sizes sink transaction timeouts)."""
        for attribute in ("max_backoff_s", "delay_s"):
            value = getattr(self, attribute, None)
            if value is not None:
                return float(value)
        return 0.0

    def stats(self) -> RestartStats:
        return RestartStats(
            self.name, self._restart_count, self._last_failure_at, self._last_restart_at, self._gave_up is not None
        )

    def on_failure(self, now: float, cause: Failure) -> RestartDecision:
        """Decide what to do about one failure of the job at ``now``."""
        if self._gave_up is not None:
            return self._gave_up
        if not cause.retriable:
            decision: RestartDecision = GiveUp(f"the failure is not retriable: {cause.message}")
        else:
            decision = self._decide(now)
        self._last_failure_at = now
        if isinstance(decision, GiveUp):
            self._gave_up = decision
        else:
            self._restart_count += 1
            self._last_restart_at = now + decision.delay_s
        return decision

    def _attempt(self) -> int:
        return self._restart_count + 1

    @abc.abstractmethod
    def _decide(self, now: float) -> RestartDecision: ...


class NoRestartStrategy(RestartStrategy):
    name: ClassVar[str] = "none"

    def _decide(self, now: float) -> RestartDecision:
        return GiveUp("the restart strategy is 'none'")


class FixedDelayRestartStrategy(RestartStrategy):
    """Restart after a constant delay, at most ``max_attempts`` times (``None``: no limit)."""

    name: ClassVar[str] = "fixed-delay"

    def __init__(self, delay_s: float, max_attempts: int | None = None) -> None:
        super().__init__()
        _check_duration("restart.delay", delay_s)
        _check_attempts(max_attempts)
        self.delay_s = delay_s
        self.max_attempts = max_attempts

    def _decide(self, now: float) -> RestartDecision:
        if self.max_attempts is not None and self._restart_count >= self.max_attempts:
            return GiveUp(f"restarted {self._restart_count} times, the maximum (restart.max-attempts)")
        return RestartAfter(self.delay_s, self._attempt())


class ExponentialDelayRestartStrategy(RestartStrategy):
    """Backoff that grows by ``multiplier`` up to ``max_backoff_s``, with jitter.

    After ``reset_after_s`` without a failure (measured from the last restart) the backoff and the
    attempt count start over. ``max_attempts`` bounds the restarts between two such resets.
    """

    name: ClassVar[str] = "exponential-delay"

    def __init__(
        self,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        multiplier: float = 2.0,
        jitter_factor: float = 0.1,
        reset_after_s: float = 3600.0,
        max_attempts: int | None = None,
        rng: RandomSource | None = None,
    ) -> None:
        super().__init__()
        _check_duration("restart.initial-backoff", initial_backoff_s)
        _check_duration("restart.max-backoff", max_backoff_s)
        if max_backoff_s < initial_backoff_s:
            raise ConfigError(
                "restart.max-backoff",
                f"{max_backoff_s:g}s is below restart.initial-backoff {initial_backoff_s:g}s",
            )
        if not (math.isfinite(multiplier) and multiplier >= 1.0):
            raise ConfigError("restart.backoff-multiplier", f"must be a number >= 1, got {multiplier}")
        if not (0.0 <= jitter_factor <= 1.0):
            raise ConfigError("restart.jitter-factor", f"must be between 0 and 1, got {jitter_factor}")
        _check_duration("restart.reset-backoff-after", reset_after_s, allow_zero=False)
        _check_attempts(max_attempts)
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.multiplier = multiplier
        self.jitter_factor = jitter_factor
        self.reset_after_s = reset_after_s
        self.max_attempts = max_attempts
        self._rng: RandomSource = rng if rng is not None else random.Random()
        self._backoff_s = initial_backoff_s
        self._attempts_since_reset = 0

    @property
    def current_backoff_s(self) -> float:
        """The backoff the next restart gets before jitter."""
        return self._backoff_s

    def _decide(self, now: float) -> RestartDecision:
        if self._last_restart_at is not None and now - self._last_restart_at >= self.reset_after_s:
            self._backoff_s = self.initial_backoff_s
            self._attempts_since_reset = 0
        if self.max_attempts is not None and self._attempts_since_reset >= self.max_attempts:
            return GiveUp(
                f"restarted {self._attempts_since_reset} times without {self.reset_after_s:g}s of running "
                f"free of failures (restart.max-attempts)"
            )
        base = self._backoff_s
        jitter = base * self.jitter_factor * (2.0 * self._rng.random() - 1.0)
        delay = min(max(base + jitter, 0.0), self.max_backoff_s)
        self._backoff_s = min(base * self.multiplier, self.max_backoff_s)
        self._attempts_since_reset += 1
        return RestartAfter(delay, self._attempt())


class FailureRateRestartStrategy(RestartStrategy):
    """Restart after ``delay_s`` unless more than ``max_failures`` failures fell within ``interval_s``."""

    name: ClassVar[str] = "failure-rate"

    def __init__(self, max_failures: int, interval_s: float, delay_s: float) -> None:
        super().__init__()
        if max_failures < 1:
            raise ConfigError("restart.max-failures-per-interval", f"must be at least 1, got {max_failures}")
        _check_duration("restart.failure-rate-interval", interval_s, allow_zero=False)
        _check_duration("restart.delay", delay_s)
        self.max_failures = max_failures
        self.interval_s = interval_s
        self.delay_s = delay_s
        self._failures: deque[float] = deque()

    def _decide(self, now: float) -> RestartDecision:
        while self._failures and self._failures[0] <= now - self.interval_s:
            self._failures.popleft()
        self._failures.append(now)
        if len(self._failures) > self.max_failures:
            return GiveUp(
                f"{len(self._failures)} failures within {self.interval_s:g}s, more than the "
                f"{self.max_failures} allowed (restart.max-failures-per-interval)"
            )
        return RestartAfter(self.delay_s, self._attempt())


# ---------------------------------------------------------------------------------------------------
# Parsing from job config


def _check_duration(key: str, value: float, *, allow_zero: bool = True) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise ConfigError(key, f"must be a duration of {bound} seconds, got {value}")


def _check_attempts(max_attempts: int | None) -> None:
    if max_attempts is not None and max_attempts < 0:
        raise ConfigError("restart.max-attempts", f"must be 0 or more, got {max_attempts}")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(key: str, value: object) -> float:
    """Seconds from a number (seconds) or text such as ``"500ms"``, ``"10s"``, ``"2min"``, ``"1h"``."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration such as '10s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ConfigError(key, f"expected a duration such as '500ms', '10s', '2min' or '1h', got {value!r}")
    if not math.isfinite(seconds):
        raise ConfigError(key, f"expected a finite duration, got {value!r}")
    return seconds


def _parse_int(key: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise ConfigError(key, f"expected a whole number, got {value!r}")


def _parse_float(key: str, value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(key, f"expected a number, got {value!r}")


def _parse_max_attempts(key: str, value: object) -> int | None:
    if isinstance(value, str) and value.strip().lower() == "unlimited":
        return None
    return _parse_int(key, value)


_T = TypeVar("_T")

_STRATEGY_KEY = "restart.strategy"
_KEYS_BY_STRATEGY: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "fixed-delay": frozenset({"restart.delay", "restart.max-attempts"}),
    "exponential-delay": frozenset(
        {
            "restart.initial-backoff",
            "restart.max-backoff",
            "restart.backoff-multiplier",
            "restart.jitter-factor",
            "restart.reset-backoff-after",
            "restart.max-attempts",
        }
    ),
    "failure-rate": frozenset({"restart.max-failures-per-interval", "restart.failure-rate-interval", "restart.delay"}),
}
_ALL_KEYS = frozenset({_STRATEGY_KEY}).union(*_KEYS_BY_STRATEGY.values())


def parse_restart_strategy(config: Mapping[str, object], *, rng: RandomSource | None = None) -> RestartStrategy:
    """Build the strategy named by ``restart.strategy`` (default ``exponential-delay``).

    Only ``restart.*`` keys are read; an unknown one, or one the chosen strategy does not use, is a
    ``ConfigError`` so that a misspelt setting does not pass silently.
    """
    settings = {k: v for k, v in config.items() if k.startswith("restart.")}
    raw_name = settings.get(_STRATEGY_KEY, "exponential-delay")
    name = str(raw_name).strip().lower()
    if name not in _KEYS_BY_STRATEGY:
        raise ConfigError(
            _STRATEGY_KEY, f"unknown strategy {raw_name!r}; use one of {', '.join(sorted(_KEYS_BY_STRATEGY))}"
        )
    for key in sorted(settings):
        if key not in _ALL_KEYS:
            raise ConfigError(key, f"unknown setting; the restart settings are {', '.join(sorted(_ALL_KEYS))}")
        if key != _STRATEGY_KEY and key not in _KEYS_BY_STRATEGY[name]:
            raise ConfigError(key, f"is not used by the {name!r} restart strategy")

    def get(key: str, parse: Callable[[str, object], _T], default: _T) -> _T:
        return parse(key, settings[key]) if key in settings else default

    if name == "none":
        return NoRestartStrategy()
    if name == "fixed-delay":
        return FixedDelayRestartStrategy(
            delay_s=get("restart.delay", parse_duration, 10.0),
            max_attempts=get("restart.max-attempts", _parse_max_attempts, None),
        )
    if name == "failure-rate":
        return FailureRateRestartStrategy(
            max_failures=get("restart.max-failures-per-interval", _parse_int, 3),
            interval_s=get("restart.failure-rate-interval", parse_duration, 300.0),
            delay_s=get("restart.delay", parse_duration, 10.0),
        )
    return ExponentialDelayRestartStrategy(
        initial_backoff_s=get("restart.initial-backoff", parse_duration, 1.0),
        max_backoff_s=get("restart.max-backoff", parse_duration, 60.0),
        multiplier=get("restart.backoff-multiplier", _parse_float, 2.0),
        jitter_factor=get("restart.jitter-factor", _parse_float, 0.1),
        reset_after_s=get("restart.reset-backoff-after", parse_duration, 3600.0),
        max_attempts=get("restart.max-attempts", _parse_max_attempts, None),
        rng=rng,
    )
