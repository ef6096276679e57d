"""The CDC source's parallel snapshot against the real server: the server places each key in the
partition Python does, and the source at parallelism 2 and 3 (its subtasks in this process, polled in
turn, with checkpoints and a crash of them all mid-snapshot) gives, with rows inserted, updated and
deleted all along, a change log that applied in order equals the table, each row read once."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from psycopg import sql

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster, create_topics
from tests.integration.polling import poll, settle
from tests.integration.sinks.conftest import operator_context
from tests.integration.sources.test_postgres_cdc import (
    CDC_JOB,
    CdcJobTables,
    Writer,
    cdc_job_tables,  # noqa: F401 (a fixture)
    logged_events,
    settled,
    slot_exists,
)
from weir.connectors import kafka, postgres, postgres_cdc
from weir.core.cdc import CdcState, ChangeEvent, ChangeOp, Phase, decode_cdc_state, key_partition
from weir.core.config import Endpoints
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import JobDefinitionError
from weir.operators.cdc_source import PostgresCdcSourceOperator
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

PARALLEL_PARAMETERS = {"checkpointing.interval": "1s"}


def test_the_server_places_every_key_in_the_partition_python_does(services: Endpoints) -> None:
    """Integers (negative too), text with non-ASCII characters, uuids and a composite key: the chunk
    query's partition (``key_partition_sql``) is ``weir.core.cdc.key_partition`` of each row's key."""
    rng = random.Random(7)
    suffix = uuid.uuid4().hex[:10]
    tables = {
        f"cdc_part_int_{suffix}": ("id bigint PRIMARY KEY", [(rng.randint(-(2**62), 2**62),) for _ in range(400)]),
        f"cdc_part_text_{suffix}": (
            "id text PRIMARY KEY",
            [("".join(rng.choice("aZé€𝄞 -_0") for _ in range(rng.randint(0, 12))) + str(i),) for i in range(400)],
        ),
        f"cdc_part_uuid_{suffix}": (
            "id uuid PRIMARY KEY",
            [(uuid.UUID(int=rng.getrandbits(128)),) for _ in range(400)],
        ),
        f"cdc_part_pair_{suffix}": (
            "a text, b int, PRIMARY KEY (a, b)",
            [(f"k{rng.randint(0, 50)}", i) for i in range(400)],
        ),
    }
    try:
        with postgres.connect(services, autocommit=True) as conn:
            for table, (columns, keys) in tables.items():
                conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(columns)))
                with conn.cursor() as cur:
                    marks = sql.SQL(", ").join(sql.Placeholder() * len(keys[0]))
                    cur.executemany(sql.SQL("INSERT INTO {} VALUES ({})").format(sql.Identifier(table), marks), keys)
            for captured in postgres_cdc.captured_tables(conn, list(tables)):
                assert captured.chunked, captured
                key_columns = sql.SQL(", ").join(sql.Identifier(c) for c in captured.key_columns)
                for partitions in (2, 3, 7):
                    query = sql.SQL("SELECT {}, {} FROM {}").format(
                        key_columns,
                        postgres_cdc.key_partition_sql(captured, partitions),
                        sql.Identifier(captured.schema, captured.name),
                    )
                    by_server = {tuple(row[:-1]): row[-1] for row in conn.execute(query).fetchall()}
                    assert len(by_server) == 400
                    by_python = {key: key_partition(key, partitions) for key in by_server}
                    assert by_server == by_python, captured.name
    finally:
        with postgres.connect(services, autocommit=True) as conn:
            for table in tables:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@dataclass
class Downstream:
    """The one consumer of every subtask's events, in the order they were emitted (each subtask
    emits only between polls here, so the order is the one a keyed consumer sees per key)."""

    events: list[ChangeEvent] = field(default_factory=list)

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.events.append(value)

    def emit_watermark(self, watermark: int) -> None:
        pass


@dataclass
class ParallelCase:
    endpoints: Endpoints
    table: str
    slot: str

    def rows(self) -> Counter[tuple[Any, ...]]:
        with postgres.connect(self.endpoints, autocommit=True) as conn:
            return Counter(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(self.table))).fetchall())

    def subtasks(
        self, parallelism: int, out: Downstream, attempt: int, restored: list[bytes] | None, chunk_size: int
    ) -> list[PostgresCdcSourceOperator]:
        spec = PostgresCdcSourceSpec((self.table,), self.slot, self.slot, chunk_size=chunk_size)
        operators = []
        for subtask in range(parallelism):
            operator = PostgresCdcSourceOperator(spec)
            ctx = replace(
                operator_context("cdc-parallel-job", "cdc", subtask, parallelism),
                attempt=attempt,
                parameters=PARALLEL_PARAMETERS,
            )
            operator.setup(ctx, out)
            if restored is not None:
                operator.restore_state(restored[subtask])
            operators.append(operator)
        for operator in operators:  # every subtask restored before any opens, as a deployment does
            operator.open()
        return operators


@pytest.fixture
def parallel_case(services: Endpoints) -> Iterator[ParallelCase]:
    suffix = uuid.uuid4().hex[:10]
    case = ParallelCase(services, f"cdc_par_{suffix}", f"weir_cdc_par_{suffix}")
    with postgres.connect(services, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(case.table))
        )
    try:
        yield case
    finally:
        with postgres.connect(services, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (case.slot,),
            )
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(case.slot)))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(case.table)))


def applied(events: list[ChangeEvent]) -> tuple[Counter[tuple[Any, ...]], Counter[int]]:
    """The change log applied in order, as the table's rows (whole), and how often each key was read."""
    rows: dict[int, tuple[Any, ...]] = {}
    reads: Counter[int] = Counter()
    for event in events:
        row = event.row
        if event.op is ChangeOp.READ:
            reads[row["id"]] += 1
        if event.op is ChangeOp.DELETE:
            rows.pop(row["id"], None)
        else:
            rows[row["id"]] = (row["id"], row["name"], row["amount"])
    return Counter(rows.values()), reads


def each_change_once(
    events: list[ChangeEvent], rows: int, changes: list[tuple[str, int, str | None, int | None]]
) -> None:
    """Each key's events are a read of a value it had (or none, when it had no row as its chunk was
    read) and then every later committed value once, in order, to its last: nothing the snapshot
    saw comes again, nothing it did not see is missing."""
    history: dict[int, list[tuple[Any, ...] | None]] = {k: [(k, f"n{k}", k * 10)] for k in range(1, rows + 1)}
    for op, key, name, amount in changes:
        history.setdefault(key, [None]).append(None if op == "delete" else (key, name, amount))
    by_key: dict[int, list[ChangeEvent]] = {}
    for event in events:
        by_key.setdefault(event.row["id"], []).append(event)
    for key, values_had in history.items():
        emitted = by_key.pop(key, [])
        reads = [e for e in emitted if e.op is ChangeOp.READ]
        assert len(reads) <= 1 and (not reads or emitted[0] is reads[0]), f"key {key}: {emitted}"
        values: list[tuple[Any, ...] | None] = [] if reads else [None]
        for e in emitted:
            values.append(None if e.op is ChangeOp.DELETE else (e.row["id"], e.row["name"], e.row["amount"]))
        assert any(values_had[i:] == values for i in range(len(values_had))), (
            f"key {key}: emitted {values}, committed {values_had}"
        )
    assert not by_key, f"events of keys never written: {sorted(by_key)[:10]}"


def streaming(operator: PostgresCdcSourceOperator) -> bool:
    return operator._progress.state.phase is Phase.STREAMING  # noqa: SLF001 - the test watches the phase


@pytest.mark.parametrize(("parallelism", "crash"), [(2, False), (3, False), (3, True)], ids=["p2", "p3", "p3-crash"])
def test_a_parallel_snapshot_under_concurrent_writes_gives_exactly_the_table(
    parallel_case: ParallelCase, unique: str, parallelism: int, crash: bool
) -> None:
    """6,000 rows in chunks of 100 (twenty chunks or so per partition), a writer inserting, updating
    and deleting all along; the subtasks are polled in turn and every few rounds a checkpoint is
    taken by each and completed. With ``crash``, once a checkpoint holds some chunks of every
    partition, every subtask is closed mid-snapshot, the events after that checkpoint are dropped
    (an exactly-once sink's view), and a new attempt restores each subtask from its state."""
    case = parallel_case
    rows = 6_000
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
    operators = case.subtasks(parallelism, out, attempt, None, chunk_size=100)
    checkpoint = 0
    completed: tuple[list[bytes], int] | None = None  # the last completed checkpoint: states, events before it
    crashed = False
    writer.start()
    try:

        def round_of_polls() -> bool | None:
            nonlocal checkpoint, completed, operators, attempt, crashed
            for operator in operators:
                operator.poll(500)
            checkpoint += 1
            states = [op.snapshot_state(checkpoint) for op in operators]
            assert all(s is not None for s in states)
            completed = ([s for s in states if s is not None], len(out.events))
            for operator in operators:
                operator.notify_checkpoint_complete(checkpoint)
            phases = [op._progress.state for op in operators]  # noqa: SLF001
            if crash and not crashed and all(s.phase is Phase.SNAPSHOT and len(s.chunks) >= 3 for s in phases):
                crashed = True
                for operator in operators:
                    operator.close()
                del out.events[completed[1] :]
                attempt += 1
                operators = case.subtasks(parallelism, out, attempt, completed[0], chunk_size=100)
            return True if streaming(operators[0]) and len(writer.changes) >= 200 else None

        poll("the snapshot read and two hundred changes written", 300, round_of_polls, interval_s=0.05)
        assert crashed == crash
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, f"the writer failed: {writer.error!r}"
        expected = case.rows()

        def caught_up() -> Counter[tuple[Any, ...]]:
            for operator in operators:
                operator.poll(1000)
            return applied(out.events)[0]

        assert settle(120, caught_up, lambda table: table == expected, 0.1) == expected  # the change log applied
        each_change_once(out.events, rows, writer.changes)
        table_reads = applied(out.events)[1]
        assert [k for k, n in table_reads.items() if n > 1] == [], "no row read twice"
        assert len(table_reads) >= rows * 0.8, "the snapshot's rows were read (the writer deleted a few)"
        assert {key_partition((k,), parallelism) for k in table_reads} == set(range(parallelism))
    finally:
        writer.stop.set()
        for operator in operators:
            operator.close()


def test_subtask_0_holds_the_slot_in_every_checkpoint_from_its_open(parallel_case: ParallelCase) -> None:
    """A checkpoint taken as soon as the subtasks opened, before any poll: subtask 0's state holds the
    slot's consistent point. Else a checkpoint could pair a reader's chunks (read once subtask 0 had
    created the slot) with a subtask 0 without the slot, which a restore would then create anew, at a
    later point: the changes between those chunks' reads and that point would be lost."""
    case = parallel_case
    operators = case.subtasks(2, Downstream(), 0, None, chunk_size=100)
    try:
        states = [op.snapshot_state(1) for op in operators]
        assert all(s is not None for s in states)
        subtask_0 = decode_cdc_state(states[0] or b"", case.slot)
        with postgres.connect(case.endpoints, autocommit=True) as conn:
            slot = postgres_cdc.slot_found(conn, case.slot)
        assert slot is not None and subtask_0 == CdcState(Phase.SNAPSHOT, slot.confirmed_flush, (), 2)
    finally:
        for operator in operators:
            operator.close()


def test_a_parallel_snapshot_needs_periodic_aligned_checkpoints(parallel_case: ParallelCase) -> None:
    spec = PostgresCdcSourceSpec((parallel_case.table,), parallel_case.slot, parallel_case.slot)
    for parameters, why in [
        ({}, "set checkpointing.interval"),
        ({"checkpointing.interval": "1s", "checkpointing.unaligned": "true"}, "set checkpointing.unaligned=false"),
    ]:
        operator = PostgresCdcSourceOperator(spec)
        ctx = replace(operator_context("j", "cdc", 1, 2), parameters=parameters)
        operator.setup(ctx, Downstream())
        with pytest.raises(JobDefinitionError, match=f"^postgres cdc source 'cdc': at parallelism 2 .*{why}"):
            operator.open()
        operator.close()
    assert not slot_exists(parallel_case.endpoints, parallel_case.slot)


def test_a_taskmanager_killed_mid_parallel_snapshot_leaves_the_copy_and_the_changelog_exact(
    weir_cluster: WeirCluster,
    cdc_job_tables: CdcJobTables,  # noqa: F811 (the fixture imported above)
    unique: str,
) -> None:
    """The source at parallelism 3 over 30,000 rows in chunks of 250, a writer changing the table all
    along, a slow consumer chained to each subtask (2 ms per change: each partition takes ~20 s);
    the TaskManager of reader subtask 1 killed once a checkpoint holds rows of the snapshot: the copy
    ends equal to the table, the changelog gives each key its read and then every later change once
    (replayed, the table), no row read twice, and every reader announced its partition."""
    t, endpoints = cdc_job_tables, weir_cluster.endpoints
    rows, chunk = 30_000, 250
    topic = f"cdc-par-{unique}"
    create_topics(endpoints, {topic: 3})
    t.execute("INSERT INTO {t} SELECT g, 'n' || g, g * 10 FROM generate_series(1, %s) g", (rows,))
    writer = Writer(endpoints, t.source, unique, first_id=rows + 1)
    params = {
        "source.table": t.source,
        "source.slot": t.slot,
        "source.chunk_size": str(chunk),
        "source.parallelism": "3",
        "sink.table": t.target,
        "sink.topic": topic,
        "copy.delay_us": "2000",
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    try:
        writer.start()
        job_id = weir_cluster.submit(CDC_JOB, params)
        status = wait_until(
            weir_cluster,
            job_id,
            lambda s: (s.last_completed_checkpoint or 0) >= 2 and sum(t.rows(t.target).values()) > 0,
            "two completed checkpoints and rows of the snapshot in the copy",
            240,
        )
        copied = sum(t.rows(t.target).values())
        assert copied < rows, f"the snapshot was done before the kill ({copied} rows copied): it proves nothing"
        victim = next(
            str(task.taskmanager_id) for task in status.tasks if task.vertex_uid == "cdc" and task.subtask == 1
        )
        killed_at = status.last_completed_checkpoint or 0
        kill_process(weir_cluster.directory, victim)
        wait_until(
            weir_cluster,
            job_id,
            lambda s: (
                s.summary.status == "RUNNING"
                and s.last_restore_at is not None
                and (s.last_completed_checkpoint or 0) >= killed_at + 2
            ),
            f"recovery after killing {victim}, the TaskManager of reader subtask 1",
            300,
        )
        after_recovery = len(writer.changes) + 50
        poll(
            "fifty changes more after the recovery",
            120,
            lambda: True if len(writer.changes) >= after_recovery else None,
        )

        def snapshot_streamed() -> bool | None:
            emitted = logged_events(weir_cluster, "cdc_snapshot_emitted")
            return True if any(e.get("slot") == t.slot for e in emitted) else None

        poll("subtask 0 streaming after the parallel snapshot", 400, snapshot_streamed)
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, f"the writer failed: {writer.error!r}"
        expected_copy = t.rows(t.source)
        assert settled("the copy equal to the source table", 400, expected_copy, lambda: t.rows(t.target)) == (
            expected_copy
        )
        announced = {
            e["partition"] for e in logged_events(weir_cluster, "cdc_partition_announced") if e.get("slot") == t.slot
        }
        assert announced == {1, 2}, f"every reader announced its partition: {announced}"
        resumed = [e for e in logged_events(weir_cluster, "cdc_snapshot_resumed") if e.get("slot") == t.slot]
        assert any(e["chunks_read"] > 0 for e in resumed), f"the restore did not resume the snapshot: {resumed}"

        def changelog() -> list[ChangeEvent]:
            events = []
            for _p, _o, _k, value, _ts in sorted(kafka.read_committed_records(endpoints, topic)):
                if value is not None:
                    e = json.loads(value)
                    events.append(ChangeEvent(ChangeOp(e["op"]), e["table"], e["before"], e["after"], 0, e["xid"]))
            return events

        # The changelog replayed equal to the source table.
        events = settle(240, changelog, lambda found: applied(found)[0] == expected_copy, 0.5)
        assert applied(events)[0] == expected_copy
        each_change_once(events, rows, writer.changes)
        reads = applied(events)[1]
        assert [k for k, n in reads.items() if n > 1] == [], "no row read twice: each partition resumed"
        weir_cluster.client.cancel_job(job_id)
        weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=120)
        assert not slot_exists(endpoints, t.slot), "a cancelled job's slot is dropped"
    finally:
        writer.stop.set()
