"""The job record: what a restarted JobManager needs to take a job over, as versioned JSON.

Written to ``<job>/_job`` in checkpoint storage whenever the job changes (and every few seconds for
its progress counters); read back by ``JobManager.recover_jobs``. The format is documented here and
in ``docs/formats.md``; it is never a pickle of Python classes, so a newer Weir reads an older record.

Format 1::

    {"format": 1,
     "submission": {"job_id", "job_name", "job_file_name", "job_source" (base64), "parameters",
                    "parallelism", "submitted_at",
                    "restored_from",        # optional: the external path of the retained checkpoint or
                                            # savepoint the job started from (weir run --from-...)
                    "artifact_id"},         # optional: the SHA-256 of the job's artifact in <job>/_artifact
                                            # (weir run --py-files ...; job_source is then empty)
     "attempt": int,              # the highest attempt deployed (persisted before deployment)
     "status": "RUNNING" | ...,   # weir.core.states.JobStatus
     "failure": null | {"type", "message", "fault", "retriable"},
     "records_in_all_attempts": [[vertex uid, subtask, count], ...],
     "checkpoint_ids_reserved_through": int,   # no checkpoint id at or below it is handed out again
     "transactions_resolved": bool,            # an ended job's sink transactions were resolved
     "restarts": int,                          # optional (absent: 0); restarts since submission, over
                                               # every JobManager that ran the job
     "exceptions": [                           # optional (absent: none); the last 100 failures, newest first
        {"failure": {"type", "message", "fault", "retriable"}, "timestamp": seconds, "attempt": int,
         "vertex_uid": str | null, "subtask": int | null, "taskmanager_id": str | null}, ...],
     "end": null | {                           # optional (absent: none); the job is ending or ended
        "outcome": "CANCELED" | "FAILED" | "FINISHED",
        "ended": bool,                         # false: still ending (tasks stopping, sinks resolving)
        "at": seconds,                         # since when it is ending, or when it ended
        "resolution": null | {                 # null: nothing to resolve (every task FINISHED), or not
                                               # decided yet (ending, a checkpoint was being persisted)
           "as_of": int | null,                # the checkpoint the sinks are resolved as of (null: none)
           "attempts": int, "resolved": bool, "error": str}},
     "stop": null | {"savepoint_id": int, "drain": bool},   # optional (absent: none); a weir stop under way
     "term_fences": [{"term": int, "checkpoints_through": int | null}, ...]}
                               # optional (absent: none); one per high-availability takeover of the job:
                               # the new leader's term and the highest checkpoint id it listed
                               # (weir.jobmanager.checkpointing.term_fences)

``exceptions``, ``restarts``, ``end``, ``stop`` and ``term_fences`` were added to format 1 as optional
fields: an older record has none (an empty history, 0 restarts, an end told by ``status`` and
``transactions_resolved``, no fence) and an older Weir ignores them, so neither reader refuses the
other's record. ``transactions_resolved``
is still written (true once the end is resolved) for an older reader.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final

from weir.core.documents import load_versioned, number, typed
from weir.core.errors import Fault, SerializationError
from weir.core.failures import Failure
from weir.core.ids import CheckpointId
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.term_fences import TermFence
from weir.jobmanager.exception_history import ExceptionEntry, ExceptionHistory
from weir.jobmanager.lifecycle import RecordedEnd, Resolution, StopRequest

RECORD_FORMAT: Final = 1


@dataclass(frozen=True)
class JobSubmission:
    job_id: str
    job_name: str
    job_file_name: str
    job_source: bytes
    parameters: dict[str, str]
    parallelism: int
    submitted_at: float
    restored_from: str = ""  # the external path of another job's checkpoint or savepoint it started from
    artifact_id: str = ""  # the job's artifact (weir.api.artifacts) beside its record; empty: job_source


@dataclass(frozen=True)
class JobRecord:
    submission: JobSubmission
    attempt: int
    status: JobStatus
    failure: Failure | None
    records_in_all_attempts: dict[tuple[str, int], int]
    checkpoint_ids_reserved_through: int = 0
    transactions_resolved: bool = False
    exceptions: ExceptionHistory = ExceptionHistory()
    restarts: int = 0
    end: RecordedEnd | None = None
    stop: StopRequest | None = None
    term_fences: tuple[TermFence, ...] = ()

    def to_json(self) -> bytes:
        sub = self.submission
        document = {
            "format": RECORD_FORMAT,
            "submission": {
                "job_id": sub.job_id,
                "job_name": sub.job_name,
                "job_file_name": sub.job_file_name,
                "job_source": base64.b64encode(sub.job_source).decode("ascii"),
                "parameters": dict(sorted(sub.parameters.items())),
                "parallelism": sub.parallelism,
                "submitted_at": sub.submitted_at,
                **({"restored_from": sub.restored_from} if sub.restored_from else {}),
                **({"artifact_id": sub.artifact_id} if sub.artifact_id else {}),
            },
            "attempt": self.attempt,
            "status": self.status.value,
            "failure": _failure_to_json(self.failure),
            "records_in_all_attempts": [[uid, s, n] for (uid, s), n in sorted(self.records_in_all_attempts.items())],
            "checkpoint_ids_reserved_through": self.checkpoint_ids_reserved_through,
            "transactions_resolved": self.transactions_resolved,
            "exceptions": [_entry_to_json(e) for e in self.exceptions.entries],
            "restarts": self.restarts,
            **({"end": _end_to_json(self.end)} if self.end is not None else {}),
            **(
                {"stop": {"savepoint_id": self.stop.savepoint_id, "drain": self.stop.drain}}
                if self.stop is not None
                else {}
            ),
            **(
                {
                    "term_fences": [
                        {"term": f.term, "checkpoints_through": f.checkpoints_through} for f in self.term_fences
                    ]
                }
                if self.term_fences
                else {}
            ),
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "job record") -> JobRecord:
        document = load_versioned(
            data, where, RECORD_FORMAT, "was it written by a Weir older than format 1? It is left as it is"
        )
        try:
            sub = document["submission"]
            submission = JobSubmission(
                job_id=str(sub["job_id"]),
                job_name=str(sub["job_name"]),
                job_file_name=str(sub["job_file_name"]),
                job_source=base64.b64decode(sub["job_source"]),
                parameters={str(k): str(v) for k, v in sub["parameters"].items()},
                parallelism=int(sub["parallelism"]),
                submitted_at=float(sub["submitted_at"]),
                restored_from=str(sub.get("restored_from", "")),
                artifact_id=str(sub.get("artifact_id", "")),
            )
            return cls(
                submission=submission,
                attempt=int(document["attempt"]),
                status=JobStatus(document["status"]),
                failure=_failure_from_json(document["failure"]),
                records_in_all_attempts={(str(u), int(s)): int(n) for u, s, n in document["records_in_all_attempts"]},
                checkpoint_ids_reserved_through=int(document["checkpoint_ids_reserved_through"]),
                transactions_resolved=bool(document["transactions_resolved"]),
                exceptions=ExceptionHistory(tuple(_entry_from_json(e) for e in document.get("exceptions", ()))),
                restarts=int(document.get("restarts", 0)),
                end=_end_from_json(document["end"]) if document.get("end") is not None else None,
                stop=_stop_from_json(document["stop"]) if document.get("stop") is not None else None,
                term_fences=tuple(_fence_from_json(f) for f in document.get("term_fences", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SerializationError(f"{where} is malformed: {type(exc).__name__}: {exc}") from exc


def _failure_to_json(failure: Failure | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    return {
        "type": failure.type,
        "message": failure.message,
        "fault": failure.fault.value,
        "retriable": failure.retriable,
        **({"stacktrace": failure.stacktrace} if failure.stacktrace else {}),
    }


def _failure_from_json(document: dict[str, Any] | None) -> Failure | None:
    if document is None:
        return None
    return Failure(
        str(document["type"]),
        str(document["message"]),
        Fault(document["fault"]),
        bool(document["retriable"]),
        typed(document.get("stacktrace", ""), str),
    )


def _entry_to_json(entry: ExceptionEntry) -> dict[str, Any]:
    return {
        "failure": _failure_to_json(entry.failure),
        "timestamp": entry.timestamp,
        "attempt": entry.attempt,
        "vertex_uid": entry.vertex_uid,
        "subtask": entry.subtask,
        "taskmanager_id": entry.taskmanager_id,
    }


def _entry_from_json(document: dict[str, Any]) -> ExceptionEntry:
    failure = _failure_from_json(document["failure"])
    if failure is None:
        raise TypeError("an exception history entry without a failure")
    vertex_uid, subtask, taskmanager_id = document["vertex_uid"], document["subtask"], document["taskmanager_id"]
    return ExceptionEntry(
        failure=failure,
        timestamp=number(document["timestamp"]),
        attempt=typed(document["attempt"], int),
        vertex_uid=None if vertex_uid is None else typed(vertex_uid, str),
        subtask=None if subtask is None else typed(subtask, int),
        taskmanager_id=None if taskmanager_id is None else typed(taskmanager_id, str),
    )


def _end_to_json(end: RecordedEnd) -> dict[str, Any]:
    resolution = end.resolution
    return {
        "outcome": end.outcome.value,
        "ended": end.ended,
        "at": end.at,
        "resolution": None
        if resolution is None
        else {
            "as_of": resolution.as_of,
            "attempts": resolution.attempts,
            "resolved": resolution.resolved,
            "error": resolution.error,
        },
    }


def _end_from_json(document: dict[str, Any]) -> RecordedEnd:
    outcome = JobStatus(document["outcome"])
    if outcome not in (JobStatus.CANCELED, JobStatus.FAILED, JobStatus.FINISHED):
        raise ValueError(f"an end's outcome must be CANCELED, FAILED or FINISHED, not {outcome.value}")
    resolution = document["resolution"]
    return RecordedEnd(
        outcome=outcome,
        ended=typed(document["ended"], bool),
        at=number(document["at"]),
        resolution=None
        if resolution is None
        else Resolution(
            as_of=None if resolution["as_of"] is None else CheckpointId(typed(resolution["as_of"], int)),
            attempts=typed(resolution["attempts"], int),
            resolved=typed(resolution["resolved"], bool),
            error=typed(resolution["error"], str),
        ),
    )


def _stop_from_json(document: dict[str, Any]) -> StopRequest:
    return StopRequest(CheckpointId(typed(document["savepoint_id"], int)), typed(document["drain"], bool))


def _fence_from_json(document: dict[str, Any]) -> TermFence:
    through = document["checkpoints_through"]
    return TermFence(typed(document["term"], int), None if through is None else CheckpointId(typed(through, int)))
