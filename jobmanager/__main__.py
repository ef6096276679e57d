"""``python -m weir.jobmanager``: the JobManager process.

Start-up: the REST API first (``/healthz`` answers 503 ``starting`` while the jobs are taken over
from checkpoint storage), then the recovery, then the gRPC server, whose ``grpc.health.v1.Health``
answers SERVING from then on and NOT_SERVING once the process stops.

With high availability (``WEIR_HA_ENABLED``) the recovery waits until this JobManager holds the
leader lease (``weir.jobmanager.lease``): a standby serves its REST API (``starting``) and its
metrics (``weir_jobmanager_leader`` 0) and nothing else. A leader that loses the lease stops its gRPC
server and starts over as a standby by exec'ing itself: no thread, queued call or in-memory job of the
old leadership survives to act on.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import uuid

from weir.core.extras import exit_without_server

# A client-only install (no `weir-streaming[server]`) ends here with one line naming the extra.
with exit_without_server("jobmanager", "the JobManager"):
    import grpc
    import structlog
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from weir.connectors.object_storage import open_storage, warn_when_unauthenticated
    from weir.core import logs
    from weir.core.config import (
        Endpoints,
        HighAvailabilitySettings,
        JobManagerSettings,
        check_environment,
        checkpoint_dir,
        exit_on_configuration_error,
    )
    from weir.core.grpc_security import add_port, new_server
    from weir.core.metrics_http import serve_metrics
    from weir.core.transport_security import TransportSecurity
    from weir.jobmanager import metrics
    from weir.jobmanager.gateway import GrpcTaskManagerGateway
    from weir.jobmanager.leader_election import LeaderElection, LeaderTerm, LeaseTiming
    from weir.jobmanager.lease import FencedStorage, LeaderElector, LeaseStore
    from weir.jobmanager.manager import JobManager
    from weir.jobmanager.rest import views
    from weir.jobmanager.rest.app import create_app
    from weir.jobmanager.rest.server import RestServer
    from weir.jobmanager.service import JobManagerServicer, LeaderOnlyInterceptor
    from weir.wire import jobmanager_pb2, jobmanager_pb2_grpc

STEP_DOWN_DRAIN_S = 5.0
SERVICE_NAME = jobmanager_pb2.DESCRIPTOR.services_by_name["JobManagerService"].full_name


def main() -> None:
    with exit_on_configuration_error("jobmanager"):
        check_environment()
        ha = HighAvailabilitySettings.from_env()
    endpoints = Endpoints.from_env()
    default_port = int(endpoints.jobmanager_address.rsplit(":", 1)[1])
    parser = argparse.ArgumentParser(prog="python -m weir.jobmanager")
    parser.add_argument("--bind", default=JobManagerSettings.from_env().jobmanager_bind)
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--metrics-port", type=int, default=endpoints.jobmanager_metrics_port)
    parser.add_argument(
        "--rest-port", type=int, default=endpoints.jobmanager_rest_port, help="the REST API and web UI; 0: none"
    )
    args = parser.parse_args()
    with exit_on_configuration_error("jobmanager"):
        security = TransportSecurity.from_env()
        security.check_bind(args.bind, args.port, "WEIR_JOBMANAGER_BIND")
        if args.rest_port:
            security.check_bind(args.bind, args.rest_port, "WEIR_JOBMANAGER_BIND")
        if args.metrics_port:
            security.check_bind(args.bind, args.metrics_port, "WEIR_JOBMANAGER_BIND")

    logs.configure("jobmanager")
    warn_when_unauthenticated()
    log = structlog.get_logger("weir.jobmanager")
    with exit_on_configuration_error("jobmanager"):  # e.g. S3 without credentials: one line, what was tried
        storage = open_storage(checkpoint_dir(), endpoints)
    elector: LeaderElector | None = None
    leading = threading.Event()
    server_box: list[grpc.Server] = []
    if ha.ha_enabled:
        holder = f"{socket.gethostname()}:{args.port}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        timing = LeaseTiming(ha.ha_lease_duration_s, ha.ha_renew_interval_s, ha.ha_renew_deadline_s)

        def step_down(term: LeaderTerm, reason: str) -> None:
            # The record writes in flight end first: a creation the job index refuses withdraws its record.
            drained = jm.records.drain(STEP_DOWN_DRAIN_S)
            log.warning("jobmanager_restarting_as_standby", term=term, reason=reason, writes_drained=drained)
            for running in server_box:
                running.stop(grace=0)
            sys.stdout.flush()  # what is still buffered would be lost with the process image
            sys.stderr.flush()
            os.execv(sys.executable, sys.orig_argv)  # the same command: a standby from scratch

        elector = LeaderElector(
            LeaderElection(holder, ha.ha_advertised_address or f"{args.bind}:{args.port}", timing),
            LeaseStore(storage),
            on_leader=lambda _term: leading.set(),
            on_step_down=step_down,
        )
        storage = FencedStorage(storage, elector)
    jm = JobManager(
        storage,
        gateway=GrpcTaskManagerGateway(
            security.for_cluster_peers(), term=elector.term if elector is not None else None
        ),
        leader_term=elector.term if elector is not None else None,
    )
    rest = (
        RestServer(
            create_app(
                jm,
                access=security.access,
                settings_overrides={
                    "WEIR_JOBMANAGER_BIND": args.bind,
                    "WEIR_JOBMANAGER_PORT": str(args.port),
                    "WEIR_JOBMANAGER_METRICS_PORT": str(args.metrics_port),
                    "WEIR_JOBMANAGER_REST_PORT": str(args.rest_port),
                    "WEIR_CHECKPOINT_DIR": storage.uri,
                },
                known_leader=(lambda: views.known_leader(elector.known_leader())) if elector is not None else None,
            ),
            args.bind,
            args.rest_port,
            security,
        )
        if args.rest_port
        else None
    )
    if rest is not None:
        rest.start()
    metrics.leadership(elector.term if elector is not None else None)
    if args.metrics_port:  # a standby's too: weir_jobmanager_leader 0 (an alert sees a cluster with no leader)
        serve_metrics(args.metrics_port, args.bind, security.access)
    if elector is not None:
        elector.start()
        log.info("jobmanager_standby", holder=elector.election.holder)
        leading.wait()
    recovered = jm.recover_jobs()
    server = new_server(
        security,
        max_workers=32,
        thread_name_prefix="jm-grpc",
        interceptors=[LeaderOnlyInterceptor(lambda: elector.term() is not None)] if elector is not None else [],
    )
    server_box.append(server)
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(JobManagerServicer(jm), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    add_port(server, f"{args.bind}:{args.port}", security)
    server.start()
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    jm.start()
    log.info(
        "jobmanager_started",
        port=args.port,
        metrics_port=args.metrics_port,
        rest_port=rest.port if rest is not None else None,
        checkpoints=storage.uri,
        tls=security.server_tls is not None,
        client_certificates=security.server_tls is not None and security.server_tls.requires_client_certificate,
        token=security.access is not None,
        internal_token=security.internal_token is not None,
        recovered_jobs=recovered,
        leader_term=elector.term() if elector is not None else None,
        ended_jobs_loading=jm.recovery.history_pending(),
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    log.info("jobmanager_stopping")
    health_servicer.enter_graceful_shutdown()  # every service NOT_SERVING from now on
    jm.stop()
    if rest is not None:
        rest.stop()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
