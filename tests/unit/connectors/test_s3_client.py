"""The S3 settings and the clients built from them, without a network: which endpoint, region and
addressing style a client gets, and which credential provider botocore chose (static keys, the
environment, a profile of the shared files, a web identity, container credentials); the local S3
server's development keys only in the local mode, never as a fallback elsewhere; a process without
credentials stops with one line naming what boto3's chain tried.

Every test runs with a private HOME and no ``AWS_*`` variable but those it sets, and with the instance
metadata service disabled: nothing here asks a machine's metadata address for credentials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from weir.connectors import s3
from weir.connectors.object_storage import S3CheckpointStorage, open_storage
from weir.core.config import LOCAL_S3_SERVER, Endpoints, S3AddressingStyle, check_environment, resolve_environment
from weir.core.errors import ConfigurationError

DEV_ACCESS_KEY, DEV_SECRET_KEY = "weiradmin", "weiradmin-secret"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def aws_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No AWS variable of the machine's, an empty home (no ~/.aws), no instance metadata, and an STS
    endpoint on a closed loopback port (a web identity must never reach AWS from a test); no session
    of another test (the process keeps one per credentials and region)."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")
    s3.forget_sessions()
    yield home
    s3.forget_sessions()


def _endpoints(**variables: str) -> Endpoints:
    return Endpoints.from_env(variables)


def _signer_credentials(client: Any) -> Any:
    return client._request_signer._credentials


# The settings ---------------------------------------------------------------------------------------


def test_outside_the_local_mode_s3_is_aws_with_boto3s_chain() -> None:
    endpoints = _endpoints()
    assert endpoints.local_mode is False
    assert (endpoints.s3_endpoint, endpoints.s3_region) == (None, None)
    assert (endpoints.s3_access_key, endpoints.s3_secret_key) == (None, None)
    assert endpoints.s3_addressing_style is S3AddressingStyle.AUTO
    assert endpoints.s3_bucket == "weir-checkpoints", "the bucket's name is no secret: every mode's default"


def test_the_local_mode_takes_the_local_s3_server_of_endpoints_env() -> None:
    endpoints = _endpoints(WEIR_LOCAL_MODE="true")
    local = resolve_environment({})
    assert endpoints.s3_endpoint == local["WEIR_S3_ENDPOINT"] == "http://127.0.0.1:19000"
    assert endpoints.s3_region == "us-east-1"
    assert endpoints.s3_addressing_style is S3AddressingStyle.PATH
    assert endpoints.s3_access_key == DEV_ACCESS_KEY
    assert endpoints.s3_secret_key is not None and endpoints.s3_secret_key.get_secret_value() == DEV_SECRET_KEY
    moved = _endpoints(WEIR_LOCAL_MODE="1", WEIR_S3_PORT="29000")
    assert moved.s3_endpoint == "http://127.0.0.1:29000"


@pytest.mark.parametrize("endpoint", ["https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:19000"])
def test_the_development_keys_go_to_no_endpoint_set_explicitly(endpoint: str) -> None:
    """Even in the local mode: an endpoint of one's own gets its own keys or boto3's chain."""
    endpoints = _endpoints(WEIR_LOCAL_MODE="true", WEIR_S3_ENDPOINT=endpoint)
    assert endpoints.s3_endpoint == endpoint
    assert (endpoints.s3_access_key, endpoints.s3_secret_key, endpoints.s3_region) == (None, None, None)
    assert endpoints.s3_addressing_style is S3AddressingStyle.AUTO


def test_explicit_settings_win_in_every_mode() -> None:
    for mode in ("true", "false"):
        endpoints = _endpoints(
            WEIR_LOCAL_MODE=mode,
            WEIR_S3_REGION="eu-central-1",
            WEIR_S3_ADDRESSING_STYLE="Virtual",
            WEIR_S3_ACCESS_KEY="AKIAEXAMPLE",
            WEIR_S3_SECRET_KEY="example-secret",
        )
        assert endpoints.s3_region == "eu-central-1"
        assert endpoints.s3_addressing_style is S3AddressingStyle.VIRTUAL
        assert endpoints.s3_access_key == "AKIAEXAMPLE"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"WEIR_S3_ACCESS_KEY": "AKIAEXAMPLE"}, "WEIR_S3_ACCESS_KEY='AKIAEXAMPLE': WEIR_S3_ACCESS_KEY and"),
        ({"WEIR_S3_SECRET_KEY": "only-the-secret"}, "WEIR_S3_ACCESS_KEY is unset: WEIR_S3_ACCESS_KEY and"),
        ({"WEIR_S3_ADDRESSING_STYLE": "hosted"}, "WEIR_S3_ADDRESSING_STYLE='hosted': Input should be 'path'"),
        ({"WEIR_LOCAL_MODE": "perhaps"}, "WEIR_LOCAL_MODE='perhaps': Input should be a valid boolean"),
        ({"WEIR_S3_ENDPOINT": "s3.example:9000"}, "WEIR_S3_ENDPOINT='s3.example:9000': expected an http://"),
    ],
)
def test_bad_s3_settings_are_one_line(variables: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_environment(variables)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert "only-the-secret" not in str(caught.value), "a secret's value is never printed"


# The client -----------------------------------------------------------------------------------------


def test_a_local_mode_client_signs_with_the_development_keys_path_style() -> None:
    client, source = s3.connect(_endpoints(WEIR_LOCAL_MODE="true"))
    assert source == "explicit"
    assert client.meta.endpoint_url == "http://127.0.0.1:19000"
    assert client.meta.region_name == "us-east-1"
    assert client.meta.config.s3 == {"addressing_style": "path"}
    credentials = _signer_credentials(client)
    assert (credentials.access_key, credentials.secret_key) == (DEV_ACCESS_KEY, DEV_SECRET_KEY)


def test_without_an_endpoint_the_client_talks_to_aws_in_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    client, source = s3.connect(_endpoints(WEIR_S3_REGION="eu-west-1", WEIR_S3_ADDRESSING_STYLE="virtual"))
    assert source == "env"
    assert client.meta.endpoint_url == "https://s3.eu-west-1.amazonaws.com"
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.config.s3 == {"addressing_style": "virtual"}
    assert client.meta.config.retries == {"total_max_attempts": 6, "mode": "standard"}  # 5 retries
    assert _signer_credentials(client).access_key == "AKIAFROMENV"


def test_an_unset_region_is_boto3s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-southeast-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    client = s3.client(_endpoints(WEIR_S3_ENDPOINT="https://minio.example:9000"))
    assert client.meta.region_name == "ap-southeast-2"
    assert client.meta.endpoint_url == "https://minio.example:9000"
    assert client.meta.config.s3 == {"addressing_style": "auto"}


def test_static_keys_win_over_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    client, source = s3.connect(_endpoints(WEIR_S3_ACCESS_KEY="AKIASTATIC", WEIR_S3_SECRET_KEY="static-secret"))
    assert source == "explicit"
    assert _signer_credentials(client).access_key == "AKIASTATIC"


def test_a_profile_of_the_shared_files_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "credentials"
    shared.write_text("[weir-test]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = profile-secret\n")
    config = tmp_path / "config"
    config.write_text("[profile weir-test]\nregion = eu-north-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "weir-test")
    client, source = s3.connect(_endpoints())
    assert source == "shared-credentials-file"
    assert client.meta.region_name == "eu-north-1", "the profile's region, WEIR_S3_REGION being unset"
    assert _signer_credentials(client).access_key == "AKIAPROFILE"


def test_a_web_identity_token_workload_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What EKS injects for a service account with a role (IRSA): the credentials are fetched from STS
    when first used, never here."""
    token = tmp_path / "token"
    token.write_text("eyJ.header.payload")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/weir-checkpoints")
    client, source = s3.connect(_endpoints(WEIR_S3_REGION="us-west-2"))
    assert source == "assume-role-with-web-identity"
    assert client.meta.endpoint_url == "https://s3.us-west-2.amazonaws.com"


class _ContainerCredentials(BaseHTTPRequestHandler):
    """The container credentials endpoint (ECS, EKS Pod Identity) on a loopback port."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).requests.append(self.headers.get("Authorization", ""))
        body = json.dumps(
            {
                "AccessKeyId": "ASIACONTAINER",
                "SecretAccessKey": "container-secret",
                "Token": "container-token",
                "Expiration": "2999-01-01T00:00:00Z",
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def container_endpoint() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _ContainerCredentials)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/credentials"
    finally:
        server.shutdown()
        server.server_close()


def test_container_credentials(container_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", container_endpoint)
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "pod-identity-token")
    _ContainerCredentials.requests.clear()
    client, source = s3.connect(_endpoints())
    assert source == "container-role"
    assert _signer_credentials(client).access_key == "ASIACONTAINER"
    assert _ContainerCredentials.requests == ["pod-identity-token"]


def test_the_process_keeps_one_session_per_credentials_and_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's chain runs once: a role's credentials are refreshed by botocore, not fetched for every
    storage opened; another key or region is another session."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    endpoints = _endpoints(WEIR_S3_REGION="eu-west-1")
    first, second = s3.client(endpoints), s3.client(endpoints)
    assert first is not second, "a client per storage"
    assert _signer_credentials(first) is _signer_credentials(second), "one resolution of the chain"
    assert s3.session(endpoints) is s3.session(_endpoints(WEIR_S3_REGION="eu-west-1", WEIR_S3_ENDPOINT="http://x:1"))
    assert s3.session(endpoints) is not s3.session(_endpoints(WEIR_S3_REGION="eu-central-1"))
    static = _endpoints(WEIR_S3_ACCESS_KEY="AKIASTATIC", WEIR_S3_SECRET_KEY="static-secret")
    assert s3.session(static) is not s3.session(_endpoints())


# Nothing falls back to the development keys ---------------------------------------------------------


def test_outside_the_local_mode_no_credentials_is_one_line_naming_what_was_tried() -> None:
    with pytest.raises(s3.NoCredentialsError) as caught:
        s3.client(_endpoints())
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("s3: no credentials for AWS: WEIR_S3_ACCESS_KEY and WEIR_S3_SECRET_KEY are unset")
    for tried in (
        "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: unset)",
        "profile 'default' of ~/.aws/credentials and ~/.aws/config",
        "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN: unset)",
        "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI: unset)",
        "the instance metadata service (disabled: AWS_EC2_METADATA_DISABLED)",
    ):
        assert tried in message, tried
    assert DEV_ACCESS_KEY not in message.replace("WEIR_LOCAL_MODE=true", "")
    assert caught.value.fault == "user"


def test_a_named_profile_that_is_not_there_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("[profile weir-prod]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "weir-prod")
    with pytest.raises(s3.NoCredentialsError, match=f"profile 'weir-prod' of ~/.aws/credentials and {config}"):
        s3.client(_endpoints(WEIR_S3_ENDPOINT="https://s3.example"))


def test_no_setting_of_any_mode_but_the_local_one_holds_the_development_keys() -> None:
    """Every combination of the S3 variables but the local mode's switch: no development key, and
    a storage opened on them asks boto3's chain (here: finds nothing) rather than taking them."""
    for endpoint in ("", "http://127.0.0.1:19000", "https://s3.example"):
        for mode in ("", "false", "0"):
            endpoints = _endpoints(WEIR_LOCAL_MODE=mode, WEIR_S3_ENDPOINT=endpoint)
            assert endpoints.local_mode is False
            values = {getattr(endpoints, name.removeprefix("WEIR_").lower()) for name in LOCAL_S3_SERVER}
            assert DEV_ACCESS_KEY not in values and endpoints.s3_secret_key is None
            with pytest.raises(s3.NoCredentialsError):
                open_storage("s3://weir-checkpoints/checkpoints", endpoints)


def test_a_storage_names_where_its_credentials_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    storage = open_storage("s3://weir-checkpoints/checkpoints", _endpoints(WEIR_S3_ENDPOINT="http://127.0.0.1:9"))
    assert isinstance(storage, S3CheckpointStorage)
    assert storage._credentials_from == "env"


def test_a_jobmanager_without_s3_credentials_stops_with_one_line(tmp_path: Path) -> None:
    """The process outside the local mode, checkpoints on S3, no keys, nothing for boto3's chain: exit
    code 2 and one line naming what was tried, before it binds a port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_", "AWS_"))}
    env |= {
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
        "AWS_EC2_METADATA_DISABLED": "true",
        "WEIR_CHECKPOINT_DIR": "s3://weir-checkpoints/checkpoints",
        "WEIR_RUN_DIR": str(tmp_path / "run"),
        "WEIR_LOG_FORMAT": "json",
    }
    result = subprocess.run(
        [sys.executable, "-m", "weir.jobmanager", "--port", "1", "--rest-port", "0", "--metrics-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("jobmanager: error:")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("jobmanager: error: s3: no credentials for AWS:"), errors[0]
    assert "the instance metadata service (disabled: AWS_EC2_METADATA_DISABLED)" in errors[0]
    assert "Traceback" not in result.stderr
