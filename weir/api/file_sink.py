"""The exactly-once file sink (Flink's ``FileSink``): part files on S3 or in a directory, finished
when a checkpoint covering them completes. ``stream.sink_to_files(path, format=..., uid=...)`` is
:class:`PartFileSink` with the same option names.

::

    events.sink_to_files("s3://lake/events", format="parquet", uid="events-files")
    events.sink_to(PartFileSink("/data/events", "jsonl", max_part_bytes=64 << 20), uid="events-files")

Part files go to ``<path>/<bucket>/part-<uid>-<job>-<subtask>-<epoch>-<n>.<ext>``; the bucket comes
from ``bucket_assigner(value, timestamp)``, by default the hour of the record's timestamp
(``dt=YYYY-MM-DD/hour=HH``). A reader sees a part file only once the checkpoint that closed it
completed. See docs/sinks.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from weir.api.connector import Duration, OperatorFactory, Options, Sink, WithOnError
from weir.core.descriptors import SinkDelivery, SinkSpec, SinkSystem
from weir.core.rejections import OnRecordError
from weir.core.windows import to_millis
from weir.operators.part_files import FileFormat, RollingPolicy, check_bucket
from weir.operators.partition_commit import PartitionCommit

if TYPE_CHECKING:
    from weir.operators.file_sink import PartFileSinkOperator

FileFormatName = Literal["parquet", "jsonl", "csv"]
OPTIONS = Options("file sink")
MIN_S3_PART_BYTES = 5 * 1024 * 1024  # S3's smallest part but the last (weir.connectors.files, not imported by a client)
DEFAULT_MAX_PART_BYTES = RollingPolicy().max_part_bytes
DEFAULT_ROLLOVER_INTERVAL_MS = RollingPolicy().rollover_interval_ms


@dataclass(frozen=True)
class PartFileSink(Sink):
    """Writes values into part files under ``path``: ``s3://bucket/prefix``, ``file:///dir`` or an
    absolute directory. ``format``: ``parquet`` (values are dicts; ``schema`` a ``pyarrow.Schema``,
    default: inferred from the first rows), ``jsonl`` (``serializer(value)`` bytes, default JSON) or
    ``csv`` (``serializer(value)`` bytes, the record's CSV line: required).
    A part file rolls at ``max_part_bytes``, after ``rollover_interval``, and at every checkpoint.
    ``partition_commit``: write a success file into each bucket once it is complete (Flink's
    filesystem connector's partition commit: docs/sinks.md)."""

    path: str
    format: FileFormatName = "parquet"
    bucket_assigner: Callable[[Any, int | None], str] | None = None
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES
    rollover_interval: Duration = DEFAULT_ROLLOVER_INTERVAL_MS
    serializer: Callable[[Any], bytes] | None = None
    schema: Any = None
    row_group_rows: int = 10_000
    s3_part_bytes: int = 8 * 1024 * 1024
    partition_commit: PartitionCommit | None = None

    def __post_init__(self) -> None:
        path = self.path
        if not isinstance(path, str) or not (
            (path.startswith("s3://") and len(path) > len("s3://") and not path.startswith("s3:///"))
            or path.startswith("file:///")
            or path.startswith("/")
        ):
            raise OPTIONS.refuse("path", "s3://bucket/prefix, file:///dir or an absolute directory", path)
        if self.format not in ("parquet", "jsonl", "csv"):
            raise OPTIONS.refuse("format", "'parquet', 'jsonl' or 'csv'", self.format)
        OPTIONS.function("bucket_assigner", self.bucket_assigner)
        OPTIONS.function("serializer", self.serializer)
        if self.serializer is not None and self.format == "parquet":
            raise OPTIONS.error("serializer applies to format='jsonl' or 'csv'; a Parquet sink writes dicts as rows")
        if self.serializer is None and self.format == "csv":
            raise OPTIONS.error("format='csv' needs a serializer (a record's CSV line, as bytes)")
        if self.schema is not None and self.format != "parquet":
            raise OPTIONS.error("schema applies to format='parquet' only")
        for option, value, least in (
            ("max_part_bytes", self.max_part_bytes, 1),
            ("row_group_rows", self.row_group_rows, 1),
            ("s3_part_bytes", self.s3_part_bytes, MIN_S3_PART_BYTES),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OPTIONS.refuse(option, f"an int of at least {least}", value)
        OPTIONS.millis("rollover_interval", self.rollover_interval, positive=True)
        if self.partition_commit is not None and not isinstance(self.partition_commit, PartitionCommit):
            raise OPTIONS.refuse(
                "partition_commit", "a weir.operators.partition_commit.PartitionCommit", self.partition_commit
            )

    def descriptor(self) -> SinkSpec:
        return SinkSpec(SinkSystem.FILES, self.path, SinkDelivery.EXACTLY_ONCE)

    def rolling(self) -> RollingPolicy:
        return RollingPolicy(self.max_part_bytes, to_millis(self.rollover_interval, "rollover_interval"))

    def operator(self) -> OperatorFactory:
        return WithOnError(self._create)

    def _create(self, on_error: OnRecordError) -> PartFileSinkOperator:
        # The operator runs in the TaskManager: imported there (it needs the S3 client).
        from weir.operators.file_sink import PartFileSinkOperator, default_bucket, json_line

        return PartFileSinkOperator(
            self.path,
            FileFormat(self.format),
            bucket_assigner=self.bucket_assigner or default_bucket,
            rolling=self.rolling(),
            serializer=self.serializer or json_line,
            schema=self.schema,
            row_group_rows=self.row_group_rows,
            s3_part_bytes=self.s3_part_bytes,
            on_error=on_error,
            partition_commit=self.partition_commit,
        )

    def default_name(self) -> str:
        return f"files:{self.path}"


def fixed_bucket(bucket: str) -> Callable[[Any, int | None], str]:
    """A bucket assigner putting every record into ``bucket`` ("" : the path itself)."""
    check_bucket(bucket)
    return _Fixed(bucket)


@dataclass(frozen=True)
class _Fixed:
    bucket: str

    def __call__(self, value: Any, timestamp: int | None) -> str:
        return self.bucket


__all__ = ["FileFormatName", "PartFileSink", "fixed_bucket"]
