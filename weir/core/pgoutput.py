"""The messages of PostgreSQL's ``pgoutput`` logical decoding plugin, protocol version 1, read from bytes.

The layout is PostgreSQL's "Logical Replication Message Formats" (the protocol chapter of its
manual): one message per decoded row of ``pg_logical_slot_get_binary_changes``, big-endian integers,
null-terminated strings, column values in their text form. Pure: the connector adapter turns the text
values into Python values by the column types (``weir.connectors.postgres_cdc``).

No well-kept Python library decodes pgoutput (the PyPI packages for it are unmaintained single
releases or bind psycopg2), and protocol version 1 is small: Begin, Commit, Relation, Insert,
Update, Delete, plus Origin, Type and Truncate, which the source reads past.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from weir.core.errors import SerializationError


class Unchanged:
    """An unchanged TOASTed value of an update (pgoutput's ``u``): the message does not carry it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged()

TupleValue = str | None | Unchanged
"""A column of a tuple: its text, NULL, or an unchanged TOASTed value."""


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    key: bool  # part of the replica identity


@dataclass(frozen=True)
class Relation:
    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # the commit record's LSN
    commit_ts_us: int  # microseconds since 2000-01-01
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # the end of the commit record: the position after this transaction
    commit_ts_us: int


@dataclass(frozen=True)
class Insert:
    relation_id: int
    new: tuple[TupleValue, ...]


@dataclass(frozen=True)
class Update:
    relation_id: int
    old: tuple[TupleValue, ...] | None  # the key columns ('K') or the whole old row ('O'); None: not sent
    old_is_key: bool
    new: tuple[TupleValue, ...]


@dataclass(frozen=True)
class Delete:
    relation_id: int
    old: tuple[TupleValue, ...]
    old_is_key: bool


@dataclass(frozen=True)
class LogicalMessage:
    """A message written with ``pg_logical_emit_message`` (decoded with the ``messages`` option):
    the parallel snapshot's readers announce their partitions this way (``weir.core.cdc``)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Skipped:
    """A message the source has no use for (Origin, Type, Truncate), by its tag."""

    tag: str


Message = Begin | Commit | Relation | Insert | Update | Delete | LogicalMessage | Skipped


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise SerializationError(f"pgoutput message ends early: {size} bytes wanted at {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def byte(self) -> str:
        return chr(self.take(">B"))

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise SerializationError("pgoutput message has an unterminated string")
        text = self.data[self.pos : end].decode()
        self.pos = end + 1
        return text

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise SerializationError(f"pgoutput message ends early: {n} bytes of a value wanted at {self.pos}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def tuple_data(self) -> tuple[TupleValue, ...]:
        values: list[TupleValue] = []
        for _ in range(self.take(">h")):
            kind = self.byte()
            match kind:
                case "n":
                    values.append(None)
                case "u":
                    values.append(UNCHANGED)
                case "t":
                    values.append(self.raw(self.take(">i")).decode())
                case _:
                    raise SerializationError(f"pgoutput tuple has a column of kind {kind!r} (text only in version 1)")
        return tuple(values)


def decode_message(data: bytes) -> Message:
    """One pgoutput message. Raises SerializationError for a truncated or unknown message."""
    reader = _Reader(bytes(data))
    tag = reader.byte()
    match tag:
        case "B":
            return Begin(final_lsn=reader.take(">Q"), commit_ts_us=reader.take(">q"), xid=reader.take(">I"))
        case "C":
            reader.take(">B")  # flags, unused
            return Commit(commit_lsn=reader.take(">Q"), end_lsn=reader.take(">Q"), commit_ts_us=reader.take(">q"))
        case "R":
            relation_id = reader.take(">I")
            namespace, name = reader.string(), reader.string()
            identity = reader.byte()
            columns = []
            for _ in range(reader.take(">h")):
                flags = reader.take(">B")
                column_name = reader.string()
                type_oid = reader.take(">I")
                reader.take(">i")  # atttypmod
                columns.append(Column(column_name, type_oid, key=bool(flags & 1)))
            return Relation(relation_id, namespace or "pg_catalog", name, identity, tuple(columns))
        case "I":
            relation_id = reader.take(">I")
            _expect(reader, "N", tag)
            return Insert(relation_id, reader.tuple_data())
        case "U":
            relation_id = reader.take(">I")
            kind = reader.byte()
            old: tuple[TupleValue, ...] | None = None
            old_is_key = False
            if kind in ("K", "O"):
                old, old_is_key = reader.tuple_data(), kind == "K"
                kind = reader.byte()
            if kind != "N":
                raise SerializationError(f"pgoutput update has {kind!r} where its new tuple ('N') belongs")
            return Update(relation_id, old, old_is_key, reader.tuple_data())
        case "D":
            relation_id = reader.take(">I")
            kind = reader.byte()
            if kind not in ("K", "O"):
                raise SerializationError(f"pgoutput delete has {kind!r} where its old tuple ('K' or 'O') belongs")
            return Delete(relation_id, reader.tuple_data(), old_is_key=kind == "K")
        case "M":
            transactional = bool(reader.take(">B") & 1)
            lsn = reader.take(">Q")
            prefix = reader.string()
            return LogicalMessage(transactional, lsn, prefix, reader.raw(reader.take(">i")))
        case "O" | "Y" | "T":
            return Skipped(tag)
        case _:
            raise SerializationError(f"pgoutput message of unknown type {tag!r} (protocol version 1 expected)")


def _expect(reader: _Reader, wanted: str, tag: str) -> None:
    found = reader.byte()
    if found != wanted:
        raise SerializationError(f"pgoutput message {tag!r} has {found!r} where {wanted!r} belongs")


__all__ = [
    "UNCHANGED",
    "Begin",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Relation",
    "Skipped",
    "TupleValue",
    "Unchanged",
    "Update",
    "decode_message",
]
