"""The two-phase-commit PostgreSQL sink against the real server: prepare, commit, crash and recovery;
and the version guard of the idempotent upsert sink."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from connectors import postgres
from taskmanager.operators.sinks import PostgresUpsertSinkOperator
from taskmanager.operators.transactional_sinks import (
    SinkTransactionLostError,
    TwoPhasePostgresSinkOperator,
    gid_prefix,
)
from taskmanager.twophase import TransactionId
from tests.integration.sinks.conftest import TASKMANAGER, PostgresSinkCase, row, run_until_crash, set_up
from weir.crashpoints import EXIT_CODE
from weir.errors import JobDefinitionError, ServiceUnavailableError
from weir.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId

pytestmark = pytest.mark.integration

TS = int(time.time()) * 1000  # now: the broker's 7-day retention deletes older records mid-test


def expected(first: int, last: int) -> list[tuple[Any, ...]]:
    return [(i, f"name-{i}", Decimal(i) / 4) for i in range(first, last + 1)]


def feed(sink: TwoPhasePostgresSinkOperator, first: int, last: int) -> None:
    for i in range(first, last + 1):
        sink.process(row(i), TS)


def gid(case: PostgresSinkCase, epoch: int, subtask: int = 0) -> str:
    task = TaskId(JobId(case.job_id), OperatorUid(case.uid), SubtaskIndex(subtask))
    return TransactionId.for_task(task, CheckpointId(epoch)).gid


def sample(name: str, case: PostgresSinkCase, subtask: int = 0) -> float:
    labels = {"job_id": case.job_id, "operator_uid": case.uid, "subtask": str(subtask), "taskmanager": TASKMANAGER}
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_two_committed_epochs_are_written_once_with_their_proof(postgres_case: PostgresSinkCase) -> None:
    sink = postgres_case.sink()
    sink.open()
    feed(sink, 1, 3)
    sink.snapshot_state(1)
    assert postgres_case.prepared() == [gid(postgres_case, 1)]
    assert postgres_case.rows() == []  # prepared, not visible
    assert sample("weir_sink_prepared_transactions", postgres_case) == 1
    sink.notify_checkpoint_complete(1)
    assert postgres_case.prepared() == []
    feed(sink, 4, 5)
    sink.process({"id": 1, "name": "name-1", "amount": Decimal("0.25")}, TS)  # same row again: one upsert
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    assert sample("weir_sink_transactions_committed_total", postgres_case) == 2
    assert sample("weir_sink_records_committed_total", postgres_case) == 6
    assert sample("weir_sink_prepared_transactions", postgres_case) == 0
    sink.close()

    assert postgres_case.rows() == expected(1, 5)
    assert postgres_case.proofs() == [(0, 1, 3), (0, 2, 3)]


def test_crash_after_prepare_rolls_back_to_the_previous_checkpoint(
    postgres_case: PostgresSinkCase, tmp_path: Path
) -> None:
    """Killed after PREPARE at the second barrier: checkpoint 2 never completed; recovery from 1
    rolls the prepared transaction back, and the replayed epoch commits with checkpoint 3."""
    crash = run_until_crash(
        tmp_path,
        postgres_case.endpoints,
        "after_pre_commit:2",
        kind="postgres",
        job_id=postgres_case.job_id,
        uid=postgres_case.uid,
        table=postgres_case.table,
        epochs=[[row(i) for i in range(1, 4)], [row(i) for i in range(4, 6)]],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert "crash_point_hit" in crash.output
    assert sorted(crash.snapshots) == [1]
    assert postgres_case.prepared() == [gid(postgres_case, 2)]  # survived its session

    sink = postgres_case.recovered(crash.snapshots[1])
    assert postgres_case.prepared() == []
    assert postgres_case.rows() == expected(1, 3)
    assert sample("weir_sink_transactions_aborted_total", postgres_case) == 1

    feed(sink, 4, 5)
    sink.snapshot_state(3)
    sink.notify_checkpoint_complete(3)
    sink.close()
    assert postgres_case.rows() == expected(1, 5)
    assert postgres_case.proofs() == [(0, 1, 3), (0, 3, 2)]


def test_crash_after_completion_before_commit_commits_on_recovery(
    postgres_case: PostgresSinkCase, tmp_path: Path
) -> None:
    crash = run_until_crash(
        tmp_path,
        postgres_case.endpoints,
        "after_checkpoint_complete_before_commit",
        kind="postgres",
        job_id=postgres_case.job_id,
        uid=postgres_case.uid,
        table=postgres_case.table,
        epochs=[[row(i) for i in range(1, 4)]],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert postgres_case.prepared() == [gid(postgres_case, 1)]
    assert postgres_case.rows() == []

    first = postgres_case.recovered(crash.snapshots[1])
    first.close()
    assert postgres_case.prepared() == []
    assert postgres_case.rows() == expected(1, 3)

    second = postgres_case.recovered(crash.snapshots[1])  # recovering twice commits nothing twice
    second.close()
    assert postgres_case.rows() == expected(1, 3)
    assert postgres_case.proofs() == [(0, 1, 3)]


def test_between_sink_commits_is_the_start_of_the_commit(postgres_case: PostgresSinkCase, tmp_path: Path) -> None:
    crash = run_until_crash(
        tmp_path,
        postgres_case.endpoints,
        "between_sink_commits#0",
        kind="postgres",
        job_id=postgres_case.job_id,
        uid=postgres_case.uid,
        table=postgres_case.table,
        epochs=[[row(1)]],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert postgres_case.prepared() == [gid(postgres_case, 1)]
    postgres_case.recovered(crash.snapshots[1]).close()
    assert postgres_case.rows() == expected(1, 1)


def test_lost_notification_is_covered_by_the_next_checkpoint(postgres_case: PostgresSinkCase) -> None:
    sink = postgres_case.sink()
    sink.open()
    feed(sink, 1, 2)
    sink.snapshot_state(1)  # prepared; its notification is lost
    feed(sink, 2, 4)  # id 2 again: a second prepared transaction would wait on the first one's row lock
    sink.snapshot_state(2)  # kept in memory and in the snapshot until 1 commits
    sink.notify_checkpoint_aborted(3)
    assert postgres_case.prepared() == [gid(postgres_case, 1)]
    sink.notify_checkpoint_complete(2)  # commits 1, then writes and commits 2
    sink.close()
    assert postgres_case.prepared() == []
    assert postgres_case.rows() == expected(1, 4)
    assert postgres_case.proofs() == [(0, 1, 2), (0, 2, 3)]


def test_recovery_from_a_checkpoint_with_two_pending_epochs(postgres_case: PostgresSinkCase) -> None:
    """Checkpoint 2 completed while 1's notification was lost, then the process died: 1 is prepared
    (committed by recovery), 2 only in the snapshot (written by recovery)."""
    abandoned = postgres_case.sink()
    abandoned.open()
    feed(abandoned, 1, 2)
    abandoned.snapshot_state(1)
    feed(abandoned, 3, 4)
    snapshot = abandoned.snapshot_state(2)
    abandoned.close()  # the session ends; the prepared transaction stays

    postgres_case.recovered(snapshot).close()
    assert postgres_case.prepared() == []
    assert postgres_case.rows() == expected(1, 4)
    assert postgres_case.proofs() == [(0, 1, 2), (0, 2, 2)]


def test_recovery_without_a_checkpoint_rolls_back_every_prepared_transaction(
    postgres_case: PostgresSinkCase,
) -> None:
    abandoned = postgres_case.sink()
    abandoned.open()
    feed(abandoned, 1, 2)
    abandoned.snapshot_state(1)
    abandoned.close()
    other_subtask = postgres_case.sink(subtask=1)
    other_subtask.open()
    feed(other_subtask, 10, 10)
    other_subtask.snapshot_state(1)
    other_subtask.close()

    postgres_case.recovered(None).close()  # subtask 0 starts over
    assert postgres_case.prepared() == [gid(postgres_case, 1, subtask=1)]  # another subtask's: untouched
    assert postgres_case.rows() == []


def test_a_lost_prepared_transaction_fails_loudly(postgres_case: PostgresSinkCase) -> None:
    sink = postgres_case.sink()
    sink.open()
    feed(sink, 1, 1)
    snapshot = sink.snapshot_state(1)
    sink.close()
    postgres_case.query(f"ROLLBACK PREPARED '{gid(postgres_case, 1)}'")  # outside the job
    with pytest.raises(SinkTransactionLostError, match="rolled back outside this run"):
        postgres_case.recovered(snapshot)


def test_disabled_prepared_transactions_fail_clearly_at_open(
    postgres_case: PostgresSinkCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server here allows prepared transactions; pretend its SHOW answered 0 and run the real
    open(): the decision and the message come from the sink's own code path."""
    shown: list[int] = []
    real_show = postgres.max_prepared_transactions

    def show_zero(conn: psycopg.Connection[Any]) -> int:
        shown.append(real_show(conn))
        return 0

    monkeypatch.setattr(postgres, "max_prepared_transactions", show_zero)
    sink = postgres_case.sink()
    with pytest.raises(JobDefinitionError, match="max_prepared_transactions = 0") as failure:
        sink.open()
    sink.close()
    assert shown and shown[0] > 0  # the real server was asked
    assert "delivery='upsert'" in str(failure.value)
    assert failure.value.fault == "external"


def test_prepared_transactions_check() -> None:
    postgres.check_prepared_transactions(1, sink="s", server="h")
    with pytest.raises(JobDefinitionError, match="cannot prepare transactions"):
        postgres.check_prepared_transactions(0, sink="s", server="h")


def test_a_row_lock_held_by_another_transaction_times_out_clearly(postgres_case: PostgresSinkCase) -> None:
    """Two subtasks writing the same key: the second cannot prepare while the first holds the row."""
    first = postgres_case.sink(subtask=0)
    first.open()
    feed(first, 1, 1)
    first.snapshot_state(1)
    second = postgres_case.sink(subtask=1, lock_timeout_s=0.5)
    second.open()
    feed(second, 1, 1)
    with pytest.raises(ServiceUnavailableError, match="row lock was not granted"):
        second.snapshot_state(1)
    first.notify_checkpoint_complete(1)
    first.close()
    second.close()


def test_gids_of_a_subtask_share_a_prefix(postgres_case: PostgresSinkCase) -> None:
    task = TaskId(JobId(postgres_case.job_id), OperatorUid(postgres_case.uid), SubtaskIndex(1))
    assert gid(postgres_case, 7, subtask=1).startswith(gid_prefix(task))
    assert not gid(postgres_case, 7, subtask=11).startswith(gid_prefix(task))


# The idempotent upsert sink ------------------------------------------------------------------------


def test_upsert_version_guard_makes_replays_of_older_rows_harmless(postgres_case: PostgresSinkCase) -> None:
    columns = ("id", "name", "amount")

    def upsert_sink() -> PostgresUpsertSinkOperator:
        operator = PostgresUpsertSinkOperator(
            postgres_case.table,
            columns,
            ("id",),
            lambda v: (v["id"], v["name"], v["amount"]),
            version_column="amount",
        )
        set_up(operator, postgres_case.job_id, "upsert-sink")
        operator.open()
        return operator

    sink = upsert_sink()
    for amount in (1, 3, 2):  # within a batch the newest version wins, not the last row
        sink.process({"id": 1, "name": f"v{amount}", "amount": Decimal(amount)}, None)
    sink.snapshot_state(1)
    assert postgres_case.rows() == [(1, "v3", Decimal(3))]

    replay = upsert_sink()  # a replay after a failure sends older versions again
    replay.process({"id": 1, "name": "v2", "amount": Decimal(2)}, None)
    replay.process({"id": 2, "name": "v1", "amount": Decimal(1)}, None)
    replay.end_input()
    assert postgres_case.rows() == [(1, "v3", Decimal(3)), (2, "v1", Decimal(1))]
    replay.process({"id": 1, "name": "v3-again", "amount": Decimal(3)}, None)  # equal version: applied
    replay.end_input()
    assert postgres_case.rows() == [(1, "v3-again", Decimal(3)), (2, "v1", Decimal(1))]
    sink.close()
    replay.close()
