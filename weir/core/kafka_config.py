"""One Kafka client configuration per job: where it is merged, how its secrets are referenced, resolved
and kept out of records and logs.

A job reaches one Kafka cluster. Its clients (each source's consumer and dead-letter producer, each
sink's producer and commit-marker clients, the JobManager's admin checks at submit and the end-of-job
resolution, ``weir verify``) take their settings from three layers, the later winning key by key:

1. the endpoints: ``bootstrap.servers`` is ``WEIR_KAFKA_BOOTSTRAP``;
2. the job's parameters: ``-D kafka.<librdkafka key>=value`` (``kafka.bootstrap.servers`` included:
   a job may read and write another cluster than the endpoints');
3. the connector's own ``properties=`` (a source's, a sink's), for that connector's clients only.

:func:`kafka_client_config` is that merge, the one every client site calls. It keeps values as
given: a secret is written as a reference, ``${env:NAME}`` or ``${file:/absolute/path}``, which the
job record, the logs and every message keep as it is; :meth:`KafkaClientConfig.client_settings`
resolves the references in the process that creates the client (the JobManager, each TaskManager),
right before the client is made, and the resolved settings are handed to the client alone. A literal
value of a secret setting (``sasl.password``, ``ssl.key.password``, ...) is refused where the job is
defined or submitted: it would be stored in the job record. Flink's Kafka connector takes its client
``Properties`` the same way, per source and sink; the references follow Kafka's own
``ConfigProvider`` syntax (``${provider:path}``).

Pure apart from :func:`resolve_references`'s environment and file reads: no Kafka client here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from weir.core.config import Endpoints
from weir.core.errors import JobDefinitionError

JOB_PARAMETER_PREFIX: Final = "kafka."
"""A job parameter ``kafka.<key>=value`` is the librdkafka setting ``<key>`` of every client of the job."""

BOOTSTRAP_SERVERS: Final = "bootstrap.servers"

REDACTED: Final = "<redacted>"

_SECRET_KEY = re.compile(r"password|passphrase|secret|token|(^|\.)key\.pem$")
_NOT_SECRET_SUFFIXES: Final = (".url",)  # sasl.oauthbearer.token.endpoint.url names a place, not a secret
_REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.-]*):([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

RESERVED_PROPERTIES: Final[Mapping[str, str]] = {
    "group.id": "give the source group_id= instead",
    "enable.auto.commit": "Weir commits positions itself when a checkpoint completes (commit_offsets_on_checkpoint=)",
    "enable.auto.offset.store": "Weir commits positions itself when a checkpoint completes",
    "isolation.level": "a Weir source reads read_committed",
    "auto.offset.reset": "give the source starting_offsets= instead",
    "enable.partition.eof": "a bounded source relies on end-of-partition events",
    "transactional.id": "each exactly-once sink subtask has its own, derived from the job and the sink",
    "transaction.timeout.ms": "give the sink transaction_timeout_ms= instead",
    "enable.idempotence": "Weir's producers are idempotent (the exactly-once sink needs it)",
    "acks": "Weir's producers wait for all in-sync replicas (acks=all)",
}
"""Client settings Weir sets itself, in every layer, with what to do instead."""

CONNECTOR_RESERVED: Final[Mapping[str, str]] = {
    BOOTSTRAP_SERVERS: (
        "a job reaches one cluster: Weir connects to the broker of its endpoints (WEIR_KAFKA_BOOTSTRAP), or to "
        "the job's -D kafka.bootstrap.servers"
    ),
}
"""Settings a connector's ``properties=`` may not give, beyond :data:`RESERVED_PROPERTIES`."""

Properties = tuple[tuple[str, str], ...]
"""Client settings as sorted ``(key, value)`` pairs, references unresolved."""

ReadText = Callable[[Path], str]


def is_secret_key(key: str) -> bool:
    """A setting whose value is a secret: its name says password, passphrase, secret or token (a
    ``.url`` aside), or it is a PEM private key (``ssl.key.pem``)."""
    name = key.strip().lower()
    return bool(_SECRET_KEY.search(name)) and not name.endswith(_NOT_SECRET_SUFFIXES)


def is_reference_only(value: str) -> bool:
    """The value is one or more references and nothing else (no literal character)."""
    return bool(value) and not _REFERENCE.sub("", value)


def redact(key: str, value: str) -> str:
    """What may be shown of a setting: a secret's value only when it is references alone."""
    if is_secret_key(key) and not is_reference_only(value):
        return REDACTED
    return value


def redacted(properties: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The settings as they may be logged or shown (:func:`redact`)."""
    return {key: redact(key, value) for key, value in properties}


def check_property(key: object, value: object, where: str) -> tuple[str, str]:
    """One setting as given by the job: strings, references well formed, a secret given by reference.
    ``where`` names it in the error (``kafka source 'orders' property 'sasl.password'``)."""
    if not isinstance(key, str) or not isinstance(value, str):
        shown = REDACTED if isinstance(key, str) and is_secret_key(key) else repr(value)
        raise JobDefinitionError(f"{where}: keys and values must be strings, got {shown}")
    key = key.strip()
    if not key:
        raise JobDefinitionError(f"{where}: the setting's name is empty")
    for provider, argument in _REFERENCE.findall(value):
        _check_reference(provider, argument, where)
    if is_secret_key(key) and not is_reference_only(value):
        raise JobDefinitionError(
            f"{where} holds a literal secret: give ${{env:NAME}} (an environment variable of the JobManager and "
            "every TaskManager) or ${file:/absolute/path} (a file on each of them) instead, so that it stays out "
            "of the job record and the logs"
        )
    return key, value


def _check_reference(provider: str, argument: str, where: str) -> None:
    match provider:
        case "env":
            if not _ENV_NAME.fullmatch(argument):
                raise JobDefinitionError(
                    f"{where}: ${{env:{argument}}} does not name an environment variable (letters, digits, _)"
                )
        case "file":
            if not argument or not Path(argument).is_absolute():
                raise JobDefinitionError(
                    f"{where}: ${{file:{argument}}} must name an absolute path: each process resolves it on its own "
                    "host, from its own working directory"
                )
        case _:
            raise JobDefinitionError(
                f"{where}: unknown reference ${{{provider}:...}}: a value may hold ${{env:NAME}} or ${{file:/path}}"
            )


def check_properties(properties: Mapping[str, str], what: str, *, connector: bool) -> Properties:
    """A layer's settings as sorted pairs, each checked (:func:`check_property`); a setting Weir sets
    itself is refused with what to do instead (``connector``: also ``bootstrap.servers``). ``what``
    names the layer: ``kafka source 'orders' property``, ``job parameter kafka.``."""
    checked: dict[str, str] = {}
    for raw_key, raw_value in properties.items():
        key, value = check_property(raw_key, raw_value, f"{what}{raw_key!r}" if connector else f"{what}{raw_key}")
        name = key.lower()
        reason = RESERVED_PROPERTIES.get(name) or (CONNECTOR_RESERVED.get(name) if connector else None)
        if reason is not None:
            shown = f"{what}{raw_key!r}" if connector else f"{what}{raw_key}"
            raise JobDefinitionError(f"{shown} is set by Weir and cannot be overridden: {reason}")
        if name == BOOTSTRAP_SERVERS:
            _check_bootstrap(value, f"{what}{raw_key}")
        checked[key] = value
    return tuple(sorted(checked.items()))


def _check_bootstrap(value: str, where: str) -> None:
    for server in value.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise JobDefinitionError(f"{where}={value!r}: expected host:port[,host:port...]")


def job_properties(parameters: Mapping[str, str]) -> Properties:
    """The job's own layer: its ``kafka.<key>`` parameters, checked (JobDefinitionError naming the
    parameter: a setting Weir sets itself, a literal secret, a malformed reference)."""
    given = {k[len(JOB_PARAMETER_PREFIX) :]: v for k, v in parameters.items() if k.startswith(JOB_PARAMETER_PREFIX)}
    return check_properties(given, f"job parameter {JOB_PARAMETER_PREFIX}", connector=False)


# The merged configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaClientConfig:
    """How a job's clients reach its Kafka cluster: the bootstrap servers and the librdkafka settings,
    secrets as references. Shown (``repr``, :meth:`redacted`) without any secret value."""

    bootstrap_servers: str
    properties: Properties = field(default=(), repr=False)

    @classmethod
    def of(cls, endpoints: Endpoints) -> KafkaClientConfig:
        """The endpoints' cluster with no setting of its own (the local tools and tests)."""
        return cls(endpoints.kafka_bootstrap)

    def merged(self, properties: Iterable[tuple[str, str]]) -> KafkaClientConfig:
        """These settings over this configuration's, key by key (``bootstrap.servers`` moves the
        cluster)."""
        bootstrap = self.bootstrap_servers
        merged = dict(self.properties)
        for key, value in properties:
            if key.lower() == BOOTSTRAP_SERVERS:
                bootstrap = value
            else:
                merged[key] = value
        return KafkaClientConfig(bootstrap, tuple(sorted(merged.items())))

    def redacted(self) -> dict[str, str]:
        """Every setting as it may be logged: a secret's value only as its reference."""
        return {BOOTSTRAP_SERVERS: self.bootstrap_servers, **redacted(self.properties)}

    def __repr__(self) -> str:
        return f"KafkaClientConfig({self.redacted()!r})"

    def client_settings(
        self, environ: Mapping[str, str] | None = None, read_text: ReadText | None = None
    ) -> dict[str, str]:
        """The settings to hand a client's constructor, references resolved in this process
        (:func:`resolve_references`). Never log or store what this returns."""
        settings = {BOOTSTRAP_SERVERS: self.bootstrap_servers}
        for key, value in self.properties:
            settings[key] = resolve_references(key, value, environ, read_text)
        return settings


def secret_values(settings: Mapping[str, str]) -> list[str]:
    """The values of the secret settings among ``settings``, resolved ones included (to blank them
    out of a client's error message)."""
    return [value for key, value in settings.items() if is_secret_key(key) and value]


def kafka_client_config(
    endpoints: Endpoints, parameters: Mapping[str, str], properties: Iterable[tuple[str, str]] = ()
) -> KafkaClientConfig:
    """The one merge: the endpoints' cluster, the job's ``-D kafka.*`` parameters over it, the
    connector's own ``properties`` (already checked where the connector was defined) over those."""
    return KafkaClientConfig.of(endpoints).merged(job_properties(parameters)).merged(properties)


# Resolving references ----------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def resolve_references(
    key: str, value: str, environ: Mapping[str, str] | None = None, read_text: ReadText | None = None
) -> str:
    """``value`` with each ``${env:NAME}`` replaced by the variable and each ``${file:/path}`` by the
    file's text (one trailing line break dropped). JobDefinitionError naming the setting and the
    reference (never a value) when a variable is unset or a file cannot be read."""
    env = os.environ if environ is None else environ
    read = _read_text if read_text is None else read_text

    def resolve(match: re.Match[str]) -> str:
        provider, argument = match.group(1), match.group(2)
        where = f"kafka setting {key!r}"
        _check_reference(provider, argument, where)
        if provider == "env":
            if argument not in env:
                raise JobDefinitionError(
                    f"{where}: ${{env:{argument}}} is not set in this process's environment: set {argument} for "
                    "the JobManager and every TaskManager (and for weir verify)"
                )
            return env[argument]
        try:
            text = read(Path(argument))
        except (OSError, UnicodeDecodeError) as exc:
            raise JobDefinitionError(
                f"{where}: ${{file:{argument}}} cannot be read here: {type(exc).__name__}: {exc.strerror or exc}"
                if isinstance(exc, OSError)
                else f"{where}: ${{file:{argument}}} is not UTF-8 text"
            ) from None
        return text.removesuffix("\n").removesuffix("\r")

    return _REFERENCE.sub(resolve, value)


__all__ = [
    "BOOTSTRAP_SERVERS",
    "JOB_PARAMETER_PREFIX",
    "RESERVED_PROPERTIES",
    "KafkaClientConfig",
    "Properties",
    "check_properties",
    "check_property",
    "is_reference_only",
    "is_secret_key",
    "job_properties",
    "kafka_client_config",
    "redact",
    "redacted",
    "resolve_references",
    "secret_values",
]
