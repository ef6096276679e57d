"""Every dashboard panel and every alert rule against a live cluster scraped by the local Prometheus.

Three jobs run side by side on the session's cluster:

* ``load``: the keyed aggregation over generated events at a throttled rate, checkpoints every 500 ms;
* ``loop``: a job failing on the same record in every attempt (jobs/restart_loop.py), restarted
  every 500 ms: WeirRestartLoop must fire;
* ``slow``: a backpressured job whose checkpoints time out (jobs/slow_checkpoints.py):
  WeirCheckpointsFailing must fire.

Prometheus scrapes the cluster's metrics ports: the static jobs of prometheus-local.yml cover the
default ports; ports set through WEIR_JOBMANAGER_METRICS_PORT / WEIR_TASKMANAGER_METRICS_BASE_PORT
are added as a file_sd target file of the ``weir-test`` job for the duration of the module.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster, create_topics, create_window_table
from tests.observability import (
    PROMETHEUS_LOCAL,
    cluster_metrics_targets,
    expand,
    exported_metrics_read,
    load_yaml,
    panel_queries,
    rules,
    variable_queries,
)
from weir.core.config import Endpoints
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import TASKMANAGERS

pytestmark = pytest.mark.integration

JOBS_DIR = "tests/integration/observability/jobs"
POLL_S = 1.0  # poll interval inside a deadline; Prometheus scrapes and evaluates every 2 s
DATA_DEADLINE_S = 90.0
ALERT_DEADLINE_S = 90.0

# Metrics the dashboards and rules read that Weir does not update yet: a query reading one of them
# is not required to return data. Each comes with the reason and a probe, PromQL that answers once
# the metric is updated ($jobs: these jobs' ids, $instances: the cluster's metrics endpoints);
# test_metrics_not_yet_updated_are_still_missing fails when a probe answers, as a reminder to delete
# the entry so that the queries reading the metric are checked.
NOT_YET_UPDATED: dict[str, tuple[str, str | None]] = {}

# Recorded signals that answer only for a job in trouble: a job not running (the loop job is RUNNING
# most of the time), a task with event-time watermarks (test_alertmanager.py proves the first).
SIGNALS_OF_TROUBLE = {
    "job_id:weir_job_not_running:max",
    "job_id_operator_uid_subtask:weir_current_watermark_seconds:changes5m",
}


# Prometheus's HTTP API ----------------------------------------------------------------------------


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _request(self, path: str, params: dict[str, str] | None = None, method: str = "GET") -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        request = urllib.request.Request(f"{self.url}{path}{query}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body.strip().startswith(b"{") else body

    def query(self, expr: str) -> list[dict[str, Any]]:
        try:
            answer = self._request("/api/v1/query", {"query": expr})
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"Prometheus rejected {expr!r}: {exc.read().decode(errors='replace')}") from exc
        return answer["data"]["result"]

    def reload(self) -> None:
        self._request("/-/reload", method="POST")

    def rule_groups(self) -> list[dict[str, Any]]:
        return self._request("/api/v1/rules")["data"]["groups"]

    def alerts(self) -> list[dict[str, Any]]:
        return self._request("/api/v1/alerts")["data"]["alerts"]

    def targets(self) -> list[dict[str, Any]]:
        return self._request("/api/v1/targets", {"state": "active"})["data"]["activeTargets"]


# Fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(services: Endpoints) -> Prometheus:
    """The local Prometheus with this checkout's config and rules loaded (POST /-/reload)."""
    prom = Prometheus(services.prometheus_url)
    prom.reload()
    wanted = {g["name"] for path in PROMETHEUS_LOCAL.parent.glob("rules/*.yml") for g in load_yaml(path)["groups"]}
    polling.poll(
        f"Prometheus to load the rule groups {sorted(wanted)}",
        30,
        lambda: True if wanted <= {g["name"] for g in prom.rule_groups()} else None,
        POLL_S,
    )
    return prom


@pytest.fixture(scope="module")
def scraped(weir_cluster: WeirCluster, prometheus: Prometheus) -> set[str]:
    """The cluster's metrics endpoints, every one up in Prometheus (the session fixture registers those
    its config does not list)."""
    wanted = cluster_metrics_targets(weir_cluster.endpoints, TASKMANAGERS)

    def all_up() -> bool | None:
        health = {t["labels"]["instance"]: t["health"] for t in prometheus.targets()}
        return True if all(health.get(t) == "up" for t in wanted) else None

    polling.poll(f"Prometheus to scrape {sorted(wanted)}", 60, all_up, POLL_S)
    return wanted


@dataclass(frozen=True)
class Jobs:
    load: str
    loop: str
    slow: str

    @property
    def all(self) -> str:
        """The job ids as the regular expression a dashboard's $job_id variable becomes."""
        return f"{self.load}|{self.loop}|{self.slow}"


@pytest.fixture(scope="module")
def jobs(weir_cluster: WeirCluster, scraped: set[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    endpoints = weir_cluster.endpoints
    unique = f"obs{os.getpid()}"
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 3, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    # Event time starts now and advances 1 ms per event, so the watermark lag stays meaningful.
    spec = EventSpec(count=9000, keys=50, start_ms=int(time.time() * 1000), events_per_ms=1, malformed_every=1000)
    produce_events(endpoints, source, spec)
    out = tmp_path_factory.mktemp("observability")
    submitted: list[str] = []
    try:
        submitted.append(
            weir_cluster.submit(
                "examples/keyed_aggregation.py",
                {
                    "source.topic": source,
                    "sink.topic": sink,
                    "sink.table": table,
                    "source.dlq_topic": dlq,
                    "source.records_per_second": "300",
                    "checkpointing.interval": "500ms",
                },
            )
        )
        submitted.append(
            weir_cluster.submit(
                f"{JOBS_DIR}/restart_loop.py",
                {
                    "output": str(out / "loop"),
                    "checkpointing.interval": "500ms",
                    "restart.strategy": "fixed-delay",
                    "restart.delay": "500ms",
                },
                parallelism=1,
            )
        )
        submitted.append(
            weir_cluster.submit(
                f"{JOBS_DIR}/slow_checkpoints.py",
                {"output": str(out / "slow"), "checkpointing.interval": "500ms", "checkpointing.timeout": "1ms"},
                parallelism=1,  # one input channel at the map: no alignment holds the source back
            )
        )
        yield Jobs(*submitted)
    finally:
        for job_id in submitted:
            weir_cluster.client.cancel_job(job_id)
        for job_id in submitted:
            status = weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=60)
            assert status.summary.status == "CANCELED", status


# What must answer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    where: str
    expr: str


def not_yet_updated(expr: str) -> set[str]:
    return exported_metrics_read(expr) & set(NOT_YET_UPDATED)


def dashboard_checks(jobs: Jobs) -> list[Check]:
    checks = [Check(str(q), expand(q.expr, jobs.all)) for q in panel_queries()]
    checks += [Check(f"{board} / variable ${var}", query) for board, var, query in variable_queries()]
    return [c for c in checks if not not_yet_updated(c.expr)]


def unanswered(prometheus: Prometheus, checks: list[Check]) -> list[Check]:
    return [c for c in checks if not prometheus.query(c.expr)]


def wait_until_answered(prometheus: Prometheus, checks: list[Check]) -> None:
    remaining = list(checks)

    def still_unanswered() -> list[Check]:
        remaining[:] = unanswered(prometheus, remaining)
        return remaining

    polling.settle(DATA_DEADLINE_S, still_unanswered, lambda left: not left, POLL_S)
    assert not remaining, f"{len(remaining)} of {len(checks)} queries returned no data:\n" + "\n".join(
        f"  {c.where}\n    {c.expr}" for c in remaining
    )


def firing(prometheus: Prometheus, alert: str, job_id: str) -> dict[str, Any] | None:
    for a in prometheus.alerts():
        if a["labels"].get("alertname") == alert and a["labels"].get("job_id") == job_id and a["state"] == "firing":
            return a
    return None


# Tests --------------------------------------------------------------------------------------------


def test_every_dashboard_query_returns_data(prometheus: Prometheus, jobs: Jobs) -> None:
    wait_until_answered(prometheus, dashboard_checks(jobs))


def test_every_recorded_signal_of_the_alerts_returns_data(prometheus: Prometheus, jobs: Jobs) -> None:
    """Each alert compares recorded signals with a threshold: every signal answers for these jobs
    (the thresholds themselves are tested by promtool in tests/unit/deploy). Signals of the cluster
    (not per job) and those that answer only for a job in trouble are left out (SIGNALS_OF_TROUBLE)."""
    checks = [
        Check(f"record {r.name}", f'{r.name}{{job_id=~"{jobs.all}"}}')
        for r in rules()
        if r.kind == "record"
        and r.name.startswith("job_id")
        and r.name not in SIGNALS_OF_TROUBLE
        and not not_yet_updated(r.expr)
    ]
    wait_until_answered(prometheus, checks)


def test_every_rule_evaluates_without_error(prometheus: Prometheus, jobs: Jobs) -> None:
    names = {r.name for r in rules()}
    loaded = {r["name"]: r for g in prometheus.rule_groups() for r in g["rules"] if r["name"] in names}
    assert set(loaded) == names
    broken = {name: r.get("lastError") for name, r in loaded.items() if r["health"] not in ("ok", "unknown")}
    assert not broken, broken


def test_restart_loop_fires_weir_restart_loop(prometheus: Prometheus, jobs: Jobs) -> None:
    alert = polling.poll(
        f"WeirRestartLoop to fire for job {jobs.loop}",
        ALERT_DEADLINE_S,
        lambda: firing(prometheus, "WeirRestartLoop", jobs.loop),
        POLL_S,
    )
    assert float(alert["value"]) >= 3
    assert firing(prometheus, "WeirRestartLoop", jobs.load) is None


def test_checkpoint_timeouts_fire_weir_checkpoints_failing(prometheus: Prometheus, jobs: Jobs) -> None:
    alert = polling.poll(
        f"WeirCheckpointsFailing to fire for job {jobs.slow}",
        ALERT_DEADLINE_S,
        lambda: firing(prometheus, "WeirCheckpointsFailing", jobs.slow),
        POLL_S,
    )
    assert float(alert["value"]) > 0


def test_the_restart_loop_restores_from_a_checkpoint(prometheus: Prometheus, jobs: Jobs) -> None:
    restores = polling.poll(
        f"job {jobs.loop} to restore from a checkpoint",
        ALERT_DEADLINE_S,
        lambda: prometheus.query(f'weir_job_restores_total{{job_id="{jobs.loop}"}} > 0') or None,
        POLL_S,
    )
    assert restores


def test_the_signals_tell_the_jobs_apart(prometheus: Prometheus, jobs: Jobs) -> None:
    """Not only data: the load flows and checkpoints, the slow job's source is backpressured and
    loses more checkpoints than it completes."""
    load, slow = f'job_id="{jobs.load}"', f'job_id="{jobs.slow}"'
    wait_until_answered(
        prometheus,
        [
            Check("the load job sends records", f"sum(rate(weir_records_out_total{{{load}}}[1m])) > 0"),
            Check(
                "the load job completes checkpoints", f"job_id:weir_checkpoint_completion_age:intervals{{{load}}} < 10"
            ),
            Check(
                "the slow job's source waits for credit most of the time",
                "job_id_operator_uid_subtask:weir_backpressured_seconds:rate1m"
                f'{{{slow}, operator_uid="numbers"}} > 0.5',
            ),
            Check(
                "the slow job's checkpoints mostly expire",
                f"sum(weir_checkpoints_failed_total{{{slow}}})"
                f" > 3 * (sum(weir_checkpoints_completed_total{{{slow}}}) or vector(0))",
            ),
        ],
    )


def test_metrics_not_yet_updated_are_still_missing(prometheus: Prometheus, jobs: Jobs, scraped: set[str]) -> None:
    """Runs last, when the load job has run long enough for every updated metric to show."""
    instances = "|".join(sorted(scraped))
    updated = sorted(
        name
        for name, (_why, probe) in NOT_YET_UPDATED.items()
        if probe is not None and prometheus.query(probe.replace("$jobs", jobs.all).replace("$instances", instances))
    )
    assert not updated, (
        f"now updated: delete {updated} from NOT_YET_UPDATED in {Path(__file__).name} "
        "so that the queries reading them are checked"
    )
