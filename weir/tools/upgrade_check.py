"""``weir upgrade check JOB_V2.py --savepoint PATH``: whether a new version of a job can take a
savepoint's state, decided offline from the job's code and the checkpoint storage alone, before
``weir run --from-savepoint`` is tried (Flink checks the same things at restore, one by one, as the
job starts: ``StateAssignmentOperation`` for uids and max parallelism,
``TypeSerializerSnapshot#resolveSchemaCompatibility`` for state schemas; this runs them all at once,
over every stored value, and reports every problem instead of the first).

What it checks, each a :class:`Finding` of a :class:`FindingKind` (the uid it concerns, a reason):

- **uids**: every stateful operator of the savepoint is matched by uid to the new job's (kept,
  missing, new; a missing uid with a new stateful operator of the same kind next to it is reported
  as a likely rename); the JobManager's own restore rules (``weir.core.rescale.check_state_assignment``:
  max parallelism, incomplete vertices, in-flight records) are run as they are, never restated;
- **keyed state**: the states' schemas against the new operators' declarations
  (``weir.core.state_schema.required_migrations``, what the TaskManager runs at restore); every
  stored value is unpickled (a class that no longer imports), run through the new operator's
  ``migrate_value`` when its state is migrated (the first value that raises is named), and its
  stored record key re-hashed with the new job's max parallelism (``weir.core.keygroups``): an entry
  whose key would fall into another key group is state the new job never reads again (silent loss);
  a keyed operator that is no longer keyed loses its state too;
- **window state layout**: a window operator's sliced sliding windows (``weir.operators.windows``)
  restore only into slices of the same width (a changed size, slide or a lost ``merge`` fails);
  per-window accumulators restore into sliced windows too (said as info);
- **key functions**: every key sample the operator kept (``weir.core.key_samples``: a bounded
  sample of the records it keyed, each with its key) is run through the new operator's key function;
  a record it keys otherwise (or raises on) is state the new job would not find (the restore
  succeeds, the loss is silent); a changed fingerprint of the key function's code with every sample
  agreeing is a note;
- **exactly-once sinks**: a transactional sink of the savepoint keeps its uid, stays an exactly-once
  sink, and of the same system (a Kafka sink's snapshot names its marker topic);
- **dead-letter topics** of the new job (``weir.jobmanager.submit_checks.dead_letter_topics``)
  exist, when a way to ask Kafka is given (else a warning says they were not checked).

- **CDC sources**: a PostgreSQL CDC source's position restored at the parallelism the new job runs it
  at, its slot's name kept (``weir.core.cdc.redistribute_stored``, what the source's restore runs:
  a snapshot in progress cannot go on at a lower parallelism).

What it cannot see: a key function that keys otherwise only records never sampled; a change in a
function the key function calls (the fingerprint covers its own code); the operator state of other
sources and windows (offsets, watermarks), which the new operators read as they open; anything about
the records still to come. The verdict is PASS when no finding is fatal.

The stored values are unpickled in this process, as a restore does: check only savepoints you would
restore from.
"""

from __future__ import annotations

import dataclasses
import enum
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, assert_never

from weir.api.job_code import JobCode, PreparedArtifact, SourceCode, load_job
from weir.api.loading import load_job_file
from weir.core.cdc import Redistributed, RedistributionRefused, redistribute_stored
from weir.core.config import Endpoints
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import Fault, JobDefinitionError, SerializationError, WeirError
from weir.core.key_samples import KEY_SAMPLE_STATE, KeySample, key_function_fingerprint
from weir.core.keygroups import key_group_for, key_group_for_key, key_to_bytes
from weir.core.rescale import StateAssignmentError, check_state_assignment, stateful_operator_uids
from weir.core.state_layout import (
    EVENT_TIMERS,
    PROCESSING_TIMERS,
    STATE_KINDS,
    WINDOW_STATE,
    KeyedEntry,
    describe_state_key,
    load_value,
    record_key_of,
    split_key_prefix,
)
from weir.core.state_schema import (
    StateSchema,
    StateSchemaError,
    merge_stored_schemas,
    required_migrations,
)
from weir.core.task_state import TaskStateDocument
from weir.graph import LogicalGraph, Transformation
from weir.jobmanager.submit_checks import dead_letter_topics
from weir.operators.keyed import KeyedOperator
from weir.operators.windows import WindowAggregateOperator, decode_window_document
from weir.plan import build_plan
from weir.sql.join_layout_compat import is_relaid_join
from weir.tools.savepoint_inspect import (
    LoadedSavepoint,
    decode_operator_state,
    load_savepoint,
    open_keyed_snapshot,
    scan_entries,
)


class UpgradeRefusedError(WeirError):
    """``weir run --from-savepoint`` will not submit a job the upgrade check fails (the author's to fix,
    or to override with ``--skip-upgrade-check``)."""

    fault: Fault = Fault.USER


class FindingKind(enum.Enum):
    KEPT_UID = "kept-uid"
    """A stateful operator of the savepoint the new job has, by uid."""
    NEW_UID = "new-uid"
    """A stateful operator of the new job the savepoint has no state of: it starts empty."""
    MISSING_UID = "missing-uid"
    """A stateful operator of the savepoint the new job does not have: its state is dropped."""
    RENAMED_UID = "renamed-uid"
    """A missing uid next to a new one of the same kind of operator: likely a rename."""
    JOIN_LAYOUT_CHANGED = "join-layout-changed"
    """A SQL changelog join of the savepoint that this Weir keeps another way (its uid carries the new
    layouts, ``weir.sql.join_layout_compat``): not a rename, its state cannot be carried over."""
    RESTORE_REFUSED = "restore-refused"
    """The JobManager's restore rules refuse the savepoint (incomplete vertex, in-flight records)."""
    MAX_PARALLELISM = "max-parallelism"
    """Keyed state split into another number of key groups than the new job's max parallelism."""
    NOT_KEYED = "not-keyed"
    """Keyed state of an operator the new job does not key: nothing reads it."""
    STATE_SCHEMA = "state-schema"
    """A state's stored schema the new operator's declaration cannot read."""
    STATE_NAME = "state-name"
    """A stored state the new operator neither declares nor writes as the runtime's own."""
    MIGRATION_FAILED = "migration-failed"
    """The new operator's migrate raised on a stored value."""
    CLASS_NOT_IMPORTABLE = "class-not-importable"
    """A stored value does not unpickle: a class it names no longer imports."""
    KEY_FUNCTION_CHANGED = "key-function-changed"
    """The new key function gives a sampled record another key than the old one: its state is not found."""
    KEY_FUNCTION_REWRITTEN = "key-function-rewritten"
    """The key function's code changed, and it still gives every sampled record its old key."""
    KEY_FUNCTION_UNSAMPLED = "key-function-unsampled"
    """A keyed operator's state holds no key samples (an earlier Weir wrote it): its key function is unchecked."""
    KEY_GROUP_MOVED = "key-group-moved"
    """A stored key hashes to another key group than it is stored under: the new job never reads it."""
    SINK_REMOVED = "sink-removed"
    """An exactly-once sink of the savepoint the new job does not have."""
    SINK_CHANGED = "sink-changed"
    """An exactly-once sink of the savepoint is, under its uid, no longer an exactly-once sink of that system."""
    DEAD_LETTER_TOPIC_MISSING = "dead-letter-topic-missing"
    DEAD_LETTER_UNCHECKED = "dead-letter-unchecked"
    """Dead-letter topics were not checked (no Kafka to ask)."""
    SOURCE_POSITION = "source-position"
    """A PostgreSQL CDC source's position against the new source: its slot, and the parallelism it is
    restored at (``weir.core.cdc.redistribute``, what the source's restore decides)."""


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    FATAL = "fatal"


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    uid: str
    reason: str
    severity: Severity

    @property
    def fatal(self) -> bool:
        return self.severity is Severity.FATAL

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "severity": self.severity.value, "uid": self.uid, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.severity.value} {self.kind.value} {self.uid}: {self.reason}"


@dataclass(frozen=True)
class UpgradeReport:
    """Every finding, in the order found; PASS when none is fatal."""

    job: str
    savepoint: str
    findings: tuple[Finding, ...]
    entries_checked: int = 0
    samples_checked: int = 0
    """Key samples (``weir.core.key_samples``) run through the new key functions."""

    @property
    def passed(self) -> bool:
        return not any(f.fatal for f in self.findings)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def fatal(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.fatal)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "job": self.job,
            "savepoint": self.savepoint,
            "entries_checked": self.entries_checked,
            "samples_checked": self.samples_checked,
            "findings": [f.to_json() for f in self.findings],
        }

    def summary(self) -> str:
        """One line: the verdict and, on FAIL, the first fatal reason (what ``weir run`` refuses with)."""
        fatal = self.fatal()
        if not fatal:
            return f"PASS: {self.job} can restore from {self.savepoint}"
        more = f" (and {len(fatal) - 1} more)" if len(fatal) > 1 else ""
        first = fatal[0]
        head = f"FAIL: {self.job} cannot restore from {self.savepoint}"
        return f"{head}: {first.kind.value} {first.uid}: {first.reason}{more}"


TopicExists = Callable[[str], bool]
"""Whether a Kafka topic exists (None: Kafka could not be asked)."""

_RUNTIME_STATES: Final = frozenset(STATE_KINDS)


def check_upgrade(
    graph: LogicalGraph,
    savepoint: LoadedSavepoint,
    *,
    job: str = "the job",
    allow_non_restored_state: bool = False,
    topic_exists: TopicExists | None = None,
    work_dir: Path | None = None,
) -> UpgradeReport:
    """Every finding of restoring ``savepoint`` into the job ``graph``; reads the keyed state of each
    kept keyed operator (downloaded under ``work_dir``, a temporary folder when None)."""
    findings: list[Finding] = []
    documents = [t.document for t in savepoint.tasks]
    transformations = graph.transformations
    old_stateful = _stateful_by_uid(documents)
    sinks = _transactional_sinks(savepoint)
    findings += _map_uids(old_stateful, transformations, sinks, allow_non_restored_state)
    findings += _jobmanager_rules(documents, graph, savepoint.what, savepoint.storage.get_bytes)
    findings += _check_sinks(sinks, transformations, allow_non_restored_state)
    findings += _check_cdc_sources(graph, savepoint)
    entries = samples = 0
    keyed_uids = sorted({u for d in documents for u in d.layout.keyed_operator_uids if u in transformations})
    max_parallelism_ok = all(
        d.layout.max_parallelism == graph.max_parallelism
        for d in documents
        if set(d.layout.keyed_operator_uids) & set(keyed_uids)
    )
    operators = {uid: transformations[uid] for uid in keyed_uids}
    for uid, t in operators.items():
        if t.key_selector is None:
            findings.append(
                Finding(
                    FindingKind.NOT_KEYED,
                    uid,
                    "the savepoint holds keyed state of this operator, the new job does not key it: nothing would "
                    "read that state; key it as before, or give it another uid (and --allow-non-restored-state)",
                    Severity.FATAL,
                )
            )
    with _scratch(work_dir) as directory:
        for uid in keyed_uids:
            t = operators[uid]
            if t.key_selector is None:
                continue
            found, checked, sampled = _check_keyed_operator(
                uid, t, savepoint, documents, graph.max_parallelism if max_parallelism_ok else None, directory
            )
            findings += found
            entries += checked
            samples += sampled
    findings += _check_dead_letters(graph, topic_exists)
    return UpgradeReport(job, savepoint.path, tuple(findings), entries, samples)


# uids -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _OldOperator:
    uid: str
    keyed: bool
    state_names: frozenset[str] = field(default_factory=frozenset)


def _stateful_by_uid(documents: Sequence[TaskStateDocument]) -> dict[str, _OldOperator]:
    out: dict[str, _OldOperator] = {}
    for d in documents:
        for uid in sorted(stateful_operator_uids(d)):
            keyed = uid in d.layout.keyed_operator_uids or (uid in out and out[uid].keyed)
            names = frozenset(s.name for s in d.layout.state_schemas.get(uid, ()))
            out[uid] = _OldOperator(uid, keyed, names | (out[uid].state_names if uid in out else frozenset()))
    return out


def _is_stateful(t: Transformation) -> bool:
    """Whether a new operator may take state: a keyed one, a source, a sink (what holds state in Weir);
    a window over a non-keyed stream holds operator state too, but that cannot be told from the graph."""
    return t.key_selector is not None or t.source_spec is not None or t.sink_spec is not None


def _kind_of(t: Transformation) -> str:
    if t.source_spec is not None:
        return "source"
    if t.sink_spec is not None:
        return f"{t.sink_spec.system.value} sink ({t.sink_spec.delivery.value})"
    return "keyed operator" if t.key_selector is not None else "operator"


def _map_uids(
    old: Mapping[str, _OldOperator],
    new: Mapping[str, Transformation],
    sinks: Mapping[str, bool],
    allow_non_restored_state: bool,
) -> list[Finding]:
    findings: list[Finding] = []
    missing = [uid for uid in old if uid not in new]
    added = [uid for uid, t in new.items() if uid not in old and _is_stateful(t)]
    for uid in old:
        if uid in new:
            findings.append(
                Finding(FindingKind.KEPT_UID, uid, f"restored into the new job's {_kind_of(new[uid])}", Severity.INFO)
            )
    for uid in missing:
        if uid in sinks:
            continue  # an exactly-once sink: _check_sinks says it
        severity = Severity.WARNING if allow_non_restored_state else Severity.FATAL
        what = "keyed state" if old[uid].keyed else "operator state"
        action = (
            "its state is dropped (--allow-non-restored-state)"
            if allow_non_restored_state
            else "give it the same uid in the new job, or pass --allow-non-restored-state to drop its state"
        )
        findings.append(
            Finding(
                FindingKind.MISSING_UID,
                uid,
                f"the savepoint holds {what} of it, the new job has no such uid: {action}",
                severity,
            )
        )
        candidates = [u for u in added if (new[u].key_selector is not None) == old[uid].keyed and u not in sinks]
        relaid = [u for u in candidates if is_relaid_join(uid, u)]
        if relaid:
            findings.append(
                Finding(
                    FindingKind.JOIN_LAYOUT_CHANGED,
                    uid,
                    f"the same SQL join is now {relaid[0]!r}: this Weir keeps its sides' rows another way than the "
                    "one that took the savepoint (docs/sql.md, upsert keys), so its state cannot be carried over; "
                    "--allow-non-restored-state starts the join empty",
                    severity,
                )
            )
        elif candidates:
            findings.append(
                Finding(
                    FindingKind.RENAMED_UID,
                    uid,
                    f"renamed to {', '.join(map(repr, candidates))}? a uid is how state finds its operator: "
                    f"give the new operator uid {uid!r} to keep its state",
                    severity,
                )
            )
    for uid in added:
        findings.append(
            Finding(
                FindingKind.NEW_UID,
                uid,
                f"a {_kind_of(new[uid])} with no state in the savepoint: it starts empty",
                Severity.INFO,
            )
        )
    return findings


def _jobmanager_rules(
    documents: Sequence[TaskStateDocument], graph: LogicalGraph, where: str, read_object: Callable[[str], bytes]
) -> list[Finding]:
    """The JobManager's restore rules (``check_state_assignment``, as ``weir.jobmanager.restoring``
    runs them), vertex by vertex so that each refusal is its own finding; lost uids are the uid
    mapping's, so they are allowed here."""
    plan = build_plan(graph)
    keyed = [uid for uid, t in graph.transformations.items() if t.key_selector is not None]
    by_vertex: dict[str, list[TaskStateDocument]] = defaultdict(list)
    for d in documents:
        by_vertex[d.vertex_uid].append(d)
    findings: list[Finding] = []
    for vertex, docs in sorted(by_vertex.items()):
        try:
            check_state_assignment(
                docs,
                graph.transformations,
                keyed,
                graph.max_parallelism,
                allow_non_restored_state=True,
                where=where,
                new_chains={v.uid: v.operator_uids for v in plan.vertices.values()},
                new_outputs={v.uid: [e.target for e in v.outputs] for v in plan.vertices.values()},
                read_object=read_object,
            )
        except (StateAssignmentError, SerializationError) as exc:
            moved = set(docs[0].layout.keyed_operator_uids) & set(keyed)
            kind = (
                FindingKind.MAX_PARALLELISM
                if moved and docs[0].layout.max_parallelism != graph.max_parallelism
                else FindingKind.RESTORE_REFUSED
            )
            findings.append(Finding(kind, vertex, str(exc), Severity.FATAL))
    return findings


# exactly-once sinks ------------------------------------------------------------------------------


def _transactional_sinks(savepoint: LoadedSavepoint) -> dict[str, bool]:
    """The uids of the savepoint's transactional sinks, each with whether it is a Kafka sink (its
    snapshot names a marker topic)."""
    sinks: dict[str, bool] = {}
    for task in savepoint.tasks:
        for uid, data in task.operator_states.items():
            decoded = decode_operator_state(data)
            if decoded["kind"] == "transactional-sink":
                sinks[uid] = sinks.get(uid, False) or decoded["marker_topic"] is not None
    return sinks


def _check_sinks(
    sinks: Mapping[str, bool], new: Mapping[str, Transformation], allow_non_restored_state: bool
) -> list[Finding]:
    findings: list[Finding] = []
    for uid, kafka in sorted(sinks.items()):
        t = new.get(uid)
        if t is None:
            findings.append(
                Finding(
                    FindingKind.SINK_REMOVED,
                    uid,
                    "an exactly-once sink of the savepoint the new job does not have: its output stops at the "
                    "savepoint; keep the sink with the same uid"
                    + (" (--allow-non-restored-state drops it)" if allow_non_restored_state else ""),
                    Severity.WARNING if allow_non_restored_state else Severity.FATAL,
                )
            )
            continue
        spec = t.sink_spec
        if spec is None or not spec.transactional:
            what = "not a sink" if spec is None else f"a {spec.system.value} sink with delivery {spec.delivery.value}"
            findings.append(
                Finding(
                    FindingKind.SINK_CHANGED,
                    uid,
                    f"an exactly-once sink in the savepoint, {what} in the new job: its output would no longer be "
                    "exactly once across the upgrade; keep delivery exactly_once under this uid",
                    Severity.FATAL,
                )
            )
        elif kafka and spec.system.value != "kafka":
            findings.append(
                Finding(
                    FindingKind.SINK_CHANGED,
                    uid,
                    f"a Kafka exactly-once sink in the savepoint, a {spec.system.value} sink in the new job: a sink's "
                    "transactions belong to its system; give the new sink another uid (and --allow-non-restored-state)",
                    Severity.FATAL,
                )
            )
    return findings


# CDC source positions ----------------------------------------------------------------------------


def _check_cdc_sources(graph: LogicalGraph, savepoint: LoadedSavepoint) -> list[Finding]:
    """Each PostgreSQL CDC source of the new job with state in the savepoint: the restore's own decision
    (``weir.core.cdc.redistribute_stored``) at the parallelism the new job runs it at."""
    findings: list[Finding] = []
    plan = build_plan(graph)
    for uid, t in sorted(graph.transformations.items()):
        spec = t.source_spec
        if not isinstance(spec, PostgresCdcSourceSpec):
            continue
        stored = sorted(
            (task.document.subtask, task.operator_states[uid])
            for task in savepoint.tasks
            if uid in task.operator_states
        )
        if not stored:
            continue
        parallelism = next(v.parallelism for v in plan.vertices.values() if uid in v.operator_uids)
        source = f"postgres cdc source {uid!r}"
        try:
            decision = redistribute_stored([data for _, data in stored], spec.slot_name, parallelism, source)
        except (JobDefinitionError, SerializationError) as exc:
            findings.append(Finding(FindingKind.SOURCE_POSITION, uid, str(exc), Severity.FATAL))
            continue
        match decision:
            case Redistributed(states=states):
                if len(stored) != parallelism:
                    phases = ", ".join(f"#{i} {s.phase.value}" for i, s in enumerate(states))
                    findings.append(
                        Finding(
                            FindingKind.SOURCE_POSITION,
                            uid,
                            f"restored from parallelism {len(stored)} at {parallelism}: {phases}",
                            Severity.INFO,
                        )
                    )
            case RedistributionRefused(reason=reason):
                findings.append(Finding(FindingKind.SOURCE_POSITION, uid, reason, Severity.FATAL))
            case _:
                assert_never(decision)
    return findings


# dead-letter topics ------------------------------------------------------------------------------


def _check_dead_letters(graph: LogicalGraph, topic_exists: TopicExists | None) -> list[Finding]:
    topics = dead_letter_topics(graph)
    if not topics:
        return []
    if topic_exists is None:
        names = ", ".join(sorted(topics))
        return [
            Finding(
                FindingKind.DEAD_LETTER_UNCHECKED,
                ", ".join(sorted({u for uids in topics.values() for u in uids})),
                f"dead-letter topic(s) {names} not checked: no Kafka was asked (weir run refuses a missing one)",
                Severity.WARNING,
            )
        ]
    findings: list[Finding] = []
    for topic, uids in topics.items():
        try:
            exists = topic_exists(topic)
        except Exception as exc:  # Kafka does not answer: say so, the check did not run
            findings.append(
                Finding(
                    FindingKind.DEAD_LETTER_UNCHECKED,
                    ", ".join(uids),
                    f"dead-letter topic {topic!r} not checked: {type(exc).__name__}: {exc}",
                    Severity.WARNING,
                )
            )
            continue
        if not exists:
            findings.append(
                Finding(
                    FindingKind.DEAD_LETTER_TOPIC_MISSING,
                    ", ".join(uids),
                    f"dead-letter topic {topic!r} does not exist: a rejected record could not be kept; create it first",
                    Severity.FATAL,
                )
            )
    return findings


# keyed state ------------------------------------------------------------------------------------


def _declared_schemas(t: Transformation) -> tuple[KeyedOperator | None, tuple[StateSchema, ...]]:
    operator = t.factory()  # builds the operator only; it is not opened
    if isinstance(operator, KeyedOperator):
        return operator, operator.state_schemas()
    return None, ()


def _record_keys(state: str, state_key: bytes) -> tuple[bytes, ...]:
    """The record key bytes an entry's state key may start with: its kind's reading, and for a state
    the layout does not name (a process function's, maybe a MapState) also a key prefix's."""
    first = record_key_of(state, state_key)
    if state in _RUNTIME_STATES:
        return (first,)
    split = split_key_prefix(state_key)
    return (first,) if split is None else (first, split[0])


def _value_key(state: str, value: Any) -> tuple[bool, Any]:
    """The record key a value holds, when its state's values hold one: a window's ``(key, acc)``, a
    timer's ``(key,)``."""
    if state == WINDOW_STATE and isinstance(value, tuple) and len(value) == 2:
        return True, value[0]
    if state in (EVENT_TIMERS, PROCESSING_TIMERS) and isinstance(value, tuple) and len(value) == 1:
        return True, value[0]
    return False, None


def _entries(savepoint: LoadedSavepoint, uid: str, work_dir: Path) -> Iterator[tuple[str, KeyedEntry]]:
    """Every stored entry of keyed operator ``uid``, with the task it is read from."""
    for task in savepoint.tasks:
        if task.keyed is None:
            continue
        ranges = [r for u, r in task.keyed.ranges if u == uid]
        if not ranges:
            continue
        where = f"{savepoint.what}: task {task.name}"
        with open_keyed_snapshot(savepoint.storage, task.keyed, work_dir, where) as db:
            for key_groups in ranges:
                for entry in scan_entries(db, uid, key_groups, values=True):
                    yield task.name, entry


def _check_window_layout(uid: str, operator: WindowAggregateOperator, savepoint: LoadedSavepoint) -> list[Finding]:
    """A window operator's state layout (operators/windows.py): sliced sliding windows restore only
    into slices of the same width; per-window accumulators (format 1) into either."""
    layouts: set[int | None] = set()
    for task in savepoint.tasks:
        data = task.operator_states.get(uid)
        if data is None:
            continue
        try:
            layouts.add(decode_window_document(data)[1])
        except SerializationError as exc:
            return [Finding(FindingKind.STATE_SCHEMA, uid, str(exc), Severity.FATAL)]
    now = f"slices of {operator.slice_ms} ms" if operator.slice_ms else "one accumulator per window"
    findings = []
    for slice_ms in sorted(w for w in layouts if w is not None):
        if slice_ms != operator.slice_ms:
            reason = (
                f"the savepoint's sliding windows keep slices of {slice_ms} ms, the new job's keep {now} (window "
                "size, slide or the aggregate's merge changed): the restore would fail; keep them as they were"
            )
            findings.append(Finding(FindingKind.STATE_SCHEMA, uid, reason, Severity.FATAL))
    if None in layouts and operator.slice_ms:
        reason = (
            f"the savepoint's windows keep one accumulator each, the new job's sliding windows keep {now}: "
            "restored windows keep their accumulators until cleaned up, merged with new slices as they fire"
        )
        findings.append(Finding(FindingKind.STATE_SCHEMA, uid, reason, Severity.INFO))
    return findings


def _check_keyed_operator(
    uid: str,
    t: Transformation,
    savepoint: LoadedSavepoint,
    documents: Sequence[TaskStateDocument],
    max_parallelism: int | None,
    work_dir: Path,
) -> tuple[list[Finding], int, int]:
    """Schemas, then every stored value: unpickled, migrated, its key re-hashed (``max_parallelism``
    None: the key groups cannot map anyway, a finding says so already)."""
    findings: list[Finding] = []
    operator, declared = _declared_schemas(t)
    if isinstance(operator, WindowAggregateOperator):
        findings += _check_window_layout(uid, operator, savepoint)
    declared_by_name = {s.name: s for s in declared}
    stored = merge_stored_schemas(uid, (d.layout.state_schemas.get(uid, ()) for d in documents))
    try:
        migrations = required_migrations(uid, stored, declared)
    except StateSchemaError as exc:
        findings.append(Finding(FindingKind.STATE_SCHEMA, uid, str(exc), Severity.FATAL))
        migrations = {}
    unpickle_failed = migrate_failed = False
    moved = 0
    first_moved = ""
    undeclared: dict[str, int] = defaultdict(int)
    checked = 0
    samples = _KeySamples(uid, operator, t, max_parallelism)
    for task_name, entry in _entries(savepoint, uid, work_dir):
        name = entry.state
        if name == KEY_SAMPLE_STATE:
            samples.check(entry, task_name)
            continue
        checked += 1
        if name not in declared_by_name and name not in _RUNTIME_STATES and declared:
            undeclared[name] += 1
        at = f"state {name!r} key {describe_state_key(name, entry.key)!r} in key group {entry.key_group} ({task_name})"
        entry_moved = max_parallelism is not None and entry.key_group not in {
            key_group_for(k, max_parallelism) for k in _record_keys(name, entry.key)
        }
        if entry_moved:
            moved += 1
            first_moved = first_moved or at
        try:
            value = load_value(entry.value)
        except Exception as exc:
            if not unpickle_failed:
                unpickle_failed = True
                findings.append(
                    Finding(
                        FindingKind.CLASS_NOT_IMPORTABLE,
                        uid,
                        f"{at}: the stored value does not unpickle: {type(exc).__name__}: {exc}; keep the classes "
                        "state values name importable where they were (a module of the job's, not the job file)",
                        Severity.FATAL,
                    )
                )
            continue
        holds_key, key = _value_key(name, value)
        if holds_key and max_parallelism is not None:
            rehashed: int
            try:
                rehashed = key_group_for_key(key, max_parallelism)
            except Exception:  # a key with no stable encoding any more
                rehashed = -1
            if rehashed != entry.key_group and not entry_moved:
                moved += 1
                first_moved = first_moved or f"{at} (the key {key!r} it holds hashes to {rehashed})"
        if name in migrations and not migrate_failed:
            schema = declared_by_name[name]
            assert operator is not None  # a migration needs a declared schema, which only a keyed operator has
            try:
                operator.migrate_value(schema, migrations[name], value)
            except Exception as exc:
                migrate_failed = True
                findings.append(
                    Finding(
                        FindingKind.MIGRATION_FAILED,
                        uid,
                        f"{at}: migrate from version {migrations[name]} to {schema.version} raised "
                        f"{type(exc).__name__}: {exc} on {value!r:.200}; fix the migration",
                        Severity.FATAL,
                    )
                )
    findings += samples.findings()
    if moved:
        findings.append(
            Finding(
                FindingKind.KEY_GROUP_MOVED,
                uid,
                f"{moved} stored entr{'y' if moved == 1 else 'ies'} would hash to another key group in the new job, "
                f"so it would never read them again, e.g. {first_moved}; restore with the Weir (key encoding) that "
                "wrote them",
                Severity.FATAL,
            )
        )
    for name, count in sorted(undeclared.items()):
        findings.append(
            Finding(
                FindingKind.STATE_NAME,
                uid,
                f"state {name!r} ({count} entries) is stored, the new operator declares only "
                f"{', '.join(map(repr, sorted(declared_by_name)))}: it is kept but nothing declares it",
                Severity.WARNING,
            )
        )
    return findings, checked, samples.count


class _KeySamples:
    """The key samples of one keyed operator (``weir.core.key_samples``) run through the new job's
    key function: a sample whose record gets another key (or makes the key function raise) is state
    the new job would not find; a changed fingerprint with every sample agreeing is a note."""

    def __init__(
        self, uid: str, operator: KeyedOperator | None, t: Transformation, max_parallelism: int | None
    ) -> None:
        self._uid = uid
        self._operator = operator
        self._t = t
        self._max_parallelism = max_parallelism
        self.count = 0
        self._changed = 0
        self._first_changed = ""
        self._unreadable = ""
        self._old_fingerprints: dict[int, set[str]] = defaultdict(set)

    def _key_function(self, input_index: int) -> Callable[[Any], Any] | None:
        if self._operator is not None:
            try:
                return self._operator.key_selector_of(input_index)
            except IndexError:
                return None
        return self._t.key_selector if input_index == 0 else None

    def check(self, entry: KeyedEntry, task_name: str) -> None:
        at = f"key sample in key group {entry.key_group} ({task_name})"
        try:
            sample = KeySample.from_stored(load_value(entry.value))
            record = load_value(sample.record)
        except Exception as exc:
            self._unreadable = self._unreadable or f"{at}: {type(exc).__name__}: {exc}"
            return
        self.count += 1
        self._old_fingerprints[sample.input_index].add(sample.fingerprint)
        key_function = self._key_function(sample.input_index)
        if key_function is None:
            return  # an input the new operator does not have: the uid/kind findings say so
        try:
            new_key = key_function(record)
            new_bytes = key_to_bytes(new_key)
        except Exception as exc:
            self._note_changed(
                f"{at}: record {record!r:.200}: the old key function gave key {sample.key_repr}, the new one "
                f"raises {type(exc).__name__}: {exc}"
            )
            return
        if new_bytes == sample.key_bytes:
            return
        moves = ""
        if self._max_parallelism is not None:
            old_group = key_group_for(sample.key_bytes, self._max_parallelism)
            new_group = key_group_for(new_bytes, self._max_parallelism)
            moves = (
                f" (key group {old_group} -> {new_group}: another key group)"
                if old_group != new_group
                else f" (the same key group {old_group}, another key)"
            )
        self._note_changed(
            f"{at}: record {record!r:.200} had key {sample.key_repr}, the new key function gives "
            f"{new_key!r:.200}{moves}"
        )

    def _note_changed(self, what: str) -> None:
        self._changed += 1
        self._first_changed = self._first_changed or what

    def findings(self) -> list[Finding]:
        uid = self._uid
        out: list[Finding] = []
        if self._changed:
            out.append(
                Finding(
                    FindingKind.KEY_FUNCTION_CHANGED,
                    uid,
                    f"the new key function keys {self._changed} of {self.count} sampled records differently, "
                    f"e.g. {self._first_changed}: the state of the old keys would never be read again (silent "
                    "loss); keep the key function, or give the operator a new uid and rebuild its state",
                    Severity.FATAL,
                )
            )
        elif self.count == 0:
            out.append(
                Finding(
                    FindingKind.KEY_FUNCTION_UNSAMPLED,
                    uid,
                    "no key samples in the savepoint (it saw no records, or an earlier Weir wrote it): the new "
                    "key function is not checked"
                    + (f"; a sample did not read: {self._unreadable}" if self._unreadable else ""),
                    Severity.WARNING,
                )
            )
        else:
            rewritten = []
            for input_index, old in sorted(self._old_fingerprints.items()):
                key_function = self._key_function(input_index)
                if key_function is not None and key_function_fingerprint(key_function) not in old:
                    rewritten.append(input_index)
            if rewritten:
                out.append(
                    Finding(
                        FindingKind.KEY_FUNCTION_REWRITTEN,
                        uid,
                        f"the key function's code changed (input {', '.join(map(str, rewritten))}), and it gives "
                        f"each of the {self.count} sampled records its old key: records never sampled are not "
                        "checked",
                        Severity.INFO,
                    )
                )
        return out


@contextmanager
def _scratch(work_dir: Path | None) -> Iterator[Path]:
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        yield work_dir
        return
    with tempfile.TemporaryDirectory(prefix="weir-upgrade-check-") as directory:
        yield Path(directory)


def upgrade_check(
    job_file: str | Path,
    savepoint_path: str,
    *,
    parameters: Mapping[str, str] | None = None,
    parallelism: int = 1,
    allow_non_restored_state: bool = False,
    topic_exists: TopicExists | None = None,
    endpoints: Endpoints | None = None,
    work_dir: Path | None = None,
) -> UpgradeReport:
    """Load the new job's graph from its file (in this process: its ``migrate`` functions run here)
    and check it against the savepoint at ``savepoint_path``. A job file that does not load and a path
    with no savepoint are the user's errors (raised, not findings)."""
    loaded = load_job_file(job_file, parameters, parallelism)
    savepoint = load_savepoint(savepoint_path, endpoints)
    return check_upgrade(
        loaded.graph,
        savepoint,
        job=str(job_file),
        allow_non_restored_state=allow_non_restored_state,
        topic_exists=topic_exists,
        work_dir=work_dir,
    )


def check_before_run(
    code: JobCode,
    savepoint_path: str,
    *,
    full_report: str,
    parameters: Mapping[str, str] | None = None,
    parallelism: int = 1,
    allow_non_restored_state: bool = False,
    endpoints: Endpoints | None = None,
) -> UpgradeReport:
    """What ``weir run --from-savepoint`` runs before it submits: the same check, over the code it is
    about to ship (a job file or an artifact, loaded in this process). Dead-letter topics are left to
    the JobManager's submit checks. Raises :class:`UpgradeRefusedError`, one line naming the first fatal
    reason and ``full_report`` (the command that prints every finding), on FAIL; answers the report
    on PASS. Flink refuses the same restores only once the job is deployed (``StateAssignmentOperation``);
    checking here refuses them before anything is submitted."""
    loaded = load_job(code, parameters, parallelism)
    savepoint = load_savepoint(savepoint_path, endpoints)
    match code:
        case SourceCode(file_name=job):
            pass
        case PreparedArtifact(manifest=manifest):
            job = manifest.entry_name
        case unreachable:
            assert_never(unreachable)
    report = check_upgrade(loaded.graph, savepoint, job=job, allow_non_restored_state=allow_non_restored_state)
    unchecked = FindingKind.DEAD_LETTER_UNCHECKED  # the JobManager checks them at submit
    report = dataclasses.replace(report, findings=tuple(f for f in report.findings if f.kind is not unchecked))
    if not report.passed:
        raise UpgradeRefusedError(
            f"the upgrade check refuses this restore: {report.summary()}; the full report: {full_report} "
            "(--skip-upgrade-check submits it anyway)"
        )
    return report
