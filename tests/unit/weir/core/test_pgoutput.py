"""The pgoutput decoder on messages built byte by byte as PostgreSQL's manual lays them out."""

from __future__ import annotations

import struct

import pytest

from weir.core.errors import SerializationError
from weir.core.pgoutput import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    Skipped,
    TupleValue,
    Update,
    decode_message,
)


def string(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_data(*values: TupleValue) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            assert isinstance(value, str)
            raw = value.encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def test_begin_and_commit() -> None:
    assert decode_message(b"B" + struct.pack(">QqI", 0x1000, 123456, 768)) == Begin(0x1000, 123456, 768)
    assert decode_message(b"C" + struct.pack(">BQQq", 0, 0x1000, 0x1030, 123456)) == Commit(0x1000, 0x1030, 123456)


def test_relation() -> None:
    columns = (
        struct.pack(">B", 1) + string("id") + struct.pack(">Ii", 23, -1),
        struct.pack(">B", 0) + string("name") + struct.pack(">Ii", 25, -1),
    )
    data = b"R" + struct.pack(">I", 16384) + string("public") + string("orders") + b"d" + struct.pack(">h", 2)
    assert decode_message(data + b"".join(columns)) == Relation(
        16384, "public", "orders", "d", (Column("id", 23, key=True), Column("name", 25, key=False))
    )


def test_a_relation_in_pg_catalog_has_an_empty_namespace() -> None:
    data = b"R" + struct.pack(">I", 1) + string("") + string("t") + b"f" + struct.pack(">h", 0)
    assert decode_message(data).qualified_name == "pg_catalog.t"  # type: ignore[union-attr]


def test_insert_with_null_and_text_values() -> None:
    data = b"I" + struct.pack(">I", 7) + b"N" + tuple_data("1", None, "héllo")
    assert decode_message(data) == Insert(7, ("1", None, "héllo"))


def test_update_without_old_tuple_with_key_and_with_full_old_row() -> None:
    new = tuple_data("1", UNCHANGED)
    assert decode_message(b"U" + struct.pack(">I", 7) + b"N" + new) == Update(7, None, False, ("1", UNCHANGED))
    key = tuple_data("0", None)
    assert decode_message(b"U" + struct.pack(">I", 7) + b"K" + key + b"N" + new) == Update(
        7, ("0", None), True, ("1", UNCHANGED)
    )
    old = tuple_data("0", "x")
    assert decode_message(b"U" + struct.pack(">I", 7) + b"O" + old + b"N" + new) == Update(
        7, ("0", "x"), False, ("1", UNCHANGED)
    )


def test_delete_by_key_and_by_full_row() -> None:
    assert decode_message(b"D" + struct.pack(">I", 7) + b"K" + tuple_data("3", None)) == Delete(7, ("3", None), True)
    assert decode_message(b"D" + struct.pack(">I", 7) + b"O" + tuple_data("3", "c")) == Delete(7, ("3", "c"), False)


@pytest.mark.parametrize("tag", [b"O", b"Y", b"T"])
def test_messages_the_source_does_not_use_are_skipped(tag: bytes) -> None:
    assert decode_message(tag + b"\0\0\0\0") == Skipped(tag.decode())


@pytest.mark.parametrize("flags", [0, 1])
def test_a_logical_message_carries_its_prefix_and_content(flags: int) -> None:
    data = b"M" + struct.pack(">BQ", flags, 0x1_0000_0A00) + b"weir-cdc\0" + struct.pack(">i", 3) + b"{\x00}"
    assert decode_message(data) == LogicalMessage(bool(flags), 0x1_0000_0A00, "weir-cdc", b"{\x00}")
    with pytest.raises(SerializationError, match="ends early"):
        decode_message(data[:-1])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"Z",
        b"B\0\0",
        b"I" + struct.pack(">I", 7) + b"X" + tuple_data("1"),
        b"U" + struct.pack(">I", 7) + b"Q",
        b"D" + struct.pack(">I", 7) + b"N" + tuple_data("1"),
        b"I" + struct.pack(">I", 7) + b"N" + struct.pack(">h", 1) + b"b",
        b"I" + struct.pack(">I", 7) + b"N" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 10) + b"abc",
        b"R" + struct.pack(">I", 1) + b"public",
    ],
)
def test_a_truncated_or_unknown_message_is_a_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError):
        decode_message(data)
