"""A completed checkpoint's ``_metadata`` object, as versioned JSON (``docs/formats.md``).

Written last, in one PUT, once every task acknowledged (``JobActionExecutor._persist``); read
back by a JobManager that takes a job over. Each task's ``state_handle`` is its task-state document
(``weir.core.task_state``) kept as opaque bytes; the JobManager reads only the object keys listed
beside it, which retention and deletion count. Format 2::

    {"format": 2,
     "job_id": str, "checkpoint_id": int, "kind": "checkpoint" | "savepoint",
     "leader_term": int,                 # the leader term of the JobManager that wrote it (0: no HA)
     "full": bool,                       # optional (absent: false): a full checkpoint (weir checkpoint --full)
     "trigger_timestamp": float, "completion_timestamp": float,      # seconds since the epoch
     "tasks": [{"vertex_uid": str, "subtask": int,
                "objects": [{"key": str, "size_bytes": int, "reused": bool}],
                "state_handle": "<base64>", "sink_precommit": "<base64>"}]}

Format 1 is the same without ``leader_term``; it is still read, as term 0. ``full`` was added to format 2
without a new number: a Weir that does not know it ignores it, and a document without it reads as not
full. The key the document is read from is its ``metadata_key``; it is not stored in the document. In a
savepoint every object key is relative to the folder holding its ``_metadata`` (so it may be copied
anywhere); the decoder puts the folder back in front, so a ``CompletedCheckpoint`` always holds keys of
the storage it was read from.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from weir.core.checkpointing import CheckpointKind
from weir.core.documents import load_versioned, number, typed
from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.paths import metadata_folder
from weir.jobmanager.checkpointing.pending import StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.errors import CheckpointProtocolError

METADATA_FORMAT: Final = 2
READABLE_FORMATS: Final = (1, 2)  # format 1: no leader_term (read as 0)


def encode_metadata(checkpoint: CompletedCheckpoint) -> bytes:
    folder = metadata_folder(checkpoint.metadata_key) if checkpoint.is_savepoint else ""

    def key_of(key: str) -> str:
        if not key.startswith(folder):
            raise CheckpointProtocolError(
                f"savepoint {checkpoint.checkpoint_id}: object {key} lies outside its folder {folder}"
            )
        return key[len(folder) :]

    document = {
        "format": METADATA_FORMAT,
        "job_id": checkpoint.job_id,
        "checkpoint_id": checkpoint.checkpoint_id,
        "kind": checkpoint.kind.value,
        "leader_term": checkpoint.leader_term,
        "full": checkpoint.full,
        "trigger_timestamp": checkpoint.trigger_timestamp,
        "completion_timestamp": checkpoint.completion_timestamp,
        "tasks": [
            {
                "vertex_uid": state.task_id.operator_uid,
                "subtask": state.task_id.subtask,
                "objects": [
                    {"key": key_of(o.key), "size_bytes": o.size_bytes, "reused": o.reused} for o in state.objects
                ],
                "state_handle": base64.b64encode(state.inline_payload).decode("ascii"),
                "sink_precommit": base64.b64encode(state.sink_precommit).decode("ascii"),
            }
            for state in checkpoint.task_states
        ],
    }
    return json.dumps(document, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ReadMetadata:
    """A metadata object as read: the checkpoint, and the format the object was written in."""

    checkpoint: CompletedCheckpoint
    format: int


def decode_metadata(data: bytes, key: str) -> CompletedCheckpoint:
    """The checkpoint whose metadata object ``key`` holds ``data``; a SerializationError naming the
    key when the document is of another format or malformed."""
    return read_metadata(data, key).checkpoint


def read_metadata(data: bytes, key: str) -> ReadMetadata:
    """``decode_metadata``, with the format the object was written in (``weir savepoint info``)."""
    document = load_versioned(
        data,
        f"checkpoint metadata {key}",
        READABLE_FORMATS,
        "written by another Weir version, or damaged; recover the job with the Weir version that wrote it",
    )
    try:
        job_id = JobId(typed(document["job_id"], str))
        kind = CheckpointKind(document["kind"])
        folder = metadata_folder(key) if kind is CheckpointKind.SAVEPOINT else ""
        checkpoint = CompletedCheckpoint(
            checkpoint_id=CheckpointId(typed(document["checkpoint_id"], int)),
            job_id=job_id,
            trigger_timestamp=float(number(document["trigger_timestamp"])),
            completion_timestamp=float(number(document["completion_timestamp"])),
            task_states=tuple(_task_state(job_id, task, folder) for task in typed(document["tasks"], list)),
            metadata_key=key,
            kind=kind,
            leader_term=typed(document["leader_term"], int) if document["format"] >= 2 else 0,
            full=typed(document.get("full", False), bool),
        )
        return ReadMetadata(checkpoint, typed(document["format"], int))
    except (KeyError, TypeError, ValueError, binascii.Error, CheckpointProtocolError) as exc:
        raise SerializationError(f"checkpoint metadata {key} is malformed: {type(exc).__name__}: {exc}") from exc


def _task_state(job_id: JobId, task: Any, folder: str) -> TaskStateHandle:
    return TaskStateHandle(
        task_id=TaskId(job_id, OperatorUid(typed(task["vertex_uid"], str)), SubtaskIndex(typed(task["subtask"], int))),
        objects=tuple(
            StateObject(folder + typed(o["key"], str), typed(o["size_bytes"], int), typed(o["reused"], bool))
            for o in typed(task["objects"], list)
        ),
        inline_payload=base64.b64decode(typed(task["state_handle"], str), validate=True),
        sink_precommit=base64.b64decode(typed(task["sink_precommit"], str), validate=True),
    )


_T = TypeVar("_T")
