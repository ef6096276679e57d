"""A bounded job in unaligned mode under backpressure fails over after its final checkpoint completed
and before it FINISHED, on a real cluster with real Kafka, PostgreSQL and S3.

A generator feeds a slow task holding the exactly-once Kafka sink and the two-phase PostgreSQL sink
(``jobs/slow_two_sinks.py``): when the generator ends, its output queue and the sink task's input
queue are full. The final checkpoint's barrier is forced aligned, so it waits behind those records:
the sinks pre-commit every record at it, commit on its notification, and find nothing left at their
end of input, where the TaskManager dies (``after_sink_end_of_input``). The job restores the final
checkpoint, which holds nothing in flight, and finishes. Both sinks hold each record exactly once
(whole records compared as multisets; each sink's own commit proofs count every record once), and
nothing is left prepared or open.

Before, the final barrier was a priority event that overtook those records: the sinks pre-committed
before them and committed them at their end of input, outside any checkpoint; the restore replayed
them from the final checkpoint's in-flight state and the Kafka sink committed them again, while the
PostgreSQL sink had committed them under a checkpoint id not issued yet, on which the next attempt's
final checkpoint collided (one more failover).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.conftest import REPO_ROOT, create_topics, wait_for_job
from tests.integration.sinks.jobs.slow_two_sinks import event
from weir.connectors import kafka, postgres
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.config import Endpoints
from weir.operators.transactional_sinks import CommitMarker, marker_topic_name
from weir.tools.client import CheckpointInfo, JobManagerClient
from weir.tools.verify import verify_job

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "tests" / "integration" / "sinks" / "jobs" / "slow_two_sinks.py"
EVENTS = 20_000
KAFKA_SINK, POSTGRES_SINK = "kafka-sink", "postgres-sink"


def whole(e: dict[str, Any]) -> tuple[int, str, int]:
    return (e["id"], e["key"], e["value"])


def kafka_records(endpoints: Endpoints, topic: str) -> Counter[tuple[int, str, int]]:
    return Counter(whole(json.loads(v or b"")) for _p, _o, _k, v in kafka.read_all(endpoints, topic, "read_committed"))


def kafka_proof_records(endpoints: Endpoints, job_id: str) -> int:
    """The records the Kafka sink's committed markers say it committed, over all its checkpoints."""
    markers = kafka.read_all(endpoints, marker_topic_name(job_id, KAFKA_SINK), "read_committed")
    found = [CommitMarker.parse(v) for _p, _o, _k, v in markers]
    return sum(m.records for m in found if m is not None and m.job_id == job_id)


def postgres_rows(endpoints: Endpoints, table: str) -> Counter[tuple[int, str, int]]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        return Counter(conn.execute(f'SELECT id, key, value FROM "{table}"').fetchall())


def postgres_proof_rows(endpoints: Endpoints, job_id: str) -> int:
    """The rows the PostgreSQL sink's commit proofs say it committed, over all its checkpoints."""
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        row = conn.execute(
            f"SELECT coalesce(sum(rows), 0) FROM {postgres.COMMIT_PROOF_TABLE} WHERE job_id = %s AND operator_uid = %s",
            (job_id, POSTGRES_SINK),
        ).fetchone()
    return int(row[0]) if row else 0


def prepared_of(endpoints: Endpoints, job_id: str) -> list[str]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        return [g for (g,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall() if job_id in g]


def completed(client: JobManagerClient, job_id: str) -> list[CheckpointInfo]:
    return sorted(
        (
            c
            for c in client.list_checkpoints(job_id)
            if c.status is CheckpointStatus.COMPLETED and c.kind is CheckpointKind.CHECKPOINT
        ),
        key=lambda c: c.checkpoint_id,
    )


@pytest.mark.parametrize("crash_cluster", ["after_sink_end_of_input:2"], indirect=True)
def test_a_failover_after_the_final_checkpoint_of_an_unaligned_job_leaves_both_sinks_exact(
    crash_cluster: tuple[Endpoints, JobManagerClient], unique: str
) -> None:
    endpoints, client = crash_cluster
    topic, table = f"slow-results-{unique}", f"slow_results_{unique}"
    create_topics(endpoints, {topic: 1})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, key text, value bigint)')
    params = {
        "source.count": str(EVENTS),
        "sink.records_per_second": "4000",
        "sink.topic": topic,
        "sink.table": table,
        "checkpointing.interval": "1s",
        "checkpointing.unaligned": "true",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = client.submit_job(JOB, params, 1)
    final = wait_for_job(client, job_id)
    assert final.summary.status == "FINISHED", final.failure

    fired = list(Path(os.environ["WEIR_CRASH_ONCE_DIR"]).glob("*"))
    assert fired, "the crash point never fired: the test would prove nothing"
    assert final.summary.restarts == 1, f"{final.summary.restarts} restarts (one more: a proof collision)"
    assert final.last_restore_at is not None

    checkpoints = completed(client, job_id)
    assert any(c.unaligned and c.inflight_bytes > 0 for c in checkpoints), (
        "no checkpoint held records in flight: the sink task was not backpressured, the test would prove nothing"
    )
    restored = max((c for c in checkpoints if c.trigger_time < final.last_restore_at), key=lambda c: c.checkpoint_id)
    last = checkpoints[-1]
    for what, checkpoint in (("the final checkpoint restored", restored), ("the last attempt's final one", last)):
        assert not checkpoint.unaligned and checkpoint.inflight_bytes == 0, (what, checkpoint)

    expected = Counter(whole(event(i)) for i in range(EVENTS))
    found_kafka = kafka_records(endpoints, topic)
    assert found_kafka == expected, {
        "duplicates": sum((found_kafka - expected).values()),
        "missing": sum((expected - found_kafka).values()),
    }
    assert kafka_proof_records(endpoints, job_id) == EVENTS
    assert postgres_rows(endpoints, table) == expected
    assert postgres_proof_rows(endpoints, job_id) == EVENTS, "the PostgreSQL sink committed some rows twice"
    assert prepared_of(endpoints, job_id) == []

    report = verify_job(JOB, params, job_id=job_id, endpoints=endpoints)
    assert report.ok, json.dumps(report.to_json(), indent=1)[:4000]
