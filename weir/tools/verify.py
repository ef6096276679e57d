"""``weir verify``: compare what a job's sinks hold with what the job should have written.

The expected output comes from reference mode (:mod:`weir.tools.reference`) over the job's input as it is
now. Each Kafka and PostgreSQL sink is then read and compared:

- Kafka, read_committed up to the last stable offsets: a multiset compare of serialized record values.
  A value found more often than expected is a *duplicate*, one never expected is *unexpected*, an
  expected one found less often is *missing*.
- PostgreSQL, compared by the sink's key columns against the rows its upserts and deletes leave
  (applied in order: the last row per key, none for a key deleted after it): keys absent from the
  table are *missing*, keys the job never wrote are *unexpected*, keys whose other columns differ are
  *mismatched* (and a key found twice, possible only without a primary key, is a *duplicate*). An
  upsert (or a delete) hides a change committed twice, so the commit proofs count them: the changes
  (upserts and deletes) the proofs say were committed, summed over the job's checkpoints, must equal
  the changes the reference writes when it changes each key once (a surplus is that many
  *duplicates*), and lie between the keys changed and the changes otherwise (an epoch keeps one
  change per key).
- Kafka's commit proofs must count exactly the committed records the topic holds.

A sink with expected output and no commit proof of the job is a discrepancy. The proofs are summed over
``job_id`` and ``earlier_job_ids``: the jobs whose output the sinks hold (a job restored from another
one's savepoint or checkpoint continues its output).

Each sink's own commit proof says which checkpoint it committed last, per subtask: the Kafka sinks'
marker records in each sink's own marker topic (``weir-sink-commits.{uid}.{job}.{hash}``, see
``marker_topic_name``; markers of runs before that, in topic ``weir-sink-commits``, are read too) and
the PostgreSQL sinks' rows in table ``weir_sink_commits``,
both written by the transactional sinks in the transaction they commit. The two sinks never commit in
one atomic transaction, so one may be a checkpoint ahead of the other; the report says so.

Verify a bounded job once it FINISHED, with no input produced since it was submitted (reference mode
reads the input as it is now); for an unbounded job, the windows it has not fired yet count as
missing, and the report warns about it.

Transactions left behind are discrepancies: PostgreSQL transactions still prepared whose gid names
the sink in one of the jobs (``pg_prepared_xacts``), and Kafka partitions of a sink topic whose last
stable offset is below the high watermark (an open transaction: see
:data:`KAFKA_OPEN_TRANSACTION_METHOD`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal, assert_never
from urllib.parse import unquote

from weir.api import LoadedJob
from weir.connectors import kafka, postgres
from weir.core.config import Endpoints
from weir.core.errors import Fault, WeirError
from weir.core.ids import JobId, OperatorUid
from weir.core.kafka_config import KafkaClientConfig, kafka_client_config
from weir.operators.transactional_sinks import COMMIT_MARKER_TOPIC, marker_topic_name, marker_topic_prefix
from weir.operators.twophase import TransactionId
from weir.tools.reference import ReferenceResult, SinkCapture, run_loaded, run_reference

COMMIT_PROOF_TOPIC = COMMIT_MARKER_TOPIC  # the shared marker topic of older runs, and the marker topics' prefix
COMMIT_PROOF_TABLE = postgres.COMMIT_PROOF_TABLE
OPEN_TRANSACTION_GRACE_S = 3.0
"""How long a partition may show an open transaction before it counts: a committed transaction's
markers reach the partitions a moment after the commit returns."""
SAMPLES = 5

KAFKA_OPEN_TRANSACTION_METHOD = (
    "last stable offset < high watermark per partition (ListOffsets read_committed vs read_uncommitted); "
    "confluent-kafka's AdminClient has no list_transactions/describe_transactions"
)
POSTGRES_PREPARED_METHOD = "pg_prepared_xacts, gids parsed as weir transaction ids of the sink"

SinkKindName = Literal["kafka", "postgres"]


class VerifyError(WeirError):
    """The job or the sinks it names cannot be verified as given (missing topic or table, ...)."""

    fault: Fault = Fault.USER


@dataclass(frozen=True)
class SubtaskCommit:
    """A sink subtask's last committed checkpoint, from its commit proof."""

    subtask: int
    checkpoint_id: int
    records: int  # records (Kafka) or rows (PostgreSQL) committed with that checkpoint


@dataclass(frozen=True)
class CommitProof:
    source: str  # where the proof was read
    job_id: str | None
    subtasks: tuple[SubtaskCommit, ...] = ()
    missing_reason: str | None = None  # set when there is no proof to show

    @property
    def available(self) -> bool:
        return bool(self.subtasks)

    @property
    def last_committed_checkpoint(self) -> int | None:
        return max((s.checkpoint_id for s in self.subtasks), default=None)


@dataclass(frozen=True)
class OpenTransaction:
    kind: Literal["prepared", "open"]
    detail: str
    gid: str | None = None
    partition: int | None = None


@dataclass(frozen=True)
class SinkReport:
    uid: str
    kind: SinkKindName
    target: str
    expected: int
    found: int
    duplicates: int
    missing: int
    unexpected: int
    mismatched: int
    samples: dict[str, list[str]]
    commit_proof: CommitProof
    open_transactions: tuple[OpenTransaction, ...]
    open_transaction_method: str
    proof_records: int | None = None  # records (rows) the commit proofs count over the job's checkpoints
    proof_problems: tuple[str, ...] = ()  # the proofs against the output: see check_proof_records

    def problems(self) -> list[str]:
        out = [
            f"{n} {label}"
            for n, label in (
                (self.duplicates, "duplicate" if self.duplicates == 1 else "duplicates"),
                (self.missing, "missing"),
                (self.unexpected, "unexpected"),
                (self.mismatched, "mismatched"),
            )
            if n
        ]
        prepared = sum(1 for t in self.open_transactions if t.kind == "prepared")
        opened = sum(1 for t in self.open_transactions if t.kind == "open")
        if prepared:
            out.append(f"{prepared} prepared transaction{'s' if prepared > 1 else ''}")
        if opened:
            out.append(f"{opened} partition{'s' if opened > 1 else ''} with an open transaction")
        return out + list(self.proof_problems)

    @property
    def ok(self) -> bool:
        return not self.problems()


@dataclass(frozen=True)
class SourceReport:
    uid: str
    kind: str
    topic: str | None
    records: int
    dead_lettered: int


@dataclass(frozen=True)
class VerifyReport:
    job_file: str
    job_name: str
    job_id: str | None
    job_id_from: str  # "--job-id", "latest in commit proofs" or "none"
    sources: tuple[SourceReport, ...]
    sinks: tuple[SinkReport, ...]
    skipped_sinks: tuple[str, ...]  # sinks verify cannot read back (print, file, ...)
    reconciliation: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.sinks)

    def discrepancies(self) -> list[str]:
        return [f"{s.uid}: {', '.join(s.problems())}" for s in self.sinks if not s.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "job_file": self.job_file,
            "job_name": self.job_name,
            "job_id": self.job_id,
            "job_id_from": self.job_id_from,
            "discrepancies": self.discrepancies(),
            "sources": [vars(s) for s in self.sources],
            "sinks": [_sink_json(s) for s in self.sinks],
            "skipped_sinks": list(self.skipped_sinks),
            "reconciliation": list(self.reconciliation),
            "warnings": list(self.warnings),
        }


def _sink_json(s: SinkReport) -> dict[str, Any]:
    proof = s.commit_proof
    return {
        "uid": s.uid,
        "kind": s.kind,
        "target": s.target,
        "ok": s.ok,
        "expected": s.expected,
        "found": s.found,
        "duplicates": s.duplicates,
        "missing": s.missing,
        "unexpected": s.unexpected,
        "mismatched": s.mismatched,
        "samples": s.samples,
        "commit_proof": {
            "source": proof.source,
            "available": proof.available,
            "job_id": proof.job_id,
            "last_committed_checkpoint": proof.last_committed_checkpoint,
            "subtasks": [vars(c) for c in proof.subtasks],
            "missing_reason": proof.missing_reason,
            "records": s.proof_records,
            "problems": list(s.proof_problems),
        },
        "open_transactions": {
            "method": s.open_transaction_method,
            "transactions": [vars(t) for t in s.open_transactions],
        },
    }


# Pure comparisons ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    expected: int
    found: int
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    mismatched: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)


TOMBSTONE: Final = b"<tombstone> "
"""How verify shows a Kafka tombstone (a null value): this, then the key it deletes."""


def kafka_compared(key: bytes | None, value: bytes | None) -> bytes:
    """What verify compares of a Kafka record: its value; for a tombstone, which key it deletes."""
    return value if value is not None else TOMBSTONE + (key or b"")


def compare_records(expected: Iterable[bytes | None], found: Iterable[bytes | None]) -> Comparison:
    """Multiset compare of serialized record values (Kafka; ``kafka_compared`` tells tombstones apart)."""
    want = Counter(b"" if v is None else v for v in expected)
    have = Counter(b"" if v is None else v for v in found)
    duplicates = missing = unexpected = 0
    samples: dict[str, list[str]] = {}
    for value, n in have.items():
        if want[value] == 0:
            unexpected += n
            _sample(samples, "unexpected", _show(value))
        elif n > want[value]:
            duplicates += n - want[value]
            _sample(samples, "duplicates", f"{_show(value)} found {n}x, expected {want[value]}x")
    for value, n in want.items():
        if have[value] < n:
            missing += n - have[value]
            _sample(samples, "missing", _show(value))
    return Comparison(sum(want.values()), sum(have.values()), duplicates, missing, unexpected, samples=samples)


def compare_rows(
    expected: Mapping[tuple[Any, ...], tuple[Any, ...]],
    found: Sequence[tuple[Any, ...]],
    key_index: Sequence[int],
) -> Comparison:
    """Compare a table's rows with the rows expected per key (PostgreSQL)."""
    have: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    duplicates = missing = unexpected = mismatched = 0
    samples: dict[str, list[str]] = {}
    for row in found:
        key = tuple(row[i] for i in key_index)
        if key in have:
            duplicates += 1
            _sample(samples, "duplicates", f"key {key!r}")
            continue
        have[key] = row
        want = expected.get(key)
        if want is None:
            unexpected += 1
            _sample(samples, "unexpected", f"{row!r}")
        elif not _same_row(want, row):
            mismatched += 1
            _sample(samples, "mismatched", f"key {key!r}: expected {want!r}, found {row!r}")
    for key, row in expected.items():
        if key not in have:
            missing += 1
            _sample(samples, "missing", f"{row!r}")
    return Comparison(len(expected), len(found), duplicates, missing, unexpected, mismatched, samples)


def _same_row(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))


def _same_value(a: Any, b: Any) -> bool:
    if a == b:
        return True
    numeric = (int, float, Decimal)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)))
    return False


def _show(value: bytes) -> str:
    text = value.decode("utf-8", errors="replace")
    return text if len(text) <= 200 else text[:197] + "..."


def _sample(samples: dict[str, list[str]], kind: str, text: str) -> None:
    bucket = samples.setdefault(kind, [])
    if len(bucket) < SAMPLES:
        bucket.append(text)


@dataclass(frozen=True)
class ProofCount:
    """The commit proofs' record count against a sink's output: ``hidden_duplicates`` rows committed
    more than once (PostgreSQL: the upsert left one), ``problems`` one line per discrepancy."""

    hidden_duplicates: int = 0
    problems: tuple[str, ...] = ()


def check_proof_records(
    kind: SinkKindName, proof_records: int | None, *, found: int, writes: int, keys: int
) -> ProofCount:
    """What the commit proofs count (``proof_records``; None: the job left no proof) against the output.

    Kafka: ``found`` committed records in the topic, each committed with its subtask's marker: the
    markers must count exactly those. PostgreSQL: the reference writes ``writes`` rows over ``keys``
    keys. Each epoch commits one row per key, so when every key is written once the proofs must count
    ``writes`` rows, and a surplus is rows committed again in a later epoch (a replay's duplicate, which
    the upsert hid); when keys are rewritten, the count lies between ``keys`` and ``writes``."""
    if proof_records is None:
        return ProofCount(problems=("no commit proof",) if writes or found else ())
    match kind:
        case "kafka":
            if proof_records != found:
                return ProofCount(
                    problems=(f"commit proofs count {proof_records} records, the topic holds {found} committed",)
                )
            return ProofCount()
        case "postgres":
            if writes == keys:
                if proof_records > writes:
                    return ProofCount(hidden_duplicates=proof_records - writes)
                if proof_records < writes:
                    return ProofCount(
                        problems=(f"commit proofs count {proof_records} rows, the reference writes {writes}",)
                    )
                return ProofCount()
            if not keys <= proof_records <= writes:
                return ProofCount(
                    problems=(
                        f"commit proofs count {proof_records} rows, the reference writes {writes} rows "
                        f"over {keys} keys",
                    )
                )
            return ProofCount()
        case _:
            assert_never(kind)


def committed_by_proofs(entries: Iterable[ProofEntry], job_ids: Sequence[str], operator_uid: str) -> int | None:
    """The records (rows) one sink's commit proofs count over every checkpoint of these jobs; None: no proof."""
    counted = [e.records for e in entries if e.job_id in job_ids and e.operator_uid == operator_uid]
    return sum(counted) if counted else None


@dataclass(frozen=True)
class ProofEntry:
    """One commit of one sink subtask, as its commit proof records it."""

    job_id: str
    operator_uid: str
    subtask: int
    checkpoint_id: int
    records: int
    at_ms: int  # when it was committed (Kafka record timestamp, PostgreSQL committed_at)


def latest_job_id(entries: Iterable[ProofEntry]) -> str | None:
    """The job whose most recent commit is the latest of all."""
    latest: dict[str, int] = {}
    for e in entries:
        latest[e.job_id] = max(latest.get(e.job_id, e.at_ms), e.at_ms)
    return max(latest, key=lambda j: (latest[j], j)) if latest else None


def last_commits(entries: Iterable[ProofEntry], job_id: str, operator_uid: str) -> tuple[SubtaskCommit, ...]:
    """Each subtask's last committed checkpoint of one sink in one job."""
    last: dict[int, SubtaskCommit] = {}
    for e in entries:
        if e.job_id != job_id or e.operator_uid != operator_uid:
            continue
        current = last.get(e.subtask)
        if current is None or e.checkpoint_id > current.checkpoint_id:
            last[e.subtask] = SubtaskCommit(e.subtask, e.checkpoint_id, e.records)
    return tuple(last[s] for s in sorted(last))


def reconcile(sinks: Sequence[tuple[str, CommitProof]]) -> list[str]:
    """Say where the sinks' last committed checkpoints differ: they commit one after the other, never
    in one atomic transaction, so a sink behind commits the missing checkpoint later."""
    with_proof = [(uid, p.last_committed_checkpoint) for uid, p in sinks if p.last_committed_checkpoint is not None]
    lines = [f"{uid}: no commit proof ({p.missing_reason})" for uid, p in sinks if not p.available]
    if not with_proof:
        return lines
    ahead_uid, ahead = max(with_proof, key=lambda item: (item[1], item[0]))
    behind = [(uid, cp) for uid, cp in with_proof if cp < ahead]
    for uid, cp in behind:
        lines.append(
            f"{ahead_uid} committed up to {ahead}, {uid} up to {cp}: "
            f"{uid} will commit {ahead} on recovery/next notification"
        )
    if not behind and len(with_proof) > 1:
        lines.append(f"every sink with a commit proof committed up to checkpoint {ahead}")
    return lines


def sink_transaction(gid: str, operator_uid: str, job_id: str | None) -> TransactionId | None:
    """The transaction ``gid`` names when it belongs to this sink (and this job, when known)."""
    if job_id is None:
        parts = gid.split(":")
        if len(parts) != 5:
            return None
        job_id = unquote(parts[1])
    return TransactionId.parse(gid, job_id=JobId(job_id), operator_uid=OperatorUid(operator_uid))


# Reading the systems ------------------------------------------------------------------------------


def verify_job(
    job_file: str | Path,
    parameters: Mapping[str, str] | None = None,
    *,
    job_id: str | None = None,
    earlier_job_ids: Sequence[str] = (),
    endpoints: Endpoints | None = None,
    commit_topic: str | None = None,
    commit_table: str | None = None,
    open_transaction_grace_s: float = OPEN_TRANSACTION_GRACE_S,
    loaded: LoadedJob | None = None,
) -> VerifyReport:
    """Run the job in reference mode, read its sinks, commit proofs and open transactions; report.
    The proofs are read from ``commit_topic``/``commit_table`` (default: where the sinks write them:
    each Kafka sink's own marker topics, and the shared topic of older runs if it exists).
    ``earlier_job_ids``: the jobs whose output the sinks hold before ``job_id`` restored from them
    (their proofs count, their prepared transactions are left behind too)."""
    endpoints = endpoints or Endpoints.from_env()
    cluster = kafka_client_config(endpoints, parameters or {})  # the job's Kafka settings, as its tasks have them
    commit_table = commit_table or COMMIT_PROOF_TABLE
    # ``loaded``: the job already loaded (one of many files, from its artifact); else the job file.
    reference = (
        run_loaded(loaded, parameters, endpoints=endpoints)
        if loaded is not None
        else run_reference(job_file, parameters, endpoints=endpoints)
    )
    kafka_sinks = [c for c in reference.sinks.values() if c.description.kind == "kafka"]
    postgres_sinks = [c for c in reference.sinks.values() if c.description.kind == "postgres"]
    skipped = tuple(
        f"{c.uid} ({c.description.kind})"
        for c in reference.sinks.values()
        if c.description.kind not in ("kafka", "postgres")
    )

    if earlier_job_ids and job_id is None:
        raise VerifyError("earlier job ids need the job id of the run that restored from them")
    kafka_proof_topics = _kafka_proof_topics(
        cluster, commit_topic, [c.uid for c in kafka_sinks], None if job_id is None else (job_id, *earlier_job_ids)
    )
    sink_clusters = {c.uid: cluster.merged(c.description.kafka_properties) for c in kafka_sinks}
    kafka_proofs = _kafka_proofs(sink_clusters, kafka_proof_topics, open_transaction_grace_s)
    conn = postgres.connect(endpoints, autocommit=True) if postgres_sinks else None
    try:
        pg_proofs, pg_proof_missing = (
            _postgres_proofs(conn, commit_table, [c.uid for c in postgres_sinks]) if conn is not None else ([], None)
        )
        job_id_from = "--job-id"
        if job_id is None:
            job_id = latest_job_id([*kafka_proofs, *pg_proofs])
            job_id_from = "latest in commit proofs" if job_id is not None else "none"
        jobs = () if job_id is None else (job_id, *earlier_job_ids)
        reports: list[SinkReport] = []
        for capture in kafka_sinks:
            topics = _job_topics(kafka_proof_topics[capture.uid], commit_topic, capture.uid, jobs)
            missing = None if topics else _no_marker_topic(commit_topic, capture.uid, job_id)
            proof = _proof(_topics_source(topics, commit_topic), kafka_proofs, missing, job_id, capture.uid)
            counted = committed_by_proofs(kafka_proofs, jobs, capture.uid)
            reports.append(
                _verify_kafka_sink(sink_clusters[capture.uid], capture, proof, counted, open_transaction_grace_s)
            )
        prepared = postgres.prepared_transactions(conn) if conn is not None else []
        for capture in postgres_sinks:
            assert conn is not None
            proof = _proof(f"postgres table {commit_table}", pg_proofs, pg_proof_missing, job_id, capture.uid)
            counted = committed_by_proofs(pg_proofs, jobs, capture.uid)
            reports.append(_verify_postgres_sink(conn, capture, proof, counted, prepared, jobs))
        foreign = _foreign_prepared(prepared, [c.uid for c in postgres_sinks], jobs)
    finally:
        if conn is not None:
            conn.close()

    return VerifyReport(
        job_file=str(job_file),
        job_name=reference.job_name,
        job_id=job_id,
        job_id_from=job_id_from,
        sources=_sources(reference),
        sinks=tuple(reports),
        skipped_sinks=skipped,
        reconciliation=tuple(reconcile([(r.uid, r.commit_proof) for r in reports])),
        warnings=tuple(
            _warnings(reference)
            + foreign
            + (["the job has no Kafka or PostgreSQL sink to verify"] if not reports else [])
        ),
    )


def _sources(reference: ReferenceResult) -> tuple[SourceReport, ...]:
    return tuple(
        SourceReport(s.uid, s.kind, s.topic, s.records, len(s.dead_letters)) for s in reference.sources.values()
    )


def _warnings(reference: ReferenceResult) -> list[str]:
    out = [
        f"source {s.uid!r} is unbounded in the job: windows a running job has not fired yet count as missing"
        for s in reference.sources.values()
        if not s.job_bounded
    ]
    out += [
        f"reference mode dropped {n} late record(s) in {uid!r}: which records are late depends on how "
        "partitions interleave and when watermarks arrive, so a correct cluster run may differ"
        for uid, n in reference.late_records.items()
        if n
    ]
    return out


def _kafka_proof_topics(
    cluster: KafkaClientConfig, commit_topic: str | None, uids: Sequence[str], job_ids: Sequence[str] | None
) -> dict[str, list[str]]:
    """Per Kafka sink uid, the existing topics that may hold its commit markers: ``commit_topic`` when
    given; else the sink's marker topics in ``job_ids`` (in every job when no job id is given: the
    markers tell the latest) and the shared topic of older runs."""
    if not uids:
        return {}
    if commit_topic is not None:
        present = kafka.topic_partition_count(cluster, commit_topic) is not None
        return {uid: [commit_topic] if present else [] for uid in uids}
    marker_topics = kafka.list_topic_names(cluster, f"{COMMIT_PROOF_TOPIC}.")
    legacy = [COMMIT_PROOF_TOPIC] if kafka.topic_partition_count(cluster, COMMIT_PROOF_TOPIC) is not None else []
    found: dict[str, list[str]] = {}
    for uid in uids:
        if job_ids is not None:
            own = [name for name in marker_topics if name in {marker_topic_name(j, uid) for j in job_ids}]
        else:
            own = [name for name in marker_topics if name.startswith(marker_topic_prefix(uid))]
        found[uid] = own + legacy
    return found


def _job_topics(topics: Sequence[str], commit_topic: str | None, uid: str, job_ids: Sequence[str]) -> list[str]:
    """Of the topics read for a sink, those that can hold its markers in ``job_ids`` (all: none known)."""
    if commit_topic is not None or not job_ids:
        return list(topics)
    own = {marker_topic_name(j, uid) for j in job_ids}
    return [name for name in topics if name in own or name == COMMIT_PROOF_TOPIC]


def _no_marker_topic(commit_topic: str | None, uid: str, job_id: str | None) -> str:
    if commit_topic is not None:
        return f"topic {commit_topic} does not exist"
    if job_id is not None:
        return f"topic {marker_topic_name(job_id, uid)} does not exist"
    return f"no marker topic {marker_topic_prefix(uid)}* exists"


def _topics_source(topics: Sequence[str], commit_topic: str | None) -> str:
    if not topics:
        return f"kafka topic {commit_topic or COMMIT_PROOF_TOPIC}"
    return f"kafka topic{'s' if len(topics) > 1 else ''} {', '.join(topics)}"


def _kafka_proofs(
    clusters: Mapping[str, KafkaClientConfig], topics: Mapping[str, Sequence[str]], grace_s: float
) -> list[ProofEntry]:
    """The commit proofs of these sinks in these topics (a topic read once for all sinks it may hold,
    with the Kafka settings of the first of them: ``clusters`` by sink uid)."""
    entries: list[ProofEntry] = []
    for topic in sorted({topic for names in topics.values() for topic in names}):
        wanted = {uid for uid, names in topics.items() if topic in names}
        entries += _kafka_topic_proofs(clusters[min(wanted)], topic, wanted, grace_s)
    return entries


def _kafka_topic_proofs(cluster: KafkaClientConfig, topic: str, wanted: set[str], grace_s: float) -> list[ProofEntry]:
    partitions = kafka.topic_partition_count(cluster, topic)
    if partitions is None:
        return []  # deleted since it was listed
    _settle(cluster, topic, partitions, grace_s)  # the proofs of a commit that just returned
    entries: list[ProofEntry] = []
    for _p, _o, _key, value, timestamp in kafka.read_committed_records(cluster, topic):
        try:
            doc = json.loads(value or b"")
            entry = ProofEntry(
                str(doc["job_id"]),
                str(doc["operator_uid"]),
                int(doc["subtask"]),
                int(doc["checkpoint_id"]),
                int(doc.get("records", 0)),
                timestamp,
            )
        except (ValueError, KeyError, TypeError):
            continue  # not a commit proof record: skip it
        if entry.operator_uid in wanted:
            entries.append(entry)
    return entries


def _postgres_proofs(conn: Any, table: str, uids: Sequence[str]) -> tuple[list[ProofEntry], str | None]:
    rows = postgres.sink_commit_rows(conn, table, uids)
    if rows is None:
        return [], f"table {table} does not exist"
    return [
        ProofEntry(job, uid, int(subtask), int(cp), int(n or 0), _ms(at)) for job, uid, subtask, cp, n, at in rows
    ], None


def _ms(at: Any) -> int:
    if isinstance(at, datetime):
        return int(at.timestamp() * 1000)
    return int(at or 0)


def _proof(source: str, entries: list[ProofEntry], missing: str | None, job_id: str | None, uid: str) -> CommitProof:
    if missing is not None:
        return CommitProof(source, job_id, missing_reason=missing)
    if job_id is None:
        return CommitProof(source, None, missing_reason=f"no entries for {uid} in any job")
    commits = last_commits(entries, job_id, uid)
    if not commits:
        return CommitProof(source, job_id, missing_reason=f"no entries for {uid} of job {job_id}")
    return CommitProof(source, job_id, commits)


def _verify_kafka_sink(
    cluster: KafkaClientConfig, capture: SinkCapture, proof: CommitProof, counted: int | None, grace_s: float
) -> SinkReport:
    topic = capture.description.target
    assert topic is not None
    partitions = kafka.topic_partition_count(cluster, topic)
    if partitions is None:
        raise VerifyError(f"kafka sink {capture.uid!r}: topic {topic!r} does not exist (check the job's parameters)")
    open_txns = open_kafka_transactions(cluster, topic, partitions, grace_s)
    found = [kafka_compared(key, value) for _p, _o, key, value, _ts in kafka.read_committed_records(cluster, topic)]
    keys, values = capture.serialized_keys(), capture.serialized_values()
    expected = [kafka_compared(k, v) for k, v in zip(keys, values, strict=True)]
    comparison = compare_records(expected, found)
    count = check_proof_records("kafka", counted, found=len(found), writes=len(expected), keys=len(expected))
    return _report(capture, "kafka", topic, comparison, proof, open_txns, KAFKA_OPEN_TRANSACTION_METHOD, counted, count)


def _settle(cluster: kafka.KafkaTarget, topic: str, partitions: int, grace_s: float) -> dict[int, tuple[int, int]]:
    """Wait up to ``grace_s`` for every partition's last stable offset to reach its high watermark
    (a committed transaction's markers land a moment after the commit returns); answer the partitions
    still behind, with (last stable offset, high watermark): their transaction is open."""
    deadline = time.monotonic() + grace_s
    while True:
        offsets = kafka.partition_offsets(cluster, topic, partitions)
        behind = {p: (lso, hw) for p, (_low, lso, hw) in offsets.items() if lso < hw}
        if not behind or time.monotonic() >= deadline:
            return behind
        time.sleep(0.2)


def open_kafka_transactions(
    cluster: kafka.KafkaTarget, topic: str, partitions: int, grace_s: float
) -> tuple[OpenTransaction, ...]:
    """Partitions whose last stable offset stays below the high watermark for ``grace_s``."""
    stuck = _settle(cluster, topic, partitions, grace_s)
    return tuple(
        OpenTransaction(
            "open",
            f"open transaction on partition {p} of {topic} (last stable offset {lso} < high watermark {hw})",
            partition=p,
        )
        for p, (lso, hw) in sorted(stuck.items())
    )


def _verify_postgres_sink(
    conn: Any,
    capture: SinkCapture,
    proof: CommitProof,
    counted: int | None,
    prepared: Sequence[tuple[str, Any, str]],
    job_ids: Sequence[str],
) -> SinkReport:
    d = capture.description
    table = d.target
    assert table is not None
    present = set(postgres.table_columns(conn, table))
    if not present:
        raise VerifyError(f"postgres sink {capture.uid!r}: table {table!r} does not exist (check the job's parameters)")
    absent = [c for c in d.columns if c not in present]
    if absent:
        raise VerifyError(f"postgres sink {capture.uid!r}: table {table!r} has no column(s) {absent}")
    rows = postgres.fetch_rows(conn, table, d.columns)
    key_index = [d.columns.index(c) for c in d.key_columns]
    final_rows = capture.final_rows()
    comparison = compare_rows(final_rows, rows, key_index)
    count = check_proof_records(
        "postgres", counted, found=len(rows), writes=len(capture.rows()), keys=capture.keys_changed()
    )
    if count.hidden_duplicates:
        samples = dict(comparison.samples)
        _sample(
            samples,
            "duplicates",
            f"the commit proofs count {counted} rows committed, the reference writes {len(capture.rows())} "
            f"(one per key): {count.hidden_duplicates} committed again, hidden by the upsert",
        )
        comparison = replace(comparison, duplicates=comparison.duplicates + count.hidden_duplicates, samples=samples)
    open_txns = tuple(
        OpenTransaction("prepared", f"prepared transaction {gid} (database {database}, since {at})", gid=gid)
        for gid, at, database in prepared
        if any(sink_transaction(gid, capture.uid, j) is not None for j in (job_ids or (None,)))
    )
    return _report(capture, "postgres", table, comparison, proof, open_txns, POSTGRES_PREPARED_METHOD, counted, count)


def _foreign_prepared(
    prepared: Sequence[tuple[str, Any, str]], uids: Sequence[str], job_ids: Sequence[str]
) -> list[str]:
    """Prepared transactions of the same sink uids in other jobs: not this run's, but they hold locks."""
    if not job_ids:
        return []
    return [
        f"prepared transaction {gid} belongs to sink {uid!r} of another job: roll it back if that job is gone"
        for gid, _at, _db in prepared
        for uid in uids
        if all(sink_transaction(gid, uid, j) is None for j in job_ids) and sink_transaction(gid, uid, None) is not None
    ]


def _report(
    capture: SinkCapture,
    kind: SinkKindName,
    target: str,
    c: Comparison,
    proof: CommitProof,
    open_txns: tuple[OpenTransaction, ...],
    method: str,
    counted: int | None,
    count: ProofCount,
) -> SinkReport:
    return SinkReport(
        uid=capture.uid,
        kind=kind,
        target=target,
        expected=c.expected,
        found=c.found,
        duplicates=c.duplicates,
        missing=c.missing,
        unexpected=c.unexpected,
        mismatched=c.mismatched,
        samples=c.samples,
        commit_proof=proof,
        open_transactions=open_txns,
        open_transaction_method=method,
        proof_records=counted,
        proof_problems=count.problems,
    )
