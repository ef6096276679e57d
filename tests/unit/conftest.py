"""Factory fixtures for the TaskManager unit tests: a RocksDB state backend in a temp dir, operator
contexts, and an Output that collects what an operator emits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.operators.base import OperatorContext, StreamOperator
from weir.taskmanager.state import StateBackend


@dataclass
class CollectingOutput:
    """An operator Output that keeps records and watermarks; ``events`` has both in emission order."""

    records: list[tuple[Any, int | None]] = field(default_factory=list)
    watermarks: list[int] = field(default_factory=list)
    events: list[tuple[str, Any]] = field(default_factory=list)

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.records.append((value, timestamp))
        self.events.append(("record", value))

    def emit_watermark(self, watermark: int) -> None:
        self.watermarks.append(watermark)
        self.events.append(("watermark", watermark))

    @property
    def values(self) -> list[Any]:
        return [v for v, _ in self.records]

    def take(self) -> list[tuple[Any, int | None]]:
        taken, self.records = self.records, []
        return taken


@pytest.fixture
def state_backend(tmp_path: Path) -> Iterator[StateBackend]:
    backend = StateBackend(tmp_path / "rocksdb")
    yield backend
    backend.close()


MakeContext = Callable[..., OperatorContext]


@pytest.fixture
def make_context(state_backend: StateBackend) -> MakeContext:
    """An OperatorContext for subtask ``subtask`` of ``parallelism`` over the test's state backend."""

    def make(
        uid: str = "op", subtask: int = 0, parallelism: int = 1, max_parallelism: int = 128, job_id: str = "job-1"
    ) -> OperatorContext:
        return OperatorContext(
            job_id=job_id,
            job_name="test-job",
            uid=uid,
            subtask=subtask,
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            attempt=1,
            key_group_range=key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(subtask)),
            parameters={},
            state=state_backend,
        )

    return make


StartOperator = Callable[..., CollectingOutput]


@pytest.fixture
def start_operator(make_context: MakeContext) -> StartOperator:
    """Set an operator up as a task does (setup, restore_state, open); returns its collecting output."""

    def start(op: StreamOperator, uid: str = "op", restore: bytes | None = None, **context: Any) -> CollectingOutput:
        output = CollectingOutput()
        op.setup(make_context(uid, **context), output)
        if restore is not None:
            op.restore_state(restore)
        op.open()
        return output

    return start
