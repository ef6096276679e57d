"""Restoring a retained checkpoint into a new job, at the same or another parallelism: which old
subtasks' state each new subtask takes (Flink's ``StateAssignmentOperation``), as pure rules.

- **Keyed state** moves by key groups: a new subtask restores the key groups of its range from every
  old subtask whose range overlaps it, and nothing else (:func:`key_group_sources`).
- **Operator state** (source positions, a window operator's watermark) is redistributed as a union:
  every new subtask of a vertex is handed the states of every old subtask that ran one of its
  operators, with each old subtask's layout, and each operator keeps what is its own
  (``weir.operators.base.InheritedState``).
- **In-flight records** of an unaligned checkpoint are redistributed only into the same operator
  chain: an input channel's by the edge it belongs to, an output's by the edge it was queued on,
  named by consumer, never by position (``weir.core.inflight_state``). Output records queued for a
  consumer the new job no longer connects are refused like an operator's lost state.
- **Transactional sinks** do not inherit: their transactions belong to the old job's subtasks, which
  the JobManager resolves as of the checkpoint before the new job starts (``weir.jobmanager.restoring``).

A new job's operators are matched to the old ones by operator uid, so a job's operators need stable
uids to carry their state across versions (``.uid(...)`` in the job API).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.ids import KeyGroup
from weir.core.inflight_state import OutputTarget, queued_output_targets
from weir.core.keygroups import KeyGroupRange
from weir.core.task_state import (
    INFLIGHT_REDISTRIBUTION_REFUSED,
    INFLIGHT_STATE_NAME,
    TaskStateDocument,
    read_operator_states,
)


class StateAssignmentError(JobDefinitionError):
    """The retained checkpoint's state cannot be given to the new job as it is defined."""


@dataclass(frozen=True)
class KeyGroupSource:
    """Key groups ``key_groups`` of a new subtask come from old subtask ``old_subtask``."""

    old_subtask: int
    key_groups: KeyGroupRange


def key_group_sources(new_range: KeyGroupRange, old_ranges: Mapping[int, KeyGroupRange]) -> tuple[KeyGroupSource, ...]:
    """Where each key group of ``new_range`` comes from, ordered by key group: the old subtasks whose
    range (``old_ranges``, by old subtask index) overlaps it, each with the overlapping part.

    Raises SerializationError when the old ranges overlap each other or leave a key group of
    ``new_range`` uncovered: the checkpoint's subtasks do not add up to one vertex's key groups."""
    parts = sorted(
        (
            KeyGroupSource(old, common)
            for old, old_range in old_ranges.items()
            if (common := old_range.intersection(new_range)) is not None
        ),
        key=lambda source: source.key_groups.start,
    )
    expected = new_range.start
    for part in parts:
        if part.key_groups.start != expected:
            what = (
                "overlap"
                if part.key_groups.start < expected
                else f"leave key groups {expected}..{part.key_groups.start - 1} uncovered"
            )
            raise SerializationError(
                f"the old subtasks' key group ranges {_ranges(old_ranges)} {what} within {new_range}: "
                "the checkpoint's task states are not those of one vertex"
            )
        expected = KeyGroup(part.key_groups.end + 1)
    if expected != new_range.end + 1:
        raise SerializationError(
            f"the old subtasks' key group ranges {_ranges(old_ranges)} leave key groups "
            f"{expected}..{new_range.end} uncovered: the checkpoint's task states are not those of one vertex"
        )
    return tuple(parts)


def _ranges(old_ranges: Mapping[int, KeyGroupRange]) -> str:
    return ", ".join(f"#{s} {r}" for s, r in sorted(old_ranges.items()))


def stateful_operator_uids(document: TaskStateDocument) -> frozenset[str]:
    """The operators of an old subtask that hold state in the checkpoint: keyed ones and those with
    operator state (not the task's in-flight records, which belong to its chain, not an operator)."""
    operator_states = frozenset(document.operator_state_uids) - {INFLIGHT_STATE_NAME}
    return frozenset(document.layout.keyed_operator_uids) | operator_states


def inherited_documents(
    vertex_operator_uids: Mapping[str, Sequence[str]], documents: Iterable[TaskStateDocument]
) -> dict[str, tuple[TaskStateDocument, ...]]:
    """For each new vertex (by vertex uid, with its operators' uids), the old subtasks' documents it
    inherits: every old subtask that ran one of its operators, ordered by old vertex and subtask."""
    ordered = sorted(documents, key=lambda d: (d.vertex_uid, d.subtask))
    return {
        vertex: tuple(d for d in ordered if set(d.layout.operator_uids) & set(uids))
        for vertex, uids in vertex_operator_uids.items()
    }


def check_state_assignment(
    documents: Sequence[TaskStateDocument],
    new_operator_uids: Iterable[str],
    keyed_operator_uids: Iterable[str],
    max_parallelism: int,
    *,
    allow_non_restored_state: bool,
    where: str,
    new_chains: Mapping[str, Sequence[str]] | None = None,
    new_outputs: Mapping[str, Sequence[OutputTarget]] | None = None,
    read_object: Callable[[str], bytes] | None = None,
) -> None:
    """Refuse a restore that would lose or misplace state (StateAssignmentError, a user error):

    - unaligned in-flight records of an old task whose operator chain (``new_chains``: the new job's
      vertices, head uid -> operator uids) the new job does not have (a restore redistributes them
      only into the same chain);
    - with ``new_outputs`` (the new job's vertices, head uid -> the edges of its outputs, read through
      ``read_object`` when stored in checkpoint storage): in-flight output records whose document
      names no consumer (format 2) unless the new vertex has the one output they can only mean; and,
      unless ``allow_non_restored_state``, in-flight output records queued for an edge the new vertex
      does not have (its consumer is gone, or fed another way);
    - an old operator with state that no operator of the new job takes (by uid), unless
      ``allow_non_restored_state`` (Flink's ``--allowNonRestoredState``);
    - keyed state written with another max parallelism (its key groups do not map onto the new ones);
    - a vertex whose subtasks are missing from the checkpoint (its key groups would not add up).
    """
    chains = dict(new_chains) if new_chains is not None else None
    misplaced = sorted(
        f"{d.vertex_uid}#{d.subtask}"
        for d in documents
        if INFLIGHT_STATE_NAME in d.operator_state_uids
        and (chains is None or tuple(chains.get(d.vertex_uid, ())) != tuple(d.layout.operator_uids))
    )
    if misplaced:
        raise StateAssignmentError(
            f"{where} is an unaligned checkpoint with records in flight at subtask(s) {', '.join(misplaced)}, "
            f"whose operator chain the new job does not have: {INFLIGHT_REDISTRIBUTION_REFUSED}"
        )
    if new_outputs is not None:
        _check_inflight_outputs(
            documents, new_outputs, read_object, allow_non_restored_state=allow_non_restored_state, where=where
        )
    new_uids = set(new_operator_uids)
    keyed = set(keyed_operator_uids)
    lost = sorted({uid for d in documents for uid in stateful_operator_uids(d)} - new_uids)
    if lost and not allow_non_restored_state:
        raise StateAssignmentError(
            f"{where} holds state of operator(s) {', '.join(lost)} that the new job does not have (operators are "
            "matched by uid): give them the same uid in the new job, or pass --allow-non-restored-state to drop "
            "their state"
        )
    by_vertex: dict[str, list[TaskStateDocument]] = {}
    for d in documents:
        by_vertex.setdefault(d.vertex_uid, []).append(d)
    for vertex, subtasks in sorted(by_vertex.items()):
        layout = subtasks[0].layout
        indexes = sorted(d.subtask for d in subtasks)
        if indexes != list(range(layout.parallelism)) or any(
            d.layout.parallelism != layout.parallelism for d in subtasks
        ):
            raise SerializationError(
                f"{where}: vertex {vertex!r} ran {layout.parallelism} subtask(s), the checkpoint holds the state of "
                f"subtasks {indexes}: it is incomplete or damaged"
            )
        moved = sorted(set(layout.keyed_operator_uids) & keyed)
        if moved and layout.max_parallelism != max_parallelism:
            raise StateAssignmentError(
                f"{where}: the keyed state of {', '.join(moved)} is split into {layout.max_parallelism} key groups "
                f"(its max parallelism), the new job has max parallelism {max_parallelism}: key groups cannot be "
                f"remapped; set the new job's max parallelism to {layout.max_parallelism}"
            )


def _check_inflight_outputs(
    documents: Sequence[TaskStateDocument],
    new_outputs: Mapping[str, Sequence[OutputTarget]],
    read_object: Callable[[str], bytes] | None,
    *,
    allow_non_restored_state: bool,
    where: str,
) -> None:
    """The in-flight output records of each old subtask against its vertex's outputs in the new job."""

    def read(key: str) -> bytes:
        if read_object is None:
            raise SerializationError(f"{where}: an in-flight state is stored in {key}, which was not given to read")
        return read_object(key)

    for d in sorted(documents, key=lambda d: (d.vertex_uid, d.subtask)):
        if INFLIGHT_STATE_NAME not in d.operator_state_uids:
            continue
        task = f"{d.vertex_uid}#{d.subtask}"
        data = read_operator_states(d.operator_state, read)[INFLIGHT_STATE_NAME]
        queued = queued_output_targets(data, f"of task {task} in {where}")
        outputs = tuple(new_outputs.get(d.vertex_uid, ()))
        unnamed = sorted(edge for edge, target in queued.items() if target is None)
        if unnamed and (len(outputs) != 1 or unnamed != [0]):
            count = f"{len(outputs)} output" + ("" if len(outputs) == 1 else "s")
            raise StateAssignmentError(
                f"{where} holds records in flight at subtask {task} in output(s) {unnamed}, named by index only "
                f"(written before output buffers named their consumer), and {d.vertex_uid} has {count} in the new "
                "job, so which consumer they were queued for is unknown: take a savepoint of the old job (always "
                "aligned) and restore from it"
            )
        vanished = sorted({str(t) for t in queued.values() if t is not None and t not in outputs})
        if vanished and not allow_non_restored_state:
            raise StateAssignmentError(
                f"{where} holds records in flight at subtask {task} queued for {'; '.join(vanished)}, an edge the "
                f"new job does not have (matched by producing operator, consumer and input): connect that consumer "
                "as it was, or pass --allow-non-restored-state to drop those records"
            )
