"""A job whose TaskManager is killed fires WeirJobNotRunning, and Alertmanager delivers it.

The module starts its own pieces, on ports of its own: a Weir cluster with one TaskManager (so that
killing it kills the job, and the session's cluster is left alone), a Prometheus scraping the
JobManager with the shipped rules (every ``for:`` shortened to seconds: the rules' expressions are
what is under test, their production durations are promtool's), an Alertmanager with the shipped
routing (deploy/alertmanager/alertmanager.yml, its receivers given a webhook, its group waits
shortened) and the webhook: a small HTTP server here that keeps what it is sent.

A job is cancelled on purpose first: its series go (the JobManager removes an ended job's series),
and no notification names it. Then a job with restart strategy ``none`` runs, its TaskManager is
killed (SIGKILL, as ``docker kill``), the job fails, and WeirJobNotRunning must reach the webhook of
the critical receiver, naming the job by id and name and linking its runbook section.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT
from tests.observability import RULES_DIR, load_yaml
from weir.core.config import Endpoints
from weir.core.states import TaskState
from weir.tools.client import JobManagerClient
from weir.tools.supervisor import default_children, kill_process, start_cluster, stop_cluster

pytestmark = pytest.mark.integration

ALERTMANAGER_CONFIG = REPO_ROOT / "deploy/alertmanager/alertmanager.yml"
JOB_FILE = REPO_ROOT / "tests/integration/observability/jobs/restart_loop.py"
SHORT_FOR = "10s"  # every alert's for: in the test's copy of the rules (a job deploying is CREATED for a moment)
DEADLINE_S = 120.0


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.fail(
        f"none of {', '.join(names)} is installed: deploy/local/prometheus.sh install and "
        "deploy/local/alertmanager.sh install (make infra-up) install them (Debian prometheus, prometheus-alertmanager)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port_run(length: int) -> int:
    """The first of ``length`` + 1 consecutive free ports (TaskManager N listens on base + N)."""
    for _ in range(50):
        base = free_port()
        if base + length < 65536 and all(_is_free(base + n) for n in range(1, length + 1)):
            return base
    raise AssertionError(f"found no {length + 1} consecutive free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ready(url: str) -> bool | None:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return True if response.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


# The webhook receiver -----------------------------------------------------------------------------


@dataclass
class Notification:
    receiver_path: str  # the URL path of the receiver's webhook (/weir-critical, /weir-warning)
    body: dict[str, Any]


@dataclass
class Webhook:
    url: str
    received: list[Notification] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, alertname: str, job_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(receiver path, alert) of every alert named ``alertname`` for ``job_id`` received so far."""
        with self.lock:
            return [
                (n.receiver_path, alert)
                for n in self.received
                for alert in n.body.get("alerts", [])
                if alert["labels"].get("alertname") == alertname and alert["labels"].get("job_id") == job_id
            ]


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            with hook.lock:
                hook.received.append(Notification(self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="alert-webhook", daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


# Alertmanager and Prometheus ----------------------------------------------------------------------


def start(argv: list[str], log: Path, url: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    polling.poll(f"{argv[0]} ready at {url} (log {log})", 60, lambda: ready(url) if process.poll() is None else True)
    assert process.poll() is None, f"{argv[0]} exited: {log.read_text(errors='replace')[-2000:]}"
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def alertmanager(webhook: Webhook, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shipped routing, each receiver posting to the webhook at /<receiver name>."""
    directory = tmp_path_factory.mktemp("alertmanager")
    config = load_yaml(ALERTMANAGER_CONFIG)
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    for receiver in config["receivers"]:
        receiver["webhook_configs"] = [{"url": f"{webhook.url}/{receiver['name']}", "send_resolved": True}]
    path = directory / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        binary("prometheus-alertmanager", "alertmanager"),
        f"--config.file={path}",
        f"--storage.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # one instance, no gossip port
    ]
    process = start(argv, directory / "alertmanager.log", url)
    try:
        yield url
    finally:
        stop(process)


@dataclass(frozen=True)
class Cluster:
    endpoints: Endpoints
    directory: Path
    client: JobManagerClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """JobManager and one TaskManager on free ports, checkpoints in the run directory (file://)."""
    run_dir = tmp_path_factory.mktemp("alerts-run")
    jm_port = free_port()
    env = {
        "WEIR_RUN_DIR": str(run_dir),
        "WEIR_CHECKPOINT_DIR": f"file://{run_dir / 'checkpoints'}",
        "WEIR_JOBMANAGER_PORT": str(jm_port),
        "WEIR_JOBMANAGER_ADDRESS": f"127.0.0.1:{jm_port}",
        "WEIR_JOBMANAGER_METRICS_PORT": str(free_port()),
        "WEIR_JOBMANAGER_REST_PORT": str(free_port()),
        "WEIR_TASKMANAGER_METRICS_BASE_PORT": str(free_port_run(1)),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        endpoints = Endpoints.from_env()
        directory = run_dir / "cluster"
        start_cluster(
            directory,
            endpoints,
            restart=True,
            restart_delay_s=1.0,
            timeout_s=90,
            children=default_children(endpoints, taskmanagers=1),
        )
        client = JobManagerClient(endpoints.jobmanager_address)
        try:
            yield Cluster(endpoints, directory, client)
        finally:
            client.close()
            stop_cluster(directory)


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as response:
            result: list[dict[str, Any]] = json.loads(response.read())["data"]["result"]
            return result


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, alertmanager: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """The shipped rules with short for: durations, scraping the JobManager, alerting Alertmanager."""
    directory = tmp_path_factory.mktemp("prometheus")
    rule_files = []
    for rules_path in sorted(RULES_DIR.glob("*.yml")):
        rules = load_yaml(rules_path)
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["for"] = SHORT_FOR
        copy = directory / rules_path.name
        copy.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
        rule_files.append(str(copy))
    am = urllib.parse.urlparse(alertmanager)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.netloc]}]}]},
        "scrape_configs": [
            {
                "job_name": "weir-jobmanager",
                "static_configs": [{"targets": [f"127.0.0.1:{cluster.endpoints.jobmanager_metrics_port}"]}],
            }
        ],
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        binary("prometheus"),
        f"--config.file={path}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    process = start(argv, directory / "prometheus.log", url)
    try:
        yield Prometheus(url)
    finally:
        stop(process)


# The test -----------------------------------------------------------------------------------------


def submit(cluster: Cluster, name: str, output: Path) -> str:
    parameters = {"fail_at": str(10**9), "rate": "20", "output": str(output), "restart.strategy": "none"}
    job_id = cluster.client.submit_job(JOB_FILE, parameters, 1, job_name=name)

    def tasks_running() -> bool | None:
        # The job is RUNNING once its deployment went out; its tasks run once the TaskManager started
        # them. A TaskManager lost before that is a deployment failure, retried whatever the strategy.
        status = cluster.client.job_status(job_id)
        running = status.summary.status == "RUNNING" and all(t.state is TaskState.RUNNING for t in status.tasks)
        return True if running and status.tasks else None

    polling.poll(f"job {name} ({job_id}) and its tasks running", DEADLINE_S, tasks_running)
    return job_id


def wait_for_status(cluster: Cluster, job_id: str, wanted: str) -> None:
    status = polling.settle(
        DEADLINE_S, lambda: cluster.client.job_status(job_id).summary.status, lambda found: found == wanted, 0.5
    )
    if status != wanted:
        log = cluster.directory / "jobmanager.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else f"(no {log})"
        pytest.fail(f"job {job_id} is {status}, not {wanted}; the JobManager's log ends:\n{tail}")


def test_a_killed_job_fires_job_not_running_through_alertmanager(
    cluster: Cluster, prometheus: Prometheus, webhook: Webhook, tmp_path: Path, unique: str
) -> None:
    # A job cancelled on purpose: its series go, no alert names it.
    canceled_name = f"alerts-canceled-{unique}"
    canceled = submit(cluster, canceled_name, tmp_path / "canceled")
    polling.poll(
        "Prometheus to scrape the running job's status",
        DEADLINE_S,
        lambda: prometheus.query(f'weir_job_status{{job_id="{canceled}", job_name="{canceled_name}"}} == 1') or None,
    )
    cluster.client.cancel_job(canceled)
    wait_for_status(cluster, canceled, "CANCELED")
    polling.poll(
        f"the series of the canceled job {canceled} to go",
        DEADLINE_S,
        lambda: True if not prometheus.query(f'weir_job_status{{job_id="{canceled}"}}') else None,
    )

    # A job whose only TaskManager is killed, with no restarts: it fails, and the alert is delivered.
    killed_name = f"alerts-killed-{unique}"
    killed = submit(cluster, killed_name, tmp_path / "killed")
    kill_process(cluster.directory, "taskmanager-1")
    wait_for_status(cluster, killed, "FAILED")
    delivered = polling.poll(
        f"WeirJobNotRunning for job {killed} at the webhook",
        DEADLINE_S,
        lambda: [a for a in webhook.alerts("WeirJobNotRunning", killed) if a[1]["status"] == "firing"] or None,
    )
    receiver_path, alert = delivered[0]
    assert receiver_path == "/weir-critical"  # severity critical: routed to the paging receiver
    assert alert["labels"]["job_name"] == killed_name and alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"] == "docs/runbook.md#weirjobnotrunning"
    assert alert["annotations"]["summary"] == f"Job {killed_name} ({killed}) is not running"
    assert webhook.alerts("WeirJobNotRunning", canceled) == []
