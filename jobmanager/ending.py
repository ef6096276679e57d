"""Resolving an ended job's sink transactions: after ``weir cancel``, or once the restart strategy
gave up, nothing of the job may stay prepared or open in PostgreSQL or Kafka, nor unfinished in a file sink's path.

The JobManager does what a restore would do, without the rest of the job: for every subtask of
every transactional sink it builds the sink, restores it from the latest completed checkpoint (or
from nothing when none completed), opens it and closes it. Opening is the sink's recovery: it
fences every earlier attempt (a newer attempt number, a new Kafka producer epoch), commits what the
checkpoint lists as pre-committed (those transactions belong to a completed checkpoint) and rolls
back or aborts everything else of that subtask. The output then equals the output as of the
latest completed checkpoint, exactly once, and a job resubmitted over the same keys finds no row
lock held by a forgotten prepared transaction.

A CDC source's replication slot is released next (``release_source_slots``): dropped, with the
publication the source created, or kept, as ``weir.core.cdc.decide_slot_at_end`` decides from how
the job ended and the source's ``slot_retention``. A slot that cannot be dropped (still in use, the
server down) fails the resolution with a line naming it, and the end is retried with back-off like a
sink's (``weir_job_end_unresolved``); a restart never gets here, so the slot keeps the position the
restored checkpoint needs.

Each sink is set up with the job's parameters in its context, as its tasks were: a Kafka sink reaches
the job's cluster with the job's ``-D kafka.*`` settings and its own ``properties``
(``weir.core.kafka_config``), its secrets resolved here, in the JobManager.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

import structlog

from weir.connectors.object_storage import open_storage
from weir.core.cdc import JobEnd
from weir.core.config import Endpoints, checkpoint_dir
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import WeirError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.paths import metadata_folder
from weir.core.states import JobStatus
from weir.core.task_state import TaskStateDocument, decode_task_state, read_operator_states
from weir.graph import LogicalGraph
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.records import JobSubmission
from weir.operators.base import OperatorContext
from weir.operators.cdc_source import release_at_job_end
from weir.operators.file_sink import PartFileSinkOperator
from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator, TwoPhasePostgresSinkOperator
from weir.plan import JobPlan

log = structlog.get_logger("weir.jobmanager")

TransactionalSink = TransactionalKafkaSinkOperator | TwoPhasePostgresSinkOperator | PartFileSinkOperator


@dataclass(frozen=True)
class ResolutionReport:
    sink_subtasks: int  # sink subtasks whose transactions were resolved


@dataclass(frozen=True)
class _SinkSubtask:
    operator_uid: str
    vertex_uid: str
    subtask: int
    parallelism: int


class _NoOutput:
    """A sink being resolved emits nothing."""

    def emit(self, value: Any, timestamp: int | None) -> None:
        raise AssertionError("a sink emitted a record during transaction resolution")

    def emit_watermark(self, watermark: int) -> None:
        pass


def transactional_sink_subtasks(graph: LogicalGraph, plan: JobPlan) -> Iterator[_SinkSubtask]:
    for vertex in plan.vertices.values():
        for uid in vertex.operator_uids:
            spec = graph.transformations[uid].sink_spec
            if spec is None or not spec.transactional:
                continue
            for subtask in range(vertex.parallelism):
                yield _SinkSubtask(uid, vertex.uid, subtask, vertex.parallelism)


ReadObject = Callable[[str], bytes]
"""Reads one object of the checkpoint storage by its key."""


def configured_storage_reader(key: str) -> bytes:
    """Read ``key`` from the checkpoint storage this process is configured with."""
    return open_storage(checkpoint_dir()).get_bytes(key)


def reader_of(checkpoint: CompletedCheckpoint | None, read_object: ReadObject) -> ReadObject:
    """Reads the keys of ``checkpoint``'s task states: a savepoint's are relative to its folder."""
    if checkpoint is None or not checkpoint.is_savepoint:
        return read_object
    folder = metadata_folder(checkpoint.metadata_key)
    return lambda key: read_object(folder + key)


def sink_state(
    checkpoint: CompletedCheckpoint | None,
    vertex_uid: str,
    subtask: int,
    operator_uid: str,
    read_object: ReadObject = configured_storage_reader,
) -> bytes | None:
    """The sink operator's own state in the checkpoint's snapshot of its task, if any: decoded from
    the task-state document, read from checkpoint storage when it was too large to stay inline."""
    if checkpoint is None:
        return None
    for handle in checkpoint.task_states:
        if handle.task_id.operator_uid == vertex_uid and handle.task_id.subtask == subtask:
            if not handle.inline_payload:
                return None
            where = f"of task {handle.task_id} in checkpoint {checkpoint.checkpoint_id} ({checkpoint.metadata_key})"
            document = decode_task_state(handle.inline_payload, where)
            return read_operator_states(document.operator_state, read_object).get(operator_uid)
    return None


def resolve_sink_transactions(
    graph: LogicalGraph,
    plan: JobPlan,
    submission: JobSubmission,
    attempt: int,
    latest: CompletedCheckpoint | None,
    read_object: ReadObject = configured_storage_reader,
) -> ResolutionReport:
    """Resolve every transactional sink subtask's transactions as of ``latest``, as ``attempt``
    (above every attempt that ran). Raises the sink's WeirError when an external system refuses."""
    parts = list(transactional_sink_subtasks(graph, plan))
    read_object = reader_of(latest, read_object)
    return _resolve(
        graph, parts, submission.job_id, submission.job_name, submission.parameters, attempt, latest, read_object
    )


def inherited_sink_subtasks(
    graph: LogicalGraph, documents: Iterable[TaskStateDocument]
) -> tuple[list[_SinkSubtask], list[str]]:
    """The old job's transactional sink subtasks in a checkpoint's task states, as the new job's graph
    defines those sinks (by uid); and the uids of old operators the new graph does not have."""
    parts: list[_SinkSubtask] = []
    missing: set[str] = set()
    for d in documents:
        for uid in d.layout.operator_uids:
            transformation = graph.transformations.get(uid)
            if transformation is None:
                missing.add(uid)
                continue
            spec = transformation.sink_spec
            if spec is not None and spec.transactional:
                parts.append(_SinkSubtask(uid, d.vertex_uid, d.subtask, d.layout.parallelism))
    return parts, sorted(missing)


def job_end_of(outcome: JobStatus) -> JobEnd:
    """How an ending job ended, from its outcome: an end that is resolved is a cancel, a failure the
    restart strategy gave up on, or a FINISHED job that stopped at a savepoint (a job whose tasks all
    finished has nothing to resolve and does not get here, ``weir.jobmanager.lifecycle``)."""
    match outcome:
        case JobStatus.CANCELED:
            return JobEnd.CANCELED
        case JobStatus.FAILED:
            return JobEnd.FAILED
        case JobStatus.FINISHED:
            return JobEnd.STOPPED_AT_SAVEPOINT
        case JobStatus.CREATED | JobStatus.RUNNING | JobStatus.RESTARTING | JobStatus.CANCELLING:
            raise ValueError(f"a job's end is not {outcome.value}")
        case _:
            assert_never(outcome)


def cdc_sources(graph: LogicalGraph) -> list[PostgresCdcSourceSpec]:
    return [t.source_spec for t in graph.transformations.values() if isinstance(t.source_spec, PostgresCdcSourceSpec)]


def release_source_slots(graph: LogicalGraph, job_id: str, outcome: JobStatus) -> None:
    """Drop or keep each CDC source's replication slot now that the job ended as ``outcome``; every
    slot is tried, then the first failure is raised (SlotDropError, naming its slot)."""
    specs = cdc_sources(graph)
    if not specs:
        return
    end, endpoints = job_end_of(outcome), Endpoints.from_env()
    failures: list[WeirError] = []
    for spec in specs:
        try:
            release_at_job_end(spec, end, endpoints, log.bind(job_id=job_id))
        except WeirError as exc:
            log.warning("cdc_slot_not_released", job_id=job_id, slot=spec.slot_name, error=str(exc))
            failures.append(exc)
    if failures:
        raise failures[0]


def resolve_inherited_transactions(
    graph: LogicalGraph,
    documents: Iterable[TaskStateDocument],
    checkpoint: CompletedCheckpoint,
    job_name: str,
    parameters: Mapping[str, str],
    attempt: int,
    read_object: ReadObject = configured_storage_reader,
) -> ResolutionReport:
    """Before a new job starts from ``checkpoint`` of another job: resolve the transactions of that
    job's sink subtasks (at its parallelism, under its job id) as of the checkpoint, as ``attempt``,
    with the sinks as the new job defines them. Subtasks that the new parallelism no longer has are
    resolved with the rest, so nothing of the old job stays prepared or open."""
    parts, missing = inherited_sink_subtasks(graph, documents)
    if missing:
        log.warning(
            "inherited_operators_not_resolved",
            job_id=checkpoint.job_id,
            checkpoint_id=checkpoint.checkpoint_id,
            operator_uids=missing,
            reason="the new job has no operator with these uids: if one was a transactional sink, its "
            "transactions stay as the old job left them",
        )
    return _resolve(graph, parts, checkpoint.job_id, job_name, parameters, attempt, checkpoint, read_object)


def _resolve(
    graph: LogicalGraph,
    parts: Iterable[_SinkSubtask],
    job_id: str,
    job_name: str,
    parameters: Mapping[str, str],
    attempt: int,
    checkpoint: CompletedCheckpoint | None,
    read_object: ReadObject,
) -> ResolutionReport:
    resolved = 0
    for part in parts:
        sink: TransactionalSink = graph.transformations[part.operator_uid].factory()
        context = OperatorContext(
            job_id=job_id,
            job_name=job_name,
            uid=part.operator_uid,
            subtask=part.subtask,
            parallelism=part.parallelism,
            max_parallelism=graph.max_parallelism,
            attempt=attempt,
            key_group_range=key_group_range_for_subtask(
                graph.max_parallelism, part.parallelism, SubtaskIndex(part.subtask)
            ),
            parameters=parameters,
            state=None,
            log=log.bind(job_id=job_id, operator_uid=part.operator_uid, subtask=part.subtask, attempt=attempt),
        )
        sink.setup(context, _NoOutput())
        state = sink_state(checkpoint, part.vertex_uid, part.subtask, part.operator_uid, read_object)
        try:
            if state is not None:
                sink.restore_state(state)
            sink.open()
        finally:
            sink.close()
        resolved += 1
    return ResolutionReport(resolved)
