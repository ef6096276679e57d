"""Which objects of a job no checkpoint will ever need: the orphans of checkpoints that never completed.

A TaskManager uploads a snapshot's files before it acknowledges the checkpoint. When the checkpoint
never completes (the JobManager died, an acknowledgement was lost, the checkpoint expired before the
late ack came) nothing references those files and the coordinator never hears of them.
``find_orphans`` decides from a listing of the job's folder which keys go; ``weir.jobmanager.orphans``
lists, deletes and logs. The decision keeps:

* the job record, and every key outside Weir's layout (left alone, never guessed at);
* every key a retained checkpoint or savepoint references, or a checkpoint in flight (``live_keys``),
  and everything in the folder of a retained or in-flight checkpoint;
* completed savepoints (their metadata is listed), and, for those whose references it was not given,
  every shared SST uploaded up to the savepoint's id: a savepoint only reuses SSTs uploaded before it.

It deletes the folders of checkpoints neither retained nor in flight (their metadata first, as the
coordinator's ``DeleteObjects`` does) and the shared SSTs nothing retained or in flight references.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId
from weir.core.paths import CheckpointPaths
from weir.jobmanager.checkpointing.store import CompletedCheckpoint


@dataclass(frozen=True)
class StoredObject:
    """One key of a storage listing."""

    key: str
    size_bytes: int


class Kept(enum.Enum):
    """Why a listed object is not an orphan."""

    JOB_RECORD = "job_record"
    REFERENCED = "referenced"  # a retained or in-flight checkpoint references the key
    RETAINED = "retained"  # in the folder of a retained checkpoint or savepoint
    IN_FLIGHT = "in_flight"  # uploaded for a checkpoint that may still complete
    SAVEPOINT = "savepoint"  # part of a completed savepoint, or a shared SST one may reference
    OTHER_JOB = "other_job"  # outside the job's folder
    UNKNOWN = "unknown"  # not a key of the layout in ``weir.core.paths``: left alone


@dataclass(frozen=True)
class Orphans:
    """What to delete: ``metadata`` first, then ``checkpoint_objects`` and ``shared_ssts``."""

    metadata: tuple[StoredObject, ...]
    checkpoint_objects: tuple[StoredObject, ...]
    shared_ssts: tuple[StoredObject, ...]
    kept: tuple[tuple[Kept, int], ...]
    """How many listed objects were kept, by reason (reasons with none left out)."""

    @property
    def metadata_keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in self.metadata)

    @property
    def object_keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in (*self.checkpoint_objects, *self.shared_ssts))

    @property
    def size_bytes(self) -> int:
        return sum(o.size_bytes for o in (*self.metadata, *self.checkpoint_objects, *self.shared_ssts))

    def kept_count(self, reason: Kept) -> int:
        return dict(self.kept).get(reason, 0)


def find_orphans(
    paths: CheckpointPaths,
    job_id: JobId,
    listing: Iterable[StoredObject],
    retained: Iterable[CompletedCheckpoint],
    in_flight: Iterable[CheckpointId] = (),
    live_keys: Iterable[str] = (),
) -> Orphans:
    """The orphans among ``listing`` (the objects under ``paths.job_dir(job_id)``).

    ``retained``: the checkpoints and savepoints the store retains; ``in_flight``: ids of checkpoints
    that may still complete (pending or persisting); ``live_keys``: other keys not to delete, such as
    those in-flight acknowledgements reference.
    """
    listed = tuple(listing)
    kept_checkpoints = tuple(retained)
    protected = {c.metadata_key for c in kept_checkpoints} | set(live_keys)
    protected.update(key for c in kept_checkpoints for key in c.object_keys)
    retained_folders = {(c.kind, c.checkpoint_id) for c in kept_checkpoints}
    in_flight_ids = frozenset(in_flight)
    job_dir = paths.job_dir(job_id)
    job_record = paths.job_record(job_id)
    job_artifact = paths.job_artifact(job_id)

    completed_savepoints: set[CheckpointId] = set()
    for listed_object in listed:
        parsed = paths.parse_checkpoint_object(listed_object.key)
        if parsed is None or parsed.job_id != job_id:
            continue
        if parsed.kind is CheckpointKind.SAVEPOINT and parsed.is_metadata:
            completed_savepoints.add(parsed.checkpoint_id)
    # A savepoint whose references are unknown may reuse any SST uploaded up to its own id.
    unknown_references_through = max(
        (i for i in completed_savepoints if (CheckpointKind.SAVEPOINT, i) not in retained_folders), default=None
    )

    def kept_because(key: str) -> Kept | None:
        if not key.startswith(job_dir):
            return Kept.OTHER_JOB
        if key in (job_record, job_artifact):
            return Kept.JOB_RECORD
        if key in protected:
            return Kept.REFERENCED
        in_folder = paths.parse_checkpoint_object(key)
        if in_folder is not None and in_folder.job_id == job_id:
            if (in_folder.kind, in_folder.checkpoint_id) in retained_folders:
                return Kept.RETAINED
            if in_folder.checkpoint_id in in_flight_ids:
                return Kept.IN_FLIGHT
            if in_folder.kind is CheckpointKind.SAVEPOINT and in_folder.checkpoint_id in completed_savepoints:
                return Kept.SAVEPOINT
            return None
        shared = paths.parse_shared_sst(key)
        if shared is not None and shared.job_id == job_id:
            if shared.checkpoint_id in in_flight_ids:
                return Kept.IN_FLIGHT
            if unknown_references_through is not None and shared.checkpoint_id <= unknown_references_through:
                return Kept.SAVEPOINT
            return None
        return Kept.UNKNOWN

    metadata: list[StoredObject] = []
    checkpoint_objects: list[StoredObject] = []
    shared_ssts: list[StoredObject] = []
    kept: Counter[Kept] = Counter()
    for listed_object in sorted(set(listed), key=lambda o: o.key):
        reason = kept_because(listed_object.key)
        if reason is not None:
            kept[reason] += 1
            continue
        in_folder = paths.parse_checkpoint_object(listed_object.key)
        if in_folder is None:
            shared_ssts.append(listed_object)
        elif in_folder.is_metadata:
            metadata.append(listed_object)
        else:
            checkpoint_objects.append(listed_object)
    return Orphans(
        metadata=tuple(metadata),
        checkpoint_objects=tuple(checkpoint_objects),
        shared_ssts=tuple(shared_ssts),
        kept=tuple((reason, kept[reason]) for reason in Kept if kept[reason]),
    )
