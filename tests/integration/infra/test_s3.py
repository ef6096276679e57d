"""The local S3 server serves the checkpoint bucket with the operations Weir's storage uses, and Weir
reaches it with credentials from wherever boto3's default chain finds them (here: a profile file)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from weir.connectors import s3
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError
from weir.core.ids import CheckpointId, JobId
from weir.core.paths import CheckpointPaths

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


@pytest.fixture
def profile_only(services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The S3 server's keys in a profile of temporary shared credentials and config files, and nowhere
    else: no AWS_* or WEIR_S3_* key variable, no local mode, an empty home. Answers the WEIR_* settings
    of a process outside the local mode that talks to this server."""
    keys = ("WEIR_S3_ACCESS_KEY", "WEIR_S3_SECRET_KEY")
    for name in list(os.environ):
        if (name.startswith("AWS_") and name != "AWS_CA_BUNDLE") or name in keys:
            monkeypatch.delenv(name)
    assert services.s3_access_key is not None and services.s3_secret_key is not None
    credentials = tmp_path / "aws-credentials"
    credentials.write_text(
        f"[weir-it]\naws_access_key_id = {services.s3_access_key}\n"
        f"aws_secret_access_key = {services.s3_secret_key.get_secret_value()}\n"
        f"[weir-it-wrong]\naws_access_key_id = {services.s3_access_key}\naws_secret_access_key = not-the-secret\n"
    )
    config = tmp_path / "aws-config"
    config.write_text("[profile weir-it]\nregion = us-east-1\n[profile weir-it-wrong]\nregion = us-east-1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "weir-it")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert services.s3_endpoint is not None
    s3.forget_sessions()  # the process keeps a session per credentials and region: none of an earlier test
    yield {"WEIR_S3_ENDPOINT": services.s3_endpoint, "WEIR_S3_ADDRESSING_STYLE": "path"}
    s3.forget_sessions()


def test_a_checkpoint_object_through_credentials_from_a_profile_alone(
    services: Endpoints, profile_only: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoints = Endpoints.from_env(profile_only)
    assert not endpoints.local_mode and endpoints.s3_access_key is None and endpoints.s3_secret_key is None
    job = JobId(f"it-profile-{uuid.uuid4().hex[:8]}")
    storage = open_storage(f"s3://{services.s3_bucket}/it-profile", endpoints)
    assert storage._credentials_from == "shared-credentials-file"  # type: ignore[attr-defined]
    key = CheckpointPaths().metadata(job, CheckpointId(7))
    document = b'{"format": "weir-checkpoint-metadata", "version": 1, "checkpoint_id": 7}'
    storage.put_bytes(key, document)
    try:
        assert storage.get_bytes(key) == document
        assert list(storage.list(f"{job}/")) == [(key, len(document))]
    finally:
        storage.delete([key])
    assert not storage.exists(key)

    monkeypatch.setenv("AWS_PROFILE", "weir-it-wrong")  # the server refuses a wrong secret: the message says whose
    s3.forget_sessions()
    refused = open_storage(f"s3://{services.s3_bucket}/it-profile", endpoints)
    with pytest.raises(ServiceUnavailableError, match="refused .* for the credentials from shared-credentials-file"):
        refused.put_bytes(key, document)
