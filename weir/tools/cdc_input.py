"""A PostgreSQL CDC source's input in ``weir test``: the change events the source delivers, given as
test data instead of read from a replication slot (pure: no I/O, no database driver).

The input is what the source emits, in its order: the snapshot's ``read`` events first (one per row,
at the slot's consistent point), then the changes (``insert``, ``update``, ``delete``) in commit
order, grouped into transactions. A JSON lines file holds one event per line in the change event's
documented JSON form (``ChangeEvent.to_json``, docs/formats.md: what ``json.dumps(event.to_json())``
writes, so a changelog captured from a real source replays as it is), where ``format``, ``lsn`` and
``xid`` may be left out and ``ts_ms`` gives the transaction's commit time:

``{"op": "update", "table": "customers", "after": {"id": 1, "name": "Ada"}, "xid": 7, "lsn": "0/3", "ts_ms": 1000}``

- ``lsn`` on every line or on none. Given: the reads share one (the consistent point), and each
  change's is above the one before (a WAL record each), above the consistent point. Left out: the
  reads are at ``0/1`` and the n-th change (from 1) at ``0/(1 + n)``.
- ``xid`` on every change or on none: a transaction is a run of consecutive changes with one xid
  (its changes must be consecutive: the source emits whole transactions in commit order); left out,
  each change is its own transaction, the n-th with xid n. A transaction's position (what a
  checkpoint holds and a restore resumes after) is its last change's lsn.
- ``ts_ms`` (epoch ms), the same on every change of a transaction: the record timestamp the source
  stamps on each change (its transaction's commit time); left out, the changes carry none. Reads
  never carry one.
- ``table`` as the source delivers it, schema-qualified; a name without a schema is ``public``'s.
- ``before``/``after`` as the source gives them: a read and an insert have ``after`` only, an update
  ``after`` and maybe ``before``, a delete ``before`` only. Values are the JSON values as written (a
  ``numeric`` written as a string stays a string); give ``ChangeEvent`` values in Python for other
  types (:meth:`CdcInput.of`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from weir.core.cdc import CHANGE_EVENT_FORMAT, ChangeEvent, ChangeOp, format_lsn, parse_lsn
from weir.core.errors import Fault, WeirError

NO_LSN_CONSISTENT_POINT: Final = 1
"""The reads' LSN (the slot's consistent point) when the input gives none; the n-th change is at ``1 + n``."""

_FIELDS: Final = frozenset({"format", "op", "table", "before", "after", "lsn", "xid", "ts_ms"})


class CdcInputError(WeirError):
    """A CDC source's test input is not what the source could deliver (one line, naming the event)."""

    fault: Fault = Fault.USER


@dataclass(frozen=True)
class CdcTransaction:
    """One transaction as the source emits it: its changes, its position (the last change's lsn, what
    a checkpoint after it holds) and its commit time (the changes' record timestamp; None: none)."""

    changes: tuple[ChangeEvent, ...]
    commit_end: int
    commit_ms: int | None


@dataclass(frozen=True)
class CdcInput:
    """What a CDC source delivers in a test: the snapshot's reads at ``consistent_point``, then the
    transactions in commit order."""

    consistent_point: int
    reads: tuple[ChangeEvent, ...]
    transactions: tuple[CdcTransaction, ...]

    @classmethod
    def of(cls, events: Iterable[ChangeEvent], commit_ms: Sequence[int | None] | None = None) -> CdcInput:
        """The input from change events in the order the source emits them (reads, then changes whose
        consecutive equal xids form a transaction); ``commit_ms[i]``: event i's record timestamp (None:
        none). Raises CdcInputError when the events are not what a source could deliver."""
        given = list(events)
        stamps = list(commit_ms) if commit_ms is not None else [None] * len(given)
        if len(stamps) != len(given):
            raise CdcInputError(f"{len(given)} change events and {len(stamps)} commit times")
        for n, event in enumerate(given, 1):
            if not isinstance(event, ChangeEvent):
                raise CdcInputError(f"change event {n}: a CDC source's input is ChangeEvent values, not {event!r}")
            try:
                _check_rows(event)
            except CdcInputError as exc:
                raise CdcInputError(f"change event {n}: {exc}") from None
        reads = [e for e in given if e.op is ChangeOp.READ]
        first_change = next((n for n, e in enumerate(given) if e.op is not ChangeOp.READ), len(given))
        late = next((n for n, e in enumerate(given) if e.op is ChangeOp.READ and n > first_change), None)
        if late is not None:
            raise CdcInputError(f"change event {late + 1} is a read after a change: the snapshot's reads come first")
        consistent_point = reads[0].lsn if reads else NO_LSN_CONSISTENT_POINT
        for n, event in enumerate(reads, 1):
            if event.lsn != consistent_point or event.xid is not None:
                raise CdcInputError(
                    f"change event {n}: the snapshot's reads share one lsn (the consistent point, "
                    f"{format_lsn(consistent_point)}) and no xid; this one has lsn {format_lsn(event.lsn)}, "
                    f"xid {event.xid}"
                )
        transactions: list[CdcTransaction] = []
        pending: list[ChangeEvent] = []
        ended: set[int] = set()
        previous = consistent_point
        changes = list(zip(given[first_change:], stamps[first_change:], strict=True))
        for i, (event, stamp) in enumerate(changes):
            n = first_change + i + 1
            if event.xid is None:
                raise CdcInputError(f"change event {n}: a {event.op.value} has the xid of its transaction")
            if event.lsn <= previous:
                raise CdcInputError(
                    f"change event {n}: lsn {format_lsn(event.lsn)} is not after {format_lsn(previous)} "
                    "(each change's lsn is above the one before, and above the snapshot's consistent point)"
                )
            previous = event.lsn
            if event.xid in ended:
                raise CdcInputError(
                    f"change event {n}: transaction {event.xid} already ended: the source emits whole "
                    "transactions in commit order, each one's changes consecutive"
                )
            if pending and pending[0].xid == event.xid and stamp != stamps[first_change + i - 1]:
                raise CdcInputError(
                    f"change event {n}: ts_ms {stamp} differs from the rest of transaction {event.xid} "
                    "(a transaction has one commit time)"
                )
            if pending and pending[0].xid != event.xid:
                transactions.append(_transaction(pending, stamps[first_change + i - 1]))
                assert pending[0].xid is not None
                ended.add(pending[0].xid)
                pending = []
            pending.append(event)
        if pending:
            transactions.append(_transaction(pending, stamps[-1]))
        return cls(consistent_point, tuple(reads), tuple(transactions))

    @property
    def events(self) -> tuple[ChangeEvent, ...]:
        """Every event, as the source emits them from the start."""
        return self.reads + tuple(e for t in self.transactions for e in t.changes)

    def tables(self) -> frozenset[str]:
        return frozenset(e.table for e in self.events)


def _transaction(changes: Sequence[ChangeEvent], commit_ms: int | None) -> CdcTransaction:
    return CdcTransaction(tuple(changes), changes[-1].lsn, commit_ms)


def _check_rows(event: ChangeEvent) -> None:
    before, after = event.before is not None, event.after is not None
    match event.op:
        case ChangeOp.READ | ChangeOp.INSERT:
            ok = after and not before
            rule = "has an after row and no before row"
        case ChangeOp.UPDATE:
            ok = after
            rule = "has an after row"
        case ChangeOp.DELETE:
            ok = before and not after
            rule = "has a before row and no after row"
        case _:
            assert_never(event.op)
    if not ok:
        article = "an" if event.op.value[0] in "aeiou" else "a"
        raise CdcInputError(f"{article} {event.op.value} {rule}")


def qualified(table: str) -> str:
    """A table as the source names it: schema-qualified, ``public`` when no schema is given."""
    return table if "." in table else f"public.{table}"


def read_change_events(lines: Sequence[bytes], where: str) -> CdcInput:
    """The input from JSON lines, one change event each (see the module doc); ``where`` names the
    input in errors (``source 'cdc' (changes.jsonl)``)."""
    documents: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(lines, 1):
        try:
            document = json.loads(line)
        except ValueError as exc:
            raise CdcInputError(f"{where}, change event {n}: not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise CdcInputError(f"{where}, change event {n}: a change event is a JSON object, not {line[:80]!r}")
        documents.append((n, document))
    changes = [(n, d) for n, d in documents if d.get("op") != ChangeOp.READ.value]
    has_lsn = [n for n, d in documents if "lsn" in d]
    if has_lsn and len(has_lsn) != len(documents):
        missing = next(n for n, d in documents if "lsn" not in d)
        raise CdcInputError(f"{where}, change event {missing}: no lsn, where other events give one (all or none)")
    has_xid = [n for n, d in changes if "xid" in d]
    if has_xid and len(has_xid) != len(changes):
        missing = next(n for n, d in changes if "xid" not in d)
        raise CdcInputError(f"{where}, change event {missing}: no xid, where other changes give one (all or none)")
    events: list[ChangeEvent] = []
    stamps: list[int | None] = []
    change_number = 0
    for n, document in documents:
        try:
            event, stamp = _event(document, bool(has_lsn), bool(has_xid), change_number)
        except CdcInputError as exc:
            raise CdcInputError(f"{where}, change event {n}: {exc}") from None
        if event.op is not ChangeOp.READ:
            change_number += 1
        events.append(event)
        stamps.append(stamp)
    try:
        return CdcInput.of(events, stamps)
    except CdcInputError as exc:
        raise CdcInputError(f"{where}, {exc}") from None


def _event(
    document: Mapping[str, Any], has_lsn: bool, has_xid: bool, changes_before: int
) -> tuple[ChangeEvent, int | None]:
    unknown = sorted(set(document) - _FIELDS)
    if unknown:
        raise CdcInputError(f"unknown field {unknown[0]!r} (the fields: {', '.join(sorted(_FIELDS))})")
    if document.get("format", CHANGE_EVENT_FORMAT) != CHANGE_EVENT_FORMAT:
        raise CdcInputError(
            f"format {document['format']!r}: this Weir reads change events of format {CHANGE_EVENT_FORMAT}"
        )
    try:
        op = ChangeOp(str(document.get("op")))
    except ValueError:
        ops = ", ".join(o.value for o in ChangeOp)
        raise CdcInputError(f"op {document.get('op')!r} is none of {ops}") from None
    table = document.get("table")
    if not isinstance(table, str) or not table:
        raise CdcInputError(f"table {table!r} is not a table name")
    before, after = document.get("before"), document.get("after")
    for name, row in (("before", before), ("after", after)):
        if row is not None and not isinstance(row, dict):
            raise CdcInputError(f"{name} is a row (a JSON object of columns) or null, not {row!r}")
    read = op is ChangeOp.READ
    if has_lsn:
        text = document["lsn"]
        try:
            lsn = parse_lsn(text) if isinstance(text, str) else -1
        except ValueError:
            lsn = -1
        if lsn < 0:
            raise CdcInputError(f'lsn {text!r} is not an LSN such as "0/16B3748"')
    else:
        lsn = NO_LSN_CONSISTENT_POINT + (0 if read else changes_before + 1)
    xid: int | None = None
    if not read:
        xid = document["xid"] if has_xid else changes_before + 1
        if type(xid) is not int or xid < 0:
            raise CdcInputError(f"xid {xid!r} is not a transaction id (a non-negative integer)")
    elif document.get("xid") is not None:
        raise CdcInputError("a read has no xid")
    stamp = document.get("ts_ms")
    if stamp is not None and (read or type(stamp) is not int):
        raise CdcInputError(
            "a read carries no ts_ms" if read else f"ts_ms {stamp!r} is not a commit time (epoch ms, an integer)"
        )
    event = ChangeEvent(op, qualified(table), before, after, lsn, xid)
    _check_rows(event)
    return event, stamp


__all__ = ["CdcInput", "CdcInputError", "CdcTransaction", "qualified", "read_change_events"]
