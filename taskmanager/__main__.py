"""``python -m taskmanager --id taskmanager-1``: one TaskManager process."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from concurrent import futures

import grpc
import structlog
from prometheus_client import start_http_server

from taskmanager.identity import advertised_host, default_taskmanager_id
from taskmanager.runtime import TaskManagerRuntime
from taskmanager.service import TaskManagerServicer
from weir.core import logs
from weir.core.config import Endpoints, TaskManagerSettings, check_environment, exit_on_configuration_error, run_dir
from weir.core.transport import GRPC_OPTIONS
from weir.wire import taskmanager_pb2_grpc


def main() -> None:
    with exit_on_configuration_error("taskmanager"):
        check_environment()
    settings = TaskManagerSettings.from_env()
    parser = argparse.ArgumentParser(prog="python -m taskmanager")
    parser.add_argument("--id", default=settings.taskmanager_id, help="default: the host name (a container's own)")
    parser.add_argument(
        "--host",
        default=settings.taskmanager_host,
        help="address other processes reach this TaskManager at; default: the bind address, or with --bind 0.0.0.0 "
        "the address the host name resolves to",
    )
    parser.add_argument("--bind", default=settings.taskmanager_bind)
    parser.add_argument("--port", type=int, default=settings.taskmanager_port)
    parser.add_argument("--slots", type=int, default=settings.taskmanager_slots)
    parser.add_argument(
        "--local-channels",
        action=argparse.BooleanOptionalAction,
        default=settings.taskmanager_local_channels,
        help="hand buffers to consumers in this TaskManager in memory, not over gRPC",
    )
    parser.add_argument("--metrics-port", type=int, default=settings.taskmanager_metrics_port)
    args = parser.parse_args()
    args.id = args.id or default_taskmanager_id()
    host = advertised_host(args.bind, args.host)

    os.environ["WEIR_TASKMANAGER_ID"] = args.id  # every thread (crash point scopes, logs) can name this process
    logs.configure(args.id)
    log = structlog.get_logger("weir.taskmanager")
    endpoints = Endpoints.from_env()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="tm-grpc"), options=GRPC_OPTIONS
    )
    port = server.add_insecure_port(f"{args.bind}:{args.port}")
    runtime = TaskManagerRuntime(
        args.id,
        f"{host}:{port}",
        endpoints.jobmanager_address,
        args.slots,
        run_dir(),
        local_channels=args.local_channels,
    )
    taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(TaskManagerServicer(runtime), server)
    server.start()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind)
    log.info(
        "taskmanager_started",
        taskmanager_id=args.id,
        address=f"{host}:{port}",
        port=port,
        metrics_port=args.metrics_port,
        slots=args.slots,
        jobmanager=endpoints.jobmanager_address,
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    heartbeats = threading.Thread(target=runtime.heartbeat_loop, args=(args.metrics_port,), daemon=True)
    heartbeats.start()
    stop.wait()
    log.info("taskmanager_stopping", taskmanager_id=args.id)
    runtime.stop()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
