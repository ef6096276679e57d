"""The keyed aggregation job, as every scenario that runs it sees it: defined once.

examples/keyed_aggregation.py (and its variants: upgrade_v1.py, upgrade_v2.py and
slow_sink_aggregation.py keep its uids and parameter names) reads JSON events from a Kafka topic,
dead-letters the malformed ones, keys them, aggregates ``(count, sum)`` per key and tumbling
event-time window, and writes each window's result to the transactional Kafka sink and the
two-phase-commit PostgreSQL sink. This module holds what the scenarios and their tests need of it:

- the uids of its operators, its topics and table (:class:`KeyedJob`) and its ``-D`` parameters;
- the **reference**: each (key, window)'s count and sum computed from the input read back, with a
  function of its own (not the job's code: the checker is the specification), and the comparison of
  what a sink or the state holds with the windows it must hold (duplicates, missing, unexpected,
  mismatched, by whole results);
- what the run leaves, read back: the input, the sinks' records and rows, the sinks' commit proofs,
  and the cut a savepoint holds (each partition's position, each window subtask's watermark), with
  the decoders a restore uses.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

from weir.connectors import kafka, postgres
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.keygroups import KeyGroupRange, key_group_for_key
from weir.core.paths import locate_state
from weir.core.task_state import decode_task_state, read_operator_states
from weir.core.windows import window_start
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.operators.sources import merge_kafka_source_states
from weir.operators.transactional_sinks import CommitMarker
from weir.operators.windows import decode_window_state
from weir.scenarios.framework import EXAMPLES, JobSpec, Samples, ScenarioError
from weir.tools.verify import CommitProof, ProofEntry, last_commits, sink_transaction

JOB_FILE: Final = EXAMPLES / "keyed_aggregation.py"
SOURCE_UID: Final = "events-source"
PROJECT_UID: Final = "key-value"
WINDOW_UID: Final = "window-count-sum"
KAFKA_SINK_UID: Final = "kafka-sink"
POSTGRES_SINK_UID: Final = "postgres-sink"
UIDS: Final = (SOURCE_UID, PROJECT_UID, WINDOW_UID, KAFKA_SINK_UID, POSTGRES_SINK_UID)
COLUMNS: Final = ("key", "window_start", "window_end", "count", "sum")
TABLE_DEFINITION: Final = (
    "key text, window_start bigint, window_end bigint, count bigint, sum bigint, PRIMARY KEY (key, window_start)"
)

WindowKey = tuple[str, int]  # (key, window start)


@dataclass(frozen=True)
class KeyedJob:
    """The job's topics and table, and how it runs: what its ``-D`` parameters say.

    ``table`` None: a variant without the PostgreSQL sink (slow_sink_aggregation.py).
    ``records_per_second`` 0: the source is not throttled. ``restart_delay`` None: the default restart
    strategy; otherwise fixed-delay restarts with that delay."""

    source_topic: str = "keyed-events"
    sink_topic: str = "keyed-results"
    dlq_topic: str = "keyed-dlq"
    table: str | None = "keyed_results"
    window_ms: int = 1000
    checkpoint_interval: str = "1s"
    bounded: bool = False
    records_per_second: int = 0
    restart_delay: str | None = None
    file: Path = JOB_FILE

    @classmethod
    def named(cls, prefix: str, **settings: Any) -> KeyedJob:
        """Topics ``PREFIX-events``, ``PREFIX-results``, ``PREFIX-dlq`` and table ``PREFIX_results``
        (a test gives each run a prefix of its own)."""
        return cls(
            source_topic=f"{prefix}-events",
            sink_topic=f"{prefix}-results",
            dlq_topic=f"{prefix}-dlq",
            table=f"{prefix.replace('-', '_')}_results",
        ).with_(**settings)

    def with_(self, **settings: Any) -> KeyedJob:
        return replace(self, **settings)

    def parameters(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        params = {
            "source.topic": self.source_topic,
            "sink.topic": self.sink_topic,
            "source.dlq_topic": self.dlq_topic,
            "source.bounded": "true" if self.bounded else "false",
            "window.size_ms": str(self.window_ms),
            "checkpointing.interval": self.checkpoint_interval,
        }
        if self.table is not None:
            params["sink.table"] = self.table
        if self.records_per_second:
            params["source.records_per_second"] = str(self.records_per_second)
        if self.restart_delay is not None:
            params |= {"restart.strategy": "fixed-delay", "restart.delay": self.restart_delay}
        return params | dict(extra or {})

    def spec(
        self, parallelism: int, *, from_savepoint: str | None = None, extra: Mapping[str, str] | None = None
    ) -> JobSpec:
        return JobSpec(self.file, self.parameters(extra), parallelism, from_savepoint)

    def topics(self, partitions: int, sink_partitions: int = 3) -> dict[str, int]:
        return {self.source_topic: partitions, self.sink_topic: sink_partitions, self.dlq_topic: 1}

    def recreate(
        self,
        endpoints: Endpoints,
        partitions: int,
        sink_partitions: int = 3,
        table_definition: str = TABLE_DEFINITION,
    ) -> None:
        """The topics, empty, and the table (when the job has one) as ``CREATE TABLE table (definition)``."""
        kafka.create_topics(endpoints, self.topics(partitions, sink_partitions), replace=True)
        if self.table is not None:
            postgres.replace_table(endpoints, self.table, table_definition)

    def describe(self, partitions: int) -> str:
        table = f" and table {self.table}" if self.table is not None else ""
        return f"topics {self.source_topic} ({partitions} partitions), {self.sink_topic}, {self.dlq_topic}{table}"


# The input and the reference (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    key: str
    value: int
    ts: int


@dataclass(frozen=True)
class InputRecord:
    """A record of the input topic as read back: its position and the event, None when malformed."""

    partition: int
    offset: int
    event: Event | None


@dataclass(frozen=True)
class WindowResult:
    """One (key, window)'s aggregate, as the reference computes it or a sink or the state holds it."""

    key: str
    start: int
    end: int
    count: int
    sum: int

    @property
    def window(self) -> WindowKey:
        return (self.key, self.start)


def parse_input(value: bytes | None) -> Event | None:
    """The event in an input record, None when it is not a well-formed event: a JSON object with a str
    ``id`` and ``key`` and int ``value`` and ``ts`` (the job's rule, stated again: the checker is the spec)."""
    try:
        doc = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    kinds = {"id": str, "key": str, "value": int, "ts": int}
    if any(type(doc.get(name)) is not kind for name, kind in kinds.items()):
        return None
    return Event(doc["key"], doc["value"], doc["ts"])


def reference_windows(events: Iterable[Event], window_ms: int) -> dict[WindowKey, WindowResult]:
    """Each (key, tumbling window)'s count and sum over the events."""
    acc: dict[WindowKey, list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        a = acc[(e.key, window_start(e.ts, 0, window_ms))]
        a[0] += 1
        a[1] += e.value
    return {(k, s): WindowResult(k, s, s + window_ms, n, total) for (k, s), (n, total) in sorted(acc.items())}


def window_of(value: bytes | None) -> WindowKey | None:
    """The (key, window start) a results record is for; None for a record that does not parse."""
    try:
        doc = json.loads(value or b"")
        return (str(doc["key"]), int(doc["window_start"]))
    except (ValueError, KeyError, TypeError):
        return None


R = TypeVar("R")


@dataclass(frozen=True)
class Comparison(Generic[R]):
    """What one place (a sink, the state) holds against the windows it must hold: per window the
    results found (a whole result compared, never a count), and what does not fit."""

    place: str
    expected: int
    by_window: Mapping[WindowKey, tuple[R, ...]]
    unreadable: int  # entries that do not parse as a result: counted as unexpected too
    duplicates: int
    missing: int
    unexpected: int
    mismatched: int
    samples: tuple[str, ...] = ()

    @property
    def found(self) -> int:
        """Entries, records or rows read, unreadable ones included."""
        return sum(len(r) for r in self.by_window.values()) + self.unreadable

    @property
    def windows(self) -> frozenset[WindowKey]:
        return frozenset(self.by_window)

    def problems(self) -> list[str]:
        counts = (
            (self.duplicates, "duplicate(s)"),
            (self.missing, "missing"),
            (self.unexpected, "unexpected"),
            (self.mismatched, "mismatched"),
        )
        return [f"{n} {label}" for n, label in counts if n]

    @property
    def exact(self) -> bool:
        return not self.problems() and self.found == self.expected

    def numbers(self) -> str:
        return (
            f"{self.found:,} found = {self.expected:,} expected; {self.duplicates} duplicates, "
            f"{self.missing} missing, {self.unexpected} unexpected, {self.mismatched} mismatched"
        )

    def figures(self) -> dict[str, int]:
        """The counts, for a check's numbers."""
        return {
            "found": self.found,
            "expected": self.expected,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "mismatched": self.mismatched,
        }


def compare_windows(
    place: str,
    expected: Mapping[WindowKey, R],
    found: Iterable[R | None],
    window: Callable[[R], WindowKey | None],
    samples: int = 5,
) -> Comparison[R]:
    """Per window exactly the expected result, once (``None`` in ``found``, or a result ``window``
    cannot place: an entry that does not parse)."""
    by_window: dict[WindowKey, list[R]] = defaultdict(list)
    shown = Samples(samples)
    unreadable = 0
    for r in found:
        w = None if r is None else window(r)
        if r is None or w is None:
            unreadable += 1
            shown.add(f"unreadable: {r!r}")
            continue
        by_window[w].append(r)
    duplicates = mismatched = 0
    for w, results in sorted(by_window.items()):
        if len(results) > 1:
            duplicates += len(results) - 1
            shown.add(f"duplicate: {w} found {len(results)}x")
        want = expected.get(w)
        if want is not None and any(r != want for r in results):
            mismatched += 1
            shown.add(f"mismatched: {w}: expected {want}, found {results}")
    missing = [w for w in expected if w not in by_window]
    unexpected = [w for w in by_window if w not in expected]
    for w in missing:
        shown.add(f"missing: {expected[w]}")
    for w in unexpected:
        shown.add(f"unexpected: {by_window[w]}")
    return Comparison(
        place=place,
        expected=len(expected),
        by_window={w: tuple(rs) for w, rs in by_window.items()},
        unreadable=unreadable,
        duplicates=duplicates,
        missing=len(missing),
        unexpected=len(unexpected) + unreadable,
        mismatched=mismatched,
        samples=tuple(shown.lines),
    )


def compare_results(
    place: str, expected: Mapping[WindowKey, WindowResult], found: Iterable[WindowResult | None]
) -> Comparison[WindowResult]:
    """:func:`compare_windows` for the job's (count, sum) results."""
    return compare_windows(place, expected, found, lambda r: r.window)


def counted(c: Comparison[WindowResult]) -> int:
    """Σ count over the entries found (each entry once, duplicates included)."""
    return sum(r.count for results in c.by_window.values() for r in results)


# What the run leaves, read back ------------------------------------------------------------------------


def sink_record(value: bytes | None) -> WindowResult | None:
    """A Kafka result record, None when it is not one."""
    try:
        doc = json.loads(value or b"")
        return WindowResult(
            str(doc["key"]), int(doc["window_start"]), int(doc["window_end"]), int(doc["count"]), int(doc["sum"])
        )
    except (ValueError, KeyError, TypeError):
        return None


def sink_row(row: Sequence[Any]) -> WindowResult | None:
    """A PostgreSQL row of COLUMNS, None when a value is missing."""
    key, start, end, count, total = row
    if None in (key, start, end, count, total):
        return None
    return WindowResult(str(key), int(start), int(end), int(count), int(total))


def read_input(endpoints: Endpoints, topic: str) -> list[InputRecord]:
    """Every record of the input topic (read_committed), with its position, parsed by the job's rule."""
    return [
        InputRecord(partition, offset, parse_input(value))
        for partition, offset, _key, value, _ts in kafka.read_committed_records(endpoints, topic)
    ]


def read_kafka_results(endpoints: Endpoints, topic: str) -> list[WindowResult | None]:
    """The results topic as a read_committed consumer sees it."""
    return [sink_record(value) for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, topic)]


def read_postgres_results(endpoints: Endpoints, table: str) -> list[WindowResult | None]:
    with postgres.connect(endpoints, autocommit=True) as conn:
        rows = postgres.fetch_rows(conn, table, COLUMNS)
    return [sink_row(r) for r in rows]


# The sinks' commit proofs --------------------------------------------------------------------------------


def marker_entries(records: Iterable[tuple[bytes | None, int]], operator_uid: str) -> list[ProofEntry]:
    """The Kafka sink's commit proof: the commit markers (``CommitMarker``) of ``operator_uid`` among a
    marker topic's records, given as (value, timestamp ms)."""
    entries: list[ProofEntry] = []
    for value, at_ms in records:
        m = CommitMarker.parse(value)
        if m is not None and m.operator_uid == operator_uid:
            entries.append(ProofEntry(m.job_id, m.operator_uid, m.subtask, m.checkpoint_id, m.records, at_ms))
    return entries


def postgres_proof_entries(rows: Iterable[Sequence[Any]]) -> list[ProofEntry]:
    """The PostgreSQL sink's commit proof: ``weir_sink_commits`` rows (job, uid, subtask, checkpoint,
    rows, ...) as entries."""
    return [ProofEntry(str(job), str(uid), int(st), int(cp), int(n or 0), 0) for job, uid, st, cp, n, *_ in rows]


def proof_of(source: str, entries: Sequence[ProofEntry], job_id: str, operator_uid: str) -> CommitProof:
    """One sink's commit proof in one job, as ``weir verify`` builds it: per subtask its last commit."""
    commits = last_commits(entries, job_id, operator_uid)
    if not commits:
        return CommitProof(source, job_id, missing_reason=f"no entries for {operator_uid} of job {job_id}")
    return CommitProof(source, job_id, commits)


def committed_checkpoints(entries: Iterable[ProofEntry], job_id: str, operator_uid: str, subtask: int) -> set[int]:
    """Every checkpoint one sink subtask committed in the job, by its proof."""
    return {
        e.checkpoint_id
        for e in entries
        if e.job_id == job_id and e.operator_uid == operator_uid and e.subtask == subtask
    }


def prepared_epochs(gids: Iterable[str], operator_uid: str, job_id: str) -> dict[int, tuple[int, ...]]:
    """Per subtask of the sink, the epochs (checkpoint ids) of its transactions prepared now."""
    found: dict[int, list[int]] = {}
    for gid in gids:
        txn = sink_transaction(gid, operator_uid, job_id)
        if txn is not None:
            found.setdefault(int(txn.subtask), []).append(int(txn.checkpoint_id))
    return {subtask: tuple(sorted(epochs)) for subtask, epochs in sorted(found.items())}


# The cut a savepoint holds -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowWatermark:
    """A window subtask's key groups and the watermark it had reached at the savepoint."""

    subtask: int
    key_groups: KeyGroupRange
    watermark: int


@dataclass(frozen=True)
class SavepointCut:
    """Where the job stopped: each partition's next offset, each window subtask's watermark."""

    next_offsets: Mapping[int, int]
    window_watermarks: tuple[WindowWatermark, ...]
    max_parallelism: int = 128
    path: str = ""
    job_id: str = ""
    savepoint_id: int = 0
    window_state_schemas: tuple[str, ...] = ()

    def before(self, partition: int, offset: int) -> bool:
        """Whether the job read the record before the cut (a partition it never read starts at 0)."""
        return offset < self.next_offsets.get(partition, 0)

    def watermark_of(self, key: str) -> int:
        """The watermark of the window subtask that held ``key``."""
        group = key_group_for_key(key, self.max_parallelism)
        for w in self.window_watermarks:
            if group in w.key_groups:
                return w.watermark
        raise ScenarioError(f"no window subtask of the savepoint holds key group {group} (key {key!r})")


def read_savepoint(path: str, endpoints: Endpoints | None = None) -> SavepointCut:
    """The cut in the savepoint at ``path`` (a folder URI), read from the storage alone, with the
    decoders a restore uses: the metadata, each task-state document, the Kafka source's positions and
    the window operator's watermark (``weir savepoint info`` shows the rest)."""
    location = locate_state(path)
    storage = open_storage(location.root_uri, endpoints)
    checkpoint = decode_metadata(storage.get_bytes(location.metadata_key), location.metadata_key)
    source_states: list[bytes] = []
    watermarks: list[WindowWatermark] = []
    schemas: tuple[str, ...] = ()
    max_parallelism = 128
    for handle in checkpoint.task_states:
        name = f"{handle.task_id.operator_uid}#{handle.task_id.subtask}"
        document = decode_task_state(handle.inline_payload, f"{path} task {name}")
        states = read_operator_states(document.operator_state, storage.get_bytes)
        if SOURCE_UID in states:
            source_states.append(states[SOURCE_UID])
        if WINDOW_UID in states:
            watermark = decode_window_state(states[WINDOW_UID])
            watermarks.append(WindowWatermark(document.subtask, document.key_group_range, watermark))
            max_parallelism = document.layout.max_parallelism
            declared = document.layout.state_schemas.get(WINDOW_UID, ())
            schemas = tuple(f"{s.name} v{s.version} ({s.serializer})" for s in declared) or ("win v1 (pickle)",)
    if not source_states or not watermarks:
        raise ScenarioError(f"savepoint {path} holds no state of {SOURCE_UID!r} or {WINDOW_UID!r}")
    next_offsets, _ends = merge_kafka_source_states(source_states)
    return SavepointCut(
        next_offsets=next_offsets,
        window_watermarks=tuple(sorted(watermarks, key=lambda w: w.subtask)),
        max_parallelism=max_parallelism,
        path=path,
        job_id=checkpoint.job_id,
        savepoint_id=checkpoint.checkpoint_id,
        window_state_schemas=schemas,
    )
