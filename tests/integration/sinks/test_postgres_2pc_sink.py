"""The two-phase-commit PostgreSQL sink against the real server: prepare, commit, crash and recovery;
and the version guard of the idempotent upsert sink."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from tests.integration.sinks.conftest import (
    TASKMANAGER,
    NoOutput,
    PostgresSinkCase,
    operator_context,
    row,
    run_until_crash,
    set_up,
)
from weir.connectors import postgres
from weir.core.config import Endpoints
from weir.core.crashpoints import EXIT_CODE
from weir.core.errors import JobDefinitionError, ServiceUnavailableError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.operators.sinks import PostgresUpsertSinkOperator
from weir.operators.transactional_sinks import (
    SinkFencedError,
    SinkTransactionLostError,
    TwoPhasePostgresSinkOperator,
    gid_prefix,
)
from weir.operators.twophase import TransactionId

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
    labels = {
        "job_id": case.job_id,
        "job_name": "sink-test",
        "operator_uid": case.uid,
        "subtask": str(subtask),
        "taskmanager": TASKMANAGER,
    }
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


def test_a_table_dropped_under_a_running_sink_is_a_user_error_that_is_not_retried(
    postgres_case: PostgresSinkCase,
) -> None:
    """It used to come back as ServiceUnavailableError (retriable): the job restarted forever."""
    sink = postgres_case.sink()
    sink.open()
    feed(sink, 1, 3)
    postgres_case.query(f"ALTER TABLE {postgres_case.table} RENAME TO {postgres_case.table}_moved")
    try:
        with pytest.raises(JobDefinitionError, match="the rows do not fit the table: UndefinedTable") as raised:
            sink.snapshot_state(1)
        assert not raised.value.retriable and raised.value.fault == "user"
        assert postgres_case.prepared() == []
    finally:
        sink.close()
        postgres_case.query(f"ALTER TABLE {postgres_case.table}_moved RENAME TO {postgres_case.table}")


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


# Fencing: an older attempt never touches a newer attempt's transactions ----------------------------

COLUMNS = ("id", "name", "amount")


def attempt_sink(case: PostgresSinkCase, attempt: int, subtask: int = 0) -> TwoPhasePostgresSinkOperator:
    """A sink instance of one attempt of the job, as the task of that attempt would build it."""
    operator = TwoPhasePostgresSinkOperator(
        case.table, COLUMNS, ("id",), lambda v: (v["id"], v["name"], v["amount"]), claim_timeout_s=10.0
    )
    context = dataclasses.replace(operator_context(case.job_id, case.uid, subtask), attempt=attempt)
    operator.setup(context, NoOutput())
    return operator


def snapshot(sink: TwoPhasePostgresSinkOperator, checkpoint_id: int) -> bytes:
    data = sink.snapshot_state(checkpoint_id)
    assert data is not None
    return data


def stray_prepared_transaction(case: PostgresSinkCase, epoch: int, ids: range) -> None:
    """A transaction of this subtask prepared at a barrier whose checkpoint never completed (by a
    process long gone): rows only, under the subtask's gid for ``epoch``."""
    with psycopg.connect(case.endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        for i in ids:
            conn.execute(f"INSERT INTO {case.table} (id, name, amount) VALUES (%s, 'stray', 0)", (i,))
        conn.execute(f"PREPARE TRANSACTION '{gid(case, epoch)}'")


@pytest.fixture
def owners(postgres_case: PostgresSinkCase) -> Iterator[None]:
    """Forget this test job's owner rows afterwards (job ids are never reused)."""
    yield
    postgres_case.query("DELETE FROM weir_sink_owners WHERE job_id = %s", postgres_case.job_id)


def test_a_zombie_attempt_reaching_open_late_is_fenced_and_the_live_attempt_commits(
    postgres_case: PostgresSinkCase, owners: None
) -> None:
    """Attempt 2 was cancelled while restoring; attempt 3 restored the same checkpoint, opened and
    prepared checkpoint 4. When attempt 2's thread finally reaches open(), its recovery must fail
    instead of rolling back attempt 3's prepared transaction (which it does not list)."""
    first = attempt_sink(postgres_case, 1)
    first.open()
    feed(first, 1, 2)
    snapshot3 = snapshot(first, 3)  # checkpoint 3 completes; attempt 1 then fails (session left open)
    first.notify_checkpoint_complete(3)

    zombie = attempt_sink(postgres_case, 2)
    zombie.restore_state(snapshot3)  # cancelled here, its thread still running
    live = attempt_sink(postgres_case, 3)
    live.restore_state(snapshot3)
    live.open()
    feed(live, 3, 6)
    live.snapshot_state(4)
    assert postgres_case.prepared() == [gid(postgres_case, 4)]

    with pytest.raises(SinkFencedError, match=r"attempt 2 .*attempt 3") as fenced:
        zombie.open()
    assert fenced.value.fault == "internal" and not fenced.value.retriable
    assert postgres_case.prepared() == [gid(postgres_case, 4)]  # untouched

    live.notify_checkpoint_complete(4)
    assert postgres_case.prepared() == []
    assert postgres_case.rows() == expected(1, 6)
    assert postgres_case.proofs() == [(0, 3, 2), (0, 4, 4)]
    for sink in (zombie, live, first):
        sink.close()


def test_a_superseded_owner_cannot_commit_the_newer_attempts_transaction(
    postgres_case: PostgresSinkCase, owners: None
) -> None:
    """Attempt 1 owns and prepared epoch 1; attempt 2 takes over from no completed checkpoint, rolls
    epoch 1 back and prepares its own epoch 1 under the same gid. A late completion notification to
    attempt 1 would COMMIT PREPARED attempt 2's transaction: it must fail instead."""
    old = attempt_sink(postgres_case, 1)
    old.open()
    feed(old, 1, 3)
    old.snapshot_state(1)
    assert postgres_case.prepared() == [gid(postgres_case, 1)]

    new = attempt_sink(postgres_case, 2)
    new.open()  # no completed checkpoint: epoch 1 of attempt 1 is rolled back
    assert postgres_case.prepared() == []
    feed(new, 10, 12)
    new.snapshot_state(1)
    assert postgres_case.prepared() == [gid(postgres_case, 1)]

    with pytest.raises(SinkFencedError, match=r"attempt 1 .*attempt 2"):
        old.notify_checkpoint_complete(1)
    assert postgres_case.prepared() == [gid(postgres_case, 1)]
    assert postgres_case.rows() == []  # nothing committed before attempt 2's checkpoint completes

    new.notify_checkpoint_complete(1)
    assert postgres_case.rows() == expected(10, 12)
    assert postgres_case.proofs() == [(0, 1, 3)]
    old.close()
    new.close()


def test_a_superseded_owner_cannot_prepare(postgres_case: PostgresSinkCase, owners: None) -> None:
    old = attempt_sink(postgres_case, 5)
    old.open()
    feed(old, 1, 3)
    new = attempt_sink(postgres_case, 6)
    new.open()
    feed(new, 4, 4)
    new.snapshot_state(1)

    with pytest.raises(SinkFencedError, match=r"attempt 5 .*attempt 6"):
        old.snapshot_state(1)
    assert postgres_case.prepared() == [gid(postgres_case, 1)]
    new.notify_checkpoint_complete(1)
    assert postgres_case.rows() == expected(4, 4)
    old.close()
    new.close()


def test_end_of_job_resolution_commits_the_listed_rolls_back_the_rest_and_fences(
    postgres_case: PostgresSinkCase, owners: None
) -> None:
    """After the job ends, a fresh sink with a newer attempt restores the latest completed checkpoint,
    opens and closes: the listed transaction commits, every other prepared one of the subtask is
    rolled back, and the attempt still running is fenced."""
    running = attempt_sink(postgres_case, 4)
    running.open()
    feed(running, 1, 3)
    snapshot1 = snapshot(running, 1)  # checkpoint 1 completed; its notification never arrived
    stray_prepared_transaction(postgres_case, 2, range(100, 102))
    other_subtask = attempt_sink(postgres_case, 4, subtask=1)
    other_subtask.open()
    feed(other_subtask, 50, 50)
    other_subtask.snapshot_state(1)
    assert sorted(postgres_case.prepared()) == sorted(
        [gid(postgres_case, 1), gid(postgres_case, 2), gid(postgres_case, 1, 1)]
    )

    resolver = attempt_sink(postgres_case, 5)
    resolver.restore_state(snapshot1)
    resolver.open()
    resolver.close()

    assert postgres_case.prepared() == [gid(postgres_case, 1, subtask=1)]  # another subtask's: untouched
    assert postgres_case.rows() == expected(1, 3)
    assert postgres_case.proofs() == [(0, 1, 3)]
    with pytest.raises(SinkFencedError, match=r"attempt 4 .*attempt 5"):
        running.notify_checkpoint_complete(1)  # its session was ended by the resolver's claim
    with pytest.raises(SinkFencedError, match=r"attempt 4 .*attempt 5"):
        attempt_sink(postgres_case, 4).open()  # nor can attempt 4 come back
    running.close()
    other_subtask.notify_checkpoint_complete(1)  # subtask 1's owner was not disturbed
    other_subtask.close()
    assert postgres_case.rows() == [*expected(1, 3), *expected(50, 50)]


def test_end_of_job_resolution_without_a_completed_checkpoint_rolls_back_everything(
    postgres_case: PostgresSinkCase, owners: None
) -> None:
    running = attempt_sink(postgres_case, 1)
    running.open()
    feed(running, 1, 3)
    running.snapshot_state(1)

    resolver = attempt_sink(postgres_case, 2)
    resolver.open()
    resolver.close()
    assert postgres_case.prepared() == []
    assert postgres_case.rows() == []
    with pytest.raises(SinkFencedError):
        running.notify_checkpoint_complete(1)
    running.close()


def test_the_same_attempt_may_claim_again(postgres_case: PostgresSinkCase, owners: None) -> None:
    """A task restarted within the same attempt (or a test) takes over from its own earlier session."""
    earlier = attempt_sink(postgres_case, 3)
    earlier.open()
    feed(earlier, 1, 1)
    data = snapshot(earlier, 1)
    again = attempt_sink(postgres_case, 3)
    again.restore_state(data)
    again.open()  # commits epoch 1, listed by the snapshot
    again.close()
    earlier.close()
    assert postgres_case.rows() == expected(1, 1)


def test_a_claim_waits_for_another_claim_no_longer_than_its_timeout(
    postgres_case: PostgresSinkCase, owners: None
) -> None:
    """Claims of one subtask queue on its owner row: one stuck there fails the open clearly, in time."""
    first = attempt_sink(postgres_case, 1)
    first.open()
    with psycopg.connect(postgres_case.endpoints.postgres_dsn) as stuck:  # a claim in progress, never ending
        stuck.execute(
            "SELECT attempt FROM weir_sink_owners WHERE job_id = %s AND subtask = 0 FOR UPDATE", (postgres_case.job_id,)
        )
        second = TwoPhasePostgresSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple, claim_timeout_s=0.5)
        second.setup(
            dataclasses.replace(operator_context(postgres_case.job_id, postgres_case.uid), attempt=2), NoOutput()
        )
        with pytest.raises(ServiceUnavailableError, match=r"attempt 2 could not take ownership within 0.5s"):
            second.open()
        second.close()
    feed(first, 1, 1)  # the first attempt still owns the subtask
    first.snapshot_state(1)
    first.notify_checkpoint_complete(1)
    first.close()
    assert postgres_case.rows() == expected(1, 1)


# Submit-time table checks --------------------------------------------------------------------------


@pytest.fixture
def tables(postgres_case: PostgresSinkCase) -> Iterator[list[str]]:
    """Names of extra tables a test creates; dropped afterwards."""
    created: list[str] = []
    yield created
    for name in created:
        postgres_case.query(f"DROP TABLE IF EXISTS {name}")


def create(case: PostgresSinkCase, tables: list[str], name: str, body: str) -> str:
    table = f"{case.table}_{name}"
    tables.append(table)
    case.query(f"CREATE TABLE {table} ({body})")
    return table


def check(case: PostgresSinkCase, table: str, columns: tuple[str, ...], keys: tuple[str, ...]) -> None:
    with postgres.connect(case.endpoints, autocommit=True) as conn:
        postgres.require_table(conn, table, columns, keys)


def test_require_table_names_a_missing_table(postgres_case: PostgresSinkCase) -> None:
    with pytest.raises(JobDefinitionError, match=r"table 'no_such_table_x' does not exist"):
        check(postgres_case, "no_such_table_x", COLUMNS, ("id",))


def test_require_table_names_missing_columns(postgres_case: PostgresSinkCase) -> None:
    with pytest.raises(JobDefinitionError, match=r"has no column\(s\) \['colour', 'code'\]") as failure:
        check(postgres_case, postgres_case.table, ("id", "colour", "name"), ("id", "code"))
    assert "\n" not in str(failure.value)


def test_require_table_wants_a_unique_key_on_exactly_the_key_columns(
    postgres_case: PostgresSinkCase, tables: list[str]
) -> None:
    plain = create(postgres_case, tables, "plain", "id bigint, name text, amount numeric")
    with pytest.raises(JobDefinitionError, match=r"no PRIMARY KEY or UNIQUE constraint on exactly \['id'\]"):
        check(postgres_case, plain, COLUMNS, ("id",))
    wider = create(postgres_case, tables, "wider", "id bigint, name text, amount numeric, PRIMARY KEY (id, name)")
    with pytest.raises(JobDefinitionError, match=r"unique keys found: \[\['id', 'name'\]\]"):
        check(postgres_case, wider, COLUMNS, ("id",))
    partial = create(postgres_case, tables, "partial", "id bigint, name text, amount numeric")
    postgres_case.query(f"CREATE UNIQUE INDEX ON {partial} (id) WHERE amount > 0")  # ON CONFLICT (id) can't use it
    with pytest.raises(JobDefinitionError, match="no PRIMARY KEY or UNIQUE constraint"):
        check(postgres_case, partial, COLUMNS, ("id",))
    deferred = create(postgres_case, tables, "deferred", "id bigint UNIQUE DEFERRABLE, name text, amount numeric")
    with pytest.raises(JobDefinitionError, match="no PRIMARY KEY or UNIQUE constraint"):
        check(postgres_case, deferred, COLUMNS, ("id",))


def test_require_table_accepts_a_primary_key_unique_constraint_or_unique_index(
    postgres_case: PostgresSinkCase, tables: list[str]
) -> None:
    check(postgres_case, postgres_case.table, COLUMNS, ("id",))  # PRIMARY KEY (id)
    composite = create(postgres_case, tables, "composite", "id bigint, name text, amount numeric, UNIQUE (name, id)")
    check(postgres_case, composite, COLUMNS, ("id", "name"))  # the order does not matter to ON CONFLICT
    indexed = create(postgres_case, tables, "indexed", "id bigint, name text, amount numeric")
    postgres_case.query(f"CREATE UNIQUE INDEX ON {indexed} (id) INCLUDE (name)")
    check(postgres_case, indexed, COLUMNS, ("id",))


def test_validate_at_submit_accepts_a_good_table_for_both_postgres_sinks(postgres_case: PostgresSinkCase) -> None:
    two_phase = TwoPhasePostgresSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple)
    upsert = PostgresUpsertSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple)
    two_phase.validate_at_submit(postgres_case.endpoints)  # no setup(): the JobManager has no task context
    upsert.validate_at_submit(postgres_case.endpoints)


def test_validate_at_submit_rejects_a_table_without_the_key_constraint(
    postgres_case: PostgresSinkCase, tables: list[str]
) -> None:
    plain = create(postgres_case, tables, "nokey", "id bigint, name text, amount numeric")
    for sink in (
        TwoPhasePostgresSinkOperator(plain, COLUMNS, ("id",), tuple),
        PostgresUpsertSinkOperator(plain, COLUMNS, ("id",), tuple),
    ):
        with pytest.raises(JobDefinitionError, match=rf"table '{plain}' has no PRIMARY KEY or UNIQUE"):
            sink.validate_at_submit(postgres_case.endpoints)


def test_validate_at_submit_checks_prepared_transactions_for_the_two_phase_sink_only(
    postgres_case: PostgresSinkCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "max_prepared_transactions", lambda conn: 0)
    with pytest.raises(JobDefinitionError, match="max_prepared_transactions = 0"):
        TwoPhasePostgresSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple).validate_at_submit(
            postgres_case.endpoints
        )
    PostgresUpsertSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple).validate_at_submit(postgres_case.endpoints)


def test_validate_at_submit_with_postgres_down_names_the_dsn_without_its_password(
    postgres_case: PostgresSinkCase,
) -> None:
    down = postgres_case.endpoints.model_copy(update={"postgres_dsn": "postgresql://weir:s3cret@127.0.0.1:1/weir"})
    for sink in (
        TwoPhasePostgresSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple),
        PostgresUpsertSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple),
    ):
        with pytest.raises(ServiceUnavailableError, match=r"postgresql://weir@127\.0\.0\.1:1/weir") as failure:
            sink.validate_at_submit(down)
        assert "s3cret" not in str(failure.value)


def test_validate_at_submit_creates_nothing(postgres_case: PostgresSinkCase, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks run in one read-only session (PostgreSQL refuses any write in it), closed afterwards."""
    sessions: list[tuple[Any, dict[str, Any]]] = []
    real_connect = postgres.connect

    def spy(endpoints: Endpoints, *args: Any, **kwargs: Any) -> Any:
        conn = real_connect(endpoints, *args, **kwargs)
        sessions.append((conn, kwargs))
        return conn

    monkeypatch.setattr(postgres, "connect", spy)
    for sink in (
        TwoPhasePostgresSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple),
        PostgresUpsertSinkOperator(postgres_case.table, COLUMNS, ("id",), tuple),
    ):
        sink.validate_at_submit(postgres_case.endpoints)
    assert [kwargs.get("read_only") for _conn, kwargs in sessions] == [True, True]
    assert all(conn.closed for conn, _kwargs in sessions)
