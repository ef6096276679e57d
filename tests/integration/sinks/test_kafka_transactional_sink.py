"""The transactional Kafka sink against the real broker: commits, crashes and recoveries.

Values are ``"v{i}"`` strings; the data topic has one partition, so order is checked too.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.integration.polling import until
from tests.integration.sinks.conftest import TASKMANAGER, KafkaSinkCase, run_until_crash
from weir.connectors import kafka
from weir.core.crashpoints import EXIT_CODE
from weir.core.errors import JobDefinitionError, ServiceUnavailableError
from weir.core.ids import JobId, OperatorUid, SubtaskIndex, TaskId
from weir.operators.transactional_sinks import (
    MARKER_TOPIC_CONFIG,
    CommitMarker,
    CommitMarkerLostError,
    EndOfInputNotCheckpointedError,
    MarkerTopicError,
    SinkSnapshot,
    TransactionalKafkaSinkOperator,
    marker_key,
    transactional_id,
)

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
    labels = {
        "job_id": case.job_id,
        "job_name": "sink-test",
        "operator_uid": case.uid,
        "subtask": str(subtask),
        "taskmanager": TASKMANAGER,
    }
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


def _limit_record_size(case: KafkaSinkCase, max_bytes: int) -> None:
    """The data topic's ``max.message.bytes``, applied once the broker shows it."""
    kafka.set_topic_configs(case.endpoints, case.topic, {"max.message.bytes": str(max_bytes)})
    until(
        f"max.message.bytes={max_bytes} on {case.topic}",
        30,
        lambda: (
            kafka.topic_configs(case.endpoints, case.topic, ["max.message.bytes"]).get("max.message.bytes")
            == str(max_bytes)
        ),
    )


def test_a_record_the_broker_refuses_fails_its_checkpoint_transaction_and_recovery_produces_it_again(
    kafka_case: KafkaSinkCase,
) -> None:
    """A sink's records are produced without a delivery callback each: a record whose delivery fails
    (here one larger than the topic's ``max.message.bytes``, refused by the broker) must still keep
    its epoch from committing, at the pre-commit or at the latest at the commit (librdkafka refuses
    ``commit_transaction`` once a record of the transaction failed), and the task's restart must
    produce the epoch again, once."""
    _limit_record_size(kafka_case, 1000)
    big = "x" * 5000
    sink = kafka_case.sink()
    sink.open()
    feed(sink, 1, 3)
    sink.process(big, TS)
    snapshot: bytes | None = None
    with pytest.raises(ServiceUnavailableError, match="Message size too large|failed delivery"):
        snapshot = sink.snapshot_state(1)  # the pre-commit (refused here if the failure came first)
        sink.notify_checkpoint_complete(1)  # else the commit: aborted, then reported
    assert kafka_case.values("read_committed") == []
    assert committed_markers(kafka_case) == []
    sink.close()

    _limit_record_size(kafka_case, 1_048_588)  # the cause removed; the task restarts
    if snapshot is not None:  # checkpoint 1 completed: its epoch is in the snapshot, produced again
        recovered = kafka_case.recovered(snapshot)
        expected_markers = [(1, 4)]
    else:  # checkpoint 1 failed: recovery from none, the source replays the epoch
        recovered = kafka_case.sink()
        recovered.open()
        feed(recovered, 1, 3)
        recovered.process(big, TS)
        recovered.snapshot_state(2)
        recovered.notify_checkpoint_complete(2)
        expected_markers = [(2, 4)]
    recovered.close()
    assert collections.Counter(kafka_case.values("read_committed")) == collections.Counter([*values(1, 3), big])
    assert committed_markers(kafka_case) == expected_markers


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


def test_end_of_input_commits_nothing_and_refuses_records_no_checkpoint_covers(kafka_case: KafkaSinkCase) -> None:
    """Everything a sink commits lies in a checkpoint: a bounded job's records are committed through
    its final checkpoint, never at the end of input (a failover before FINISHED would restore that
    checkpoint and write them again). A record after the last checkpoint is refused, and the open
    transaction holding it is aborted when the task closes the sink."""
    sink = kafka_case.sink()
    sink.open()
    feed(sink, 1, 2)
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.end_input()  # everything committed through checkpoint 1: nothing to do
    feed(sink, 3, 3)
    with pytest.raises(EndOfInputNotCheckpointedError, match="1 record\\(s\\) no checkpoint covers"):
        sink.end_input()
    sink.close()
    assert kafka_case.values("read_committed") == values(1, 2)
    assert committed_markers(kafka_case) == [(1, 2)]


# The marker topic: kept for ever, one per sink, one partition per subtask -------------------------


def marker_configs(case: KafkaSinkCase) -> dict[str, str]:
    return kafka.topic_configs(case.endpoints, case.markers_in, MARKER_TOPIC_CONFIG)


def test_a_sink_creates_its_own_marker_topic_kept_for_ever_with_a_partition_per_subtask(
    kafka_job: KafkaSinkCase,
) -> None:
    """Before: every sink wrote to the shared ``weir-sink-commits``, created with the broker's default
    retention (7 days), so markers aged out; the partition was a hash of the subtask's key."""
    sink = kafka_job.sink(subtask=1, parallelism=3)
    sink.open()
    feed(sink, 1, 2)
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.close()

    lookup = kafka.lookup_topic(kafka_job.endpoints, kafka_job.markers_in)
    assert lookup.topic is not None
    assert (lookup.topic.partitions, lookup.topic.replication_factor) == (3, min(3, lookup.brokers))
    assert marker_configs(kafka_job) == {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    [(partition, _offset, key, value)] = kafka.read_all(kafka_job.endpoints, kafka_job.markers_in)
    assert (partition, key) == (1, f"{kafka_job.job_id}/{kafka_job.uid}/1".encode())
    assert CommitMarker.parse(value) == CommitMarker(
        kafka_job.job_id, kafka_job.uid, 1, 1, 2, f"weir-{kafka_job.job_id}-{kafka_job.uid}-1"
    )

    wider = kafka_job.sink(subtask=4, parallelism=5)  # a later run with more subtasks grows the topic
    wider.open()
    wider.close()
    assert kafka.wait_for_partitions(kafka_job.endpoints, kafka_job.markers_in, 5) == 5


def test_the_marker_replication_factor_is_a_setting_checked_against_the_brokers(kafka_job: KafkaSinkCase) -> None:
    """Before: the marker topic was created with replication factor 1 whatever the cluster."""
    brokers = kafka.lookup_topic(kafka_job.endpoints, kafka_job.topic).brokers
    with pytest.raises(JobDefinitionError, match="marker_replication_factor must be at least 1"):
        kafka_job.sink(marker_replication_factor=0)
    too_many = kafka_job.sink(marker_replication_factor=brokers + 1)
    with pytest.raises(JobDefinitionError, match=f"broker count \\({brokers}\\)"):
        too_many.validate_at_submit(kafka_job.endpoints)
    with pytest.raises(JobDefinitionError, match=f"broker count \\({brokers}\\)"):
        too_many.open()
    too_many.close()
    assert kafka.lookup_topic(kafka_job.endpoints, kafka_job.markers_in).topic is None  # nothing created

    sink = kafka_job.sink(marker_replication_factor=brokers)
    sink.open()
    sink.close()
    layout = kafka.lookup_topic(kafka_job.endpoints, kafka_job.markers_in).topic
    assert layout is not None and layout.replication_factor == brokers


def test_an_existing_marker_topic_with_finite_retention_is_altered_to_keep_markers_for_ever(
    kafka_case: KafkaSinkCase,
) -> None:
    """Before: an existing marker topic was used as it was, retention and all."""
    kafka.set_topic_configs(kafka_case.endpoints, kafka_case.markers_in, {"retention.ms": "60000"})
    assert marker_configs(kafka_case)["retention.ms"] == "60000"
    sink = kafka_case.sink()
    sink.open()
    sink.close()
    assert marker_configs(kafka_case) == {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


def test_a_marker_topic_whose_retention_cannot_be_altered_is_refused_in_one_line(
    kafka_case: KafkaSinkCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the sink went on writing markers that retention would delete."""
    kafka.set_topic_configs(kafka_case.endpoints, kafka_case.markers_in, {"retention.bytes": "1048576"})

    def refused(*_args: object, **_kwargs: object) -> None:
        raise ServiceUnavailableError("kafka: cannot alter the configs of topic: TOPIC_AUTHORIZATION_FAILED")

    monkeypatch.setattr(kafka, "set_topic_configs", refused)
    sink = kafka_case.sink()
    with pytest.raises(MarkerTopicError) as refusal:
        sink.open()
    sink.close()
    message = str(refusal.value)
    assert "\n" not in message and kafka_case.markers_in in message and "retention.bytes=1048576" in message
    assert "retention.ms=-1" in message  # says what to set
    assert (refusal.value.fault, refusal.value.retriable) == ("external", False)


def test_a_restore_whose_marker_is_below_the_log_start_fails_instead_of_producing_it_again(
    kafka_case: KafkaSinkCase,
) -> None:
    """Checkpoint 1 committed, then its marker was deleted (as retention would): before, recovery read
    "not committed" and produced epoch 1 a second time (v1..v3 twice in read_committed)."""
    abandoned = kafka_case.sink()
    abandoned.open()
    feed(abandoned, 1, 3)
    snapshot = abandoned.snapshot_state(1)
    assert snapshot is not None
    abandoned.notify_checkpoint_complete(1)
    abandoned.close()
    for partition, high in kafka.end_offsets(kafka_case.endpoints, kafka_case.markers_in).items():
        kafka.delete_records_before(kafka_case.endpoints, kafka_case.markers_in, partition, high)

    with pytest.raises(CommitMarkerLostError) as lost:
        kafka_case.recovered(snapshot)
    message = str(lost.value)
    assert f"{kafka_case.markers_in}[0] from offset 0" in message and "log start offset" in message
    assert (lost.value.fault, lost.value.retriable) == ("external", False)
    assert kafka_case.values("read_committed") == values(1, 3)  # produced once


def subtasks_sharing_a_legacy_partition(job_id: str, uid: str) -> tuple[int, int]:
    """Two subtasks whose markers shared a partition of the former 6-partition ``weir-sink-commits``
    (partition ``crc32(key) % 6``; of 7 subtasks two always do)."""
    legacy = {s: zlib.crc32(f"{job_id}/{uid}/{s}".encode()) % 6 for s in range(7)}
    return next((a, b) for a, b in itertools.combinations(range(7), 2) if legacy[a] == legacy[b])


def test_one_subtasks_open_transaction_does_not_hold_up_another_subtasks_recovery(kafka_job: KafkaSinkCase) -> None:
    """Subtask A keeps a transaction open (pre-committed, its checkpoint not complete) while subtask B
    recovers. Before: their markers shared a partition, so B's read_committed check of its own marker
    waited behind A's open transaction until B's recovery timed out."""
    a, b = subtasks_sharing_a_legacy_partition(kafka_job.job_id, kafka_job.uid)
    parallelism = b + 1
    holder = kafka_job.sink(a, parallelism)
    holder.open()
    feed(holder, 1, 3)
    holder.snapshot_state(1)  # A's transaction stays open: marker flushed, no commit
    try:
        crashed = kafka_job.sink(b, parallelism)
        crashed.open()
        feed(crashed, 11, 12)
        snapshot = crashed.snapshot_state(1)  # B's marker lands after A's transaction began
        assert snapshot is not None

        recovered = kafka_job.recovered(snapshot, b, parallelism)  # B fences its old producer, recovers
        recovered.close()

        offsets = kafka.partition_offsets(kafka_job.endpoints, kafka_job.markers_in, parallelism)
        low, stable, high = offsets[a]
        assert stable < high, "A's transaction is still open while B's recovery has finished"
        committed = [
            CommitMarker.parse(value)
            for partition, _o, _k, value, _ts in kafka.read_committed_records(kafka_job.endpoints, kafka_job.markers_in)
        ]
        assert [(m.subtask, m.checkpoint_id, m.records) for m in committed if m is not None] == [(b, 1, 2)]

        holder.notify_checkpoint_complete(1)
    finally:
        holder.close()
    assert sorted(kafka_job.values("read_committed")) == sorted(values(1, 3) + values(11, 12))


def test_validate_at_submit_names_a_missing_output_topic_and_creates_nothing(kafka_job: KafkaSinkCase) -> None:
    from weir.operators.sinks import KafkaSinkOperator

    missing = f"{kafka_job.topic}-missing"
    sinks = [
        TransactionalKafkaSinkOperator(missing, str.encode, None),
        KafkaSinkOperator(missing, str.encode, None),
    ]
    for sink in sinks:
        with pytest.raises(JobDefinitionError) as refusal:
            sink.validate_at_submit(kafka_job.endpoints)
        assert f"kafka sink output topic {missing!r} does not exist" in str(refusal.value)
        assert "\n" not in str(refusal.value)
        TransactionalKafkaSinkOperator(kafka_job.topic, str.encode, None).validate_at_submit(kafka_job.endpoints)
    assert kafka.topic_partition_count(kafka_job.endpoints, missing) is None
    assert kafka.topic_partition_count(kafka_job.endpoints, kafka_job.markers_in) is None

    unreachable = kafka_job.endpoints.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"})
    with pytest.raises(ServiceUnavailableError, match="no answer from 127.0.0.1:1"):  # both ask the same way
        sinks[0].validate_at_submit(unreachable)


# Epochs larger than the sink's memory bound -------------------------------------------------------

MEMORY_BOUND = 1024 * 1024
LARGE_VALUE = 1024  # bytes per value: a 20 MiB epoch is 20,480 records


def large_values(first: int, last: int) -> list[str]:
    return [f"v{i}:".ljust(LARGE_VALUE, ".") for i in range(first, last + 1)]


def spilling_sink(case: KafkaSinkCase, spill: Path) -> TransactionalKafkaSinkOperator:
    return case.sink(epoch_memory_bytes=MEMORY_BOUND, spill_directory=spill)


def spill_files(spill: Path) -> list[Path]:
    return sorted(p for p in spill.rglob("*") if p.is_file()) if spill.exists() else []


@dataclasses.dataclass(frozen=True)
class PeakMemory:
    """Python memory allocated beyond what was held before a step, at its peak (tracemalloc)."""

    bytes: int

    @property
    def mib(self) -> float:
        return round(self.bytes / 2**20, 2)


class MemoryTrace:
    def __init__(self) -> None:
        self.steps: dict[str, PeakMemory] = {}

    def __enter__(self) -> MemoryTrace:
        tracemalloc.start()
        self._base = tracemalloc.get_traced_memory()[0]
        return self

    def step(self, name: str) -> None:
        """The peak since the previous step, above the memory held when tracing began."""
        self.steps[name] = PeakMemory(tracemalloc.get_traced_memory()[1] - self._base)
        tracemalloc.reset_peak()

    def __exit__(self, *exc: object) -> None:
        tracemalloc.stop()


def test_an_epoch_far_above_the_memory_bound_is_committed_once_without_holding_its_records(
    kafka_case: KafkaSinkCase, tmp_path: Path
) -> None:
    """20 MiB in one epoch with a 1 MiB bound: records spill to the epoch's file, the snapshot streams
    from it, the commit removes it. Before: every record stayed in a list (peak above the epoch)."""
    spill = tmp_path / "spill"
    expected = large_values(1, 20 * 1024)
    epoch_bytes = len(expected) * LARGE_VALUE
    sink = spilling_sink(kafka_case, spill)
    sink.open()
    with MemoryTrace() as trace:
        for value in expected:
            sink.process(value, TS)
        trace.step("process")
        snapshot = sink.snapshot_state(1)
        assert snapshot is not None
        trace.step("snapshot")
        assert len(spill_files(spill)) == 1  # the epoch's file, until its commit
        sink.notify_checkpoint_complete(1)
        trace.step("commit")
    print({name: peak.mib for name, peak in trace.steps.items()}, "MiB; snapshot", len(snapshot) / 2**20, "MiB")
    assert trace.steps["process"].bytes < epoch_bytes / 5
    held = len(snapshot)  # the snapshot's bytes, held by this test from the snapshot on
    assert trace.steps["snapshot"].bytes - held < epoch_bytes / 4  # the bytes (and BytesIO's slack), not the records
    assert trace.steps["commit"].bytes - held < epoch_bytes / 5
    assert spill_files(spill) == []
    assert sample("weir_sink_records_committed_total", kafka_case) == len(expected)
    sink.close()
    assert not spill.exists() or list(spill.iterdir()) == []

    restored = SinkSnapshot.from_bytes(snapshot)
    assert [len(records) for records in restored.epochs.values()] == [len(expected)]
    assert kafka_case.values("read_committed") == expected
    assert committed_markers(kafka_case) == [(1, len(expected))]


def test_an_epoch_above_the_memory_bound_is_recovered_once_after_an_abandoned_instance(
    kafka_case: KafkaSinkCase, tmp_path: Path
) -> None:
    """The instance holding a spilled 20 MiB epoch pre-committed at checkpoint 1 is abandoned (no
    close, its file left behind); recovery from checkpoint 1 re-produces the epoch from the snapshot."""
    expected = large_values(1, 20 * 1024)
    abandoned = spilling_sink(kafka_case, tmp_path / "spill")
    abandoned.open()
    for value in expected:
        abandoned.process(value, TS)
    snapshot = abandoned.snapshot_state(1)
    assert snapshot is not None
    assert len(spill_files(tmp_path / "spill")) == 1

    recovered = spilling_sink(kafka_case, tmp_path / "spill")
    recovered.restore_state(snapshot)
    recovered.open()
    feed(recovered, 1, 2)
    recovered.snapshot_state(2)
    recovered.notify_checkpoint_complete(2)
    recovered.close()
    assert kafka_case.values("read_committed") == expected + values(1, 2)
    assert len(kafka_case.values("read_uncommitted")) == 2 * len(expected) + 2  # aborted, then redone
    assert committed_markers(kafka_case) == [(1, len(expected)), (2, 2)]


def test_an_epoch_that_waited_on_disk_is_produced_from_its_file_after_the_older_commit(
    kafka_case: KafkaSinkCase, tmp_path: Path
) -> None:
    """Checkpoint 1's notification is late: epoch 2 (3 MiB) waits behind its open transaction and
    spills; when checkpoint 2 completes, 1 commits, then 2 is produced from its file and committed."""
    spill = tmp_path / "spill"
    first, second = large_values(1, 1024), large_values(1025, 4 * 1024)
    sink = spilling_sink(kafka_case, spill)
    sink.open()
    for value in first:
        sink.process(value, TS)
    sink.snapshot_state(1)
    for value in second:
        sink.process(value, TS)
    sink.snapshot_state(2)
    assert kafka_case.values("read_uncommitted") == first  # 2 is only on disk
    assert len(spill_files(spill)) == 2
    sink.notify_checkpoint_complete(2)
    assert spill_files(spill) == []
    sink.close()
    assert kafka_case.values("read_committed") == first + second
    assert committed_markers(kafka_case) == [(1, len(first)), (2, len(second))]
