"""A failure as Weir reports it: the error's type, its message, whose fault it is, whether to retry.

One definition for the whole control plane. A task turns the exception that ended it into a
``Failure`` (``Failure.from_exception``), the TaskManager sends it typed (``weir.core.codec``), the
JobManager's restart strategy reads ``retriable``, and ``weir run`` prints ``message``. A failure that
is not retriable fails the job at once instead of restarting it (Flink's suppressed restarts).

A failure raised in a task also carries its traceback, formatted where it was raised (the task's
process is the only one that has the frames) and bounded (``MAX_STACKTRACE_CHARS``): Flink's
``SerializedThrowable`` keeps the stack trace for ``/jobs/:jobid/exceptions`` the same way.
"""

from __future__ import annotations

import traceback
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Final

from weir.core.errors import Fault, WeirError
from weir.core.rejections import UserFunctionError


@dataclass(frozen=True)
class Failure:
    type: str  # the exception's class name, e.g. "JobDefinitionError"
    message: str
    fault: Fault
    retriable: bool
    # The formatted traceback of the exception ("" for a failure Weir decided on, or one read from an
    # older Weir). Diagnostic only: two reports of one failure are the same failure wherever rendered.
    stacktrace: str = field(default="", compare=False)

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
        trace = format_stacktrace(exc)
        if isinstance(exc, UserFunctionError):
            cause = exc.__cause__
            if isinstance(cause, WeirError):
                retriable = cause.retriable
            else:
                retriable = not isinstance(cause, PROGRAMMING_ERRORS)
            return cls(exc.rejected.error_type, message, Fault.USER, retriable, trace)
        if isinstance(exc, WeirError):
            return cls(type_name, message, exc.fault, exc.retriable, trace)
        if isinstance(exc, OSError):
            return cls(type_name, message, Fault.EXTERNAL, True, trace)
        if user_code_files and _raised_through(exc, user_code_files):
            return cls(type_name, message, Fault.USER, not isinstance(exc, PROGRAMMING_ERRORS), trace)
        return cls(type_name, message, Fault.INTERNAL, True, trace)


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


MAX_STACKTRACE_CHARS: Final = 16_384
"""The longest traceback a failure carries: it crosses gRPC in every FAILED report and is kept 100 times
in the job record (docs/formats.md), so a deep recursion must not make either large."""
_CUT_NOTE: Final = "\n  ... {} characters of the traceback left out ...\n"


def format_stacktrace(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, its chained causes included (a ``UserFunctionError``
    names the user function's frame in its cause). Beyond ``MAX_STACKTRACE_CHARS`` the middle goes: the
    start says where the task was, the end where the exception was raised and what it was."""
    text = "".join(traceback.format_exception(exc))
    if len(text) <= MAX_STACKTRACE_CHARS:
        return text
    note = _CUT_NOTE.format(len(text))  # an upper bound on the characters left out, for the note's length
    keep = MAX_STACKTRACE_CHARS - len(note)
    head = keep // 4
    tail = keep - head
    return text[:head] + _CUT_NOTE.format(len(text) - head - tail) + text[-tail:]


def _raised_through(exc: BaseException, files: Collection[str]) -> bool:
    return any(frame.filename in files for frame in traceback.extract_tb(exc.__traceback__))
