"""Job and vertex ids in Flink's form. Flink's ``JobID`` is 32 hex characters, Weir's 16: a Weir id goes out in
Flink's fields (``jid``, ``id``) left-padded with zeros to 32 (``flink_job_id``), and a path takes
either form (``weir_job_id``), so ``weir list`` and ``flink list`` name the same job."""

from __future__ import annotations

import hashlib
import re
from typing import Final

JOB_ID_DIGITS: Final = 16
FLINK_ID_HEX: Final = 32
_HEX: Final = re.compile(r"[0-9a-f]+")
_PADDING: Final = "0" * (FLINK_ID_HEX - JOB_ID_DIGITS)


def flink_job_id(job_id: str) -> str:
    """A Weir job id as Flink's 32-hex JobID (zeros first); any other id unchanged."""
    if len(job_id) == JOB_ID_DIGITS and _HEX.fullmatch(job_id):
        return _PADDING + job_id
    return job_id


def weir_job_id(job_id: str) -> str:
    """The Weir job id a path names: Flink's 32-hex form of one (``flink_job_id``), or the Weir id."""
    lowered = job_id.lower()
    if len(lowered) == FLINK_ID_HEX and _HEX.fullmatch(lowered) and lowered.startswith(_PADDING):
        return lowered[len(_PADDING) :]
    return job_id


def flink_vertex_id(uid: str) -> str:
    """A vertex's id in Flink's form (``JobVertexID``, 32 hex characters): a 128-bit hash of its head
    operator's uid, as Flink derives a vertex's id from a uid the job sets. The same uid, the same id,
    in every job and attempt."""
    return hashlib.blake2b(uid.encode(), digest_size=16).hexdigest()


def names_vertex(vertex_id: str, uid: str) -> bool:
    """Whether a path's vertex id names the vertex of this uid: the uid itself or its Flink form."""
    return vertex_id == uid or vertex_id.lower() == flink_vertex_id(uid)


def slot_sharing_group_id(job_id: str) -> str:
    """The id in Flink's form (``SlotSharingGroupId``, 32 hex characters) of a job's one slot sharing
    group: every vertex of a Weir job shares slots (slot ``i`` runs subtask ``i`` of each), as Flink's
    default group. A hash of the job's id: the same for every attempt of the job."""
    return hashlib.blake2b(f"slot-sharing-group/{job_id}".encode(), digest_size=16).hexdigest()
