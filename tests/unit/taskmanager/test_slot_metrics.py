"""A TaskManager's /metrics with slot workers (``slot_metrics``): the workers' families merged with
its own into one family per name, shared series summed, and process figures that count the workers."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from weir.core.metrics import RECORDS_OUT
from weir.taskmanager.slot_metrics import ProcessTreeCollector, merge_families, served_registry
from weir.taskmanager.slot_worker import task_metric_families

LABELS = ("job_id", "operator_uid", "subtask", "taskmanager")


def worker_families(subtask: int, records: float, running: float) -> list[Metric]:
    """What one worker's registry collects: its subtask's counter and its own count of running tasks."""
    registry = CollectorRegistry()
    Counter("weir_records_in_total", "Records", LABELS, registry=registry).labels("j", "map", str(subtask), "tm").inc(
        records
    )
    Gauge("weir_taskmanager_tasks_running", "Tasks", ("taskmanager",), registry=registry).labels("tm").set(running)
    return list(registry.collect())


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_the_workers_series_are_served_once_per_family_with_shared_gauges_summed() -> None:
    own = CollectorRegistry()
    Counter("weir_records_in_total", "Records", LABELS, registry=own)  # defined here, no task in this process
    Gauge("weir_taskmanager_tasks_running", "Tasks", ("taskmanager",), registry=own)
    workers = [*worker_families(0, 100, 2), *worker_families(1, 250, 3)]
    text = generate_latest(served_registry(own, lambda _names: workers)).decode()
    assert text.count("# TYPE weir_records_in_total counter") == 1
    assert samples(text, "weir_records_in_total") == {
        (("job_id", "j"), ("operator_uid", "map"), ("subtask", "0"), ("taskmanager", "tm")): 100.0,
        (("job_id", "j"), ("operator_uid", "map"), ("subtask", "1"), ("taskmanager", "tm")): 250.0,
    }
    assert samples(text, "weir_taskmanager_tasks_running") == {(("taskmanager", "tm"),): 5.0}


def restricted(families: list[Metric], names: frozenset[str] | None) -> list[Metric]:
    """What a worker answers: its families, restricted to the samples named (as ``task_metric_families``)."""
    if names is None:
        return families
    kept = []
    for family in families:
        metric = Metric(family.name, family.documentation, family.type)
        metric.samples = [s for s in family.samples if s.name in names]
        if metric.samples:
            kept.append(metric)
    return kept


def test_a_scrape_restricted_by_name_asks_the_workers_for_those_series_alone() -> None:
    own = CollectorRegistry()
    Counter("weir_records_in_total", "Records", LABELS, registry=own)
    Gauge("weir_taskmanager_tasks_running", "Tasks", ("taskmanager",), registry=own).labels("tm").set(1)
    workers = [*worker_families(0, 100, 2), *worker_families(1, 250, 3)]
    asked: list[frozenset[str] | None] = []

    def from_workers(names: frozenset[str] | None) -> list[Metric]:
        asked.append(names)
        return restricted(workers, names)

    app = make_wsgi_app(served_registry(own, from_workers))
    body = b"".join(
        app(
            {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "name[]=weir_records_in_total"},
            lambda *_: None,
        )
    )
    text = body.decode()
    assert asked == [frozenset({"weir_records_in_total"})]
    assert {s.name for f in text_string_to_metric_families(text) for s in f.samples} == {"weir_records_in_total"}
    assert sorted(samples(text, "weir_records_in_total").values()) == [100.0, 250.0]
    full = generate_latest(served_registry(own, from_workers)).decode()
    assert asked[-1] is None
    assert samples(full, "weir_taskmanager_tasks_running") == {(("taskmanager", "tm"),): 6.0}


def test_a_worker_collects_only_the_families_of_the_names_asked() -> None:
    series = RECORDS_OUT.labels("job-restricted", "job", "numbers", "0", "tm")
    series.inc(7)
    try:
        families = task_metric_families(frozenset({"weir_records_out_total"}))
        assert {s.name for f in families for s in f.samples} == {"weir_records_out_total"}
        assert any(s.labels.get("job_id") == "job-restricted" and s.value == 7 for f in families for s in f.samples)
        everything = {f.name for f in task_metric_families()}
        assert {"weir_records_out", "weir_busy_seconds"} <= everything
        assert not any(name.startswith(("process_", "python_")) for name in everything)
    finally:
        RECORDS_OUT.remove("job-restricted", "job", "numbers", "0", "tm")


def test_a_created_timestamp_of_a_shared_series_is_the_earliest() -> None:
    first, second = Metric("c", "c", "counter"), Metric("c", "c", "counter")
    first.add_sample("c_total", {}, 1.0)
    first.add_sample("c_created", {}, 200.0)
    second.add_sample("c_total", {}, 2.0)
    second.add_sample("c_created", {}, 100.0)
    (merged,) = merge_families([first, second])
    assert {s.name: s.value for s in merged.samples} == {"c_total": 3.0, "c_created": 100.0}


def figure(collector: ProcessTreeCollector, name: str) -> float:
    return next(s.value for f in collector.collect() for s in f.samples if s.name == name)


def test_process_figures_count_the_workers_cpu_and_memory() -> None:
    """A busy child's CPU time and resident memory are in the TaskManager's figures while it runs, and
    its CPU time stays in them once it exited and was reaped."""
    burn = (
        "import sys, time\n"
        "x = bytearray(64 * 2**20)\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\n"
        "print('burnt', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        alone = ProcessTreeCollector(lambda: [])
        tree = ProcessTreeCollector(lambda: [child.pid])
        cpu_gap = figure(tree, "process_cpu_seconds_total") - figure(alone, "process_cpu_seconds_total")
        rss_gap = figure(tree, "process_resident_memory_bytes") - figure(alone, "process_resident_memory_bytes")
        before_exit = figure(tree, "process_cpu_seconds_total")
    finally:
        child.communicate("\n", timeout=10)
    assert cpu_gap >= 0.45
    assert rss_gap >= 64 * 2**20
    exited = ProcessTreeCollector(lambda: [])  # the child reaped: its time is among the children's
    assert figure(exited, "process_cpu_seconds_total") >= before_exit - 0.05
