"""A CDC source restored at another parallelism than the checkpoint's (``weir.core.cdc.redistribute``),
against the real PostgreSQL, with rows inserted, updated and deleted all along:

- in this process (each subtask polled in turn, checkpoints taken and completed by all, every subtask
  closed and the events after the restored checkpoint dropped, as an exactly-once sink sees a
  restore): after the snapshot, 3 -> 1 and 2 -> 3; mid-snapshot, 2 -> 3 (the partitions go on in
  the first subtasks) and 3 -> 2 refused in one line, then restored at 3. Each time the change log
  applied in order equals the table, each key's read comes once and then every later change once;
- on the session cluster: a job reading the snapshot at parallelism 2 stopped with a savepoint,
  changes made while it is stopped, restored with the source at 3, its TaskManager killed under a
  writer, stopped again and restored at 1: the copy equals the table as a multiset of whole rows and
  the Kafka changelog holds each change once."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from psycopg import sql

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import REPO_ROOT, WeirCluster, create_topics
from tests.integration.polling import poll
from tests.integration.sinks.conftest import operator_context
from tests.integration.sources.test_postgres_cdc import (
    CDC_JOB,
    CdcJobTables,
    Writer,
    cdc_job_tables,  # noqa: F401 (a fixture)
    changelog_entry,
    logged_events,
    settled,
    slot_exists,
    write_through_a_source_kill,
)
from tests.integration.sources.test_postgres_cdc_parallel import (
    PARALLEL_PARAMETERS,
    Downstream,
    ParallelCase,
    applied,
    each_change_once,
    parallel_case,  # noqa: F401 (a fixture)
    streaming,
)
from weir.connectors import kafka, postgres
from weir.core.cdc import Phase
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.operators.base import InheritedState, StateNotRedistributableError
from weir.operators.cdc_source import PostgresCdcSourceOperator

pytestmark = pytest.mark.integration


def restored_at(
    case: ParallelCase, parallelism: int, out: Downstream, attempt: int, states: list[bytes], chunk_size: int
) -> list[PostgresCdcSourceOperator]:
    """The source at ``parallelism``, each subtask handed every old subtask's state (a savepoint's
    restore, ``restore_inherited_state``), all restored before any opens, as a deployment does."""
    spec = PostgresCdcSourceSpec((case.table,), case.slot, case.slot, chunk_size=chunk_size)
    old = len(states)
    inherited = [
        InheritedState(s, old, key_group_range_for_subtask(128, old, SubtaskIndex(s)), data)
        for s, data in enumerate(states)
    ]
    operators = []
    for subtask in range(parallelism):
        operator = PostgresCdcSourceOperator(spec)
        ctx = replace(
            operator_context("cdc-rescale-job", "cdc", subtask, parallelism),
            attempt=attempt,
            parameters=PARALLEL_PARAMETERS,
        )
        operator.setup(ctx, out)
        operator.restore_inherited_state(inherited)
        operators.append(operator)
    for operator in operators:
        operator.open()
    return operators


@pytest.mark.parametrize(
    ("before", "after", "when"),
    [(3, 1, "streaming"), (2, 3, "streaming"), (2, 3, "snapshot"), (3, 2, "snapshot")],
    ids=["streaming-3-to-1", "streaming-2-to-3", "snapshot-2-to-3", "snapshot-3-to-2-refused"],
)
def test_a_source_restored_at_another_parallelism_gives_exactly_the_table(
    parallel_case: ParallelCase,  # noqa: F811 (the fixture imported above)
    unique: str,
    before: int,
    after: int,
    when: str,
) -> None:
    """3,000 rows in chunks of 100, a writer changing the table all along; the subtasks polled in
    turn, a checkpoint taken by each and completed every round. Once subtask 0 streams and a hundred
    changes were made (``streaming``), or once every partition has two chunks read (``snapshot``),
    every subtask is closed, the events after the last completed checkpoint are dropped, and the
    checkpoint is restored at ``after`` (refused below the snapshot's partitions: then at
    ``before``)."""
    case = parallel_case
    rows, chunk_size = 3_000, 100
    with postgres.connect(case.endpoints, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'n' || g, g * 10 FROM generate_series(1, %s) g").format(
                sql.Identifier(case.table)
            ),
            (rows,),
        )
    writer = Writer(case.endpoints, case.table, unique, first_id=rows + 1)
    out = Downstream()
    attempt = 0
    operators = case.subtasks(before, out, attempt, None, chunk_size=chunk_size)
    checkpoint = 0
    completed: tuple[list[bytes], int] | None = None
    rescaled = False
    refusal: list[str] = []
    writer.start()
    try:

        def due() -> bool:
            states = [op._progress.state for op in operators]  # noqa: SLF001 - the test watches the phases
            if when == "streaming":
                return streaming(operators[0]) and len(writer.changes) >= 100
            return all(s.phase is Phase.SNAPSHOT and len(s.chunks) >= 2 for s in states)

        def round_of_polls() -> bool | None:
            nonlocal checkpoint, completed, operators, attempt, rescaled
            for operator in operators:
                operator.poll(500)
            checkpoint += 1
            states = [op.snapshot_state(checkpoint) for op in operators]
            completed = ([s for s in states if s is not None], len(out.events))
            assert len(completed[0]) == len(operators)
            for operator in operators:
                operator.notify_checkpoint_complete(checkpoint)
            if not rescaled and due():
                rescaled = True
                for operator in operators:
                    operator.close()
                del out.events[completed[1] :]
                attempt += 1
                try:
                    operators = restored_at(case, after, out, attempt, completed[0], chunk_size)
                except StateNotRedistributableError as exc:
                    refusal.append(str(exc))
                    operators = restored_at(case, before, out, attempt, completed[0], chunk_size)
                return None
            return True if rescaled and streaming(operators[0]) and len(writer.changes) >= 250 else None

        poll("the restore at another parallelism and 250 changes written", 300, round_of_polls, interval_s=0.05)
        if when == "snapshot" and after < before:
            assert refusal == [
                f"postgres cdc source 'cdc': the checkpoint was taken while {before} subtasks read the snapshot, "
                f"each its partition of the rows, which cannot be read by {after}: restore it at parallelism "
                f"{before} or above and rescale once the snapshot is done (the source logs cdc_snapshot_emitted), "
                f"or start the job without the checkpoint for a new snapshot at parallelism {after}"
            ]
            assert len(operators) == before
        else:
            assert refusal == [] and len(operators) == after
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, f"the writer failed: {writer.error!r}"
        expected = case.rows()
        last: list[Counter[tuple[Any, ...]]] = []

        def caught_up() -> bool | None:
            for operator in operators:
                operator.poll(1000)
            last[:] = [applied(out.events)[0]]
            return True if last[0] == expected else None

        try:
            poll("the change log applied equal to the table", 120, caught_up, interval_s=0.1)
        except pytest.fail.Exception:
            pass
        assert last[0] == expected
        each_change_once(out.events, rows, writer.changes)
        reads = applied(out.events)[1]
        assert [k for k, n in reads.items() if n > 1] == [], "no row read twice"
        assert len(reads) >= rows * 0.8, "the snapshot's rows were read (the writer deleted a few)"
        idle = [op for op in operators[1:] if op._progress.state.phase is Phase.IDLE]  # noqa: SLF001
        if when == "streaming":
            assert len(idle) == after - 1, "after the snapshot, subtask 0 streams alone"
        elif after > before:
            assert len(idle) == after - before, "above the snapshot's partitions, nothing to read"
    finally:
        writer.stop.set()
        for operator in operators:
            operator.close()


# On the cluster: savepoints restored at 3, then at 1 --------------------------------------------------


def test_a_cdc_job_restored_from_savepoints_at_other_source_parallelisms_stays_exact(
    weir_cluster: WeirCluster,
    cdc_job_tables: CdcJobTables,  # noqa: F811 (the fixture imported above)
    unique: str,
) -> None:
    t, endpoints, client = cdc_job_tables, weir_cluster.endpoints, weir_cluster.client
    topic = f"cdc-rescale-{unique}"
    create_topics(endpoints, {topic: 3})
    initial = 600
    t.execute("INSERT INTO {t} SELECT g, 'n' || g, g * 10 FROM generate_series(1, %s) g", (initial,))
    params = {
        "source.table": t.source,
        "source.slot": t.slot,
        "source.chunk_size": "50",
        "source.parallelism": "2",
        "sink.table": t.target,
        "sink.topic": topic,
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    manual: list[tuple[str, int, str | None, int | None]] = []

    def stop_with_savepoint(job_id: str) -> str:
        savepoint_id = client.trigger_savepoint(job_id, None, stop=True)
        path = client.wait_for_savepoint(job_id, savepoint_id, timeout_s=180.0).external_path
        stopped = weir_cluster.wait_for(job_id, ("FINISHED", "FAILED", "CANCELED"), timeout_s=180)
        assert stopped.summary.status == "FINISHED", stopped.failure
        assert slot_exists(endpoints, t.slot), "kept for the savepoint"
        return path

    def changes_while_stopped(new_id: int) -> None:
        """An insert, an update (twice, the same values), a delete, while no job reads the slot."""
        updated, deleted = sorted(k for k, *_ in t.rows(t.source))[:2]
        t.execute("INSERT INTO {t} VALUES (%s, %s, %s)", (new_id, f"n{new_id}", 7))
        t.execute("UPDATE {t} SET name = 'stopped', amount = 1 WHERE id = %s", (updated,))
        t.execute("UPDATE {t} SET name = 'stopped', amount = 1 WHERE id = %s", (updated,))
        t.execute("DELETE FROM {t} WHERE id = %s", (deleted,))
        manual.extend([("insert", new_id, f"n{new_id}", 7), *[("update", updated, "stopped", 1)] * 2])
        manual.append(("delete", deleted, None, None))

    def restored(path: str, parallelism: int) -> str:
        job_id = client.submit_job(
            REPO_ROOT / CDC_JOB, {**params, "source.parallelism": str(parallelism)}, 2, from_checkpoint=path
        )
        weir_cluster.submitted.append(job_id)
        return job_id

    first = weir_cluster.submit(CDC_JOB, params, parallelism=2)
    expected = t.rows(t.source)
    assert settled("the parallel snapshot in the copy", 240, expected, lambda: t.rows(t.target)) == expected

    def streams() -> bool | None:
        return (
            True if any(e.get("slot") == t.slot for e in logged_events(weir_cluster, "cdc_snapshot_emitted")) else None
        )

    poll("subtask 0 streaming after the snapshot", 240, streams)
    path = stop_with_savepoint(first)
    changes_while_stopped(initial + 1)

    second = restored(path, 3)
    writer = Writer(endpoints, t.source, unique, first_id=initial + 2)
    writer.live = {k for (k, *_rest) in t.rows(t.source)}
    write_through_a_source_kill(weir_cluster, second, writer, "cdc", more_after=100)
    expected = t.rows(t.source)
    assert settled("the copy equal to the table at 3", 240, expected, lambda: t.rows(t.target)) == expected
    redistributed = [e for e in logged_events(weir_cluster, "cdc_state_redistributed") if e.get("slot") == t.slot]
    assert {(e["from_parallelism"], e["to_parallelism"], e["phase"]) for e in redistributed} >= {
        (2, 3, "streaming"),
        (2, 3, "idle"),
    }, redistributed

    path = stop_with_savepoint(second)
    changes_while_stopped(10_000_000)  # above every id the writer used
    third = restored(path, 1)
    expected = t.rows(t.source)
    assert settled("the copy equal to the table at 1", 240, expected, lambda: t.rows(t.target)) == expected
    status = wait_until(weir_cluster, third, lambda s: (s.last_completed_checkpoint or 0) >= 2, "two checkpoints", 120)
    assert sum(1 for task in status.tasks if task.vertex_uid == "cdc") == 1

    expected_log = Counter([("read", i, f"n{i}", i * 10) for i in range(1, initial + 1)] + manual + writer.changes)

    def changelog() -> Counter[tuple[str, int, str | None, int | None]] | None:
        records = kafka.read_committed_records(endpoints, topic)
        found = Counter(changelog_entry(value) for _p, _o, _k, value, _ts in records if value is not None)
        return found if found.total() >= expected_log.total() else None

    assert poll("every change once in the changelog", 240, changelog) == expected_log
    client.cancel_job(third)
    weir_cluster.wait_for(third, ("CANCELED",), timeout_s=120)
