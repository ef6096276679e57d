"""``python -m jobmanager``: the JobManager process."""

from __future__ import annotations

import argparse
import signal
import threading
from concurrent import futures

import grpc
import structlog
from prometheus_client import start_http_server

from connectors.object_storage import open_storage
from jobmanager.manager import JobManager
from jobmanager.service import JobManagerServicer
from weir.core import logs
from weir.core.config import (
    Endpoints,
    JobManagerSettings,
    check_environment,
    checkpoint_dir,
    exit_on_configuration_error,
)
from weir.core.transport import GRPC_OPTIONS
from weir.wire import jobmanager_pb2_grpc


def main() -> None:
    with exit_on_configuration_error("jobmanager"):
        check_environment()
    endpoints = Endpoints.from_env()
    default_port = int(endpoints.jobmanager_address.rsplit(":", 1)[1])
    parser = argparse.ArgumentParser(prog="python -m jobmanager")
    parser.add_argument("--bind", default=JobManagerSettings.from_env().jobmanager_bind)
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--metrics-port", type=int, default=endpoints.jobmanager_metrics_port)
    args = parser.parse_args()

    logs.configure("jobmanager")
    log = structlog.get_logger("weir.jobmanager")
    storage = open_storage(checkpoint_dir(), endpoints)
    jm = JobManager(storage)
    recovered = jm.recover_jobs()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="jm-grpc"), options=GRPC_OPTIONS)
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(JobManagerServicer(jm), server)
    server.add_insecure_port(f"{args.bind}:{args.port}")
    server.start()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind)
    jm.start()
    log.info(
        "jobmanager_started",
        port=args.port,
        metrics_port=args.metrics_port,
        checkpoints=storage.uri,
        recovered_jobs=recovered,
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    log.info("jobmanager_stopping")
    jm.stop()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
