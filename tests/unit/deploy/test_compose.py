"""docker-compose.yml agrees with the local mode.

No service is started: the compose file, the Prometheus and Grafana configs and the Dockerfile are
compared with the local mode's own sources, read where the local mode reads them:

* weir/core/endpoints.env (through ``weir.core.config.resolve_environment``): ports, endpoints, bucket, keys;
* deploy/local/kafka/broker.properties, appended by deploy/local/kafka.sh to its server.properties,
  and the KRaft identity written by kafka.sh itself; the Kafka version pinned in kafka/pom.xml;
* deploy/local/postgres/weir.conf, appended by deploy/local/postgres.sh to the cluster's config;
* deploy/prometheus/prometheus-local.yml, used by deploy/local/prometheus.sh;
* ``weir.tools.supervisor.default_children``: the commands ``weir cluster up`` runs the Weir processes with;
* jobmanager/__main__.py and taskmanager/__main__.py: the flags the processes accept;
* pyproject.toml's package list and the build hook's files, for deploy/Dockerfile;
* deploy/local/s3.sh: the S3 server and version the local mode runs;
* weir.core.config.SecuritySettings and weir.tools.dev_credentials: the TLS and token variables and the
  files the ``weir-credentials`` step writes.

Where the compose CLI can be built (deploy/local/tools.sh, from the Go module proxy), ``docker-compose
config`` also validates the file and the tests read its resolved model: interpolation, anchors and merges
as Docker Compose itself applies them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from weir.core.config import Endpoints, SecuritySettings, env_name, resolve_environment
from weir.core.roles import CLIENT_ROLES, METRICS_ROLE, Role
from weir.core.transport_security import TransportSecurity
from weir.tools import dev_credentials, supervisor

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy/Dockerfile"
KAFKA_SH = REPO / "deploy/local/kafka.sh"
BROKER_PROPERTIES = REPO / "deploy/local/kafka/broker.properties"
KAFKA_POM = REPO / "deploy/local/kafka/pom.xml"
POSTGRES_SH = REPO / "deploy/local/postgres.sh"
POSTGRES_CONF = REPO / "deploy/local/postgres/weir.conf"
PROMETHEUS_LOCAL = REPO / "deploy/prometheus/prometheus-local.yml"
PROMETHEUS_COMPOSE = REPO / "deploy/prometheus/prometheus-compose.yml"
GRAFANA_PROVISIONING = REPO / "deploy/grafana/provisioning"

S3_SH = REPO / "deploy/local/s3.sh"
TOOLS_SH = REPO / "deploy/local/tools.sh"

STANDBY = "jobmanager-standby"
JOBMANAGERS = ("jobmanager", STANDBY)  # the leader and the standby of high availability
WEIR_SERVICES = (*JOBMANAGERS, "taskmanager")
SCRAPED_WEIR_JOBS = ("weir-jobmanager", "weir-taskmanager")  # Prometheus' scrape jobs of the Weir services
INIT = "weir-init"
CREDENTIALS = "weir-credentials"
REQUIRED_SERVICES = (
    "kafka",
    "postgres",
    "s3",
    "prometheus",
    "alertmanager",
    "grafana",
    CREDENTIALS,
    INIT,
    *WEIR_SERVICES,
)
ALERTMANAGER_CONFIG = REPO / "deploy/alertmanager/alertmanager.yml"
ALERTMANAGER_SH = REPO / "deploy/local/alertmanager.sh"
RUN_ONCE = (CREDENTIALS, INIT)
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
PUBLISH_DEFAULT = "127.0.0.1"
EXIT_PROXY_UNREACHABLE = 3  # deploy/local/tools.sh install

LOCAL = resolve_environment({})  # the local mode's defaults, whatever this shell exports


# Readers ------------------------------------------------------------------------------------------


def _load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_yaml(COMPOSE_FILE)


@pytest.fixture(scope="module")
def svc(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def read_properties(path: Path) -> dict[str, str]:
    """``key=value`` lines of a Java properties file (no continuations are used here)."""
    props: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()
    return props


def read_pg_conf(path: Path) -> dict[str, str]:
    """``name = value`` lines of a postgresql.conf fragment, comments and quotes removed."""
    conf: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, value = line.partition("=")
        conf[name.strip()] = value.strip().strip("'")
    return conf


def kafka_sh_properties() -> dict[str, str]:
    """The properties kafka.sh writes itself (its write_config heredoc), before broker.properties."""
    text = KAFKA_SH.read_text(encoding="utf-8")
    body = text.split('cat >"$KAFKA_CONF" <<CONF', 1)[1].split("\nCONF\n", 1)[0]
    return {k: v for k, v in (line.split("=", 1) for line in body.splitlines() if "=" in line and line[0] != "#")}


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def command_of(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def interpolate(value: str, environ: dict[str, str] | None = None) -> str:
    """Compose's ``${NAME:-default}`` / ``${NAME}`` with the given environment (none: the defaults)."""
    env = environ or {}

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        return env.get(name) or (default if default is not None else "")

    return re.sub(r"\$\{([A-Z0-9_]+)(?::-([^}]*))?\}", one, value)


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """host port -> container port of a service's ``ports`` (short or long syntax)."""
    mapping: dict[int, int] = {}
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            mapping[int(entry["published"])] = int(entry["target"])
            continue
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) in (2, 3), f"port {entry!r} should publish host:container explicitly"
        mapping[int(parts[-2])] = int(parts[-1])
    return mapping


def host_ips(service: dict[str, Any], environ: dict[str, str] | None = None) -> set[str]:
    """The host addresses a service's ports are published on (``""``: every interface)."""
    ips = set()
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ips.add(interpolate(str(entry.get("host_ip", "")), environ))
        else:
            parts = interpolate(str(entry), environ).split("/")[0].split(":")
            ips.add(parts[0] if len(parts) == 3 else "")
    return ips


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def volume_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume; the short syntax's ``:ro``/``:rw`` suffix is dropped."""
    mounts = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts.append((str(entry.get("source", "")), str(entry["target"])))
        else:
            source, target = str(entry).split(":")[:2]
            mounts.append((source, target))
    return mounts


def flags(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line (every flag here takes a value)."""
    out: dict[str, str] = {}
    it = iter(args)
    for arg in it:
        assert arg.startswith("--"), f"unexpected positional argument {arg!r} in {args}"
        out[arg] = next(it)
    return out


def port_of(url: str) -> int:
    port = urlsplit(url if "://" in url else f"tcp://{url}").port
    assert port is not None, url
    return port


def host_of(url: str) -> str:
    host = urlsplit(url if "://" in url else f"tcp://{url}").hostname
    assert host is not None, url
    return host


def without_host(url: str) -> tuple[Any, ...]:
    """Everything in an endpoint but its host: scheme, user, password, port, path, query."""
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    return parts.scheme, parts.username, parts.password, parts.port, parts.path, parts.query


def static_targets(config: dict[str, Any]) -> dict[str, list[str]]:
    return {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in config["scrape_configs"]
    }


# Services, ports, environment ---------------------------------------------------------------------


def test_every_required_service_exists(svc: dict[str, Any]) -> None:
    missing = [name for name in REQUIRED_SERVICES if name not in svc]
    assert not missing, f"docker-compose.yml lacks the services {missing}"


def test_published_ports_equal_the_local_mode_ports(svc: dict[str, Any]) -> None:
    endpoints = Endpoints.from_env({"WEIR_LOCAL_MODE": "true"})
    assert endpoints.s3_endpoint is not None
    expected = {
        "kafka": {int(LOCAL["WEIR_KAFKA_PORT"]), port_of(endpoints.kafka_bootstrap)},
        "postgres": {int(LOCAL["WEIR_POSTGRES_PORT"]), port_of(endpoints.postgres_dsn)},
        "s3": {int(LOCAL["WEIR_S3_PORT"]), port_of(endpoints.s3_endpoint)},
        "prometheus": {int(LOCAL["WEIR_PROMETHEUS_PORT"]), port_of(endpoints.prometheus_url)},
        "jobmanager": {
            int(LOCAL["WEIR_JOBMANAGER_PORT"]),
            port_of(endpoints.jobmanager_address),
            endpoints.jobmanager_metrics_port,
            endpoints.jobmanager_rest_port,
        },
    }
    for name, ports in expected.items():
        published = published_ports(svc[name])
        for port in ports:
            # The same port inside and outside: the processes' flags and configs name one number.
            assert published.get(port) == port, f"{name} should publish {port}:{port}, publishes {published}"
    # A scaled service cannot publish fixed host ports: Prometheus scrapes the TaskManagers inside.
    assert not published_ports(svc["taskmanager"]), "the taskmanager service scales: no fixed host ports"
    if LOCAL["WEIR_KAFKA_CONTROLLER_PORT"]:
        assert int(LOCAL["WEIR_KAFKA_CONTROLLER_PORT"]) not in published_ports(svc["kafka"]), (
            "the KRaft controller listener is internal to the kafka container"
        )


def test_ports_are_published_on_the_loopback_unless_configured(svc: dict[str, Any]) -> None:
    for name, service in svc.items():
        if service.get("ports"):
            assert host_ips(service) == {PUBLISH_DEFAULT}, f"{name} publishes on {host_ips(service)}"
            assert host_ips(service, {"WEIR_PUBLISH_ADDRESS": "0.0.0.0"}) == {"0.0.0.0"}, name


def test_weir_processes_share_one_environment(compose: dict[str, Any], svc: dict[str, Any]) -> None:
    anchor = {k: str(v) for k, v in compose["x-weir-env"].items()}
    endpoints, credentials = compose["x-weir-endpoints"], compose["x-weir-credentials"]
    security, ha = compose["x-weir-security"], compose["x-weir-ha"]
    assert anchor == {k: str(v) for k, v in {**endpoints, **credentials, **security, **ha}.items()}
    blocks = [set(endpoints), set(credentials), set(security), set(ha)]
    assert sum(len(b) for b in blocks) == len(set().union(*blocks)), "each variable in one block"
    assert set(credentials) == {"WEIR_S3_ACCESS_KEY", "WEIR_S3_SECRET_KEY", "WEIR_POSTGRES_DSN"}
    for name in ("taskmanager", INIT):
        assert env_of(svc[name]) == anchor, f"{name} should use the x-weir-env block unchanged"
    for name in JOBMANAGERS:
        # Each JobManager adds where it is reached, written into the leader lease.
        assert env_of(svc[name]) == anchor | {"WEIR_HA_ADVERTISED_ADDRESS": f"{name}:{LOCAL['WEIR_JOBMANAGER_PORT']}"}


def test_the_standby_is_the_jobmanager_with_its_own_run_directory_and_host_ports(svc: dict[str, Any]) -> None:
    """High availability as the local mode runs it (``weir cluster up --standbys 1``): the same image,
    command, settings and checkpoint storage as the leader; on the host the local standby's ports."""
    leader, standby = svc["jobmanager"], svc[STANDBY]
    for key in ("image", "build", "command", "restart"):
        assert standby[key] == leader[key], key
    leader_env, standby_env = env_of(leader), env_of(standby)
    assert {k: v for k, v in standby_env.items() if k != "WEIR_HA_ADVERTISED_ADDRESS"} == {
        k: v for k, v in leader_env.items() if k != "WEIR_HA_ADVERTISED_ADDRESS"
    }
    assert standby_env["WEIR_HA_ENABLED"] == "true" and standby_env["WEIR_CHECKPOINT_DIR"].startswith("s3://")
    # Every Weir process follows whichever leads: the two JobManagers' gRPC ports inside the network.
    grpc_port = int(flags(command_of(leader)[3:])["--port"])
    assert standby_env["WEIR_JOBMANAGER_ADDRESSES"] == f"jobmanager:{grpc_port},{STANDBY}:{grpc_port}"
    # Host ports: the local mode's standby 1 (its ports are distinct from the leader's on one host).
    endpoints = Endpoints.from_env({"WEIR_LOCAL_MODE": "true"})
    (local_standby,) = [c for c in supervisor.default_children(endpoints, standbys=1) if c.name == f"{STANDBY}-1"]
    local_flags = flags(list(local_standby.argv[3:]))
    leader_flags = flags(command_of(leader)[3:])
    assert published_ports(standby) == {
        int(local_flags["--port"]): int(leader_flags["--port"]),
        int(local_flags["--rest-port"]): int(leader_flags["--rest-port"]),
        int(local_flags["--metrics-port"]): int(leader_flags["--metrics-port"]),
    }
    assert not set(published_ports(standby)) & set(published_ports(leader)), "distinct host ports"
    runs = {t: src for src, t in volume_mounts(standby)}
    assert runs.get(standby_env["WEIR_RUN_DIR"]) == "jobmanager-standby-data", "its own run directory"
    assert {t: src for src, t in volume_mounts(leader)}.get(leader_env["WEIR_RUN_DIR"]) == "jobmanager-data"
    # It starts once the leader leads (the first `up` makes jobmanager the leader); its own health is
    # its REST port accepting connections (a standby's /healthz answers 503 while it waits).
    assert depends_on(standby).get("jobmanager") == "service_healthy"
    assert health_url(standby) == f"tcp://127.0.0.1:{leader_flags['--rest-port']}"


def test_weir_environment_is_the_local_one_with_container_hosts(compose: dict[str, Any], svc: dict[str, Any]) -> None:
    env = {k: str(v) for k, v in compose["x-weir-env"].items()}
    for name in ("WEIR_S3_BUCKET", "WEIR_S3_ACCESS_KEY", "WEIR_S3_SECRET_KEY"):
        assert env[name] == LOCAL[name], name
    hosts = {
        "WEIR_KAFKA_BOOTSTRAP": "kafka",
        "WEIR_POSTGRES_DSN": "postgres",
        "WEIR_S3_ENDPOINT": "s3",
        "WEIR_PROMETHEUS_URL": "prometheus",
        "WEIR_JOBMANAGER_ADDRESS": "jobmanager",
    }
    for name, host in hosts.items():
        assert host in svc, host
        assert host_of(env[name]) == host, f"{name}={env[name]} should name the compose service {host}"
        local = LOCAL[name]
        if name == "WEIR_KAFKA_BOOTSTRAP":
            continue  # the containers use the broker's internal listener; checked with the listeners
        assert port_of(env[name]) == port_of(local), name
        # Everything but the host (scheme, user, password, path) is the local mode's.
        assert without_host(env[name]) == without_host(local), name
    assert env["WEIR_JOBMANAGER_METRICS_PORT"] == LOCAL["WEIR_JOBMANAGER_METRICS_PORT"]
    assert env["WEIR_JOBMANAGER_REST_PORT"] == LOCAL["WEIR_JOBMANAGER_REST_PORT"]
    assert env["WEIR_TASKMANAGER_METRICS_BASE_PORT"] == LOCAL["WEIR_TASKMANAGER_METRICS_BASE_PORT"]
    assert env["WEIR_CHECKPOINT_DIR"].startswith(f"s3://{LOCAL['WEIR_S3_BUCKET']}/"), env["WEIR_CHECKPOINT_DIR"]
    assert env["WEIR_LOG_FORMAT"] == "json"


# Kafka --------------------------------------------------------------------------------------------


def test_kafka_sh_appends_broker_properties_and_does_not_override_them() -> None:
    text = KAFKA_SH.read_text(encoding="utf-8")
    assert "broker.properties" in text and re.search(r'cat "\$KAFKA_BROKER_PROPS" >>"\$KAFKA_CONF"', text)
    overlap = set(kafka_sh_properties()) & set(read_properties(BROKER_PROPERTIES))
    assert not overlap, f"kafka.sh and broker.properties both set {sorted(overlap)}"


def test_broker_properties_hold_the_single_broker_transaction_settings() -> None:
    props = read_properties(BROKER_PROPERTIES)
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert "offsets.topic.num.partitions" in props and "transaction.state.log.num.partitions" in props


def test_kafka_broker_settings_equal_the_local_mode(svc: dict[str, Any]) -> None:
    env = env_of(svc["kafka"])
    props = read_properties(BROKER_PROPERTIES)
    assert props
    for key, value in props.items():
        var = "KAFKA_" + key.upper().replace(".", "_")
        assert env.get(var) == value, f"{key}={value} in broker.properties, but {var}={env.get(var)!r} in compose"


def test_kafka_kraft_identity_and_listeners(compose: dict[str, Any], svc: dict[str, Any]) -> None:
    kafka = svc["kafka"]
    env = {name: interpolate(value) for name, value in env_of(kafka).items()}
    local = kafka_sh_properties()
    version = re.search(r"<kafka.version>(.+)</kafka.version>", KAFKA_POM.read_text(encoding="utf-8"))
    assert version and kafka["image"] == f"apache/kafka:{version.group(1)}", "the local mode's Kafka version"
    cluster_id = re.search(r'^CLUSTER_ID="([^"]+)"', KAFKA_SH.read_text(encoding="utf-8"), re.M)
    assert cluster_id and env["CLUSTER_ID"] == cluster_id.group(1)
    for key in ("process.roles", "node.id", "controller.listener.names"):
        assert env["KAFKA_" + key.upper().replace(".", "_")] == local[key], key

    def listeners(value: str) -> dict[str, str]:
        return dict(item.split("://", 1) for item in value.split(","))

    bound = listeners(env["KAFKA_LISTENERS"])
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(bound) == set(protocols), "every listener needs a security protocol"
    assert all(p == "PLAINTEXT" for p in protocols.values())
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert port_of(bound[controller]) == int(LOCAL["WEIR_KAFKA_CONTROLLER_PORT"])
    voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voter.split("@")[0] == env["KAFKA_NODE_ID"] and port_of(voter.split("@")[1]) == port_of(bound[controller])
    # The host's listener: the local mode's port, advertised to the host.
    host_side = [name for name, addr in advertised.items() if port_of(addr) == int(LOCAL["WEIR_KAFKA_PORT"])]
    assert len(host_side) == 1 and host_of(advertised[host_side[0]]) in ("localhost", "127.0.0.1")
    assert port_of(bound[host_side[0]]) == int(LOCAL["WEIR_KAFKA_PORT"])
    # The containers' listener: the one the Weir processes bootstrap from, also the inter-broker one.
    bootstrap = compose["x-weir-env"]["WEIR_KAFKA_BOOTSTRAP"]
    internal = [name for name, addr in advertised.items() if addr == bootstrap]
    assert internal == [env["KAFKA_INTER_BROKER_LISTENER_NAME"]], (bootstrap, advertised)
    assert port_of(bound[internal[0]]) == port_of(bootstrap)
    assert controller not in advertised or port_of(advertised[controller]) == port_of(bound[controller])
    data_dir = env["KAFKA_LOG_DIRS"]
    assert any(target == data_dir and not source.startswith((".", "/")) for source, target in volume_mounts(kafka))


# PostgreSQL ---------------------------------------------------------------------------------------


def test_postgres_sh_appends_the_shared_conf() -> None:
    text = POSTGRES_SH.read_text(encoding="utf-8")
    assert "postgres/weir.conf" in text and 'cat "$PG_SHARED_CONF"' in text
    assert read_pg_conf(POSTGRES_CONF)["max_prepared_transactions"] != "0", "Weir's 2PC sinks need it"


def test_postgres_settings_equal_the_local_mode(svc: dict[str, Any]) -> None:
    pg = svc["postgres"]
    cmd = command_of(pg)
    assert cmd[0] == "postgres"
    settings = {}
    for flag, value in zip(cmd[1::2], cmd[2::2], strict=True):
        assert flag == "-c", cmd
        name, _, setting = value.partition("=")
        settings[name] = setting
    for name, value in read_pg_conf(POSTGRES_CONF).items():
        assert settings.get(name) == value, f"{name} = {value} in deploy/local/postgres/weir.conf, compose: {settings}"
    assert settings["port"] == LOCAL["WEIR_POSTGRES_PORT"]
    for durability in ("fsync", "synchronous_commit", "full_page_writes"):
        assert durability not in settings, f"the local mode's {durability}=off is not for a real deployment"
    dsn = urlsplit(LOCAL["WEIR_POSTGRES_DSN"])
    env = env_of(pg)
    assert (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]) == (
        dsn.username,
        dsn.password,
        dsn.path.lstrip("/"),
    )
    assert pg["image"].split(":")[1].split(".")[0].split("-")[0] == "15", "the local mode runs PostgreSQL 15"
    assert any(t == "/var/lib/postgresql/data" for _, t in volume_mounts(pg))


# S3 ------------------------------------------------------------------------------------------------


def _local_s3_server() -> tuple[str, str]:
    """(module, version) of the local mode's S3 server (deploy/local/s3.sh)."""
    text = S3_SH.read_text(encoding="utf-8")
    module = re.search(r"^S3_MODULE=(\S+)$", text, re.M)
    version = re.search(r'^S3_VERSION="\$\{WEIR_S3_SERVER_VERSION:-(v[^}]+)\}"$', text, re.M)
    assert module and version
    return module.group(1), version.group(1)


def test_s3_is_the_local_modes_server_with_its_keys_port_and_region(svc: dict[str, Any]) -> None:
    s3 = svc["s3"]
    module, version = _local_s3_server()
    assert module == "github.com/versity/versitygw"
    assert s3["image"] == f"versity/versitygw:{version}", "the official image of the local mode's version"
    env = env_of(s3)
    assert (env["ROOT_ACCESS_KEY"], env["ROOT_SECRET_KEY"]) == (
        LOCAL["WEIR_S3_ACCESS_KEY"],
        LOCAL["WEIR_S3_SECRET_KEY"],
    )
    cmd = command_of(s3)
    assert cmd[-2:] == ["posix", "/data"], cmd
    options = flags([c for c in cmd[:-2] if c != "--quiet"])
    assert port_of("x" + options["--port"]) == int(LOCAL["WEIR_S3_PORT"])
    assert options["--region"] == "us-east-1"
    assert ("s3-data", "/data") in volume_mounts(s3)
    health = " ".join(s3["healthcheck"]["test"])
    assert f"http://127.0.0.1:{LOCAL['WEIR_S3_PORT']}{options['--health']}" in health


def test_weir_processes_sign_for_the_s3_servers_region_path_style(compose: dict[str, Any], svc: dict[str, Any]) -> None:
    """Not in the local mode, the containers name every S3 setting the local mode would default: the
    server's region, path-style addressing (the host name s3 has no bucket subdomains), the keys."""
    env = {k: str(v) for k, v in compose["x-weir-env"].items()}
    options = flags([c for c in command_of(svc["s3"])[:-2] if c != "--quiet"])
    assert env["WEIR_S3_REGION"] == options["--region"] == LOCAL["WEIR_S3_REGION"]
    assert env["WEIR_S3_ADDRESSING_STYLE"] == LOCAL["WEIR_S3_ADDRESSING_STYLE"] == "path"
    assert "WEIR_LOCAL_MODE" not in env, "a container is no local mode: its S3 settings are all given"


def test_the_init_step_prepares_the_example_and_runs_once(svc: dict[str, Any]) -> None:
    from weir.tools.prepare import DEMO_INPUTS

    init = svc[INIT]
    assert init["image"] == svc["jobmanager"]["image"] and init.get("build") == svc["jobmanager"]["build"]
    cmd = command_of(init)
    assert cmd[:3] == ["python", "-m", "weir.tools.prepare"], cmd
    assert int(flags(cmd[3:])["--events"]) > 0, "the demo's input, so the first weir run has events"
    assert str(init.get("restart")) == "no"
    assert depends_on(init) == {
        "kafka": "service_healthy",
        "postgres": "service_healthy",
        "s3": "service_healthy",
        CREDENTIALS: "service_completed_successfully",
    }
    assert DEMO_INPUTS.input_topic in DEMO_INPUTS.topics


# Authentication and TLS -------------------------------------------------------------------------------

CREDENTIALS_DIR = "/etc/weir/credentials"
# What each variable names among the files weir.tools.dev_credentials writes.
SECURITY_FILES = {
    "WEIR_AUTH_TOKEN_FILE": dev_credentials.TOKEN,
    "WEIR_AUTH_TOKENS_FILE": dev_credentials.TOKENS,
    "WEIR_INTERNAL_TOKEN_FILE": dev_credentials.INTERNAL_TOKEN,
    "WEIR_TLS_CERT_FILE": dev_credentials.CERTIFICATE,
    "WEIR_TLS_KEY_FILE": dev_credentials.KEY,
    "WEIR_TLS_CA_FILE": dev_credentials.CA_CERTIFICATE,
}


def credential_mounts(service: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in service.get("volumes") or [] if isinstance(v, dict) and v.get("target") == CREDENTIALS_DIR]


def test_every_weir_process_has_the_token_and_tls_of_the_generated_files(compose: dict[str, Any]) -> None:
    security = {k: str(v) for k, v in compose["x-weir-security"].items()}
    assert set(security) <= {env_name(f) for f in SecuritySettings.model_fields}, "SecuritySettings' variables"
    assert security == {
        **{name: f"{CREDENTIALS_DIR}/{file}" for name, file in SECURITY_FILES.items()},
        "WEIR_TLS_SERVER_NAME": dev_credentials.CLUSTER_NAME,
    }
    # Client certificates are not required (WEIR_TLS_CLIENT_CA_FILE unset), as in Kubernetes, whose
    # httpGet probes cannot show one.
    assert "WEIR_TLS_CLIENT_CA_FILE" not in security
    assert dev_credentials.CLUSTER_NAME in dev_credentials.DEFAULT_NAMES
    assert {"127.0.0.1", "localhost", "jobmanager"} <= set(dev_credentials.DEFAULT_NAMES), "probe, host, containers"


def _generated_in(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with every credentials file moved to a directory weir.tools.dev_credentials wrote."""
    generate = dev_credentials.generate(tmp_path).credentials.directory
    return {k: v.replace(CREDENTIALS_DIR, str(generate)) for k, v in env.items()}


@pytest.mark.parametrize("name", WEIR_SERVICES)
def test_weir_processes_call_each_other_with_the_internal_token_and_users_with_theirs(
    svc: dict[str, Any], name: str, tmp_path: Path
) -> None:
    """Roles on (docs/security.md): the servers take the tokens file, the processes send each other the
    internal token, and the weir CLI in a container (the same environment) sends the client token."""
    env = _generated_in(tmp_path, env_of(svc[name]))
    assert "WEIR_AUTH_TOKENS_FILE" in env and "WEIR_INTERNAL_TOKEN_FILE" in env, f"{name}: one token, every role"
    security = TransportSecurity.from_env(env)
    assert security.access is not None
    made = dev_credentials.DevCredentials(tmp_path)
    internal, client = made.internal_token.read_text().strip(), made.token.read_text().strip()
    assert security.for_cluster_peers().token == internal, f"{name} calls its peers with the internal token"
    assert security.access.roles_of(internal) == frozenset({Role.INTERNAL})
    assert security.token == client and security.access.roles_of(client) == frozenset(CLIENT_ROLES)


def test_prometheus_scrapes_weir_with_a_read_only_token(svc: dict[str, Any], tmp_path: Path) -> None:
    """The Weir processes bind 0.0.0.0 with tokens, so their metrics answer 401 to a scrape without a
    token holding read: Prometheus (user nobody) reads prometheus-token from the credentials volume."""
    prom = svc["prometheus"]
    (mount,) = credential_mounts(prom)
    assert mount["source"] == CREDENTIALS and mount["read_only"] is True
    assert depends_on(prom).get(CREDENTIALS) == "service_completed_successfully"
    config = _load_yaml(PROMETHEUS_COMPOSE)
    weir_jobs = {job["job_name"]: job for job in config["scrape_configs"] if job["job_name"] in SCRAPED_WEIR_JOBS}
    assert set(weir_jobs) == set(SCRAPED_WEIR_JOBS)
    token_file = f"{CREDENTIALS_DIR}/{dev_credentials.PROMETHEUS_TOKEN}"
    for name, job in weir_jobs.items():
        assert job.get("authorization") == {"type": "Bearer", "credentials_file": token_file}, name
    # That file holds read and nothing more on the servers the compose file configures.
    security = TransportSecurity.from_env(_generated_in(tmp_path, env_of(svc["jobmanager"])))
    assert security.access is not None
    prometheus_token = (tmp_path / dev_credentials.PROMETHEUS_TOKEN).read_text()
    assert security.access.roles_of(prometheus_token) == frozenset({METRICS_ROLE})
    # 0711: Prometheus may open that file by name; every secret beside it is 0600 (test_dev_credentials).
    assert re.search(rf"chmod 0711 {CREDENTIALS_DIR}\b", DOCKERFILE.read_text(encoding="utf-8"))


def test_credentials_are_generated_once_into_a_volume_every_weir_process_reads(svc: dict[str, Any]) -> None:
    step = svc[CREDENTIALS]
    assert step["image"] == svc["jobmanager"]["image"] and step.get("build") == svc["jobmanager"]["build"]
    assert command_of(step) == ["python", "-m", "weir.tools.dev_credentials", CREDENTIALS_DIR]
    assert str(step.get("restart")) == "no" and not depends_on(step)
    (writable,) = credential_mounts(step)
    assert writable["type"] == "volume" and writable["read_only"] is False
    for name in (*WEIR_SERVICES, INIT):
        (mount,) = credential_mounts(svc[name])
        assert mount["source"] == writable["source"] and mount["read_only"] is True, name
        assert depends_on(svc[name]).get(CREDENTIALS) == "service_completed_successfully", name
    # A new named volume takes the owner of the image's directory: the image's user can write it.
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(rf"mkdir -p [^\n]*{CREDENTIALS_DIR}", dockerfile)
    assert re.search(rf"chown weir:weir [^\n]*{CREDENTIALS_DIR}", dockerfile)


# The Weir processes ---------------------------------------------------------------------------------


def _accepted_flags(module: str) -> set[str]:
    source = (REPO / module / "__main__.py").read_text(encoding="utf-8")
    return set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', source))


# The command-line flags only a container needs on top of the local mode's: listen on every interface,
# and (TaskManagers) a fixed gRPC port, which the image exposes and the Kubernetes manifests declare.
TASKMANAGER_PORT = 16124


def test_weir_commands_use_the_local_mode_flags_and_ports(svc: dict[str, Any]) -> None:
    from weir.tools.supervisor import default_children

    endpoints = Endpoints.from_env({})
    children = {child.name: list(child.argv) for child in default_children(endpoints, taskmanagers=1, python="python")}
    local_for = {"jobmanager": children["jobmanager"], "taskmanager": children["taskmanager-1"]}
    for name, local in local_for.items():
        cmd = command_of(svc[name])
        assert cmd[:3] == local[:3] == ["python", "-m", f"weir.{name}"], (cmd, local)
        compose_flags, local_flags = flags(cmd[3:]), flags(local[3:])
        assert set(compose_flags) <= _accepted_flags(name), f"{name}: unknown flags in {cmd}"
        extra = {f: v for f, v in compose_flags.items() if f not in local_flags}
        if name == "taskmanager":
            # One command for every replica: the id and the advertised address come from the host
            # name (taskmanager/identity.py), the metrics port is taskmanager-1's.
            assert local_flags.pop("--id") == "taskmanager-1"
            assert "--id" not in compose_flags and "--host" not in compose_flags, cmd
            assert extra == {"--bind": "0.0.0.0", "--port": str(TASKMANAGER_PORT)}, f"{name}: extra flags {extra}"
        else:
            extra.pop("--port", None)
            assert extra == {"--bind": "0.0.0.0"}, f"{name}: extra flags {extra}"
        for flag, value in local_flags.items():
            assert compose_flags.get(flag) == value, f"{name}: local mode runs {flag} {value}, compose {cmd}"
        assert svc[name]["image"] == svc["jobmanager"]["image"]
        assert svc[name].get("build") == svc["jobmanager"]["build"]


def test_the_taskmanager_service_scales(svc: dict[str, Any]) -> None:
    tm = svc["taskmanager"]
    assert "container_name" not in tm and "hostname" not in tm, "each replica has its own name"
    assert int(tm["deploy"]["replicas"]) == 3, "three TaskManagers by default, as the local mode"
    assert not [s for s in svc if s.startswith("taskmanager-")], "one service, scaled; no copies"
    run_dir = {t: src for src, t in volume_mounts(tm)}.get(tm["environment"]["WEIR_RUN_DIR"])
    assert run_dir is None, "a named volume would be shared by every replica; the image's VOLUME is each one's"


def test_restart_policies(svc: dict[str, Any]) -> None:
    """Every service has one: what runs for good comes back when it crashes, what runs once does not."""
    for name, service in svc.items():
        if name in RUN_ONCE:
            assert str(service.get("restart")) == "no", f"{name} runs once"
        else:
            assert service.get("restart") in ("unless-stopped", "always"), f"{name} should come back when it crashes"


def test_every_long_running_service_has_a_healthcheck(svc: dict[str, Any]) -> None:
    for name, service in svc.items():
        if name in RUN_ONCE:
            continue  # runs once; its successful exit is what the others wait for
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} needs a healthcheck"
    assert LOCAL["WEIR_KAFKA_PORT"] in " ".join(svc["kafka"]["healthcheck"]["test"])
    assert LOCAL["WEIR_POSTGRES_PORT"] in svc["postgres"]["healthcheck"]["test"]
    # The REST API serves HTTPS with WEIR_TLS_CERT_FILE set; the metrics endpoints stay plain HTTP, their
    # /healthz open (the metrics themselves need a read token on a non-loopback bind).
    assert "WEIR_TLS_CERT_FILE" in env_of(svc["jobmanager"])
    assert health_url(svc["jobmanager"]) == f"https://127.0.0.1:{LOCAL['WEIR_JOBMANAGER_REST_PORT']}/healthz"
    metrics_port = flags(command_of(svc["taskmanager"])[3:])["--metrics-port"]
    assert health_url(svc["taskmanager"]) == f"http://127.0.0.1:{metrics_port}/healthz"


def health_url(service: dict[str, Any]) -> str:
    """The URL a Weir service's healthcheck probes (``python -m weir.tools.probe URL``)."""
    test = service["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "weir.tools.probe"] and len(test) == 5, test
    return str(test[4])


def test_depends_on_conditions_name_existing_services(svc: dict[str, Any]) -> None:
    for name, service in svc.items():
        for dep, condition in depends_on(service).items():
            assert dep in svc, f"{name} depends on {dep}, which is no service"
            assert condition in ("service_healthy", "service_completed_successfully"), (
                f"{name} -> {dep}: {condition}; wait for health or completion, not a mere start"
            )
            if condition == "service_healthy":
                assert "healthcheck" in svc[dep], f"{name} waits for {dep} to be healthy, but it has no healthcheck"
            if condition == "service_completed_successfully":
                assert str(svc[dep].get("restart", "no")) == "no", f"{dep} must run once"
    for name in WEIR_SERVICES:
        deps = depends_on(svc[name])
        for infra in ("kafka", "postgres", "s3"):
            assert deps.get(infra) == "service_healthy", f"{name} should wait for {infra}"
        assert deps.get(INIT) == "service_completed_successfully", f"{name} should wait for the bucket and topics"
    assert depends_on(svc["taskmanager"]).get("jobmanager") == "service_healthy"
    assert depends_on(svc["grafana"]).get("prometheus") == "service_healthy"


def test_volumes_are_declared_and_bind_mounts_exist(compose: dict[str, Any], svc: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, service in svc.items():
        for source, _target in volume_mounts(service):
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repo"
            else:
                assert source in declared, f"{name} uses the volume {source}, not declared at the top level"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"
    run_dir = compose["x-weir-env"]["WEIR_RUN_DIR"]
    assert f"WEIR_RUN_DIR={run_dir}" in DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(rf"^VOLUME {run_dir}$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert dict((t, s) for s, t in volume_mounts(svc["jobmanager"])).get(run_dir) == "jobmanager-data"


# Prometheus and Grafana -----------------------------------------------------------------------------


def test_prometheus_configs_agree() -> None:
    local, container = _load_yaml(PROMETHEUS_LOCAL), _load_yaml(PROMETHEUS_COMPOSE)
    assert container["global"] == local["global"]
    assert local.get("rule_files") == container.get("rule_files")
    local_jobs = {job["job_name"]: job for job in local["scrape_configs"]}
    container_jobs = {job["job_name"]: job for job in container["scrape_configs"]}
    assert set(container_jobs) == set(local_jobs)
    for name, job in local_jobs.items():
        assert [c["files"] for c in job.get("file_sd_configs", [])] == [
            c["files"] for c in container_jobs[name].get("file_sd_configs", [])
        ], name
    local_targets, container_targets = static_targets(local), static_targets(container)
    for name, targets in local_targets.items():
        if name == "weir-taskmanager":
            continue  # compose's TaskManagers are a scaled service, found by DNS (next test)
        if name == "weir-jobmanager":  # the local standby's port is the JobManager's - 1 (next tests)
            targets = [t for t in targets if port_of(t) == int(LOCAL["WEIR_JOBMANAGER_METRICS_PORT"])]
        assert sorted(port_of(t) for t in container_targets[name]) == sorted(port_of(t) for t in targets), name


def test_prometheus_scrapes_the_ports_the_processes_serve(svc: dict[str, Any]) -> None:
    config = _load_yaml(PROMETHEUS_COMPOSE)
    targets = static_targets(config)
    metrics_port = {name: int(flags(command_of(svc[name])[3:])["--metrics-port"]) for name in WEIR_SERVICES}
    assert {(host_of(t), port_of(t)) for t in targets["weir-jobmanager"]} == {
        ("jobmanager", metrics_port["jobmanager"])
    }
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "weir-taskmanager")
    assert "static_configs" not in job
    assert job["dns_sd_configs"] == [
        {"names": ["taskmanager"], "type": "A", "port": metrics_port["taskmanager"], "refresh_interval": "5s"}
    ]
    local_ports = sorted(port_of(t) for t in static_targets(_load_yaml(PROMETHEUS_LOCAL))["weir-taskmanager"])
    assert metrics_port["taskmanager"] == local_ports[0], "taskmanager-1's metrics port of the local mode"
    assert {port_of(t) for t in targets["prometheus"]} == {int(LOCAL["WEIR_PROMETHEUS_PORT"])}


def test_the_local_prometheus_scrapes_the_standby_jobmanager_of_weir_cluster_up() -> None:
    """`weir cluster up --standbys 1`: the standby's metrics port is scraped in the JobManager's job
    (a standby serves weir_jobmanager_leader 0; WeirNoJobManagerLeader sums by job)."""
    endpoints = Endpoints.from_env({"WEIR_LOCAL_MODE": "true"})
    children = {c.name: c for c in supervisor.default_children(endpoints, standbys=1)}
    served = {
        name: int(flags(list(child.argv[3:]))["--metrics-port"])
        for name, child in children.items()
        if name.startswith("jobmanager")
    }
    assert served == {
        "jobmanager": endpoints.jobmanager_metrics_port,
        "jobmanager-standby-1": supervisor.standby_metrics_port(endpoints, 1),
    }
    targets = static_targets(_load_yaml(PROMETHEUS_LOCAL))
    assert sorted(("127.0.0.1", port) for port in served.values()) == sorted(
        (host_of(t), port_of(t)) for t in targets["weir-jobmanager"]
    )


def test_the_compose_prometheus_scrapes_standby_jobmanagers_by_dns_in_the_jobmanagers_job(
    svc: dict[str, Any],
) -> None:
    job = next(j for j in _load_yaml(PROMETHEUS_COMPOSE)["scrape_configs"] if j["job_name"] == "weir-jobmanager")
    metrics_port = int(flags(command_of(svc["jobmanager"])[3:])["--metrics-port"])
    assert job["dns_sd_configs"] == [{"names": [STANDBY], "type": "A", "port": metrics_port, "refresh_interval": "5s"}]
    assert int(flags(command_of(svc[STANDBY])[3:])["--metrics-port"]) == metrics_port, "the service it finds"
    assert job["authorization"]["credentials_file"] == "/etc/weir/credentials/prometheus-token"


def test_prometheus_service_runs_the_compose_config(svc: dict[str, Any]) -> None:
    prom = svc["prometheus"]
    args = dict(arg.split("=", 1) for arg in command_of(prom) if "=" in arg)
    assert "--web.enable-lifecycle" in command_of(prom)
    assert port_of("x" + args["--web.listen-address"]) == int(LOCAL["WEIR_PROMETHEUS_PORT"])
    mounts = {source: target for source, target in volume_mounts(prom)}
    assert mounts["./deploy/prometheus/prometheus-compose.yml"] == args["--config.file"]
    config_dir = str(Path(args["--config.file"]).parent)
    config = _load_yaml(PROMETHEUS_COMPOSE)
    relative = [f for job in config["scrape_configs"] for c in job.get("file_sd_configs", []) for f in c["files"]]
    relative += config.get("rule_files") or []
    for pattern in relative:  # relative paths resolve against the config file's directory
        top = Path(pattern).parts[0]
        assert mounts.get(f"./deploy/prometheus/{top}") == f"{config_dir}/{top}", f"{top} is not mounted"


def test_alertmanager_runs_the_shipped_routing_and_prometheus_alerts_it(svc: dict[str, Any]) -> None:
    """One Alertmanager config for compose, Kubernetes and the local mode; both Prometheus configs
    send to it on the port the service and deploy/local/alertmanager.sh listen on."""
    am = svc["alertmanager"]
    args = dict(arg.split("=", 1) for arg in command_of(am) if "=" in arg)
    port = port_of("x" + args["--web.listen-address"])
    assert args["--cluster.listen-address"] == "", "one instance: no gossip"
    assert published_ports(am) == {port: port}
    mounts = {source: target for source, target in volume_mounts(am)}
    assert mounts["./deploy/alertmanager/alertmanager.yml"] == args["--config.file"]
    assert f"http://127.0.0.1:{port}/-/ready" in am["healthcheck"]["test"]
    assert f'WEIR_ALERTMANAGER_PORT="${{WEIR_ALERTMANAGER_PORT:-{port}}}"' in ALERTMANAGER_SH.read_text(
        encoding="utf-8"
    )
    for config, host in ((PROMETHEUS_COMPOSE, "alertmanager"), (PROMETHEUS_LOCAL, "127.0.0.1")):
        alerting = _load_yaml(config)["alerting"]["alertmanagers"]
        assert [t for a in alerting for sc in a["static_configs"] for t in sc["targets"]] == [f"{host}:{port}"], config


def test_amtool_accepts_the_alertmanager_config() -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is not installed: deploy/local/alertmanager.sh install (make infra-up) installs it")
    result = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def promtool_checkable(config: Path, directory: Path) -> Path:
    """``config`` as ``promtool check config`` can check it here: promtool checks that a scrape job's
    token file exists, so the credentials directory of the containers becomes one weir.tools.dev_credentials
    makes in ``directory``, beside links to the config's rules and targets (its relative paths)."""
    made = dev_credentials.generate(directory / "credentials").credentials
    text = config.read_text(encoding="utf-8")
    checkable = directory / config.name
    checkable.write_text(text.replace(CREDENTIALS_DIR, str(made.directory)), encoding="utf-8")
    for name in ("rules", "targets"):
        (directory / name).symlink_to(config.parent / name)
    return checkable


def test_promtool_accepts_the_compose_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make infra-up` installs it (Debian package prometheus)")
    assert f"{CREDENTIALS_DIR}/{dev_credentials.PROMETHEUS_TOKEN}" in PROMETHEUS_COMPOSE.read_text(encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "config", str(promtool_checkable(PROMETHEUS_COMPOSE, tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning_agrees_with_compose(svc: dict[str, Any]) -> None:
    grafana = svc["grafana"]
    mounts = {source: target for source, target in volume_mounts(grafana)}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    datasources = _load_yaml(GRAFANA_PROVISIONING / "datasources/prometheus.yml")["datasources"]
    prometheus = [d for d in datasources if d["type"] == "prometheus"]
    assert len(prometheus) == 1
    assert prometheus[0]["url"] == f"http://prometheus:{LOCAL['WEIR_PROMETHEUS_PORT']}"
    providers = _load_yaml(GRAFANA_PROVISIONING / "dashboards/weir.yml")["providers"]
    assert [p["options"]["path"] for p in providers if p["type"] == "file"] == [mounts["./deploy/grafana/dashboards"]]
    env = env_of(grafana)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert published_ports(grafana) == {3000: 3000}
    assert "wget" in grafana["healthcheck"]["test"] and "/api/health" in " ".join(grafana["healthcheck"]["test"])


# The image ------------------------------------------------------------------------------------------


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined), in order."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            current = stages.setdefault(line.split()[-1], [])
        current.append(line)
    return stages


def test_dockerfile_builds_a_wheel_of_every_package_with_the_build_hook(svc: dict[str, Any]) -> None:
    build = svc["jobmanager"]["build"]
    assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    stages = dockerfile_stages()
    assert list(stages) == ["build", "runtime"]
    copies = [line for line in stages["build"] if line.startswith("COPY ")]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages == {"weir"}, "one import root"
    # weir/{jobmanager,taskmanager,operators,connectors} link to the top-level folders: copied too.
    linked = sorted(p.name for p in (REPO / "weir").iterdir() if p.is_symlink())
    assert linked == ["connectors", "jobmanager", "operators", "taskmanager"]
    for package in sorted({*packages, *linked, "proto"}):
        assert f"COPY {package} ./{package}" in copies, f"the image's build lacks {package}"
    top_level = copies[0].split()[1:-1]
    for needed in ("pyproject.toml", "setup.py", "build_hooks.py", "MANIFEST.in", "README.md", "LICENSE"):
        assert needed in top_level, f"the build stage lacks {needed}"
    assert "COPY requirements ./requirements" in copies, "the lock files"
    (build,) = [line for line in stages["build"] if "pip wheel" in line]
    # The build backend's requirements exactly as locked, hashes checked, then no isolated (unlocked) build env.
    assert "pip install --require-hashes --no-deps -r requirements/build.lock" in build
    assert "--no-build-isolation" in build.split("pip wheel", 1)[1]
    assert not any("grpc_tools.protoc" in line for line in stages["build"]), "the build hook generates the code"


def test_the_runtime_stage_caches_dependencies_and_runs_as_weir() -> None:
    runtime = dockerfile_stages()["runtime"]
    first_copy = next(i for i, line in enumerate(runtime) if line.startswith("COPY "))
    assert runtime[first_copy] == "COPY requirements/server.lock ./requirements/server.lock", (
        "only what decides the dependencies"
    )
    deps = next(i for i, line in enumerate(runtime) if line.startswith("RUN ") and "server.lock" in line)
    wheel = next(i for i, line in enumerate(runtime) if line.startswith("COPY --from=build"))
    assert first_copy < deps < wheel, "dependencies installed before the sources' wheel arrives"
    # The server extra's lock, every file's hash checked, and nothing pip would resolve on its own.
    assert runtime[deps] == "RUN pip install --require-hashes --no-deps -r requirements/server.lock"
    assert "pip install --no-deps" in runtime[wheel + 1] and "pip check" in runtime[wheel + 1]
    user = [line for line in runtime if line.startswith("USER ")]
    assert user == ["USER 10001:10001"], "numeric, so Kubernetes' runAsNonRoot can check it"
    assert runtime.index(user[0]) > wheel
    assert not [line for line in runtime if line.startswith("ENTRYPOINT")], "compose runs `python -m ...`"
    exposed = {int(p) for line in runtime if line.startswith("EXPOSE ") for p in line.split()[1:]}
    assert exposed == {16123, 18081, 19249, TASKMANAGER_PORT, 19251}


def test_dockerignore_keeps_the_sources() -> None:
    ignored = {
        line.strip() for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines() if line.strip()
    }
    for needed in ("weir", "jobmanager", "taskmanager", "connectors", "proto", "pyproject.toml", "README.md"):
        assert needed not in ignored and f"/{needed}" not in ignored


# The compose CLI, built from the Go module proxy -----------------------------------------------------

# `make test` builds the tools first (`make tools`); run alone, the first test may build it (minutes).
BUILDS_A_TOOL = pytest.mark.timeout(2400)


@pytest.fixture(scope="module")
def compose_cli() -> list[str]:
    """``docker-compose`` as deploy/local/tools.sh builds it (once, into the shared cache)."""
    result = subprocess.run([str(TOOLS_SH), "install", "docker-compose"], capture_output=True, text=True, timeout=2400)
    if result.returncode == EXIT_PROXY_UNREACHABLE:
        pytest.fail(f"docker-compose could not be built (`make tools`): {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    path = subprocess.run([str(TOOLS_SH), "path", "docker-compose"], capture_output=True, text=True, check=True)
    return [path.stdout.strip()]


def compose_config(cli: list[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The file as Docker Compose resolves it: interpolated, anchors and merges applied, long syntax."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIR_", "COMPOSE_"))} | (environ or {})
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@BUILDS_A_TOOL
def test_docker_compose_config_accepts_the_file(compose_cli: list[str]) -> None:
    result = subprocess.run(
        [*compose_cli, "-f", str(COMPOSE_FILE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not result.stderr.strip(), f"warnings: {result.stderr}"


@BUILDS_A_TOOL
def test_the_resolved_model_is_the_one_these_tests_read(compose_cli: list[str], svc: dict[str, Any]) -> None:
    resolved = compose_config(compose_cli)["services"]
    assert set(resolved) == set(svc)
    for name in WEIR_SERVICES + (INIT,):
        assert resolved[name]["environment"] == env_of(svc[name]), f"{name}: the merged x-weir-env"
        assert resolved[name]["command"] == command_of(svc[name])
        assert resolved[name]["image"] == "weir:local"
        (mount,) = (v for v in resolved[name]["volumes"] if v["target"] == CREDENTIALS_DIR)
        assert mount["source"] == CREDENTIALS and mount["read_only"] is True, name
    (mount,) = resolved[CREDENTIALS]["volumes"]
    assert mount["target"] == CREDENTIALS_DIR and not mount.get("read_only"), "the step writes the volume"
    for name, service in resolved.items():
        published = {(p["host_ip"], int(p["published"]), p["target"]) for p in service.get("ports", [])}
        assert published == {(PUBLISH_DEFAULT, h, c) for h, c in published_ports(svc[name]).items()}, name
        deps = {dep: spec["condition"] for dep, spec in service.get("depends_on", {}).items()}
        assert deps == depends_on(svc[name]), name
    assert resolved["taskmanager"]["deploy"]["replicas"] == 3
    kafka_env = resolved["kafka"]["environment"]
    assert "EXTERNAL://localhost:19092" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]


@BUILDS_A_TOOL
def test_publish_address_and_scale_are_settings(compose_cli: list[str]) -> None:
    resolved = compose_config(
        compose_cli, {"WEIR_PUBLISH_ADDRESS": "0.0.0.0", "WEIR_KAFKA_ADVERTISED_HOST": "weir.example"}
    )["services"]
    for name, service in resolved.items():
        assert {p["host_ip"] for p in service.get("ports", [])} <= {"0.0.0.0"}, name
    assert "EXTERNAL://weir.example:19092" in resolved["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
