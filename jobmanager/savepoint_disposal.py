"""Disposing of a savepoint (Flink's ``flink savepoint --dispose`` and ``POST /savepoint-disposal``): the
one function ``weir savepoint --dispose`` and the REST API both call.

Only a savepoint: its files are its own (every key relative to its folder, docs/formats.md), where a
retained checkpoint shares files with the job's later checkpoints, so disposing of one would damage
them (the JobManager deletes checkpoints as it retires them). The ``_metadata`` goes first: a
disposal cut short leaves no folder that a restore would take for a savepoint and find incomplete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from weir.connectors.object_storage import ObjectNotFoundError, open_storage
from weir.core.checkpointing import CheckpointKind
from weir.core.config import Endpoints
from weir.core.errors import SerializationError
from weir.core.paths import METADATA_FILE, locate_state
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.errors import SavepointDisposalError

_ONLY_SAVEPOINTS = (
    "only a savepoint is disposed (a retained checkpoint of a job shares its files with the job's later checkpoints)"
)


@dataclass(frozen=True)
class DisposedSavepoint:
    path: str
    job_id: str
    savepoint_id: int
    files: int
    size_bytes: int


def dispose_savepoint(path: str, endpoints: Endpoints | None = None) -> DisposedSavepoint:
    """Delete every object of the savepoint at ``path`` (an absolute path or a URI: ``file://``,
    ``s3://``), its ``_metadata`` first, then the rest of its folder (and, on a local disk, the emptied
    directories). SavepointDisposalError, with nothing deleted, for anything that is not a savepoint: a
    relative path, no folder or no ``_metadata`` there, a checkpoint, a ``_metadata`` that does not read."""
    if "://" not in path and not path.startswith("/"):
        raise SavepointDisposalError(f"savepoint {path}: give an absolute path or a URI (file://, s3://)")
    location = locate_state(path)
    local = _local_folder(location.root_uri)
    if local is not None and not local.is_dir():
        raise SavepointDisposalError(f"savepoint {path}: no such folder {local}")
    storage = open_storage(location.root_uri, endpoints)
    key = location.metadata_key
    if not storage.exists(key):
        raise SavepointDisposalError(
            f"savepoint {path}: no {key} under {location.root_uri}: not a savepoint folder, "
            "or the savepoint never completed"
        )
    try:
        checkpoint: CompletedCheckpoint | None = decode_metadata(storage.get_bytes(key), key)
    except (SerializationError, ObjectNotFoundError) as exc:
        if key == METADATA_FILE:
            raise SavepointDisposalError(f"savepoint {path}: its {METADATA_FILE} does not read: {exc}") from exc
        checkpoint = None  # a checkpoint's folder, refused below all the same
    if checkpoint is None:
        raise SavepointDisposalError(f"{path} is a checkpoint of a job, not a savepoint: {_ONLY_SAVEPOINTS}")
    if checkpoint.kind is not CheckpointKind.SAVEPOINT or key != METADATA_FILE:
        raise SavepointDisposalError(
            f"{path} is {checkpoint.kind.value} {checkpoint.checkpoint_id} of job {checkpoint.job_id}, "
            f"not a savepoint: {_ONLY_SAVEPOINTS}"
        )
    objects = list(storage.list(""))
    storage.delete([METADATA_FILE])
    storage.delete([k for k, _ in objects if k != METADATA_FILE])
    if local is not None:
        for directory in sorted((d for d in local.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            if not any(directory.iterdir()):
                directory.rmdir()
    return DisposedSavepoint(
        path=path,
        job_id=checkpoint.job_id,
        savepoint_id=checkpoint.checkpoint_id,
        files=len(objects),
        size_bytes=sum(size for _, size in objects),
    )


def _local_folder(root_uri: str) -> Path | None:
    """The local directory a storage URI names (None: an object store)."""
    parsed = urlparse(root_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        return Path(root_uri)
    return None
