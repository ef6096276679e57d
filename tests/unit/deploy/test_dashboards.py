"""Grafana dashboards and Prometheus rules, checked without any service running.

* every dashboard is valid JSON, every panel and target queries the provisioned datasource, every
  target has an expression that promtool parses, every metric it reads is one Weir exports, and
  every metric Weir exports is on some dashboard;
* the rules pass ``promtool check rules`` and their unit tests (weir_alerts_test.yml: each alert
  fires on its synthetic failure and stays quiet for a healthy job); both Prometheus configs load
  them and pass ``promtool check config``.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.observability import (
    DASHBOARDS_DIR,
    DATASOURCE,
    PROMETHEUS_COMPOSE,
    PROMETHEUS_LOCAL,
    REPO,
    RULES_DIR,
    PanelQuery,
    dashboards,
    expand,
    load_yaml,
    metric_names,
    panel_queries,
    rules,
    variable_queries,
)
from tests.unit.deploy.test_compose import promtool_checkable

ALERTS_TEST = Path(__file__).with_name("weir_alerts_test.yml")
METRIC_MODULES = (
    "weir.core.metrics",
    "weir.operators.source_metrics",
    "weir.operators.rejections",
    "weir.jobmanager.metrics",
)
PROCESS_METRICS = {"process_resident_memory_bytes", "process_cpu_seconds_total"}  # prometheus-client's own
PROMETHEUS_METRICS = {"up"}  # Prometheus' own, per target
RUNBOOK = REPO / "docs/runbook.md"
EXPECTED_ALERTS = {
    "WeirJobNotRunning",
    "WeirCheckpointsFailing",
    "WeirRestartLoop",
    "WeirSustainedBackpressure",
    "WeirGrowingLag",
    "WeirStuckPreparedTransaction",
    "WeirJobEndUnresolved",
    "WeirDeadLetters",
    "WeirWatermarkStalled",
    "WeirTargetDown",
    "WeirNoJobManagerLeader",
    "WeirTaskManagersLost",
}
GRID_WIDTH = 24


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: `make infra-up` installs it (Debian package prometheus)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def is_collector(value: object) -> bool:
    """A custom collector (an instance with describe(), such as weir.core.metrics.LatencyHistogram)."""
    return not isinstance(value, type) and callable(getattr(value, "describe", None))


def exported_metric_names() -> set[str]:
    """Every series name Weir's metric modules expose (counters with _total, histograms with
    _bucket/_sum/_count)."""
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for module_name in METRIC_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase) or is_collector(value):
                for family in value.describe():
                    names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


# Dashboards ---------------------------------------------------------------------------------------


def test_there_are_the_four_dashboards_with_unique_uids() -> None:
    boards = dashboards()
    assert set(boards) == {
        "weir-job-overview.json",
        "weir-checkpoints.json",
        "weir-sinks.json",
        "weir-taskmanagers.json",
    }
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)
    assert all(b["title"].startswith("Weir / ") and "weir" in b["tags"] for b in boards.values())


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_every_panel_queries_the_provisioned_datasource(name: str) -> None:
    board = dashboards()[name]
    assert board["panels"], f"{name} has no panels"
    for panel in board["panels"]:
        where = f"{name}: panel {panel.get('title')!r}"
        assert panel.get("datasource") == DATASOURCE, where
        assert panel.get("targets"), f"{where} has no targets"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), f"{where}: duplicate refIds"
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, f"{where} / {target['refId']}"
            assert target.get("expr", "").strip(), f"{where} / {target['refId']} has no expression"
    for var in board.get("templating", {}).get("list", []):
        if "datasource" in var:
            assert var["datasource"] == DATASOURCE, f"{name}: variable {var['name']}"


def test_every_exported_metric_is_on_a_dashboard() -> None:
    """A new metric gets a panel: every series name family Weir exports is read by some panel."""
    read = {name for q in panel_queries() for name in metric_names(q.expr)}
    families = {
        name.removesuffix("_bucket") for name in exported_metric_names() if not name.endswith(("_sum", "_count"))
    }
    missing = {f for f in families if f not in read and f + "_bucket" not in read}
    assert not missing, f"metrics on no dashboard: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_panels_fit_the_grid_without_overlapping(name: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboards()[name]["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"{name}: panel {panel['title']!r} overlaps another"
        taken |= cells


def test_dashboards_read_only_metrics_weir_exports() -> None:
    exported = exported_metric_names() | PROCESS_METRICS | PROMETHEUS_METRICS
    unknown = {(str(q), name) for q in panel_queries() for name in metric_names(q.expr) if name not in exported}
    assert not unknown, "metrics no Weir process exports:\n" + "\n".join(f"{n}  in  {q}" for q, n in sorted(unknown))


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    """promtool parses every panel expression (each checked as a recording rule)."""
    queries = panel_queries() + [PanelQuery(board, var, "variable", query) for board, var, query in variable_queries()]
    check = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:query_{i}:check", "expr": expand(q.expr)} for i, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(check, sort_keys=False, width=1000), encoding="utf-8")
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# Prometheus rules and configs ---------------------------------------------------------------------


def test_promtool_accepts_the_rules() -> None:
    result = run_promtool("check", "rules", *(str(p) for p in sorted(RULES_DIR.glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_fire_on_their_failures_and_not_on_healthy_jobs() -> None:
    result = run_promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("config", [PROMETHEUS_LOCAL, PROMETHEUS_COMPOSE], ids=["local", "compose"])
def test_promtool_accepts_the_config_and_it_loads_the_rules(config: Path, tmp_path: Path) -> None:
    result = run_promtool("check", "config", str(promtool_checkable(config, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(path.name in result.stdout for path in RULES_DIR.glob("*.yml")), result.stdout
    assert load_yaml(config)["rule_files"] == ["rules/*.yml"]


def test_weir_labels_its_series_job_id_so_no_config_relabels_them() -> None:
    """A label named ``job`` would clash with the scrape job (Prometheus would rename it
    ``exported_job``): Weir's per-job series carry ``job_id``, and the configs scrape them as they are."""
    for module_name in METRIC_MODULES:
        for value in vars(importlib.import_module(module_name)).values():
            if isinstance(value, MetricWrapperBase):
                labels = value._labelnames
                assert "job" not in labels, f"{value._name} is labelled job: name it job_id"
                assert labels[:2] == ("job_id", "job_name") or labels in ((), ("taskmanager",)), (
                    f"{value._name}: {labels} (a job's series carry job_id and job_name)"
                )
    for config in (load_yaml(PROMETHEUS_LOCAL), load_yaml(PROMETHEUS_COMPOSE)):
        weir_jobs = [j for j in config["scrape_configs"] if j["job_name"].startswith("weir-")]
        assert {j["job_name"] for j in weir_jobs} == {"weir-jobmanager", "weir-taskmanager", "weir-test"}
        assert "exported_job" not in yaml.safe_dump(config)


def test_the_alerts_are_there_with_severity_for_and_annotations() -> None:
    alerts = {r.name: r.body for r in rules() if r.kind == "alert"}
    assert set(alerts) == EXPECTED_ALERTS
    for name, body in alerts.items():
        assert body["labels"]["severity"] in ("warning", "critical"), name
        assert body.get("for"), f"{name} has no for:"
        assert body["annotations"]["summary"] and body["annotations"]["description"], name


def test_every_alert_links_its_runbook_section() -> None:
    """runbook_url is docs/runbook.md#<alert in lower case>, a section headed by the alert's name."""
    headings = {
        line.removeprefix("## ").strip().lower()
        for line in RUNBOOK.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }
    for rule in rules():
        if rule.kind == "alert":
            assert rule.body["annotations"].get("runbook_url") == f"docs/runbook.md#{rule.name.lower()}", rule.name
            assert rule.name.lower() in headings, f"docs/runbook.md has no section ## {rule.name}"


def test_alerts_compare_recorded_signals_and_rules_read_exported_metrics() -> None:
    """Every alert reads only recorded signals (so the integration test can query each one), and
    every rule reads only metrics Weir exports or records."""
    all_rules = rules()
    records = {r.name for r in all_rules if r.kind == "record"}
    exported = exported_metric_names()
    for rule in all_rules:
        names = metric_names(rule.expr)
        assert names, f"{rule.name} reads no metric"
        if rule.kind == "alert":
            assert names <= records, f"{rule.name} reads {names - records}, not a recorded signal"
        else:
            known = exported | records | PROMETHEUS_METRICS
            assert names <= known, f"{rule.name} reads unknown metrics {names - known}"
