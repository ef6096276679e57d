"""The pure parts of the REST views: a vertex's aggregate status, backpressure levels, milliseconds."""

from __future__ import annotations

import pytest

from weir.core.states import TaskState
from weir.jobmanager.rest.views import (
    FLINK_EXECUTION_STATES,
    BackpressureLevel,
    backpressure_level,
    execution_state,
    execution_state_counts,
    ms,
    vertex_status,
)

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


def test_a_state_goes_out_as_flink_s_execution_state_never_null() -> None:
    """Flink's client refuses a vertex without an ExecutionState: one not all reported is CREATED."""
    assert [execution_state(vertex_status(s)) for s in ([FINISHED, None], [], [RUNNING])] == [
        "CREATED",
        "CREATED",
        "RUNNING",
    ]
    counts = execution_state_counts([RUNNING, None, RUNNING, FAILED])
    assert list(counts) == list(FLINK_EXECUTION_STATES)  # every state, by Flink's names, no total
    assert {state: n for state, n in counts.items() if n} == {"RUNNING": 2, "CREATED": 1, "FAILED": 1}


@pytest.mark.parametrize(
    ("ratio", "level"),
    [(0.0, BackpressureLevel.OK), (0.1, BackpressureLevel.OK), (0.100001, BackpressureLevel.LOW),
     (0.5, BackpressureLevel.LOW), (0.5000001, BackpressureLevel.HIGH), (1.0, BackpressureLevel.HIGH)],
)  # fmt: skip
def test_backpressure_levels(ratio: float, level: BackpressureLevel) -> None:
    assert backpressure_level(ratio) is level


def test_seconds_become_whole_milliseconds() -> None:
    assert (ms(1764000000.1234), ms(0.0005), ms(0.0)) == (1764000000123, 0, 0)
