"""Waiting in integration tests: poll a condition with a deadline, never sleep for it.

One loop (:func:`settle`) and the two waits built on it: :func:`poll` (until an answer, not None)
and :func:`until` (until a truthy answer), which fail the test at the deadline naming what they
waited for. A test that asserts on the last answer itself (a multiset against the expected one, a
status with its failure) takes :func:`settle`'s answer, which it gives back at the deadline too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def settle(deadline_s: float, check: Callable[[], T], done: Callable[[T], bool], interval_s: float = 0.2) -> T:
    """``check()`` every ``interval_s`` until ``done`` holds for its answer, and that answer; after
    ``deadline_s`` the last answer (for the caller's assert to show what it is)."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = check()
        if done(result) or time.monotonic() >= deadline:
            return result
        time.sleep(interval_s)


def _wait(what: str, deadline_s: float, check: Callable[[], T], done: Callable[[T], bool], interval_s: float) -> T:
    result = settle(deadline_s, check, done, interval_s)
    if not done(result):
        last = "" if result is None else f"; last answer: {result!r}"
        pytest.fail(f"timed out after {deadline_s:g} s waiting for {what}{last}")
    return result


def poll(what: str, deadline_s: float, check: Callable[[], T | None], interval_s: float = 0.5) -> T:
    """``check()`` every ``interval_s`` until it answers something else than None; fail after the deadline."""
    result = _wait(what, deadline_s, check, lambda r: r is not None, interval_s)
    assert result is not None
    return result


def until(what: str, deadline_s: float, check: Callable[[], T], interval_s: float = 0.2) -> T:
    """``check()`` every ``interval_s`` until its answer is truthy, and that answer; fail after the
    deadline, naming the last answer."""
    return _wait(what, deadline_s, check, bool, interval_s)
