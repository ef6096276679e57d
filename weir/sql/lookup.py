"""A processing-time lookup join's side input (Flink's lookup join, ``JOIN t FOR SYSTEM_TIME AS OF
p.proc_time``): a ``'filesystem'`` table's CSV file read whole, its rows indexed by the join's key
columns. ``side_rows`` is the pure part (the file's text to typed rows, a malformed line refused with
its file, line and column); ``LookupRows`` is the operator's function: each subtask reads the file at
its first lookup (as Flink's file lookup function loads its cache when it opens) and joins each input
row with the rows of its key, holding no state (a restore reads the file again). A static file gives
the same output in any run; a file changed while the job runs is not read again."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from weir.sql.catalog import FilesystemTable, Table
from weir.sql.types import Kind, coerce

Row = Mapping[str, Any]


class SideInputError(ValueError):
    """A side input file that cannot be read or a line that does not decode: one line naming it."""


def side_rows(text: str, table: Table, source: str) -> list[dict[str, Any]]:
    """The rows of a CSV text (Flink's csv format: comma-separated, ``"``-quoted fields) as
    ``table``'s columns, in order: each field converted to its column's type (an empty field is NULL,
    but for a STRING column the empty string); a line with another number of fields, or a field that
    does not convert, raises ``SideInputError`` naming ``source``, the line and the column."""
    columns = table.columns
    rows: list[dict[str, Any]] = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue  # a blank line
            if len(fields) != len(columns):
                raise SideInputError(
                    f"{source} line {line}: {len(fields)} fields, table {table.name} has {len(columns)} columns"
                )
            row: dict[str, Any] = {}
            for column, field in zip(columns, fields, strict=True):
                if field == "" and column.type.kind is not Kind.STRING:
                    row[column.name] = None
                    continue
                try:
                    row[column.name] = coerce(field, column.type.kind)
                except ValueError as e:
                    raise SideInputError(f"{source} line {line}: column {column.name}: {e}") from None
            rows.append(row)
    except csv.Error as e:
        raise SideInputError(f"{source} line {reader.line_num}: {e}") from None
    return rows


def index_rows(rows: Sequence[Row], columns: Sequence[str]) -> dict[tuple[Any, ...], list[Row]]:
    """Rows by the values of ``columns``; a row with a NULL among them is left out (``=`` never
    matches NULL)."""
    index: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        key = tuple(row[c] for c in columns)
        if None not in key:
            index.setdefault(key, []).append(row)
    return index


def read_side_input(table: Table) -> list[dict[str, Any]]:
    connector = table.connector
    assert isinstance(connector, FilesystemTable)
    try:
        text = Path(connector.path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SideInputError(f"table {table.name}: cannot read {connector.path}: {e}") from None
    return side_rows(text, table, connector.path)


class LookupRows:
    """The lookup join's function: ``joined(left, right)`` of each input row and each side row whose
    ``columns`` equal the row's ``keys`` (none when a key value is NULL). The index is built at the
    first call and not pickled (each subtask reads the file itself)."""

    def __init__(
        self,
        table: Table,
        keys: Sequence[Callable[[Row], Any]],
        columns: Sequence[str],
        joined: Callable[[Row, Row], dict[str, Any]],
    ) -> None:
        self.table, self.keys, self.columns, self.joined = table, tuple(keys), tuple(columns), joined
        self._index: dict[tuple[Any, ...], list[Row]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_index": None}

    def __call__(self, row: Row) -> list[dict[str, Any]]:
        if self._index is None:
            self._index = index_rows(read_side_input(self.table), self.columns)
        key = tuple(f(row) for f in self.keys)
        return [self.joined(row, side) for side in self._index.get(key, ())]


__all__ = ["LookupRows", "SideInputError", "index_rows", "read_side_input", "side_rows"]
