"""The exactly-once file sink's decisions, pure: part file names, rolling, buckets, the committables
kept in a checkpoint and what recovery does with each part file it finds. No I/O.

Follows Flink's ``FileSink`` (``flink-connector-files``): a part file is *in progress* while records
go into it, *pending* once it is closed (rolled by size or time, or at a checkpoint's barrier) and
*finished* when a checkpoint covering it completes. Its committable (Flink's
``FileSinkCommittable``: for S3 the multipart upload's key, upload id and part ETags, for a
directory the hidden file and its final name) is in the sink's state of every checkpoint until it is
committed, so a restore can finish it. Readers only ever see finished files: an S3 multipart upload
is invisible until completed, and a directory's in-progress file is hidden (a leading dot) until its
rename.

Part file names are deterministic, ``part-<uid>-<job>-<subtask>-<epoch>-<n>.<ext>`` (the epoch is the
sink transaction of :mod:`weir.operators.twophase` the file belongs to, ``n`` counts the files of that
epoch), so a retried commit completes or renames the same object, and recovery can tell a part
file's sink subtask and epoch from its name alone. The job id keeps two jobs with the same sink uid
writing to the same path apart, as Flink's per-run unique id does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Final, assert_never
from urllib.parse import quote, unquote

from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.operators.twophase import LedgerSnapshot, TransactionId

SNAPSHOT_FORMAT: Final = 1
IN_PROGRESS_SUFFIX: Final = ".inprogress"
PART_PREFIX: Final = "part-"

_NAME = re.compile(
    r"part-(?P<uid>[^/-]+)-(?P<job>[^/-]+)-(?P<subtask>0|[1-9][0-9]*)-(?P<epoch>0|[1-9][0-9]*)"
    r"-(?P<n>0|[1-9][0-9]*)\.(?P<ext>[a-z0-9]+)"
)
_HIDDEN = re.compile(r"\.(?P<base>.+)\.(?P<attempt>0|[1-9][0-9]*)" + re.escape(IN_PROGRESS_SUFFIX))
_BUCKET_SEGMENT = re.compile(r"[^/]+")


class FileFormat(Enum):
    """How records are written into a part file."""

    JSONL = "jsonl"  # one JSON document per line (a row format: Flink's forRowFormat)
    CSV = "csv"  # one CSV line per record, by the sink's serializer (a row format, as JSONL)
    PARQUET = "parquet"  # Apache Parquet (a bulk format: Flink's forBulkFormat, rolled at every checkpoint)

    @property
    def extension(self) -> str:
        return self.value


@dataclass(frozen=True, order=True)
class PartFileName:
    """One part file of one sink subtask: its bucket (a relative folder, "" for the root), the epoch
    (sink transaction) it belongs to and its number within the epoch."""

    task: TaskId
    bucket: str
    epoch: CheckpointId
    number: int
    file_format: FileFormat

    def __post_init__(self) -> None:
        check_bucket(self.bucket)
        if self.epoch < 0 or self.number < 0 or self.task.subtask < 0:
            raise ValueError(f"part file {self!r}: epoch, number and subtask must not be negative")

    @property
    def basename(self) -> str:
        uid, job = _name_part(self.task.operator_uid), _name_part(self.task.job_id)
        return f"{PART_PREFIX}{uid}-{job}-{self.task.subtask}-{self.epoch}-{self.number}.{self.file_format.extension}"

    @property
    def key(self) -> str:
        """The finished file's path relative to the sink's root."""
        return f"{self.bucket}/{self.basename}" if self.bucket else self.basename

    def in_progress_key(self, attempt: int) -> str:
        """Where a directory keeps it until its commit: hidden beside its final name, and named by
        the job attempt writing it, so that a cancelled attempt still running (a zombie) never writes
        into, or deletes, the file of the attempt that replaced it."""
        hidden = f".{self.basename}.{attempt}{IN_PROGRESS_SUFFIX}"
        return f"{self.bucket}/{hidden}" if self.bucket else hidden

    @property
    def txn(self) -> TransactionId:
        return TransactionId.for_task(self.task, self.epoch)

    @classmethod
    def parse(cls, key: str) -> PartFileName | None:
        """The finished part file at ``key`` (relative to the sink's root; also an S3 upload's key);
        None for any other file (a reader's ``_SUCCESS``, another tool's files, a malformed name)."""
        bucket, _, base = key.rpartition("/")
        return cls._parse(bucket, base)

    @classmethod
    def parse_in_progress(cls, key: str) -> tuple[PartFileName, int] | None:
        """The part file a directory's hidden ``key`` holds, and the attempt writing it; None for any other."""
        bucket, _, base = key.rpartition("/")
        match = _HIDDEN.fullmatch(base)
        if match is None:
            return None
        name = cls._parse(bucket, match["base"])
        if name is None or name.in_progress_key(int(match["attempt"])) != key:
            return None
        return name, int(match["attempt"])

    @classmethod
    def _parse(cls, bucket: str, base: str) -> PartFileName | None:
        match = _NAME.fullmatch(base)
        if match is None:
            return None
        try:
            file_format = FileFormat(match["ext"])
            task = TaskId(
                JobId(unquote(match["job"])), OperatorUid(unquote(match["uid"])), SubtaskIndex(int(match["subtask"]))
            )
            name = cls(task, bucket, CheckpointId(int(match["epoch"])), int(match["n"]), file_format)
        except ValueError:
            return None
        return name if name.basename == base else None


def _name_part(text: str) -> str:
    """``text`` percent-encoded down to letters, digits, ``_`` and ``.``: no ``-`` (the name's
    separator), ``/`` or ``~``, so any uid and job id read back unambiguously."""
    return quote(text, safe="_.").replace("-", "%2D").replace("~", "%7E")


def check_bucket(bucket: str) -> str:
    """A bucket is a relative folder: segments without ``.``/``..``, no leading or doubled slash."""
    if bucket and not all(
        _BUCKET_SEGMENT.fullmatch(segment) and segment not in (".", "..") and not segment.startswith(".")
        for segment in bucket.split("/")
    ):
        raise ValueError(
            f"bucket {bucket!r} is not a relative folder: segments separated by single '/', none empty, "
            "none starting with '.' (hidden names are the sink's in-progress files)"
        )
    return bucket


def hourly_bucket(timestamp_ms: int) -> str:
    """The default bucket, by the hour of the record's timestamp in UTC (Flink's DateTimeBucketAssigner,
    Hive-style): ``dt=YYYY-MM-DD/hour=HH``."""
    at = datetime.fromtimestamp(timestamp_ms / 1000.0, tz=UTC)
    return f"dt={at:%Y-%m-%d}/hour={at:%H}"


# Rolling --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RollingPolicy:
    """When an in-progress part file is closed and a new one started (Flink's DefaultRollingPolicy;
    every part file is also closed at each checkpoint's barrier, Flink's OnCheckpointRollingPolicy,
    which a bulk format such as Parquet needs: a Parquet file cannot be resumed)."""

    max_part_bytes: int = 128 * 1024 * 1024
    rollover_interval_ms: int = 15 * 60 * 1000

    def __post_init__(self) -> None:
        if self.max_part_bytes < 1 or self.rollover_interval_ms < 1:
            raise ValueError(f"rolling policy {self!r}: max_part_bytes and rollover_interval_ms must be at least 1")

    def should_roll(self, written_bytes: int, opened_at_ms: int, now_ms: int) -> bool:
        """Close a part file of ``written_bytes`` opened at ``opened_at_ms`` now?"""
        return written_bytes >= self.max_part_bytes or now_ms - opened_at_ms >= self.rollover_interval_ms

    def roll_due_at(self, opened_at_ms: int) -> int:
        """When a part file opened at ``opened_at_ms`` rolls by time."""
        return opened_at_ms + self.rollover_interval_ms


# Committables and the snapshot --------------------------------------------------------------------


@dataclass(frozen=True)
class UploadedPart:
    """One part of an S3 multipart upload."""

    number: int
    etag: str


@dataclass(frozen=True)
class PendingPartFile:
    """A closed part file waiting for its commit (Flink's committable): an S3 multipart upload
    (``upload_id`` and its ``parts``) or a directory's hidden file (``attempt``: the job attempt
    that wrote it, part of its name)."""

    name: PartFileName
    upload_id: str | None = None
    parts: tuple[UploadedPart, ...] = ()
    size: int = 0
    records: int = 0
    attempt: int | None = None

    def __post_init__(self) -> None:
        if (self.upload_id is None) == (self.attempt is None):
            raise ValueError(f"part file {self.name.key}: either an S3 upload id or a directory's attempt")

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.name.key,
            "upload_id": self.upload_id,
            "attempt": self.attempt,
            "parts": [[part.number, part.etag] for part in self.parts],
            "size": self.size,
            "records": self.records,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, object]) -> PendingPartFile:
        key = str(document["key"])
        name = PartFileName.parse(key)
        if name is None:
            raise SerializationError(f"file sink snapshot: {key!r} is not a part file name")
        upload_id, attempt = document["upload_id"], document["attempt"]
        parts = document["parts"]
        assert isinstance(parts, list)
        return cls(
            name,
            None if upload_id is None else str(upload_id),
            tuple(UploadedPart(int(number), str(etag)) for number, etag in parts),
            int(str(document["size"])),
            int(str(document["records"])),
            None if attempt is None else int(str(attempt)),
        )


@dataclass(frozen=True)
class FileSinkSnapshot:
    """The file sink subtask's state in checkpoint N: its ledger (which epochs are pending) and the
    closed part files of each pending epoch. Versioned JSON (docs/formats.md), never a pickle."""

    ledger: LedgerSnapshot
    files: Mapping[CheckpointId, tuple[PendingPartFile, ...]]  # by epoch

    def __post_init__(self) -> None:
        pending = {entry.txn.checkpoint_id for entry in self.ledger.pending}
        if set(self.files) != pending:
            raise ValueError(
                f"file sink snapshot of {self.ledger.task} at checkpoint {self.ledger.checkpoint_id}: part files "
                f"listed for epochs {sorted(self.files)}, the ledger has {sorted(pending)} pending"
            )
        for epoch, files in self.files.items():
            for pending_file in files:
                if pending_file.name.txn != TransactionId.for_task(self.ledger.task, epoch):
                    raise ValueError(f"file sink snapshot: part file {pending_file.name.key} is not of epoch {epoch}")

    def to_bytes(self) -> bytes:
        document = {
            "format": SNAPSHOT_FORMAT,
            "ledger": json.loads(self.ledger.to_bytes()),
            "files": [[int(epoch), [f.to_json() for f in files]] for epoch, files in sorted(self.files.items())],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> FileSinkSnapshot:
        try:
            document = json.loads(data)
        except ValueError as exc:
            raise SerializationError(f"file sink snapshot is not JSON: {exc}") from exc
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        if found != SNAPSHOT_FORMAT:
            raise SerializationError(f"file sink snapshot has format {found!r}, this version reads {SNAPSHOT_FORMAT}")
        ledger = LedgerSnapshot.from_bytes(json.dumps(document["ledger"]).encode())
        files = {
            CheckpointId(int(epoch)): tuple(PendingPartFile.from_json(f) for f in listed)
            for epoch, listed in document["files"]
        }
        return cls(ledger, files)


# Recovery -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FoundInProgress:
    """A part file recovery found unfinished: an S3 multipart upload not completed or aborted (with
    its upload id), or a directory's hidden in-progress file (with the attempt that wrote it)."""

    name: PartFileName
    upload_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class FinishPart:
    """Listed by the restored checkpoint and still unfinished: complete the upload, or rename the file."""

    pending: PendingPartFile


@dataclass(frozen=True)
class AlreadyFinished:
    """Listed by the restored checkpoint and found finished: committed before the failure."""

    pending: PendingPartFile


@dataclass(frozen=True)
class DiscardPart:
    """Unfinished and not listed by the restored checkpoint (or another upload of a listed name):
    abort the upload, or delete the hidden file. Readers never saw it."""

    found: FoundInProgress


@dataclass(frozen=True)
class PartLost:
    """Listed by the restored checkpoint, but neither unfinished nor finished: removed outside the job."""

    pending: PendingPartFile


RecoveryAction = FinishPart | AlreadyFinished | DiscardPart | PartLost


def plan_part_recovery(
    task: TaskId,
    snapshot: FileSinkSnapshot | None,
    in_progress: Iterable[FoundInProgress],
    finished: frozenset[str],
) -> tuple[RecoveryAction, ...]:
    """What a file sink subtask restoring ``snapshot`` (None: no completed checkpoint) does with each
    part file: finish the committables the snapshot lists (its checkpoint completed, so they belong to
    the output; finishing one twice is harmless), discard every other unfinished part file of the
    subtask. ``in_progress``: the subtask's unfinished part files found; ``finished``: the keys of
    listed part files that exist finished. Discards come first: epochs after the snapshot are reused."""
    found = tuple(in_progress)
    for item in found:
        if item.name.task != task:
            raise ValueError(f"recovery of {task}: part file {item.name.key} belongs to another subtask")
    listed: dict[str, PendingPartFile] = {}
    if snapshot is not None:
        if snapshot.ledger.task != task:
            raise ValueError(f"recovery of {task}: the snapshot is of {snapshot.ledger.task}")
        for files in snapshot.files.values():
            for pending in files:
                listed[pending.name.key] = pending
    actions: list[RecoveryAction] = []
    unfinished: set[str] = set()
    for item in sorted(found, key=lambda f: (f.name, f.upload_id or "", f.attempt or 0)):
        listed_as = listed.get(item.name.key)
        same = listed_as is not None and (listed_as.upload_id, listed_as.attempt) == (item.upload_id, item.attempt)
        if same and item.name.key not in unfinished:
            unfinished.add(item.name.key)
        else:
            actions.append(DiscardPart(item))
    for key, pending in sorted(listed.items(), key=lambda kv: kv[0]):
        if key in unfinished:
            actions.append(FinishPart(pending))
        elif key in finished:
            actions.append(AlreadyFinished(pending))
        else:
            actions.append(PartLost(pending))
    return tuple(actions)


def describe(action: RecoveryAction) -> str:
    """One line per action, for the recovery's log event."""
    match action:
        case FinishPart(pending):
            return f"finish {pending.name.key}"
        case AlreadyFinished(pending):
            return f"already finished {pending.name.key}"
        case DiscardPart(found):
            staged = f"upload {found.upload_id}" if found.upload_id is not None else f"attempt {found.attempt}"
            return f"discard {found.name.key} ({staged})"
        case PartLost(pending):
            return f"lost {pending.name.key}"
        case _:
            assert_never(action)
