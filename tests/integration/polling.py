"""Waiting in integration tests: poll a condition with a deadline, never sleep for it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def _wait(what: str, deadline_s: float, check: Callable[[], T], done: Callable[[T], bool], interval_s: float) -> T:
    deadline = time.monotonic() + deadline_s
    while True:
        result = check()
        if done(result):
            return result
        if time.monotonic() >= deadline:
            last = "" if result is None else f"; last answer: {result!r}"
            pytest.fail(f"timed out after {deadline_s:g} s waiting for {what}{last}")
        time.sleep(interval_s)


def poll(what: str, deadline_s: float, check: Callable[[], T | None], interval_s: float = 0.5) -> T:
    """``check()`` every ``interval_s`` until it answers something else than None; fail after the deadline."""
    result = _wait(what, deadline_s, check, lambda r: r is not None, interval_s)
    assert result is not None
    return result


def until(what: str, deadline_s: float, check: Callable[[], T], interval_s: float = 0.2) -> T:
    """``check()`` every ``interval_s`` until its answer is truthy, and that answer; fail after the
    deadline, naming the last answer."""
    return _wait(what, deadline_s, check, bool, interval_s)
