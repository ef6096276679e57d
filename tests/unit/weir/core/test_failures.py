"""Typed failures: classification of exceptions, and the codec to and from the wire."""

from __future__ import annotations

import pytest

from weir.core.checkpointing import CheckpointingMode
from weir.core.codec import (
    checkpointing_mode_from_proto,
    checkpointing_mode_to_proto,
    failure_from_proto,
    failure_to_proto,
    optional_failure_from_proto,
)
from weir.core.errors import (
    Fault,
    JobDefinitionError,
    NonRetriableError,
    ProtocolError,
    ServiceUnavailableError,
)
from weir.core.failures import MAX_STACKTRACE_CHARS, Failure
from weir.wire import common_pb2, jobmanager_pb2

JOB_FILE = "<job: my_job.py>"


def raise_in_job_code(exc: BaseException) -> BaseException:
    """``exc`` raised by a function compiled as if it were the job's own file."""
    namespace: dict[str, object] = {}
    exec(compile("def job_function(e):\n    raise e\n", JOB_FILE, "exec"), namespace)
    try:
        namespace["job_function"](exc)  # type: ignore[operator]
    except BaseException as raised:  # noqa: BLE001 - handed back to the test
        return raised
    raise AssertionError("the job function did not raise")


def test_a_weir_error_says_its_own_fault_and_retriability() -> None:
    missing = Failure.from_exception(JobDefinitionError("postgres sink: table 'out' does not exist"))
    assert missing == Failure("JobDefinitionError", "postgres sink: table 'out' does not exist", Fault.USER, False)
    down = Failure.from_exception(ServiceUnavailableError("kafka down"))
    assert (down.fault, down.retriable) == (Fault.EXTERNAL, True)
    assert Failure.from_exception(NonRetriableError("bad input")).retriable is False


def test_a_programming_error_in_the_job_code_is_the_users_and_not_retriable() -> None:
    failure = Failure.from_exception(raise_in_job_code(TypeError("unsupported operand")), {JOB_FILE})
    assert failure == Failure("TypeError", "unsupported operand", Fault.USER, False)


def test_another_exception_of_the_job_code_is_the_users_and_restarts_as_in_flink() -> None:
    failure = Failure.from_exception(raise_in_job_code(ValueError("bad record")), {JOB_FILE})
    assert (failure.fault, failure.retriable) == (Fault.USER, True)


def test_an_exception_outside_the_job_code_is_weirs_own_and_retriable() -> None:
    try:
        raise KeyError("internal")
    except KeyError as exc:
        failure = Failure.from_exception(exc, {JOB_FILE})
    assert (failure.fault, failure.retriable) == (Fault.INTERNAL, True)
    assert Failure.from_exception(ConnectionResetError("reset")).fault is Fault.EXTERNAL


@pytest.mark.parametrize(
    "failure",
    [
        Failure("JobDefinitionError", "no table", Fault.USER, False),
        Failure("ServiceUnavailableError", "kafka down", Fault.EXTERNAL, True),
        Failure("", "TaskManager tm-1 lost", Fault.INTERNAL, True),
    ],
)
def test_failures_cross_the_wire_unchanged(failure: Failure) -> None:
    wire = failure_to_proto(failure)
    assert failure_from_proto(common_pb2.Failure.FromString(wire.SerializeToString())) == failure


def test_an_unset_failure_reads_as_none_and_an_unknown_fault_is_refused() -> None:
    assert optional_failure_from_proto(jobmanager_pb2.ReportTaskStateRequest(), "failure") is None
    with pytest.raises(ProtocolError):
        failure_from_proto(common_pb2.Failure(type="X", message="m"))


@pytest.mark.parametrize("text", ["exactly_once", "EXACTLY_ONCE", "exactly-once", " exactly_once", "Exactly-Once "])
def test_every_spelling_of_exactly_once_names_one_mode(text: str) -> None:
    assert CheckpointingMode.parse(text) is CheckpointingMode.EXACTLY_ONCE


def test_modes_cross_the_wire_and_an_unspecified_mode_is_refused() -> None:
    for mode in CheckpointingMode:
        assert checkpointing_mode_from_proto(checkpointing_mode_to_proto(mode)) is mode
    with pytest.raises(ProtocolError, match="without a known checkpointing mode"):
        checkpointing_mode_from_proto(common_pb2.CHECKPOINTING_MODE_UNSPECIFIED)
    assert CheckpointingMode.parse("sometimes") is None


def test_checkpoint_kinds_and_task_states_cross_the_wire_and_unspecified_is_refused() -> None:
    from weir.core.checkpointing import CheckpointKind
    from weir.core.codec import (
        checkpoint_kind_from_proto,
        checkpoint_kind_to_proto,
        task_state_from_proto,
        task_state_to_proto,
    )
    from weir.core.states import TaskState

    for kind in CheckpointKind:
        assert checkpoint_kind_from_proto(checkpoint_kind_to_proto(kind)) is kind
    for state in TaskState:
        assert task_state_from_proto(task_state_to_proto(state)) is state
    with pytest.raises(ProtocolError):
        checkpoint_kind_from_proto(common_pb2.CHECKPOINT_KIND_UNSPECIFIED)
    with pytest.raises(ProtocolError):
        task_state_from_proto(common_pb2.TASK_STATE_UNSPECIFIED)


def test_barrier_alignments_cross_the_wire_and_unspecified_is_refused() -> None:
    from weir.core.checkpointing import BarrierAlignment
    from weir.core.codec import barrier_alignment_from_proto, barrier_alignment_to_proto

    for alignment in BarrierAlignment:
        assert barrier_alignment_from_proto(barrier_alignment_to_proto(alignment)) is alignment
    with pytest.raises(ProtocolError, match="alignment"):
        barrier_alignment_from_proto(common_pb2.BARRIER_ALIGNMENT_UNSPECIFIED)


# Stack traces --------------------------------------------------------------------------------------


def test_a_failure_keeps_the_traceback_naming_the_job_s_file_and_line() -> None:
    failure = Failure.from_exception(raise_in_job_code(ValueError("bad record")), {JOB_FILE})
    assert f'File "{JOB_FILE}", line 2, in job_function' in failure.stacktrace
    assert failure.stacktrace.startswith("Traceback (most recent call last):")
    assert failure.stacktrace.rstrip().endswith("ValueError: bad record")


def test_a_deep_traceback_is_cut_to_its_bound_keeping_its_start_and_the_raising_frames() -> None:
    def ping(depth: int) -> None:  # two functions in turn: Python abridges one frame repeated, not these
        if depth == 0:
            raise raise_in_job_code(ValueError("deep"))
        pong(depth - 1)

    def pong(depth: int) -> None:
        ping(depth - 1)

    try:
        ping(400)
    except ValueError as exc:
        failure = Failure.from_exception(exc, {JOB_FILE})
    assert len(failure.stacktrace) <= MAX_STACKTRACE_CHARS
    assert failure.stacktrace.startswith("Traceback (most recent call last):")
    assert "characters of the traceback left out" in failure.stacktrace
    assert f'File "{JOB_FILE}", line 2, in job_function' in failure.stacktrace
    assert failure.stacktrace.rstrip().endswith("ValueError: deep")


def test_a_failure_weir_decided_on_has_no_traceback() -> None:
    assert Failure.internal("TaskManager tm-1 lost").stacktrace == ""


def test_the_traceback_crosses_the_wire() -> None:
    failure = Failure.from_exception(raise_in_job_code(ValueError("bad record")), {JOB_FILE})
    back = failure_from_proto(common_pb2.Failure.FromString(failure_to_proto(failure).SerializeToString()))
    assert back.stacktrace == failure.stacktrace and JOB_FILE in back.stacktrace
