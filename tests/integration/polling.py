"""Waiting in integration tests: poll a condition with a deadline, never sleep for it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def poll(what: str, deadline_s: float, check: Callable[[], T | None], interval_s: float = 0.5) -> T:
    """``check()`` every ``interval_s`` until it answers something else than None; fail after the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {deadline_s:g} s waiting for {what}")
        time.sleep(interval_s)
