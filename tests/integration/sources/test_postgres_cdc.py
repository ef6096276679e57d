"""The PostgreSQL CDC source against the real server: the snapshot and the changes after it, a restore
that decodes again exactly from its checkpoint, the slot advanced only when a checkpoint completes,
the snapshot read in chunks and resumed after the last checkpointed one, the slot dropped or kept at
the job's end, and the clear errors (a slot that is gone, a table without a replica identity)."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import structlog
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import REPO_ROOT, WeirCluster, create_topics
from tests.integration.polling import poll, settle
from tests.integration.sinks.conftest import operator_context
from weir.connectors import kafka, postgres, postgres_cdc
from weir.core.cdc import CdcSourceError, ChangeEvent, ChangeOp, JobEnd, parse_lsn
from weir.core.config import Endpoints
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import JobDefinitionError
from weir.operators.cdc_source import PostgresCdcSourceOperator, release_at_job_end
from weir.tools.cli import run_cli
from weir.tools.client import JobDetails
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration


class Collected:
    """The source's output: every event, in order."""

    def __init__(self) -> None:
        self.events: list[ChangeEvent] = []

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.events.append(value)

    def emit_watermark(self, watermark: int) -> None:
        pass


@dataclass
class CdcCase:
    endpoints: Endpoints
    table: str
    slot: str

    def execute(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        with postgres.connect(self.endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(t=sql.Identifier(self.table)), params)

    def source(
        self, restored: bytes | None = None, chunk_size: int = 8096
    ) -> tuple[PostgresCdcSourceOperator, Collected]:
        spec = PostgresCdcSourceSpec((self.table,), self.slot, self.slot, chunk_size=chunk_size)
        operator = PostgresCdcSourceOperator(spec)
        out = Collected()
        operator.setup(operator_context(f"cdc-{self.slot}", "cdc"), out)
        if restored is not None:
            operator.restore_state(restored)
        operator.open()
        return operator, out

    def confirmed_flush(self) -> int | None:
        with postgres.connect(self.endpoints, autocommit=True) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
            ).fetchone()
        return None if row is None else parse_lsn(row[0])

    def drop_slot(self) -> None:
        with postgres.connect(self.endpoints, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            )


@pytest.fixture
def cdc_case(services: Endpoints) -> Iterator[CdcCase]:
    """A table of its own and a slot name of its own; the slot and publication are dropped after
    (a slot keeps the server's WAL)."""
    suffix = uuid.uuid4().hex[:10]
    case = CdcCase(services, f"cdc_src_{suffix}", f"weir_cdc_test_{suffix}")
    case.execute("CREATE TABLE {t} (id int PRIMARY KEY, name text NOT NULL, amount numeric(10, 2))")
    try:
        yield case
    finally:
        case.drop_slot()
        with postgres.connect(services, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(case.slot)))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(case.table)))


def drain(operator: PostgresCdcSourceOperator, out: Collected, wanted: int) -> list[ChangeEvent]:
    """Poll until ``wanted`` events came: a commit is decodable once its WAL is flushed, which the
    local server (``synchronous_commit=off``) does within a few WAL writer rounds of 200 ms."""

    def enough() -> bool | None:
        operator.poll(100)
        return True if len(out.events) >= wanted else None

    poll(f"{wanted} events from the source", 60, enough, interval_s=0.05)
    return list(out.events)


def whole(event: ChangeEvent) -> tuple[Any, ...]:
    def items(row: Any) -> Any:
        return None if row is None else tuple(sorted(row.items()))

    return (event.op, event.table, items(event.before), items(event.after))


def test_snapshot_then_changes_then_a_restore_reads_again_exactly_from_its_checkpoint(cdc_case: CdcCase) -> None:
    cdc_case.execute("INSERT INTO {t} VALUES (1, 'a', 1.50), (2, 'b', NULL)")
    source, out = cdc_case.source()
    source.poll(100)  # the snapshot
    table = f"public.{cdc_case.table}"
    assert Counter(whole(e) for e in out.events) == Counter(
        [
            (ChangeOp.READ, table, None, (("amount", Decimal("1.50")), ("id", 1), ("name", "a"))),
            (ChangeOp.READ, table, None, (("amount", None), ("id", 2), ("name", "b"))),
        ]
    )
    created_at = cdc_case.confirmed_flush()
    assert created_at is not None and all(e.lsn == created_at for e in out.events)

    cdc_case.execute("INSERT INTO {t} VALUES (3, 'c', 3)")
    cdc_case.execute("UPDATE {t} SET name = 'b2' WHERE id = 2")
    first = source.snapshot_state(1)  # before the source decoded them: at the snapshot's position
    source.notify_checkpoint_complete(1)
    cdc_case.execute("DELETE FROM {t} WHERE id = 1")
    events = drain(source, out, 5)
    assert [whole(e) for e in events[2:]] == [
        (ChangeOp.INSERT, table, None, (("amount", Decimal("3.00")), ("id", 3), ("name", "c"))),
        (ChangeOp.UPDATE, table, None, (("amount", None), ("id", 2), ("name", "b2"))),
        (ChangeOp.DELETE, table, (("id", 1),), None),
    ]
    lsns = [e.lsn for e in events[2:]]
    assert all(e.xid is not None for e in events[2:]) and lsns == sorted(lsns) and lsns[0] >= created_at
    second = source.snapshot_state(2)  # after the delete; never completes
    assert cdc_case.confirmed_flush() == created_at, "checkpoint 1 held the snapshot's position only"
    source.close()

    restored, again = cdc_case.source(first)
    assert drain(restored, again, 3) == events[2:], "the restore decodes again every change after checkpoint 1"
    cdc_case.execute("INSERT INTO {t} VALUES (4, 'd', 4)")  # a later change: everything before it is out
    drain(restored, again, 4)
    assert [whole(e) for e in again.events[3:]] == [
        (ChangeOp.INSERT, table, None, (("amount", Decimal("4.00")), ("id", 4), ("name", "d")))
    ], "and nothing else"
    restored.close()

    from_second, after_second = cdc_case.source(second)
    assert [whole(e) for e in drain(from_second, after_second, 1)] == [whole(again.events[3])], (
        "checkpoint 2 held every change before it: only the later insert comes again"
    )
    from_second.snapshot_state(4)
    from_second.notify_checkpoint_complete(4)
    from_second.close()
    advanced = cdc_case.confirmed_flush()
    assert advanced is not None and advanced > again.events[3].lsn, "a completed checkpoint advances the slot"
    with pytest.raises(CdcSourceError, match="past the restored checkpoint's LSN"):
        cdc_case.source(first)  # the slot no longer holds what came after checkpoint 1


def test_the_before_row_is_what_the_replica_identity_gives(cdc_case: CdcCase) -> None:
    cdc_case.execute("INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 2)")
    source, out = cdc_case.source()
    source.poll(100)
    cdc_case.execute("UPDATE {t} SET id = 10 WHERE id = 1")  # the key changed: its old key is sent
    cdc_case.execute("ALTER TABLE {t} REPLICA IDENTITY FULL")
    cdc_case.execute("UPDATE {t} SET name = 'b2' WHERE id = 2")
    cdc_case.execute("DELETE FROM {t} WHERE id = 10")
    table = f"public.{cdc_case.table}"
    assert [whole(e) for e in drain(source, out, 5)[2:]] == [
        (ChangeOp.UPDATE, table, (("id", 1),), (("amount", Decimal("1.00")), ("id", 10), ("name", "a"))),
        (
            ChangeOp.UPDATE,
            table,
            (("amount", Decimal("2.00")), ("id", 2), ("name", "b")),
            (("amount", Decimal("2.00")), ("id", 2), ("name", "b2")),
        ),
        (ChangeOp.DELETE, table, (("amount", Decimal("1.00")), ("id", 10), ("name", "a")), None),
    ]
    source.close()


def test_a_slot_dropped_while_running_is_one_clear_error(cdc_case: CdcCase) -> None:
    cdc_case.execute("INSERT INTO {t} VALUES (1, 'a', 1)")
    source, out = cdc_case.source()
    source.poll(100)
    cdc_case.execute("INSERT INTO {t} VALUES (2, 'b', 2)")
    drain(source, out, 2)
    state = source.snapshot_state(1)
    cdc_case.drop_slot()
    with pytest.raises(CdcSourceError, match=f"replication slot '{cdc_case.slot}' is gone"):
        source.notify_checkpoint_complete(1)
    source.close()
    with pytest.raises(CdcSourceError, match=f"replication slot '{cdc_case.slot}' is gone.*take a new snapshot"):
        cdc_case.source(state)


def test_a_table_without_replica_identity_is_one_clear_error(cdc_case: CdcCase) -> None:
    cdc_case.execute("ALTER TABLE {t} REPLICA IDENTITY NOTHING")
    operator = PostgresCdcSourceOperator(PostgresCdcSourceSpec((cdc_case.table,), cdc_case.slot, cdc_case.slot))
    expected = f"table public.{cdc_case.table} has no replica identity \\(REPLICA IDENTITY NOTHING\\)"
    with pytest.raises(JobDefinitionError, match=expected):
        operator.validate_at_submit(cdc_case.endpoints)
    with pytest.raises(JobDefinitionError, match=expected):
        cdc_case.source()
    assert cdc_case.confirmed_flush() is None, "no slot is created for it"


def test_a_restore_from_an_older_checkpoint_than_the_slot_is_refused(cdc_case: CdcCase) -> None:
    source, out = cdc_case.source()
    source.poll(100)
    older = source.snapshot_state(1)
    source.notify_checkpoint_complete(1)
    cdc_case.execute("INSERT INTO {t} VALUES (1, 'a', 1)")
    drain(source, out, 1)
    source.snapshot_state(2)
    source.notify_checkpoint_complete(2)
    source.close()
    with pytest.raises(CdcSourceError, match="past the restored checkpoint's LSN"):
        cdc_case.source(older)


# The chunked snapshot ---------------------------------------------------------------------------------


def poll_until_streaming(operator: PostgresCdcSourceOperator) -> None:
    poll(
        "the snapshot's last chunk", 60, lambda: True if (operator.poll(100) and operator_streaming(operator)) else None
    )


def operator_streaming(operator: PostgresCdcSourceOperator) -> bool:
    """Whether the source streams (every chunk emitted): its state as a checkpoint would hold it,
    that checkpoint then aborted."""
    state = operator.snapshot_state(0)
    operator.notify_checkpoint_aborted(0)
    return state is not None and b'"phase":"streaming"' in state


def test_a_chunked_snapshot_resumes_after_its_checkpointed_chunk_and_each_change_comes_once(
    cdc_case: CdcCase,
) -> None:
    """Chunks of 3 rows by id; a checkpoint after two chunks; then changes to rows of read chunks,
    of unread chunks and between keys; a crash; the restore reads the remaining chunks (which see
    the changes to their rows) and streams only the changes no chunk saw."""
    ids = list(range(1, 41, 2))  # gaps between the keys for inserts
    for i in ids:
        cdc_case.execute("INSERT INTO {t} VALUES (%s, %s, %s)", (i, f"n{i}", i))
    table = f"public.{cdc_case.table}"
    source, out = cdc_case.source(chunk_size=3)
    source.poll(100)
    source.poll(100)
    assert [e.row["id"] for e in out.events] == ids[:6], "two polls, two chunks of three rows by key"
    created_at = cdc_case.confirmed_flush()
    checkpoint = source.snapshot_state(1)
    source.notify_checkpoint_complete(1)
    assert cdc_case.confirmed_flush() == created_at, "the slot stays at its consistent point during the snapshot"
    cdc_case.execute("UPDATE {t} SET name = 'u3' WHERE id = 3")  # a read chunk: streamed
    cdc_case.execute("DELETE FROM {t} WHERE id = 9")  # a read chunk: streamed
    cdc_case.execute("UPDATE {t} SET name = 'u25' WHERE id = 25")  # an unread chunk: in its read
    cdc_case.execute("INSERT INTO {t} VALUES (26, 'n26', 26)")  # between unread keys: in its chunk's read
    cdc_case.execute("INSERT INTO {t} VALUES (100, 'n100', 100)")  # above every key: in the last chunk's read
    source.close()  # the crash: what came after checkpoint 1 is dropped by the sinks

    cdc_case.execute("UPDATE {t} SET name = 'u1' WHERE id = 1")  # while down, to a read chunk: streamed
    restored, again = cdc_case.source(checkpoint, chunk_size=3)
    poll_until_streaming(restored)
    with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, name, amount FROM {}").format(sql.Identifier(cdc_case.table))
        ).fetchall()
    reads = [
        (ChangeOp.READ, table, None, (("amount", Decimal(a)), ("id", i), ("name", n))) for i, n, a in rows if i > ids[5]
    ]
    streamed = [
        (ChangeOp.UPDATE, table, None, (("amount", Decimal(3)), ("id", 3), ("name", "u3"))),
        (ChangeOp.DELETE, table, (("id", 9),), None),
        (ChangeOp.UPDATE, table, None, (("amount", Decimal(1)), ("id", 1), ("name", "u1"))),
    ]
    events = drain(restored, again, len(reads) + len(streamed))
    assert Counter(whole(e) for e in events[: len(reads)]) == Counter(reads), "the chunks after the checkpoint's"
    assert [whole(e) for e in events[len(reads) :]] == streamed, "only the changes no chunk saw, in commit order"
    cdc_case.execute("UPDATE {t} SET name = 'u26' WHERE id = 26")  # a later change: everything before it is out
    assert [whole(e) for e in drain(restored, again, len(events) + 1)[len(events) :]] == [
        (ChangeOp.UPDATE, table, None, (("amount", Decimal(26)), ("id", 26), ("name", "u26")))
    ], "and nothing else"
    restored.close()


def test_text_keys_are_chunked_in_code_point_order_and_each_change_placed_in_its_chunk(cdc_case: CdcCase) -> None:
    """A text key: chunks by ``COLLATE "C"`` order, which is Python's; changes to every key after two
    chunks were read: the keys of read chunks are streamed, the others are in their chunks' reads."""
    text_table = f"{cdc_case.table}_text"
    keys = ["a", "B", "b", "Z", "é", "aa", "ab", "A", "z", "0", "ä", "ba"]
    with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (k text PRIMARY KEY, v int)").format(sql.Identifier(text_table)))
        for k in keys:
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, 0)").format(sql.Identifier(text_table)), (k,))
    try:
        spec = PostgresCdcSourceSpec((text_table,), cdc_case.slot, cdc_case.slot, chunk_size=3)
        source, out = PostgresCdcSourceOperator(spec), Collected()
        source.setup(operator_context(f"cdc-{cdc_case.slot}", "cdc"), out)
        source.open()
        source.poll(100)
        source.poll(100)
        read_first = [e.row["k"] for e in out.events]
        assert read_first == sorted(keys)[:6], "two chunks of three keys, in code point order"
        with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {} SET v = 1").format(sql.Identifier(text_table)))
        poll_until_streaming(source)
        n = len(keys) + 6
        events = drain(source, out, n)
        table = f"public.{text_table}"
        later_reads = [(ChangeOp.READ, table, None, (("k", k), ("v", 1))) for k in sorted(keys)[6:]]
        updates = [(ChangeOp.UPDATE, table, None, (("k", k), ("v", 1))) for k in read_first]
        assert Counter(whole(e) for e in events[6:]) == Counter(later_reads + updates)
        source.close()
    finally:
        with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(text_table)))


def test_a_composite_key_is_chunked_and_a_table_without_a_key_is_read_in_one_chunk(cdc_case: CdcCase) -> None:
    """Two tables in one source: one keyed by (int, text), read in chunks of two in row order; one
    without a primary key (REPLICA IDENTITY FULL), read in one chunk. Changes after the first chunk:
    those of its rows are streamed, the rest are in the later chunks' reads."""
    composite, keyless = f"{cdc_case.table}_comp", f"{cdc_case.table}_nokey"
    with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (a int, b text, v int, PRIMARY KEY (a, b))").format(sql.Identifier(composite))
        )
        conn.execute(sql.SQL("CREATE TABLE {} (x int, y text)").format(sql.Identifier(keyless)))
        conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(sql.Identifier(keyless)))
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (1, 'b', 0), (1, 'a', 0), (2, 'A', 0), (2, 'z', 0), (3, 'x', 0)").format(
                sql.Identifier(composite)
            )
        )
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'p'), (2, 'q'), (2, 'q')").format(sql.Identifier(keyless)))
    try:
        spec = PostgresCdcSourceSpec((composite, keyless), cdc_case.slot, cdc_case.slot, chunk_size=2)
        source, out = PostgresCdcSourceOperator(spec), Collected()
        source.setup(operator_context(f"cdc-{cdc_case.slot}", "cdc"), out)
        source.open()
        source.poll(100)
        assert [(e.row["a"], e.row["b"]) for e in out.events] == [(1, "a"), (1, "b")], "the first chunk, in key order"
        with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {} SET v = 1").format(sql.Identifier(composite)))
            conn.execute(sql.SQL("UPDATE {} SET y = y || '2'").format(sql.Identifier(keyless)))
            conn.execute(sql.SQL("INSERT INTO {} VALUES (3, 'r')").format(sql.Identifier(keyless)))
        poll_until_streaming(source)
        c, k = f"public.{composite}", f"public.{keyless}"
        expected = [
            *[(ChangeOp.READ, c, None, (("a", a), ("b", b), ("v", 1))) for a, b in [(2, "A"), (2, "z"), (3, "x")]],
            *[(ChangeOp.READ, k, None, (("x", x), ("y", y))) for x, y in [(1, "p2"), (2, "q2"), (2, "q2"), (3, "r")]],
            *[(ChangeOp.UPDATE, c, None, (("a", 1), ("b", b), ("v", 1))) for b in ["a", "b"]],
        ]
        events = drain(source, out, 2 + len(expected))
        assert Counter(whole(e) for e in events[2:]) == Counter(expected)
        with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("DELETE FROM {} WHERE x = 1").format(sql.Identifier(keyless)))
        assert [whole(e) for e in drain(source, out, len(events) + 1)[len(events) :]] == [
            (ChangeOp.DELETE, k, (("x", 1), ("y", "p2")), None)
        ], "a later change of the one-chunk table is streamed"
        source.close()
    finally:
        with postgres.connect(cdc_case.endpoints, autocommit=True) as conn:
            for table in (composite, keyless):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


# The slot at the job's end ------------------------------------------------------------------------------


def slot_exists(endpoints: Endpoints, slot: str) -> bool:
    with postgres.connect(endpoints, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is not None


def publication_exists(endpoints: Endpoints, publication: str) -> bool:
    with postgres.connect(endpoints, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is not None


def test_releasing_drops_the_slot_and_only_a_publication_the_source_created(cdc_case: CdcCase) -> None:
    endpoints = cdc_case.endpoints
    spec = PostgresCdcSourceSpec((cdc_case.table,), cdc_case.slot, cdc_case.slot)
    source, _ = cdc_case.source()
    source.poll(100)
    source.close()
    assert slot_exists(endpoints, cdc_case.slot) and publication_exists(endpoints, cdc_case.slot)
    assert cdc_case.slot in [s.slot for s in postgres_cdc.list_slots(postgres.connect(endpoints, autocommit=True))]
    release_at_job_end(spec, JobEnd.STOPPED_AT_SAVEPOINT, endpoints, structlog.get_logger())
    assert slot_exists(endpoints, cdc_case.slot), "kept at a savepoint"
    release_at_job_end(spec, JobEnd.CANCELED, endpoints, structlog.get_logger())
    assert not slot_exists(endpoints, cdc_case.slot) and not publication_exists(endpoints, cdc_case.slot)
    release_at_job_end(spec, JobEnd.FAILED, endpoints, structlog.get_logger())  # again: nothing left, no error

    mine = f"{cdc_case.slot}_mine"
    cdc_case.execute(f"CREATE PUBLICATION {mine} FOR TABLE {{t}}")
    try:
        spec = PostgresCdcSourceSpec((cdc_case.table,), cdc_case.slot, mine)
        source = PostgresCdcSourceOperator(spec)
        source.setup(operator_context(f"cdc-{cdc_case.slot}", "cdc"), Collected())
        source.open()
        source.poll(100)
        source.close()
        release_at_job_end(spec, JobEnd.FINISHED, endpoints, structlog.get_logger())
        assert not slot_exists(endpoints, cdc_case.slot)
        assert publication_exists(endpoints, mine), "a publication the user made stays"
    finally:
        cdc_case.execute(f"DROP PUBLICATION IF EXISTS {mine}")


def test_a_slot_still_read_by_a_session_is_not_dropped_until_it_is_free(cdc_case: CdcCase) -> None:
    """A session of the ended job still streams from the slot: the drop fails with a line naming
    the slot (the JobManager retries it); once the session is gone, it succeeds."""
    source, _ = cdc_case.source()
    source.poll(100)
    source.close()
    spec = PostgresCdcSourceSpec((cdc_case.table,), cdc_case.slot, cdc_case.slot)
    reader = psycopg.connect(make_conninfo(cdc_case.endpoints.postgres_dsn, replication="database"), autocommit=True)
    try:
        start = sql.SQL("START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {})").format(
            sql.Identifier(cdc_case.slot), sql.Literal(cdc_case.slot)
        )
        reader.pgconn.send_query(start.as_bytes(reader))
        poll(
            "the slot read by the session",
            30,
            lambda: True if not _slot_inactive(cdc_case.endpoints, cdc_case.slot) else None,
        )
        with pytest.raises(postgres_cdc.SlotDropError, match=f"replication slot '{cdc_case.slot}' is still in use"):
            release_at_job_end(spec, JobEnd.CANCELED, cdc_case.endpoints, structlog.get_logger())
        assert slot_exists(cdc_case.endpoints, cdc_case.slot)
    finally:
        reader.close()
    poll("the slot free", 30, lambda: True if _slot_inactive(cdc_case.endpoints, cdc_case.slot) else None)
    release_at_job_end(spec, JobEnd.CANCELED, cdc_case.endpoints, structlog.get_logger())
    assert not slot_exists(cdc_case.endpoints, cdc_case.slot)


def test_a_slot_that_cannot_be_dropped_is_one_line_naming_it(cdc_case: CdcCase) -> None:
    source, _ = cdc_case.source()
    source.poll(100)
    source.close()
    down = cdc_case.endpoints.model_copy(
        update={"postgres_dsn": cdc_case.endpoints.postgres_dsn.replace(":15432", ":27599")}
    )
    spec = PostgresCdcSourceSpec((cdc_case.table,), cdc_case.slot, cdc_case.slot)
    with pytest.raises(postgres_cdc.SlotDropError, match=f"replication slot '{cdc_case.slot}' could not be dropped"):
        release_at_job_end(spec, JobEnd.CANCELED, down, structlog.get_logger())
    assert slot_exists(cdc_case.endpoints, cdc_case.slot), "still there: the end is retried"


def test_weir_cdc_lists_a_leftover_slot_with_its_weir_publication_and_drops_it(
    cdc_case: CdcCase, capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = cdc_case.source()
    source.poll(100)
    source.close()
    capsys.readouterr()  # the source's logs
    assert run_cli(["cdc", "slots", "--json"]) == 0
    listed = {s["slot"]: s for s in json.loads(capsys.readouterr().out)["slots"]}
    assert listed[cdc_case.slot]["weir_publication"] == cdc_case.slot and not listed[cdc_case.slot]["active"]
    assert listed[cdc_case.slot]["retained_wal_bytes"] >= 0
    assert run_cli(["cdc", "drop-slot", cdc_case.slot]) == 0
    assert f"replication slot {cdc_case.slot} dropped; publication {cdc_case.slot} dropped" in capsys.readouterr().out
    assert not slot_exists(cdc_case.endpoints, cdc_case.slot)
    assert not publication_exists(cdc_case.endpoints, cdc_case.slot)
    assert run_cli(["cdc", "drop-slot", cdc_case.slot]) == 2
    assert f"weir: error: no logical replication slot '{cdc_case.slot}'" in capsys.readouterr().err


# A cluster run with a TaskManager killed ------------------------------------------------------------


class Writer(threading.Thread):
    """Inserts, updates and deletes rows of the source table (one to three per transaction) until
    stopped, and keeps each committed change as the changelog should show it."""

    def __init__(self, endpoints: Endpoints, table: str, seed: str, first_id: int) -> None:
        super().__init__(name="cdc-writer", daemon=True)
        self._endpoints, self._table = endpoints, table
        self._rng = random.Random(seed)
        self._next_id = first_id
        self.live: set[int] = set(range(1, first_id))
        self.changes: list[tuple[str, int, str | None, int | None]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with postgres.connect(self._endpoints) as conn:
                while not self.stop.wait(0.02):  # pacing: about 50 transactions a second at most
                    done = [self._change(conn) for _ in range(self._rng.randint(1, 3))]
                    conn.commit()
                    self.changes.extend(c for c in done if c is not None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _change(self, conn: psycopg.Connection[Any]) -> tuple[str, int, str | None, int | None] | None:
        t = sql.Identifier(self._table)
        choice = self._rng.random()
        if choice < 0.45 or len(self.live) < 5:
            row_id, self._next_id = self._next_id, self._next_id + 1
            name, amount = f"n{row_id}", self._rng.randint(0, 1000)
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(t), (row_id, name, amount))
            self.live.add(row_id)
            return ("insert", row_id, name, amount)
        row_id = self._rng.choice(sorted(self.live))
        if choice < 0.8:
            name, amount = f"u{self._rng.randint(0, 10**6)}", self._rng.randint(0, 1000)
            conn.execute(
                sql.SQL("UPDATE {} SET name = %s, amount = %s WHERE id = %s").format(t), (name, amount, row_id)
            )
            return ("update", row_id, name, amount)
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(t), (row_id,))
        self.live.discard(row_id)
        return ("delete", row_id, None, None)


def changelog_entry(value: bytes) -> tuple[str, int, str | None, int | None]:
    event = json.loads(value)
    if event["op"] == "delete":
        return ("delete", event["before"]["id"], None, None)
    after = event["after"]
    return (event["op"], after["id"], after["name"], after["amount"])


def test_cdc_through_a_taskmanager_kill_leaves_the_copy_equal_and_every_change_once_in_the_changelog(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    suffix = uuid.uuid4().hex[:10]
    source, target, slot, topic = f"cdc_src_{suffix}", f"cdc_copy_{suffix}", f"weir_cdc_test_{suffix}", f"cdc-{unique}"
    create_topics(endpoints, {topic: 3})
    with postgres.connect(endpoints, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(source))
        )
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(target))
        )
        initial = [(i, f"n{i}", i * 10) for i in range(1, 201)]
        with conn.cursor() as cur:
            cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(sql.Identifier(source)), initial)
    case = CdcCase(endpoints, source, slot)
    writer = Writer(endpoints, source, unique, first_id=len(initial) + 1)
    try:
        params = {
            "source.table": source,
            "source.slot": slot,
            "sink.table": target,
            "sink.topic": topic,
            "checkpointing.interval": "1s",
            "restart.strategy": "fixed-delay",
            "restart.delay": "1s",
        }
        job_id = weir_cluster.submit("tests/integration/sources/jobs/cdc_to_postgres.py", params)

        def copy_rows() -> Counter[tuple[Any, ...]]:
            """Every row of the copy, whole: a delete deleted its row (no tombstone column to filter)."""
            with postgres.connect(endpoints, autocommit=True) as conn:
                rows = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(target))).fetchall()
            return Counter(rows)

        def source_rows() -> Counter[tuple[Any, ...]]:
            with postgres.connect(endpoints, autocommit=True) as conn:
                return Counter(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(source))))

        assert settled("the snapshot in the copy", 180, Counter(initial), copy_rows) == Counter(initial)
        write_through_a_source_kill(weir_cluster, job_id, writer, "cdc", more_after=100)
        expected_source = source_rows()
        assert {r[0] for r in expected_source} == writer.live, "the writer's view is the table's"
        assert settled("the copy equal to the source table", 240, expected_source, copy_rows) == expected_source

        expected_log = Counter([("read", i, n, a) for i, n, a in initial] + writer.changes)

        def changelog() -> Counter[tuple[str, int, str | None, int | None]] | None:
            records = kafka.read_committed_records(endpoints, topic)
            found = Counter(changelog_entry(value) for _p, _o, _k, value, _ts in records if value is not None)
            return found if found.total() >= expected_log.total() else None

        assert poll("every change in the changelog", 240, changelog) == expected_log
        weir_cluster.client.cancel_job(job_id)
        wait_until(weir_cluster, job_id, lambda s: s.summary.status == "CANCELED", "the job to cancel", 120)
    finally:
        writer.stop.set()
        poll("the slot released by the cancelled job", 120, lambda: True if _slot_inactive(endpoints, slot) else None)
        case.drop_slot()
        with postgres.connect(endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))
            for table in (source, target):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def kill_source_and_recover(
    cluster: WeirCluster, job_id: str, status: JobDetails, vertex_uid: str, timeout_s: float
) -> JobDetails:
    """SIGKILL the TaskManager running ``vertex_uid`` (the CDC source); the job RUNNING again after a
    restore, with two checkpoints completed since the last one before the kill."""
    victim = next(str(t.taskmanager_id) for t in status.tasks if t.vertex_uid == vertex_uid)
    killed_at = status.last_completed_checkpoint or 0
    kill_process(cluster.directory, victim)
    recovered = wait_until(
        cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and s.last_restore_at is not None
            and (s.last_completed_checkpoint or 0) >= killed_at + 2
        ),
        f"recovery after killing {victim}, the CDC source's TaskManager",
        timeout_s,
    )
    assert recovered.last_restore_at is not None
    return recovered


def write_through_a_source_kill(
    cluster: WeirCluster, job_id: str, writer: Writer, vertex_uid: str, more_after: int
) -> None:
    """Start ``writer``; once three checkpoints completed and it made a hundred changes, kill the CDC
    source's TaskManager (``kill_source_and_recover``); ``more_after`` changes after the recovery, stop
    it. It must have inserted, updated and deleted, and not failed."""
    writer.start()
    status = wait_until(
        cluster,
        job_id,
        lambda s: (s.last_completed_checkpoint or 0) >= 3 and len(writer.changes) >= 100,
        "three completed checkpoints and a hundred changes",
        180,
    )
    kill_source_and_recover(cluster, job_id, status, vertex_uid, 240)
    after_recovery = len(writer.changes) + more_after
    poll(f"{more_after} changes more after the recovery", 120, lambda: len(writer.changes) >= after_recovery or None)
    writer.stop.set()
    writer.join(30)
    assert writer.error is None, f"the writer failed: {writer.error!r}"
    kinds = Counter(c[0] for c in writer.changes)
    assert kinds["insert"] and kinds["update"] and kinds["delete"], kinds


def settled(what: str, deadline_s: float, expected: Counter[Any], actual: Callable[[], Counter[Any]]) -> Counter[Any]:
    """``actual()`` once it equals ``expected``, or its last value after the deadline (the caller's
    assert then shows the difference)."""
    return settle(deadline_s, actual, lambda answer: answer == expected)


def _slot_inactive(endpoints: Endpoints, slot: str) -> bool:
    with postgres.connect(endpoints, autocommit=True) as conn:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return row is None or not row[0]


def test_a_job_on_a_table_without_replica_identity_is_refused_at_submit(
    weir_cluster: WeirCluster, cdc_case: CdcCase, unique: str
) -> None:
    cdc_case.execute("ALTER TABLE {t} REPLICA IDENTITY NOTHING")
    topic = f"cdc-refused-{unique}"
    create_topics(weir_cluster.endpoints, {topic: 1})
    params = {"source.table": cdc_case.table, "source.slot": cdc_case.slot, "sink.table": "unused", "sink.topic": topic}
    params["checkpointing.interval"] = "1s"
    with pytest.raises(JobDefinitionError, match=f"source 'cdc': postgres cdc source: table public.{cdc_case.table} "):
        weir_cluster.submit("tests/integration/sources/jobs/cdc_to_postgres.py", params)
    assert cdc_case.confirmed_flush() is None, "no slot was created"


def test_a_slot_dropped_under_a_running_job_fails_it_with_one_clear_line(
    weir_cluster: WeirCluster, cdc_case: CdcCase, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    target, topic = f"{cdc_case.table}_copy", f"cdc-dropped-{unique}"
    create_topics(endpoints, {topic: 1})
    with postgres.connect(endpoints, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(target))
        )
    try:
        params = {
            "source.table": cdc_case.table,
            "source.slot": cdc_case.slot,
            "sink.table": target,
            "sink.topic": topic,
            "checkpointing.interval": "1s",
            "restart.strategy": "none",
        }
        job_id = weir_cluster.submit("tests/integration/sources/jobs/cdc_to_postgres.py", params)
        wait_until(
            weir_cluster,
            job_id,
            lambda s: s.summary.status == "RUNNING" and (s.last_completed_checkpoint or 0) >= 1,
            "a completed checkpoint",
            180,
        )

        poll("the slot created by the snapshot", 120, lambda: True if cdc_case.confirmed_flush() is not None else None)

        def dropped() -> bool | None:  # the source holds the slot only while it decodes: try again then
            try:
                cdc_case.drop_slot()
            except psycopg.errors.ObjectInUse:
                return None
            return True

        poll("the slot dropped", 60, dropped)
        cdc_case.execute("INSERT INTO {t} VALUES (1, 'a', 1)")  # a change moves the position: the slot must advance
        ended = weir_cluster.wait_for(job_id, ("FAILED",), timeout_s=120)
        assert ended.summary.status == "FAILED", ended
        # The job's failure is the first a task reported: the source's, since a failed task's report goes
        # before its outputs close (make test once saw the consumer's "input channel 0 lost its producer"
        # arrive first and stand as the job's failure, the source's report then dropped).
        failure = weir_cluster.client.job_status(job_id).failure
        assert failure is not None and failure.type == "CdcSourceError", failure
        assert f"postgres cdc source: replication slot '{cdc_case.slot}' is gone" in failure.message
        assert "\n" not in failure.message
        poll(
            "the publication the source created dropped at the failed job's end",
            120,
            lambda: True if not publication_exists(endpoints, cdc_case.slot) else None,
        )
    finally:
        with postgres.connect(endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(target)))


# The slot at a job's end, on the cluster ----------------------------------------------------------------

CDC_JOB = "tests/integration/sources/jobs/cdc_to_postgres.py"


@dataclass
class CdcJobTables:
    endpoints: Endpoints
    source: str
    target: str
    slot: str

    def rows(self, table: str) -> Counter[tuple[Any, ...]]:
        with postgres.connect(self.endpoints, autocommit=True) as conn:
            return Counter(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall())

    def execute(self, statement: str, params: tuple[Any, ...] = ()) -> None:
        with postgres.connect(self.endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(t=sql.Identifier(self.source)), params)


@pytest.fixture
def cdc_job_tables(services: Endpoints) -> Iterator[CdcJobTables]:
    """A source table, its copy and a slot name of their own; whatever is left is dropped after."""
    suffix = uuid.uuid4().hex[:10]
    tables = CdcJobTables(services, f"cdc_src_{suffix}", f"cdc_copy_{suffix}", f"weir_cdc_test_{suffix}")
    with postgres.connect(services, autocommit=True) as conn:
        for table in (tables.source, tables.target):
            conn.execute(
                sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(table))
            )
    try:
        yield tables
    finally:
        poll("the slot released", 120, lambda: True if _slot_inactive(services, tables.slot) else None)
        CdcCase(services, tables.source, tables.slot).drop_slot()
        with postgres.connect(services, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(tables.slot)))
            for table in (tables.source, tables.target):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def test_a_stop_with_savepoint_keeps_the_slot_for_the_resumed_job_and_a_cancel_drops_it(
    weir_cluster: WeirCluster, cdc_job_tables: CdcJobTables, unique: str
) -> None:
    t, endpoints, client = cdc_job_tables, weir_cluster.endpoints, weir_cluster.client
    topic = f"cdc-end-{unique}"
    create_topics(endpoints, {topic: 1})
    t.execute("INSERT INTO {t} SELECT g, 'n' || g, g FROM generate_series(1, 20) g")
    params = {
        "source.table": t.source,
        "source.slot": t.slot,
        "sink.table": t.target,
        "sink.topic": topic,
        "checkpointing.interval": "1s",
    }
    first = weir_cluster.submit(CDC_JOB, params, parallelism=1)
    expected = t.rows(t.source)
    assert settled("the snapshot in the copy", 180, expected, lambda: t.rows(t.target)) == expected
    savepoint_id = client.trigger_savepoint(first, None, stop=True)
    path = client.wait_for_savepoint(first, savepoint_id, timeout_s=120.0).external_path
    stopped = weir_cluster.wait_for(first, ("FINISHED", "FAILED", "CANCELED"), timeout_s=120)
    assert stopped.summary.status == "FINISHED", stopped.failure
    assert slot_exists(endpoints, t.slot) and publication_exists(endpoints, t.slot), "kept for the savepoint"

    t.execute("INSERT INTO {t} SELECT g, 'n' || g, g FROM generate_series(21, 30) g")  # while stopped
    t.execute("UPDATE {t} SET name = 'u1' WHERE id = 1")
    t.execute("DELETE FROM {t} WHERE id = 2")
    second = client.submit_job(REPO_ROOT / CDC_JOB, params, 1, from_checkpoint=path)
    weir_cluster.submitted.append(second)
    expected = t.rows(t.source)
    assert settled("the changes made while stopped in the copy", 180, expected, lambda: t.rows(t.target)) == expected
    client.cancel_job(second)
    weir_cluster.wait_for(second, ("CANCELED",), timeout_s=120)
    assert not slot_exists(endpoints, t.slot), "a cancelled job's slot is dropped"
    assert not publication_exists(endpoints, t.slot), "and the publication its source created"


def logged_events(cluster: WeirCluster, event: str) -> list[dict[str, Any]]:
    """Every ``event`` the cluster's processes logged (JSON lines)."""
    found = []
    for log in cluster.directory.glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if event not in line or not line.startswith("{"):
                continue
            try:
                document = json.loads(line)
            except json.JSONDecodeError:
                continue
            if document.get("event") == event:
                found.append(document)
    return found


def test_a_taskmanager_killed_mid_snapshot_resumes_at_the_last_checkpointed_chunk(
    weir_cluster: WeirCluster, cdc_job_tables: CdcJobTables, unique: str
) -> None:
    """A table of 200 chunks, written to while its snapshot is read; the source's TaskManager killed
    once a checkpoint holds some chunks: the restore goes on after them (no row read twice), the
    copy ends equal to the source, and the changelog replayed gives the source table."""
    t, endpoints = cdc_job_tables, weir_cluster.endpoints
    rows, chunk = 50_000, 250
    topic = f"cdc-chunks-{unique}"
    create_topics(endpoints, {topic: 3})
    t.execute("INSERT INTO {t} SELECT g, 'n' || g, g * 10 FROM generate_series(1, %s) g", (rows,))
    writer = Writer(endpoints, t.source, unique, first_id=rows + 1)
    params = {
        "source.table": t.source,
        "source.slot": t.slot,
        "source.chunk_size": str(chunk),
        "sink.table": t.target,
        "sink.topic": topic,
        # 0.5 ms per change downstream: the snapshot takes ~25 s however fast the machine reads its chunks
        "copy.delay_us": "500",
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
        kill_source_and_recover(weir_cluster, job_id, status, "cdc", 300)
        after_recovery = len(writer.changes) + 50
        poll(
            "fifty changes more after the recovery",
            120,
            lambda: True if len(writer.changes) >= after_recovery else None,
        )
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, f"the writer failed: {writer.error!r}"
        expected = t.rows(t.source)
        assert settled("the copy equal to the source table", 400, expected, lambda: t.rows(t.target)) == expected

        resumed = [e for e in logged_events(weir_cluster, "cdc_snapshot_resumed") if e.get("slot") == t.slot]
        assert any(e["chunks_read"] > 0 for e in resumed), f"the restore did not resume the snapshot: {resumed}"

        read_ids: Counter[int] = Counter()

        def replayed() -> Counter[tuple[Any, ...]]:
            """The committed changelog applied in order (per partition, so per key)."""
            rows_now: dict[int, tuple[Any, ...]] = {}
            read_ids.clear()
            records = kafka.read_committed_records(endpoints, topic)
            for _p, _o, _k, value, _ts in sorted(records):
                if value is None:
                    continue
                event = json.loads(value)
                row = event["before"] if event["op"] == "delete" else event["after"]
                if event["op"] == "read":
                    read_ids[row["id"]] += 1
                if event["op"] == "delete":
                    rows_now.pop(row["id"], None)
                else:
                    rows_now[row["id"]] = (row["id"], row["name"], row["amount"])
            return Counter(rows_now.values())

        assert settled("the changelog replayed equal to the source table", 240, expected, replayed) == expected
        assert [i for i, n in read_ids.items() if n > 1] == [], "no row read twice: the snapshot resumed"
        weir_cluster.client.cancel_job(job_id)
        weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=120)
        assert not slot_exists(endpoints, t.slot), "a cancelled job's slot is dropped"
    finally:
        writer.stop.set()
