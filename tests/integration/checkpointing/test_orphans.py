"""Orphans against the real S3 server: the uploads a real RocksDB snapshotter made for a checkpoint that
never completed are recognized and deleted; the retained checkpoint's stay."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.connectors.object_storage import CheckpointStorage, S3CheckpointStorage
from weir.core.config import Endpoints
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId, TaskManagerId
from weir.core.keygroups import KeyGroupRange, key_to_bytes
from weir.core.paths import CheckpointPaths
from weir.jobmanager.checkpointing.coordinator import CheckpointCoordinator
from weir.jobmanager.checkpointing.orphans import Kept
from weir.jobmanager.checkpointing.pending import StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.jobmanager.orphans import collect_orphans
from weir.taskmanager.snapshots import KeyedStateHandle, RocksDBSnapshotter
from weir.taskmanager.state import StateBackend

pytestmark = pytest.mark.integration

JOB = JobId("job-orphans")
TASK = TaskId(JOB, OperatorUid("keyed"), SubtaskIndex(0))
COUNTS = OperatorUid("counts")
RANGES = [(COUNTS, KeyGroupRange(KeyGroup(0), KeyGroup(127)))]
PATHS = CheckpointPaths()


@pytest.fixture
def storage(services: Endpoints) -> Iterator[CheckpointStorage]:
    store = S3CheckpointStorage(services, services.s3_bucket, f"it-orphans/{uuid.uuid4().hex[:12]}")
    yield store
    store.delete(key for key, _ in store.list(""))


def snapshot_after_writes(
    backend: StateBackend, snapshotter: RocksDBSnapshotter, checkpoint_id: int, users: range
) -> KeyedStateHandle:
    store = backend.keyed_store(COUNTS)
    for i in users:
        store.put("count", i % 128, key_to_bytes(f"user-{i}"), i)
    store.flush()
    return snapshotter.snapshot(JOB, CheckpointId(checkpoint_id), RANGES, timeout=60.0)


def test_a_crashed_checkpoint_s_real_uploads_are_deleted_and_the_retained_one_s_stay(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    backend = StateBackend(tmp_path / "db")
    snapshotter = RocksDBSnapshotter(backend, storage, PATHS, TaskManagerId("tm-0"))
    try:
        first = snapshot_after_writes(backend, snapshotter, 1, range(0, 500))
        snapshotter.notify_checkpoint_complete(JOB, CheckpointId(1))
        crashed = snapshot_after_writes(backend, snapshotter, 2, range(500, 1000))  # its ack is lost
    finally:
        snapshotter.close()
        backend.close()
    state = TaskStateHandle(TASK, tuple(StateObject(f.key, f.size_bytes, f.reused) for f in first.objects))
    retained = CompletedCheckpoint(CheckpointId(1), JOB, 1.0, 2.0, (state,), PATHS.metadata(JOB, CheckpointId(1)))
    storage.put_bytes(retained.metadata_key, b"metadata")
    storage.put_bytes(PATHS.job_record(JOB), b"{}")
    coordinator = CheckpointCoordinator(JOB, CheckpointConfig(interval_s=1.0), InMemoryCompletedCheckpointStore(1))
    coordinator.load_completed([retained])

    orphans = collect_orphans(storage, PATHS, coordinator)

    crashed_own = {f.key for f in crashed.objects if not f.reused}
    assert orphans is not None and crashed_own and orphans.kept_count(Kept.UNKNOWN) == 0
    assert set(orphans.object_keys) == crashed_own
    left = {key for key, _ in storage.list(PATHS.job_dir(JOB))}
    assert left == {PATHS.job_record(JOB), retained.metadata_key, *retained.object_keys}
