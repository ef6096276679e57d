"""The JobManager's exceptions: one base class, each saying whose fault it is and whether to retry."""

from __future__ import annotations

from typing import ClassVar

from weir.core.errors import Fault, WeirError

__all__ = [
    "CheckpointProtocolError",
    "ConfigError",
    "Fault",
    "JobManagerError",
    "JobManagerNotReadyError",
    "JobNotCreatedError",
    "SavepointDisposalError",
    "CheckpointRejectedError",
    "SavepointRejectedError",
    "RescaleRejectedError",
    "UnknownRescaleError",
    "TaskManagerCallError",
    "UnknownVertexError",
]


class JobManagerError(WeirError):
    """Base of every error the JobManager raises on purpose.

    ``retriable`` and ``fault`` (``"user"``, ``"external"`` or ``"internal"``) come from ``WeirError``;
    ``grpc_code`` is the status name a servicer answers with.
    """

    grpc_code: ClassVar[str] = "INTERNAL"


class ConfigError(JobManagerError):
    """A configuration value is missing, malformed or out of range. Fix the value and resubmit."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class SavepointRejectedError(JobManagerError):
    """A savepoint cannot start now (job not running, another savepoint in progress). Try again later."""

    fault: Fault = Fault.USER
    retriable: ClassVar[bool] = True
    grpc_code: ClassVar[str] = "FAILED_PRECONDITION"


class RescaleRejectedError(JobManagerError):
    """A rescale (``weir rescale``) is refused before it touches the job: not running, a rescale or a
    stop already under way, the parallelism out of range, not enough slots. The user's; retriable."""

    fault: Fault = Fault.USER
    retriable: ClassVar[bool] = True
    grpc_code: ClassVar[str] = "FAILED_PRECONDITION"


class ResourceRequirementsError(JobManagerError):
    """Resource requirements (Flink's ``PUT /jobs/:jobid/resource-requirements``) that Flink's own
    validation refuses: an unknown or missing vertex, a bound below 1, a lower bound above the upper, an
    upper bound above the max parallelism. Each problem is one line (``problems``); nothing changes."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class UnknownRescaleError(JobManagerError):
    """No rescale of the job has that trigger id (this JobManager keeps the latest ones it ran)."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "NOT_FOUND"


class SavepointDisposalError(JobManagerError):
    """A path given to dispose of is no savepoint (none there, or a checkpoint's); nothing is deleted."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"


class CheckpointRejectedError(JobManagerError):
    """A checkpoint on request (``weir checkpoint``) cannot start now (job not running, another
    checkpoint in flight) or not at all (a full one). The user's; retriable when it is about now."""

    fault: Fault = Fault.USER
    retriable: ClassVar[bool] = True
    grpc_code: ClassVar[str] = "FAILED_PRECONDITION"


class UnknownVertexError(JobManagerError):
    """The job has no vertex (chain of operators) of this id; its plan lists them."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "NOT_FOUND"

    def __init__(self, job_id: str, vertex_uid: str) -> None:
        super().__init__(f"job {job_id} has no vertex {vertex_uid!r} (its plan lists the vertices)")
        self.job_id = job_id
        self.vertex_uid = vertex_uid


class MetricsQueryError(JobManagerError):
    """A metrics query Flink would refuse too: an unknown aggregation (``agg=``), a malformed subtask
    range (``subtasks=``). Answered 400, nothing read."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"


class UnknownJarError(JobManagerError):
    """No uploaded artifact has this id (``GET /jars`` lists them; the oldest go beyond the last 20)."""

    fault: Fault = Fault.USER
    grpc_code: ClassVar[str] = "NOT_FOUND"

    def __init__(self, jar_id: str) -> None:
        super().__init__(
            f"no uploaded artifact {jar_id!r} (GET /jars lists them; upload it again with POST /jars/upload)"
        )
        self.jar_id = jar_id


class JobManagerNotReadyError(JobManagerError):
    """The JobManager is still taking over its jobs from checkpoint storage, or stopping; try again."""

    fault: Fault = Fault.INTERNAL
    retriable: ClassVar[bool] = True
    grpc_code: ClassVar[str] = "UNAVAILABLE"


class JobNotCreatedError(JobManagerNotReadyError):
    """A submission to a JobManager that stopped leading before the job index named the job: the job
    does not exist (its record was withdrawn); submit it again, to the new leader."""


class CheckpointProtocolError(JobManagerError):
    """The I/O layer or a task broke the checkpoint protocol (e.g. a state handle for another task)."""

    fault: Fault = Fault.INTERNAL


class TaskManagerCallError(JobManagerError):
    """A call to a TaskManager failed (``code`` is the gRPC status name). ``unavailable``: the
    TaskManager is gone or unreachable, so the JobManager places the job on the others."""

    fault: Fault = Fault.INTERNAL
    retriable: ClassVar[bool] = True

    def __init__(self, address: str, code: str, details: str) -> None:
        super().__init__(f"TaskManager at {address}: {code}: {details}")
        self.address = address
        self.code = code
        self.details = details

    @property
    def unavailable(self) -> bool:
        return self.code == "UNAVAILABLE"
