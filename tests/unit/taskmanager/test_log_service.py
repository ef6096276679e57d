"""A TaskManager's log files over its gRPC service: the JobManager's gateway against the real servicer
on a loopback port (ListLogs, ReadLog in chunks; NOT_FOUND for a file it does not list)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import cast

import grpc
import pytest

from weir.core.log_files import LogFiles, LogSelector
from weir.jobmanager.errors import TaskManagerCallError
from weir.jobmanager.gateway import GrpcTaskManagerGateway
from weir.taskmanager.runtime import TaskManagerRuntime
from weir.taskmanager.service import TaskManagerServicer
from weir.wire import taskmanager_pb2_grpc


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, LogFiles]]]:
    log = tmp_path / "taskmanager-1.log"
    files = {"now": LogFiles(log=log, stdout=log)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = TaskManagerServicer(cast(TaskManagerRuntime, None), log_files=lambda: files["now"])
    taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", log, files
    server.stop(grace=0)


def test_a_log_larger_than_one_message_is_read_whole_in_chunks(served: tuple[str, Path, dict[str, LogFiles]]) -> None:
    address, log, _ = served
    lines = [f'{{"event": "line {n}", "pad": "{"x" * 100}"}}\n' for n in range(60_000)]  # ~7 MiB: > 4 MiB
    log.write_text("".join(lines))
    gateway = GrpcTaskManagerGateway()
    (listed,) = gateway.list_logs(address)
    assert (listed.name, listed.size) == ("taskmanager-1.log", log.stat().st_size)
    assert abs(listed.mtime_s - log.stat().st_mtime) < 0.001
    chunks = list(gateway.read_log(address, LogSelector.LOG))
    assert len(chunks) > 1
    assert b"".join(chunks) == log.read_bytes()
    assert b"".join(gateway.read_log(address, LogSelector.NAMED, "taskmanager-1.log")) == log.read_bytes()


def test_a_file_the_taskmanager_does_not_list_is_not_found(served: tuple[str, Path, dict[str, LogFiles]]) -> None:
    address, log, files = served
    log.write_text("x\n")
    gateway = GrpcTaskManagerGateway()
    for selector, name in ((LogSelector.NAMED, "../../etc/passwd"), (LogSelector.NAMED, "other.log")):
        with pytest.raises(TaskManagerCallError) as refused:
            gateway.read_log(address, selector, name)
        assert refused.value.code == "NOT_FOUND" and repr(name) in refused.value.details
    files["now"] = LogFiles(log=None, stdout=None)  # a terminal or a pipe
    assert gateway.list_logs(address) == ()
    with pytest.raises(TaskManagerCallError, match="NOT_FOUND.*terminal or a pipe"):
        gateway.read_log(address, LogSelector.STDOUT)
