"""Named crash points: recovery tests make a process die at an exact step of a protocol.

A point is armed through the environment of the process (the local cluster's supervisor passes its
environment on to the JobManager and TaskManagers it starts)::

    WEIR_CRASH_POINT=after_pre_commit                  the first time any subtask reaches it
    WEIR_CRASH_POINT=after_pre_commit:3                the third time it is reached in this process
    WEIR_CRASH_POINTS=after_pre_commit@taskmanager-2,between_sink_commits#1:2

With ``WEIR_CRASH_ONCE_DIR=<dir>`` a point fires once per cluster, not once per process: firing leaves
a marker file there, and a restarted process (the supervisor keeps its environment) skips the points
that already fired. Recovery tests and ``make demo`` use it to crash exactly once.

A spec is ``name[@taskmanager][#subtask][:count]``: ``@`` scopes it to one TaskManager, ``#`` to one
subtask index; ``count`` (default 1) says which matching visit kills the process. Only visits that
match the scope are counted. When an armed point fires, the process logs ``crash_point_hit`` and
leaves with ``os._exit(137)`` (as if SIGKILLed): no ``finally``, no flush, no close.

A point armed with ``WEIR_PAUSE_POINTS`` (same specs) stops the process instead: it logs
``pause_point_hit`` and sends itself SIGSTOP, frozen at that exact step as a paused process is (a
long GC, a suspended VM) until a test sends SIGCONT, and then goes on. High-availability tests pause a
leader JobManager this way between its lease check and a write.

Unarmed, ``crash_point`` costs two set lookups.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from weir.core.config import CrashPointSettings, TaskManagerSettings
from weir.core.errors import ConfigurationError, Fault

EXIT_CODE: Final = 137
"""What a SIGKILLed process reports (128 + 9), so supervisors treat the exit as a crash."""

AFTER_PRE_COMMIT: Final = "after_pre_commit"
"""A sink pre-committed at a barrier (PREPARE TRANSACTION done, Kafka transaction flushed), before the
task acknowledges the checkpoint."""
AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT: Final = "after_checkpoint_complete_before_commit"
"""A sink received the completion notification of a checkpoint covering a transaction, before it commits."""
BETWEEN_SINK_COMMITS: Final = "between_sink_commits"
"""At the start of the PostgreSQL two-phase sink's commit: a Kafka sink earlier in the same chain has
committed the checkpoint, the PostgreSQL sink has not."""
DURING_SNAPSHOT_UPLOAD: Final = "during_snapshot_upload"
"""While a TaskManager uploads a keyed-state snapshot (call site: ``taskmanager/snapshots.py``)."""
AFTER_SINK_END_OF_INPUT: Final = "after_sink_end_of_input"
"""A transactional sink of a bounded job ended its input (everything it wrote was committed through the
final checkpoint), before its task reports FINISHED: the job fails over and restores the final checkpoint."""

BEFORE_JOB_RECORD_CREATE: Final = "before_job_record_create"
"""A leader JobManager checked its lease for a new job's first record write, and has not sent it yet."""

KNOWN_POINTS: Final = frozenset(
    {
        BEFORE_JOB_RECORD_CREATE,
        AFTER_PRE_COMMIT,
        AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT,
        BETWEEN_SINK_COMMITS,
        DURING_SNAPSHOT_UPLOAD,
        AFTER_SINK_END_OF_INPUT,
    }
)

_SPEC = re.compile(r"(?P<name>[a-z_][a-z0-9_]*)(?:@(?P<tm>[^#:@,]+))?(?:#(?P<subtask>[0-9]+))?(?::(?P<count>[0-9]+))?")


class CrashPointSpecError(ConfigurationError):
    """``WEIR_CRASH_POINT(S)`` names an unknown point or is malformed: fix the variable and restart."""

    fault: Fault = Fault.USER


@dataclass(frozen=True)
class CrashPointSpec:
    """One armed point: which visits match, and which matching visit kills the process."""

    name: str
    count: int = 1
    taskmanager: str | None = None
    subtask: int | None = None
    pause: bool = False  # armed by WEIR_PAUSE_POINTS: the process stops itself there, not exits

    def matches(self, name: str, context: Mapping[str, Any]) -> bool:
        if name != self.name:
            return False
        if self.taskmanager is not None and str(context.get("taskmanager")) != self.taskmanager:
            return False
        return self.subtask is None or context.get("subtask") == self.subtask

    def __str__(self) -> str:
        scope = (f"@{self.taskmanager}" if self.taskmanager else "") + (
            f"#{self.subtask}" if self.subtask is not None else ""
        )
        return f"{self.name}{scope}:{self.count}"


def parse_spec(text: str, *, pause: bool = False) -> CrashPointSpec:
    """``name[@taskmanager][#subtask][:count]``; the name must be one of ``KNOWN_POINTS``."""
    match = _SPEC.fullmatch(text.strip())
    if match is None:
        raise CrashPointSpecError(
            f"crash point {text!r} is malformed: write name[@taskmanager][#subtask][:count], "
            "e.g. after_pre_commit@taskmanager-2#0:3"
        )
    name = match["name"]
    if name not in KNOWN_POINTS:
        raise CrashPointSpecError(f"unknown crash point {name!r}; known points: {', '.join(sorted(KNOWN_POINTS))}")
    count = int(match["count"]) if match["count"] is not None else 1
    if count < 1:
        raise CrashPointSpecError(f"crash point {text!r}: the count must be at least 1")
    subtask = int(match["subtask"]) if match["subtask"] is not None else None
    return CrashPointSpec(name, count, match["tm"], subtask, pause)


def specs_from_env(environ: Mapping[str, str] | None = None) -> tuple[CrashPointSpec, ...]:
    """The points armed by ``WEIR_CRASH_POINT`` and ``WEIR_CRASH_POINTS`` (comma-separated), and the
    pauses armed by ``WEIR_PAUSE_POINTS``."""
    settings = CrashPointSettings.from_env(environ)
    texts = [settings.crash_point or ""] + (settings.crash_points or "").split(",")
    pauses = (settings.pause_points or "").split(",")
    specs = tuple(parse_spec(text) for text in texts if text.strip()) + tuple(
        parse_spec(text, pause=True) for text in pauses if text.strip()
    )
    once_dir = settings.crash_once_dir
    if once_dir is not None:
        specs = tuple(spec for spec in specs if not _fired_marker(once_dir, spec).exists())
    return specs


def _fired_marker(once_dir: Path, spec: CrashPointSpec) -> Path:
    return once_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", ("pause-" if spec.pause else "") + str(spec))


class CrashPoints:
    """The armed points of one process and how often each was matched; ``visit`` decides, pure."""

    def __init__(self, specs: Iterable[CrashPointSpec] = ()) -> None:
        self._specs = tuple(specs)
        self._names = frozenset(spec.name for spec in self._specs)
        self._visits: dict[CrashPointSpec, int] = dict.fromkeys(self._specs, 0)
        self._lock = threading.Lock()

    @property
    def specs(self) -> tuple[CrashPointSpec, ...]:
        return self._specs

    @property
    def names(self) -> frozenset[str]:
        return self._names

    def visit(self, name: str, context: Mapping[str, Any]) -> CrashPointSpec | None:
        """Count this visit against every armed spec it matches; the spec whose count it reaches, if any."""
        if name not in self._names:
            return None
        fired: CrashPointSpec | None = None
        with self._lock:
            for spec in self._specs:
                if spec.matches(name, context):
                    self._visits[spec] += 1
                    if self._visits[spec] == spec.count and fired is None:
                        fired = spec
        return fired

    def visits(self, spec: CrashPointSpec) -> int:
        return self._visits.get(spec, 0)


def process_name() -> str | None:
    """The name this process logs under (``taskmanager-2``: set by ``weir.core.logs.configure``), else
    ``$WEIR_TASKMANAGER_ID``: what an ``@taskmanager`` scope is matched against when the call site
    does not pass ``taskmanager``."""
    from weir.core.logs import process_name as logged_name

    name = logged_name()
    return str(name) if name else TaskManagerSettings.from_env().taskmanager_id


def _exit_hard(code: int) -> None:
    os._exit(code)


def _stop_self() -> None:
    # To the calling thread: it stops on its way out of this call (a stop sent to the process stops
    # the other threads at once but may let this one run on for a moment).
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


_armed: CrashPoints | None = None
_arm_lock = threading.Lock()
_exit: Callable[[int], None] = _exit_hard
_pause: Callable[[], None] = _stop_self


def armed() -> CrashPoints:
    """This process's armed points, read from the environment on first use."""
    global _armed
    if _armed is None:
        with _arm_lock:
            if _armed is None:
                _armed = CrashPoints(specs_from_env())
    return _armed


def arm(specs: Iterable[CrashPointSpec] | None = None) -> CrashPoints:
    """Replace the armed points (None: read the environment again); visit counts start over."""
    global _armed
    with _arm_lock:
        _armed = CrashPoints(specs_from_env() if specs is None else specs)
        return _armed


def crash_point(name: str, **context: Any) -> None:
    """Exit the process hard if an armed spec of point ``name`` matches ``context`` for the count-th time
    (stop it, for a pause spec: it goes on once woken).

    ``context`` should carry ``subtask`` for ``#``-scoped specs (``taskmanager`` defaults to the
    process's name), and whatever helps read the log (job, operator uid, checkpoint id)."""
    if name not in KNOWN_POINTS:
        raise ValueError(f"crash_point({name!r}): not a known crash point; add it to weir.core.crashpoints")
    points = armed()
    if name not in points.names:
        return
    if "taskmanager" not in context:
        context["taskmanager"] = process_name()
    spec = points.visit(name, context)
    if spec is None:
        return
    once_dir = CrashPointSettings.from_env().crash_once_dir
    if once_dir is not None:
        marker = _fired_marker(once_dir, spec)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    event = "pause_point_hit" if spec.pause else "crash_point_hit"
    structlog.get_logger("weir.core.crashpoints").critical(event, point=name, spec=str(spec), **context)
    sys.stdout.flush()
    sys.stderr.flush()
    if spec.pause:
        _pause()
        structlog.get_logger("weir.core.crashpoints").warning("pause_point_woken", point=name, **context)
        return
    _exit(EXIT_CODE)
