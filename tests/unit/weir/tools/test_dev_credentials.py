"""weir.tools.dev_credentials: the certificate verifies against the CA and carries the cluster's names,
keys and tokens are private (Prometheus' read-only token excepted), the tokens file gives each token its
role and no more, a second run keeps everything, the settings accept the files, and a gRPC
call over loopback with them (TLS checked against the fixed cluster name, the token) passes."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from weir.core.config import SecuritySettings
from weir.core.grpc_security import add_port, new_server, open_channel
from weir.core.roles import Role
from weir.core.transport_security import TransportSecurity
from weir.tools.dev_credentials import CLUSTER_NAME, DevCredentials, generate, main


def _certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _names(certificate: x509.Certificate) -> set[str]:
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}


def test_the_certificate_is_the_cas_and_names_the_cluster(tmp_path: Path) -> None:
    credentials = generate(tmp_path / "dev", ["tm.example.test", "10.1.2.3"]).credentials
    ca, node = _certificate(credentials.ca_certificate), _certificate(credentials.certificate)
    node.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert node.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert _names(node) >= {CLUSTER_NAME, "jobmanager", "localhost", "127.0.0.1", "::1", "tm.example.test", "10.1.2.3"}
    usage = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in san.get_values_for_type(x509.IPAddress), "an IP is an IP SAN"


def test_keys_and_tokens_are_private_certificates_and_the_read_token_public(tmp_path: Path) -> None:
    credentials = generate(tmp_path).credentials
    for path in (
        credentials.ca_key,
        credentials.key,
        credentials.token,
        credentials.internal_token,
        credentials.tokens,
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # Prometheus runs as another user than the files' owner; its token grants read only (next test).
    for path in (credentials.ca_certificate, credentials.certificate, credentials.prometheus_token):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    tokens = [
        p.read_text().strip() for p in (credentials.token, credentials.internal_token, credentials.prometheus_token)
    ]
    assert all(len(t) >= 40 for t in tokens) and len(set(tokens)) == 3
    assert tokens[0] != generate(tmp_path / "other").credentials.token.read_text().strip()


def test_each_token_holds_its_role_and_no_more(tmp_path: Path) -> None:
    credentials = generate(tmp_path).credentials
    access = TransportSecurity.from_env(credentials.environment()).access
    assert access is not None

    def roles(path: Path) -> frozenset[Role] | None:
        return access.roles_of(path.read_text().strip())

    assert roles(credentials.token) == frozenset({Role.READ, Role.OPERATE, Role.SUBMIT}), (
        "a user on the host, as before"
    )
    assert roles(credentials.prometheus_token) == frozenset({Role.READ})
    assert roles(credentials.internal_token) == frozenset({Role.INTERNAL})
    assert credentials.token.read_text().strip() not in credentials.tokens.read_text(), "digests, not tokens"


def test_a_token_made_anew_is_written_into_the_tokens_file(tmp_path: Path) -> None:
    credentials = generate(tmp_path).credentials
    credentials.prometheus_token.unlink()
    assert set(generate(tmp_path).written) == {credentials.prometheus_token, credentials.tokens}
    access = TransportSecurity.from_env(credentials.environment()).access
    assert access is not None and access.roles_of(credentials.prometheus_token.read_text()) == frozenset({Role.READ})


def test_a_second_run_keeps_every_file(tmp_path: Path) -> None:
    first = generate(tmp_path)
    assert len(first.written) == 8
    before = {p: p.read_bytes() for p in first.written}
    again = generate(tmp_path)
    assert again.written == ()
    assert {p: p.read_bytes() for p in first.written} == before


def test_a_missing_name_or_a_new_ca_reissues_the_certificate_only(tmp_path: Path) -> None:
    credentials = generate(tmp_path).credentials
    token, ca = credentials.token.read_bytes(), credentials.ca_certificate.read_bytes()
    assert set(generate(tmp_path, ["extra.example.test"]).written) == {credentials.certificate, credentials.key}
    assert "extra.example.test" in _names(_certificate(credentials.certificate))
    assert credentials.ca_certificate.read_bytes() == ca and credentials.token.read_bytes() == token
    credentials.ca_key.unlink()
    rewritten = set(generate(tmp_path).written)
    assert rewritten == {credentials.ca_certificate, credentials.ca_key, credentials.certificate, credentials.key}
    _certificate(credentials.certificate).verify_directly_issued_by(_certificate(credentials.ca_certificate))


def test_the_settings_accept_the_files(tmp_path: Path) -> None:
    credentials = generate(tmp_path).credentials
    env = credentials.environment()
    settings = SecuritySettings.from_env(env)
    assert settings.tls_server_name == CLUSTER_NAME and settings.auth_token_file == credentials.token
    security = TransportSecurity.from_env(env)
    assert security.token == credentials.token.read_text().strip()
    assert security.server_tls is not None and security.server_tls.certificate_file == credentials.certificate
    assert not security.server_tls.requires_client_certificate
    assert security.client_tls is not None and security.client_tls.server_name == CLUSTER_NAME
    assert security.client_tls.root_certificates == credentials.ca_certificate.read_bytes()


def _echo(request: bytes, _context: grpc.ServicerContext) -> bytes:
    return request


@pytest.mark.parametrize("client_ca", [False, True], ids=["tls", "mutual-tls"])
def test_a_call_with_the_files_passes_tls_and_the_token(tmp_path: Path, client_ca: bool) -> None:
    credentials = generate(tmp_path).credentials
    env = credentials.environment()
    if client_ca:
        env["WEIR_TLS_CLIENT_CA_FILE"] = str(credentials.ca_certificate)
    security = TransportSecurity.from_env(env)
    server = new_server(security, max_workers=2, thread_name_prefix="test-dev-credentials")
    server.add_generic_rpc_handlers(
        [  # an echo under a method of the real service: the server checks the method's role (read)
            grpc.method_handlers_generic_handler(
                "weir.wire.JobManagerService", {"ListJobs": grpc.unary_unary_rpc_method_handler(_echo)}
            )
        ]
    )
    # 127.0.0.2: an address the certificate does not name, like a TaskManager's IP: the fixed name is checked.
    port = add_port(server, "127.0.0.2:0", security)
    server.start()
    try:
        with open_channel(f"127.0.0.2:{port}", security) as channel:
            # wait_for_ready: a TLS handshake slower than gRPC's connect attempt on a loaded machine is retried
            call = channel.unary_unary("/weir.wire.JobManagerService/ListJobs")
            assert call(b"hello", timeout=60, wait_for_ready=True) == b"hello"
        without_token = TransportSecurity.from_env({k: v for k, v in env.items() if k != "WEIR_AUTH_TOKEN_FILE"})
        with open_channel(f"127.0.0.2:{port}", without_token) as channel, pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary("/weir.wire.JobManagerService/ListJobs")(b"hello", timeout=60, wait_for_ready=True)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        wrong_name = TransportSecurity.from_env({**env, "WEIR_TLS_SERVER_NAME": "someone-else"})
        with open_channel(f"127.0.0.2:{port}", wrong_name) as channel, pytest.raises(grpc.RpcError) as mismatch:
            channel.unary_unary("/weir.wire.JobManagerService/ListJobs")(b"hello", timeout=10)
        assert mismatch.value.code() is grpc.StatusCode.UNAVAILABLE, "a name the certificate lacks fails the handshake"
    finally:
        server.stop(None)


def test_main_reports_what_it_wrote_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "dev")]) == 0
    assert "wrote ca.crt" in capsys.readouterr().out
    assert main([str(tmp_path / "dev")]) == 0
    assert "all kept" in capsys.readouterr().out
    assert DevCredentials(tmp_path / "dev").token.exists()


def test_main_says_in_one_line_why_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main([str(blocker)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(blocker) in err
