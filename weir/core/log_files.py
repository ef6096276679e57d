"""A process's log files: the regular files its standard error (the log) and output are written to.

Weir's processes log to their standard error (``weir.core.logs``); under ``weir cluster up`` the
supervisor appends each child's standard error and output to ``$WEIR_RUN_DIR/cluster/<name>.log``, so
that file is the process's log. On a terminal or a pipe (a container's log driver) there is none. The
JobManager serves its own (``/jobmanager/logs``) and asks a TaskManager for its own over the
TaskManagerService (``ListLogs``, ``ReadLog``), as Flink's ``/taskmanagers/:id/logs`` does.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final

STDOUT_FD: Final = 1
STDERR_FD: Final = 2
CHUNK_BYTES: Final = 256 * 1024  # one gRPC message of a log being read (well under the 4 MiB limit)


class LogSelector(Enum):
    """Which file to read: the log (standard error), the standard output, or one listed by name."""

    LOG = "log"
    STDOUT = "stdout"
    NAMED = "named"


@dataclass(frozen=True)
class LogFileInfo:
    """One listed file: its name, size in bytes and last modification (epoch seconds)."""

    name: str
    size: int
    mtime_s: float


@dataclass(frozen=True)
class LogFiles:
    """The files this process's standard error (``log``) and output (``stdout``) are written to;
    None: not a regular file."""

    log: Path | None
    stdout: Path | None

    def listed(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(p for p in (self.log, self.stdout) if p is not None))

    def named(self, name: str) -> Path | None:
        """The listed file called ``name`` (only those: a path never reaches another file)."""
        return next((p for p in self.listed() if p.name == name), None)

    def selected(self, selector: LogSelector, name: str = "") -> Path | None:
        match selector:
            case LogSelector.LOG:
                return self.log
            case LogSelector.STDOUT:
                return self.stdout
            case LogSelector.NAMED:
                return self.named(name)

    def infos(self) -> tuple[LogFileInfo, ...]:
        found = []
        for path in self.listed():
            try:
                info = path.stat()
            except OSError:
                continue  # rotated away meanwhile
            found.append(LogFileInfo(path.name, info.st_size, info.st_mtime))
        return tuple(found)


def file_of(fd: int, resolve: Callable[[int], str] = lambda fd: os.readlink(f"/proc/self/fd/{fd}")) -> Path | None:
    """The regular file ``fd`` writes to; None for a terminal, a pipe, a socket or a deleted file."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        path = Path(resolve(fd))
    except OSError:
        return None
    return path if path.is_absolute() and path.is_file() else None


def process_log_files() -> LogFiles:
    return LogFiles(log=file_of(STDERR_FD), stdout=file_of(STDOUT_FD))


def read_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The file's bytes as they are now, in chunks (OSError when it cannot be opened)."""
    with path.open("rb") as file:
        while chunk := file.read(chunk_bytes):
            yield chunk
