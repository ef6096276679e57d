"""``python -m weir.tools.dev_credentials OUT_DIR [--names NAME ...]``: development credentials for
the TLS and bearer tokens of every Weir service (docs/security.md), as compose's ``weir-credentials``
step and the Kubernetes dev overlay use them.

It writes, in ``OUT_DIR``:

* ``ca.crt``, ``ca.key``: a CA of this cluster alone;
* ``tls.crt``, ``tls.key``: one certificate, signed by that CA, that every JobManager, TaskManager and
  client shows (server and client use);
* ``token``: a random bearer token, the client token of a user of the cluster (role ``submit``);
* ``internal-token``: the token the JobManager and the TaskManagers send each other (role ``internal``);
* ``prometheus-token``: the token Prometheus scrapes the metrics endpoints with (role ``read``);
* ``tokens``: the servers' table (``WEIR_AUTH_TOKENS_FILE``): ``token`` as ``submit``, ``prometheus-token``
  as ``read``, each by its SHA-256 (the file holds no usable secret).

Keys and tokens are mode 0600, except ``prometheus-token``: 0644, because Prometheus runs as another
user than the one that owns these files, and that token only grants ``read`` (docs/security.md,
"Roles"); the roles follow Flink's split of a read-only dashboard from its operators.

One certificate for all processes, valid for one fixed name, :data:`CLUSTER_NAME`, which every
process inside the cluster checks (``WEIR_TLS_SERVER_NAME``):
TaskManagers advertise the address their host name resolves to (a container's or a pod's IP, known
only at run time), so no certificate made beforehand can name them; with one fixed name the same
files serve compose and Kubernetes. The certificate also carries ``jobmanager``, ``localhost``,
``127.0.0.1`` and ``::1`` (a client on the host, through a published port or ``kubectl
port-forward``, dials those without a server name) and every ``--names`` entry (a DNS name or an IP).

Idempotent: files that exist are kept; the certificate is issued again only when it is missing, is
not the CA's, or lacks a requested name, and ``tokens`` only when a token it names was made anew. Exit
0, 1 with one line when a file cannot be written or an existing one cannot be read.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from weir.core.roles import SHA256_PREFIX, Role, token_digest

CLUSTER_NAME: Final = "weir-cluster"
"""The name every process's certificate carries and every process checks (``WEIR_TLS_SERVER_NAME``)."""
DEFAULT_NAMES: Final = (CLUSTER_NAME, "jobmanager", "localhost", "127.0.0.1", "::1")

CA_CERTIFICATE: Final = "ca.crt"
CA_KEY: Final = "ca.key"
CERTIFICATE: Final = "tls.crt"
KEY: Final = "tls.key"
TOKEN: Final = "token"
INTERNAL_TOKEN: Final = "internal-token"
PROMETHEUS_TOKEN: Final = "prometheus-token"
TOKENS: Final = "tokens"

CA_VALID: Final = datetime.timedelta(days=3650)
CERTIFICATE_VALID: Final = datetime.timedelta(days=825)
SECRET_MODE: Final = 0o600
PUBLIC_MODE: Final = 0o644


@dataclass(frozen=True)
class DevCredentials:
    """The files of one directory of development credentials."""

    directory: Path

    @property
    def ca_certificate(self) -> Path:
        return self.directory / CA_CERTIFICATE

    @property
    def ca_key(self) -> Path:
        return self.directory / CA_KEY

    @property
    def certificate(self) -> Path:
        return self.directory / CERTIFICATE

    @property
    def key(self) -> Path:
        return self.directory / KEY

    @property
    def token(self) -> Path:
        return self.directory / TOKEN

    @property
    def internal_token(self) -> Path:
        return self.directory / INTERNAL_TOKEN

    @property
    def prometheus_token(self) -> Path:
        return self.directory / PROMETHEUS_TOKEN

    @property
    def tokens(self) -> Path:
        return self.directory / TOKENS

    def environment(self) -> dict[str, str]:
        """The ``WEIR_AUTH_*``/``WEIR_TLS_*`` variables of a process of the cluster using these files."""
        return {
            "WEIR_AUTH_TOKEN_FILE": str(self.token),
            "WEIR_AUTH_TOKENS_FILE": str(self.tokens),
            "WEIR_INTERNAL_TOKEN_FILE": str(self.internal_token),
            "WEIR_TLS_CERT_FILE": str(self.certificate),
            "WEIR_TLS_KEY_FILE": str(self.key),
            "WEIR_TLS_CA_FILE": str(self.ca_certificate),
            "WEIR_TLS_SERVER_NAME": CLUSTER_NAME,
        }


@dataclass(frozen=True)
class Generated:
    """What one run wrote (the rest was kept)."""

    credentials: DevCredentials
    written: tuple[Path, ...]


def subject_names(names: Sequence[str]) -> list[x509.GeneralName]:
    """Each name as a SAN: an IP address when it parses as one, else a DNS name."""
    result: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


def generate(directory: Path, extra_names: Sequence[str] = ()) -> Generated:
    """Write what is missing of the credentials in ``directory`` (see the module's docstring)."""
    credentials = DevCredentials(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    now = datetime.datetime.now(datetime.UTC)

    if credentials.ca_certificate.exists() and credentials.ca_key.exists():
        ca_key = _load_key(credentials.ca_key)
        ca_certificate = x509.load_pem_x509_certificate(credentials.ca_certificate.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_certificate = _ca_certificate(ca_key, now)
        written += _write_pair(credentials.ca_certificate, ca_certificate, credentials.ca_key, ca_key)

    wanted = subject_names([*DEFAULT_NAMES, *extra_names])
    if not _still_valid(credentials, ca_certificate, wanted):
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = _node_certificate(key, ca_key, ca_certificate, wanted, now)
        written += _write_pair(credentials.certificate, certificate, credentials.key, key)

    for path, mode in (
        (credentials.token, SECRET_MODE),
        (credentials.internal_token, SECRET_MODE),
        (credentials.prometheus_token, PUBLIC_MODE),  # grants read only: Prometheus' user must read it
    ):
        if not path.exists():
            _write(path, (secrets.token_urlsafe(32) + "\n").encode(), mode)
            written.append(path)

    # Written again when a token it names was made anew, so that the table never lacks the client's token.
    if not credentials.tokens.exists() or {credentials.token, credentials.prometheus_token} & set(written):
        _write(credentials.tokens, _tokens_file(credentials), SECRET_MODE)
        written.append(credentials.tokens)
    return Generated(credentials, tuple(written))


def _tokens_file(credentials: DevCredentials) -> bytes:
    """The servers' ``WEIR_AUTH_TOKENS_FILE``: each client token by its SHA-256, with its role."""
    lines = [
        '# role  sha256 of the token (python -m weir.tools.dev_credentials; docs/security.md, "Roles")',
        f"# {TOKEN}: a user's (the weir CLI, the REST API)",
        f"{Role.SUBMIT.value} {SHA256_PREFIX}{_digest(credentials.token)}",
        f"# {PROMETHEUS_TOKEN}: Prometheus' scrapes",
        f"{Role.READ.value} {SHA256_PREFIX}{_digest(credentials.prometheus_token)}",
    ]
    return ("\n".join(lines) + "\n").encode()


def _digest(path: Path) -> str:
    return token_digest(path.read_text()).hex()


def _still_valid(credentials: DevCredentials, ca: x509.Certificate, wanted: list[x509.GeneralName]) -> bool:
    """Whether the certificate on disk can be kept: it and its key exist, the CA signed it, it names
    everything wanted."""
    if not (credentials.certificate.exists() and credentials.key.exists()):
        return False
    certificate = x509.load_pem_x509_certificate(credentials.certificate.read_bytes())
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return all(name in names for name in wanted)


def _ca_certificate(key: ec.EllipticCurvePrivateKey, now: datetime.datetime) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Weir development CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CA_VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(certificate_signing=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _node_certificate(
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca: x509.Certificate,
    names: list[x509.GeneralName],
    now: datetime.datetime,
) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CLUSTER_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CERTIFICATE_VALID)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(certificate_signing=False), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _key_usage(*, certificate_signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not certificate_signing,
        key_cert_sign=certificate_signing,
        crl_sign=certificate_signing,
        encipher_only=False,
        decipher_only=False,
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: not an EC private key (delete the directory's CA files to make new ones)")
    return key


def _write_pair(
    certificate_path: Path, certificate: x509.Certificate, key_path: Path, key: ec.EllipticCurvePrivateKey
) -> list[Path]:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write(key_path, pem, SECRET_MODE)
    _write(certificate_path, certificate.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE)
    return [certificate_path, key_path]


def _write(path: Path, content: bytes, mode: int) -> None:
    """Write ``content`` to ``path`` created with ``mode`` (a key is never readable by others, not even
    for a moment), replacing the file in one rename."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as f:
        f.write(content)
    os.chmod(temporary, mode)  # whatever the umask
    temporary.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m weir.tools.dev_credentials",
        description="Development TLS certificates and bearer tokens for a Weir cluster (kept when present).",
    )
    parser.add_argument("directory", type=Path, help="where to write ca.crt, ca.key, tls.crt, tls.key and the tokens")
    parser.add_argument(
        "--names",
        nargs="+",
        default=[],
        metavar="NAME",
        help=f"more DNS names or IPs for the certificate (always: {', '.join(DEFAULT_NAMES)})",
    )
    args = parser.parse_args(argv)
    try:
        generated = generate(args.directory, args.names)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"dev_credentials: {args.directory}: {exc}\n")
        return 1
    kept = "all kept" if not generated.written else "wrote " + ", ".join(p.name for p in generated.written)
    sys.stdout.write(f"{args.directory}: {kept}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
