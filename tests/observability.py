"""Weir's Grafana dashboards and Prometheus rules as the tests read them (no service needed).

Shared by tests/unit/deploy/test_dashboards.py (static checks) and
tests/integration/observability/test_prometheus.py (every query answered by a live Prometheus).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from weir.core.config import Endpoints

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS_DIR = REPO / "deploy/grafana/dashboards"
RULES_DIR = REPO / "deploy/prometheus/rules"
PROMETHEUS_LOCAL = REPO / "deploy/prometheus/prometheus-local.yml"
PROMETHEUS_COMPOSE = REPO / "deploy/prometheus/prometheus-compose.yml"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}  # the dashboards' datasource variable

_METRIC_NAME = re.compile(
    r"\b((?:[a-z_]+:)?weir_[a-z0-9_]+(?::[a-z0-9_]+)?|process_[a-z_]+|up(?=\{))\b"
)  # Weir's own, prometheus-client's process_*, and Prometheus' up{...} (the target-down alert)


def static_targets() -> set[str]:
    """The ``host:port`` targets prometheus-local.yml scrapes by itself."""
    config = yaml.safe_load(PROMETHEUS_LOCAL.read_text(encoding="utf-8"))
    return {t for job in config["scrape_configs"] for c in job.get("static_configs", []) for t in c["targets"]}


def cluster_metrics_targets(endpoints: Endpoints, taskmanagers: int) -> set[str]:
    """The metrics endpoints of a cluster on ``endpoints``: its JobManager's and TaskManager 1..N's."""
    ports = [endpoints.jobmanager_metrics_port] + [
        endpoints.taskmanager_metrics_base_port + n for n in range(1, taskmanagers + 1)
    ]
    return {f"127.0.0.1:{port}" for port in ports}


FLAGS_WITHIN_S = 120.0


def targets_dir(endpoints: Endpoints) -> Path:
    """Where the running local Prometheus reads the targets a test adds (file_sd, job ``weir-test``):
    ``targets/`` beside the config file it was started with, which deploy/local/prometheus.sh keeps
    in the shared run directory (``$WEIR_RUN_DIR/prometheus/config``) for every checkout. Asked until
    it answers, within ``FLAGS_WITHIN_S`` (another session may be starting it again)."""
    from tests.integration import polling

    def config_file() -> str | None:
        try:
            with urllib.request.urlopen(f"{endpoints.prometheus_url}/api/v1/status/flags", timeout=10) as response:
                return str(json.load(response)["data"]["config.file"])
        except OSError:  # refused while it restarts, 503 while it starts
            return None

    return (
        Path(polling.poll("the local Prometheus to say which config it reads", FLAGS_WITHIN_S, config_file)).parent
        / "targets"
    )


def register_scrape_targets(endpoints: Endpoints, targets: set[str], name: str) -> Path | None:
    """Have the local Prometheus scrape those of ``targets`` its config does not list (a session
    cluster of a second pytest-xdist worker runs on shifted ports): a file in its ``targets_dir``,
    which it reads within seconds (file_sd). The file to delete afterwards, or None when nothing was
    missing."""
    extra = sorted(targets - static_targets())
    if not extra:
        return None
    path = targets_dir(endpoints) / f"{name}-{os.getpid()}.json"
    path.write_text(json.dumps([{"targets": extra, "labels": {"weir_test": name}}]), encoding="utf-8")
    return path


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}: {self.expr}"


@dataclass(frozen=True)
class Rule:
    group: str
    name: str  # the record or alert name
    kind: str  # "record" or "alert"
    expr: str
    body: dict[str, Any]


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> parsed dashboard JSON."""
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def panel_queries() -> list[PanelQuery]:
    return [
        PanelQuery(board["title"], panel["title"], target["refId"], target.get("expr", ""))
        for board in dashboards().values()
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def variable_queries() -> list[tuple[str, str, str]]:
    """(dashboard, variable, metric) of every ``label_values(metric, label)`` variable, as a query
    returning the label."""
    found = []
    for board in dashboards().values():
        for var in board.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((\w+(?:\{[^}]*\})?),\s*(\w+)\)", query)
            assert match, f"{board['title']}: variable {var['name']}: unsupported query {query!r}"
            found.append((board["title"], var["name"], expand(f"count by ({match.group(2)}) ({match.group(1)})")))
    return found


def expand(expr: str, job_ids: str = ".*") -> str:
    """A panel's expression with the dashboard variables Grafana would fill in: ``$job_id`` is a
    regular expression of job ids (``a|b``), All is ``.*``; ``$job_name`` is All."""
    return expr.replace("$job_id", job_ids).replace("$job_name", ".*")


def rules() -> list[Rule]:
    found = []
    for path in sorted(RULES_DIR.glob("*.yml")):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                kind = "record" if "record" in rule else "alert"
                found.append(Rule(group["name"], rule[kind], kind, rule["expr"], rule))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric and recording-rule names an expression reads (Weir's own and process_*)."""
    return set(_METRIC_NAME.findall(expr))


def exported_metrics_read(expr: str) -> set[str]:
    """The exported metrics an expression reads, through the recording rules it reads."""
    recorded = {r.name: r.expr for r in rules() if r.kind == "record"}
    found: set[str] = set()
    pending = list(metric_names(expr))
    while pending:
        name = pending.pop()
        if name in recorded:
            pending.extend(metric_names(recorded.pop(name)))
        elif ":" not in name:
            found.add(name)
    return found


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))
