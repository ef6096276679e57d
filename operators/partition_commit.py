"""Partition commit of the exactly-once file sink (Flink's filesystem connector's
``sink.partition-commit.*`` with the ``success-file`` policy): a ``_SUCCESS`` file written into a
partition (a bucket folder, ``dt=2026-12-04/hm=05%3A10``) once the partition is complete, as Flink's
trigger decides it:

- ``partition-time``: once the watermark passed the partition's time (read from its values, Flink's
  ``partition.time-extractor.timestamp-pattern``) plus the delay;
- ``process-time``: once the wall clock passed the time the partition was first written plus the delay.

Flink's writers report their partitions to one committer task. Weir's sink subtasks share the sink's
storage instead: after each completed checkpoint every subtask writes its :class:`CommitProgress` (a
small versioned JSON document, ``.weir-partition-commit/<uid>/<subtask>.json`` under the sink's path),
then reads every subtask's and decides with :func:`committable`. A partition is committed only when
every subtask has finished (made visible) its part files of the partition up to the latest checkpoint
that closed one, so the ``_SUCCESS`` file appears only after the checkpoint that commits the
partition's last part file. The last subtask to write its progress for a checkpoint sees all of
them, so each decision is taken by at least one subtask; writing ``_SUCCESS`` again is harmless (an
empty file, as Flink's, which may commit a partition again when late data arrives in it)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from weir.core.documents import load_versioned
from weir.core.errors import Fault, SerializationError, WeirError

PROGRESS_FORMAT: Final = 1
PROGRESS_FOLDER: Final = ".weir-partition-commit"
SUCCESS_FILE: Final = "_SUCCESS"

Trigger = Literal["process-time", "partition-time"]


class PartitionTimeError(WeirError):
    """A partition's values do not give a time by the table's timestamp pattern (the job's data or its
    DDL): the partition cannot be committed by partition time."""

    fault: Fault = Fault.USER


def unescape_path_name(text: str) -> str:
    """A folder name's partition value: each ``%XX`` back to its character (Flink's
    ``PartitionPathUtils.unescapePathName``)."""
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def partition_values(bucket: str) -> dict[str, str]:
    """``col=value/...`` as ``{col: value}`` (values unescaped)."""
    out: dict[str, str] = {}
    for part in bucket.split("/"):
        name, sep, value = part.partition("=")
        if sep:
            out[unescape_path_name(name)] = unescape_path_name(value)
    return out


_TIMESTAMP: Final = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})(?:[ T](\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,9}))?)?)?"
)


@dataclass(frozen=True)
class PartitionTimeExtractor:
    """Flink's default partition time extractor: ``pattern`` (``'$dt $hm:00'``) with each ``$column``
    replaced by the partition's value (no pattern: the first partition column's value), read as
    ``yyyy-MM-dd[ HH:mm[:ss[.S...]]]`` in UTC (``'sink.partition-commit.watermark-time-zone'`` is
    UTC, Flink's default)."""

    columns: tuple[str, ...]
    pattern: str | None = None

    def time_ms(self, bucket: str) -> int:
        values = partition_values(bucket)
        if self.pattern is None:
            text = values.get(self.columns[0], "") if self.columns else ""
        else:
            text = self.pattern
            for column in sorted(self.columns, key=len, reverse=True):  # $hm before $h
                text = text.replace("${" + column + "}", values.get(column, "")).replace(
                    "$" + column, values.get(column, "")
                )
        match = _TIMESTAMP.fullmatch(text.strip())
        if match is None:
            raise PartitionTimeError(
                f"partition {bucket}: its time {text!r} (by the pattern {self.pattern or '$' + self.columns[0]}) "
                "is not yyyy-MM-dd[ HH:mm:ss]: it cannot be committed by partition time"
            )
        year, month, day, hour, minute, second, fraction = match.groups()
        try:
            moment = dt.datetime(
                int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0), tzinfo=dt.UTC
            )
        except ValueError as exc:
            raise PartitionTimeError(f"partition {bucket}: its time {text!r} is not a date: {exc}") from None
        millis = int((fraction or "0")[:3].ljust(3, "0"))
        return int(moment.timestamp() * 1000) + millis


@dataclass(frozen=True)
class PartitionCommit:
    """When a partition is committed (``trigger``, ``delay_ms``; ``extractor`` for ``partition-time``)
    and the name of the file that says so (``success_file``)."""

    trigger: Trigger = "process-time"
    delay_ms: int = 0
    extractor: PartitionTimeExtractor | None = None
    success_file: str = SUCCESS_FILE

    def __post_init__(self) -> None:
        if self.trigger == "partition-time" and self.extractor is None:
            raise ValueError("a partition-time trigger needs a partition time extractor")
        if self.delay_ms < 0:
            raise ValueError(f"the partition commit delay is {self.delay_ms} ms: not negative")
        if not self.success_file or "/" in self.success_file:
            raise ValueError(f"the success file's name {self.success_file!r} is a file name")


@dataclass(frozen=True)
class PendingPartition:
    """A partition a subtask finished part files in and has not committed: when it first wrote it
    (wall clock ms) and the latest checkpoint whose part files in it it finished."""

    first_written_ms: int
    last_checkpoint: int


@dataclass(frozen=True)
class CommitProgress:
    """One sink subtask's progress after a completed checkpoint: its part files are finished up to
    ``checkpoint``, whose barrier it passed at ``watermark``; ``ended`` once its input ended (Flink
    commits every pending partition at the end of input); ``partitions`` those it has not committed."""

    job_id: str
    subtask: int
    parallelism: int
    checkpoint: int
    watermark: int
    ended: bool = False
    partitions: Mapping[str, PendingPartition] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": PROGRESS_FORMAT,
                "job_id": self.job_id,
                "subtask": self.subtask,
                "parallelism": self.parallelism,
                "checkpoint": self.checkpoint,
                "watermark": self.watermark,
                "ended": self.ended,
                "partitions": {
                    bucket: [p.first_written_ms, p.last_checkpoint] for bucket, p in sorted(self.partitions.items())
                },
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, what: str) -> CommitProgress:
        document = load_versioned(data, what, PROGRESS_FORMAT, "it was written by another Weir version")
        try:
            partitions: dict[str, Any] = document["partitions"]
            return cls(
                str(document["job_id"]),
                int(document["subtask"]),
                int(document["parallelism"]),
                int(document["checkpoint"]),
                int(document["watermark"]),
                bool(document["ended"]),
                {str(b): PendingPartition(int(p[0]), int(p[1])) for b, p in partitions.items()},
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SerializationError(f"{what} is not a partition commit progress document: {exc!r}") from exc


def progress_key(uid_folder: str, subtask: int) -> str:
    """Where a subtask's progress document is, relative to the sink's path."""
    return f"{PROGRESS_FOLDER}/{uid_folder}/{subtask}.json"


def committable(policy: PartitionCommit, progresses: Sequence[CommitProgress | None], now_ms: int) -> tuple[str, ...]:
    """The partitions to commit now, given every subtask's latest progress of this job (``None``: a
    subtask that has written none yet: nothing is committed before every subtask has). A partition
    any subtask lists is committed when every subtask has finished its part files up to the latest
    checkpoint that finished one in it (a subtask whose input ended has finished them all), and:
    every subtask's input ended, or by ``process-time`` the wall clock passed its first write plus
    the delay, or by ``partition-time`` the lowest of the subtasks' watermarks passed its time plus
    the delay (strictly, as Flink's)."""
    if not progresses or any(p is None for p in progresses):
        return ()
    known = [p for p in progresses if p is not None]
    # an ended subtask closes no more part files: it holds no partition back (it may have finished early)
    done_through = min((p.checkpoint for p in known if not p.ended), default=None)
    ended = all(p.ended for p in known)
    watermark = min(p.watermark for p in known)
    merged: dict[str, PendingPartition] = {}
    for progress in known:
        for bucket, pending in progress.partitions.items():
            seen = merged.get(bucket)
            merged[bucket] = (
                pending
                if seen is None
                else PendingPartition(
                    min(seen.first_written_ms, pending.first_written_ms),
                    max(seen.last_checkpoint, pending.last_checkpoint),
                )
            )
    out = []
    for bucket, pending in sorted(merged.items()):
        if done_through is not None and pending.last_checkpoint > done_through:
            continue  # a subtask may still be finishing part files of a checkpoint that closed one in it
        if ended:
            out.append(bucket)
        elif policy.trigger == "process-time":
            if now_ms > pending.first_written_ms + policy.delay_ms:
                out.append(bucket)
        else:
            assert policy.extractor is not None
            if watermark > policy.extractor.time_ms(bucket) + policy.delay_ms:
                out.append(bucket)
    return tuple(out)


__all__ = [
    "PROGRESS_FOLDER",
    "SUCCESS_FILE",
    "CommitProgress",
    "PartitionCommit",
    "PartitionTimeError",
    "PartitionTimeExtractor",
    "PendingPartition",
    "Trigger",
    "committable",
    "partition_values",
    "progress_key",
    "unescape_path_name",
]
