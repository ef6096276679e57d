"""The transactional Kafka sink against the real broker: commits, crashes and recoveries.

Values are ``"v{i}"`` strings; the data topic has one partition, so order is checked too.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from connectors import kafka
from taskmanager.operators.transactional_sinks import (
    SinkSnapshot,
    TransactionalKafkaSinkOperator,
    marker_key,
    transactional_id,
)
from tests.integration.sinks.conftest import TASKMANAGER, KafkaSinkCase, run_until_crash
from weir.crashpoints import EXIT_CODE
from weir.ids import JobId, OperatorUid, SubtaskIndex, TaskId

pytestmark = pytest.mark.integration

TS = int(time.time()) * 1000  # now: the broker's 7-day retention deletes older records mid-test


def values(first: int, last: int) -> list[str]:
    return [f"v{i}" for i in range(first, last + 1)]


def feed(sink: TransactionalKafkaSinkOperator, first: int, last: int) -> None:
    for value in values(first, last):
        sink.process(value, TS)


def committed_markers(case: KafkaSinkCase) -> list[tuple[int, int]]:
    return [(m.checkpoint_id, m.records) for m in case.markers("read_committed")]


def sample(name: str, case: KafkaSinkCase, subtask: int = 0) -> float:
    labels = {"job_id": case.job_id, "operator_uid": case.uid, "subtask": str(subtask), "taskmanager": TASKMANAGER}
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_ids_are_stable_per_job_sink_and_subtask() -> None:
    task = TaskId(JobId("job-1"), OperatorUid("out"), SubtaskIndex(2))
    assert transactional_id(task) == "weir-job-1-out-2"
    assert marker_key(task) == b"job-1/out/2"


def test_two_committed_epochs_are_read_exactly_once(kafka_case: KafkaSinkCase) -> None:
    sink = kafka_case.sink()
    sink.open()
    feed(sink, 1, 3)
    sink.snapshot_state(1)
    assert kafka_case.values("read_uncommitted") == values(1, 3)  # produced into the open transaction
    sink.notify_checkpoint_complete(1)
    feed(sink, 4, 5)
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    assert sample("weir_sink_transactions_committed_total", kafka_case) == 2
    assert sample("weir_sink_records_committed_total", kafka_case) == 5
    assert sample("weir_end_to_end_latency_seconds_count", kafka_case) == 5
    sink.close()

    assert kafka_case.values("read_committed") == values(1, 5)
    assert kafka_case.values("read_uncommitted") == values(1, 5)
    assert committed_markers(kafka_case) == [(1, 3), (2, 2)]


def test_open_transaction_is_invisible_until_its_checkpoint_completes(kafka_case: KafkaSinkCase) -> None:
    sink = kafka_case.sink()
    sink.open()
    feed(sink, 1, 2)
    sink.snapshot_state(1)
    assert sample("weir_sink_open_transaction_age_seconds", kafka_case) > 0
    high = kafka.partition_range(kafka_case.endpoints, kafka_case.topic, 0)[1]
    offsets = kafka.partition_offsets(kafka_case.endpoints, kafka_case.topic, 1)
    assert offsets[0][1] < high  # last stable offset below the high watermark: a transaction is open
    sink.notify_checkpoint_complete(1)
    assert sample("weir_sink_records_committed_total", kafka_case) == 2
    assert sample("weir_sink_open_transaction_age_seconds", kafka_case) == 0
    sink.close()
    assert kafka_case.values("read_committed") == values(1, 2)


def test_crash_after_pre_commit_rolls_back_to_the_previous_checkpoint(
    kafka_case: KafkaSinkCase, tmp_path: Path
) -> None:
    """Killed at the second barrier after the flush: checkpoint 2 never completed, so recovery restores
    checkpoint 1; fencing aborts the open transaction and the source replays epoch 2."""
    crash = run_until_crash(
        tmp_path,
        kafka_case.endpoints,
        "after_pre_commit:2",
        kind="kafka",
        job_id=kafka_case.job_id,
        uid=kafka_case.uid,
        topic=kafka_case.topic,
        marker_topic=kafka_case.marker_topic,
        epochs=[values(1, 3), values(4, 5)],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert sorted(crash.snapshots) == [1]

    sink = kafka_case.recovered(crash.snapshots[1])
    assert kafka_case.values("read_uncommitted") == values(1, 5)  # the aborted records are in the log
    assert kafka_case.values("read_committed") == values(1, 3)
    assert committed_markers(kafka_case) == [(1, 3)]

    feed(sink, 4, 5)  # the replay of epoch 2
    sink.snapshot_state(3)
    sink.notify_checkpoint_complete(3)
    sink.close()
    assert kafka_case.values("read_committed") == values(1, 5)
    assert committed_markers(kafka_case) == [(1, 3), (3, 2)]


def test_crash_after_completion_before_commit_reproduces_the_checkpoint_once(
    kafka_case: KafkaSinkCase, tmp_path: Path
) -> None:
    """Killed after checkpoint 1 completed, before its commit: recovery from checkpoint 1 finds no
    committed marker for it, re-produces its records from the snapshot and commits them; a second
    recovery from the same checkpoint finds the marker and produces nothing."""
    crash = run_until_crash(
        tmp_path,
        kafka_case.endpoints,
        "after_checkpoint_complete_before_commit",
        kind="kafka",
        job_id=kafka_case.job_id,
        uid=kafka_case.uid,
        topic=kafka_case.topic,
        marker_topic=kafka_case.marker_topic,
        epochs=[values(1, 3)],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert "crash_point_hit" in crash.output

    first = kafka_case.recovered(crash.snapshots[1])
    assert kafka_case.values("read_committed") == values(1, 3)
    assert kafka_case.values("read_uncommitted") == values(1, 3) + values(1, 3)  # aborted, then redone
    first.close()

    second = kafka_case.recovered(crash.snapshots[1])  # e.g. the first recovery died after its commit
    second.close()
    assert kafka_case.values("read_committed") == values(1, 3)
    assert committed_markers(kafka_case) == [(1, 3)]


def test_recovery_commits_an_open_transaction_only_through_the_snapshot(kafka_case: KafkaSinkCase) -> None:
    """An abandoned instance (no close) held checkpoint 1's transaction open after completion."""
    abandoned = kafka_case.sink()
    abandoned.open()
    feed(abandoned, 1, 4)
    snapshot = abandoned.snapshot_state(1)
    assert snapshot is not None

    recovered = kafka_case.recovered(snapshot)
    feed(recovered, 5, 6)
    recovered.snapshot_state(2)
    recovered.notify_checkpoint_complete(2)
    recovered.close()
    assert kafka_case.values("read_committed") == values(1, 6)
    assert committed_markers(kafka_case) == [(1, 4), (2, 2)]


def test_lost_notification_is_covered_by_the_next_checkpoint(kafka_case: KafkaSinkCase) -> None:
    sink = kafka_case.sink()
    sink.open()
    feed(sink, 1, 2)
    sink.snapshot_state(1)  # notification of 1 lost
    feed(sink, 3, 4)  # kept in memory: checkpoint 1's transaction is still open
    sink.snapshot_state(2)
    sink.notify_checkpoint_aborted(3)  # an aborted checkpoint changes nothing
    feed(sink, 5, 5)
    sink.snapshot_state(4)
    assert kafka_case.values("read_uncommitted") == values(1, 2)
    sink.notify_checkpoint_complete(2)  # commits 1, then 2
    assert kafka_case.values("read_committed") == values(1, 4)
    sink.notify_checkpoint_complete(4)
    sink.close()
    assert kafka_case.values("read_committed") == values(1, 5)
    assert committed_markers(kafka_case) == [(1, 2), (2, 2), (4, 1)]


def test_recovery_from_a_checkpoint_with_two_pending_epochs(kafka_case: KafkaSinkCase) -> None:
    """Checkpoint 2 completed while 1's notification was lost, then the process died: the snapshot of
    2 lists 1 (open in Kafka, aborted by fencing) and 2 (never produced); both are re-produced in order."""
    abandoned = kafka_case.sink()
    abandoned.open()
    feed(abandoned, 1, 2)
    abandoned.snapshot_state(1)
    feed(abandoned, 3, 5)
    snapshot = abandoned.snapshot_state(2)
    assert snapshot is not None
    restored = SinkSnapshot.from_bytes(snapshot)
    assert [entry.checkpoint_id for entry in restored.ledger.pending] == [1, 2]
    assert restored.marker_floor is not None

    recovered = kafka_case.recovered(snapshot)
    recovered.close()
    assert kafka_case.values("read_committed") == values(1, 5)
    assert committed_markers(kafka_case) == [(1, 2), (2, 3)]


def test_end_of_input_commits_what_is_left(kafka_case: KafkaSinkCase) -> None:
    sink = kafka_case.sink()
    sink.open()
    feed(sink, 1, 2)
    sink.snapshot_state(1)
    feed(sink, 3, 3)
    sink.end_input()
    sink.close()
    assert kafka_case.values("read_committed") == values(1, 3)
