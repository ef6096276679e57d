"""The pure parts of the REST views: a vertex's aggregate status, backpressure levels, milliseconds."""

from __future__ import annotations

import pytest

from weir.core.states import TaskState
from weir.jobmanager.rest.views import BackpressureLevel, backpressure_level, ms, vertex_status

DEPLOYING, RUNNING, FINISHED, CANCELED, FAILED = (
    TaskState.DEPLOYING,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.CANCELED,
    TaskState.FAILED,
)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([RUNNING, FAILED, FINISHED], FAILED),
        ([RUNNING, CANCELED], CANCELED),
        ([RUNNING, DEPLOYING, FINISHED], RUNNING),
        ([DEPLOYING, None], DEPLOYING),
        ([FINISHED, FINISHED], FINISHED),
        ([FINISHED, None], None),
        ([None, None], None),
        ([], None),
    ],
)
def test_a_vertex_s_status_is_its_subtasks_aggregated_as_flink_does(
    states: list[TaskState | None], expected: TaskState | None
) -> None:
    assert vertex_status(states) is expected


@pytest.mark.parametrize(
    ("ratio", "level"),
    [(0.0, BackpressureLevel.OK), (0.1, BackpressureLevel.OK), (0.100001, BackpressureLevel.LOW),
     (0.5, BackpressureLevel.LOW), (0.5000001, BackpressureLevel.HIGH), (1.0, BackpressureLevel.HIGH)],
)  # fmt: skip
def test_backpressure_levels(ratio: float, level: BackpressureLevel) -> None:
    assert backpressure_level(ratio) is level


def test_seconds_become_whole_milliseconds() -> None:
    assert (ms(1764000000.1234), ms(0.0005), ms(0.0)) == (1764000000123, 0, 0)
