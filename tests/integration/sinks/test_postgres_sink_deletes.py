"""Deletes through the PostgreSQL sinks against the real server: a row function returning
``Delete(key)`` deletes the key's row in the checkpoint's transaction. A transaction rolled back
(its process killed after PREPARE, the checkpoint never completed) applies none of its deletes; a
committed one applies each exactly once, also when recovery commits it; within one checkpoint an
upsert then a delete of a key ends deleted and a delete then an upsert ends present."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.sinks.conftest import PostgresSinkCase, case_change, delete, row, run_until_crash, set_up
from weir.core.crashpoints import EXIT_CODE
from weir.operators.sinks import PostgresUpsertSinkOperator

pytestmark = pytest.mark.integration


def named(i: int, name: str) -> dict[str, Any]:
    return {"id": i, "name": name, "amount": Decimal(i)}


def whole(i: int, name: str | None = None, amount: Decimal | None = None) -> tuple[Any, ...]:
    """A table row as the case's table holds it (``row(i)`` unless given)."""
    return (i, name or f"name-{i}", amount if amount is not None else Decimal(i) / 4)


def table(case: PostgresSinkCase) -> Counter[tuple[Any, ...]]:
    return Counter(case.rows())


# Checkpoint 2's changes: a delete of a committed row (1), an insert deleted again (6), a delete then
# an insert of the same key (2), an update (3).
CHANGES = [delete(1), row(6), delete(6), delete(2), named(2, "back"), named(3, "changed")]
AFTER_CHANGES = Counter([(2, "back", Decimal(2)), (3, "changed", Decimal(3)), whole(4), whole(5)])


def test_deletes_of_a_transaction_rolled_back_by_a_crash_do_not_apply_and_the_replay_applies_them_once(
    postgres_case: PostgresSinkCase, tmp_path: Path
) -> None:
    crash = run_until_crash(
        tmp_path,
        postgres_case.endpoints,
        "after_pre_commit:2",
        kind="postgres",
        job_id=postgres_case.job_id,
        uid=postgres_case.uid,
        table=postgres_case.table,
        epochs=[[row(i) for i in range(1, 6)], CHANGES],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert sorted(crash.snapshots) == [1]
    assert len(postgres_case.prepared()) == 1  # checkpoint 2's deletes, prepared, never completed
    assert table(postgres_case) == Counter(whole(i) for i in range(1, 6))

    sink = postgres_case.recovered(crash.snapshots[1])  # the restore rolls the prepared transaction back
    assert postgres_case.prepared() == []
    assert table(postgres_case) == Counter(whole(i) for i in range(1, 6))

    for value in CHANGES:  # the source replays checkpoint 2's input after the restore
        sink.process(value, None)
    sink.snapshot_state(3)
    sink.notify_checkpoint_complete(3)
    sink.close()
    assert table(postgres_case) == AFTER_CHANGES
    # one change per key changed: 1, 6, 2, 3 (the rolled-back checkpoint 2 left no proof)
    assert postgres_case.proofs() == [(0, 1, 5), (0, 3, 4)]


def test_a_completed_checkpoint_of_deletes_is_committed_once_by_recovery(
    postgres_case: PostgresSinkCase, tmp_path: Path
) -> None:
    crash = run_until_crash(
        tmp_path,
        postgres_case.endpoints,
        "after_checkpoint_complete_before_commit:2",
        kind="postgres",
        job_id=postgres_case.job_id,
        uid=postgres_case.uid,
        table=postgres_case.table,
        epochs=[[row(i) for i in range(1, 6)], CHANGES],
    )
    assert crash.returncode == EXIT_CODE, crash.output
    assert sorted(crash.snapshots) == [1, 2]
    assert table(postgres_case) == Counter(whole(i) for i in range(1, 6))  # 2 prepared, not committed

    postgres_case.recovered(crash.snapshots[2]).close()
    assert postgres_case.prepared() == []
    assert table(postgres_case) == AFTER_CHANGES
    postgres_case.recovered(crash.snapshots[2]).close()  # recovering again applies nothing twice
    assert table(postgres_case) == AFTER_CHANGES
    assert postgres_case.proofs() == [(0, 1, 5), (0, 2, 4)]


def test_an_epoch_of_deletes_waiting_in_the_snapshot_is_written_by_recovery(postgres_case: PostgresSinkCase) -> None:
    """Checkpoint 1's notification lost, 2 completed, the process gone: 1 is prepared, 2's changes
    (deletes among them) exist only in the snapshot (format 2) and recovery writes them."""
    abandoned = postgres_case.sink()
    abandoned.open()
    for i in range(1, 6):
        abandoned.process(row(i), None)
    abandoned.snapshot_state(1)
    for value in CHANGES:
        abandoned.process(value, None)
    snapshot = abandoned.snapshot_state(2)
    abandoned.close()

    postgres_case.recovered(snapshot).close()
    assert postgres_case.prepared() == []
    assert table(postgres_case) == AFTER_CHANGES
    assert postgres_case.proofs() == [(0, 1, 5), (0, 2, 4)]


def test_a_delete_of_a_key_the_table_does_not_hold_changes_nothing(postgres_case: PostgresSinkCase) -> None:
    sink = postgres_case.sink()
    sink.open()
    sink.process(row(1), None)
    sink.process(delete(99), None)
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    assert table(postgres_case) == Counter([whole(1)])
    assert postgres_case.proofs() == [(0, 1, 2)]


def test_the_upsert_sink_deletes_in_its_batches_in_order(postgres_case: PostgresSinkCase) -> None:
    sink = PostgresUpsertSinkOperator(postgres_case.table, ("id", "name", "amount"), ("id",), case_change, batch_size=3)
    set_up(sink, postgres_case.job_id, "pg-upsert", 0)
    sink.open()
    for value in [*(row(i) for i in range(1, 6)), *CHANGES]:
        sink.process(value, None)
    sink.end_input()
    sink.close()
    assert table(postgres_case) == AFTER_CHANGES
