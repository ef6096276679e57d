"""Part files of the exactly-once file sink, on S3 or in a local directory: the one adapter that
writes, finishes and discards them (``weir.operators.file_sink`` decides when).

S3 (Flink's ``S3RecoverableWriter``): a part file is one multipart upload of its final key. Parts
are uploaded as the file grows (each ``part_bytes`` or more, S3's minimum being 5 MiB but for the
last); closing it uploads the last part and answers the upload id and the parts' ETags, the
committable; finishing completes the upload, and only then is the object visible. Until then a
reader listing the prefix sees nothing of it. Unfinished uploads are found by
ListMultipartUploads under the sink's prefix and aborted.

A directory (Flink's local ``RecoverableWriter``): a part file is written to a hidden name beside its
final one (``.part-….<attempt>.inprogress``, which readers such as pyarrow, Spark and Hive skip), fsynced when
closed, and renamed to its final name to finish it (then the directory is fsynced); discarding
deletes the hidden file.

Keys are relative to the sink's root (``s3://bucket/prefix`` or the directory). Failures of S3 or
the file system raise ``ServiceUnavailableError`` naming the object.
"""

from __future__ import annotations

import abc
import enum
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlparse

from botocore.exceptions import BotoCoreError, ClientError

from weir.connectors import s3
from weir.core.config import Endpoints
from weir.core.errors import Fault, ServiceUnavailableError, WeirError

MIN_PART_BYTES: Final = 5 * 1024 * 1024
"""S3's smallest part of a multipart upload (all but the last)."""
DEFAULT_PART_BYTES: Final = 8 * 1024 * 1024
_NO_UPLOAD_CODES: Final = frozenset({"NoSuchUpload", "404", "NotFound"})


class FileSinkPathError(WeirError):
    """The file sink's path names no storage it supports."""

    fault: Fault = Fault.USER


class Finished(enum.Enum):
    """What finishing a part file found."""

    NOW = "now"  # completed (S3) or renamed (directory) by this call
    ALREADY = "already"  # the upload or hidden file is gone and the finished object exists
    MISSING = "missing"  # neither: removed outside the job


@dataclass(frozen=True)
class ClosedPartFile:
    """A part file closed for good: its size, and for S3 the upload and its parts (number, ETag)."""

    size: int
    upload_id: str | None
    parts: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class UnfinishedPartFile:
    """A part file found unfinished: its key as found (the hidden name in a directory) and upload id."""

    key: str
    upload_id: str | None


class PartFileWriter(abc.ABC):
    """An in-progress part file: bytes go in (``write``, file-like, for pyarrow too) until ``close``."""

    closed: bool = False

    @abc.abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> int: ...

    @abc.abstractmethod
    def tell(self) -> int:
        """Bytes written so far."""

    def flush(self) -> None:  # noqa: B027 - file-like for pyarrow; deliberately nothing
        """Nothing: a part file is only durable when closed."""

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @abc.abstractmethod
    def close_part(self) -> ClosedPartFile:
        """Make every byte durable (the last part uploaded, or fsynced) and say what finishes it."""

    @abc.abstractmethod
    def abandon(self) -> None:
        """Give up on the file: abort the upload or delete the hidden file (best effort)."""

    def close(self) -> None:  # noqa: B027 - file-like for pyarrow; deliberately nothing
        """What pyarrow calls when it ends writing: nothing, the sink closes the part itself."""


class PartFileStore(abc.ABC):
    """Where one file sink's part files go."""

    @property
    @abc.abstractmethod
    def uri(self) -> str: ...

    @abc.abstractmethod
    def open_storage(self) -> None:
        """Reach the storage (create the directory); raise a one-line error when it cannot be used."""

    @abc.abstractmethod
    def start(self, key: str, in_progress_key: str) -> PartFileWriter:
        """A new part file that will be ``key`` once finished (a directory writes ``in_progress_key``)."""

    @abc.abstractmethod
    def finish(self, key: str, in_progress_key: str, closed: ClosedPartFile) -> Finished:
        """Make the closed part file visible under ``key``; safe to run again."""

    @abc.abstractmethod
    def discard(self, unfinished: UnfinishedPartFile) -> bool:
        """Abort or delete an unfinished part file; False when it was gone already."""

    @abc.abstractmethod
    def unfinished(self) -> Iterator[UnfinishedPartFile]:
        """Every unfinished part file under the root (of any sink: the caller keeps its own)."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def finished_keys(self) -> Iterator[str]:
        """Keys of every object under the root, unfinished files excluded (for tests and checks)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write a small object (a partition's ``_SUCCESS``, a progress document) whole: a reader sees
        the old one or the new one, never a part (S3's PUT; a directory's write and rename)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """A small object's bytes, None when there is none."""


def open_part_file_store(path: str, endpoints: Endpoints, part_bytes: int = DEFAULT_PART_BYTES) -> PartFileStore:
    """The store of ``s3://bucket/prefix``, ``file:///dir`` or an absolute directory."""
    parsed = urlparse(path)
    match parsed.scheme:
        case "s3":
            if not parsed.netloc:
                raise FileSinkPathError(f"file sink path {path!r}: name the bucket, s3://bucket/prefix")
            return S3PartFileStore(endpoints, parsed.netloc, parsed.path, part_bytes)
        case "file":
            return LocalPartFileStore(Path(unquote(parsed.path)))
        case "" if path.startswith("/"):
            return LocalPartFileStore(Path(path))
        case _:
            raise FileSinkPathError(
                f"file sink path {path!r} is neither s3://bucket/prefix nor an absolute directory (or file:///dir)"
            )


def check_path(path: str) -> None:
    """A path ``open_part_file_store`` takes (checked at job definition, without reaching it)."""
    parsed = urlparse(path)
    if parsed.scheme == "s3" and parsed.netloc:
        return
    if parsed.scheme == "file" or (parsed.scheme == "" and path.startswith("/")):
        return
    raise FileSinkPathError(
        f"file sink path {path!r} is neither s3://bucket/prefix nor an absolute directory (or file:///dir)"
    )


# S3 -----------------------------------------------------------------------------------------------


class S3PartFileStore(PartFileStore):
    def __init__(self, endpoints: Endpoints, bucket: str, prefix: str, part_bytes: int = DEFAULT_PART_BYTES) -> None:
        if part_bytes < MIN_PART_BYTES:
            raise FileSinkPathError(f"S3 part size {part_bytes} is below S3's minimum of {MIN_PART_BYTES} bytes")
        self._endpoints = endpoints
        self.bucket = bucket
        self.prefix = "".join(f"{p}/" for p in prefix.split("/") if p)
        self._part_bytes = part_bytes
        self._client: Any = None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3.client(self._endpoints)
        return self._client

    def _error(self, what: str, key: str, exc: Exception) -> ServiceUnavailableError:
        return ServiceUnavailableError(
            f"file sink: cannot {what} s3://{self.bucket}/{self.prefix}{key}: {exc}; "
            "check that the S3 server answers and that the credentials may write the bucket"
        )

    def open_storage(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise self._error("reach the bucket of", "", exc) from exc

    def start(self, key: str, in_progress_key: str) -> PartFileWriter:
        try:
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.prefix + key)["UploadId"]
        except (ClientError, BotoCoreError) as exc:
            raise self._error("start the multipart upload of", key, exc) from exc
        return _S3PartWriter(self, key, str(upload_id), self._part_bytes)

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        try:
            answer = self.client.upload_part(
                Bucket=self.bucket, Key=self.prefix + key, UploadId=upload_id, PartNumber=number, Body=data
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(f"upload part {number} of", key, exc) from exc
        return str(answer["ETag"])

    def finish(self, key: str, in_progress_key: str, closed: ClosedPartFile) -> Finished:
        assert closed.upload_id is not None, f"part file {key} on S3 without an upload id"
        parts = [{"PartNumber": number, "ETag": etag} for number, etag in closed.parts]
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + key, UploadId=closed.upload_id, MultipartUpload={"Parts": parts}
            )
            return Finished.NOW
        except ClientError as exc:
            if _code(exc) not in _NO_UPLOAD_CODES:
                raise self._error("complete the multipart upload of", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("complete the multipart upload of", key, exc) from exc
        return Finished.ALREADY if self.exists(key) else Finished.MISSING

    def discard(self, unfinished: UnfinishedPartFile) -> bool:
        assert unfinished.upload_id is not None
        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + unfinished.key, UploadId=unfinished.upload_id
            )
            return True
        except ClientError as exc:
            if _code(exc) in _NO_UPLOAD_CODES:
                return False
            raise self._error("abort the multipart upload of", unfinished.key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("abort the multipart upload of", unfinished.key, exc) from exc

    def unfinished(self) -> Iterator[UnfinishedPartFile]:
        paginator = self.client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for upload in page.get("Uploads", []) or []:
                    yield UnfinishedPartFile(str(upload["Key"])[len(self.prefix) :], str(upload["UploadId"]))
        except (ClientError, BotoCoreError) as exc:
            raise self._error("list the multipart uploads under", "", exc) from exc

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return True
        except ClientError as exc:
            if _code(exc) in _NO_UPLOAD_CODES | {"NoSuchKey"}:
                return False
            raise self._error("look up", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("look up", key, exc) from exc

    def finished_keys(self) -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for item in page.get("Contents", []) or []:
                    yield str(item["Key"])[len(self.prefix) :]
        except (ClientError, BotoCoreError) as exc:
            raise self._error("list the objects under", "", exc) from exc

    def read(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise self._error("read", key, exc) from exc

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._error("write", key, exc) from exc

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read())
        except ClientError as exc:
            if _code(exc) in _NO_UPLOAD_CODES | {"NoSuchKey"}:
                return None
            raise self._error("read", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("read", key, exc) from exc


def _code(exc: ClientError) -> str | None:
    code = exc.response.get("Error", {}).get("Code")
    return None if code is None else str(code)


class _S3PartWriter(PartFileWriter):
    """Buffers up to ``part_bytes``, then uploads that much as the next part."""

    def __init__(self, store: S3PartFileStore, key: str, upload_id: str, part_bytes: int) -> None:
        self._store = store
        self._key = key
        self._upload_id = upload_id
        self._part_bytes = part_bytes
        self._buffer = bytearray()
        self._parts: list[tuple[int, str]] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buffer += data
        self._size += len(data)
        if len(self._buffer) >= self._part_bytes:
            self._upload(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def tell(self) -> int:
        return self._size

    def _upload(self, data: bytes) -> None:
        number = len(self._parts) + 1
        self._parts.append((number, self._store.upload_part(self._key, self._upload_id, number, data)))

    def close_part(self) -> ClosedPartFile:
        if self._buffer or not self._parts:
            self._upload(bytes(self._buffer))
            self._buffer.clear()
        self.closed = True
        return ClosedPartFile(self._size, self._upload_id, tuple(self._parts))

    def abandon(self) -> None:
        self.closed = True
        try:
            self._store.discard(UnfinishedPartFile(self._key, self._upload_id))
        except ServiceUnavailableError:
            pass  # the next recovery aborts it


# A local directory ---------------------------------------------------------------------------------


class LocalPartFileStore(PartFileStore):
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def open_storage(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot create the directory {self.root}: {exc}") from exc

    def start(self, key: str, in_progress_key: str) -> PartFileWriter:
        path = self.root / in_progress_key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return _LocalPartWriter(path, open(path, "wb"))  # noqa: SIM115 - closed by close_part or abandon
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot create {path}: {exc}") from exc

    def finish(self, key: str, in_progress_key: str, closed: ClosedPartFile) -> Finished:
        source, target = self.root / in_progress_key, self.root / key
        try:
            os.replace(source, target)
        except FileNotFoundError:
            return Finished.ALREADY if target.exists() else Finished.MISSING
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot rename {source} to {target}: {exc}") from exc
        _fsync_directory(target.parent)
        return Finished.NOW

    def discard(self, unfinished: UnfinishedPartFile) -> bool:
        try:
            (self.root / unfinished.key).unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot delete {self.root / unfinished.key}: {exc}") from exc

    def unfinished(self) -> Iterator[UnfinishedPartFile]:
        for folder, _dirs, names in os.walk(self.root):
            for name in names:
                if name.startswith(".") and name.endswith(".inprogress"):
                    yield UnfinishedPartFile(os.path.relpath(os.path.join(folder, name), self.root), None)

    def exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def finished_keys(self) -> Iterator[str]:
        for folder, _dirs, names in os.walk(self.root):
            for name in names:
                if not (name.startswith(".") and (name.endswith(".inprogress") or name.endswith(".put"))):
                    yield os.path.relpath(os.path.join(folder, name), self.root)

    def put(self, key: str, data: bytes) -> None:
        target = self.root / key
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.put")  # writers never share one
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot write {target}: {exc}") from exc
        _fsync_directory(target.parent)

    def get(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot read {self.root / key}: {exc}") from exc


class _LocalPartWriter(PartFileWriter):
    def __init__(self, path: Path, file: Any) -> None:
        self._path = path
        self._file = file
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        try:
            self._file.write(data)
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot write {self._path}: {exc}") from exc
        self._size += len(data)
        return len(data)

    def tell(self) -> int:
        return self._size

    def close_part(self) -> ClosedPartFile:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        except OSError as exc:
            raise ServiceUnavailableError(f"file sink: cannot make {self._path} durable: {exc}") from exc
        _fsync_directory(self._path.parent)
        self.closed = True
        return ClosedPartFile(self._size, None, ())

    def abandon(self) -> None:
        self.closed = True
        self._file.close()
        self._path.unlink(missing_ok=True)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
