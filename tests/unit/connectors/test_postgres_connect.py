"""Opening a PostgreSQL session: retried with back-off while the server is unreachable or starting up
(found by the chaos run: each restart of a job whose PostgreSQL was restarting failed again at once,
four restarts in three seconds), never for a refusal another try cannot change."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from weir.connectors import postgres
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError

ENDPOINTS = Endpoints(postgres_dsn="postgresql://weir:secret@127.0.0.1:1/weir")


class Refused(psycopg.OperationalError):
    """An OperationalError with a chosen SQLSTATE (psycopg's is read-only)."""

    def __init__(self, sqlstate: str | None) -> None:
        self._state = sqlstate
        super().__init__("connection refused" if sqlstate is None else f"refused {sqlstate}")

    @property
    def sqlstate(self) -> str | None:  # type: ignore[override]
        return self._state


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("tenacity.nap.time.sleep", slept.append)
    return slept


def fake_connect(monkeypatch: pytest.MonkeyPatch, failures: list[BaseException]) -> list[str]:
    calls: list[str] = []

    def connect(conninfo: str, **_: Any) -> str:
        calls.append(conninfo)
        if failures:
            raise failures.pop(0)
        return "session"

    monkeypatch.setattr(psycopg, "connect", connect)
    return calls


@pytest.mark.parametrize("state", [None, "57P03", "08006"])
def test_an_unreachable_or_starting_server_is_tried_again_with_back_off(
    monkeypatch: pytest.MonkeyPatch, no_sleep: list[float], state: str | None
) -> None:
    calls = fake_connect(monkeypatch, [Refused(state), Refused(state), Refused(state)])
    assert postgres.connect(ENDPOINTS, retry_for_s=30.0) == "session"
    assert len(calls) == 4
    assert no_sleep == [0.2, 0.4, 0.8]  # exponential, capped at 2 s


def test_without_a_retry_window_one_try_fails_clearly(monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]) -> None:
    calls = fake_connect(monkeypatch, [Refused(None)])
    with pytest.raises(ServiceUnavailableError, match="cannot connect to postgresql://weir@127.0.0.1:1/weir"):
        postgres.connect(ENDPOINTS)
    assert len(calls) == 1 and no_sleep == []


def test_a_refusal_another_try_cannot_change_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]
) -> None:
    calls = fake_connect(monkeypatch, [Refused("28P01")])  # invalid password
    with pytest.raises(ServiceUnavailableError, match="refused 28P01"):
        postgres.connect(ENDPOINTS, retry_for_s=30.0)
    assert len(calls) == 1 and no_sleep == []


def test_the_window_bounds_the_retries(monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]) -> None:
    clock = iter(range(0, 1000, 10))  # every call to the clock advances 10 s
    monkeypatch.setattr("tenacity.time.monotonic", lambda: float(next(clock)))
    calls = fake_connect(monkeypatch, [Refused(None)] * 50)
    with pytest.raises(ServiceUnavailableError):
        postgres.connect(ENDPOINTS, retry_for_s=25.0)
    assert 1 < len(calls) < 50
