"""The control link between a TaskManager and one of its slot workers: typed messages over one
socket pair, calls with replies, and the worker's reports.

The TaskManager calls its worker (deploy, cancel, trigger, notify, collect progress and metrics,
stop); the worker answers each call and, unasked, sends its tasks' reports (states, ends of input,
acknowledgements, declines), which the TaskManager forwards to the JobManager in order. Messages
are pickled by :mod:`multiprocessing.connection`: the link joins two processes of one installation
and lives only as long as they do, so it is no durable format. Protobuf requests travel as their
bytes. The end of the socket is the end of the peer: a worker whose TaskManager is gone exits, a
TaskManager whose worker is gone fails the worker's tasks (``slot_processes``).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final, Literal

from weir.core.errors import JobDefinitionError, ProtocolError, WeirError
from weir.taskmanager.reporter import AckReport, DeclineReport, StateReport

CALL_TIMEOUT_S: Final = 30.0
"""The longest a call waits for its reply by default (a deploy loads the job file first)."""


class SlotWorkerError(WeirError):
    """A slot worker refused a call (``type_name``: the class of the error it raised there, which
    the message starts with), or cannot be reached: it exited, or it did not answer in time.
    Retriable: a fail-over deploys the tasks again, in a new worker when this one is gone."""

    retriable = True

    def __init__(self, message: str, *, type_name: str = "SlotWorkerError") -> None:
        super().__init__(message)
        self.type_name = type_name


class LinkClosedError(SlotWorkerError):
    """The other end of the link is gone."""


# TaskManager -> worker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Deploy:
    request: bytes  # a DeployTaskRequest, its consumer addresses resolved to the workers' (slot_processes)


@dataclass(frozen=True)
class CancelAttempts:
    """Cancel the job's attempts up to ``attempt`` (``through``) or exactly it; the reply comes once
    they ended (or the wait ran out)."""

    job_id: str
    attempt: int
    through: bool
    job_ended: bool = False


@dataclass(frozen=True)
class TriggerCheckpoint:
    request: bytes  # a TriggerCheckpointRequest; the reply: whether the task took it


@dataclass(frozen=True)
class NotifyCheckpoint:
    job_id: str
    attempt: int
    checkpoint_id: int
    complete: bool


@dataclass(frozen=True)
class CollectProgress:
    """The reply: every deploying or running task's TaskProgress, serialized."""


@dataclass(frozen=True)
class CollectMetrics:
    """The reply: the worker's metric families (prometheus_client ``Metric`` values); with ``names``,
    only their samples of these names (a restricted scrape)."""

    names: frozenset[str] | None = None


@dataclass(frozen=True)
class CollectThreadDump:
    """The reply: the worker's threads (``weir.core.thread_dump.ThreadInfo`` values)."""


@dataclass(frozen=True)
class StopWorker:
    """Cancel every task, send what is still being acknowledged, then exit."""


Command = (
    Deploy
    | CancelAttempts
    | TriggerCheckpoint
    | NotifyCheckpoint
    | CollectProgress
    | CollectMetrics
    | CollectThreadDump
    | StopWorker
)


# Worker -> TaskManager ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The worker runs and serves its data plane at ``data_address``."""

    pid: int
    data_address: str


@dataclass(frozen=True)
class Report:
    report: StateReport | AckReport | DeclineReport


# Envelopes ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    call_id: int
    command: Command


@dataclass(frozen=True)
class Reply:
    call_id: int
    value: Any


@dataclass(frozen=True)
class Refusal:
    call_id: int
    type_name: str
    message: str


def refusal_of(call_id: int, exc: BaseException) -> Refusal:
    return Refusal(call_id, type(exc).__name__, str(exc))


def error_of(refusal: Refusal) -> WeirError:
    """The error a refused call raises in the TaskManager: the same class for the ones its servicer
    maps onto a status code (a bad job file stays the user's fault), else :class:`SlotWorkerError`."""
    if refusal.type_name == JobDefinitionError.__name__:
        return JobDefinitionError(refusal.message)
    if refusal.type_name == ProtocolError.__name__:
        return ProtocolError(refusal.message)
    return SlotWorkerError(f"{refusal.type_name}: {refusal.message}", type_name=refusal.type_name)


class ControlLink:
    """One end of the link: :meth:`send` from any thread, :meth:`call` waits for the reply, and one
    thread runs :meth:`serve`, which hands every other message to ``on_message`` and ends (calling
    ``on_closed``) when the other end is gone."""

    def __init__(self, connection: Connection, name: str) -> None:
        self._connection = connection
        self.name = name
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._pending_lock = threading.Lock()
        self._closed: str | None = None
        # The socket's file descriptor is closed once, by the thread that reads it (``serve``), or by
        # ``close`` when no thread reads it: a descriptor closed while another thread still used it
        # (a read, a shutdown through a dup of it) could be reused at once by a new socket of the
        # process, which that thread would then read from or shut down.
        self._fd_lock = threading.Lock()
        self._reader: _Reader = "none"
        self._shut = False
        self._fd_open = True

    def send(self, message: object) -> None:
        """Raises :class:`LinkClosedError` when the other end is gone."""
        if self._closed is not None:
            raise LinkClosedError(f"{self.name}: {self._closed}")
        try:
            with self._send_lock:
                self._connection.send(message)
        except (OSError, EOFError, ValueError) as exc:  # ValueError: the connection was closed here
            raise LinkClosedError(f"{self.name}: the link is closed ({exc})") from exc

    def call_async(self, command: Command) -> Future[Any]:
        """Send ``command``; the future holds its reply, or the error it was refused with."""
        future: Future[Any] = Future()
        call_id = next(self._ids)
        with self._pending_lock:
            if self._closed is not None:
                future.set_exception(LinkClosedError(f"{self.name}: {self._closed}"))
                return future
            self._pending[call_id] = future
        try:
            self.send(Call(call_id, command))
        except LinkClosedError as exc:
            with self._pending_lock:
                self._pending.pop(call_id, None)
            future.set_exception(exc)
        return future

    def call(self, command: Command, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return wait_reply(self.call_async(command), timeout_s, f"{self.name}: {type(command).__name__}")

    def serve(self, on_message: Callable[[object], None], on_closed: Callable[[str], None]) -> None:
        """Read until the other end is gone; replies complete their calls, the rest goes to
        ``on_message`` (on this thread: it must not block on a call of this link)."""
        reason = "the other end closed the link"
        with self._fd_lock:
            reading = self._reader == "none" and self._fd_open
            self._reader = "serving" if reading else "done"
        while reading:
            try:
                message = self._connection.recv()
            except (EOFError, OSError) as exc:
                reason = f"the other end is gone ({type(exc).__name__})"
                break
            match message:
                case Reply(call_id=call_id, value=value):
                    future = self._take(call_id)
                    if future is not None:
                        future.set_result(value)
                case Refusal(call_id=call_id):
                    future = self._take(call_id)
                    if future is not None:
                        future.set_exception(error_of(message))
                case _:
                    on_message(message)
        if not reading:
            reason = f"the link was closed before it was served ({self._closed})"
        self.close(reason)
        with self._fd_lock:
            self._reader = "done"
        self._close_socket()
        on_closed(reason)

    def _take(self, call_id: int) -> Future[Any] | None:
        with self._pending_lock:
            return self._pending.pop(call_id, None)

    def close(self, reason: str) -> None:
        """No call waits any more: each pending one fails with ``reason``."""
        with self._pending_lock:
            if self._closed is None:
                self._closed = reason
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(LinkClosedError(f"{self.name}: {reason}"))
        self._shutdown()
        with self._fd_lock:
            serving = self._reader == "serving"
            if not serving:
                self._reader = "done"  # a serve that starts later reads nothing
        if not serving:  # else the reading thread closes it once its read ended
            self._close_socket()

    def _shutdown(self) -> None:
        """A shutdown, not only a close: it wakes a read blocked on the socket, here and at the peer,
        and a send blocked on a full socket."""
        with self._fd_lock:
            if self._shut or not self._fd_open:
                return
            self._shut = True
            try:
                with socket.socket(fileno=os.dup(self._connection.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (OSError, ValueError):
                pass

    def _close_socket(self) -> None:
        """Close the descriptor, once; never during a send (the send lock) or a shutdown."""
        with self._send_lock, self._fd_lock:
            if not self._fd_open:
                return
            self._fd_open = False
            try:
                self._connection.close()
            except OSError:
                pass

    @property
    def closed(self) -> bool:
        return self._closed is not None


_Reader = Literal["none", "serving", "done"]
"""Whether a thread reads the link's socket: not yet, now (it closes the socket when it ends), or
no more (whoever closes the link closes the socket)."""


def wait_reply(future: Future[Any], timeout_s: float, what: str) -> Any:
    try:
        return future.result(timeout_s)
    except FutureTimeout:
        raise SlotWorkerError(f"{what}: no reply within {timeout_s:g} s") from None
