"""The PostgreSQL CDC source against the real server: the snapshot and the changes after it, a restore
that decodes again exactly from its checkpoint, the slot advanced only when a checkpoint completes,
and the two clear errors (a slot that is gone, a table without a replica identity)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql

from tests.integration.sinks.conftest import operator_context
from weir.connectors import postgres
from weir.core.cdc import CdcSourceError, ChangeEvent, ChangeOp, parse_lsn
from weir.core.config import Endpoints
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import JobDefinitionError
from weir.operators.cdc_source import PostgresCdcSourceOperator

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

    def source(self, restored: bytes | None = None) -> tuple[PostgresCdcSourceOperator, Collected]:
        operator = PostgresCdcSourceOperator(PostgresCdcSourceSpec((self.table,), self.slot, self.slot))
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
    """Poll until ``wanted`` events came (each poll decodes what is committed: no wait needed)."""
    for _ in range(50):
        if len(out.events) >= wanted:
            break
        operator.poll(100)
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
    restored.poll(100)
    assert len(again.events) == 3, "and nothing else"
    restored.snapshot_state(3)
    restored.notify_checkpoint_complete(3)
    restored.close()
    advanced = cdc_case.confirmed_flush()
    assert advanced is not None and advanced > created_at, "a completed checkpoint advances the slot"

    from_second, none_again = cdc_case.source(second)
    from_second.poll(100)
    assert none_again.events == [], "checkpoint 2 held every change: none is emitted twice"
    from_second.close()


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
