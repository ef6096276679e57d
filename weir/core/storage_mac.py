"""The keyed MAC over every object Weir writes to checkpoint storage, checked before anything is decoded.

Snapshot objects, state handles, in-flight channel state and operator state are pickles; checkpoint and
savepoint metadata, job records and artifacts are read back and acted on. Anyone who can write to the
bucket could otherwise hand a JobManager or a TaskManager a pickle that runs code when it is loaded.
Each object therefore carries a trailer, an HMAC-SHA256 under the cluster's secret
(``WEIR_STORAGE_MAC_KEY``); :func:`unseal` refuses an object whose trailer is missing, names another
key, or does not match, before its bytes reach a decoder (docs/formats.md, "Authenticated objects").
Flink trusts its checkpoint storage as it trusts its own disk; this is the stricter trust of a
system that reads back code-carrying objects from a shared bucket.

A trailer rather than a header: an object downloaded to a file is checked in one streaming pass and
its trailer cut off by truncating the file, without copying it. Pure: bytes and files in, bytes out.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, assert_never

from weir.core.config import SecuritySettings, env_name
from weir.core.errors import ConfigurationError, StorageAuthenticationError

MAGIC: Final = b"WEIRMAC\x01"
"""8 bytes: the trailer's tag, ending in its format version (1)."""
KEY_ID_SIZE: Final = 8
MAC_SIZE: Final = hashlib.sha256().digest_size
TRAILER_SIZE: Final = len(MAGIC) + KEY_ID_SIZE + MAC_SIZE  # 48
KEY_VARIABLES: Final = "WEIR_STORAGE_MAC_KEY or WEIR_STORAGE_MAC_KEY_FILE"
_CHUNK: Final = 1 << 20
_MIN_KEY_BYTES: Final = 16


@dataclass(frozen=True)
class StorageKey:
    """The cluster's storage secret; ``key_id`` (public) tells a foreign object from a tampered one."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < _MIN_KEY_BYTES:
            raise ValueError(f"a storage MAC key needs at least {_MIN_KEY_BYTES} bytes")

    @property
    def key_id(self) -> bytes:
        return hashlib.sha256(b"weir-storage-key-id\x00" + self.secret).digest()[:KEY_ID_SIZE]

    def _mac(self) -> hmac.HMAC:
        return hmac.new(self.secret, digestmod=hashlib.sha256)

    def _trailer(self, mac: hmac.HMAC) -> bytes:
        mac.update(MAGIC + self.key_id)  # the MAC covers the tag and the key id too
        return MAGIC + self.key_id + mac.digest()


def storage_key(settings: SecuritySettings) -> StorageKey | None:
    """The key ``WEIR_STORAGE_MAC_KEY`` or ``_FILE`` gives (None: neither set); ConfigurationError for
    a file that cannot be read or a key too short, naming the variable, never the key."""
    if settings.storage_mac_key is not None:
        secret, variable = settings.storage_mac_key.get_secret_value().strip().encode(), env_name("storage_mac_key")
    elif settings.storage_mac_key_file is not None:
        variable = env_name("storage_mac_key_file")
        try:
            secret = settings.storage_mac_key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigurationError(
                f"bad configuration: {variable}={str(settings.storage_mac_key_file)!r}: cannot be read: {exc.strerror}"
            ) from None
    else:
        return None
    if len(secret) < _MIN_KEY_BYTES:
        raise ConfigurationError(
            f"bad configuration: {variable} is shorter than {_MIN_KEY_BYTES} bytes: use e.g. `openssl rand -hex 32`"
        )
    return StorageKey(secret)


class Refusal(enum.Enum):
    """Why an object was refused."""

    MISSING = "it carries no Weir MAC (written without a key, truncated, or not written by Weir)"
    FOREIGN = "it was sealed with another key"
    MISMATCH = "its MAC does not match its bytes (changed or truncated after it was written)"
    UNEXPECTED = "it is sealed (it carries a Weir MAC) but this process has no key"


def refusal_error(location: str, refusal: Refusal, key_id: bytes | None = None) -> StorageAuthenticationError:
    """The one line a refused object raises."""
    match refusal:
        case Refusal.MISSING | Refusal.MISMATCH:
            advice = "restore from another checkpoint or savepoint, or find who wrote to the storage"
        case Refusal.FOREIGN:
            theirs = "" if key_id is None else f" (key id {key_id.hex()})"
            advice = f"it belongs to a cluster with another {KEY_VARIABLES}{theirs}; use that cluster's key"
        case Refusal.UNEXPECTED:
            advice = f"{KEY_VARIABLES} is not set here: set it to the key of the cluster that wrote it"
        case _:
            assert_never(refusal)
    return StorageAuthenticationError(
        f"checkpoint object {location} failed authentication: {refusal.value}; it was not decoded: {advice}"
    )


def seal(data: bytes, key: StorageKey) -> bytes:
    """``data`` with its trailer."""
    mac = key._mac()
    mac.update(data)
    return data + key._trailer(mac)


def _check(trailer: bytes, mac: hmac.HMAC, key: StorageKey, location: str) -> None:
    if len(trailer) != TRAILER_SIZE or trailer[: len(MAGIC)] != MAGIC:
        raise refusal_error(location, Refusal.MISSING)
    key_id = trailer[len(MAGIC) : len(MAGIC) + KEY_ID_SIZE]
    if not hmac.compare_digest(key_id, key.key_id):
        raise refusal_error(location, Refusal.FOREIGN, key_id)
    if not hmac.compare_digest(key._trailer(mac), trailer):
        raise refusal_error(location, Refusal.MISMATCH)


def unseal(data: bytes, key: StorageKey, location: str) -> bytes:
    """The payload of a sealed object; StorageAuthenticationError naming ``location`` when it is not
    this key's, unchanged."""
    if len(data) < TRAILER_SIZE:
        raise refusal_error(location, Refusal.MISSING)
    payload, trailer = data[:-TRAILER_SIZE], data[-TRAILER_SIZE:]
    mac = key._mac()
    mac.update(payload)
    _check(trailer, mac, key, location)
    return payload


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` ends with a trailer's tag (what a process without a key refuses)."""
    return len(data) >= TRAILER_SIZE and data[-TRAILER_SIZE : -TRAILER_SIZE + len(MAGIC)] == MAGIC


def seal_file(source: Path, target: Path, key: StorageKey) -> None:
    """Write ``source`` with its trailer to ``target``."""
    mac = key._mac()
    with open(source, "rb") as src, open(target, "wb") as out:
        while chunk := src.read(_CHUNK):
            mac.update(chunk)
            out.write(chunk)
        out.write(key._trailer(mac))


def unseal_file(path: Path, key: StorageKey, location: str) -> None:
    """Check the sealed object downloaded to ``path`` and cut its trailer off, in place; raises
    StorageAuthenticationError (``path`` left as it was: the caller deletes it)."""
    size = path.stat().st_size
    if size < TRAILER_SIZE:
        raise refusal_error(location, Refusal.MISSING)
    mac = key._mac()
    with open(path, "rb") as src:
        remaining = size - TRAILER_SIZE
        while remaining:
            chunk = src.read(min(_CHUNK, remaining))
            if not chunk:
                raise refusal_error(location, Refusal.MISSING)
            mac.update(chunk)
            remaining -= len(chunk)
        trailer = src.read(TRAILER_SIZE)
    _check(trailer, mac, key, location)
    os.truncate(path, size - TRAILER_SIZE)


def file_is_sealed(path: Path) -> bool:
    size = path.stat().st_size
    if size < TRAILER_SIZE:
        return False
    with open(path, "rb") as src:
        src.seek(size - TRAILER_SIZE)
        return src.read(len(MAGIC)) == MAGIC
