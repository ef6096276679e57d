"""A TaskManager's ``/metrics`` when its slots run in worker processes: the workers' task metrics
merged into the TaskManager's own, and process figures that count the workers.

Each worker keeps its tasks' metrics in its own prometheus-client registry; at each scrape the
TaskManager asks every worker for its families (``slot_link.CollectMetrics``) and merges them with
its own by name (:func:`merge_families`): a series two processes both export (a TaskManager-wide
gauge such as the tasks running, or a subtask whose old attempt still ends in one worker while the
new one runs in another) is their sum. A scrape restricted to some series (``/metrics?name[]=...``,
prometheus-client's filter) asks the workers for those alone, so that a frequent reader of a few
series (a benchmark, an autoscaler) does not cost every worker a collection of every family.
prometheus-client's multiprocess mode is not used: it keeps a dead process's counters and cannot
remove a series, which an ended task attempt must.

``process_cpu_seconds_total``, ``process_resident_memory_bytes`` and the others are the sum over the
TaskManager and its live workers (:class:`ProcessTreeCollector`), and the CPU time also counts the
workers that exited (the kernel's figure for the children a process reaped), so the dashboards'
CPU and memory of a TaskManager are those of everything it runs.
"""

from __future__ import annotations

import resource
import threading
from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

CPU_FAMILY: Final = "process_cpu_seconds"  # its sample: process_cpu_seconds_total
SUMMED_PROCESS_FAMILIES: Final = frozenset(
    {"process_virtual_memory_bytes", "process_resident_memory_bytes", CPU_FAMILY, "process_open_fds"}
)
"""The process figures that add up over processes; the others (start time, max fds) are the TaskManager's."""


WorkerFamilies = Callable[[frozenset[str] | None], list[Metric]]
"""Every worker's metric families, restricted to the samples of the given names (None: all)."""


def merge_families(families: Iterable[Metric]) -> list[Metric]:
    """One family per name, in the order names first appear; samples with the same name and labels
    summed (a ``_created`` timestamp: the earliest)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in families:
        target = merged.get(family.name)
        if target is None:
            target = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            values[family.name] = {}
        into = values[family.name]
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key not in into:
                into[key] = sample.value
            elif sample.name.endswith("_created"):
                into[key] = min(into[key], sample.value)
            else:
                into[key] += sample.value
    for name, target in merged.items():
        for (sample_name, labels), value in values[name].items():
            target.add_sample(sample_name, dict(labels), value)
    return list(merged.values())


class MergedMetrics(Collector):
    """The TaskManager's registry and its workers' families, merged (:func:`merge_families`); what
    its metrics server serves. ``names``: only the samples of these names (a restricted scrape)."""

    def __init__(self, own: CollectorRegistry, workers: WorkerFamilies, names: frozenset[str] | None = None) -> None:
        self._own = own
        self._workers = workers
        self._names = names

    def collect(self) -> Iterable[Metric]:
        own = self._own.collect() if self._names is None else self._own.restricted_registry(self._names).collect()
        return merge_families([*own, *self._workers(self._names)])

    def restricted_registry(self, names: Iterable[str]) -> MergedMetrics:
        """The same, restricted to the samples named (prometheus-client's ``?name[]=`` calls this)."""
        return MergedMetrics(self._own, self._workers, frozenset(names))


def served_registry(own: CollectorRegistry, workers: WorkerFamilies) -> MergedMetrics:
    """What the TaskManager's metrics server serves."""
    return MergedMetrics(own, workers)


class ProcessTreeCollector(Collector):
    """The TaskManager's process figures with its workers in them; see the module. The CPU counter
    never goes down (a worker's time moves from its live figure to the reaped children's when it
    exits; a scrape in between must not see it missing)."""

    def __init__(self, worker_pids: Callable[[], list[int]]) -> None:
        self._worker_pids = worker_pids
        self._cpu_high = 0.0
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        own = list(ProcessCollector(registry=None).collect())
        others = [
            family
            for pid in self._worker_pids()
            for family in ProcessCollector(pid=lambda p=pid: p, registry=None).collect()  # type: ignore[misc]
            if family.name in SUMMED_PROCESS_FAMILIES
        ]
        families = merge_families([*own, *others])
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        for family in families:
            if family.name != CPU_FAMILY:
                continue
            total = sum(s.value for s in family.samples) + children.ru_utime + children.ru_stime
            with self._lock:
                self._cpu_high = max(self._cpu_high, total)
                total = self._cpu_high
            family.samples = []
            family.add_sample(CPU_FAMILY + "_total", {}, total)
        return families
