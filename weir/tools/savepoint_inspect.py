"""Offline inspection of a retained checkpoint or a savepoint: ``weir savepoint info`` and ``dump``.

No cluster is involved, only the checkpoint storage. The path is a folder URI (``s3://…``,
``file:///…`` or a plain directory) or the URI of its ``_metadata``; ``weir.core.paths.locate_state``
tells the storage root its keys are relative to (a checkpoint folder's: the storage root above
``<job>/checkpoints/chk-<id>/``; any other folder is a savepoint, whose keys are relative to itself,
docs/formats.md). The metadata, every task-state document and each operator's state bytes are read
the way a restore reads them (``weir.jobmanager.checkpointing.metadata``, ``weir.core.task_state``); known
operator states are decoded by trying each known decoder (Kafka and generator sources, window
operator, transactional sinks), anything else is reported as opaque bytes.

Keyed state is read only when asked for (``info --keyed``, ``dump``): the files of each RocksDB
snapshot handle are downloaded into a temporary directory, checked against their sizes, opened
read-only (``weir.taskmanager.state.ReadOnlyState``), and scanned over the handle's ``(operator uid,
key groups)`` ranges. Every entry is decoded by ``weir.core.state_layout``, which owns the bytes:
the key group and state name of each RocksDB key, the state key by its state's kind (a window's
bounds, a timer's time, a map entry's key; a state the layout does not name is guessed at), and the
value (a pickle). A record key's bytes (``weir.core.keygroups.key_to_bytes``) are not reversible in
general: a dump gives the exact bytes (``key_hex``) and a best-effort reading (``key``). Values are
unpickled, as a restore does: inspect only checkpoints you would restore from.

Errors: a path with no ``_metadata`` or an unknown operator uid is the user's (exit 2,
``SavepointNotFoundError``, ``UnknownOperatorError``); metadata, task state or objects that are
missing, truncated or do not parse make ``DamagedStateError`` (exit 1).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlparse

from weir.connectors.object_storage import CheckpointStorage, ObjectNotFoundError, open_storage
from weir.core.config import Endpoints
from weir.core.documents import load_versioned, typed
from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.key_samples import KEY_SAMPLE_STATE
from weir.core.keygroups import KeyGroupRange
from weir.core.paths import METADATA_FILE, locate_state
from weir.core.state_layout import KeyedEntry, describe_state_key, load_value
from weir.core.task_state import (
    TASK_STATE_FORMAT_WITHOUT_BROADCAST,
    InlineOperatorState,
    StoredOperatorState,
    TaskStateDocument,
    decode_task_state,
    read_operator_states,
)
from weir.jobmanager.checkpointing.metadata import read_metadata
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.operators.sources import SOURCE_STATE_FORMAT, decode_kafka_source_state
from weir.operators.transactional_sinks import SinkSnapshot
from weir.operators.windows import decode_window_state, pending_window_count
from weir.taskmanager.snapshots import KeyedStateHandle, SnapshotFile, keyed_state_from_document
from weir.taskmanager.state import ReadOnlyState


class SavepointNotFoundError(WeirError):
    """The path names no checkpoint or savepoint: no such folder, or no ``_metadata`` in it."""

    fault: Fault = Fault.USER


class UnknownOperatorError(WeirError):
    """``dump --uid`` names an operator the savepoint has no state of."""

    fault: Fault = Fault.USER


class DamagedStateError(WeirError):
    """The savepoint's metadata, a task-state document or an object it references is missing,
    truncated or does not parse."""

    fault: Fault = Fault.EXTERNAL


# Reading a savepoint ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedTask:
    """One subtask's state as the metadata lists it: its task-state document, keyed state handle and
    each operator's state bytes (read from the storage when stored as an object)."""

    handle: TaskStateHandle
    document: TaskStateDocument
    keyed: KeyedStateHandle | None
    operator_states: Mapping[str, bytes]

    @property
    def name(self) -> str:
        return f"{self.document.vertex_uid}#{self.document.subtask}"


@dataclass(frozen=True)
class LoadedSavepoint:
    path: str
    root_uri: str
    metadata_key: str
    storage: CheckpointStorage
    checkpoint: CompletedCheckpoint
    tasks: tuple[LoadedTask, ...]
    metadata_format: int
    """The format the ``_metadata`` object was written in (docs/formats.md), not the one this Weir writes."""

    @property
    def keys_relative_to_folder(self) -> bool:
        """The savepoint layout: every key relative to the folder holding ``_metadata``."""
        return self.metadata_key == METADATA_FILE

    @property
    def what(self) -> str:
        """How errors name it: kind, id, job and path."""
        c = self.checkpoint
        return f"{c.kind.value} {c.checkpoint_id} of job {c.job_id} ({self.path})"

    def operator_uids(self) -> list[str]:
        """Every operator the savepoint has a subtask of, in vertex then chain order."""
        seen: dict[str, None] = {}
        for task in self.tasks:
            for uid in task.document.layout.operator_uids:
                seen.setdefault(uid, None)
        return list(seen)


def _absolute(path: str) -> str:
    """A plain relative directory as an absolute one (``locate_state`` needs one); URIs unchanged."""
    if "://" in path or path.startswith("/"):
        return path
    return str(Path(path).absolute())


def load_savepoint(path: str, endpoints: Endpoints | None = None) -> LoadedSavepoint:
    """Read the metadata at ``path`` and every task's state document and operator state bytes."""
    if not path:
        raise SavepointNotFoundError("no savepoint path given")
    given = _absolute(path)
    location = locate_state(given)
    parsed = urlparse(location.root_uri)
    if parsed.scheme in ("", "file"):
        local = Path(unquote(parsed.path) if parsed.scheme == "file" else location.root_uri)
        if not local.is_dir():
            raise SavepointNotFoundError(f"savepoint {path}: no such folder {local}")
    storage = open_storage(location.root_uri, endpoints)
    key = location.metadata_key
    if not storage.exists(key):
        raise SavepointNotFoundError(
            f"savepoint {path}: no {key} under {location.root_uri}: not a checkpoint or savepoint folder, "
            "or the checkpoint never completed"
        )
    try:
        metadata = read_metadata(storage.get_bytes(key), key)
    except (SerializationError, ObjectNotFoundError) as exc:
        raise DamagedStateError(f"savepoint {path}: {exc}") from exc
    checkpoint = metadata.checkpoint
    what = f"{checkpoint.kind.value} {checkpoint.checkpoint_id} of job {checkpoint.job_id} ({path})"
    tasks = tuple(_load_task(storage, handle, what) for handle in checkpoint.task_states)
    return LoadedSavepoint(path, location.root_uri, key, storage, checkpoint, tasks, metadata.format)


def _load_task(storage: CheckpointStorage, handle: TaskStateHandle, what: str) -> LoadedTask:
    where = f"{what}: task {handle.task_id.operator_uid}#{handle.task_id.subtask}"
    if not handle.inline_payload:
        raise DamagedStateError(f"{where} has no task-state document: the checkpoint is damaged")
    try:
        document = decode_task_state(handle.inline_payload, "document")
        keyed = keyed_state_from_document(document.keyed_state, "the document") if document.keyed_state else None
        states = read_operator_states(document.operator_state, storage.get_bytes)
    except (SerializationError, ObjectNotFoundError) as exc:
        raise DamagedStateError(f"{where}: {exc}") from exc
    return LoadedTask(handle, document, keyed, states)


# Operator state decoders --------------------------------------------------------------------------


def _kafka_source(data: bytes) -> dict[str, Any]:
    next_offsets, end_offsets = decode_kafka_source_state(data)
    return {
        "kind": "kafka-source",
        "next_offsets": {str(p): o for p, o in sorted(next_offsets.items())},
        "end_offsets": {str(p): o for p, o in sorted(end_offsets.items())} if end_offsets is not None else None,
    }


def _window(data: bytes) -> dict[str, Any]:
    decoded = {"kind": "window", "watermark": decode_window_state(data)}
    pending = pending_window_count(data)
    return decoded if pending is None else {**decoded, "pending_windows": pending}


def _generator_source(data: bytes) -> dict[str, Any]:
    # As weir.operators.sources.GeneratorSourceOperator.restore_state reads it.
    document = load_versioned(data, "generator source state", SOURCE_STATE_FORMAT, "")
    try:
        return {"kind": "generator-source", "next_k": typed(document["next_k"], int)}
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"generator source state is malformed: {exc}") from exc


def _transactional_sink(data: bytes) -> dict[str, Any]:
    if not data.startswith(b"\x80"):  # not a pickle: do not try to unpickle it
        raise SerializationError("not a transactional sink snapshot")
    snapshot = SinkSnapshot.from_bytes(data)
    ledger = snapshot.ledger
    return {
        "kind": "transactional-sink",
        "ledger_checkpoint_id": ledger.checkpoint_id,
        "pending_transactions": [
            {"transaction": p.txn.gid, "epoch": p.txn.checkpoint_id, "pre_committed_at": p.checkpoint_id}
            for p in ledger.pending
        ],
        "epochs": [{"checkpoint_id": cid, "records": len(list(rows))} for cid, rows in sorted(snapshot.epochs.items())],
        "marker_topic": snapshot.marker_topic,
        "marker_partition": snapshot.marker_partition,
        "marker_floor": snapshot.marker_floor,
    }


OPERATOR_STATE_DECODERS: Final[tuple[Callable[[bytes], dict[str, Any]], ...]] = (
    _kafka_source,
    _window,
    _generator_source,
    _transactional_sink,
)


def decode_operator_state(data: bytes) -> dict[str, Any]:
    """The state as the first known decoder that accepts it reads it (``kind`` says which), with its
    size; ``{"kind": "opaque"}`` when none does."""
    for decoder in OPERATOR_STATE_DECODERS:
        try:
            decoded = decoder(data)
        except Exception:  # not this operator's state: try the next decoder
            continue
        return {**decoded, "size_bytes": len(data)}
    return {"kind": "opaque", "size_bytes": len(data)}


# Keyed state: download, open, scan ----------------------------------------------------------------


def _snapshot_identity(handle: KeyedStateHandle) -> tuple[str, str, int, int]:
    return handle.taskmanager_id, handle.db_incarnation, handle.checkpoint_id, handle.snapshot_index


@contextmanager
def open_keyed_snapshot(
    storage: CheckpointStorage, handle: KeyedStateHandle, work_dir: Path, where: str
) -> Iterator[ReadOnlyState]:
    """The handle's RocksDB snapshot, downloaded under ``work_dir`` and opened read-only; deleted on exit."""
    directory = work_dir / uuid.uuid4().hex
    directory.mkdir(parents=True)
    try:
        for f in (*handle.sst_files, *handle.db_files):
            _download(storage, f, directory, where)
        try:
            db = ReadOnlyState(directory)
        except Exception as exc:
            raise DamagedStateError(
                f"{where}: the RocksDB snapshot {handle.snapshot_index} of {handle.taskmanager_id} "
                f"(db {handle.db_incarnation}) does not open: {exc}"
            ) from exc
        try:
            yield db
        finally:
            db.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _download(storage: CheckpointStorage, f: SnapshotFile, directory: Path, where: str) -> None:
    target = directory / f.file_name
    try:
        storage.get_file(f.key, target)
    except ObjectNotFoundError as exc:
        raise DamagedStateError(f"{where}: keyed state file {f.file_name}: {exc}") from exc
    size = target.stat().st_size
    if size != f.size_bytes:
        raise DamagedStateError(
            f"{where}: keyed state file {f.key} is {size} bytes, its handle says {f.size_bytes}: "
            "the object was replaced or truncated"
        )


def scan_entries(
    db: ReadOnlyState, uid: str, key_groups: KeyGroupRange, *, values: bool = True
) -> Iterator[KeyedEntry]:
    """Every entry of operator ``uid`` in ``key_groups``, in key order (values empty unless ``values``)."""
    return db.entries(uid, key_groups, values=values)


def _compress(key_groups: Iterable[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for kg in sorted(set(key_groups)):
        if ranges and ranges[-1][1] == kg - 1:
            ranges[-1] = (ranges[-1][0], kg)
        else:
            ranges.append((kg, kg))
    return ranges


# Entries as JSON --------------------------------------------------------------------------------


def entry_to_json(entry: KeyedEntry) -> dict[str, Any]:
    """One dump line: key group, state name, key (read and exact hex), and the value: as JSON when it
    is JSON-serializable, else its repr in ``value_repr``, or ``value_error`` when it does not unpickle."""
    line: dict[str, Any] = {
        "key_group": entry.key_group,
        "state": entry.state,
        "key": describe_state_key(entry.state, entry.key),
        "key_hex": entry.key.hex(),
    }
    try:
        value = load_value(entry.value)
    except Exception as exc:  # e.g. a class of the job file, not importable here
        line["value_error"] = f"does not unpickle ({len(entry.value)} bytes): {type(exc).__name__}: {exc}"
        return line
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        line["value_repr"] = repr(value)
    else:
        line["value"] = value
    return line


# info ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateNameStats:
    name: str
    entries: int
    key_groups: tuple[tuple[int, int], ...]  # present key groups, as inclusive ranges

    def to_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "key_groups": [list(r) for r in self.key_groups]}


@dataclass(frozen=True)
class OperatorSubtaskInfo:
    """One operator in one subtask: its operator state, decoded, and its keyed state."""

    vertex_uid: str
    subtask: int
    operator_state: dict[str, Any] | None
    keyed_ranges: tuple[KeyGroupRange, ...]
    keyed_handle: KeyedStateHandle | None  # shared by the chain's keyed operators
    states: tuple[StateNameStats, ...] | None  # None: the keyed files were not read

    def to_json(self) -> dict[str, Any]:
        keyed: dict[str, Any] | None = None
        if self.keyed_handle is not None and self.keyed_ranges:
            handle = self.keyed_handle
            keyed = {
                "ranges": [[r.start, r.end] for r in self.keyed_ranges],
                "taskmanager_id": handle.taskmanager_id,
                "db_incarnation": handle.db_incarnation,
                "snapshot_index": handle.snapshot_index,
                "files": len(handle.objects),
                "size_bytes": handle.size_bytes,
                "states": {s.name: s.to_json() for s in self.states} if self.states is not None else None,
            }
        return {
            "vertex_uid": self.vertex_uid,
            "subtask": self.subtask,
            "operator_state": self.operator_state,
            "keyed_state": keyed,
        }


@dataclass(frozen=True)
class OperatorInfo:
    uid: str
    keyed: bool
    subtasks: tuple[OperatorSubtaskInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "keyed": self.keyed, "subtasks": [s.to_json() for s in self.subtasks]}


@dataclass(frozen=True)
class SavepointInfo:
    savepoint: LoadedSavepoint
    operators: tuple[OperatorInfo, ...]
    keyed_scanned: bool
    missing_objects: tuple[str, ...] = ()
    resized_objects: tuple[tuple[str, int, int], ...] = ()  # key, size found, size in the metadata
    warnings: tuple[str, ...] = ()

    @property
    def formats(self) -> dict[str, int]:
        """The format versions of what was read: the metadata object's own (1 or 2), and the task-state
        documents' newest (2, or 3 when one holds broadcast state; any other is refused before this is
        built)."""
        task_state = max((t.document.format for t in self.savepoint.tasks), default=TASK_STATE_FORMAT_WITHOUT_BROADCAST)
        return {"metadata": self.savepoint.metadata_format, "task_state": task_state}

    def to_json(self) -> dict[str, Any]:
        sp = self.savepoint
        c = sp.checkpoint
        return {
            "path": sp.path,
            "storage_root": sp.root_uri,
            "metadata_key": sp.metadata_key,
            "keys_relative_to": "folder" if sp.keys_relative_to_folder else "storage root",
            "job_id": c.job_id,
            "checkpoint_id": c.checkpoint_id,
            "kind": c.kind.value,
            "full": c.full,
            "formats": self.formats,
            "trigger_timestamp": c.trigger_timestamp,
            "completion_timestamp": c.completion_timestamp,
            "total_size_bytes": c.total_size_bytes,
            "objects": len(c.object_keys),
            "missing_objects": list(self.missing_objects),
            "resized_objects": [
                {"key": k, "size_bytes": found, "expected_size_bytes": expected}
                for k, found, expected in self.resized_objects
            ],
            "keyed_state_scanned": self.keyed_scanned,
            "subtasks": [_subtask_json(t) for t in sp.tasks],
            "operators": [o.to_json() for o in self.operators],
            "warnings": list(self.warnings),
        }


def _subtask_json(task: LoadedTask) -> dict[str, Any]:
    d = task.document
    layout = d.layout
    operator_state = d.operator_state
    stored: dict[str, Any]
    match operator_state:
        case InlineOperatorState():
            stored = {"stored": "inline", "size_bytes": operator_state.size_bytes}
        case StoredOperatorState(key=key, size_bytes=size):
            stored = {"stored": "object", "key": key, "size_bytes": size}
    if operator_state.broadcast:  # content-addressed, shared by the subtasks with the same copy
        stored["broadcast"] = {
            uid: {"key": ref.key, "size_bytes": ref.size_bytes, "sha256": ref.sha256}
            for uid, ref in sorted(operator_state.broadcast.items())
        }
    keyed = task.keyed
    return {
        "vertex_uid": d.vertex_uid,
        "subtask": d.subtask,
        "attempt": d.attempt,
        "key_group_range": [d.key_group_range.start, d.key_group_range.end],
        "parallelism": layout.parallelism,
        "max_parallelism": layout.max_parallelism,
        "operator_uids": list(layout.operator_uids),
        "keyed_operator_uids": list(layout.keyed_operator_uids),
        "state_size_bytes": task.handle.size_bytes,
        "objects": len(task.handle.objects),
        "operator_state": stored,
        "keyed_state": (
            {
                "taskmanager_id": keyed.taskmanager_id,
                "db_incarnation": keyed.db_incarnation,
                "snapshot_index": keyed.snapshot_index,
                "sst_files": len(keyed.sst_files),
                "db_files": len(keyed.db_files),
                "size_bytes": keyed.size_bytes,
                "ranges": [[uid, r.start, r.end] for uid, r in keyed.ranges],
            }
            if keyed is not None
            else None
        ),
        "sink_precommit_bytes": len(task.handle.sink_precommit),
    }


def savepoint_info(
    path: str, *, keyed: bool = False, endpoints: Endpoints | None = None, work_dir: Path | None = None
) -> SavepointInfo:
    """Everything ``weir savepoint info`` shows; ``keyed``: also download and scan the keyed state."""
    sp = load_savepoint(path, endpoints)
    stats: dict[tuple[int, str], tuple[StateNameStats, ...]] = {}  # (task index, uid) -> states
    if keyed:
        stats = _scan_keyed_stats(sp, work_dir)
    operators: list[OperatorInfo] = []
    for uid in sp.operator_uids():
        subtasks: list[OperatorSubtaskInfo] = []
        is_keyed = False
        for index, task in enumerate(sp.tasks):
            if uid not in task.document.layout.operator_uids:
                continue
            data = task.operator_states.get(uid)
            ranges = tuple(r for u, r in task.keyed.ranges if u == uid) if task.keyed is not None else ()
            is_keyed = is_keyed or bool(ranges) or uid in task.document.layout.keyed_operator_uids
            subtasks.append(
                OperatorSubtaskInfo(
                    task.document.vertex_uid,
                    task.document.subtask,
                    decode_operator_state(data) if data is not None else None,
                    ranges,
                    task.keyed if ranges else None,
                    stats.get((index, uid)) if keyed and ranges else None,
                )
            )
        operators.append(OperatorInfo(uid, is_keyed, tuple(sorted(subtasks, key=lambda s: s.subtask))))
    missing, resized = _check_objects(sp)
    warnings: list[str] = []
    if sp.keys_relative_to_folder and not sp.checkpoint.is_savepoint:
        warnings.append(
            "this folder holds a checkpoint's _metadata but is not under <job>/checkpoints/chk-<id>/: a "
            "checkpoint's keys are relative to its storage root, so they are read relative to this folder"
        )
    if missing:
        warnings.append(f"{len(missing)} object(s) the metadata references are missing, e.g. {missing[0]}")
    if resized:
        key, found, expected = resized[0]
        warnings.append(
            f"{len(resized)} object(s) differ from their size in the metadata, e.g. {key}: {found} bytes, "
            f"expected {expected}"
        )
    return SavepointInfo(sp, tuple(operators), keyed, missing, resized, tuple(warnings))


def _scan_keyed_stats(sp: LoadedSavepoint, work_dir: Path | None) -> dict[tuple[int, str], tuple[StateNameStats, ...]]:
    by_snapshot: dict[tuple[str, str, int, int], list[int]] = defaultdict(list)
    for index, task in enumerate(sp.tasks):
        if task.keyed is not None:
            by_snapshot[_snapshot_identity(task.keyed)].append(index)
    out: dict[tuple[int, str], tuple[StateNameStats, ...]] = {}
    with _work_dir(work_dir) as directory:
        for indexes in by_snapshot.values():
            first = sp.tasks[indexes[0]]
            assert first.keyed is not None
            where = f"{sp.what}: task {first.name}"
            with open_keyed_snapshot(sp.storage, first.keyed, directory, where) as db:
                for index in indexes:
                    task = sp.tasks[index]
                    assert task.keyed is not None
                    per_uid: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
                    for uid, ranges in task.keyed.ranges:
                        names = per_uid[uid]
                        for entry in _scan(db, uid, ranges, f"{sp.what}: task {task.name}", values=False):
                            names[entry.state].append(entry.key_group)
                    for operator_uid, names in per_uid.items():
                        out[(index, operator_uid)] = tuple(
                            StateNameStats(name, len(kgs), tuple(_compress(kgs))) for name, kgs in sorted(names.items())
                        )
    return out


def _scan(db: ReadOnlyState, uid: str, ranges: KeyGroupRange, where: str, *, values: bool) -> Iterator[KeyedEntry]:
    try:
        yield from scan_entries(db, uid, ranges, values=values)
    except SerializationError as exc:
        raise DamagedStateError(f"{where}: {exc}") from exc
    except Exception as exc:  # a RocksDB read error: a corrupt SST
        raise DamagedStateError(f"{where}: reading the keyed state of {uid} failed: {exc}") from exc


@contextmanager
def _work_dir(work_dir: Path | None) -> Iterator[Path]:
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        yield work_dir
        return
    with tempfile.TemporaryDirectory(prefix="weir-savepoint-") as directory:
        yield Path(directory)


def _check_objects(sp: LoadedSavepoint) -> tuple[tuple[str, ...], tuple[tuple[str, int, int], ...]]:
    """The referenced objects that are not in the storage, and those of another size; one listing
    per folder holding any of them."""
    expected: dict[str, int] = {}
    for task in sp.tasks:
        for o in task.handle.objects:
            expected[o.key] = o.size_bytes
        if task.keyed is not None:
            for f in task.keyed.objects:
                expected.setdefault(f.key, f.size_bytes)
        if isinstance(task.document.operator_state, StoredOperatorState):
            stored = task.document.operator_state
            expected.setdefault(stored.key, stored.size_bytes)
    folders = {key.rpartition("/")[0] for key in expected}
    found: dict[str, int] = {}
    for folder in sorted(folders):
        found.update(sp.storage.list(f"{folder}/" if folder else ""))
    missing = tuple(sorted(k for k in expected if k not in found))
    resized = tuple(sorted((k, found[k], size) for k, size in expected.items() if k in found and found[k] != size))
    return missing, resized


# dump ---------------------------------------------------------------------------------------------


def dump_operator(
    path: str,
    uid: str,
    *,
    state: str | None = None,
    limit: int | None = None,
    endpoints: Endpoints | None = None,
    work_dir: Path | None = None,
) -> Iterator[dict[str, Any]]:
    """The dump lines of operator ``uid``: its keyed entries (only of ``state`` if given, at most
    ``limit``), read subtask by subtask; for an operator with operator state only, one line per
    subtask with its decoded operator state. Without ``state``, the runtime's key samples
    (:data:`KEY_SAMPLE_STATE`, kept for ``weir upgrade check``) are left out: they are Weir's
    bookkeeping, not the operator's state; ``state=KEY_SAMPLE_STATE`` prints them."""
    sp = load_savepoint(path, endpoints)
    tasks = [t for t in sp.tasks if uid in t.document.layout.operator_uids]
    if not tasks:
        known = ", ".join(sp.operator_uids()) or "none"
        raise UnknownOperatorError(f"{sp.what} has no operator {uid!r}; its operators: {known}")
    keyed = [t for t in tasks if t.keyed is not None and any(u == uid for u, _ in t.keyed.ranges)]
    if not keyed:
        stateful = [t for t in tasks if uid in t.operator_states]
        if not stateful:
            raise UnknownOperatorError(f"{sp.what}: operator {uid!r} has neither keyed nor operator state")
        if state is not None:
            raise UnknownOperatorError(f"{sp.what}: operator {uid!r} has no keyed state (--state {state})")
        for t in sorted(stateful, key=lambda t: t.document.subtask)[:limit]:
            yield {
                "vertex_uid": t.document.vertex_uid,
                "subtask": t.document.subtask,
                "operator_state": decode_operator_state(t.operator_states[uid]),
            }
        return
    yield from _dump_keyed(sp, uid, sorted(keyed, key=lambda t: t.document.subtask), state, limit, work_dir)


def _dump_keyed(
    sp: LoadedSavepoint,
    uid: str,
    tasks: Sequence[LoadedTask],
    state: str | None,
    limit: int | None,
    work_dir: Path | None,
) -> Iterator[dict[str, Any]]:
    written = 0
    names: set[str] = set()
    if limit is not None and limit <= 0:
        return
    with _work_dir(work_dir) as directory:
        for task in tasks:
            assert task.keyed is not None
            where = f"{sp.what}: task {task.name}"
            with open_keyed_snapshot(sp.storage, task.keyed, directory, where) as db:
                for u, ranges in task.keyed.ranges:
                    if u != uid:
                        continue
                    for entry in _scan(db, uid, ranges, where, values=True):
                        names.add(entry.state)
                        if entry.state != state and (state is not None or entry.state == KEY_SAMPLE_STATE):
                            continue
                        yield {"subtask": task.document.subtask, **entry_to_json(entry)}
                        written += 1
                        if limit is not None and written >= limit:
                            return
    if state is not None and state not in names:
        known = ", ".join(sorted(names)) or "none"
        raise UnknownOperatorError(f"{sp.what}: operator {uid!r} has no keyed state {state!r}; its states: {known}")


def key_group_ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    """``0-3,7,9-12``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)
