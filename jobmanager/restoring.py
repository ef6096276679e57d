"""Starting a new job from a retained checkpoint of another job (``weir run --from-checkpoint PATH``),
at the same or another parallelism, as Flink's ``run -s`` does with an externalized checkpoint.

At submit the JobManager reads the checkpoint's (or savepoint's) ``_metadata`` from the storage its
path names (its own checkpoint storage or any other, ``weir.core.paths.locate_state``), checks
that the new job can take its state (``weir.core.rescale.check_state_assignment``), and works out which
old subtasks' task-state documents each new vertex inherits. Before the job is accepted, the old job's
transactional sink subtasks (every one of them, also those a smaller parallelism no longer has) are
resolved as of the checkpoint (``weir.jobmanager.ending.resolve_inherited_transactions``): what the
checkpoint pre-committed is committed, everything else of them aborted or rolled back. The new job's
sinks then start with no transactions of their own, and its sources from the checkpoint's positions,
so the output stays exactly once across the two jobs.

The new job never deletes the old job's files: it does not reuse them in its own checkpoints (its
first checkpoint uploads all of its state), and its retention only counts its own checkpoints. The
old job's checkpoint stays until the user deletes it; while the new job has no checkpoint of its own,
a restart restores from it again, so it must not be deleted before then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from weir.connectors.object_storage import CheckpointStorage, open_storage
from weir.core.errors import JobDefinitionError, SerializationError, WeirError
from weir.core.paths import locate_state
from weir.core.rescale import check_state_assignment, inherited_documents
from weir.core.task_state import TaskStateDocument, decode_task_state
from weir.graph import LogicalGraph
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.plan import JobPlan

TAKEOVER_ATTEMPT: Final = 1 << 40
"""The attempt the old job's sinks are resolved as when this JobManager does not know that job (its
checkpoint came from another cluster's run, or its record is gone): above any attempt a job reaches,
so whatever of the old job might still run is fenced for good."""


class CheckpointNotFoundError(JobDefinitionError):
    """``--from-checkpoint`` / ``--from-savepoint`` names no retained checkpoint or savepoint."""


class SourceJobRunningError(JobDefinitionError):
    """The job whose checkpoint a new job would start from still runs on this JobManager."""


@dataclass(frozen=True)
class InitialState:
    """The retained checkpoint a new job starts from, and the task-state documents each of its
    vertices inherits (by vertex uid, as the bytes the TaskManagers decode)."""

    checkpoint: CompletedCheckpoint
    documents: tuple[TaskStateDocument, ...]
    by_vertex: Mapping[str, tuple[bytes, ...]]
    storage_uri: str  # what the documents' keys are relative to


@dataclass(frozen=True)
class RetainedState:
    """A retained checkpoint or savepoint read from its storage: the storage its keys are relative to
    (its URI travels to the TaskManagers) and the checkpoint."""

    storage: CheckpointStorage
    checkpoint: CompletedCheckpoint


StorageOpener = Callable[[str], CheckpointStorage]


def read_retained_state(path: str, own: CheckpointStorage, opener: StorageOpener = open_storage) -> RetainedState:
    """The checkpoint or savepoint at an external path (a folder URI or its ``_metadata``, in this
    cluster's checkpoint storage or any other): CheckpointNotFoundError when there is none there,
    SerializationError when it cannot be read."""
    if "://" not in path and not path.startswith("/"):
        raise CheckpointNotFoundError(
            f"{path!r} is not an external path: pass the URI `weir checkpoints JOB_ID` or `weir savepoint` printed "
            "(s3://…, file:///… or an absolute directory)"
        )
    location = locate_state(path)
    root = location.root_uri.rstrip("/")
    try:
        storage = own if root == own.uri.rstrip("/") else opener(root)
        found = storage.exists(location.metadata_key)
    except WeirError as exc:
        raise CheckpointNotFoundError(f"{path!r}: its storage cannot be read: {exc}") from exc
    if not found:
        raise CheckpointNotFoundError(
            f"{path!r}: no checkpoint or savepoint metadata at {root}/{location.metadata_key}: it never completed, "
            "or retention or a user deleted it (`weir checkpoints JOB_ID` lists the retained ones)"
        )
    key = location.metadata_key
    return RetainedState(storage, decode_metadata(storage.get_bytes(key), key))


def plan_initial_state(
    retained: RetainedState, graph: LogicalGraph, plan: JobPlan, *, allow_non_restored_state: bool
) -> InitialState:
    """Decode the checkpoint's task states, check the new job can take them, and assign them to its
    vertices. Raises StateAssignmentError (a user error) or SerializationError."""
    checkpoint = retained.checkpoint
    where = (
        f"{checkpoint.kind.value} {checkpoint.checkpoint_id} of job {checkpoint.job_id} "
        f"({retained.storage.uri.rstrip('/')}/{checkpoint.metadata_key})"
    )
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
        new_chains={v.uid: v.operator_uids for v in plan.vertices.values()},
        new_outputs={v.uid: [e.target for e in v.outputs] for v in plan.vertices.values()},
        read_object=retained.storage.get_bytes,
    )
    assigned = inherited_documents({v.uid: v.operator_uids for v in plan.vertices.values()}, documents)
    return InitialState(
        checkpoint,
        tuple(documents),
        {vertex: tuple(raw[(d.vertex_uid, d.subtask)] for d in docs) for vertex, docs in assigned.items()},
        retained.storage.uri,
    )
