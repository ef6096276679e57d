"""S3 adapter: the one module that builds boto3 clients for checkpoint storage.

Works against AWS, the local S3 server and other S3-compatible servers (MinIO). Where the settings
(:class:`~weir.core.config.Endpoints`) name no static keys, credentials come from boto3's default
chain, as Flink's S3 filesystems take the AWS SDK's default provider chain: the ``AWS_*`` variables,
the ``AWS_PROFILE`` profile of the shared credentials and config files, a web identity token
(Kubernetes workload identity), container credentials, then the instance's role. The region and the
endpoint are settings (unset: boto3's region, AWS's endpoint), and so is the addressing style.
Payload checksums only where the API requires them, which every S3-compatible server accepts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any, Final

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError

from weir.core.config import LOCAL_MODE, Endpoints
from weir.core.errors import ConfigurationError, ServiceUnavailableError


class NoCredentialsError(ConfigurationError):
    """No static keys are set and boto3's default chain found no credentials: the message names what
    the chain tried; give the process an identity or set the keys."""


_SessionKey = tuple[str | None, str | None, str | None]
_sessions: dict[_SessionKey, boto3.session.Session] = {}
_sessions_lock = threading.Lock()  # a boto3 session is not thread-safe; its clients are


def session(endpoints: Endpoints) -> boto3.session.Session:
    """The process's session for these credentials and region: the static keys when the settings have
    them, else boto3's default credential chain; the region of the settings, else boto3's.

    One per process and key, as boto3's default session: the chain runs once (an instance role's or a web
    identity's credentials are then refreshed by botocore before they expire, not fetched anew for every
    storage opened), and the service models are loaded once."""
    secret = endpoints.s3_secret_key
    key: _SessionKey = (
        endpoints.s3_access_key,
        secret.get_secret_value() if secret is not None else None,
        endpoints.s3_region,
    )
    with _sessions_lock:
        found = _sessions.get(key)
        if found is None:
            found = _sessions[key] = boto3.session.Session(
                aws_access_key_id=key[0],
                aws_secret_access_key=key[1],
                region_name=key[2],
                botocore_session=botocore.session.Session(),
            )
        return found


def forget_sessions() -> None:
    """Drop the sessions: the next client runs boto3's chain again (tests that change the AWS_* environment)."""
    with _sessions_lock:
        _sessions.clear()


def client_config(endpoints: Endpoints) -> Config:
    """The botocore configuration of every S3 client: addressing style, retries, timeouts."""
    return Config(
        s3={"addressing_style": endpoints.s3_addressing_style.value},
        retries={"max_attempts": 5, "mode": "standard"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=5,
        read_timeout=60,
    )


def credentials(s: boto3.session.Session, endpoints: Endpoints) -> Credentials:
    """The credentials of ``session(endpoints)``; :class:`NoCredentialsError` naming what boto3's
    chain tried when it found none. ``.method`` says where they came from (``explicit``: the static
    keys; ``env``, ``shared-credentials-file``, ``assume-role-with-web-identity``, ``container-role``,
    ``iam-role``, ...)."""
    found: Credentials | None = s.get_credentials()
    if found is None:
        raise NoCredentialsError(_nothing_found(s, endpoints))
    return found


def connect(endpoints: Endpoints) -> tuple[Any, str]:
    """A boto3 S3 client for the configured endpoint (unset: AWS's), region and credentials, and where
    its credentials came from (botocore's provider name, for messages).

    Credentials are resolved here, once, so that a process without any fails where it starts, with one
    line naming what was tried, rather than on its first checkpoint. Refreshable ones (a web identity,
    a role) are refreshed by botocore as they near their expiry."""
    s = session(endpoints)
    with _sessions_lock:
        source = credentials(s, endpoints).method
        made = s.client("s3", endpoint_url=endpoints.s3_endpoint, config=client_config(endpoints))
    return made, source


def client(endpoints: Endpoints) -> Any:
    """The boto3 S3 client of :func:`connect`."""
    return connect(endpoints)[0]


# Where boto3's chain looks, by botocore's provider names, grouped as a person configures them.
_PROFILE = "profile {profile} of {credentials_file} and {config_file} (keys, role_arn, sso, credential_process)"
_PROVIDERS: Final[Mapping[str, str]] = {
    "env": "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY{env})",
    "assume-role": _PROFILE,
    "assume-role-with-web-identity": "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN{web})",
    "sso": _PROFILE,
    "shared-credentials-file": _PROFILE,
    "login": _PROFILE,
    "custom-process": _PROFILE,
    "config-file": _PROFILE,
    "ec2-credentials-file": "the legacy EC2 and boto credential files",
    "boto-config": "the legacy EC2 and boto credential files",
    "container-role": "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI{container})",
    "iam-role": "the instance metadata service{imds}",
}


def _unset(*names: str) -> str:
    return "" if any(os.environ.get(name) for name in names) else ": unset"


def _nothing_found(s: boto3.session.Session, endpoints: Endpoints) -> str:
    """One line: where no credentials were found, in the order boto3's chain looked."""
    core = s._session  # the botocore session: its resolver holds the providers the chain ran
    facts = {
        "profile": repr(s.profile_name or "default"),
        "credentials_file": core.get_config_variable("credentials_file"),
        "config_file": core.get_config_variable("config_file"),
        "env": _unset("AWS_ACCESS_KEY_ID"),
        "web": _unset("AWS_WEB_IDENTITY_TOKEN_FILE"),
        "container": _unset("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"),
        "imds": " (disabled: AWS_EC2_METADATA_DISABLED)"
        if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"  # as botocore reads it
        else "",
    }
    resolver = core.get_component("credential_provider")
    tried = list(dict.fromkeys(_PROVIDERS.get(p.METHOD, p.METHOD).format(**facts) for p in resolver.providers))
    return (
        f"s3: no credentials for {endpoints.s3_endpoint or 'AWS'}: WEIR_S3_ACCESS_KEY and WEIR_S3_SECRET_KEY are "
        f"unset and boto3's default chain found none; it tried {'; '.join(tried)}. Give the process an identity "
        f"(a profile, a web identity, a container or instance role) or set both keys ({LOCAL_MODE}=true: the "
        "local S3 server's development keys)"
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
            s3.create_bucket(Bucket=bucket, **_location(s3.meta.region_name))
        except ClientError as exc:  # created meanwhile by another client
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
            return False
    except (ClientError, BotoCoreError) as exc:
        raise ServiceUnavailableError(
            f"s3: cannot create the bucket {bucket} at {endpoints.s3_endpoint or 'AWS'}: {exc}; "
            "check that the S3 server answers and that the credentials may create it"
        ) from exc
    return True


def _location(region: str | None) -> dict[str, Any]:
    """CreateBucket's location: AWS wants the client's region named, except us-east-1 (its default)."""
    if region is None or region in ("us-east-1", "aws-global"):
        return {}
    return {"CreateBucketConfiguration": {"LocationConstraint": region}}
