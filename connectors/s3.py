"""S3 adapter: the one module that builds boto3 clients for checkpoint storage.

Works against the local S3 server and MinIO. Path-style addressing; payload checksums only where
the API requires them, which every S3-compatible server accepts.
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError


def client(endpoints: Endpoints) -> Any:
    """A boto3 S3 client for the configured endpoint and credentials."""
    return boto3.client(
        "s3",
        endpoint_url=endpoints.s3_endpoint,
        aws_access_key_id=endpoints.s3_access_key,
        aws_secret_access_key=endpoints.s3_secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 5, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            connect_timeout=5,
            read_timeout=60,
        ),
    )


def ensure_bucket(endpoints: Endpoints, bucket: str) -> bool:
    """Create ``bucket`` unless it exists; True when it was created. Safe to run again."""
    s3 = client(endpoints)
    try:
        try:
            s3.head_bucket(Bucket=bucket)
            return False
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as exc:  # created meanwhile by another client
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
            return False
    except (ClientError, BotoCoreError) as exc:
        raise ServiceUnavailableError(
            f"s3: cannot create the bucket {bucket} at {endpoints.s3_endpoint}: {exc}; "
            "check that the S3 server answers and WEIR_S3_ACCESS_KEY / WEIR_S3_SECRET_KEY"
        ) from exc
    return True
