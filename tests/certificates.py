"""Test certificates made with ``cryptography``: a CA, and certificates it signs for servers and clients
(SAN 127.0.0.1 and localhost, both server and client use), written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Issued:
    certificate: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    name: str
    certificate_file: Path
    _key: ec.EllipticCurvePrivateKey
    _certificate: x509.Certificate

    @classmethod
    def create(cls, directory: Path, name: str) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.crt"
        path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return cls(name, path, key, certificate)

    def issue(self, directory: Path, name: str) -> Issued:
        """A certificate for ``name`` valid as a server (SAN 127.0.0.1, ::1, localhost) and as a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("::1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        certificate_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
        certificate_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_file.chmod(0o600)
        return Issued(certificate_file, key_file)


def tls_environment(
    ca: CertificateAuthority, issued: Issued, *, client_ca: CertificateAuthority | None
) -> dict[str, str]:
    """The ``WEIR_TLS_*`` variables of a process holding ``issued``, trusting ``ca``; mutual TLS
    when ``client_ca`` is given."""
    env = {
        "WEIR_TLS_CERT_FILE": str(issued.certificate),
        "WEIR_TLS_KEY_FILE": str(issued.key),
        "WEIR_TLS_CA_FILE": str(ca.certificate_file),
    }
    if client_ca is not None:
        env["WEIR_TLS_CLIENT_CA_FILE"] = str(client_ca.certificate_file)
    return env
