"""The Nexmark loader's records and production, against a fake producer (no broker)."""

from __future__ import annotations

from typing import Any

import pytest

from weir import nexmark as nx
from weir.core.errors import ServiceUnavailableError
from weir.tools import nexmark_load
from weir.tools.nexmark_load import NexmarkRecord


class FakeProducer:
    def __init__(self, full_every: int = 0, fail: bool = False) -> None:
        self.produced: list[tuple[str, NexmarkRecord]] = []
        self._pending: list[Any] = []
        self._full_every = full_every
        self._calls = 0
        self._fail = fail

    def produce(self, topic: str, *, value: bytes, key: bytes, partition: int, on_delivery: Any) -> None:
        self._calls += 1
        if self._full_every and self._calls % self._full_every == 0:
            raise BufferError("queue full")
        self.produced.append((topic, NexmarkRecord(partition, key, value)))
        self._pending.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        for callback in self._pending:
            callback("broker down" if self._fail else None, None)
        self._pending.clear()
        return 0


def test_records_are_round_robin_keyed_by_event_number() -> None:
    out = list(nexmark_load.records(3, 5, 4, nx.DEFAULT_CONFIG))
    assert [(r.partition, r.key) for r in out] == [(3, b"3"), (0, b"4"), (1, b"5"), (2, b"6"), (3, b"7")]
    assert [r.value for r in out] == [nx.event_json(n) for n in range(3, 8)]
    with pytest.raises(ValueError):
        list(nexmark_load.records(0, 1, 0, nx.DEFAULT_CONFIG))


def test_load_produces_every_event_once_despite_a_full_queue() -> None:
    producer = FakeProducer(full_every=7)
    progress: list[int] = []
    written = nexmark_load.load(producer, "nexmark", 3, 100, on_progress=progress.append, progress_every=40)
    assert written == 100 and progress == [40, 80]
    assert [r for _t, r in producer.produced] == list(nexmark_load.records(0, 100, 3, nx.DEFAULT_CONFIG))
    assert {t for t, _r in producer.produced} == {"nexmark"}


def test_load_fails_when_events_are_not_delivered() -> None:
    with pytest.raises(ServiceUnavailableError, match="not delivered to nexmark"):
        nexmark_load.load(FakeProducer(fail=True), "nexmark", 1, 3)
