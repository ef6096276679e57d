"""A poison record on JobManager + 3 TaskManagers: a map that raises on one record of a Kafka topic.

With the default handling (fail) the job restarts from its last checkpoint and meets the record
again, until the restart strategy's attempts are spent: the job is FAILED with the record named (the
operator, the exception, the record and its partition and offset), in the failure and in every entry
of its exception history. With ``DeadLetterOnError`` the job FINISHES: every other record is in the
sink exactly once and the poison record in the dead-letter topic, with its reason and position."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.integration.conftest import WeirCluster, create_topics
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.errors import Fault

pytestmark = pytest.mark.integration

JOB = "tests/integration/runtime/jobs/poison_map.py"
RECORDS = 200
POISON_SEQ = 77
PARTITIONS = 2
MAX_ATTEMPTS = 2


def produce_sequence(endpoints: Endpoints, topic: str) -> dict[int, tuple[int, int]]:
    """``{"key", "seq"}`` for seq 0..RECORDS-1 over the partitions; the (partition, offset) of each
    record as the broker acknowledged it."""
    producer = kafka.producer(endpoints, linger_ms=5)
    positions: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def delivered(seq: int) -> Any:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                positions[seq] = (msg.partition(), msg.offset())

        return on_delivery

    for seq in range(RECORDS):
        event = {"key": f"k{seq % 5}", "seq": seq}
        producer.produce(
            topic,
            partition=seq % PARTITIONS,
            key=event["key"].encode(),
            value=json.dumps(event).encode(),
            on_delivery=delivered(seq),
        )
    assert producer.flush(30) == 0 and not errors, errors
    assert len(positions) == RECORDS
    return positions


def test_a_poison_record_fails_the_job_after_the_restarts_with_its_position(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    source, sink = f"poison-in-{unique}", f"poison-out-{unique}"
    create_topics(endpoints, {source: PARTITIONS, sink: 1})
    partition, offset = produce_sequence(endpoints, source)[POISON_SEQ]
    job_id = weir_cluster.submit(
        JOB,
        {
            "source.topic": source,
            "sink.topic": sink,
            "poison.seq": str(POISON_SEQ),
            "checkpointing.interval": "1s",
            "restart.strategy": "fixed-delay",
            "restart.delay": "200ms",
            "restart.max-attempts": str(MAX_ATTEMPTS),
        },
        parallelism=PARTITIONS,
    )
    status = weir_cluster.wait_for(job_id, ("FAILED",), timeout_s=60)
    assert status.summary.status == "FAILED", status
    failure = status.failure
    assert failure is not None
    position = f"{source}[{partition}]@{offset}"
    assert failure.type == "ValueError" and failure.fault is Fault.USER and failure.retriable, failure
    for named in ("operator 'parse'", f"seq {POISON_SEQ} is poison", f"'seq': {POISON_SEQ}", position):
        assert named in failure.message, (named, failure.message)

    base = f"http://127.0.0.1:{endpoints.jobmanager_rest_port}"
    details = httpx.get(f"{base}/jobs/{job_id}", timeout=10).json()
    assert details["restarts"] == MAX_ATTEMPTS
    history = httpx.get(f"{base}/jobs/{job_id}/exceptions?maxExceptions=100", timeout=10).json()
    entries = history["exceptionHistory"]["entries"]
    assert len(entries) == MAX_ATTEMPTS + 1, entries  # the first run and each restart met the record
    assert all(position in json.dumps(entry) for entry in entries), entries


def test_a_poison_record_goes_to_the_dead_letter_topic_and_the_job_finishes(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    source, sink, dlq = f"poison-in-{unique}", f"poison-out-{unique}", f"poison-dlq-{unique}"
    create_topics(endpoints, {source: PARTITIONS, sink: 1, dlq: 1})
    partition, offset = produce_sequence(endpoints, source)[POISON_SEQ]
    job_id = weir_cluster.submit(
        JOB,
        {
            "source.topic": source,
            "sink.topic": sink,
            "dlq.topic": dlq,
            "on_error": "dead-letter",
            "poison.seq": str(POISON_SEQ),
            "checkpointing.interval": "1s",
            "restart.strategy": "none",  # a restart here would be a failure of the test
        },
        parallelism=PARTITIONS,
    )
    status = weir_cluster.wait_for(job_id, ("FINISHED",), timeout_s=60)
    assert status.summary.status == "FINISHED", status.failure

    results = Counter(
        json.dumps(json.loads(v), sort_keys=True) for _p, _o, _k, v in kafka.read_all(endpoints, sink, "read_committed")
    )
    expected = Counter(
        json.dumps({"key": f"k{s % 5}", "seq": s}, sort_keys=True) for s in range(RECORDS) if s != POISON_SEQ
    )
    assert results == expected, (sorted((results - expected).elements()), sorted((expected - results).elements()))

    letters = [json.loads(v) for _p, _o, _k, v in kafka.read_all(endpoints, dlq, "read_committed")]
    assert len(letters) == 1, letters
    (letter,) = letters
    assert letter["reason"] == f"ValueError: seq {POISON_SEQ} is poison"
    assert (letter["topic"], letter["partition"], letter["offset"]) == (source, partition, offset)
    assert letter["operator_uid"] == "parse" and letter["job_id"] == job_id
    assert json.loads(letter["value"]) == {"key": f"k{POISON_SEQ % 5}", "seq": POISON_SEQ}
    assert letter["value_truncated"] is False


WINDOW_JOB = "tests/integration/runtime/jobs/poison_window.py"
WINDOW_MS = 200
BASE_MS = 1_700_000_000_000  # the job's event time of seq 0 (jobs/poison_window.py)


def test_a_window_whose_result_raises_is_dead_lettered_as_its_firing_and_the_job_finishes(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    source, sink, dlq = f"poison-win-in-{unique}", f"poison-win-out-{unique}", f"poison-win-dlq-{unique}"
    create_topics(endpoints, {source: PARTITIONS, sink: 1, dlq: 1})
    produce_sequence(endpoints, source)
    job_id = weir_cluster.submit(
        WINDOW_JOB,
        {
            "source.topic": source,
            "sink.topic": sink,
            "dlq.topic": dlq,
            "poison.seq": str(POISON_SEQ),
            "window.size_ms": str(WINDOW_MS),
            "checkpointing.interval": "1s",
            "restart.strategy": "none",  # a restart here would be a failure of the test
        },
        parallelism=PARTITIONS,
    )
    status = weir_cluster.wait_for(job_id, ("FINISHED",), timeout_s=60)
    assert status.summary.status == "FINISHED", status.failure

    windows: dict[tuple[str, int], list[int]] = {}
    for seq in range(RECORDS):
        start = BASE_MS + (10 * seq) // WINDOW_MS * WINDOW_MS
        windows.setdefault((f"k{seq % 5}", start), []).append(seq)
    poison_window = (f"k{POISON_SEQ % 5}", BASE_MS + (10 * POISON_SEQ) // WINDOW_MS * WINDOW_MS)
    expected = Counter(
        json.dumps({"key": key, "start": start, "count": len(seqs), "sum": sum(seqs)}, sort_keys=True)
        for (key, start), seqs in windows.items()
        if (key, start) != poison_window
    )
    results = Counter(
        json.dumps(json.loads(v), sort_keys=True) for _p, _o, _k, v in kafka.read_all(endpoints, sink, "read_committed")
    )
    assert results == expected, (sorted((results - expected).elements()), sorted((expected - results).elements()))

    letters = [json.loads(v) for _p, _o, _k, v in kafka.read_all(endpoints, dlq, "read_committed")]
    assert len(letters) == 1, letters
    (letter,) = letters
    key, start = poison_window
    assert letter["reason"] == f"ValueError: window of {key} at {start} holds poison seq {POISON_SEQ}"
    assert letter["firing"] == {"kind": "window", "start": start, "end": start + WINDOW_MS}
    assert (letter["topic"], letter["partition"], letter["offset"], letter["timestamp"]) == (None, None, None, None)
    assert letter["operator_uid"] == "window-sum" and letter["job_id"] == job_id and letter["key"] == repr(key)
    assert letter["function"] == "PoisonResult.result"
    seqs = windows[poison_window]
    assert json.loads(letter["value"]) == {"count": len(seqs), "sum": sum(seqs), "poison": True}
