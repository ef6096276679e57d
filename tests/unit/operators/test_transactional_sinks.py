"""The pure parts of the exactly-once sinks: submit-time checks, markers, snapshots, recovery decisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import Environment
from weir.connectors import postgres
from weir.core.changelog import Delete, KeyedChanges
from weir.core.errors import Fault, JobDefinitionError, SerializationError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.metrics import END_TO_END_LATENCY_BUCKETS, observe_latencies
from weir.core.rejections import UserFunctionError
from weir.core.serde import dumps_value
from weir.operators.sinks import KafkaSinkOperator, PostgresUpsertSinkOperator
from weir.operators.transactional_sinks import (
    CommitMarker,
    Deadline,
    EndOfInputNotCheckpointedError,
    SinkFencedError,
    SinkSnapshot,
    TransactionalKafkaSinkOperator,
    TwoPhasePostgresSinkOperator,
    gid_prefix,
    last_committed_checkpoint,
    row_key_indexes,
    sink_fenced_error,
)
from weir.operators.twophase import LedgerSnapshot, PendingTransaction, TransactionId

TASK = TaskId(JobId("job-1"), OperatorUid("sink"), SubtaskIndex(0))


def cp(n: int) -> CheckpointId:
    return CheckpointId(n)


# The API ------------------------------------------------------------------------------------------


def test_delivery_chooses_the_operator() -> None:
    env = Environment("j", parallelism=1)
    source = env.from_collection([{"k": 1}], uid="src")
    source.sink_to_kafka("t", uid="k1")
    source.sink_to_kafka("t", uid="k2", delivery="at_least_once")
    source.sink_to_postgres("t", uid="p1", columns=("k",), key_columns=("k",))
    source.sink_to_postgres("t", uid="p2", columns=("k",), key_columns=("k",), delivery="upsert")
    kinds = {uid: type(env.graph.transformations[uid].factory()) for uid in ("k1", "k2", "p1", "p2")}
    assert kinds == {
        "k1": TransactionalKafkaSinkOperator,
        "k2": KafkaSinkOperator,
        "p1": TwoPhasePostgresSinkOperator,
        "p2": PostgresUpsertSinkOperator,
    }
    assert env.graph.transformations["k1"].name == "kafka-sink:t"
    assert env.graph.transformations["p1"].name == "postgres-sink:t"


def test_bad_sink_arguments_fail_at_build_time() -> None:
    source = Environment("j").from_collection([1], uid="src")
    with pytest.raises(JobDefinitionError, match="delivery must be"):
        source.sink_to_kafka("t", uid="a", delivery="exactly-once")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="exactly_once' only"):
        source.sink_to_kafka("t", uid="b", delivery="at_least_once", transaction_timeout_ms=1000)
    with pytest.raises(JobDefinitionError, match="delivery must be"):
        source.sink_to_postgres("t", uid="c", columns=("k",), key_columns=("k",), delivery="2pc")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="missing"):
        source.sink_to_postgres("t", uid="d", columns=("k",), key_columns=("k",), version_column="v")


# Markers and recovery decisions -------------------------------------------------------------------


def test_a_marker_round_trips_and_anything_else_is_not_one() -> None:
    marker = CommitMarker("job-1", "sink", 0, 7, 42, "weir-job-1-sink-0")
    assert CommitMarker.parse(marker.to_json()) == marker
    assert marker.belongs_to(TASK)
    assert not marker.belongs_to(TaskId(JobId("job-1"), OperatorUid("sink"), SubtaskIndex(1)))
    for other in (None, b"", b"not json", b'{"job_id": "j"}', b"[1, 2]"):
        assert CommitMarker.parse(other) is None


def test_the_newest_committed_marker_decides() -> None:
    committed = {15}
    checked: list[int] = []

    def is_committed(offset: int) -> bool:
        checked.append(offset)
        return offset in committed

    # checkpoint 3 first attempt at 10 (aborted), 4 at 12 (aborted), 3 redone at 15 (committed)
    candidates = [(10, cp(3)), (12, cp(4)), (15, cp(3))]
    assert last_committed_checkpoint(candidates, is_committed) == 3
    assert checked == [15]
    committed.clear()
    checked.clear()
    assert last_committed_checkpoint(candidates, is_committed) is None
    assert checked == [15, 12, 10]
    assert last_committed_checkpoint([], is_committed) is None


def test_gid_prefix_separates_subtasks() -> None:
    prefix = gid_prefix(TASK)
    assert TransactionId.for_task(TASK, cp(5)).gid.startswith(prefix)
    other = TaskId(JobId("job-1"), OperatorUid("sink"), SubtaskIndex(10))
    assert not TransactionId.for_task(other, cp(5)).gid.startswith(prefix)


# Snapshots ----------------------------------------------------------------------------------------


def test_a_snapshot_round_trips() -> None:
    txn = TransactionId.for_task(TASK, cp(3))
    ledger = LedgerSnapshot(TASK, cp(4), (PendingTransaction(cp(4), txn),))
    snapshot = SinkSnapshot(ledger, {cp(4): [(b"k", b"v", 5), (None, b"w", None)]}, marker_floor=17)
    assert SinkSnapshot.from_bytes(snapshot.to_bytes()) == snapshot


def test_a_snapshot_of_another_format_is_refused() -> None:
    with pytest.raises(SerializationError, match="format 99"):
        SinkSnapshot.from_bytes(dumps_value({"format": 99}))
    with pytest.raises(SerializationError, match="format 'list'"):
        SinkSnapshot.from_bytes(dumps_value([1]))


# Rows ---------------------------------------------------------------------------------------------


def test_an_epoch_collapses_upserts_and_deletes_per_key_and_its_snapshot_holds_them(make_context: MakeContext) -> None:
    """A row function returning Delete(key) deletes; the epoch written at the barrier (here: its
    snapshot, the sink not opened) holds one change per key, in the order applying them leaves."""

    def to_row(v: tuple[str, int, str]) -> tuple[Any, ...] | Delete:
        op, key, name = v
        return Delete((key,)) if op == "delete" else (key, name)

    sink = TwoPhasePostgresSinkOperator("t", ("id", "name"), ("id",), to_row)
    sink.setup(make_context("pg-sink"), CollectingOutput())
    for value in [("upsert", 1, "a"), ("delete", 1, ""), ("delete", 2, ""), ("upsert", 2, "b"), ("upsert", 3, "c")]:
        sink.process(value, None)
    epoch = sink._close_epoch(cp(1))  # noqa: SLF001 - closing without PostgreSQL
    assert epoch is not None and epoch.size == 3
    snapshot = SinkSnapshot.from_bytes(sink._snapshot().to_bytes())  # noqa: SLF001
    assert snapshot.format == 2
    assert snapshot.epochs == {cp(1): [("d", (1,)), ("u", (2, "b"), True), ("u", (3, "c"), False)]}
    restored = KeyedChanges.decode(snapshot.epochs[cp(1)], snapshot.format, (0,))
    assert (restored.deletes(), restored.upserts()) == ([(1,), (2,)], [(2, "b"), (3, "c")])


def test_a_format_1_snapshot_of_a_postgres_sink_restores_its_rows_as_upserts() -> None:
    txn = TransactionId.for_task(TASK, cp(3))
    ledger = LedgerSnapshot(TASK, cp(4), (PendingTransaction(cp(4), txn),))
    older = dumps_value(
        {"format": 1, "ledger": ledger.to_bytes(), "epochs": [(4, [(1, "a"), (2, "b")])], "marker_floor": None}
    )
    restored = SinkSnapshot.from_bytes(older)
    changes = KeyedChanges.decode(restored.epochs[cp(4)], restored.format, (0,))
    assert (restored.format, changes.deletes(), changes.upserts()) == (1, [], [(1, "a"), (2, "b")])


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (lambda v: Delete((1, 2)), "the Delete key has 2 values for 1 key columns"),
        (lambda v: Delete(1), r"Delete\(key\) takes a non-empty tuple"),
        (lambda v: (1,), "the row has 1 values for 2 columns"),
    ],
)
def test_a_change_of_the_wrong_shape_is_one_clear_error(make_context: MakeContext, given: Any, error: str) -> None:
    sink = TwoPhasePostgresSinkOperator("t", ("id", "name"), ("id",), given)
    sink.setup(make_context("pg-sink"), CollectingOutput())
    with pytest.raises(UserFunctionError, match=error):
        sink.process("value", None)
    assert sink._current is None  # noqa: SLF001 - nothing was taken into an epoch


def test_key_and_version_columns_must_be_columns() -> None:
    assert row_key_indexes("t", ("a", "b", "v"), ("b", "a"), "v") == ((1, 0), 2)
    assert row_key_indexes("t", ("a",), ("a",), None) == ((0,), None)
    with pytest.raises(JobDefinitionError, match="missing"):
        row_key_indexes("t", ("a",), ("a",), "v")
    with pytest.raises(JobDefinitionError):
        row_key_indexes("t", ("a",), (), None)


def test_a_deadline_is_one_budget() -> None:
    now = [100.0]
    deadline = Deadline(5.0, clock=lambda: now[0])
    now[0] = 103.0
    assert deadline.remaining() == pytest.approx(2.0)
    now[0] = 106.0
    assert deadline.expired and deadline.remaining() == 0.1


# Metrics ------------------------------------------------------------------------------------------


def test_bulk_latency_observation_matches_one_by_one() -> None:
    registry = CollectorRegistry()
    bulk = Histogram("bulk", "b", ["l"], buckets=END_TO_END_LATENCY_BUCKETS, registry=registry)
    single = Histogram("single", "s", ["l"], buckets=END_TO_END_LATENCY_BUCKETS, registry=registry)
    now = 1_700_000_000_000.0
    stamps = [int(now - d) for d in (0, 50, 51, 99, 100, 2_500, 2_501, 61_000, 5_000_000)] + [int(now + 10)] * 3
    observe_latencies(bulk.labels("x"), stamps, now)
    for ts in stamps:
        single.labels("x").observe(max(0.0, (now - ts) / 1000.0))
    for suffix in ("_count", "_sum"):
        assert registry.get_sample_value(f"bulk{suffix}", {"l": "x"}) == pytest.approx(
            registry.get_sample_value(f"single{suffix}", {"l": "x"})
        )
    for bound in ("0.05", "0.1", "2.5", "60.0", "1800.0", "+Inf"):
        labels = {"l": "x", "le": bound}
        assert registry.get_sample_value("bulk_bucket", labels) == registry.get_sample_value("single_bucket", labels)
    observe_latencies(bulk.labels("x"), [], now)
    assert registry.get_sample_value("bulk_count", {"l": "x"}) == len(stamps)


# PostgreSQL sink ownership (fencing) --------------------------------------------------------------


def test_the_owner_lock_key_is_stable_and_per_subtask() -> None:
    """The key is part of the protocol between versions: a changed derivation would let an old and a
    new TaskManager own the same subtask at once."""
    assert postgres.sink_owner_lock_key("job-1", "sink", 0) == postgres.sink_owner_lock_key("job-1", "sink", 0)
    assert postgres.sink_owner_lock_key("job-1", "sink", 0) == -6953711554684819208
    keys = {
        postgres.sink_owner_lock_key(job, uid, subtask)
        for job in ("job-1", "job-11")
        for uid in ("sink", "sink1", "1sink")
        for subtask in (0, 1, 10)
    }
    assert len(keys) == 18
    assert postgres.sink_owner_lock_key("a", "b1", 0) != postgres.sink_owner_lock_key("a", "b", 10)
    assert all(-(2**63) <= key < 2**63 for key in keys)
    owner = postgres.SinkOwner("job-1", "sink", 0, attempt=7)
    assert owner.lock_key == postgres.sink_owner_lock_key("job-1", "sink", 0)  # the attempt is not in it


def test_the_fenced_error_names_the_subtask_and_both_attempts() -> None:
    error = sink_fenced_error(TASK, attempt=2, owner_attempt=3)
    assert isinstance(error, SinkFencedError)
    assert error.fault == "internal" and not error.retriable
    message = str(error)
    assert "'sink'" in message and "job job-1" in message and "subtask 0" in message
    assert "attempt 2 is fenced, attempt 3 owns" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://weir:s3cret@127.0.0.1:15432/weir", "postgresql://weir@127.0.0.1:15432/weir"),
        ("postgresql://weir@db/weir?sslmode=require&password=s3cret", "postgresql://weir@db/weir?sslmode=require"),
        ("postgres://db:5432/weir", "postgres://db:5432/weir"),
        ("host=db port=5432 user=weir password=s3cret dbname=weir", "user=weir dbname=weir host=db port=5432"),
    ],
)
def test_dsns_in_messages_carry_no_password(dsn: str, shown: str) -> None:
    assert postgres.redacted_dsn(dsn) == shown  # key=value forms come back in libpq's order


# Marker topics ------------------------------------------------------------------------------------


def test_each_sink_of_each_job_has_its_own_marker_topic() -> None:
    from weir.operators.transactional_sinks import MAX_TOPIC_NAME, marker_topic_name, marker_topic_prefix

    name = marker_topic_name("3f2a9c0d1e2b4a5f", "kafka-sink")
    assert name.startswith("weir-sink-commits.kafka-sink.3f2a9c0d1e2b4a5f.")
    assert name == marker_topic_name("3f2a9c0d1e2b4a5f", "kafka-sink")  # the same in every run of the job
    assert name != marker_topic_name("3f2a9c0d1e2b4a60", "kafka-sink")
    assert marker_topic_name("job", "a/b") != marker_topic_name("job", "a_b")  # the same once reduced
    long = marker_topic_name("j" * 300, "sink with spaces/ünïcode" * 20)
    assert len(long) <= MAX_TOPIC_NAME
    for topic in (name, long):
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in topic)
    for uid in ("kafka-sink", "sink with spaces/ünïcode" * 20):
        assert marker_topic_name("j" * 300, uid).startswith(marker_topic_prefix(uid))
        assert marker_topic_name("job", uid).startswith(marker_topic_prefix(uid))


def test_the_marker_replication_factor_defaults_to_min_3_brokers_and_must_fit() -> None:
    from weir.operators.transactional_sinks import marker_replication_factor

    assert [marker_replication_factor(None, brokers) for brokers in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert marker_replication_factor(2, 3) == 2
    for requested, brokers in ((0, 3), (4, 3)):
        with pytest.raises(JobDefinitionError, match=f"between 1 and the Kafka cluster's broker count \\({brokers}\\)"):
            marker_replication_factor(requested, brokers)


def test_marker_replication_factor_is_an_exactly_once_sink_argument() -> None:
    source = Environment("j").from_collection([1], uid="src")
    source.sink_to_kafka("t", uid="a", marker_replication_factor=2)
    with pytest.raises(JobDefinitionError, match="marker_replication_factor must be at least 1"):
        source.sink_to_kafka("t", uid="b", marker_replication_factor=0)
    with pytest.raises(JobDefinitionError, match="exactly_once' only"):
        source.sink_to_kafka("t", uid="c", delivery="at_least_once", marker_replication_factor=1)


def test_epoch_memory_bytes_and_spill_directory_reach_the_operator_and_its_spec(tmp_path: Path) -> None:
    from weir.operators.epoch_spill import DEFAULT_EPOCH_MEMORY_BYTES

    env = Environment("j")
    source = env.from_collection([1], uid="src")
    source.sink_to_kafka("t", uid="default")
    source.sink_to_kafka("t", uid="bounded", epoch_memory_bytes=1 << 20, spill_directory=str(tmp_path))
    source.sink_to_kafka("t", uid="on-disk", epoch_memory_bytes=0, spill_directory=tmp_path)
    operators = {uid: env.graph.transformations[uid].factory() for uid in ("default", "bounded", "on-disk")}
    assert {uid: (op.epoch_memory_bytes, op.spill_directory) for uid, op in operators.items()} == {
        "default": (DEFAULT_EPOCH_MEMORY_BYTES, None),
        "bounded": (1 << 20, tmp_path),
        "on-disk": (0, tmp_path),
    }
    specs = {uid: env.graph.transformations[uid].sink_spec for uid in operators}
    assert {uid: spec.epoch_memory_bytes for uid, spec in specs.items() if spec is not None} == {
        "default": DEFAULT_EPOCH_MEMORY_BYTES,
        "bounded": 1 << 20,
        "on-disk": 0,
    }


def test_the_bound_set_through_the_api_is_the_one_the_sink_spills_at(tmp_path: Path) -> None:
    """Through the factory as a task builds it: each 1 KiB record counts 1184 bytes, so with a
    3000-byte bound the third record moves the epoch to a file in the given directory."""
    from weir.core.keygroups import KeyGroupRange
    from weir.core.metrics import TaskMetrics
    from weir.operators.base import OperatorContext

    env = Environment("j")
    env.from_collection([1], uid="src").sink_to_kafka(
        "t", uid="sink", serializer=bytes, epoch_memory_bytes=3000, spill_directory=tmp_path
    )
    sink = env.graph.transformations["sink"].factory()
    ctx = OperatorContext(
        job_id="job-1",
        job_name="j",
        uid="sink",
        subtask=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        key_group_range=KeyGroupRange(0, 127),  # type: ignore[arg-type]
        parameters={},
        state=None,
        metrics=TaskMetrics("job-1", "j", "sink", 0, "tm"),
    )
    sink.setup(ctx, None)
    sink._in_kafka = object()  # a transaction of another epoch is open: records wait in the spill
    epoch = sink._begin_epoch()
    for _ in range(2):
        sink.process(1024, None)
    assert not epoch.items.spilled
    sink.process(1024, None)
    assert epoch.items.spilled and epoch.items.path is not None and epoch.items.path.is_relative_to(tmp_path)
    sink._in_kafka = None
    sink.close()
    assert list(tmp_path.iterdir()) == []


def test_bad_epoch_memory_bytes_and_spill_directory_fail_at_build_time() -> None:
    source = Environment("j").from_collection([1], uid="src")
    for bad in (-1, 1.5, "64MiB", True):
        with pytest.raises(JobDefinitionError, match="epoch_memory_bytes must be an int of at least 0"):
            source.sink_to_kafka("t", uid="a", epoch_memory_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="must be an absolute path"):
        source.sink_to_kafka("t", uid="b", spill_directory="spill")
    with pytest.raises(JobDefinitionError, match="spill_directory must be a path"):
        source.sink_to_kafka("t", uid="c", spill_directory=3)  # type: ignore[arg-type]
    for name, value in (("epoch_memory_bytes", 1024), ("spill_directory", "/tmp/spill")):
        with pytest.raises(JobDefinitionError, match=f"{name} applies to delivery='exactly_once' only"):
            source.sink_to_kafka("t", uid="d", delivery="at_least_once", **{name: value})  # type: ignore[arg-type]


def test_a_snapshot_names_where_its_marker_floor_is_and_an_older_one_reads_without() -> None:
    txn = TransactionId.for_task(TASK, cp(3))
    ledger = LedgerSnapshot(TASK, cp(4), (PendingTransaction(cp(4), txn),))
    snapshot = SinkSnapshot(ledger, {cp(4): []}, 17, "weir-sink-commits.sink.job-1.0123456789", 0)
    assert SinkSnapshot.from_bytes(snapshot.to_bytes()) == snapshot
    older = dumps_value({"format": 1, "ledger": ledger.to_bytes(), "epochs": [(4, [])], "marker_floor": 17})
    restored = SinkSnapshot.from_bytes(older)
    assert (restored.marker_floor, restored.marker_topic, restored.marker_partition) == (17, None, None)


# End of input: everything was committed through checkpoints, or the task fails ---------------------


class InMemoryTransactions:
    """A transactional producer's contract (``weir.connectors.kafka.TransactionalProducer``) in memory:
    records go into the open transaction, a commit makes them visible, an abort drops them."""

    def __init__(self) -> None:
        self.open: list[tuple[str, bytes]] | None = None
        self.committed: list[tuple[str, bytes]] = []
        self.calls: list[str] = []
        self._offset = 0

    def begin(self) -> None:
        assert self.open is None, "a transaction is already open"
        self.calls.append("begin")
        self.open = []

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        delivery: Any = None,
    ) -> None:
        assert self.open is not None, "produce outside a transaction"
        self.open.append((topic, value))
        if delivery is not None:
            delivery.partition, delivery.offset = partition or 0, self._offset
            self._offset += 1

    def poll(self) -> None:
        pass

    def flush(self, timeout_s: float) -> None:
        self.calls.append("flush")

    def commit(self, timeout_s: float) -> None:
        assert self.open is not None
        self.calls.append("commit")
        self.committed += self.open
        self.open = None

    def abort(self, timeout_s: float) -> None:
        self.calls.append("abort")
        self.open = None

    def close(self) -> None:
        pass

    def values(self, topic: str = "out") -> list[bytes]:
        return [value for t, value in self.committed if t == topic]


def kafka_sink(
    make_context: MakeContext, tmp_path: Path, producer: InMemoryTransactions
) -> TransactionalKafkaSinkOperator:
    """An exactly-once Kafka sink over ``producer`` whose every record goes to its spill file (not
    opened: that would connect)."""
    sink = TransactionalKafkaSinkOperator(
        "out", lambda v: str(v).encode(), None, epoch_memory_bytes=0, spill_directory=tmp_path / "spill"
    )
    sink.setup(make_context("sink"), CollectingOutput())
    sink._producer = producer  # type: ignore[assignment]  # noqa: SLF001
    return sink


def test_a_kafka_sink_with_records_after_its_last_checkpoint_at_end_of_input_commits_none_of_them(
    make_context: MakeContext, tmp_path: Path
) -> None:
    """Records written after the last checkpoint's barrier: committing them at the end of input put
    them outside every checkpoint, and a restore of that checkpoint wrote them again (duplicates)."""
    producer = InMemoryTransactions()
    sink = kafka_sink(make_context, tmp_path, producer)
    for i in range(3):
        sink.process(i, 100 + i)
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    assert producer.values() == [b"0", b"1", b"2"]
    sink.process(3, 103)
    sink.process(4, 104)
    directory = sink._spill.directory  # noqa: SLF001
    assert directory is not None and any(directory.iterdir()), "the open epoch is on disk"
    with pytest.raises(EndOfInputNotCheckpointedError) as raised:
        sink.end_input()
    error = raised.value
    assert error.fault is Fault.INTERNAL and not error.retriable
    message = str(error)
    for part in ("job job-1", "'sink'", "subtask 0", "2 record(s)", "epoch 2: 2 record(s), open", "checkpoint 1"):
        assert part in message, (part, message)
    assert producer.values() == [b"0", b"1", b"2"] and producer.calls[-1] != "commit"
    sink.close()
    assert producer.calls[-1] == "abort" and producer.values() == [b"0", b"1", b"2"]
    assert not directory.exists(), "the spill of the uncommitted epoch outlived the sink"


def test_a_kafka_sink_with_an_epoch_pre_committed_but_not_committed_at_end_of_input_commits_nothing(
    make_context: MakeContext, tmp_path: Path
) -> None:
    """Its checkpoint's notification never came (the task waits for it before its end of input):
    whether the checkpoint completed is the JobManager's to say, not the sink's."""
    producer = InMemoryTransactions()
    sink = kafka_sink(make_context, tmp_path, producer)
    sink.process(7, None)
    sink.snapshot_state(4)
    with pytest.raises(EndOfInputNotCheckpointedError, match="epoch 1: 1 record\\(s\\), pre-committed at checkpoint 4"):
        sink.end_input()
    assert producer.values() == []
    sink.close()


def test_a_kafka_sink_whose_every_epoch_committed_ends_its_input_without_a_call(
    make_context: MakeContext, tmp_path: Path
) -> None:
    producer = InMemoryTransactions()
    sink = kafka_sink(make_context, tmp_path, producer)
    sink.process(1, None)
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.snapshot_state(2)  # the final checkpoint: nothing after the last one
    sink.notify_checkpoint_complete(2)
    calls = list(producer.calls)
    sink.end_input()
    assert producer.calls == calls and producer.values() == [b"1"]
    assert sink._spill.held_epochs() == {}  # noqa: SLF001
    sink.close()


def test_a_postgres_sink_with_rows_left_at_end_of_input_writes_none_of_them(make_context: MakeContext) -> None:
    """It used to prepare and commit them under the next epoch's id, a checkpoint id not issued yet,
    which the restarted attempt's own checkpoint then collided with in the proof table."""
    sink = TwoPhasePostgresSinkOperator("totals", ("id", "total"), ("id",), lambda v: (v, v * 10))
    sink.setup(make_context("pg-sink"), CollectingOutput())
    sink.process(1, None)
    sink.process(2, None)
    with pytest.raises(EndOfInputNotCheckpointedError) as raised:
        sink.end_input()  # not opened: any statement would fail on the missing session
    message = str(raised.value)
    for part in ("postgres sink 'pg-sink'", "job job-1", "subtask 0", "2 record(s)", "no checkpoint yet"):
        assert part in message, (part, message)
