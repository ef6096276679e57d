"""``python -m weir.taskmanager.slot_worker``: one slot of a TaskManager, in a process of its own.

Started by its TaskManager (``slot_processes``), never by hand. It runs a
:class:`~weir.taskmanager.task_host.TaskHost` for the tasks of one job slot, serves their input
gates on a Unix socket (the data plane of producers in other workers, and of the TaskManager relaying
remote producers), and answers its TaskManager's calls on the control link given as a file
descriptor (``slot_link``); its tasks' reports go back on that link.

It never outlives its TaskManager: PR_SET_PDEATHSIG makes the kernel kill it when the TaskManager's
thread that started it ends (the TaskManager starts every worker from one thread that lives as long
as it does), and the end of the control link makes it exit too (the TaskManager gone on a system
without that signal, or the link closed on purpose).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, Final, assert_never

import grpc
import structlog
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

from weir.connectors.object_storage import open_storage
from weir.core import logs
from weir.core.config import checkpoint_dir, run_dir
from weir.core.grpc_security import new_server
from weir.core.thread_dump import thread_dump
from weir.core.transport_security import TransportSecurity
from weir.taskmanager.reporter import AckReport, DeclineReport, StateReport
from weir.taskmanager.slot_link import (
    Call,
    CancelAttempts,
    CollectMetrics,
    CollectProgress,
    CollectThreadDump,
    Command,
    ControlLink,
    Deploy,
    LinkClosedError,
    NotifyCheckpoint,
    Ready,
    Reply,
    Report,
    StopWorker,
    TriggerCheckpoint,
    refusal_of,
)
from weir.taskmanager.task_host import UNIX_ADDRESS_PREFIX, TaskHost
from weir.wire import taskmanager_pb2, taskmanager_pb2_grpc

log = structlog.get_logger("weir.taskmanager")

PR_SET_PDEATHSIG: Final = 1
EXIT_PARENT_GONE: Final = 3
PROCESS_FAMILIES: Final = ("process_", "python_")
"""Families of the process itself: the TaskManager's ``/metrics`` accounts for its workers in its own."""


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux), then check the parent did
    not end before the request (it would never fire then)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("slot_worker_pdeathsig_failed", errno=ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(EXIT_PARENT_GONE)


class LinkReports:
    """The worker's report sink: each report to the TaskManager at once, in order (its reporter
    sends them on to the JobManager)."""

    def __init__(self, link: ControlLink) -> None:
        self._link = link

    def put(self, report: object) -> None:
        if not isinstance(report, StateReport | AckReport | DeclineReport):
            return  # StopReporting: the TaskManager's reporter ends, not this link
        sent = report.sent if isinstance(report, StateReport) else None
        try:
            # The event stays here: the TaskManager's reporter sends on; a failed task waits for the link only.
            self._link.send(Report(replace(report, sent=None) if isinstance(report, StateReport) else report))
        except LinkClosedError:
            pass  # the TaskManager is gone: so is the JobManager's view of this worker's tasks
        finally:
            if sent is not None:
                sent.set()


class DataPlane(taskmanager_pb2_grpc.TaskManagerServiceServicer):
    """The worker's gRPC service: only ``OpenChannel``, into its tasks' input gates."""

    def __init__(self, host: TaskHost) -> None:
        self._host = host

    def OpenChannel(  # noqa: N802
        self, request_iterator: Iterator[taskmanager_pb2.DataMessage], context: grpc.ServicerContext
    ) -> Iterator[taskmanager_pb2.CreditMessage]:
        return self._host.channels.open_channel(request_iterator)


class SlotWorker:
    """Answers the TaskManager's calls, each on a thread of a pool (a cancel waits for its tasks;
    a trigger must not wait behind it)."""

    def __init__(self, host: TaskHost, link: ControlLink, server: grpc.Server) -> None:
        self._host = host
        self._link = link
        self._server = server
        self._calls = ThreadPoolExecutor(16, thread_name_prefix="slot-call")
        self.stopped = threading.Event()

    def on_message(self, message: object) -> None:
        if isinstance(message, Call):
            self._calls.submit(self._answer, message)
        else:
            log.warning("slot_link_message_unknown", type=type(message).__name__)

    def _answer(self, call: Call) -> None:
        try:
            reply: object = Reply(call.call_id, self._run(call.command))
        except Exception as exc:
            reply = refusal_of(call.call_id, exc)
        try:
            self._link.send(reply)
        except LinkClosedError:
            return
        if isinstance(call.command, StopWorker):  # its tasks ended and their reports went out
            self.stopped.set()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def _run(self, command: Command) -> Any:
        host = self._host
        match command:
            case Deploy(request=request):
                host.deploy(taskmanager_pb2.DeployTaskRequest.FromString(request))
                return None
            case CancelAttempts(job_id=job_id, attempt=attempt, through=through, job_ended=job_ended):
                if through:
                    host.cancel_attempts_through(job_id, attempt, job_ended=job_ended)
                else:
                    host.cancel_attempt(job_id, attempt)
                return None
            case TriggerCheckpoint(request=request):
                return host.trigger_checkpoint(taskmanager_pb2.TriggerCheckpointRequest.FromString(request))
            case NotifyCheckpoint(job_id=job_id, attempt=attempt, checkpoint_id=checkpoint_id, complete=complete):
                host.notify_checkpoint(job_id, attempt, checkpoint_id, complete)
                return None
            case CollectProgress():
                return [p.SerializeToString() for p in host.progress()]
            case CollectMetrics(names=names):
                return task_metric_families(names)
            case CollectThreadDump():
                return thread_dump()
            case StopWorker():
                host.stop()
                self._server.stop(grace=1).wait()
                return None
            case _:
                assert_never(command)


def task_metric_families(names: frozenset[str] | None = None) -> list[Metric]:
    """This process's metric families but its own process and interpreter ones; with ``names``, only
    their samples of these names (collecting only the families that hold them)."""
    families = REGISTRY.collect() if names is None else REGISTRY.restricted_registry(names).collect()
    return [m for m in families if not m.name.startswith(PROCESS_FAMILIES)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m weir.taskmanager.slot_worker")
    parser.add_argument("--taskmanager-id", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--socket", required=True, help="the Unix socket of this worker's data plane")
    parser.add_argument("--local-channels", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    die_with_parent(args.parent_pid)

    logs.configure(args.taskmanager_id)
    structlog.contextvars.bind_contextvars(slot_worker=args.worker)
    link = ControlLink(Connection(args.control_fd), f"slot worker {args.worker} -> {args.taskmanager_id}")
    security = TransportSecurity.from_env().for_cluster_peers()
    server = new_server(security.without_tls(), max_workers=128, thread_name_prefix="slot-grpc")
    address = f"{UNIX_ADDRESS_PREFIX}{args.socket}"
    server.add_insecure_port(address)
    host = TaskHost(
        args.taskmanager_id,
        address,
        run_dir() / args.taskmanager_id,
        LinkReports(link),
        storage=open_storage(checkpoint_dir()),
        security=security,
        local_channels=args.local_channels,
        owns_job_directories=False,
    )
    taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(DataPlane(host), server)
    server.start()
    worker = SlotWorker(host, link, server)
    link.send(Ready(os.getpid(), address))
    log.info("slot_worker_serving", taskmanager_id=args.taskmanager_id, worker=args.worker, data_address=address)
    link.serve(worker.on_message, lambda why: None)
    if worker.stopped.is_set():
        return
    # The TaskManager is gone: so are its registration and its heartbeats, and this worker's tasks
    # with them (the JobManager fails them over). Leave at once, as a SIGKILL would.
    log.warning("slot_worker_orphaned", taskmanager_id=args.taskmanager_id, worker=args.worker)
    sys.stderr.flush()
    os._exit(EXIT_PARENT_GONE)


if __name__ == "__main__":
    main()
