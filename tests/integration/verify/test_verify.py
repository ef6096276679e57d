"""`weir verify` against real Kafka and PostgreSQL.

The keyed aggregation's correct output is written straight into its sink topic and table, with the
commit proofs a transactional run leaves, so no cluster is needed: verify must find it clean. Then a
duplicate Kafka record, a deleted row, a prepared PostgreSQL transaction and an open Kafka transaction
are injected, and each must be reported. The proofs go to a topic and a table of this test only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from tests.integration.conftest import REPO_ROOT, create_topics, create_window_table
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.operators.sinks import json_serializer
from weir.operators.transactional_sinks import MARKER_TOPIC_CONFIG, marker_topic_name
from weir.operators.twophase import TransactionId
from weir.tools.cli import EXIT_FAILURE, EXIT_OK, run_cli
from weir.tools.events import EventSpec, events, produce_events

pytestmark = pytest.mark.integration

WINDOW_MS = 1000
SPEC = EventSpec(count=3000, keys=20, events_per_ms=2, malformed_every=500)
SUBTASKS = 3
KAFKA_CHECKPOINT = 3
POSTGRES_CHECKPOINT = 2


def expected_results(spec: EventSpec) -> list[dict[str, Any]]:
    """The keyed aggregation's results computed here, straight from the generated events."""
    acc: dict[tuple[str, int], tuple[int, int]] = {}
    for i, event in enumerate(events(spec)):
        if spec.malformed_every and i % spec.malformed_every == spec.malformed_every - 1:
            continue
        start = event["ts"] - event["ts"] % WINDOW_MS
        count, total = acc.get((event["key"], start), (0, 0))
        acc[(event["key"], start)] = (count + 1, total + event["value"])
    return [
        {"key": k, "window_start": s, "window_end": s + WINDOW_MS, "count": c, "sum": t}
        for (k, s), (c, t) in sorted(acc.items())
    ]


@dataclass(frozen=True)
class Names:
    job_id: str
    source: str
    sink: str
    dlq: str
    table: str
    commit_topic: str
    commit_table: str

    def verify_args(self, *extra: str, commit_topic: bool = True) -> list[str]:
        """``commit_topic=False``: verify finds the Kafka proofs where the sinks write them."""
        return [
            "verify",
            str(REPO_ROOT / "examples/keyed_aggregation.py"),
            *("-D", f"source.topic={self.source}"),
            *("-D", f"source.dlq_topic={self.dlq}"),
            *("-D", f"sink.topic={self.sink}"),
            *("-D", f"sink.table={self.table}"),
            *(("--commit-topic", self.commit_topic) if commit_topic else ()),
            *("--commit-table", self.commit_table),
            *extra,
        ]


@pytest.fixture
def names(services: Endpoints, unique: str) -> Iterator[Names]:
    n = Names(
        job_id=f"job-{unique}",
        source=f"events-{unique}",
        sink=f"results-{unique}",
        dlq=f"dlq-{unique}",
        table=f"window_results_{unique}",
        commit_topic=f"sink-commits-{unique}",
        commit_table=f"sink_commits_{unique}",
    )
    create_topics(services, {n.source: 3, n.sink: 3, n.dlq: 1, n.commit_topic: 1})
    create_window_table(services, n.table)
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {n.commit_table} (job_id text, operator_uid text, subtask int, checkpoint_id bigint, "
            "rows bigint, committed_at timestamptz NOT NULL DEFAULT now(), "
            "PRIMARY KEY (job_id, operator_uid, subtask, checkpoint_id))"
        )
    yield n
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {n.table}")
        conn.execute(f"DROP TABLE IF EXISTS {n.commit_table}")
    kafka.delete_topics(services, [n.source, n.sink, n.dlq, n.commit_topic])


def write_kafka_output(
    endpoints: Endpoints, n: Names, results: list[dict[str, Any]], own_marker_topic: str | None = None
) -> None:
    """The Kafka sink's committed output, with its subtasks' commit proofs in the same transaction:
    in the test's commit topic, or as the sink writes them (its own topic, partition = subtask)."""
    producer = kafka.producer(endpoints, transactional_id=f"{n.job_id}-kafka-sink")
    producer.init_transactions(30)
    producer.begin_transaction()
    for r in results:
        producer.produce(n.sink, key=r["key"].encode(), value=json_serializer(r))
    for subtask in range(SUBTASKS):
        proof = {
            "job_id": n.job_id,
            "operator_uid": "kafka-sink",
            "subtask": subtask,
            "checkpoint_id": KAFKA_CHECKPOINT,
            "records": len(results[subtask::SUBTASKS]),
            "transactional_id": f"{n.job_id}-kafka-sink",
        }
        key, value = f"{n.job_id}/kafka-sink/{subtask}".encode(), json.dumps(proof)
        if own_marker_topic is None:
            producer.produce(n.commit_topic, key=key, value=value)
        else:
            producer.produce(own_marker_topic, key=key, value=value, partition=subtask)
    producer.commit_transaction(30)


def write_postgres_output(endpoints: Endpoints, n: Names, results: list[dict[str, Any]]) -> None:
    """The PostgreSQL sink's rows and its subtasks' commit proofs, committed together."""
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {n.table} (key, window_start, window_end, count, sum) VALUES (%s, %s, %s, %s, %s)",
                [(r["key"], r["window_start"], r["window_end"], r["count"], r["sum"]) for r in results],
            )
            cur.executemany(
                f"INSERT INTO {n.commit_table} (job_id, operator_uid, subtask, checkpoint_id, rows) "
                "VALUES (%s, 'postgres-sink', %s, %s, %s)",
                [(n.job_id, s, POSTGRES_CHECKPOINT, len(results[s::SUBTASKS])) for s in range(SUBTASKS)],
            )


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def report(self) -> dict[str, Any]:
        return json.loads(self.stdout)  # type: ignore[no-any-return]

    def sink(self, uid: str) -> dict[str, Any]:
        return next(s for s in self.report["sinks"] if s["uid"] == uid)  # type: ignore[no-any-return]


def weir(capsys: pytest.CaptureFixture[str], args: list[str]) -> Outcome:
    code = run_cli(args)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def test_verify_finds_a_correct_output_clean_then_reports_each_discrepancy(
    services: Endpoints, names: Names, capsys: pytest.CaptureFixture[str]
) -> None:
    produce_events(services, names.source, SPEC)
    results = expected_results(SPEC)
    write_kafka_output(services, names, results)
    write_postgres_output(services, names, results)

    clean = weir(capsys, names.verify_args("--json"))

    assert clean.exit_code == EXIT_OK, clean.stderr
    assert clean.stderr == ""
    report = clean.report
    assert report["ok"] and report["discrepancies"] == []
    assert (report["job_id"], report["job_id_from"]) == (names.job_id, "latest in commit proofs")
    assert report["sources"] == [
        {"uid": "events-source", "kind": "kafka", "topic": names.source, "records": SPEC.count, "dead_lettered": 6}
    ]
    for uid in ("kafka-sink", "postgres-sink"):
        sink = clean.sink(uid)
        assert (sink["expected"], sink["found"]) == (len(results), len(results)), sink
        assert (sink["duplicates"], sink["missing"], sink["unexpected"], sink["mismatched"]) == (0, 0, 0, 0)
        assert sink["open_transactions"]["transactions"] == []
    kafka_proof = clean.sink("kafka-sink")["commit_proof"]
    assert kafka_proof["last_committed_checkpoint"] == KAFKA_CHECKPOINT
    assert [s["subtask"] for s in kafka_proof["subtasks"]] == [0, 1, 2]
    assert clean.sink("postgres-sink")["commit_proof"]["last_committed_checkpoint"] == POSTGRES_CHECKPOINT
    assert report["reconciliation"] == [
        f"kafka-sink committed up to {KAFKA_CHECKPOINT}, postgres-sink up to {POSTGRES_CHECKPOINT}: "
        f"postgres-sink will commit {KAFKA_CHECKPOINT} on recovery/next notification"
    ]
    assert "last stable offset" in clean.sink("kafka-sink")["open_transactions"]["method"]

    table = weir(capsys, names.verify_args("--job-id", names.job_id))
    assert table.exit_code == EXIT_OK, table.stderr
    assert "kafka-sink" in table.stdout and "postgres-sink" in table.stdout
    assert "every sink matches the reference run" in table.stdout

    # Inject one discrepancy of each kind.
    duplicate = results[len(results) // 2]
    plain = kafka.producer(services)  # outside a transaction: no commit marker counts it
    plain.produce(names.sink, key=duplicate["key"].encode(), value=json_serializer(duplicate))
    assert plain.flush(30) == 0
    deleted = results[0]
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            f"DELETE FROM {names.table} WHERE key = %s AND window_start = %s",
            (deleted["key"], deleted["window_start"]),
        )
    rewritten = results[1]  # committed again in a later checkpoint, as a replay would: the upsert hides it
    with psycopg.connect(services.postgres_dsn) as conn:
        conn.execute(
            f"UPDATE {names.table} SET count = %s WHERE key = %s AND window_start = %s",
            (rewritten["count"], rewritten["key"], rewritten["window_start"]),
        )
        conn.execute(
            f"INSERT INTO {names.commit_table} (job_id, operator_uid, subtask, checkpoint_id, rows) "
            "VALUES (%s, 'postgres-sink', 0, %s, 1)",
            (names.job_id, POSTGRES_CHECKPOINT + 1),
        )
    gid = TransactionId(JobId(names.job_id), OperatorUid("postgres-sink"), SubtaskIndex(1), CheckpointId(3)).gid
    open_txn: Producer | None = None
    try:
        with psycopg.connect(services.postgres_dsn) as conn:
            conn.execute(
                f"INSERT INTO {names.commit_table} (job_id, operator_uid, subtask, checkpoint_id, rows) "
                "VALUES (%s, 'postgres-sink', 1, 3, 0)",
                (names.job_id,),
            )
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        open_txn = kafka.producer(services, transactional_id=f"{names.job_id}-open")
        open_txn.init_transactions(30)
        open_txn.begin_transaction()
        open_txn.produce(names.sink, value=b'{"in":"flight"}', partition=0)
        assert open_txn.flush(30) == 0

        broken = weir(capsys, names.verify_args("--job-id", names.job_id, "--json"))

        assert broken.exit_code == EXIT_FAILURE
        assert broken.stderr == (
            "weir: error: verify found discrepancies: kafka-sink: 1 duplicate, 1 partition with an open "
            f"transaction, commit proofs count {len(results)} records, the topic holds {len(results) + 1} "
            "committed; postgres-sink: 1 duplicate, 1 missing, 1 prepared transaction\n"
        )
        assert broken.report["ok"] is False
        k = broken.sink("kafka-sink")
        assert (k["expected"], k["found"], k["duplicates"], k["missing"], k["unexpected"]) == (
            len(results),
            len(results) + 1,
            1,
            0,
            0,
        )
        assert k["samples"]["duplicates"] == [f"{json_serializer(duplicate).decode()} found 2x, expected 1x"]
        [open_partition] = k["open_transactions"]["transactions"]
        assert (open_partition["kind"], open_partition["partition"]) == ("open", 0)
        p = broken.sink("postgres-sink")
        assert (p["expected"], p["found"], p["missing"], p["mismatched"], p["unexpected"]) == (
            len(results),
            len(results) - 1,
            1,
            0,
            0,
        )
        assert p["duplicates"] == 1 and p["commit_proof"]["records"] == len(results) + 1
        assert "1 committed again, hidden by the upsert" in p["samples"]["duplicates"][0]
        [prepared] = p["open_transactions"]["transactions"]
        assert (prepared["kind"], prepared["gid"]) == ("prepared", gid)
    finally:
        if open_txn is not None:
            open_txn.abort_transaction(30)
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")


def test_verify_finds_the_kafka_proofs_in_the_sinks_own_marker_topic(
    services: Endpoints, names: Names, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --commit-topic, verify reads the proofs where a sink writes them: its own marker topic,
    one partition per subtask (before: only the shared weir-sink-commits, so no proof was found)."""
    marker_topic = marker_topic_name(names.job_id, "kafka-sink")
    kafka.create_topic(services, marker_topic, SUBTASKS, 1, MARKER_TOPIC_CONFIG)
    try:
        produce_events(services, names.source, SPEC)
        results = expected_results(SPEC)
        write_kafka_output(services, names, results, own_marker_topic=marker_topic)
        write_postgres_output(services, names, results)

        outcome = weir(capsys, names.verify_args("--job-id", names.job_id, "--json", commit_topic=False))

        assert outcome.exit_code == EXIT_OK, outcome.stderr
        proof = outcome.sink("kafka-sink")["commit_proof"]
        assert proof["available"], proof
        assert marker_topic in proof["source"]  # with weir-sink-commits, the shared topic of older runs, if it exists
        assert proof["last_committed_checkpoint"] == KAFKA_CHECKPOINT
        assert [(s["subtask"], s["checkpoint_id"]) for s in proof["subtasks"]] == [
            (s, KAFKA_CHECKPOINT) for s in range(SUBTASKS)
        ]
    finally:
        kafka.delete_topics(services, [marker_topic])
