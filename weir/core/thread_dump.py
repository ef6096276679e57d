"""A Python process's thread dump: every thread's name and stack, as Flink's ``ThreadInfo`` shows a
JVM thread (``"name" Id=N ...`` and one ``at`` line per frame, innermost first), for
``GET /jobmanager/thread-dump`` and ``GET /taskmanagers/{id}/thread-dump`` (``docs/rest-api.md``)."""

from __future__ import annotations

import sys
import threading
import traceback
from dataclasses import dataclass
from types import FrameType

MAX_FRAMES = 64
"""Frames shown per thread (Flink's ``cluster.thread-dump.stacktrace-max-depth`` is 50 by default)."""


@dataclass(frozen=True)
class ThreadInfo:
    """One thread: its name and its stack as text."""

    name: str
    stack: str


def thread_dump(prefix: str = "") -> tuple[ThreadInfo, ...]:
    """This process's threads, the main thread first, then by name; ``prefix`` goes before each name
    (a TaskManager's slot worker names its process so)."""
    frames = sys._current_frames()
    threads = sorted(threading.enumerate(), key=lambda t: (t is not threading.main_thread(), t.name, t.ident or 0))
    dump = []
    for thread in threads:
        frame = frames.get(thread.ident) if thread.ident is not None else None
        dump.append(ThreadInfo(prefix + thread.name, describe(thread, frame)))
    return tuple(dump)


def describe(thread: threading.Thread, frame: FrameType | None) -> str:
    """``"name" Id=<ident> [daemon] RUNNABLE`` and the stack, innermost frame first, Java's order."""
    flags = " daemon" if thread.daemon else ""
    state = "RUNNABLE" if thread.is_alive() else "TERMINATED"
    lines = [f'"{thread.name}" Id={thread.ident}{flags} native_id={thread.native_id} {state}']
    if frame is not None:
        summary = traceback.extract_stack(frame, limit=MAX_FRAMES)
        lines.extend(f"\tat {entry.name}({entry.filename}:{entry.lineno})" for entry in reversed(summary))
        if len(summary) == MAX_FRAMES:
            lines.append("\t...")
    return "\n".join(lines) + "\n"
