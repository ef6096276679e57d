"""Starting a new job from a retained checkpoint of another job (``weir run --from-checkpoint PATH``),
at the same or another parallelism, as Flink's ``run -s`` does with an externalized checkpoint.

At submit the JobManager reads the checkpoint's ``_metadata`` from its own checkpoint storage, checks
that the new job can take its state (``weir.core.rescale.check_state_assignment``), and works out which
old subtasks' task-state documents each new vertex inherits. Before the job is accepted, the old job's
transactional sink subtasks (every one of them, also those a smaller parallelism no longer has) are
resolved as of the checkpoint (``jobmanager.ending.resolve_inherited_transactions``): what the
checkpoint pre-committed is committed, everything else of them aborted or rolled back. The new job's
sinks then start with no transactions of their own, and its sources from the checkpoint's positions,
so the output stays exactly once across the two jobs.

The new job never deletes the old job's files: it does not reuse them in its own checkpoints (its
first checkpoint uploads all of its state), and its retention only counts its own checkpoints. The
old job's checkpoint stays until the user deletes it; while the new job has no checkpoint of its own,
a restart restores from it again, so it must not be deleted before then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from connectors.object_storage import CheckpointStorage
from jobmanager.checkpointing.metadata import decode_metadata
from jobmanager.checkpointing.store import CompletedCheckpoint
from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.paths import CheckpointPaths, metadata_key_of
from weir.core.rescale import check_state_assignment, inherited_documents
from weir.core.task_state import TaskStateDocument, decode_task_state
from weir.graph import LogicalGraph
from weir.plan import JobPlan

TAKEOVER_ATTEMPT: Final = 1 << 40
"""The attempt the old job's sinks are resolved as when this JobManager does not know that job (its
checkpoint came from another cluster's run, or its record is gone): above any attempt a job reaches,
so whatever of the old job might still run is fenced for good."""


class CheckpointNotFoundError(JobDefinitionError):
    """``--from-checkpoint`` names no retained checkpoint in this cluster's checkpoint storage."""


class SourceJobRunningError(JobDefinitionError):
    """The job whose checkpoint a new job would start from still runs on this JobManager."""


@dataclass(frozen=True)
class InitialState:
    """The retained checkpoint a new job starts from, and the task-state documents each of its
    vertices inherits (by vertex uid, as the bytes the TaskManagers decode)."""

    checkpoint: CompletedCheckpoint
    documents: tuple[TaskStateDocument, ...]
    by_vertex: Mapping[str, tuple[bytes, ...]]


def checkpoint_metadata_key(storage_uri: str, paths: CheckpointPaths, path: str) -> str:
    """The ``_metadata`` key an external path names; CheckpointNotFoundError when it is not one of
    this cluster's checkpoints or savepoints."""
    key = metadata_key_of(storage_uri, path)
    if key is None or paths.parse_metadata_key(key) is None:
        raise CheckpointNotFoundError(
            f"--from-checkpoint {path!r} is not a checkpoint of this cluster's checkpoint storage ({storage_uri}): "
            "pass a path `weir checkpoints JOB_ID` shows"
        )
    return key


def load_checkpoint(storage: CheckpointStorage, key: str, path: str) -> CompletedCheckpoint:
    """The retained checkpoint whose metadata is at ``key``: CheckpointNotFoundError when it is not
    there, SerializationError when it cannot be read."""
    if not storage.exists(key):
        raise CheckpointNotFoundError(
            f"--from-checkpoint {path!r}: no checkpoint metadata at {key}: the checkpoint never completed, or "
            "retention or a user deleted it (`weir checkpoints JOB_ID` lists the retained ones)"
        )
    return decode_metadata(storage.get_bytes(key), key)


def plan_initial_state(
    checkpoint: CompletedCheckpoint, graph: LogicalGraph, plan: JobPlan, *, allow_non_restored_state: bool
) -> InitialState:
    """Decode the checkpoint's task states, check the new job can take them, and assign them to its
    vertices. Raises StateAssignmentError (a user error) or SerializationError."""
    where = f"checkpoint {checkpoint.checkpoint_id} of job {checkpoint.job_id} ({checkpoint.metadata_key})"
    documents: list[TaskStateDocument] = []
    raw: dict[tuple[str, int], bytes] = {}
    for handle in checkpoint.task_states:
        if not handle.inline_payload:
            raise SerializationError(f"{where}: task {handle.task_id} has no task state: the checkpoint is damaged")
        document = decode_task_state(handle.inline_payload, f"of task {handle.task_id} in {where}")
        documents.append(document)
        raw[(document.vertex_uid, document.subtask)] = handle.inline_payload
    keyed = [uid for uid, t in graph.transformations.items() if t.key_selector is not None]
    check_state_assignment(
        documents,
        graph.transformations,
        keyed,
        graph.max_parallelism,
        allow_non_restored_state=allow_non_restored_state,
        where=where,
    )
    assigned = inherited_documents({v.uid: v.operator_uids for v in plan.vertices.values()}, documents)
    return InitialState(
        checkpoint,
        tuple(documents),
        {vertex: tuple(raw[(d.vertex_uid, d.subtask)] for d in docs) for vertex, docs in assigned.items()},
    )
