"""Flink's diagnostics endpoints (``docs/rest-api.md``, "Logs, thread dumps, accumulators"): the
JobManager's log files, thread dumps of the JobManager and the TaskManagers, and accumulators.

**Logs.** Weir's processes log to their standard error (structured lines, ``weir.core.logs``); the
JobManager has a log file when its standard error or output is a regular file, as under ``weir cluster
up``, whose supervisor appends both to ``$WEIR_RUN_DIR/cluster/jobmanager.log``. That file is what
``/jobmanager/logs`` lists and ``/jobmanager/log`` (its standard error) and ``/jobmanager/stdout`` serve;
on a terminal or a pipe (a container's log driver) there is none: an empty list and 404, as Flink
answers for a log file it does not have. A TaskManager's are asked over its gRPC service
(``weir.core.log_files``), and answered the same way.

**Accumulators.** Weir has no user accumulators (Flink's ``getRuntimeContext().addAccumulator``): the
answers are Flink's shapes with empty lists, so a Flink client or the web UI reads them as "none".
"""

from __future__ import annotations

from collections.abc import Sequence

from weir.core.log_files import LogFileInfo, LogFiles
from weir.core.log_files import LogSelector as LogSelector
from weir.core.log_files import file_of as file_of  # the app and its tests take them from here
from weir.core.log_files import process_log_files as process_log_files
from weir.core.thread_dump import ThreadInfo
from weir.jobmanager.rest.views import Model, _api, ms

# Logs -------------------------------------------------------------------------------------------


class LogInfo(Model):
    """Flink's ``LogInfo``."""

    name: str
    size: int
    mtime: int


class LogListInfo(Model):
    """Flink's ``LogListInfo``."""

    logs: list[LogInfo]


def log_list(files: LogFiles | Sequence[LogFileInfo]) -> LogListInfo:
    """Flink's list of log files: this process's (``LogFiles``), or a TaskManager's as it answered."""
    infos = files.infos() if isinstance(files, LogFiles) else files
    return LogListInfo(logs=[LogInfo(name=i.name, size=i.size, mtime=ms(i.mtime_s)) for i in infos])


# Thread dumps -----------------------------------------------------------------------------------


class ThreadDumpEntry(Model):
    """Flink's ``ThreadDumpInfo.ThreadInfo``."""

    thread_name: str = _api("threadName")
    stringified_thread_info: str = _api("stringifiedThreadInfo")


class ThreadDumpInfo(Model):
    """Flink's ``ThreadDumpInfo``."""

    thread_infos: list[ThreadDumpEntry] = _api("threadInfos")


def thread_dump_info(threads: Sequence[ThreadInfo]) -> ThreadDumpInfo:
    return ThreadDumpInfo(
        thread_infos=[ThreadDumpEntry(thread_name=t.name, stringified_thread_info=t.stack) for t in threads]
    )


# Accumulators -----------------------------------------------------------------------------------


class UserAccumulator(Model):
    """Flink's ``UserAccumulator`` (Weir has none to show)."""

    name: str
    type: str
    value: str


class JobAccumulatorsInfo(Model):
    """Flink's ``JobAccumulatorsInfo``: Weir has no accumulators, so every list is empty."""

    job_accumulators: list[UserAccumulator] = _api("job-accumulators")
    user_task_accumulators: list[UserAccumulator] = _api("user-task-accumulators")
    serialized_user_task_accumulators: dict[str, str] = _api("serialized-user-task-accumulators")


class JobVertexAccumulatorsInfo(Model):
    """Flink's ``JobVertexAccumulatorsInfo``."""

    id: str
    user_accumulators: list[UserAccumulator] = _api("user-accumulators")


def job_accumulators() -> JobAccumulatorsInfo:
    return JobAccumulatorsInfo(job_accumulators=[], user_task_accumulators=[], serialized_user_task_accumulators={})


def vertex_accumulators(vertex_id: str) -> JobVertexAccumulatorsInfo:
    return JobVertexAccumulatorsInfo(id=vertex_id, user_accumulators=[])


class SubtaskAccumulatorsInfo(Model):
    """Flink's ``SubtaskAccumulatorsInfo``."""

    subtask: int
    attempt: int
    host: str
    user_accumulators: list[UserAccumulator] = _api("user-accumulators")


class SubtasksAllAccumulatorsInfo(Model):
    """Flink's ``SubtasksAllAccumulatorsInfo``: each subtask of the vertex, with no accumulators."""

    id: str
    parallelism: int
    subtasks: list[SubtaskAccumulatorsInfo]


def subtasks_accumulators(
    vertex_id: str, parallelism: int, subtasks: Sequence[tuple[int, int, str]]
) -> SubtasksAllAccumulatorsInfo:
    """``subtasks``: each one's index, attempt and host."""
    return SubtasksAllAccumulatorsInfo(
        id=vertex_id,
        parallelism=parallelism,
        subtasks=[SubtaskAccumulatorsInfo(subtask=i, attempt=a, host=h, user_accumulators=[]) for i, a, h in subtasks],
    )
