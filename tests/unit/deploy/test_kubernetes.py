"""deploy/kubernetes/ renders with kustomize and agrees with docker-compose.yml.

The manifests are rendered by the pinned kustomize that deploy/local/tools.sh builds from the Go module
proxy (no cluster needed), then compared with the compose file: the same image, the same commands and
container ports, the same WEIR_* variables (with the same values for Weir's own settings), probes on
the endpoints compose's healthchecks use, and what Kubernetes adds: a StatefulSet of TaskManagers
behind a headless Service, resources, a non-root security context, Kafka, PostgreSQL and S3 as
external services. The dev overlay reads its TLS files and token from a git-ignored directory: the
tests render a copy of deploy/kubernetes with that directory made by weir.tools.dev_credentials.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509

from tests.unit.deploy.test_compose import (
    COMPOSE_FILE,
    EXIT_PROXY_UNREACHABLE,
    TOOLS_SH,
    command_of,
    env_of,
    flags,
    health_url,
    host_of,
)
from weir.core.roles import METRICS_ROLE
from weir.core.transport_security import TransportSecurity
from weir.tools import dev_credentials

# `make test` builds kustomize first (`make tools`); run alone, the first test may build it (a minute or two).
pytestmark = pytest.mark.timeout(2400)

REPO = Path(__file__).resolve().parents[3]
KUBERNETES = REPO / "deploy/kubernetes"
OVERLAY = KUBERNETES / "overlays/dev"
BASE = KUBERNETES / "base"
WEIR_PODS = {"jobmanager": "Deployment", "taskmanager": "StatefulSet"}
EXTERNAL = {"kafka": "WEIR_KAFKA_BOOTSTRAP", "postgres": "WEIR_POSTGRES_DSN", "s3": "WEIR_S3_ENDPOINT"}
# Settings of Weir's own: the same value in both (the endpoints of external services may differ).
SAME_VALUE = (
    "WEIR_S3_BUCKET",
    "WEIR_S3_REGION",
    "WEIR_S3_ADDRESSING_STYLE",
    "WEIR_JOBMANAGER_ADDRESS",
    "WEIR_JOBMANAGER_METRICS_PORT",
    "WEIR_JOBMANAGER_REST_PORT",
    "WEIR_TASKMANAGER_METRICS_BASE_PORT",
    "WEIR_CHECKPOINT_DIR",
    "WEIR_LOG_FORMAT",
    "WEIR_RUN_DIR",
    "WEIR_AUTH_TOKEN_FILE",
    "WEIR_AUTH_TOKENS_FILE",
    "WEIR_INTERNAL_TOKEN_FILE",
    "WEIR_TLS_CERT_FILE",
    "WEIR_TLS_KEY_FILE",
    "WEIR_TLS_CA_FILE",
    "WEIR_TLS_SERVER_NAME",
)
AUTH_FILES = {
    dev_credentials.TOKEN,
    dev_credentials.TOKENS,
    dev_credentials.INTERNAL_TOKEN,
    dev_credentials.CERTIFICATE,
    dev_credentials.KEY,
    dev_credentials.CA_CERTIFICATE,
}


@pytest.fixture(scope="module")
def kustomize() -> str:
    result = subprocess.run([str(TOOLS_SH), "install", "kustomize"], capture_output=True, text=True, timeout=2400)
    if result.returncode == EXIT_PROXY_UNREACHABLE:
        pytest.fail(f"kustomize could not be built (`make tools`): {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    path = subprocess.run([str(TOOLS_SH), "path", "kustomize"], capture_output=True, text=True, check=True)
    return path.stdout.strip()


def render(kustomize: str, directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kustomize, "build", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def dev_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes whose dev overlay has its credentials, as a user makes them."""
    copy = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(KUBERNETES, copy, ignore=shutil.ignore_patterns("credentials"))
    dev_credentials.generate(copy / OVERLAY.relative_to(KUBERNETES) / "credentials")
    return copy


@pytest.fixture(scope="module")
def objects(kustomize: str, dev_copy: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object of the dev overlay; generated names lose their hash suffix."""
    return by_kind_and_name(render(kustomize, dev_copy / OVERLAY.relative_to(KUBERNETES)))


def by_kind_and_name(rendered: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object; generated names lose their hash suffix."""
    found = {}
    for obj in rendered:
        name = obj["metadata"]["name"]
        if obj["kind"] in ("ConfigMap", "Secret"):
            name = without_hash(name)
        found[(obj["kind"], name)] = obj
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def without_hash(name: str) -> str:
    """A generated name without the hash suffix kustomize adds (its alphabet has no vowels, 0, 1 or 3)."""
    return re.sub(r"-[2456789bcdfghkmt]{10}$", "", name)


def container(objects: dict[tuple[str, str], Any], name: str) -> dict[str, Any]:
    pod = objects[(WEIR_PODS[name], name)]["spec"]["template"]["spec"]
    (only,) = pod["containers"]
    return dict(only)


def pod_env(objects: dict[tuple[str, str], Any], name: str) -> dict[str, str]:
    """The WEIR_* variables a Weir container gets: its envFrom ConfigMap and Secret, then its env."""
    env: dict[str, str] = {}
    for source in container(objects, name).get("envFrom", []):
        if "configMapRef" in source:
            env.update(objects[("ConfigMap", without_hash(source["configMapRef"]["name"]))]["data"])
        if "secretRef" in source:
            data = objects[("Secret", without_hash(source["secretRef"]["name"]))]["data"]
            env.update({k: base64.b64decode(v).decode() for k, v in data.items()})
    env.update({e["name"]: e.get("value", "") for e in container(objects, name).get("env", [])})
    return env


def named_ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in c["ports"]}


def probe_port(c: dict[str, Any], probe: dict[str, Any]) -> int:
    port = probe["port"]
    return named_ports(c)[port] if isinstance(port, str) else int(port)


def probe_endpoint(c: dict[str, Any], probe: dict[str, Any]) -> str:
    match probe:
        case {"httpGet": http}:
            return f"{http.get('scheme', 'HTTP').lower()}://127.0.0.1:{probe_port(c, http)}{http['path']}"
        case {"tcpSocket": tcp}:
            return f"tcp://127.0.0.1:{probe_port(c, tcp)}"
        case {"grpc": grpc}:
            return f"grpc://127.0.0.1:{probe_port(c, grpc)}"
    raise AssertionError(f"unknown probe {probe}")


def test_base_and_overlay_render(kustomize: str) -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in render(kustomize, BASE)}
    assert ("Deployment", "jobmanager") in base and ("StatefulSet", "taskmanager") in base
    assert not any(kind == "Secret" for kind, _ in base), "the base brings no credentials"


def test_the_same_image_and_commands_as_compose(objects: dict[tuple[str, str], Any], compose: dict[str, Any]) -> None:
    for name in WEIR_PODS:
        c = container(objects, name)
        assert c["image"] == compose["services"][name]["image"] == "weir:local"
        assert c["command"] == command_of(compose["services"][name]), name
        assert c.get("imagePullPolicy") == "IfNotPresent"


def test_container_ports_are_the_ports_the_commands_serve(objects: dict[tuple[str, str], Any]) -> None:
    jm = named_ports(container(objects, "jobmanager"))
    jm_flags = flags(container(objects, "jobmanager")["command"][3:])
    assert jm == {
        "grpc": int(jm_flags["--port"]),
        "rest": int(jm_flags["--rest-port"]),
        "metrics": int(jm_flags["--metrics-port"]),
    }
    tm = named_ports(container(objects, "taskmanager"))
    tm_flags = flags(container(objects, "taskmanager")["command"][3:])
    assert tm == {"data": int(tm_flags["--port"]), "metrics": int(tm_flags["--metrics-port"])}
    assert "--id" not in tm_flags and "--host" not in tm_flags, "the id and address come from the pod's host name"


def test_the_same_weir_variables_as_compose(objects: dict[tuple[str, str], Any], compose: dict[str, Any]) -> None:
    # Compose runs a standby JobManager; the base, one (components/high-availability adds
    # WEIR_HA_ENABLED and the advertised address; the jobmanager Service routes to the leader alone, so
    # no process needs the JobManagers' list).
    high_availability = set(compose["x-weir-ha"]) | {"WEIR_HA_ADVERTISED_ADDRESS"}
    compose_env = {k: v for k, v in env_of(compose["services"]["jobmanager"]).items() if k not in high_availability}
    for name in WEIR_PODS:
        env = pod_env(objects, name)
        assert set(env) == set(compose_env), f"{name}: {set(env) ^ set(compose_env)}"
        for var in SAME_VALUE:
            assert env[var] == compose_env[var], f"{name}: {var}={env[var]}, compose {compose_env[var]}"
    # The split is compose's: credentials in the Secret, the rest in the ConfigMap.
    secret = objects[("Secret", "weir-credentials")]["data"]
    assert set(secret) == set(compose["x-weir-credentials"])
    assert set(objects[("ConfigMap", "weir-endpoints")]["data"]) == set(compose["x-weir-endpoints"])
    assert objects[("ConfigMap", "weir-security")]["data"] == compose["x-weir-security"]


def test_the_token_and_tls_files_are_a_secret_mounted_where_the_variables_say(
    objects: dict[tuple[str, str], Any], dev_copy: Path
) -> None:
    secret = objects[("Secret", "weir-auth")]
    files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(files) == AUTH_FILES, "the CA's key stays on the machine that made it"
    made = dev_credentials.DevCredentials(dev_copy / OVERLAY.relative_to(KUBERNETES) / "credentials")
    assert files[dev_credentials.TOKEN] == made.token.read_bytes()
    certificate = x509.load_pem_x509_certificate(files[dev_credentials.CERTIFICATE])
    certificate.verify_directly_issued_by(x509.load_pem_x509_certificate(files[dev_credentials.CA_CERTIFICATE]))
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    for name in WEIR_PODS:
        env = pod_env(objects, name)
        assert env["WEIR_TLS_SERVER_NAME"] in names.get_values_for_type(x509.DNSName)
        assert "WEIR_TLS_CLIENT_CA_FILE" not in env, "the kubelet's HTTPS probes show no client certificate"
        directories = {str(Path(env[var]).parent) for var in SAME_VALUE if var.endswith("_FILE")}
        assert {Path(env[var]).name for var in SAME_VALUE if var.endswith("_FILE")} == AUTH_FILES
        (directory,) = directories
        pod = objects[(WEIR_PODS[name], name)]["spec"]["template"]["spec"]
        (mount,) = (m for m in container(objects, name)["volumeMounts"] if m["mountPath"] == directory)
        assert mount.get("readOnly") is True, name
        (volume,) = (v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == secret["metadata"]["name"], "the generated Secret, with its hash"
        assert volume["secret"]["defaultMode"] & 0o007 == 0, "not readable by others"


def test_external_services_are_named_by_the_endpoints(objects: dict[tuple[str, str], Any]) -> None:
    env = pod_env(objects, "jobmanager")
    for service, var in EXTERNAL.items():
        value = env[var]
        assert host_of(value if "://" in value else f"tcp://{value}") == service, f"{var}={value}"
        spec = objects[("Service", service)]["spec"]
        assert spec["type"] == "ExternalName" and spec["externalName"].endswith(".svc.cluster.local"), spec
    assert urlsplit(env["WEIR_POSTGRES_DSN"]).password, "the DSN, with its password, is in the Secret"
    address = env["WEIR_JOBMANAGER_ADDRESS"]
    assert address.split(":")[0] == "jobmanager" and ("Service", "jobmanager") in objects


def test_probes_use_compose_healthcheck_endpoints(objects: dict[tuple[str, str], Any], compose: dict[str, Any]) -> None:
    for name in WEIR_PODS:
        c = container(objects, name)
        assert probe_endpoint(c, c["livenessProbe"]) == health_url(compose["services"][name]), name
        assert "readinessProbe" in c, name
    jm = container(objects, "jobmanager")
    assert probe_endpoint(jm, jm["startupProbe"]) == health_url(compose["services"]["jobmanager"])
    # A grpc probe cannot speak TLS: the port accepting connections says gRPC serves.
    assert probe_endpoint(jm, jm["readinessProbe"]) == f"tcp://127.0.0.1:{named_ports(jm)['grpc']}"
    tm = container(objects, "taskmanager")
    assert probe_endpoint(tm, tm["readinessProbe"]) == f"tcp://127.0.0.1:{named_ports(tm)['data']}"


def test_services_expose_the_container_ports(objects: dict[tuple[str, str], Any]) -> None:
    for name, kind in WEIR_PODS.items():
        service = objects[("Service", name)]["spec"]
        ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["ports"]}
        assert ports == {n: (port, n) for n, port in named_ports(container(objects, name)).items()}, name
        labels = objects[(kind, name)]["spec"]["template"]["metadata"]["labels"]
        assert service["selector"].items() <= labels.items(), name
    headless = objects[("Service", "taskmanager")]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    statefulset = objects[("StatefulSet", "taskmanager")]["spec"]
    assert statefulset["serviceName"] == "taskmanager" and statefulset["replicas"] == 3
    assert compose_replicas() == statefulset["replicas"]


def compose_replicas() -> int:
    with COMPOSE_FILE.open(encoding="utf-8") as f:
        return int(yaml.safe_load(f)["services"]["taskmanager"]["deploy"]["replicas"])


def test_one_jobmanager_replaced_before_the_next_starts(objects: dict[tuple[str, str], Any]) -> None:
    spec = objects[("Deployment", "jobmanager")]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


def test_pods_run_as_the_images_user_without_privileges(objects: dict[tuple[str, str], Any]) -> None:
    dockerfile = (REPO / "deploy/Dockerfile").read_text(encoding="utf-8")
    for name, kind in WEIR_PODS.items():
        pod = objects[(kind, name)]["spec"]["template"]["spec"]
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert f"USER {ctx['runAsUser']}:{ctx['runAsGroup']}" in dockerfile
        c = container(objects, name)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {pod_env(objects, name)["WEIR_RUN_DIR"], "/tmp"} <= mounts, "writable run dir and /tmp"
        # A Service named jobmanager would otherwise set JOBMANAGER_* variables in every pod.
        assert pod["enableServiceLinks"] is False
        resources = c["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])


def test_everything_lands_in_the_overlays_namespace(objects: dict[tuple[str, str], Any]) -> None:
    assert ("Namespace", "weir") in objects
    for (kind, name), obj in objects.items():
        if kind != "Namespace":
            assert obj["metadata"].get("namespace") == "weir", (kind, name)


# Alerting, disruptions, network policies, the ServiceMonitor -------------------------------------


def pod_labels(objects: dict[tuple[str, str], Any], kind: str, name: str) -> dict[str, str]:
    return dict(objects[(kind, name)]["spec"]["template"]["metadata"]["labels"])


def test_alertmanager_runs_compose_s_command_on_the_shipped_routing(
    objects: dict[tuple[str, str], Any], compose: dict[str, Any]
) -> None:
    shipped = (REPO / "deploy/alertmanager/alertmanager.yml").read_text(encoding="utf-8")
    assert (BASE / "alertmanager.yml").read_text(encoding="utf-8") == shipped, (
        "deploy/kubernetes/base/alertmanager.yml is a copy of deploy/alertmanager/alertmanager.yml"
    )
    assert objects[("ConfigMap", "alertmanager-config")]["data"]["alertmanager.yml"] == shipped
    pod = objects[("Deployment", "alertmanager")]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    service = compose["services"]["alertmanager"]
    assert c["image"] == service["image"] and c["args"] == command_of(service)
    listen = dict(a.split("=", 1) for a in c["args"] if "=" in a)["--web.listen-address"]
    assert named_ports(c) == {"http": int(listen.rsplit(":", 1)[1])}
    config_mount = next(m for m in c["volumeMounts"] if m["name"] == "config")["mountPath"]
    assert dict(a.split("=", 1) for a in c["args"] if "=" in a)["--config.file"] == f"{config_mount}/alertmanager.yml"
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"].rsplit("-", 1)[0] == "alertmanager-config"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    ports = {p["name"]: p["port"] for p in objects[("Service", "alertmanager")]["spec"]["ports"]}
    assert ports == named_ports(c)


def test_disruption_budgets_take_taskmanagers_one_at_a_time_and_keep_the_jobmanager(
    objects: dict[tuple[str, str], Any],
) -> None:
    tm = objects[("PodDisruptionBudget", "taskmanager")]["spec"]
    jm = objects[("PodDisruptionBudget", "jobmanager")]["spec"]
    assert tm["maxUnavailable"] == 1 and jm["minAvailable"] == 1
    for name, spec in (("taskmanager", tm), ("jobmanager", jm)):
        assert spec["selector"]["matchLabels"].items() <= pod_labels(objects, WEIR_PODS[name], name).items(), name
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_network_policies_open_each_port_to_whom_needs_it(objects: dict[tuple[str, str], Any]) -> None:
    prometheus = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    pods = {"jobmanager": "Deployment", "taskmanager": "StatefulSet", "alertmanager": "Deployment"}
    expected = {  # port name -> who may connect (None: anyone)
        "jobmanager": {"grpc": None, "rest": None, "metrics": [prometheus]},
        "taskmanager": {
            "data": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "weir"}}}],
            "metrics": [prometheus],
        },
        "alertmanager": {"http": [prometheus]},
    }
    for name, kind in pods.items():
        policy = objects[("NetworkPolicy", name)]["spec"]
        assert policy["podSelector"]["matchLabels"].items() <= pod_labels(objects, kind, name).items(), name
        assert policy["policyTypes"] == ["Ingress"]
        opened = {p["port"]: rule.get("from") for rule in policy["ingress"] for p in rule["ports"]}
        assert opened == expected[name], name
        (c,) = objects[(kind, name)]["spec"]["template"]["spec"]["containers"]
        assert set(opened) == set(named_ports(c)), f"{name}: every container port is opened to someone"
    # The TaskManagers' data port takes Weir's pods: the JobManager and the TaskManagers carry that label.
    for name, kind in WEIR_PODS.items():
        assert pod_labels(objects, kind, name)["app.kubernetes.io/name"] == "weir"


def test_the_service_monitor_scrapes_both_metrics_ports_as_the_prometheus_configs_name_them(
    kustomize: str, dev_copy: Path
) -> None:
    """The component for the Prometheus operator, added to the dev overlay as its comment says."""
    overlay = dev_copy / "overlays/monitoring"
    shutil.copytree(dev_copy / "overlays/dev", overlay)
    with (overlay / "kustomization.yaml").open("a", encoding="utf-8") as f:
        f.write("\ncomponents:\n  - ../../components/prometheus-operator\n")
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in render(kustomize, overlay)}
    monitor = rendered[("ServiceMonitor", "weir")]
    assert monitor["metadata"]["namespace"] == "weir"
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {
        name
        for (kind, name), obj in rendered.items()
        if kind == "Service"
        and selector.items() <= obj["metadata"].get("labels", {}).items()
        and any(p["name"] == "metrics" for p in obj["spec"].get("ports", []))
    }
    assert scraped == {"jobmanager", "taskmanager"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    # The pods bind 0.0.0.0 with tokens: the scrape sends one the tokens file gives read, and no more.
    reference = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    secret = rendered.get(("Secret", reference["name"]))
    assert secret is not None, f"the ServiceMonitor names {reference['name']}, which no rendered Secret is called"
    token = base64.b64decode(secret["data"][reference["key"]]).decode()
    made = dev_credentials.DevCredentials(dev_copy / OVERLAY.relative_to(KUBERNETES) / "credentials")
    pods = {k: v.replace("/etc/weir/credentials", str(made.directory)) for k, v in security_env(rendered).items()}
    access = TransportSecurity.from_env(pods).access
    assert access is not None and access.roles_of(token) == frozenset({METRICS_ROLE})
    prometheus_local = yaml.safe_load((REPO / "deploy/prometheus/prometheus-local.yml").read_text(encoding="utf-8"))
    assert endpoint["interval"] == prometheus_local["global"]["scrape_interval"]
    (relabel,) = endpoint["relabelings"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_service_name"] and relabel["targetLabel"] == "job"
    jobs = {relabel["replacement"].replace("$1", name) for name in scraped}
    assert jobs == {"weir-jobmanager", "weir-taskmanager"}, "the scrape jobs the alerts and dashboards select"


def security_env(rendered: dict[tuple[str, str], Any]) -> dict[str, str]:
    """The ConfigMap weir-security's variables, whatever its generated name."""
    (data,) = [
        o["data"]
        for (kind, name), o in rendered.items()
        if kind == "ConfigMap" and without_hash(name) == "weir-security"
    ]
    return dict(data)


def test_the_high_availability_component_runs_a_leader_and_a_standby_and_routes_to_the_leader(
    kustomize: str, dev_copy: Path
) -> None:
    """components/high-availability added to the dev overlay as its comment says: two JobManagers
    contending for the lease, a standby that stays alive though its /healthz answers 503, and the
    Service (readiness) and a rollout that do not wait for a standby to become Ready."""
    overlay = dev_copy / "overlays/ha"
    shutil.copytree(dev_copy / "overlays/dev", overlay)
    with (overlay / "kustomization.yaml").open("a", encoding="utf-8") as f:
        f.write("\ncomponents:\n  - ../../components/high-availability\n")
    rendered = by_kind_and_name(render(kustomize, overlay))
    spec = rendered[("Deployment", "jobmanager")]["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "Recreate"}  # a RollingUpdate would wait for a standby to be Ready
    c = container(rendered, "jobmanager")
    env = pod_env(rendered, "jobmanager")
    assert env["WEIR_HA_ENABLED"] == "true"
    pod_ip = next(e for e in c["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["WEIR_HA_ADVERTISED_ADDRESS"] == f"$(POD_IP):{named_ports(c)['grpc']}"
    # alive and started whether it leads or waits: its REST port, never /healthz (503 on a standby)
    rest = f"tcp://127.0.0.1:{named_ports(c)['rest']}"
    assert probe_endpoint(c, c["startupProbe"]) == probe_endpoint(c, c["livenessProbe"]) == rest
    # Ready only as the leader: the gRPC port, which a standby does not serve (weir/jobmanager/__main__.py)
    assert probe_endpoint(c, c["readinessProbe"]) == f"tcp://127.0.0.1:{named_ports(c)['grpc']}"
    main = (REPO / "jobmanager/__main__.py").read_text(encoding="utf-8")
    assert "a standby serves its REST API" in main and "then the gRPC server" in main
    # the base's setting names, as docs/configuration.md documents them
    configuration = (REPO / "docs/configuration.md").read_text(encoding="utf-8")
    assert "`WEIR_HA_ENABLED`" in configuration and "`WEIR_HA_ADVERTISED_ADDRESS`" in configuration
