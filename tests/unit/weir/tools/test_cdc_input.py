"""A CDC source's test input (``weir.tools.cdc_input``): the change events' JSON lines read into the
events the source delivers, grouped into transactions; every input no source could deliver refused
with one line naming the event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from weir.core.cdc import ChangeEvent, ChangeOp, format_lsn
from weir.tools.cdc_input import CdcInput, CdcInputError, CdcTransaction, read_change_events

WHERE = "source 'cdc' (changes.jsonl)"


def lines(*documents: dict[str, Any]) -> list[bytes]:
    return [json.dumps(d).encode() for d in documents]


def read(id_: int, name: str, **extra: Any) -> dict[str, Any]:
    return {"op": "read", "table": "customers", "after": {"id": id_, "name": name}, **extra}


def insert(id_: int, name: str, **extra: Any) -> dict[str, Any]:
    return {"op": "insert", "table": "customers", "after": {"id": id_, "name": name}, **extra}


def delete(id_: int, **extra: Any) -> dict[str, Any]:
    return {"op": "delete", "table": "customers", "before": {"id": id_}, **extra}


def test_without_positions_reads_share_the_consistent_point_and_each_change_is_a_transaction() -> None:
    given = read_change_events(
        lines(read(1, "Ada"), read(2, "Bob"), insert(3, "Cy", ts_ms=5), delete(1, ts_ms=6)), WHERE
    )
    table = "public.customers"  # as the source names it
    assert given.consistent_point == 1
    assert given.reads == (
        ChangeEvent(ChangeOp.READ, table, None, {"id": 1, "name": "Ada"}, 1, None),
        ChangeEvent(ChangeOp.READ, table, None, {"id": 2, "name": "Bob"}, 1, None),
    )
    assert given.transactions == (
        CdcTransaction((ChangeEvent(ChangeOp.INSERT, table, None, {"id": 3, "name": "Cy"}, 2, 1),), 2, 5),
        CdcTransaction((ChangeEvent(ChangeOp.DELETE, table, {"id": 1}, None, 3, 2),), 3, 6),
    )


def test_given_positions_and_xids_group_consecutive_changes_into_transactions_ending_at_their_last_lsn() -> None:
    given = read_change_events(
        lines(
            read(1, "Ada", lsn="0/A0", format=1),
            insert(2, "Bob", lsn="0/B0", xid=700, ts_ms=10),
            delete(1, lsn="0/B8", xid=700, ts_ms=10),
            {"op": "update", "table": "shop.items", "before": None, "after": {"id": 9}, "lsn": "1/0", "xid": 701},
        ),
        WHERE,
    )
    assert given.consistent_point == 0xA0
    assert [(t.commit_end, t.commit_ms, [e.xid for e in t.changes]) for t in given.transactions] == [
        (0xB8, 10, [700, 700]),
        (1 << 32, None, [701]),
    ]
    assert given.transactions[1].changes[0].table == "shop.items"


def test_the_json_form_a_source_writes_replays_as_the_same_events() -> None:
    events = [
        ChangeEvent(ChangeOp.READ, "public.customers", None, {"id": 1, "name": "Ada"}, 0x10, None),
        ChangeEvent(ChangeOp.UPDATE, "public.customers", {"id": 1}, {"id": 1, "name": "Ada L"}, 0x20, 5),
        ChangeEvent(ChangeOp.DELETE, "public.customers", {"id": 1}, None, 0x28, 6),
    ]
    assert read_change_events([json.dumps(e.to_json()).encode() for e in events], WHERE).events == tuple(events)


def test_python_change_events_are_taken_as_given() -> None:
    events = [
        ChangeEvent(ChangeOp.INSERT, "public.t", None, {"id": 1}, 0x20, 9),
        ChangeEvent(ChangeOp.INSERT, "public.t", None, {"id": 2}, 0x21, 9),
    ]
    given = CdcInput.of(events, [7, 7])
    assert given.reads == () and given.transactions == (CdcTransaction(tuple(events), 0x21, 7),)


BAD = [
    pytest.param([b"{nope"], "change event 1: not JSON", id="not-json"),
    pytest.param([b"[1]"], "change event 1: a change event is a JSON object", id="not-object"),
    pytest.param(lines({"op": "upsert", "table": "t", "after": {}}), "op 'upsert' is none of read, insert", id="op"),
    pytest.param(lines({"op": "insert", "after": {"id": 1}}), "table None is not a table name", id="no-table"),
    pytest.param(lines(insert(1, "a", colour="red")), "unknown field 'colour'", id="unknown-field"),
    pytest.param(lines(insert(1, "a", format=2)), "format 2: this Weir reads change events of format 1", id="format"),
    pytest.param(lines({"op": "insert", "table": "t", "after": [1]}), "after is a row", id="row-not-object"),
    pytest.param(lines({"op": "insert", "table": "t", "before": {"id": 1}}), "an insert has an after row", id="insert"),
    pytest.param(lines({"op": "delete", "table": "t", "after": {"id": 1}}), "a delete has a before row", id="delete"),
    pytest.param(lines({"op": "update", "table": "t", "before": {"id": 1}}), "an update has an after row", id="update"),
    pytest.param(lines(read(1, "a", xid=3)), "change event 1: a read has no xid", id="read-xid"),
    pytest.param(lines(read(1, "a", ts_ms=3)), "a read carries no ts_ms", id="read-ts"),
    pytest.param(lines(insert(1, "a", ts_ms="noon")), "ts_ms 'noon' is not a commit time", id="ts"),
    pytest.param(lines(insert(1, "a", xid=-1)), "xid -1 is not a transaction id", id="xid"),
    pytest.param(lines(insert(1, "a", lsn="16")), "lsn '16' is not an LSN", id="lsn-text"),
    pytest.param(lines(insert(1, "a", lsn="0/1"), insert(2, "b")), "change event 2: no lsn", id="lsn-some"),
    pytest.param(lines(insert(1, "a", xid=1), insert(2, "b")), "change event 2: no xid", id="xid-some"),
    pytest.param(lines(insert(1, "a"), read(2, "b")), "change event 2 is a read after a change", id="late-read"),
    pytest.param(
        lines(read(1, "a", lsn="0/5"), read(2, "b", lsn="0/6"), insert(3, "c", lsn="0/7", xid=1)),
        "change event 2: the snapshot's reads share one lsn",
        id="reads-lsn",
    ),
    pytest.param(
        lines(read(1, "a", lsn="0/5"), insert(3, "c", lsn="0/5", xid=1)),
        "change event 2: lsn 0/5 is not after 0/5",
        id="change-at-consistent-point",
    ),
    pytest.param(
        lines(insert(1, "a", lsn="0/9", xid=1), insert(2, "b", lsn="0/8", xid=2)),
        "change event 2: lsn 0/8 is not after 0/9",
        id="lsn-back",
    ),
    pytest.param(
        lines(insert(1, "a", xid=1), insert(2, "b", xid=2), insert(3, "c", xid=1)),
        "change event 3: transaction 1 already ended",
        id="transaction-split",
    ),
    pytest.param(
        lines(insert(1, "a", xid=1, ts_ms=1), insert(2, "b", xid=1, ts_ms=2)),
        "change event 2: ts_ms 2 differs from the rest of transaction 1",
        id="two-commit-times",
    ),
]


@pytest.mark.parametrize(("given", "message"), BAD)
def test_input_no_source_could_deliver_is_one_line_naming_the_event(given: list[bytes], message: str) -> None:
    with pytest.raises(CdcInputError) as raised:
        read_change_events(given, WHERE)
    text = str(raised.value)
    assert text.startswith(f"{WHERE}, change event ") and message in text
    assert "\n" not in text


def test_python_input_that_is_not_change_events_is_refused() -> None:
    with pytest.raises(CdcInputError, match=r"change event 1: a CDC source's input is ChangeEvent values, not \{"):
        CdcInput.of([{"op": "insert"}])  # type: ignore[list-item]
    with pytest.raises(CdcInputError, match="2 change events and 1 commit times"):
        CdcInput.of([ChangeEvent(ChangeOp.INSERT, "public.t", None, {}, 2, 1)] * 2, [1])


def test_an_lsn_is_written_as_postgresql_writes_it() -> None:
    assert format_lsn(read_change_events(lines(read(1, "a", lsn="16/B374D848")), WHERE).consistent_point) == (
        "16/B374D848"
    )
