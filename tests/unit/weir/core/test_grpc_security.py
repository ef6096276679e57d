"""Channels and servers of weir.core.grpc_security on loopback: the token interceptor on unary and
streaming calls, health checks left open, TLS and mutual TLS with certificates made here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.certificates import CertificateAuthority, tls_environment
from weir.core.grpc_security import add_port, new_server, open_channel
from weir.core.transport_security import TransportSecurity

TOKEN = "s3cret-token"
# Echo handlers under two methods of the real services: the interceptor decides by the method's role.
UNARY = "/weir.wire.JobManagerService/ListJobs"  # read
STREAM = "/weir.wire.TaskManagerService/OpenChannel"  # internal


def _unary(request: bytes, _context: grpc.ServicerContext) -> bytes:
    return request


def _stream(requests: Iterator[bytes], _context: grpc.ServicerContext) -> Iterator[bytes]:
    yield from requests


Serve = Callable[[TransportSecurity], str]
"""Start an echo server (and health) with this security on loopback; answers its address."""


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[grpc.Server] = []

    def start(security: TransportSecurity) -> str:
        server = new_server(security, max_workers=4, thread_name_prefix="test-grpc")
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "weir.wire.JobManagerService", {"ListJobs": grpc.unary_unary_rpc_method_handler(_unary)}
                ),
                grpc.method_handlers_generic_handler(
                    "weir.wire.TaskManagerService", {"OpenChannel": grpc.stream_stream_rpc_method_handler(_stream)}
                ),
            ]
        )
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        port = add_port(server, "127.0.0.1:0", security)
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    error = failed.value
    assert isinstance(error, grpc.Call)
    return error.code()


def test_a_call_without_or_with_a_wrong_token_is_unauthenticated_and_the_right_one_passes(serve: Serve) -> None:
    address = serve(TransportSecurity(token=TOKEN))
    for security in (TransportSecurity(), TransportSecurity(token="wrong")):
        with open_channel(address, security) as channel:
            assert _code(lambda: channel.unary_unary(UNARY)(b"x", timeout=10)) is grpc.StatusCode.UNAUTHENTICATED
            stream = channel.stream_stream(STREAM)
            assert _code(lambda: list(stream(iter([b"a"]), timeout=10))) is grpc.StatusCode.UNAUTHENTICATED  # noqa: B023
    with open_channel(address, TransportSecurity(token=TOKEN)) as channel:
        assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
        assert list(channel.stream_stream(STREAM)(iter([b"a", b"b"]), timeout=10)) == [b"a", b"b"]


def test_health_checks_need_no_token(serve: Serve) -> None:
    address = serve(TransportSecurity(token=TOKEN))
    with open_channel(address, TransportSecurity()) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_tls_with_a_token_works_and_a_client_trusting_another_ca_cannot_connect(serve: Serve, tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path, "weir-ca")
    other = CertificateAuthority.create(tmp_path, "other-ca")
    server_env = {**tls_environment(ca, ca.issue(tmp_path, "server"), client_ca=None), "WEIR_AUTH_TOKEN": TOKEN}
    address = serve(TransportSecurity.from_env(server_env))
    client = TransportSecurity.from_env({"WEIR_TLS_CA_FILE": str(ca.certificate_file), "WEIR_AUTH_TOKEN": TOKEN})
    with open_channel(address, client) as channel:
        assert channel.unary_unary(UNARY)(b"tls", timeout=10) == b"tls"
    plaintext = TransportSecurity(token=TOKEN)
    with open_channel(address, plaintext) as channel:
        assert _code(lambda: channel.unary_unary(UNARY)(b"x", timeout=10)) is grpc.StatusCode.UNAVAILABLE
    distrusting = TransportSecurity.from_env(
        {"WEIR_TLS_CA_FILE": str(other.certificate_file), "WEIR_AUTH_TOKEN": TOKEN}
    )
    with open_channel(address, distrusting) as channel:
        assert _code(lambda: channel.unary_unary(UNARY)(b"x", timeout=10)) is grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_a_client_whose_certificate_another_ca_signed(serve: Serve, tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path, "weir-ca")
    other = CertificateAuthority.create(tmp_path, "other-ca")
    address = serve(TransportSecurity.from_env(tls_environment(ca, ca.issue(tmp_path, "server"), client_ca=ca)))
    member = TransportSecurity.from_env(tls_environment(ca, ca.issue(tmp_path, "member"), client_ca=None))
    with open_channel(address, member) as channel:
        assert channel.unary_unary(UNARY)(b"m", timeout=10) == b"m"
    stranger = TransportSecurity.from_env(tls_environment(ca, other.issue(tmp_path, "stranger"), client_ca=None))
    with open_channel(address, stranger) as channel:
        assert _code(lambda: channel.unary_unary(UNARY)(b"x", timeout=10)) is grpc.StatusCode.UNAVAILABLE
    no_certificate = TransportSecurity.from_env({"WEIR_TLS_CA_FILE": str(ca.certificate_file)})
    with open_channel(address, no_certificate) as channel:
        assert _code(lambda: channel.unary_unary(UNARY)(b"x", timeout=10)) is grpc.StatusCode.UNAVAILABLE


def test_a_token_without_the_methods_role_is_permission_denied_naming_the_role(serve: Serve, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("read read-token\nsubmit submit-token\n")
    server = TransportSecurity.from_env({"WEIR_AUTH_TOKENS_FILE": str(tokens), "WEIR_INTERNAL_TOKEN": "internal"})
    address = serve(server)
    for token in ("read-token", "submit-token"):  # a client token, even with submit, opens no data channel
        with open_channel(address, TransportSecurity(token=token)) as channel:
            assert channel.unary_unary(UNARY)(b"hi", timeout=5) == b"hi"
            stream = channel.stream_stream(STREAM)
            with pytest.raises(grpc.RpcError) as refused:
                list(stream(iter([b"a"]), timeout=5))
            assert isinstance(refused.value, grpc.Call)
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "'internal'" in str(refused.value.details())
    with open_channel(address, server.for_cluster_peers()) as channel:  # the cluster's own token
        assert list(channel.stream_stream(STREAM)(iter([b"a", b"b"]), timeout=5)) == [b"a", b"b"]
        assert _code(lambda: channel.unary_unary(UNARY)(b"hi", timeout=5)) is grpc.StatusCode.PERMISSION_DENIED  # noqa: B023
