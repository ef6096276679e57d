"""The TaskManager's leader-term fence: a deposed JobManager's calls are refused once a newer one called."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from weir.core.transport import LEADER_TERM_METADATA
from weir.core.transport_security import TransportSecurity
from weir.jobmanager.errors import TaskManagerCallError
from weir.jobmanager.gateway import GrpcTaskManagerGateway
from weir.jobmanager.leader_election import LeaderTerm
from weir.taskmanager.leader_fence import LeaderTermFence, StaleLeaderError, term_of
from weir.taskmanager.service import TaskManagerServicer
from weir.wire import taskmanager_pb2_grpc


def test_a_lower_term_is_refused_after_a_higher_one_was_seen() -> None:
    fence = LeaderTermFence()
    fence.admit(1, "deploy")
    fence.admit(2, "trigger checkpoint")
    fence.admit(2, "notify checkpoint complete")
    with pytest.raises(StaleLeaderError, match="leader term 1, and this TaskManager already follows term 2"):
        fence.admit(1, "notify checkpoint complete of job j")
    assert fence.highest == 2


def test_a_jobmanager_without_high_availability_is_term_zero_and_never_fenced_by_itself() -> None:
    fence = LeaderTermFence()
    for _ in range(3):
        fence.admit(term_of([], LEADER_TERM_METADATA), "cancel")
    assert fence.highest == 0


def test_the_term_is_read_from_the_calls_metadata() -> None:
    assert term_of([("authorization", "x"), (LEADER_TERM_METADATA, "7")], LEADER_TERM_METADATA) == 7
    assert term_of([(LEADER_TERM_METADATA, b"12")], LEADER_TERM_METADATA) == 12
    assert term_of([(LEADER_TERM_METADATA, "nonsense")], LEADER_TERM_METADATA) == -1  # refused once any term is seen


class _Runtime:
    """Stands in for TaskManagerRuntime: records the calls the servicer lets through."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def notify_checkpoint(self, job_id: str, attempt: int, checkpoint_id: int, complete: bool) -> None:
        self.calls.append((job_id, checkpoint_id))

    def cancel_attempts_through(self, job_id: str, attempt: int, *, job_ended: bool = False) -> None:
        self.calls.append((job_id, -attempt))


def test_a_deposed_jobmanagers_calls_are_refused_over_grpc_and_never_reach_the_tasks() -> None:
    """Gateway (term in the metadata) to servicer (fence), over a loopback gRPC server."""
    runtime = _Runtime()
    server = grpc.server(ThreadPoolExecutor(4))
    taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(TaskManagerServicer(runtime), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    address = f"127.0.0.1:{port}"
    security = TransportSecurity()
    old = GrpcTaskManagerGateway(security, term=lambda: LeaderTerm(1))
    new = GrpcTaskManagerGateway(security, term=lambda: LeaderTerm(2))
    deposed = GrpcTaskManagerGateway(security, term=lambda: None)
    try:
        old.notify_checkpoint_complete(address, "job-1", 1, 5)  # term 1 leads: admitted
        new.notify_checkpoint_complete(address, "job-1", 2, 6)  # term 2 takes over
        with pytest.raises(TaskManagerCallError, match="leader term 1.*already follows term 2") as refused:
            old.notify_checkpoint_complete(address, "job-1", 1, 7)
        assert refused.value.code == "FAILED_PRECONDITION"
        with pytest.raises(TaskManagerCallError, match="already follows term 2"):
            old.cancel_job_tasks(address, "job-1", 2, job_ended=True)
        with pytest.raises(TaskManagerCallError, match="not the leader"):  # its lease time is over: not sent
            deposed.notify_checkpoint_complete(address, "job-1", 1, 8)
        assert runtime.calls == [("job-1", 5), ("job-1", 6)]
    finally:
        server.stop(0)
