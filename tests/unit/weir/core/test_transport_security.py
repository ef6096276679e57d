"""The pure parts of transport security: the settings' rules, the token decision, the bind refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.core.config import SecuritySettings, check_environment
from weir.core.errors import ConfigurationError
from weir.core.roles import AccessTable, Role
from weir.core.transport_security import AuthDecision, TransportSecurity, authorize, is_loopback, refusal_message

TOKEN = "correct-horse-battery-staple"


@pytest.mark.parametrize(
    ("header", "token", "decision"),
    [
        (None, None, AuthDecision.OPEN),
        ("Bearer anything", None, AuthDecision.OPEN),
        (f"Bearer {TOKEN}", TOKEN, AuthDecision.ACCEPTED),
        (f"bearer {TOKEN}", TOKEN, AuthDecision.ACCEPTED),
        (f"Bearer {TOKEN} ", TOKEN, AuthDecision.ACCEPTED),
        (None, TOKEN, AuthDecision.MISSING),
        (TOKEN, TOKEN, AuthDecision.MISSING),
        (f"Basic {TOKEN}", TOKEN, AuthDecision.MISSING),
        ("Bearer ", TOKEN, AuthDecision.REJECTED),
        ("Bearer wrong", TOKEN, AuthDecision.REJECTED),
        (f"Bearer {TOKEN}x", TOKEN, AuthDecision.REJECTED),
        ("Bearer é", TOKEN, AuthDecision.REJECTED),
    ],
)
def test_a_call_is_decided_by_its_bearer_token(header: str | None, token: str | None, decision: AuthDecision) -> None:
    assert authorize(header, None if token is None else AccessTable.single(token), Role.SUBMIT) is decision
    assert decision.allowed == (decision in (AuthDecision.OPEN, AuthDecision.ACCEPTED))


def test_a_refusal_names_the_variables_to_set_never_the_token() -> None:
    for decision in (AuthDecision.MISSING, AuthDecision.REJECTED):
        message = refusal_message(decision)
        assert "WEIR_AUTH_TOKEN" in message
        assert TOKEN not in message


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("jobmanager", False),
        ("", False),
    ],
)
def test_only_loopback_addresses_count_as_local(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_non_loopback_bind_without_a_token_is_refused_naming_address_and_variables() -> None:
    with pytest.raises(ConfigurationError) as refused:
        TransportSecurity().check_bind("0.0.0.0", 6123, "WEIR_JOBMANAGER_BIND")
    message = str(refused.value)
    assert "0.0.0.0:6123" in message
    assert "WEIR_AUTH_TOKEN" in message and "WEIR_JOBMANAGER_BIND" in message
    assert "\n" not in message
    TransportSecurity().check_bind("127.0.0.1", 6123, "WEIR_JOBMANAGER_BIND")
    TransportSecurity(token=TOKEN).check_bind("0.0.0.0", 6123, "WEIR_JOBMANAGER_BIND")


def test_the_token_comes_from_the_variable_or_a_file(tmp_path: Path) -> None:
    assert TransportSecurity.from_env({}).token is None
    assert TransportSecurity.from_env({"WEIR_AUTH_TOKEN": TOKEN}).token == TOKEN
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    assert TransportSecurity.from_env({"WEIR_AUTH_TOKEN_FILE": str(secret)}).token == TOKEN


def test_both_token_sources_or_an_empty_or_missing_token_file_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN)
    with pytest.raises(ConfigurationError, match="not both"):
        SecuritySettings.from_env({"WEIR_AUTH_TOKEN": TOKEN, "WEIR_AUTH_TOKEN_FILE": str(secret)})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigurationError, match="WEIR_AUTH_TOKEN_FILE names an empty file"):
        TransportSecurity.from_env({"WEIR_AUTH_TOKEN_FILE": str(empty)})
    with pytest.raises(ConfigurationError, match="WEIR_AUTH_TOKEN_FILE=.*cannot be read"):
        TransportSecurity.from_env({"WEIR_AUTH_TOKEN_FILE": str(tmp_path / "absent")})


def test_a_certificate_needs_its_key_and_client_certificates_need_a_server_certificate(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("not checked here")
    with pytest.raises(ConfigurationError, match="WEIR_TLS_KEY_FILE is unset: .*go together"):
        check_environment({"WEIR_TLS_CERT_FILE": str(pem)})
    with pytest.raises(ConfigurationError, match="WEIR_TLS_KEY_FILE=.*go together"):
        SecuritySettings.from_env({"WEIR_TLS_KEY_FILE": str(pem)})
    with pytest.raises(ConfigurationError, match="WEIR_TLS_CLIENT_CA_FILE=.*WEIR_TLS_CERT_FILE too"):
        SecuritySettings.from_env({"WEIR_TLS_CLIENT_CA_FILE": str(pem)})


def test_tls_material_is_read_for_servers_and_clients(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca", "client-ca")}
    for name, path in files.items():
        path.write_bytes(name.encode())
    env = {
        "WEIR_TLS_CERT_FILE": str(files["cert"]),
        "WEIR_TLS_KEY_FILE": str(files["key"]),
        "WEIR_TLS_CA_FILE": str(files["ca"]),
    }
    security = TransportSecurity.from_env(env)
    assert security.server_tls is not None and security.client_tls is not None
    assert (security.server_tls.certificate_chain, security.server_tls.private_key) == (b"cert", b"key")
    assert not security.server_tls.requires_client_certificate
    assert security.client_tls.root_certificates == b"ca"
    assert (security.client_tls.certificate_chain, security.client_tls.private_key) == (b"cert", b"key")
    mutual = TransportSecurity.from_env({**env, "WEIR_TLS_CLIENT_CA_FILE": str(files["client-ca"])})
    assert mutual.server_tls is not None and mutual.server_tls.client_ca == b"client-ca"
    assert mutual.server_tls.requires_client_certificate
    client_only = TransportSecurity.from_env({"WEIR_TLS_CA_FILE": str(files["ca"])})
    assert client_only.server_tls is None
    assert client_only.client_tls is not None and client_only.client_tls.certificate_chain is None
    assert TransportSecurity.from_env({}).client_tls is None


def test_secrets_never_show_in_a_repr(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_bytes(b"PRIVATE-KEY-BYTES")
    cert = tmp_path / "cert.pem"
    cert.write_bytes(b"cert")
    env = {"WEIR_AUTH_TOKEN": TOKEN, "WEIR_TLS_CERT_FILE": str(cert), "WEIR_TLS_KEY_FILE": str(key)}
    shown = repr(SecuritySettings.from_env(env)) + repr(TransportSecurity.from_env(env))
    assert TOKEN not in shown
    assert "PRIVATE-KEY-BYTES" not in shown
