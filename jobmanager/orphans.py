"""Collects a job's orphans: lists its folder in the checkpoint storage, lets the coordinator decide
(``CheckpointCoordinator.find_orphans``), deletes the metadata first, then the objects, and logs one
``orphans_collected`` event. The recovery of a job runs it once its checkpoints are loaded, before
its next attempt is deployed: nothing is in flight then, so every upload of a checkpoint the previous
JobManager did not complete goes."""

from __future__ import annotations

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.errors import WeirError
from weir.core.paths import CheckpointPaths
from weir.jobmanager.checkpointing.coordinator import CheckpointCoordinator
from weir.jobmanager.checkpointing.orphans import Kept, Orphans, StoredObject

log = structlog.get_logger("weir.jobmanager")


def collect_orphans(
    storage: CheckpointStorage, paths: CheckpointPaths, coordinator: CheckpointCoordinator
) -> Orphans | None:
    """Delete the job's orphans; None if the storage failed (they stay for the next collection)."""
    job_id = coordinator.job_id
    try:
        listing = [StoredObject(key, size) for key, size in storage.list(paths.job_dir(job_id))]
        orphans = coordinator.find_orphans(paths, listing)
        storage.delete(orphans.metadata_keys)
        storage.delete(orphans.object_keys)
    except WeirError as exc:
        log.warning(
            "orphan_collection_failed",
            job_id=job_id,
            error=str(exc),
            action="orphans stay in checkpoint storage until the job is next recovered",
        )
        return None
    log.info(
        "orphans_collected",
        job_id=job_id,
        listed=len(listing),
        metadata=len(orphans.metadata),
        checkpoint_objects=len(orphans.checkpoint_objects),
        shared_ssts=len(orphans.shared_ssts),
        deleted_bytes=orphans.size_bytes,
        kept=sum(count for _, count in orphans.kept),
        left_alone=orphans.kept_count(Kept.UNKNOWN),
    )
    return orphans
