"""Checkpoint storage: the objects of checkpoints and savepoints, in S3 or in a local folder.

With a storage MAC key (``WEIR_STORAGE_MAC_KEY``) :func:`open_storage` answers a :class:`SealedStorage`:
every object is written with its keyed MAC and checked before a reader gets its bytes
(:mod:`weir.core.storage_mac`), the one verifying reader every read path goes through.

Keys are relative to the storage's root (``s3://bucket/prefix`` or a directory) and come from
``weir.core.paths.CheckpointPaths``. Writing one object is atomic (S3 PutObject; temp file + rename locally),
which is what makes "metadata written last" a commit. Failures of the backing system raise
``ServiceUnavailableError`` naming the key; a missing object raises ``ObjectNotFoundError``.
"""

from __future__ import annotations

import abc
import fcntl
import hashlib
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

import structlog
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from weir.connectors import s3
from weir.core import storage_mac
from weir.core.config import Endpoints, SecuritySettings
from weir.core.errors import Fault, ServiceUnavailableError, WeirError
from weir.core.storage_mac import StorageKey

log = structlog.get_logger("weir.security")

_DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
_MULTIPART_THRESHOLD = 64 * 1024 * 1024
_MULTIPART_CHUNK = 16 * 1024 * 1024
_TEMP_PREFIX = ".tmp-"
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_REFUSED_CODES = frozenset(
    {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
)


class ObjectNotFoundError(WeirError):
    """A checkpoint object that should exist is not in the storage (deleted, or never written)."""

    fault: Fault = Fault.EXTERNAL
    retriable: ClassVar[bool] = False

    def __init__(self, location: str) -> None:
        super().__init__(
            f"checkpoint object {location} does not exist; it was deleted or never written. "
            "Restore from another checkpoint or savepoint"
        )
        self.location = location


class WritePreconditionFailedError(WeirError):
    """A conditional write found the object not as expected (there already, or at another version):
    someone else wrote it in between. Nothing was written."""

    fault: Fault = Fault.EXTERNAL
    retriable: ClassVar[bool] = False


class StorageUriError(WeirError):
    """The checkpoint storage URI names no storage Weir supports."""

    fault: Fault = Fault.USER


class CheckpointStorage(abc.ABC):
    """Objects by key; each write is atomic, a reader sees the whole object or none."""

    refuses_sealed: bool = False
    """Opened without a MAC key (``open_storage``): an object that carries a Weir MAC is refused in one
    line naming the missing setting, rather than handed to a decoder with its trailer."""

    def _unsealed(self, key: str, data: bytes) -> bytes:
        if self.refuses_sealed and storage_mac.is_sealed(data):
            raise storage_mac.refusal_error(f"{self.uri.rstrip('/')}/{key}", storage_mac.Refusal.UNEXPECTED)
        return data

    def _check_unsealed_file(self, key: str, path: Path) -> None:
        if self.refuses_sealed and storage_mac.file_is_sealed(path):
            raise storage_mac.refusal_error(f"{self.uri.rstrip('/')}/{key}", storage_mac.Refusal.UNEXPECTED)

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """Where the storage's root is, for messages (``s3://bucket/prefix/``, ``file:///dir``)."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file (in parts when large)."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Download to ``path``, which appears complete or not at all."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """``(key, size in bytes)`` of every object whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete the objects; keys that do not exist are skipped."""

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object and its version (an opaque token, S3's ETag), None if there is none: for
        :meth:`put_if`. A storage without conditional writes raises ServiceUnavailableError."""
        raise ServiceUnavailableError(f"checkpoint storage {self.uri} has no conditional writes")

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str:
        """Write only if the object is absent (``expected_version`` None) or still at
        ``expected_version``; answers the new version. Raises WritePreconditionFailedError otherwise,
        ServiceUnavailableError when the storage did not answer (the write may have landed)."""
        raise ServiceUnavailableError(f"checkpoint storage {self.uri} has no conditional writes")


# ---------------------------------------------------------------------------------------------------
# S3


class S3CheckpointStorage(CheckpointStorage):
    """Objects under ``prefix`` in an S3 bucket (AWS, the local S3 server, MinIO); credentials as
    :mod:`weir.connectors.s3` finds them (static keys, else boto3's default chain)."""

    def __init__(self, endpoints_or_client: Endpoints | Any, bucket: str, prefix: str = "") -> None:
        if isinstance(endpoints_or_client, Endpoints):
            self._client, self._credentials_from = s3.connect(endpoints_or_client)
        else:
            self._client, self._credentials_from = endpoints_or_client, "the given client"
        self.bucket = bucket
        self.prefix = "".join(f"{p}/" for p in prefix.split("/") if p)
        self._transfer = TransferConfig(
            multipart_threshold=_MULTIPART_THRESHOLD, multipart_chunksize=_MULTIPART_CHUNK, max_concurrency=4
        )

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _name(self, key: str) -> str:
        return self.prefix + key

    def _error(self, operation: str, key: str, exc: Exception) -> WeirError:
        location = f"s3://{self.bucket}/{self._name(key)}"
        code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
        if code in _MISSING_CODES:
            return ObjectNotFoundError(location)
        if code in _REFUSED_CODES:
            return ServiceUnavailableError(
                f"S3 {operation} of {location} was refused ({code}) for the credentials from {self._credentials_from}: "
                "check that they are valid and may use the bucket (IAM policy, bucket policy), then retry"
            )
        return ServiceUnavailableError(
            f"S3 {operation} of {location} failed: {exc}; check that the S3 server answers and the bucket "
            "exists, then retry"
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise self._error("put", key, exc) from exc

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._name(key))
            return self._unsealed(key, response["Body"].read()), str(response["ETag"])
        except (BotoCoreError, ClientError) as exc:
            error = self._error("get", key, exc)
            if isinstance(error, ObjectNotFoundError):
                return None
            raise error from exc

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str:
        """S3 conditional writes: ``If-None-Match: *`` creates, ``If-Match: <ETag>`` replaces (AWS
        since 2024, versitygw; a server that ignored them would make this an unconditional write:
        docs/operations.md says how to check a server)."""
        condition = {"IfNoneMatch": "*"} if expected_version is None else {"IfMatch": expected_version}
        try:
            response = self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data, **condition)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise WritePreconditionFailedError(
                    f"conditional write of s3://{self.bucket}/{self._name(key)} refused ({code})"
                ) from exc
            raise self._error("put", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("put", key, exc) from exc
        return str(response["ETag"])

    def put_file(self, key: str, path: Path) -> None:
        try:
            self._client.upload_file(str(path), self.bucket, self._name(key), Config=self._transfer)
        except (BotoCoreError, ClientError, Boto3Error, OSError) as exc:  # S3UploadFailedError is a Boto3Error
            raise self._error("upload", key, exc) from exc

    def get_bytes(self, key: str) -> bytes:
        try:
            body: bytes = self._client.get_object(Bucket=self.bucket, Key=self._name(key))["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise self._error("get", key, exc) from exc
        return self._unsealed(key, body)

    def get_file(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{_TEMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
        try:
            self._client.download_file(self.bucket, self._name(key), str(temp), Config=self._transfer)
            self._check_unsealed_file(key, temp)
            os.replace(temp, path)
        except (BotoCoreError, ClientError, Boto3Error, OSError) as exc:
            raise self._error("download", key, exc) from exc
        finally:
            temp.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._name(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                return False
            raise self._error("head", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("head", key, exc) from exc
        return True

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        skip = len(self.prefix)
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._name(prefix)
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield obj["Key"][skip:], int(obj["Size"])
        except (BotoCoreError, ClientError) as exc:
            raise self._error("list", prefix + "*", exc) from exc

    def delete(self, keys: Iterable[str]) -> None:
        names = [self._name(k) for k in dict.fromkeys(keys)]
        for start in range(0, len(names), _DELETE_BATCH):
            batch = names[start : start + _DELETE_BATCH]
            try:
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": n} for n in batch], "Quiet": True}
                )
            except (BotoCoreError, ClientError) as exc:
                raise self._error("delete", batch[0][len(self.prefix) :], exc) from exc
            failed = [e for e in answer.get("Errors", ()) if e.get("Code") not in _MISSING_CODES]
            if failed:
                first = failed[0]
                raise ServiceUnavailableError(
                    f"S3 delete of {len(failed)} object(s) in s3://{self.bucket} failed, e.g. {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}; the delete is retried with the next release"
                )


# ---------------------------------------------------------------------------------------------------
# Local folder


class FileCheckpointStorage(CheckpointStorage):
    """Objects as files under a root directory; a key's ``/`` separate folders."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(_TEMP_PREFIX) for p in parts):
            raise ValueError(
                f"invalid checkpoint object key {key!r}: needs non-empty segments, no '.', '..' or '{_TEMP_PREFIX}'"
            )
        return self.root.joinpath(*parts)

    def _error(self, operation: str, key: str, exc: OSError) -> WeirError:
        location = f"{self.uri}/{key}"
        if isinstance(exc, FileNotFoundError) and operation in ("get", "download"):
            return ObjectNotFoundError(location)
        return ServiceUnavailableError(f"{operation} of checkpoint object {location} failed: {exc}")

    def _write_atomically(self, target: Path, write: Any) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f"{_TEMP_PREFIX}{uuid.uuid4().hex}-{target.name}")
        try:
            with open(temp, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self._write_atomically(self._path(key), lambda out: out.write(data))
        except OSError as exc:
            raise self._error("put", key, exc) from exc

    def put_file(self, key: str, path: Path) -> None:
        def copy(out: Any) -> None:
            with open(path, "rb") as source:
                while chunk := source.read(1 << 20):
                    out.write(chunk)

        try:
            self._write_atomically(self._path(key), copy)
        except OSError as exc:
            raise self._error("upload", key, exc) from exc

    def get_bytes(self, key: str) -> bytes:
        try:
            data = self._path(key).read_bytes()
        except OSError as exc:
            raise self._error("get", key, exc) from exc
        return self._unsealed(key, data)

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)

        def copy(out: Any) -> None:
            with open(source, "rb") as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)

        try:
            if source.is_file():
                self._check_unsealed_file(key, source)
            self._write_atomically(path, copy)
        except OSError as exc:
            raise self._error("download", key, exc) from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error("get", key, exc) from exc
        return self._unsealed(key, data), hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str:
        """Compare and write under an exclusive ``flock`` of a lock file beside the object (processes
        of one machine: the local mode's storage)."""
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.with_name(f"{_TEMP_PREFIX}lock-{target.name}"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                current = self.get_versioned(key)
                if (current[1] if current is not None else None) != expected_version:
                    raise WritePreconditionFailedError(
                        f"conditional write of {self.uri}/{key} refused: it is not at version {expected_version}"
                    )
                self._write_atomically(target, lambda out: out.write(data))
        except OSError as exc:
            raise self._error("put", key, exc) from exc
        return hashlib.sha256(data).hexdigest()

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        # Walk only the folder the prefix names; the last segment may be a partial name.
        folder, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*folder.split("/")) if folder else self.root
        found: list[tuple[str, int]] = []
        try:
            for dirpath, dirnames, filenames in os.walk(start):
                dirnames[:] = [d for d in dirnames if not d.startswith(_TEMP_PREFIX)]
                base = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    if name.startswith(_TEMP_PREFIX):
                        continue
                    key = name if base == "." else f"{base}/{name}"
                    if key.startswith(prefix):
                        found.append((key, os.stat(os.path.join(dirpath, name)).st_size))
        except OSError as exc:
            raise self._error("list", prefix + "*", exc) from exc
        yield from sorted(found)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink(missing_ok=True)
            except OSError as exc:
                raise self._error("delete", key, exc) from exc


# ---------------------------------------------------------------------------------------------------
# Authenticated objects


class SealedStorage(CheckpointStorage):
    """Another storage's objects, each written with the cluster's keyed MAC and checked before its
    bytes are answered: a tampered, truncated, foreign or unsealed object raises
    StorageAuthenticationError naming it (not retriable; the storage's fault) and reaches no decoder."""

    def __init__(self, inner: CheckpointStorage, key: StorageKey) -> None:
        self.inner = inner
        self._key = key

    def __repr__(self) -> str:
        return f"SealedStorage({self.inner.uri!r}, key_id={self._key.key_id.hex()})"

    @property
    def uri(self) -> str:
        return self.inner.uri

    def _location(self, key: str) -> str:
        return f"{self.inner.uri.rstrip('/')}/{key}"

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(key, storage_mac.seal(data, self._key))

    def put_file(self, key: str, path: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="weir-seal-") as scratch:
            sealed = Path(scratch) / "object"
            storage_mac.seal_file(path, sealed, self._key)
            self.inner.put_file(key, sealed)

    def get_bytes(self, key: str) -> bytes:
        return storage_mac.unseal(self.inner.get_bytes(key), self._key, self._location(key))

    def get_file(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{_TEMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
        try:
            self.inner.get_file(key, temp)
            storage_mac.unseal_file(temp, self._key, self._location(key))
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        found = self.inner.get_versioned(key)
        if found is None:
            return None
        data, version = found
        return storage_mac.unseal(data, self._key, self._location(key)), version

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str:
        return self.inner.put_if(key, storage_mac.seal(data, self._key), expected_version)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """The sizes are the payloads' (each object is its payload and a trailer)."""
        for key, size in self.inner.list(prefix):
            yield key, max(0, size - storage_mac.TRAILER_SIZE)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)


_warned_unauthenticated = False
_warn_unauthenticated = False


def warn_when_unauthenticated() -> None:
    """Called by the cluster's processes (JobManager, TaskManager): the first S3 storage this process
    opens without a MAC key logs a warning. Clients (the ``weir`` command) do not: their standard
    output is the user's."""
    global _warn_unauthenticated
    _warn_unauthenticated = True


def _sealed(storage: CheckpointStorage, key: StorageKey | None) -> CheckpointStorage:
    global _warned_unauthenticated
    if key is not None:
        return SealedStorage(storage, key)
    storage.refuses_sealed = True
    if isinstance(storage, S3CheckpointStorage) and _warn_unauthenticated and not _warned_unauthenticated:
        _warned_unauthenticated = True
        log.warning(
            "checkpoint_storage_unauthenticated",
            storage=storage.uri,
            why="objects read back from shared storage are decoded (pickles among them) without a MAC",
            fix=f"set {storage_mac.KEY_VARIABLES} on every process of the cluster",
        )
    return storage


def open_storage(uri: str, endpoints: Endpoints | None = None) -> CheckpointStorage:
    """The storage a URI names: ``s3://bucket/prefix``, ``file:///dir`` or a plain directory path,
    sealed (:class:`SealedStorage`) with the key of ``WEIR_STORAGE_MAC_KEY`` or ``_FILE`` when one is set.

    The S3 endpoint, region, addressing style and static keys come from ``endpoints`` (default:
    ``Endpoints.from_env()``); without static keys, credentials come from boto3's default chain.
    """
    return _sealed(_open_plain(uri, endpoints), storage_mac.storage_key(SecuritySettings.from_env()))


def _open_plain(uri: str, endpoints: Endpoints | None) -> CheckpointStorage:
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageUriError(f"checkpoint storage {uri!r} names no bucket: use s3://<bucket>/<prefix>")
        return S3CheckpointStorage(endpoints or Endpoints.from_env(), parsed.netloc, parsed.path)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageUriError(f"checkpoint storage {uri!r}: a file URI names a local path, file:///<dir>")
        return FileCheckpointStorage(Path(unquote(parsed.path)))
    if parsed.scheme == "" and uri:
        return FileCheckpointStorage(Path(uri))
    raise StorageUriError(
        f"checkpoint storage {uri!r} is not supported: use s3://<bucket>/<prefix>, file:///<dir> or a path"
    )


def copy_folder(source: CheckpointStorage, prefix: str, target: CheckpointStorage, target_prefix: str = "") -> int:
    """Copy every object under ``prefix`` of ``source`` to ``target_prefix`` + the rest of its key in
    ``target`` (another prefix, bucket or backend), streaming through a temporary file; answers how
    many bytes were copied."""
    copied = 0
    with tempfile.TemporaryDirectory(prefix="weir-copy-") as scratch:
        local = Path(scratch) / "object"
        for key, size in source.list(prefix):
            source.get_file(key, local)
            target.put_file(target_prefix + key[len(prefix) :], local)
            local.unlink(missing_ok=True)
            copied += size
    return copied
