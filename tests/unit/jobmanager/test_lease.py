"""The lease object in checkpoint storage (the folder storage's conditional writes) and FencedStorage."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.connectors.object_storage import FileCheckpointStorage, WritePreconditionFailedError
from weir.core.errors import SerializationError
from weir.jobmanager.leader_election import LeaderElection, LeaderTerm, LeaseRecord, LeaseTiming, Tick
from weir.jobmanager.lease import LEASE_KEY, FencedStorage, LeaderElector, LeaseStore, NotLeaderError, decode_lease


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
