"""Weir's configuration: every ``WEIR_*`` environment variable, typed, in a few pydantic-settings classes.

- :class:`Endpoints`: the services Weir talks to and the ports its processes serve. Their defaults
  live in ``weir/core/endpoints.env`` (shared with the shell scripts under ``deploy/local``), where
  ``${NAME}`` refers to a variable defined above it; a variable set in the environment wins.
- :class:`Directories`: where a process keeps its cache, its run files and its checkpoints.
- :class:`JobManagerSettings`, :class:`TaskManagerSettings`: the defaults of the processes' options.
- :class:`SecuritySettings`: the bearer token and the TLS files of every gRPC service and the REST API.
- :class:`ClientSettings`: the `weir` command's configuration file of profiles (:func:`client_environment`).
- :class:`Diagnostics`: logs and tracebacks; :class:`CrashPointSettings`: fault injection for tests.

Each class is read with ``from_env()`` (the process environment, or a mapping given for a test); a
value that does not fit its type raises :class:`~weir.core.errors.ConfigurationError`, one line naming
each bad variable and why. ``docs/configuration.md`` is generated from these classes
(``python -m weir.tools.config_doc``).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from importlib import resources
from pathlib import Path
from string import Template
from typing import Annotated, Any, ClassVar, Final, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonDict
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from weir.core.errors import ConfigurationError

PREFIX: Final = "WEIR_"
BAD_CONFIGURATION: Final = "bad configuration: "
EXIT_CONFIGURATION: Final = 2
"""The exit code of a process that refuses its configuration (a user error, as the CLI's exit 2)."""

Port = Annotated[int, Field(ge=1, le=65535)]
PortOrZero = Annotated[int, Field(ge=0, le=65535)]
"""A port, or 0: pick a free one (a server port) or serve none (a metrics port)."""

_environment: ContextVar[Mapping[str, str] | None] = ContextVar("weir_config_environment", default=None)


def _current_environment() -> Mapping[str, str]:
    env = _environment.get()
    return os.environ if env is None else env


# The defaults file ----------------------------------------------------------------------------------


@cache
def endpoint_defaults() -> tuple[tuple[str, str], ...]:
    """``(NAME, default)`` in the order of ``weir/core/endpoints.env``, ``${NAME}`` not yet expanded."""
    text = resources.files("weir.core").joinpath("endpoints.env").read_text(encoding="utf-8")
    pairs: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


def resolve_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable of ``endpoints.env``: the environment's value, else the default with ``${NAME}``
    expanded against the values resolved above it (as ``deploy/local/lib.sh`` does)."""
    env = os.environ if environ is None else environ
    resolved: dict[str, str] = {}
    for name, default in endpoint_defaults():
        value = env.get(name)
        resolved[name] = value if value else Template(default).safe_substitute(resolved)
    return resolved


class _EnvironmentSource(EnvSettingsSource):
    """pydantic-settings' environment source over the mapping ``from_env`` was given (else os.environ)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {
            name if self.case_sensitive else name.lower(): value
            for name, value in _current_environment().items()
            if value or not self.env_ignore_empty
        }


LOCAL_MODE: Final = "WEIR_LOCAL_MODE"
LOCAL_S3_SERVER: Final = (
    "WEIR_S3_ENDPOINT",
    "WEIR_S3_REGION",
    "WEIR_S3_ADDRESSING_STYLE",
    "WEIR_S3_ACCESS_KEY",
    "WEIR_S3_SECRET_KEY",
)
"""The defaults of ``endpoints.env`` that describe the local S3 server (deploy/local/s3.sh), its
development keys among them: a process takes them only in the local mode, and only while
``WEIR_S3_ENDPOINT`` is unset (the keys of the local server are never sent to another endpoint).
Elsewhere an unset endpoint is AWS's own and credentials come from boto3's default chain."""


def local_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``WEIR_LOCAL_MODE`` turns the local mode on (``make``, ``weir cluster up``, the tests
    and the tools that drive the local cluster set it). A value that is no boolean counts as off here;
    :class:`Endpoints` refuses it with the usual one line."""
    value = (os.environ if environ is None else environ).get(LOCAL_MODE)
    if not value:
        return False
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return False


def uses_local_s3_server(environ: Mapping[str, str] | None = None) -> bool:
    """The local mode, with no S3 endpoint of its own: the local S3 server's defaults apply."""
    env = os.environ if environ is None else environ
    return local_mode(env) and not env.get("WEIR_S3_ENDPOINT")


class _EndpointsFileSource(PydanticBaseSettingsSource):
    """The defaults of ``weir/core/endpoints.env``, expanded against the environment; those of the
    local S3 server (:data:`LOCAL_S3_SERVER`) only where :func:`uses_local_s3_server`."""

    def _defaults(self) -> dict[str, str]:
        env = _current_environment()
        resolved = resolve_environment(env)
        if not uses_local_s3_server(env):
            for name in LOCAL_S3_SERVER:
                resolved.pop(name, None)
        return resolved

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._defaults().get(env_name(field_name)), field_name, False

    def __call__(self) -> dict[str, Any]:
        resolved = self._defaults()
        names = {env_name(f): f for f in self.settings_cls.model_fields}
        return {names[name]: value for name, value in resolved.items() if name in names}


def env_name(field_name: str) -> str:
    return PREFIX + field_name.upper()


class WeirSettings(BaseSettings):
    """Base of Weir's settings classes: ``WEIR_<FIELD>`` variables, an empty value counts as unset,
    values frozen once read."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", frozen=True)
    title: ClassVar[str] = ""
    from_endpoints_file: ClassVar[bool] = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _EnvironmentSource(settings_cls)]
        if cls.from_endpoints_file:
            sources.append(_EndpointsFileSource(settings_cls))
        return tuple(sources)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The settings from ``environ`` (default: the process environment); a bad value raises
        :class:`ConfigurationError` naming every bad variable."""
        env = os.environ if environ is None else environ
        token = _environment.set(env)
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigurationError(describe_errors(exc, env)) from None
        finally:
            _environment.reset(token)


def describe_errors(error: ValidationError, environ: Mapping[str, str]) -> str:
    """One line: ``NAME='value': why`` for each bad variable, ``; ``-separated. A bad default expanded
    from a bad variable (``WEIR_JOBMANAGER_ADDRESS`` from ``WEIR_JOBMANAGER_PORT``) is left out then."""
    explicit: list[str] = []
    derived: list[str] = []
    for item in error.errors(include_url=False):
        name = env_name(str(item["loc"][0])) if item["loc"] else "?"
        message = str(item["msg"]).removeprefix("Value error, ")
        if environ.get(name):
            explicit.append(f"{name}={environ[name]!r}: {message}")
        elif item.get("input") is None:  # a variable that must be set since another one is
            explicit.append(f"{name} is unset: {message}")
        else:
            value = item.get("input")
            derived.append(f"{name}={value!r} (the default of weir/core/endpoints.env, expanded): {message}")
    return BAD_CONFIGURATION + "; ".join(explicit or derived)


@contextmanager
def exit_on_configuration_error(program: str) -> Iterator[None]:
    """For a process entry point: a :class:`ConfigurationError` becomes ``PROGRAM: error: ...`` on
    stderr and exit code 2, no traceback."""
    try:
        yield
    except ConfigurationError as exc:
        sys.stderr.write(f"{program}: error: {exc}\n")
        raise SystemExit(EXIT_CONFIGURATION) from None


# Endpoints -------------------------------------------------------------------------------------------


class S3AddressingStyle(enum.StrEnum):
    """How a request names its bucket: botocore's ``addressing_style``."""

    PATH = "path"
    VIRTUAL = "virtual"
    AUTO = "auto"


_LOCAL_S3_DEFAULT: Final = "local mode: `{}` (endpoints.env); else unset"


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected host:port with a port in 1..65535")
    return value


class Endpoints(WeirSettings):
    """The services Weir talks to and the ports of the local mode; defaults from ``endpoints.env``."""

    title: ClassVar[str] = "Endpoints (defaults in weir/core/endpoints.env, shared with deploy/local)"
    from_endpoints_file: ClassVar[bool] = True

    kafka_port: Port = Field(description="Port of the local Kafka broker (deploy/local).")
    kafka_controller_port: Port = Field(description="Port of the local Kafka broker's KRaft controller.")
    postgres_port: Port = Field(description="Port of the local PostgreSQL server.")
    s3_port: Port = Field(description="Port of the local S3 server.")
    prometheus_port: Port = Field(description="Port of the local Prometheus.")
    jobmanager_port: Port = Field(description="Port of the JobManager's gRPC service.")
    jobmanager_metrics_port: PortOrZero = Field(description="Port of the JobManager's Prometheus metrics (0: none).")
    jobmanager_rest_port: PortOrZero = Field(description="Port of the JobManager's REST API (0: none).")
    taskmanager_metrics_base_port: PortOrZero = Field(
        description="TaskManager N of the local cluster serves its metrics on this port + N."
    )
    kafka_bootstrap: str = Field(
        min_length=1, description="Kafka bootstrap servers.", json_schema_extra={"type_doc": "host:port[,host:port...]"}
    )
    postgres_dsn: str = Field(
        min_length=1,
        description="PostgreSQL connection of the PostgreSQL sinks and `weir verify`.",
        json_schema_extra={"type_doc": "`postgresql://` URI"},
    )
    local_mode: bool = Field(
        default=False,
        description="The local mode: the local S3 server's endpoint, region, addressing style and development "
        "keys (endpoints.env) are the S3 defaults while `WEIR_S3_ENDPOINT` is unset. Off, an unset S3 setting "
        "is AWS's own: its endpoint, boto3's region and credential chain.",
        json_schema_extra={"default_doc": "`false`; `true` under `make`, `weir cluster up`, the scenarios, the tests"},
    )
    s3_endpoint: str | None = Field(
        default=None,
        min_length=1,
        description="The S3 API (checkpoint storage on `s3://`): an S3-compatible server's URL; unset: AWS's "
        "endpoint for the region.",
        json_schema_extra={
            "type_doc": "URL",
            "default_doc": _LOCAL_S3_DEFAULT.format("http://127.0.0.1:${WEIR_S3_PORT}"),
        },
    )
    s3_region: str | None = Field(
        default=None,
        min_length=1,
        description="The S3 region requests are signed for; unset: boto3's (`AWS_DEFAULT_REGION`, the profile's "
        "`region`), else `us-east-1`.",
        json_schema_extra={"default_doc": _LOCAL_S3_DEFAULT.format("us-east-1")},
    )
    s3_addressing_style: S3AddressingStyle = Field(
        default=S3AddressingStyle.AUTO,
        description="`path` (`endpoint/bucket/key`, what most S3-compatible servers need), `virtual` "
        "(`bucket.endpoint/key`) or `auto` (botocore's choice: virtual-host style where the bucket name allows).",
        json_schema_extra={"default_doc": _LOCAL_S3_DEFAULT.format("path").replace("unset", "`auto`")},
    )
    s3_bucket: str = Field(min_length=1, description="Bucket of checkpoints and savepoints.")
    # The secret first: the check that both keys are set together is the access key's, so that an error
    # names the access key id, never the secret's value.
    s3_secret_key: SecretStr | None = Field(
        default=None,
        description="S3 secret access key, with `WEIR_S3_ACCESS_KEY`.",
        json_schema_extra={"type_doc": "secret string", "default_doc": _LOCAL_S3_DEFAULT.format("weiradmin-secret")},
    )
    s3_access_key: str | None = Field(
        default=None,
        min_length=1,
        validate_default=True,
        description="S3 access key id, with `WEIR_S3_SECRET_KEY`: static keys. Unset: boto3's default credential "
        "chain (`AWS_*` variables, the `AWS_PROFILE` profile of the shared files, web identity, container and "
        "instance roles); a process that finds none says what it tried and stops.",
        json_schema_extra={"default_doc": _LOCAL_S3_DEFAULT.format("weiradmin")},
    )
    prometheus_url: str = Field(
        min_length=1,
        description="The Prometheus that the tests and benchmarks query.",
        json_schema_extra={"type_doc": "URL"},
    )
    jobmanager_address: str = Field(
        description="Where clients and TaskManagers reach the JobManager.", json_schema_extra={"type_doc": "host:port"}
    )

    @field_validator("jobmanager_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        return _host_port(value)

    @field_validator("kafka_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        for server in value.split(","):
            _host_port(server.strip())
        return value

    @field_validator("s3_endpoint", "prometheus_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("s3_addressing_style", mode="before")
    @classmethod
    def _lower_style(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("s3_access_key")
    @classmethod
    def _keys_together(cls, value: str | None, info: ValidationInfo) -> str | None:
        if "s3_secret_key" in info.data and (value is None) != (info.data["s3_secret_key"] is None):
            raise ValueError("WEIR_S3_ACCESS_KEY and WEIR_S3_SECRET_KEY go together (or neither: boto3's chain)")
        return value

    @field_validator("postgres_dsn")
    @classmethod
    def _check_dsn(cls, value: str) -> str:
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("expected a postgresql:// connection URI")
        return value


# Directories -----------------------------------------------------------------------------------------


class Directories(WeirSettings):
    """Where a process keeps its files (``cache_dir()``, ``run_dir()``, ``checkpoint_dir()`` apply the defaults)."""

    title: ClassVar[str] = "Directories"

    cache_dir: Path | None = Field(
        default=None,
        description="Installed services, the wheelhouse, benchmark tools.",
        json_schema_extra={"default_doc": "`$XDG_CACHE_HOME/weir`, else `~/.cache/weir`"},
    )
    run_dir: Path | None = Field(
        default=None,
        description="Logs, pids, local state and the local cluster's files.",
        json_schema_extra={"default_doc": "`$WEIR_CACHE_DIR/run`"},
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="Checkpoint and savepoint storage (`make demo` and the tests use S3).",
        json_schema_extra={
            "default_doc": "`file://$WEIR_RUN_DIR/checkpoints`",
            "type_doc": "`s3://bucket/prefix` or `file:///dir`",
        },
    )

    @field_validator("checkpoint_dir")
    @classmethod
    def _check_storage(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("s3://", "file://")):
            raise ValueError("expected s3://bucket/prefix or file:///directory")
        return value


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$WEIR_CACHE_DIR``, else ``$XDG_CACHE_HOME/weir``, else ``~/.cache/weir`` (as deploy/local/lib.sh)."""
    env = os.environ if environ is None else environ
    explicit = Directories.from_env(env).cache_dir
    if explicit is not None:
        return explicit
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "weir"


def run_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where local processes keep logs, pids and data: ``$WEIR_RUN_DIR``, else ``cache_dir()/run``."""
    explicit = Directories.from_env(environ).run_dir
    return explicit if explicit is not None else cache_dir(environ) / "run"


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> str:
    """Checkpoint storage URI: ``$WEIR_CHECKPOINT_DIR`` (``s3://bucket/prefix`` or ``file:///dir``), else
    ``file://`` under the run dir (the embedded default)."""
    explicit = Directories.from_env(environ).checkpoint_dir
    return explicit if explicit is not None else f"file://{run_dir(environ) / 'checkpoints'}"


# Processes -------------------------------------------------------------------------------------------


class JobManagerSettings(WeirSettings):
    """Defaults of ``python -m weir.jobmanager``'s options (its port comes from the endpoints)."""

    title: ClassVar[str] = "JobManager process"

    jobmanager_bind: str = Field(default="127.0.0.1", min_length=1, description="Address the JobManager binds.")


class HighAvailabilitySettings(WeirSettings):
    """A leader JobManager and standbys (docs/operations.md, "A JobManager that fails over"): each
    JobManager started with ``WEIR_HA_ENABLED=true`` on the same checkpoint storage contends for the
    leader lease there; the one holding it serves, the others wait and take over when it stops renewing.
    ``renew interval < renew deadline < lease duration``: the leader renews every interval, stops acting
    a deadline after its last successful renewal, a standby takes over once the lease stayed unchanged
    for a whole duration (each by its own clock)."""

    title: ClassVar[str] = "High availability (leader JobManager and standbys)"

    ha_enabled: bool = Field(
        default=False, description="Contend for the leader lease in checkpoint storage (`false`: lead at once)."
    )
    ha_lease_duration_s: float = Field(
        default=6.0,
        gt=0,
        json_schema_extra={"type_doc": "seconds > 0"},
        description="How long a standby waits with the lease unchanged before taking it over.",
    )
    ha_renew_interval_s: float = Field(
        default=2.0,
        gt=0,
        json_schema_extra={"type_doc": "seconds > 0"},
        description="How often the leader renews its lease.",
    )
    ha_renew_deadline_s: float = Field(
        default=4.0,
        gt=0,
        json_schema_extra={"type_doc": "seconds > 0"},
        description="The leader stops acting this long after its last successful renewal.",
    )
    ha_advertised_address: str | None = Field(
        default=None,
        min_length=1,
        description="Where this JobManager's clients reach it, written into the lease (shown to operators).",
        json_schema_extra={"type_doc": "host:port", "default_doc": "its bind address and gRPC port"},
    )
    jobmanager_addresses: str | None = Field(
        default=None,
        min_length=1,
        description="Every JobManager (leader and standbys), comma-separated: TaskManagers and clients "
        "call the one that answers (a standby does not serve).",
        json_schema_extra={"type_doc": "host:port,…", "default_doc": "`WEIR_JOBMANAGER_ADDRESS` alone"},
    )

    @field_validator("jobmanager_addresses")
    @classmethod
    def _check_addresses(cls, value: str | None) -> str | None:
        if value is not None:
            for address in value.split(","):
                _host_port(address.strip())
        return value

    @model_validator(mode="after")
    def _check_timing(self) -> HighAvailabilitySettings:
        if not self.ha_renew_interval_s < self.ha_renew_deadline_s < self.ha_lease_duration_s:
            raise ValueError(
                "WEIR_HA_RENEW_INTERVAL_S < WEIR_HA_RENEW_DEADLINE_S < WEIR_HA_LEASE_DURATION_S is needed, got "
                f"{self.ha_renew_interval_s} / {self.ha_renew_deadline_s} / {self.ha_lease_duration_s}"
            )
        return self


def jobmanager_addresses(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The JobManagers a TaskManager or client may call, in order: ``WEIR_JOBMANAGER_ADDRESSES``,
    else ``WEIR_JOBMANAGER_ADDRESS`` alone."""
    listed = HighAvailabilitySettings.from_env(environ).jobmanager_addresses
    if listed:
        return tuple(a.strip() for a in listed.split(",") if a.strip())
    return (Endpoints.from_env(environ).jobmanager_address,)


class TaskManagerSettings(WeirSettings):
    """Defaults of ``python -m weir.taskmanager``'s options; a command-line option wins.

    Slot processes (``WEIR_TASKMANAGER_SLOT_PROCESSES``, ``--[no-]slot-processes``): a Python process
    runs on one core at a time (its interpreter lock), so with ``true`` a TaskManager runs each job
    slot's tasks (one job's, Flink's slot sharing) in a slot worker process of its own and N slots use
    N cores; the TaskManager process keeps the registration, the heartbeats, the gRPC service and the
    data-plane address (README, "Architecture"). ``false``, the default for now, runs every task in the
    TaskManager's process, as threads sharing one core: one process less per slot (memory) and
    channels between its slots in memory. The default stays off until the whole test suite has run
    with slot processes on (``WEIR_TASKMANAGER_SLOT_PROCESSES=true make test``); the figure it is
    chosen on is ``make bench-slots`` (``bench/results/slots.md``): 1 vs 2 slots on one TaskManager."""

    title: ClassVar[str] = "TaskManager process"

    taskmanager_id: str | None = Field(
        default=None,
        min_length=1,
        description="This TaskManager's id (set by the TaskManager for its own threads; crash point scopes match it).",
        json_schema_extra={"default_doc": "the host name (in a container: its own)"},
    )
    taskmanager_host: str | None = Field(
        default=None,
        min_length=1,
        description="Address other processes reach this TaskManager at.",
        json_schema_extra={
            "default_doc": "the bind address; bound to every interface (`0.0.0.0`): what the host name resolves to"
        },
    )
    taskmanager_bind: str = Field(default="127.0.0.1", min_length=1, description="Address the TaskManager binds.")
    taskmanager_port: PortOrZero = Field(default=0, description="Port of the TaskManager's gRPC service (0: any).")
    taskmanager_slots: int = Field(default=2, ge=1, description="Task slots this TaskManager offers.")
    taskmanager_local_channels: bool = Field(
        default=True, description="Hand buffers to consumers in the same TaskManager in memory, not over gRPC."
    )
    taskmanager_slot_processes: bool = Field(
        default=False,
        description="Run each slot's tasks in a worker process of its own, so that N slots use N cores "
        "(`false`: every task in the TaskManager's process, one core; see above).",
    )
    taskmanager_metrics_port: PortOrZero = Field(default=0, description="Port of its Prometheus metrics (0: none).")


class PythonJobSettings(WeirSettings):
    """How a job's Python code is loaded (``weir run``, the JobManager at submit, the TaskManagers;
    docs/jobs.md, "Jobs of many files")."""

    title: ClassVar[str] = "Python jobs"

    job_load_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a job's import and build(env) may take at submit (in a child process) before "
        "it is refused; also bounds installing its requirements.",
        json_schema_extra={"type_doc": "seconds (a number above 0)"},
    )
    job_artifact_max_bytes: int = Field(
        default=48 * 1024 * 1024,
        ge=1,
        description="The largest job artifact (--py-files, --py-requirements and their wheels, zipped) a "
        "client sends and a JobManager accepts.",
    )


# Security --------------------------------------------------------------------------------------------

_PEM: Final[JsonDict] = {"type_doc": "path of a PEM file"}


class SecuritySettings(WeirSettings):
    """Authentication and TLS of every gRPC service (the JobManager's, the TaskManagers' control and
    data plane) and of the REST API, and of every client of them (docs/security.md). A process that
    binds a non-loopback address refuses to start without a token. A client speaks TLS when
    `WEIR_TLS_CA_FILE` or `WEIR_TLS_CERT_FILE` is set; a server when `WEIR_TLS_CERT_FILE` is set."""

    title: ClassVar[str] = "Security: authentication and TLS"

    auth_token: SecretStr | None = Field(
        default=None,
        description="The bearer token every call carries and every server requires (`authorization: Bearer ...`).",
        json_schema_extra={"type_doc": "secret string"},
    )
    auth_token_file: Path | None = Field(
        default=None,
        validate_default=True,
        description="A file holding the token (a mounted secret), instead of `WEIR_AUTH_TOKEN`.",
    )
    auth_tokens_file: Path | None = Field(
        default=None,
        description="Tokens given per client, one `<role> <token>` or `<role> sha256:<hex>` a line; roles "
        "`read`, `operate` (cancel, stop, savepoint), `submit` (run code); each holds the ones before it. "
        "Set on the cluster's processes: their servers then accept these tokens (and the internal token) "
        "only, and `WEIR_AUTH_TOKEN` is just what the process sends as a client. Needs `WEIR_INTERNAL_TOKEN`.",
    )
    internal_token: SecretStr | None = Field(
        default=None,
        description="The token the JobManager and the TaskManagers send each other (registration, "
        "heartbeats, acknowledgements, deployments, data channels): role `internal` only, distinct from every "
        "client token.",
        json_schema_extra={"type_doc": "secret string"},
    )
    internal_token_file: Path | None = Field(
        default=None,
        validate_default=True,
        description="A file holding the internal token, instead of `WEIR_INTERNAL_TOKEN`.",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="This process's certificate chain: served by its servers, shown by its clients when asked.",
        json_schema_extra=_PEM,
    )
    tls_key_file: Path | None = Field(
        default=None,
        validate_default=True,
        description="The private key of `WEIR_TLS_CERT_FILE`.",
        json_schema_extra=_PEM,
    )
    tls_ca_file: Path | None = Field(
        default=None,
        description="The CA certificates clients trust for the servers' certificates (unset: the system's).",
        json_schema_extra=_PEM,
    )
    tls_client_ca_file: Path | None = Field(
        default=None,
        validate_default=True,
        description="Servers require a client certificate signed by one of these CAs (mutual TLS).",
        json_schema_extra=_PEM,
    )
    tls_server_name: str | None = Field(
        default=None,
        min_length=1,
        description="The name clients check the servers' certificates against, instead of the host they dial.",
    )

    @field_validator("auth_token_file")
    @classmethod
    def _one_token(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("auth_token") is not None:
            raise ValueError("set WEIR_AUTH_TOKEN or WEIR_AUTH_TOKEN_FILE, not both")
        return value

    storage_mac_key: SecretStr | None = Field(
        default=None,
        description="The cluster's secret for the keyed MAC (HMAC-SHA256) over every object written to checkpoint "
        'storage, checked before an object read back is decoded (docs/formats.md, "Authenticated objects"); at '
        "least 16 bytes, the same on the JobManager, every TaskManager and the tools that read savepoints. Unset: "
        "objects are written and read without one (a warning at start when the storage is S3).",
        json_schema_extra={"type_doc": "secret string"},
    )
    storage_mac_key_file: Path | None = Field(
        default=None,
        validate_default=True,
        description="A file holding the storage MAC key, instead of `WEIR_STORAGE_MAC_KEY`.",
    )

    @field_validator("storage_mac_key_file")
    @classmethod
    def _one_storage_key(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("storage_mac_key") is not None:
            raise ValueError("set WEIR_STORAGE_MAC_KEY or WEIR_STORAGE_MAC_KEY_FILE, not both")
        return value

    @field_validator("internal_token_file")
    @classmethod
    def _one_internal_token(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("internal_token") is not None:
            raise ValueError("set WEIR_INTERNAL_TOKEN or WEIR_INTERNAL_TOKEN_FILE, not both")
        return value

    @field_validator("tls_key_file")
    @classmethod
    def _key_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if (value is None) != (info.data.get("tls_cert_file") is None):
            raise ValueError("WEIR_TLS_CERT_FILE and WEIR_TLS_KEY_FILE go together")
        return value

    @field_validator("tls_client_ca_file")
    @classmethod
    def _client_ca_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("tls_cert_file") is None:
            raise ValueError("mutual TLS needs the servers' own certificate: set WEIR_TLS_CERT_FILE too")
        return value


# The client's configuration file ------------------------------------------------------------------------

DEFAULT_CONFIG_FILE: Final = Path("~/.config/weir/config.toml")


class ClientSettings(WeirSettings):
    """Which cluster the `weir` command talks to, from a configuration file of named profiles
    (docs/cli.md, "Profiles"), as kubectl's contexts or Flink's ``conf/config.yaml`` for its client.
    Precedence: a flag (`-m`) > the environment (`WEIR_JOBMANAGER_ADDRESS`, `WEIR_AUTH_*`, `WEIR_TLS_*`)
    > the profile > the defaults."""

    title: ClassVar[str] = "The weir command: configuration file and profile"

    config: Path | None = Field(
        default=None,
        description="The client's configuration file (TOML, `[profiles.NAME]` tables).",
        json_schema_extra={"default_doc": "`~/.config/weir/config.toml`"},
    )
    profile: str | None = Field(
        default=None,
        min_length=1,
        description="The profile of the configuration file `weir` uses (`--profile` wins).",
        json_schema_extra={"default_doc": "the file's `default_profile`, else none"},
    )

    @property
    def config_file(self) -> Path:
        return (self.config or DEFAULT_CONFIG_FILE).expanduser()


class ClientProfile(BaseModel):
    """One ``[profiles.NAME]`` table: a cluster's address and how to reach it securely. Paths are
    relative to the configuration file. The token is given by reference (``token_file``, ``token_env``)
    or, in a file only its owner may read (mode 0600), literally (``token``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None
    token: SecretStr | None = None
    token_file: Path | None = None
    token_env: str | None = None
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_server_name: str | None = None

    @model_validator(mode="after")
    def _one_token(self) -> Self:
        given = [name for name in ("token", "token_file", "token_env") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of token, token_file, token_env, not {' and '.join(given)}")
        return self


class ClientConfigFile(BaseSettings):
    """The TOML configuration file of the `weir` command, read with pydantic-settings' TOML source."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    default_profile: str | None = None
    profiles: dict[str, ClientProfile] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (TomlConfigSettingsSource(settings_cls, _reading_config.get()),)

    @classmethod
    def read(cls, path: Path) -> ClientConfigFile:
        """The file at ``path``; one-line ConfigurationError for a file that is no TOML or does not fit."""
        token = _reading_config.set(path)
        try:
            return cls()
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
                for e in exc.errors(include_url=False)
            )
            raise ConfigurationError(f"config file {path}: {problems}") from None
        except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
            raise ConfigurationError(f"config file {path}: {' '.join(str(exc).split())}") from None
        finally:
            _reading_config.reset(token)


_reading_config: ContextVar[Path] = ContextVar("weir_client_config_file", default=DEFAULT_CONFIG_FILE)

_TOKEN_VARIABLES: Final = ("WEIR_AUTH_TOKEN", "WEIR_AUTH_TOKEN_FILE")
_CERTIFICATE_VARIABLES: Final = ("WEIR_TLS_CERT_FILE", "WEIR_TLS_KEY_FILE")


def client_environment(profile_flag: str | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``WEIR_*`` environment the `weir` command's client reads: the process environment over the
    chosen profile's values (a variable set wins; the token and the certificate/key pair each as a
    whole). The profile: ``profile_flag``, else ``WEIR_PROFILE``, else the file's ``default_profile``;
    none chosen and no file: the environment alone. A profile asked for that is not there, a file that
    does not parse, a literal token in a file others may read: ConfigurationError, one line."""
    env = dict(os.environ if environ is None else environ)
    settings = ClientSettings.from_env(env)
    path = settings.config_file
    name = profile_flag or settings.profile
    if not path.is_file():
        if name is not None:
            raise ConfigurationError(f"profile {name!r}: no config file {path} (WEIR_CONFIG)")
        return env
    config = ClientConfigFile.read(path)
    name = name or config.default_profile
    if name is None:
        return env
    profile = config.profiles.get(name)
    if profile is None:
        known = ", ".join(sorted(config.profiles)) or "none"
        raise ConfigurationError(f"config file {path} has no profile {name!r} (it has: {known})")
    values = _profile_variables(profile, name, path, env)
    if any(env.get(v) for v in _TOKEN_VARIABLES):
        for variable in _TOKEN_VARIABLES:
            values.pop(variable, None)
    if any(env.get(v) for v in _CERTIFICATE_VARIABLES):
        for variable in _CERTIFICATE_VARIABLES:
            values.pop(variable, None)
    return {**values, **{k: v for k, v in env.items() if v}}


def _profile_variables(profile: ClientProfile, name: str, path: Path, env: Mapping[str, str]) -> dict[str, str]:
    where = f"profile {name!r} of {path}"

    def file(value: Path) -> str:
        return str(path.parent / value.expanduser())  # an absolute value stays as it is

    values: dict[str, str] = {}
    if profile.address is not None:
        values["WEIR_JOBMANAGER_ADDRESS"] = profile.address
    if profile.token is not None:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigurationError(
                f"{where} holds a token but the file is readable by others (mode {mode:04o}): "
                f"chmod 600 {path}, or use token_file or token_env"
            )
        values["WEIR_AUTH_TOKEN"] = profile.token.get_secret_value()
    if profile.token_file is not None:
        values["WEIR_AUTH_TOKEN_FILE"] = file(profile.token_file)
    if profile.token_env is not None:
        token = env.get(profile.token_env)
        if not token:
            raise ConfigurationError(f"{where}: token_env names {profile.token_env}, which is unset")
        values["WEIR_AUTH_TOKEN"] = token
    for variable, given in (
        ("WEIR_TLS_CA_FILE", profile.tls_ca_file),
        ("WEIR_TLS_CERT_FILE", profile.tls_cert_file),
        ("WEIR_TLS_KEY_FILE", profile.tls_key_file),
    ):
        if given is not None:
            values[variable] = file(given)
    if profile.tls_server_name is not None:
        values["WEIR_TLS_SERVER_NAME"] = profile.tls_server_name
    return values


# Diagnostics -----------------------------------------------------------------------------------------


class LogFormat(enum.StrEnum):
    JSON = "json"
    CONSOLE = "console"


class LogLevel(enum.StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class Diagnostics(WeirSettings):
    """Logs and tracebacks."""

    title: ClassVar[str] = "Logs and diagnostics"

    log_format: LogFormat | None = Field(
        default=None,
        description="`json` (one JSON object a line) or `console`.",
        json_schema_extra={"default_doc": "`console` on a terminal, else `json`"},
    )
    log_level: LogLevel = Field(default=LogLevel.INFO, description="Lowest level logged (any case).")
    debug: bool = Field(default=False, description="`weir` prints the traceback of an error too.")

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class CrashPointSettings(WeirSettings):
    """Fault injection for recovery tests (``weir.core.crashpoints``; docs/operations.md, "Crash points")."""

    title: ClassVar[str] = "Crash points (tests)"

    crash_point: str | None = Field(
        default=None, description="One armed crash point: `name[@taskmanager][#subtask][:count]`."
    )
    crash_points: str | None = Field(default=None, description="Armed crash points, comma-separated.")
    pause_points: str | None = Field(
        default=None,
        description="Armed pause points, comma-separated: the process stops itself (SIGSTOP) there until woken.",
    )
    crash_once_dir: Path | None = Field(
        default=None, description="A point fires once per cluster, not per process: markers in this directory."
    )


SETTINGS: Final[tuple[type[WeirSettings], ...]] = (
    Endpoints,
    Directories,
    JobManagerSettings,
    HighAvailabilitySettings,
    TaskManagerSettings,
    PythonJobSettings,
    SecuritySettings,
    ClientSettings,
    Diagnostics,
    CrashPointSettings,
)
"""Every settings class, in the order of docs/configuration.md."""


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Read every settings class once, so that a process refuses a bad variable at start, in one line
    naming all of them, rather than when some thread first reads it."""
    problems: list[str] = []
    for settings in SETTINGS:
        try:
            settings.from_env(environ)
        except ConfigurationError as exc:
            problems.append(str(exc).removeprefix(BAD_CONFIGURATION))
    if problems:
        raise ConfigurationError(BAD_CONFIGURATION + "; ".join(problems))
