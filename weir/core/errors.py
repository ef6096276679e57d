"""Weir's exceptions: one base class; each error says whose fault it is and whether a retry can help."""

from __future__ import annotations

import enum
from typing import Any, ClassVar


class Fault(enum.StrEnum):
    """Who must act on an error: the job's author, an external system, or Weir itself."""

    USER = "user"
    EXTERNAL = "external"
    INTERNAL = "internal"


class WeirError(Exception):
    """Base class of every error Weir raises on purpose.

    ``fault`` names who must act: the job's author (``user``), an external system such as Kafka or S3
    (``external``), or Weir itself (``internal``). ``retriable`` says whether the same call may succeed
    later. A raise site may override ``fault`` for one instance when the class default does not fit.
    """

    retriable: ClassVar[bool] = False
    fault: Fault = Fault.INTERNAL

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.fault = Fault(cls.fault)  # a subclass may name its fault as the plain string

    def __init__(self, message: str, *, fault: Fault | str | None = None) -> None:
        super().__init__(message)
        if fault is not None:
            self.fault = Fault(fault)


class SerializationError(WeirError):
    """Bytes could not be produced from a value or a value could not be read back from bytes."""

    fault: Fault = Fault.INTERNAL


class ProtocolError(WeirError):
    """A peer broke the data-plane protocol, e.g. sent a buffer without holding a credit."""

    fault: Fault = Fault.INTERNAL


class JobDefinitionError(WeirError):
    """The job as written cannot run: invalid graph, parallelism, key type, window size..."""

    fault: Fault = Fault.USER


class ServiceUnavailableError(WeirError):
    """An external service (Kafka, PostgreSQL, S3, a TaskManager) did not answer; try again later."""

    fault: Fault = Fault.EXTERNAL
    retriable: ClassVar[bool] = True


class AuthenticationError(WeirError):
    """A Weir service refused the caller's bearer token (none, or not the cluster's): set
    ``WEIR_AUTH_TOKEN`` or ``WEIR_AUTH_TOKEN_FILE`` as the cluster's."""

    fault: Fault = Fault.USER


class PermissionDeniedError(WeirError):
    """A token of the cluster's, without the role the call needs (docs/security.md, "Roles")."""

    fault: Fault = Fault.USER


class StorageAuthenticationError(WeirError):
    """An object read back from checkpoint storage without this cluster's MAC (tampered, truncated,
    foreign or unsealed): refused before it is decoded; the storage's content is at fault, and reading
    it again answers the same."""

    fault: Fault = Fault.EXTERNAL
    retriable: ClassVar[bool] = False


class ClusterUnavailableError(WeirError):
    """No JobManager answers at the configured address, or no local cluster runs; start it and retry."""

    fault: Fault = Fault.EXTERNAL
    retriable: ClassVar[bool] = True


class UnknownJobError(WeirError):
    """The JobManager knows no job with this id; ``weir list`` shows the known ones."""

    fault: Fault = Fault.USER

    def __init__(self, job_id: str) -> None:
        super().__init__(f"unknown job {job_id}")
        self.job_id = job_id


class UnknownCheckpointError(WeirError):
    """The job has no checkpoint with this id in the JobManager's recent history or among its retained
    checkpoints; ``weir checkpoints JOB_ID`` lists them."""

    fault: Fault = Fault.USER

    def __init__(self, job_id: str, checkpoint_id: int) -> None:
        super().__init__(
            f"job {job_id} has no checkpoint {checkpoint_id} (`weir checkpoints {job_id}` lists the recent and "
            "the retained ones)"
        )
        self.job_id = job_id
        self.checkpoint_id = checkpoint_id


class NotEnoughSlotsError(WeirError):
    """The cluster has fewer free task slots than the job needs: lower the parallelism or wait."""

    fault: Fault = Fault.EXTERNAL
    retriable: ClassVar[bool] = True


class JobManagerRequestError(WeirError):
    """The JobManager refused or failed a request for a reason no narrower error names."""

    fault: Fault = Fault.INTERNAL

    def __init__(self, message: str, *, code: str, fault: Fault | str | None = None) -> None:
        super().__init__(message, fault=fault)
        self.code = code


class CommandLineError(WeirError):
    """A command-line argument is malformed, e.g. ``-D`` without ``key=value``."""

    fault: Fault = Fault.USER


class ConfigurationError(WeirError):
    """A ``WEIR_*`` variable holds a value Weir cannot use; the message names it and why: fix it, restart."""

    fault: Fault = Fault.USER


class ClusterError(WeirError):
    """The local cluster could not be started, stopped or inspected; the message names the logs to read."""

    fault: Fault = Fault.INTERNAL


class UnknownProcessError(ClusterError):
    """``weir cluster kill`` named a process the local cluster does not run."""

    fault: Fault = Fault.USER


class NonRetriableError(WeirError):
    """Raised by a job's own code to fail the job at once, without restarts (Flink's
    ``SuppressRestartsException``): the input or the job is wrong and a restart would fail the same way."""

    fault: Fault = Fault.USER
