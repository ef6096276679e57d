"""A transactional Kafka sink's pending output, in bounded memory: records past the bound go to disk.

The sink must keep every record of an epoch until that epoch commits, since recovery re-produces an
uncommitted epoch from the snapshot. An :class:`EpochSpill` holds the records of a sink subtask's
epochs in memory up to ``memory_bytes`` for all its epochs together; the epoch whose next record
would pass the bound moves to one append-only file of its own and takes its later records there.

On disk, a spill is a directory of one sink instance, ``{root}/{digest}.{pid}.{token}`` (``digest``
names the sink subtask, ``token`` is random), holding ``epoch-{epoch:020d}.records`` files: the
header :data:`SPILL_FILE_MAGIC`, then length-prefixed records (:data:`FRAME`, key, value; a
tombstone's flags say it has no value, its value length 0). A file is
read only by the instance that wrote it, and only up to the records it counted, so a file left by a
crash is never read: a later instance makes its own directory, and removes those of instances whose
process has exited when it opens (``remove_abandoned``). A committed epoch's file is removed at once;
a closed sink removes its directory.

:func:`dumps_streaming` pickles a document whose epochs are wrapped in :class:`StreamedList`: the
records are read from memory or disk while the bytes are written, never gathered into one list.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import pickle
import secrets
import shutil
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.ids import CheckpointId, TaskId
from weir.core.serde import VALUE_PICKLE_PROTOCOL

Record = tuple[bytes | None, bytes | None, int | None]
"""A Kafka record as the sink keeps it: ``(key, value, event timestamp ms)``; a None value is a tombstone."""

DEFAULT_EPOCH_MEMORY_BYTES: Final = 64 * 1024 * 1024
RECORD_OVERHEAD_BYTES: Final = 160  # CPython's tuple, two bytes objects and an int around a record's payload
SPILL_FILE_MAGIC: Final = b"WEIRSPL1"
FRAME: Final = struct.Struct(">BIIq")  # flags, key length, value length, timestamp
_HAS_KEY: Final = 1
_HAS_TIMESTAMP: Final = 2
_TOMBSTONE: Final = 4  # no value (not an empty one): a null-value record
_IO_BUFFER_BYTES: Final = 256 * 1024


class EpochSpillError(WeirError):
    """An epoch's spill file could not be written or read back (disk full, directory not writable,
    file changed under the sink): the task fails and recovery re-produces the epoch from the snapshot."""

    fault: Fault = Fault.EXTERNAL


def record_memory_bytes(record: Record) -> int:
    """What holding ``record`` in memory costs, roughly: its payload and CPython's objects around it."""
    key, value, _timestamp = record
    return RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0) + (len(key) if key is not None else 0)


def encode_frame(record: Record) -> bytes:
    key, value, timestamp = record
    flags = (
        (_HAS_KEY if key is not None else 0)
        | (_HAS_TIMESTAMP if timestamp is not None else 0)
        | (_TOMBSTONE if value is None else 0)
    )
    header = FRAME.pack(flags, len(key) if key is not None else 0, len(value or b""), timestamp or 0)
    return header + (key or b"") + (value or b"")


def read_frames(file: BinaryIO, count: int, path: Path) -> Iterator[Record]:
    """The first ``count`` records of a spill file, from just past its magic, in order."""
    for index in range(count):
        header = file.read(FRAME.size)
        if len(header) != FRAME.size:
            raise _truncated(path, index, count)
        flags, key_length, value_length, timestamp = FRAME.unpack(header)
        key = file.read(key_length) if flags & _HAS_KEY else None
        value = file.read(value_length)
        if (key is not None and len(key) != key_length) or len(value) != value_length:
            raise _truncated(path, index, count)
        yield key, (None if flags & _TOMBSTONE else value), (timestamp if flags & _HAS_TIMESTAMP else None)


def _truncated(path: Path, index: int, count: int) -> EpochSpillError:
    return EpochSpillError(
        f"epoch spill file {path} ends at record {index} of the {count} this sink wrote there: it was truncated "
        "or replaced while the sink ran; the task fails and recovery re-produces the epoch from its checkpoint"
    )


def subtask_digest(task: TaskId) -> str:
    """The sink subtask a spill directory belongs to, in a file name of fixed length."""
    return hashlib.sha256(f"{task.job_id}\x00{task.operator_uid}\x00{task.subtask}".encode()).hexdigest()[:16]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive, not ours to judge
    return True


@dataclass(frozen=True)
class SpillDirectory:
    """The name of one sink instance's spill directory: ``{digest}.{pid}.{token}``."""

    digest: str
    pid: int
    token: str

    @property
    def name(self) -> str:
        return f"{self.digest}.{self.pid}.{self.token}"

    @classmethod
    def parse(cls, name: str) -> SpillDirectory | None:
        parts = name.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        return cls(parts[0], int(parts[1]), parts[2])


class EpochSpill:
    """The records of a sink subtask's epochs, at most ``memory_bytes`` of them in memory (estimated
    by :func:`record_memory_bytes`) for all epochs together; the rest in one file per epoch under
    ``root``. The directory is made at the first spill; ``close`` removes it."""

    def __init__(self, task: TaskId, root: Path, memory_bytes: int, log: Any) -> None:
        self.task = task
        self.root = root
        self.memory_bytes = memory_bytes
        self._log = log
        self._held = 0  # estimated bytes of records held in memory, all epochs
        self._directory: Path | None = None
        self._epochs: dict[CheckpointId, EpochRecords] = {}

    @property
    def held_bytes(self) -> int:
        return self._held

    @property
    def directory(self) -> Path | None:
        """This instance's spill directory, once an epoch spilled."""
        return self._directory

    def held_epochs(self) -> dict[CheckpointId, int]:
        """The epochs opened here and not discarded yet (not committed), with their record counts, in
        memory or on disk: at a bounded job's end of input the sink finds none (or fails)."""
        return {epoch: len(records) for epoch, records in sorted(self._epochs.items())}

    def epoch(self, epoch: CheckpointId) -> EpochRecords:
        """An empty record store for a new epoch (epochs never repeat within a sink instance)."""
        if epoch in self._epochs:
            raise ValueError(f"epoch spill of sink subtask {self.task}: epoch {epoch} already has records")
        records = self._epochs[epoch] = EpochRecords(self, epoch)
        return records

    def _reserve(self, size: int) -> bool:
        if self._held + size > self.memory_bytes:
            return False
        self._held += size
        return True

    def _release(self, size: int) -> None:
        self._held -= size

    def _forget(self, epoch: CheckpointId) -> None:
        self._epochs.pop(epoch, None)

    def _file_for(self, epoch: CheckpointId) -> Path:
        if self._directory is None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.remove_abandoned()
            name = SpillDirectory(subtask_digest(self.task), os.getpid(), secrets.token_hex(8)).name
            directory = self.root / name
            directory.mkdir()
            self._directory = directory
        return self._directory / f"epoch-{epoch:020d}.records"

    def remove_abandoned(self) -> None:
        """Remove the spill directories of this sink subtask whose process has exited (a crash). The
        sink calls it when it opens, whether it will spill or not (a recovered epoch is re-produced
        from the snapshot, so a successor may never spill), and again at its first spill."""
        digest = subtask_digest(self.task)
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return  # nothing of this root was ever spilled
        except OSError as exc:  # not fatal here: a sink that never spills needs no disk; a spill says why it fails
            self._log.warning(
                "epoch_spill_root_unreadable",
                job_id=self.task.job_id,
                operator_uid=self.task.operator_uid,
                subtask=self.task.subtask,
                directory=str(self.root),
                error=str(exc),
            )
            return
        for entry in entries:
            found = SpillDirectory.parse(entry.name)
            if found is None or found.digest != digest or process_alive(found.pid):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            self._log.info(
                "epoch_spill_abandoned_removed",
                job_id=self.task.job_id,
                operator_uid=self.task.operator_uid,
                subtask=self.task.subtask,
                directory=str(entry),
                pid=found.pid,
            )

    def close(self) -> None:
        """Forget every epoch and remove this instance's spill directory."""
        for records in list(self._epochs.values()):
            records.discard()
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


class EpochRecords:
    """One epoch's records in the order appended: in memory while the spill's bound allows, then
    all of them in the epoch's append-only file. Iterating reads them back, from memory or the file."""

    def __init__(self, spill: EpochSpill, epoch: CheckpointId) -> None:
        self._spill = spill
        self.epoch = epoch
        self._memory: list[Record] = []
        self._memory_bytes = 0
        self._count = 0
        self._path: Path | None = None
        self._writer: BinaryIO | None = None
        self._discarded = False

    def __len__(self) -> int:
        return self._count

    @property
    def spilled(self) -> bool:
        return self._path is not None

    @property
    def path(self) -> Path | None:
        return self._path

    def append(self, record: Record) -> None:
        if self._writer is None and not self._discarded:  # the common case, inline: once per record
            key, value, _timestamp = record
            # record_memory_bytes, inline
            size = (
                RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
            )
            spill = self._spill
            if spill._held + size <= spill.memory_bytes:  # spill._reserve
                spill._held += size
                self._memory.append(record)
                self._memory_bytes += size
                self._count += 1
                return
        self._append(record)

    def _append(self, record: Record) -> None:
        if self._discarded:
            raise ValueError(f"epoch {self.epoch} of sink subtask {self._spill.task} was discarded")
        if self._writer is None:
            size = record_memory_bytes(record)
            if self._spill._reserve(size):
                self._memory.append(record)
                self._memory_bytes += size
                self._count += 1
                return
            self._move_to_disk()
        assert self._writer is not None and self._path is not None
        try:
            self._writer.write(encode_frame(record))
        except OSError as exc:
            raise self._failed("write to", exc) from exc
        self._count += 1

    def _move_to_disk(self) -> None:
        path = self._spill._file_for(self.epoch)
        try:
            writer = open(path, "xb", buffering=_IO_BUFFER_BYTES)  # open until the epoch is discarded
            writer.write(SPILL_FILE_MAGIC)
            for record in self._memory:
                writer.write(encode_frame(record))
        except OSError as exc:
            self._path = path
            raise self._failed("create", exc) from exc
        self._path, self._writer = path, writer
        task = self._spill.task
        self._spill._log.info(
            "epoch_spilled",
            job_id=task.job_id,
            operator_uid=task.operator_uid,
            subtask=task.subtask,
            epoch=self.epoch,
            records=self._count,
            memory_bytes=self._memory_bytes,
            bound_bytes=self._spill.memory_bytes,
            path=str(path),
        )
        self._memory = []
        self._spill._release(self._memory_bytes)
        self._memory_bytes = 0

    def __iter__(self) -> Iterator[Record]:
        if self._writer is None:
            yield from itertools.islice(self._memory, self._count)
            return
        path, count = self._path, self._count
        assert path is not None
        try:
            self._writer.flush()
            with open(path, "rb", buffering=_IO_BUFFER_BYTES) as file:
                if file.read(len(SPILL_FILE_MAGIC)) != SPILL_FILE_MAGIC:
                    raise EpochSpillError(
                        f"epoch spill file {path} does not start with {SPILL_FILE_MAGIC!r}: it was replaced while "
                        "the sink ran; the task fails and recovery re-produces the epoch from its checkpoint"
                    )
                yield from read_frames(file, count, path)
        except OSError as exc:
            raise self._failed("read", exc) from exc

    def discard(self) -> None:
        """The epoch committed (or the sink closes): drop its records, remove its file."""
        if self._discarded:
            return
        self._discarded = True
        self._spill._release(self._memory_bytes)
        self._memory, self._memory_bytes = [], 0
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._spill._forget(self.epoch)

    def _failed(self, action: str, exc: OSError) -> EpochSpillError:
        task = self._spill.task
        return EpochSpillError(
            f"kafka sink {task.operator_uid!r} of job {task.job_id} subtask {task.subtask}: could not {action} the "
            f"spill file {self._path} of epoch {self.epoch} ({exc}); free disk space or point spill_directory "
            "at a writable disk; recovery re-produces the epoch from its checkpoint"
        )


class StreamedList:
    """Pickles as a plain list of what ``items`` yields, read while pickling: unpickling gives a
    ``list``, as if the list had been pickled, without the list ever being built here."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._items = items

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (), None, iter(self._items))


def dumps_streaming(document: object) -> bytes:
    """Pickle ``document`` (protocol 5) without a memo: the pickler keeps no reference to what it
    wrote, so the items of a :class:`StreamedList` are freed as soon as they are written. Shared
    references are written once per use (no value of a snapshot relies on identity)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=VALUE_PICKLE_PROTOCOL)
    pickler.fast = True
    try:
        pickler.dump(document)
    except EpochSpillError:
        raise
    except Exception as exc:
        raise SerializationError(
            f"cannot serialize a sink snapshot: {type(exc).__name__}: {exc}; values must be picklable "
            "(no lambdas, open files, sockets or locks)",
            fault="user",
        ) from exc
    return buffer.getvalue()
