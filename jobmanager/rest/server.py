"""The REST API's HTTP server: uvicorn in a thread of the JobManager process, beside the gRPC server."""

from __future__ import annotations

import ssl
import threading
import time
from typing import Final

import structlog
import uvicorn
from fastapi import FastAPI

from weir.core.transport_security import TransportSecurity
from weir.jobmanager.errors import ConfigError

log = structlog.get_logger("weir.jobmanager")

START_TIMEOUT_S: Final = 10.0
STOP_TIMEOUT_S: Final = 5.0


class RestServer:
    def __init__(self, app: FastAPI, host: str, port: int, security: TransportSecurity | None = None) -> None:
        """``port`` 0 takes a free one (``port`` answers which, once started). HTTPS when ``security``
        has a server certificate; a client certificate is required when it names a client CA (the
        bearer token is checked by the app, ``create_app(token=...)``)."""
        self._host = host
        self._requested_port = port
        tls = security.server_tls if security is not None else None
        client_ca = tls.client_ca_file if tls is not None else None
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                ssl_certfile=str(tls.certificate_file) if tls is not None else None,
                ssl_keyfile=str(tls.key_file) if tls is not None else None,
                ssl_ca_certs=str(client_ca) if client_ca is not None else None,
                ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca is not None else ssl.CERT_NONE,
                lifespan="off",
                log_config=None,  # uvicorn's own loggers stay quiet; the JobManager logs with structlog
                access_log=False,
                timeout_graceful_shutdown=2,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="jm-rest", daemon=True)

    def start(self) -> None:
        """Listen, or raise ConfigError when the port cannot be bound (taken by another process)."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(0.02)  # uvicorn says nothing but ``started``: poll it, with a deadline
        if not self._server.started:
            self._server.should_exit = True
            raise ConfigError(
                "WEIR_JOBMANAGER_REST_PORT",
                f"the REST API could not listen on {self._host}:{self._requested_port}: is the port taken? "
                "Free it, set WEIR_JOBMANAGER_REST_PORT, or start the JobManager with --rest-port 0 (no REST API)",
            )
        log.info("rest_server_started", host=self._host, port=self.port, tls=self._server.config.is_ssl)

    @property
    def port(self) -> int:
        for server in self._server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self._requested_port

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(STOP_TIMEOUT_S)
