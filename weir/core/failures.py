"""A failure as Weir reports it: the error's type, its message, whose fault it is, whether to retry.

One definition for the whole control plane. A task turns the exception that ended it into a
``Failure`` (``Failure.from_exception``), the TaskManager sends it typed (``weir.core.codec``), the
JobManager's restart strategy reads ``retriable``, and ``weir run`` prints ``message``. A failure that
is not retriable fails the job at once instead of restarting it (Flink's suppressed restarts).
"""

from __future__ import annotations

import traceback
from collections.abc import Collection
from dataclasses import dataclass

from weir.core.errors import Fault, WeirError
from weir.core.rejections import UserFunctionError


@dataclass(frozen=True)
class Failure:
    type: str  # the exception's class name, e.g. "JobDefinitionError"
    message: str
    fault: Fault
    retriable: bool

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.type else self.message

    @classmethod
    def internal(cls, message: str, *, retriable: bool = True, type_name: str = "") -> Failure:
        """A failure Weir itself decided on (a lost TaskManager, a task cancelled under a running job)."""
        return cls(type_name, message, Fault.INTERNAL, retriable)

    @classmethod
    def from_exception(cls, exc: BaseException, user_code_files: Collection[str] = ()) -> Failure:
        """Classify ``exc``:

        - a ``UserFunctionError`` (a user function raised on a record) keeps its cause's type, is the
          user's, and is retriable unless the cause is a programming error or a ``WeirError`` that is not;
        - a ``WeirError`` says itself whose fault it is and whether a retry can help;
        - an ``OSError`` (a connection refused or reset, a timeout) is an external system's, retriable;
        - any other exception raised in or through the job's own code (a frame of one of
          ``user_code_files`` in its traceback) is the user's. A programming error there (a
          ``TypeError``, ``AttributeError``, ``NameError``...: a bad job function) fails the same way
          after every restart, so it is not retriable; any other exception of the job's code may be
          transient and restarts as Flink would (the job raises ``NonRetriableError`` to say otherwise);
        - anything else is Weir's own, retriable.
        """
        type_name = type(exc).__name__
        message = str(exc) or type_name
        if isinstance(exc, UserFunctionError):
            cause = exc.__cause__
            if isinstance(cause, WeirError):
                retriable = cause.retriable
            else:
                retriable = not isinstance(cause, PROGRAMMING_ERRORS)
            return cls(exc.rejected.error_type, message, Fault.USER, retriable)
        if isinstance(exc, WeirError):
            return cls(type_name, message, exc.fault, exc.retriable)
        if isinstance(exc, OSError):
            return cls(type_name, message, Fault.EXTERNAL, True)
        if user_code_files and _raised_through(exc, user_code_files):
            return cls(type_name, message, Fault.USER, not isinstance(exc, PROGRAMMING_ERRORS))
        return cls(type_name, message, Fault.INTERNAL, True)


PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    ImportError,
    SyntaxError,
    NotImplementedError,
    RecursionError,
)
"""Exceptions that say the job's code is wrong, not its input or its surroundings."""


def _raised_through(exc: BaseException, files: Collection[str]) -> bool:
    return any(frame.filename in files for frame in traceback.extract_tb(exc.__traceback__))
