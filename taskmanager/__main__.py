"""``python -m weir.taskmanager --id taskmanager-1``: one TaskManager process."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from weir.core.extras import exit_without_server

# A client-only install (no `weir-streaming[server]`) ends here with one line naming the extra.
with exit_without_server("taskmanager", "a TaskManager"):
    import structlog
    from prometheus_client import PROCESS_COLLECTOR, REGISTRY

    from weir.connectors.object_storage import warn_when_unauthenticated
    from weir.core import logs
    from weir.core.config import (
        TaskManagerSettings,
        check_environment,
        exit_on_configuration_error,
        jobmanager_addresses,
        run_dir,
    )
    from weir.core.grpc_security import add_port, new_server
    from weir.core.metrics_http import serve_metrics
    from weir.core.transport_security import TransportSecurity
    from weir.taskmanager.identity import advertised_host, default_taskmanager_id
    from weir.taskmanager.runtime import TaskManagerRuntime
    from weir.taskmanager.service import add_to_server
    from weir.taskmanager.slot_metrics import ProcessTreeCollector, served_registry


def main() -> None:
    with exit_on_configuration_error("taskmanager"):
        check_environment()
    settings = TaskManagerSettings.from_env()
    parser = argparse.ArgumentParser(prog="python -m weir.taskmanager")
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
    parser.add_argument(
        "--slot-processes",
        action=argparse.BooleanOptionalAction,
        default=settings.taskmanager_slot_processes,
        help="run each slot's tasks in a worker process of its own (one core per slot)",
    )
    parser.add_argument("--metrics-port", type=int, default=settings.taskmanager_metrics_port)
    args = parser.parse_args()
    args.id = args.id or default_taskmanager_id()
    host = advertised_host(args.bind, args.host)
    with exit_on_configuration_error("taskmanager"):
        security = TransportSecurity.from_env()
        security.check_bind(args.bind, args.port, "WEIR_TASKMANAGER_BIND")
        if args.metrics_port:
            security.check_bind(args.bind, args.metrics_port, "WEIR_TASKMANAGER_BIND")

    os.environ["WEIR_TASKMANAGER_ID"] = args.id  # every thread (crash point scopes, logs) can name this process
    logs.configure(args.id)
    warn_when_unauthenticated()
    log = structlog.get_logger("weir.taskmanager")
    server = new_server(security, max_workers=256, thread_name_prefix="tm-grpc")
    port = add_port(server, f"{args.bind}:{args.port}", security)
    with exit_on_configuration_error("taskmanager"):  # e.g. S3 without credentials: one line, what was tried
        runtime = TaskManagerRuntime(
            args.id,
            f"{host}:{port}",
            jobmanager_addresses(),
            args.slots,
            run_dir(),
            local_channels=args.local_channels,
            security=security.for_cluster_peers(),
            slot_processes=args.slot_processes,
        )
    add_to_server(runtime, server)
    server.start()
    if args.metrics_port:
        workers = runtime.slot_processes
        if workers is None:
            serve_metrics(args.metrics_port, args.bind, security.access)
        else:  # the workers' task metrics and process figures are this TaskManager's too
            REGISTRY.unregister(PROCESS_COLLECTOR)
            REGISTRY.register(ProcessTreeCollector(workers.worker_pids))
            serve_metrics(
                args.metrics_port, args.bind, security.access, served_registry(REGISTRY, workers.collect_metrics)
            )
    log.info(
        "taskmanager_started",
        taskmanager_id=args.id,
        address=f"{host}:{port}",
        port=port,
        metrics_port=args.metrics_port,
        slots=args.slots,
        slot_processes=args.slot_processes,
        jobmanager=",".join(runtime.jobmanager_link.addresses),
        tls=security.server_tls is not None,
        token=security.access is not None,
        internal_token=security.internal_token is not None,
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
