"""Who may call what: the roles a bearer token holds and the role each gRPC method and REST route needs.

Pure: no gRPC, no HTTP. The gRPC interceptor (:mod:`weir.core.grpc_security`) and the REST API's check
(``weir.jobmanager.rest.app``) look a call up here. Flink itself has one switch (SSL with a shared
secret, or an authenticating proxy in front of its REST endpoint); the split follows what a Flink
operator delegates: read-only dashboards (``read``), on-call control (``operate``: cancel, stop,
savepoint), deployment (``submit``: runs code on the cluster), and the cluster's own processes
(``internal``: TaskManager registration, heartbeats, checkpoint acknowledgements, deployments and data
channels), which no client token holds.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, assert_never

from weir.core.errors import ConfigurationError


class Role(enum.Enum):
    """What a call needs. ``READ < OPERATE < SUBMIT`` for clients; ``INTERNAL`` stands apart."""

    READ = "read"
    OPERATE = "operate"
    SUBMIT = "submit"
    INTERNAL = "internal"


CLIENT_ROLES: Final = (Role.READ, Role.OPERATE, Role.SUBMIT)
"""The client roles, lowest first: each holds the ones before it."""
ALL_ROLES: Final = frozenset(Role)


def held_roles(role: Role) -> frozenset[Role]:
    """What a token given ``role`` may do: a client role holds the client roles below it; ``internal``
    holds nothing else (a TaskManager never needs to submit, and a client never to register)."""
    match role:
        case Role.READ | Role.OPERATE | Role.SUBMIT:
            return frozenset(CLIENT_ROLES[: CLIENT_ROLES.index(role) + 1])
        case Role.INTERNAL:
            return frozenset({Role.INTERNAL})
        case _:
            assert_never(role)


_JM: Final = "/weir.wire.JobManagerService/"
_TM: Final = "/weir.wire.TaskManagerService/"

GRPC_METHOD_ROLES: Final[Mapping[str, Role]] = {
    _JM + "SubmitJob": Role.SUBMIT,
    _JM + "ListJobs": Role.READ,
    _JM + "GetJobStatus": Role.READ,
    _JM + "CancelJob": Role.OPERATE,
    _JM + "ListCheckpoints": Role.READ,
    _JM + "GetCheckpointDetail": Role.READ,
    _JM + "TriggerSavepoint": Role.OPERATE,  # also stop-with-savepoint
    _JM + "TriggerJobCheckpoint": Role.OPERATE,
    _JM + "RescaleJob": Role.OPERATE,
    _JM + "GetRescaleStatus": Role.READ,
    _JM + "GetClusterStatus": Role.READ,
    _JM + "RegisterTaskManager": Role.INTERNAL,
    _JM + "Heartbeat": Role.INTERNAL,
    _JM + "ReportTaskState": Role.INTERNAL,
    _JM + "AcknowledgeCheckpoint": Role.INTERNAL,
    _JM + "DeclineCheckpoint": Role.INTERNAL,
    _TM + "DeployTask": Role.INTERNAL,
    _TM + "CancelJobTasks": Role.INTERNAL,
    _TM + "TriggerCheckpoint": Role.INTERNAL,
    _TM + "NotifyCheckpointComplete": Role.INTERNAL,
    _TM + "ThreadDump": Role.INTERNAL,
    _TM + "ListLogs": Role.INTERNAL,
    _TM + "ReadLog": Role.INTERNAL,
    _TM + "NotifyCheckpointAborted": Role.INTERNAL,
    _TM + "OpenChannel": Role.INTERNAL,  # the data plane
}
"""Every method of the services in ``proto/`` (a unit test holds the table to the descriptors)."""

REST_ROUTE_ROLES: Final[Mapping[tuple[str, str], Role]] = {
    ("GET", "/overview"): Role.READ,
    ("GET", "/config"): Role.READ,
    ("GET", "/jobmanager/config"): Role.READ,
    ("GET", "/taskmanagers"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}"): Role.READ,
    ("GET", "/jobs"): Role.READ,
    ("GET", "/jobs/overview"): Role.READ,
    ("GET", "/jobs/{job_id}"): Role.READ,
    ("PATCH", "/jobs/{job_id}"): Role.OPERATE,  # cancel
    ("GET", "/jobs/{job_id}/jobmanager/config"): Role.READ,
    ("GET", "/jobs/{job_id}/config"): Role.READ,
    ("GET", "/jobs/{job_id}/plan"): Role.READ,
    ("GET", "/jobs/{job_id}/exceptions"): Role.READ,
    ("GET", "/jobs/{job_id}/checkpoints"): Role.READ,
    ("GET", "/jobs/{job_id}/checkpoints/config"): Role.READ,
    ("GET", "/jobs/{job_id}/checkpoints/details/{checkpoint_id}"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/backpressure"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/subtasktimes"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}/attempts/{attempt}"): Role.READ,
    ("POST", "/jobs/{job_id}/savepoints"): Role.OPERATE,
    ("POST", "/jobs/{job_id}/stop"): Role.OPERATE,
    ("GET", "/jobs/{job_id}/savepoints/{trigger_id}"): Role.READ,
    ("POST", "/jobs/{job_id}/checkpoints"): Role.OPERATE,  # a checkpoint on request
    ("PATCH", "/jobs/{job_id}/rescaling"): Role.OPERATE,  # weir rescale
    ("GET", "/jobs/{job_id}/rescaling/{trigger_id}"): Role.READ,
    ("GET", "/jobs/{job_id}/checkpoints/{trigger_id}"): Role.READ,
    ("GET", "/jars"): Role.READ,
    ("POST", "/jars/upload"): Role.SUBMIT,  # code that runs on every node
    ("POST", "/jars/{jar_id}/run"): Role.SUBMIT,
    ("DELETE", "/jars/{jar_id}"): Role.SUBMIT,
    ("GET", "/jars/{jar_id}/plan"): Role.SUBMIT,  # runs the artifact's build(env), in a child process
    ("POST", "/jars/{jar_id}/plan"): Role.SUBMIT,
    ("POST", "/savepoint-disposal"): Role.OPERATE,  # deletes a savepoint folder
    ("GET", "/savepoint-disposal/{trigger_id}"): Role.READ,
    ("GET", "/jobmanager/metrics"): Role.READ,
    ("GET", "/taskmanagers/metrics"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}/metrics"): Role.READ,
    ("GET", "/jobs/metrics"): Role.READ,
    ("GET", "/jobs/{job_id}/metrics"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/metrics"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/watermarks"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/subtasks/metrics"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}/metrics"): Role.READ,
    ("GET", "/jobs/{job_id}/accumulators"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/accumulators"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/subtasks/accumulators"): Role.READ,
    ("GET", "/jobmanager/logs"): Role.READ,
    ("GET", "/jobmanager/logs/{filename}"): Role.READ,
    ("GET", "/jobmanager/log"): Role.READ,
    ("GET", "/jobmanager/stdout"): Role.READ,
    ("GET", "/jobmanager/thread-dump"): Role.READ,
    ("GET", "/jobs/{job_id}/status"): Role.READ,
    ("GET", "/jobs/{job_id}/resource-requirements"): Role.READ,
    ("PUT", "/jobs/{job_id}/resource-requirements"): Role.OPERATE,  # a rescale, as PATCH .../rescaling
    ("GET", "/jobs/{job_id}/execution-result"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}/thread-dump"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}/logs"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}/logs/{filename}"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}/log"): Role.READ,
    ("GET", "/taskmanagers/{taskmanager_id}/stdout"): Role.READ,
    ("GET", "/jobmanager/environment"): Role.READ,
    ("GET", "/jobs/{job_id}/jobmanager/environment"): Role.READ,
    ("GET", "/jobs/{job_id}/jobmanager/log-url"): Role.READ,
    ("GET", "/jobs/{job_id}/taskmanagers/{taskmanager_id}/log-url"): Role.READ,
    ("GET", "/jobs/{job_id}/vertices/{vertex_id}/taskmanagers"): Role.READ,
    ("GET", "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex_id}"): Role.READ,
    ("PATCH", "/jobs/{job_id}/clientHeartbeat"): Role.OPERATE,  # Flink's attached client; Weir acts on none
    ("GET", "/datasets"): Role.READ,
    ("DELETE", "/datasets/{dataset_id}"): Role.OPERATE,
    ("GET", "/datasets/delete/{trigger_id}"): Role.READ,
}
"""Every API route of the REST API, by method and path template (without the ``/v1`` prefix Flink's
clients use; a unit test holds the table to the app's routes)."""

METRICS_ROLE: Final = Role.READ
"""What a scrape of a Prometheus endpoint needs when the endpoint is secured."""


def grpc_method_role(method: str) -> Role | None:
    """The role a gRPC method (``/package.Service/Method``) needs; None: a method no table names,
    which a server refuses."""
    return GRPC_METHOD_ROLES.get(method)


def rest_route_role(method: str, path_template: str) -> Role | None:
    """The role a REST route needs; None: a route the table does not name, which the API refuses."""
    return REST_ROUTE_ROLES.get((method.upper(), path_template.removeprefix("/v1")))


# Tokens -------------------------------------------------------------------------------------------------

SHA256_PREFIX: Final = "sha256:"


@dataclass(frozen=True)
class Grant:
    """One token a server accepts, by its SHA-256 (the token itself is not kept), and what it holds."""

    digest: bytes
    roles: frozenset[Role]
    source: str  # where it was given, for messages: "WEIR_AUTH_TOKEN", "WEIR_AUTH_TOKENS_FILE line 3"


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.strip().encode()).digest()


@dataclass(frozen=True)
class AccessTable:
    """The tokens a server accepts and what each may do; compared per call or stream, never per record."""

    grants: tuple[Grant, ...]

    def roles_of(self, offered: str) -> frozenset[Role] | None:
        """What ``offered`` holds (None: no token of this table). Every grant is compared, in constant
        time each, so the answer's timing tells nothing of which one matched."""
        digest = token_digest(offered)
        found: frozenset[Role] | None = None
        for grant in self.grants:
            if hmac.compare_digest(digest, grant.digest):
                found = grant.roles if found is None else found | grant.roles
        return found

    @classmethod
    def single(cls, token: str, source: str = "WEIR_AUTH_TOKEN") -> AccessTable:
        """One token holding every role: the meaning of ``WEIR_AUTH_TOKEN`` alone."""
        return cls((Grant(token_digest(token), ALL_ROLES, source),))


def parse_tokens_file(text: str, source: str) -> tuple[Grant, ...]:
    """The grants of a tokens file: one ``<role> <token>`` or ``<role> sha256:<hex>`` per line; blank
    lines and ``#`` comments skipped. A bad line raises ConfigurationError naming it (never its token)."""
    grants: list[Grant] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        parts = line.split()
        if len(parts) != 2:
            raise ConfigurationError(f"bad configuration: {where}: expected '<role> <token>' or '<role> sha256:<hex>'")
        name, secret = parts
        try:
            role = Role(name.lower())
        except ValueError:
            names = ", ".join(r.value for r in Role)
            raise ConfigurationError(f"bad configuration: {where}: unknown role {name!r} (one of {names})") from None
        grants.append(Grant(_digest_of(secret, where), held_roles(role), where))
    if not grants:
        raise ConfigurationError(f"bad configuration: {source} names no token")
    return tuple(grants)


def _digest_of(secret: str, where: str) -> bytes:
    if not secret.lower().startswith(SHA256_PREFIX):
        return token_digest(secret)
    try:
        digest = bytes.fromhex(secret[len(SHA256_PREFIX) :])
    except ValueError:
        digest = b""
    if len(digest) != hashlib.sha256().digest_size:
        raise ConfigurationError(f"bad configuration: {where}: sha256: needs 64 hex digits")
    return digest


def access_table(
    single_token: str | None, file_grants: Iterable[Grant] | None, internal_token: str | None
) -> AccessTable | None:
    """A server's table from its settings (None: no token configured, every call passes).

    Without a tokens file the single token holds every role, as before roles existed. With one, the
    file is the table and the single token is only what this process sends as a client. The internal
    token holds ``internal`` only and must differ from every client token."""
    grants: list[Grant] = []
    if file_grants is None:
        if single_token is not None:
            grants.append(AccessTable.single(single_token).grants[0])
    else:
        grants.extend(file_grants)
    if internal_token is not None:
        digest = token_digest(internal_token)
        for grant in grants:
            if hmac.compare_digest(digest, grant.digest) and grant.roles != frozenset({Role.INTERNAL}):
                raise ConfigurationError(
                    f"bad configuration: the internal token (WEIR_INTERNAL_TOKEN) is also a client token "
                    f"({grant.source}): give the cluster's processes a token of their own"
                )
        grants.append(Grant(digest, frozenset({Role.INTERNAL}), "WEIR_INTERNAL_TOKEN"))
    return AccessTable(tuple(grants)) if grants else None
