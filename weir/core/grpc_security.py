"""The one place Weir opens gRPC channels and builds gRPC servers, secured by a
:class:`~weir.core.transport_security.TransportSecurity`: TLS credentials when configured, the bearer
token sent by a client interceptor and checked by a server interceptor, once per call or stream,
against the role the method needs (:data:`weir.core.roles.GRPC_METHOD_ROLES`): no token or not the
cluster's, UNAUTHENTICATED; the cluster's without the role, PERMISSION_DENIED.

``grpc.health.v1.Health`` stays open: probes (the supervisor's, Kubernetes') carry no token, and it
tells nothing but SERVING.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NamedTuple

import grpc
import structlog

from weir.core.roles import AccessTable, grpc_method_role
from weir.core.transport import GRPC_OPTIONS
from weir.core.transport_security import AUTHORIZATION, AuthDecision, TransportSecurity, authorize, refusal_message

log = structlog.get_logger("weir.security")

OPEN_SERVICE_PREFIXES: Final = ("/grpc.health.v1.Health/",)
"""Methods a server answers without a token."""

Options = Sequence[tuple[str, Any]]


def open_channel(address: str, security: TransportSecurity, options: Options = GRPC_OPTIONS) -> grpc.Channel:
    """A channel to ``address``: TLS when the security has client TLS, the token on every call."""
    channel_options = list(options)
    tls = security.client_tls
    if tls is None:
        channel = grpc.insecure_channel(address, options=channel_options)
    else:
        if tls.server_name is not None:
            channel_options.append(("grpc.ssl_target_name_override", tls.server_name))
        credentials = grpc.ssl_channel_credentials(tls.root_certificates, tls.private_key, tls.certificate_chain)
        channel = grpc.secure_channel(address, credentials, options=channel_options)
    authorization = security.authorization()
    if authorization is None:
        return channel
    return grpc.intercept_channel(channel, _TokenClientInterceptor(authorization))


def new_server(
    security: TransportSecurity,
    *,
    max_workers: int,
    thread_name_prefix: str,
    options: Options = GRPC_OPTIONS,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> grpc.Server:
    """A server whose calls (but health checks) need a token holding their role when tokens are configured;
    ``interceptors`` run after the token's check."""
    chain: list[grpc.ServerInterceptor] = [] if security.access is None else [TokenServerInterceptor(security.access)]
    chain.extend(interceptors)
    return grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix),
        interceptors=chain,
        options=list(options),
    )


def add_port(server: grpc.Server, address: str, security: TransportSecurity) -> int:
    """Listen on ``address`` (``host:port``), with TLS when the security has a server certificate;
    answers the port bound."""
    tls = security.server_tls
    if tls is None:
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials(
        [(tls.private_key, tls.certificate_chain)],
        root_certificates=tls.client_ca,
        require_client_auth=tls.requires_client_certificate,
    )
    return server.add_secure_port(address, credentials)


# Server side -----------------------------------------------------------------------------------------


class TokenServerInterceptor(grpc.ServerInterceptor):
    """Calls without one of the table's tokens end UNAUTHENTICATED, calls whose token lacks the
    method's role PERMISSION_DENIED, before any servicer code runs."""

    def __init__(self, access: AccessTable) -> None:
        self._access = access

    def __repr__(self) -> str:
        return "TokenServerInterceptor(token=<hidden>)"

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        if method.startswith(OPEN_SERVICE_PREFIXES):
            return continuation(details)
        header = next((str(v) for k, v in details.invocation_metadata or () if k == AUTHORIZATION), None)
        needed = grpc_method_role(method)
        decision = authorize(header, self._access, needed)
        if decision.allowed:
            return continuation(details)
        log.warning(
            "grpc_call_refused", method=method, decision=decision.value, needed=None if needed is None else needed.value
        )
        handler = continuation(details)
        if handler is None:
            return None
        forbidden = decision is AuthDecision.FORBIDDEN
        code = grpc.StatusCode.PERMISSION_DENIED if forbidden else grpc.StatusCode.UNAUTHENTICATED
        return _refusing(handler, code, refusal_message(decision, needed, method))


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that aborts with ``code``."""

    def refuse(_request: object, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    match (handler.request_streaming, handler.response_streaming):
        case (False, False):
            return grpc.unary_unary_rpc_method_handler(refuse, **serializers)
        case (False, True):
            return grpc.unary_stream_rpc_method_handler(refuse, **serializers)
        case (True, False):
            return grpc.stream_unary_rpc_method_handler(refuse, **serializers)
        case _:
            return grpc.stream_stream_rpc_method_handler(refuse, **serializers)


# Client side -----------------------------------------------------------------------------------------


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: tuple[tuple[str, str | bytes], ...] | None  # as grpc.ClientCallDetails has it
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):
    pass


class _TokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to each call's metadata (once per call or stream)."""

    def __init__(self, authorization: str) -> None:
        self._authorization = authorization

    def __repr__(self) -> str:
        return "TokenClientInterceptor(token=<hidden>)"

    def _with_token(self, details: grpc.ClientCallDetails) -> _ClientCallDetails:
        metadata = (*(details.metadata or ()), (AUTHORIZATION, self._authorization))
        return _ClientCallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, requests: Iterator[Any]
    ) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, requests: Iterator[Any]
    ) -> Any:
        return continuation(self._with_token(details), requests)


__all__ = ["AuthDecision", "TokenServerInterceptor", "add_port", "new_server", "open_channel"]
