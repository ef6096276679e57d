"""A ``'filesystem'`` sink table's rows as the job API's part files (``sink_to_files``, exactly once):
each row's partition folder (``PARTITIONED BY (dt, hm)``: ``dt=2023-11-14/hm=22%3A13``, each value
escaped as Flink's ``PartitionPathUtils.escapePathName`` escapes it, NULL or empty as Flink's
default partition name) and its CSV line of the other columns (Flink's csv format as it writes:
strings, timestamps as ``yyyy-MM-dd HH:mm:ss.SSS``, double-quoted, a quote doubled; numbers and
booleans bare; NULL an empty field). Pure functions of the row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from weir.operators.partition_commit import PartitionCommit, PartitionTimeExtractor, Trigger
from weir.sql.catalog import FilesystemTable, Table
from weir.sql.types import Kind, to_json

DEFAULT_PARTITION: Final = "__DEFAULT_PARTITION__"
"""Flink's ``partition.default-name``: the folder of a NULL or empty partition value."""

_ESCAPED: Final = frozenset(
    [chr(c) for c in range(0x01, 0x20)]
    + ['"', "#", "%", "'", "*", "/", ":", "=", "?", "\\", "\x7f", "{", "[", "]", "^"]
)


def escape_path_name(value: str) -> str:
    """A partition value as a folder name: each character Flink escapes as ``%XX`` (upper-case hex)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


class PartitionFolder:
    """The bucket assigner of a partitioned table: ``col=value/...`` of its PARTITIONED BY columns
    (the root of the path when it has none)."""

    def __init__(self, table: Table) -> None:
        self.columns = table.partition_by
        self.kinds = {c.name: c.type.kind for c in table.columns}

    def __call__(self, row: Mapping[str, Any], timestamp: int | None) -> str:
        parts = []
        for column in self.columns:
            value = to_json(row[column], self.kinds[column])
            text = DEFAULT_PARTITION if value is None or value == "" else escape_path_name(str(value))
            parts.append(f"{column}={text}")
        return "/".join(parts)


class CsvLine:
    """A row's CSV line (bytes, ending in a newline) of the table's columns but its partition ones, in
    order."""

    def __init__(self, table: Table) -> None:
        self.columns = tuple((c.name, c.type.kind) for c in table.columns if c.name not in table.partition_by)

    def __call__(self, row: Mapping[str, Any]) -> bytes:
        return (",".join(_field(to_json(row[name], kind), kind) for name, kind in self.columns) + "\n").encode()


def _field(value: Any, kind: Kind) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind in (Kind.STRING, Kind.TIMESTAMP) or isinstance(value, str):
        return '"' + str(value).replace('"', '""') + '"'
    return str(value)


def partition_commit(table: Table) -> PartitionCommit | None:
    """The file sink's partition commit of a ``'filesystem'`` table with ``'sink.partition-commit.policy.kind'
    = 'success-file'`` and PARTITIONED BY (a table without partitions commits none, as Flink's)."""
    connector = table.connector
    assert isinstance(connector, FilesystemTable)
    options = connector.partition_commit
    if options is None or not table.partition_by:
        return None
    extractor = PartitionTimeExtractor(table.partition_by, options.timestamp_pattern)
    trigger: Trigger = "partition-time" if options.trigger == "partition-time" else "process-time"
    return PartitionCommit(trigger, options.delay_ms, extractor, options.success_file)


__all__ = ["DEFAULT_PARTITION", "CsvLine", "PartitionFolder", "escape_path_name", "partition_commit"]
