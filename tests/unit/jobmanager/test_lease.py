"""The lease object in checkpoint storage (the folder storage's conditional writes) and FencedStorage."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from weir.connectors.object_storage import FileCheckpointStorage, WritePreconditionFailedError
from weir.core.errors import SerializationError
from weir.jobmanager.leader_election import LeaderElection, LeaderTerm, LeaseRecord, LeaseTiming, Tick
from weir.jobmanager.lease import LEASE_KEY, FencedStorage, LeaderElector, LeaseStore, NotLeaderError, decode_lease
from weir.jobmanager.manager import JobManager
from weir.jobmanager.service import JobManagerServicer, LeaderOnlyInterceptor
from weir.wire import jobmanager_pb2, jobmanager_pb2_grpc


def test_create_only_and_compare_and_write(tmp_path: Path) -> None:
    store = LeaseStore(FileCheckpointStorage(tmp_path))
    assert store.read().record is None
    first = LeaseRecord("a", LeaderTerm(1), "h:1", 6.0)
    v1 = store.write(first, None)
    with pytest.raises(WritePreconditionFailedError):
        store.write(LeaseRecord("b", LeaderTerm(1), "h:2", 6.0), None)
    v2 = store.write(LeaseRecord("a", LeaderTerm(1), "h:1", 6.0, renewal=1), v1)
    assert v2 != v1
    with pytest.raises(WritePreconditionFailedError):  # b read v1 before a's renewal: too late
        store.write(LeaseRecord("b", LeaderTerm(2), "h:2", 6.0), v1)
    observed = store.read()
    assert observed.version == v2 and observed.record == LeaseRecord("a", LeaderTerm(1), "h:1", 6.0, renewal=1)


def test_a_lease_of_another_format_is_refused_in_one_line() -> None:
    with pytest.raises(SerializationError, match="format 9"):
        decode_lease(b'{"format": 9}')


def test_fenced_storage_refuses_writes_unless_the_lease_names_this_leader(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path)
    now = [100.0]
    elector = LeaderElector(
        LeaderElection("a", "h:1", LeaseTiming()),
        LeaseStore(storage),
        lambda _t: None,
        lambda _t, _r: None,
        lambda: now[0],
    )
    fenced = FencedStorage(storage, elector)
    with pytest.raises(NotLeaderError):  # a follower
        fenced.put_bytes("job/_job", b"x")
    elector._carry_out(elector._handle(Tick(now[0])))  # acquires the absent lease at term 1
    assert elector.term() == LeaderTerm(1)
    fenced.put_bytes("job/_job", b"x")
    assert storage.get_bytes("job/_job") == b"x"
    # Another JobManager takes the lease over (term 2): this one's next write is refused.
    _, version = storage.get_versioned(LEASE_KEY) or (b"", "")
    LeaseStore(storage).write(LeaseRecord("b", LeaderTerm(2), "h:2", 6.0), version)
    with pytest.raises(NotLeaderError, match="b's at term 2"):
        fenced.put_bytes("job/_job", b"stale")
    with pytest.raises(NotLeaderError):
        fenced.delete(["job/_job"])
    assert storage.get_bytes("job/_job") == b"x"
    # Its own lease time over (paused past the renew deadline): refused without reading the lease.
    now[0] += 100.0
    assert elector.term() is None


def test_a_jobmanager_that_does_not_lead_answers_unavailable_and_its_health_still_answers() -> None:
    """So the TaskManagers and clients (weir.core.leader_link) move on to the next address."""
    leads = [True]
    servicer = JobManagerServicer(cast(JobManager, _ReadOnlyJobManager()))
    server = grpc.server(ThreadPoolExecutor(2), interceptors=[LeaderOnlyInterceptor(lambda: leads[0])])
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = jobmanager_pb2_grpc.JobManagerServiceStub(channel)
            assert list(stub.ListJobs(jobmanager_pb2.ListJobsRequest(), timeout=5).jobs) == []
            leads[0] = False  # its lease time is over
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListJobs(jobmanager_pb2.ListJobsRequest(), timeout=5)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            assert "not the leader" in refused.value.details()  # type: ignore[attr-defined]
            health_stub = health_pb2_grpc.HealthStub(channel)
            assert health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1  # SERVING
    finally:
        server.stop(0)


class _ReadOnlyJobManager:
    def list_jobs(self) -> tuple[()]:
        return ()
