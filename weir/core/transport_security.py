"""Settings -> what secures a connection: the bearer tokens and the roles they hold, the TLS material
of servers and clients, the token check and the rule that a non-loopback bind needs a token. Pure: no
gRPC, no HTTP; the gRPC adapter is :mod:`weir.core.grpc_security`, the REST API's check is in
``weir.jobmanager.rest``, the roles each call needs in :mod:`weir.core.roles`.

The token is compared per call or per stream (a data-plane channel is one stream), never per record.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from weir.core.config import SecuritySettings, env_name
from weir.core.errors import ConfigurationError
from weir.core.roles import AccessTable, Role, access_table, parse_tokens_file

AUTHORIZATION: Final = "authorization"
"""The metadata key (gRPC) and header (HTTP, any case) that carries ``Bearer <token>``."""
BEARER: Final = "Bearer "
TOKEN_VARIABLES: Final = "WEIR_AUTH_TOKEN or WEIR_AUTH_TOKEN_FILE"


class AuthDecision(enum.Enum):
    """What a server does with a call, given its ``authorization`` value and the role it needs."""

    OPEN = "open"  # no token configured: every call passes
    ACCEPTED = "accepted"
    MISSING = "missing"  # no ``authorization``, or not a bearer token
    REJECTED = "rejected"  # a bearer token, not one of this cluster's
    FORBIDDEN = "forbidden"  # one of this cluster's tokens, without the role the call needs

    @property
    def allowed(self) -> bool:
        return self in (AuthDecision.OPEN, AuthDecision.ACCEPTED)


def authorize(header: str | None, access: AccessTable | None, needed: Role | None) -> AuthDecision:
    """The decision on one call: ``header`` is its ``authorization`` value (None: absent); ``needed``
    the role the call needs (None: a call no table names, refused to every token)."""
    if access is None:
        return AuthDecision.OPEN
    if header is None or not header[: len(BEARER)].lower() == BEARER.lower():
        return AuthDecision.MISSING
    roles = access.roles_of(header[len(BEARER) :].strip())
    if roles is None:
        return AuthDecision.REJECTED
    return AuthDecision.ACCEPTED if needed is not None and needed in roles else AuthDecision.FORBIDDEN


def refusal_message(decision: AuthDecision, needed: Role | None = None, what: str = "this call") -> str:
    """What a refused caller is told (never a token)."""
    match decision:
        case AuthDecision.MISSING:
            return f"this Weir service requires a bearer token: set {TOKEN_VARIABLES} in the caller's environment"
        case AuthDecision.REJECTED:
            return f"the bearer token is not this cluster's: check {TOKEN_VARIABLES} in the caller's environment"
        case AuthDecision.FORBIDDEN:
            if needed is None:
                return f"{what} is not open to any token"
            return (
                f"{what} needs the role '{needed.value}', which this token does not hold: "
                "use a token given that role (WEIR_AUTH_TOKENS_FILE on the cluster)"
            )
        case AuthDecision.OPEN | AuthDecision.ACCEPTED:
            return "accepted"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server on this machine: ``localhost`` or a loopback IP
    (``0.0.0.0``, ``::``, any other name or address: no)."""
    name = host.strip().removeprefix("[").removesuffix("]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerTls:
    """A server's TLS: its certificate chain and key (PEM), and the CAs a client certificate must be
    signed by (None: no client certificate asked)."""

    certificate_chain: bytes
    private_key: bytes = field(repr=False)
    client_ca: bytes | None
    certificate_file: Path
    key_file: Path
    client_ca_file: Path | None

    @property
    def requires_client_certificate(self) -> bool:
        return self.client_ca is not None


@dataclass(frozen=True)
class ClientTls:
    """A client's TLS: the CAs it trusts (None: the system's), its own certificate for a server that
    asks (mutual TLS), and the name the server's certificate must carry if not the dialled host."""

    root_certificates: bytes | None
    certificate_chain: bytes | None
    private_key: bytes | None = field(repr=False)
    server_name: str | None


@dataclass(frozen=True)
class TransportSecurity:
    """How one process secures its servers and its clients; :meth:`from_env` reads it.

    ``token``: what this process sends as a client. ``access``: the tokens its servers accept and their
    roles (None: open; given ``token`` alone, that token with every role). ``internal_token``: what the
    cluster's processes send each other (:meth:`for_cluster_peers`)."""

    token: str | None = field(default=None, repr=False)
    server_tls: ServerTls | None = None
    client_tls: ClientTls | None = None
    access: AccessTable | None = field(default=None, repr=False)
    internal_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.access is None and self.token is not None:
            object.__setattr__(self, "access", AccessTable.single(self.token))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TransportSecurity:
        """The process's security from ``WEIR_AUTH_*`` and ``WEIR_TLS_*``; a file that cannot be read
        raises ConfigurationError naming its variable."""
        return cls.from_settings(SecuritySettings.from_env(environ))

    @classmethod
    def from_settings(cls, settings: SecuritySettings) -> TransportSecurity:
        token: str | None = None
        if settings.auth_token is not None:
            token = settings.auth_token.get_secret_value().strip()
        elif settings.auth_token_file is not None:
            token = _read(settings.auth_token_file, "auth_token_file").decode().strip()
            if not token:
                raise ConfigurationError(f"bad configuration: {env_name('auth_token_file')} names an empty file")
        server_tls: ServerTls | None = None
        certificate = key = None
        if settings.tls_cert_file is not None and settings.tls_key_file is not None:
            certificate = _read(settings.tls_cert_file, "tls_cert_file")
            key = _read(settings.tls_key_file, "tls_key_file")
            client_ca_file = settings.tls_client_ca_file
            server_tls = ServerTls(
                certificate,
                key,
                _read(client_ca_file, "tls_client_ca_file") if client_ca_file is not None else None,
                settings.tls_cert_file,
                settings.tls_key_file,
                client_ca_file,
            )
        client_tls: ClientTls | None = None
        if settings.tls_ca_file is not None or certificate is not None:
            roots = _read(settings.tls_ca_file, "tls_ca_file") if settings.tls_ca_file is not None else None
            client_tls = ClientTls(roots, certificate, key, settings.tls_server_name)
        grants = None
        if settings.auth_tokens_file is not None:
            text = _read(settings.auth_tokens_file, "auth_tokens_file").decode()
            grants = parse_tokens_file(text, env_name("auth_tokens_file"))
        internal: str | None = None
        if settings.internal_token is not None:
            internal = settings.internal_token.get_secret_value().strip() or None
        elif settings.internal_token_file is not None:
            internal = _read(settings.internal_token_file, "internal_token_file").decode().strip()
            if not internal:
                raise ConfigurationError(f"bad configuration: {env_name('internal_token_file')} names an empty file")
        if grants is not None and internal is None:
            raise ConfigurationError(
                f"bad configuration: {env_name('auth_tokens_file')} gives client tokens only; the cluster's "
                "processes need a token of their own: set WEIR_INTERNAL_TOKEN or WEIR_INTERNAL_TOKEN_FILE"
            )
        access = access_table(token or None, grants, internal)
        return cls(token or None, server_tls, client_tls, access, internal)

    def for_cluster_peers(self) -> TransportSecurity:
        """The security a JobManager or TaskManager calls the cluster's other processes with: the
        internal token when one is configured, else the single token (which then holds every role)."""
        if self.internal_token is None:
            return self
        return replace(self, token=self.internal_token)

    def without_tls(self) -> TransportSecurity:
        """The same tokens, no TLS (a slot worker's Unix socket: no host name a certificate could name)."""
        return replace(self, server_tls=None, client_tls=None)

    def check_bind(self, host: str, port: int, bind_variable: str) -> None:
        """Refuse a server on a non-loopback address without a token: ConfigurationError, naming the
        address and what to set."""
        if self.access is None and not is_loopback(host):
            raise ConfigurationError(
                f"refusing to serve on {host}:{port} without authentication: set {TOKEN_VARIABLES} "
                f"(and TLS: WEIR_TLS_CERT_FILE, WEIR_TLS_KEY_FILE), or bind 127.0.0.1 ({bind_variable} or --bind)"
            )

    def authorization(self) -> str | None:
        """The ``authorization`` value a client sends (None: no token configured)."""
        return None if self.token is None else BEARER + self.token


def _read(path: Path, field_name: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"bad configuration: {env_name(field_name)}={str(path)!r}: cannot be read: {exc.strerror}"
        ) from None
