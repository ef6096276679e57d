"""The local S3 server serves the checkpoint bucket with the operations Weir's storage uses."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from weir.connectors import s3
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError

pytestmark = pytest.mark.integration


def test_put_get_list_delete(services: Endpoints) -> None:
    client = s3.client(services)
    prefix = f"infra-test/{uuid.uuid4().hex[:8]}/"
    for i in range(3):
        client.put_object(Bucket=services.s3_bucket, Key=f"{prefix}obj-{i}", Body=f"payload-{i}".encode())

    body = client.get_object(Bucket=services.s3_bucket, Key=f"{prefix}obj-1")["Body"].read()
    assert body == b"payload-1"
    listed = client.list_objects_v2(Bucket=services.s3_bucket, Prefix=prefix)
    assert sorted(o["Key"] for o in listed["Contents"]) == [f"{prefix}obj-{i}" for i in range(3)]

    page = client.list_objects_v2(Bucket=services.s3_bucket, Prefix=prefix, MaxKeys=2)
    assert page["IsTruncated"] is True and len(page["Contents"]) == 2
    rest = client.list_objects_v2(
        Bucket=services.s3_bucket, Prefix=prefix, ContinuationToken=page["NextContinuationToken"]
    )
    assert [o["Key"] for o in rest["Contents"]] == [f"{prefix}obj-2"]

    client.delete_object(Bucket=services.s3_bucket, Key=f"{prefix}obj-0")
    client.delete_objects(Bucket=services.s3_bucket, Delete={"Objects": [{"Key": f"{prefix}obj-{i}"} for i in (1, 2)]})
    assert client.list_objects_v2(Bucket=services.s3_bucket, Prefix=prefix).get("KeyCount", 0) == 0


def test_multipart_upload_round_trip(services: Endpoints, tmp_path: Path) -> None:
    client = s3.client(services)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(12 * 1024 * 1024))
    key = f"infra-test/{uuid.uuid4().hex[:8]}/big.bin"
    config = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)

    client.upload_file(str(source), services.s3_bucket, key, Config=config)
    head = client.head_object(Bucket=services.s3_bucket, Key=key)
    assert head["ContentLength"] == source.stat().st_size
    assert head["ETag"].strip('"').endswith("-3")  # three parts: really a multipart upload

    target = tmp_path / "back.bin"
    client.download_file(services.s3_bucket, key, str(target))
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(source.read_bytes()).digest()
    client.delete_object(Bucket=services.s3_bucket, Key=key)


def test_a_transfer_to_a_bucket_that_does_not_exist_is_a_service_error(services: Endpoints, tmp_path: Path) -> None:
    """boto3's managed transfers raise their own S3UploadFailedError: the storage adapter must turn it
    into a ServiceUnavailableError like every other storage failure (before, it escaped and left a
    savepoint persisting for ever)."""
    storage = open_storage(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/savepoints", services)
    local = tmp_path / "object"
    local.write_bytes(b"x")
    with pytest.raises(ServiceUnavailableError, match="NoSuchBucket"):
        storage.put_file("a", local)
    with pytest.raises(ServiceUnavailableError):
        storage.get_file("a", tmp_path / "back")
