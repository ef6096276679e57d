"""Cores that add up: one TaskManager with 1 slot vs 2 slots on a CPU-bound job.

``make bench-slots`` (``.venv/bin/python -m bench.slots_bench [--rounds 3] [--events N] [--work N]``)
runs bench/jobs/cpu_per_record.py (generator -> a map with a fixed amount of Python work per record
-> key_by -> window count+sum -> discard) on a private cluster of a JobManager and ONE TaskManager,
in these configurations:

- ``1 slot, p=1`` and ``2 slots, p=2`` with slot processes (``--slot-processes``, each slot's tasks in
  a worker process of its own): the pair whose ratio is the target (>= 1.7x on 2 cores);
- the same two with ``--no-slot-processes`` (every task in the TaskManager's process), the baseline
  that the setting's default is chosen against.

``--baseline-tree DIR`` runs every configuration a second time with the cluster's processes from
another checkout (``PYTHONPATH=DIR``: e.g. a worktree of main), measured by this tree's bench in
the same rounds, so that a change is compared with what it changes in one period of the shared
machine.

Each round runs every configuration once, in an order reversed every other round (A B C D, D C B A,
...), so that a drift of the shared machine's load spreads over all of them; the figures are the
medians over ``--rounds``. Per run: records/s at the source between 10% and 90% of the events
(start-up and tail excluded), from the TaskManager's /metrics scraped every 0.25 s (only the
families the bench reads, ``?name[]=``); over that window, from /proc: the CPU of the TaskManager
and its workers (the process tree: every Weir process of the TaskManager), as cores used and CPU
seconds per million records, then split into the workers, the TaskManager's own process, the
JobManager, this bench and the rest of the machine (``/proc/stat``), so that a core the workers do
not get is accounted for; the tasks' busy, idle and backpressured shares (their
``weir_*_seconds_total``, synced every 0.5 s: coarse over a window of seconds); the peak RSS of the
TaskManager and of each worker; the workers' start (from the TaskManager's log: started -> ready).
The machine is shared: the load average is recorded before every run, and ``--max-load`` waits (at
most ``--load-wait`` s) for a quieter moment first.

Results: ``bench/results/slots.json`` and ``slots.md``, with the commit. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from bench.harness import (
    JOBS_DIR,
    REPO_ROOT,
    BenchError,
    child_pids,
    host_summary,
    log,
    machine_cpu,
    median,
    new_run_id,
    prepare_environment,
    publish_results,
    read_proc_stat,
    remove_run_root,
)
from weir.core.errors import WeirError
from weir.tools.client import JobManagerClient
from weir.tools.supervisor import DEFAULT_SPARES, ChildSpec, jobmanager_port, start_cluster, stop_cluster

JOB_FILE: Final = JOBS_DIR / "cpu_per_record.py"
SOURCE_UID: Final = "generator"
TASKMANAGER: Final = "taskmanager-1"
JOBMANAGER: Final = "jobmanager"
POLL_S: Final = 0.25
STATUS_EVERY: Final = 4
"""Polls per job status call: the JobManager is asked whether the job finished once a second."""
TARGET_RATIO: Final = 1.7
THIS_TREE: Final = "this tree"
BASELINE_TREE: Final = "baseline"
TIME_FAMILIES: Final = {
    "busy": "weir_busy_seconds_total",
    "idle": "weir_idle_seconds_total",
    "backpressured": "weir_backpressured_seconds_total",
}
SCRAPED: Final = ("weir_records_out_total", *TIME_FAMILIES.values())
"""The only series the bench reads from the TaskManager's /metrics (``?name[]=``)."""


@dataclass(frozen=True)
class Config:
    name: str
    slots: int
    parallelism: int
    slot_processes: bool


CONFIGS: Final = (
    Config("1 slot, p=1, slot processes", 1, 1, True),
    Config("2 slots, p=2, slot processes", 2, 2, True),
    Config("1 slot, p=1, one process", 1, 1, False),
    Config("2 slots, p=2, one process", 2, 2, False),
)


@dataclass(frozen=True)
class Tree:
    """Where the cluster's processes come from: this checkout (``path`` None) or another one; and
    whether the bench scrapes its TaskManager's /metrics ``filtered`` to the series it reads (a
    TaskManager with slot workers before 2026-12-05 answers a filtered scrape with nothing)."""

    label: str
    path: Path | None = None
    filtered: bool = True


@dataclass(frozen=True)
class Run:
    config: str
    round: int
    load_average_before: tuple[float, float, float]
    records_per_s: float | None
    cores: float | None  # CPU seconds per second of the TaskManager and its workers, over the window
    cpu_s_per_million: float | None
    seconds_running_to_finished: float
    taskmanager_peak_rss_bytes: int
    worker_peak_rss_bytes: list[int]
    worker_idle_rss_bytes: list[int]
    worker_ready_s: list[float]
    tree: str = THIS_TREE
    filtered_scrape: bool = True
    # Cores over the window by where they went (``cores`` = workers + taskmanager); None: no window.
    cores_by_process: dict[str, float] | None = None
    workers_cpu_s_per_million: float | None = None
    # Per operator uid of a task: its mean busy, idle and backpressured share over the window.
    task_time: dict[str, dict[str, float]] | None = None


def git_commit(tree: Path = REPO_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def children(config: Config, python: str, endpoints: Any) -> tuple[ChildSpec, ...]:
    jobmanager = ChildSpec(
        "jobmanager",
        (
            python,
            "-m",
            "weir.jobmanager",
            "--port",
            str(jobmanager_port(endpoints)),
            "--metrics-port",
            str(endpoints.jobmanager_metrics_port),
            "--rest-port",
            str(endpoints.jobmanager_rest_port),
        ),
    )
    taskmanager = ChildSpec(
        TASKMANAGER,
        (
            python,
            "-m",
            "weir.taskmanager",
            "--id",
            TASKMANAGER,
            "--metrics-port",
            str(endpoints.taskmanager_metrics_base_port + 1),
            "--slots",
            str(config.slots),
            "--slot-processes" if config.slot_processes else "--no-slot-processes",
        ),
    )
    return (jobmanager, taskmanager)


def wait_for_load(max_load: float | None, wait_s: float) -> None:
    if max_load is None:
        return
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)
    load = os.getloadavg()[0]
    if load > max_load:
        log(f"load average {load:.2f} still above {max_load} after {wait_s:.0f} s: measuring anyway")


@dataclass(frozen=True)
class Progress:
    """(monotonic time, records the source emitted) samples of one run."""

    samples: tuple[tuple[float, float], ...]

    def time_at(self, count: float) -> float | None:
        """When the count first reached ``count``, interpolated between samples."""
        previous: tuple[float, float] | None = None
        for t, c in self.samples:
            if c >= count:
                if previous is None or c == previous[1]:
                    return t
                t0, c0 = previous
                return t0 + (t - t0) * (count - c0) / (c - c0)
            previous = (t, c)
        return None

    def sustained_rate(self, total: int, low: float = 0.1, high: float = 0.9) -> float | None:
        """Records per second between ``low`` and ``high`` of ``total`` (start-up and the tail excluded)."""
        t_low, t_high = self.time_at(total * low), self.time_at(total * high)
        if t_low is None or t_high is None or t_high <= t_low:
            return None
        return total * (high - low) / (t_high - t_low)


def cluster_pid(cluster_dir: Path, name: str) -> int:
    state = json.loads((cluster_dir / "state.json").read_text())
    for child in state["children"]:
        if child["name"] == name and child["pid"]:
            return int(child["pid"])
    raise BenchError(f"no {name} in {cluster_dir / 'state.json'}")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far (/proc) of what shares the machine with the workers, at one moment."""

    at: float  # monotonic
    taskmanager: float  # the TaskManager's own process
    workers: float  # its live slot workers, and the ones it reaped
    jobmanager: float
    supervisor: float  # the cluster's supervisor and its warm spare (its children but the two above)
    bench: float  # this process
    machine: float  # every core's busy seconds
    stolen: float  # every core's seconds taken by the hypervisor (steal)

    def between(self, later: CpuSample) -> dict[str, float]:
        """Cores (CPU seconds per second) of each part from this sample to ``later``; ``other``: the
        rest of the machine (the shared services, other users)."""
        seconds = later.at - self.at
        parts = {name: (getattr(later, name) - getattr(self, name)) / seconds for name in SAMPLED}
        parts["other"] = parts["machine"] - sum(parts[p] for p in SAMPLED if p not in ("machine", "stolen"))
        return parts


SAMPLED: Final = ("taskmanager", "workers", "jobmanager", "supervisor", "bench", "machine", "stolen")
"""The figures of a :class:`CpuSample` after its time, in its order."""


def sample_cpu(
    taskmanager: int, jobmanager: int, supervisor: int | None = None, rss: dict[int, int] | None = None
) -> CpuSample:
    """One :class:`CpuSample`; ``rss`` (when given) gets the TaskManager's and each worker's RSS by pid."""
    at = time.monotonic()
    tm = read_proc_stat(taskmanager)
    workers = tm.reaped_children_cpu_s if tm is not None else 0.0
    if tm is not None and rss is not None:
        rss[taskmanager] = tm.rss_bytes
    for pid in child_pids(taskmanager):
        stat = read_proc_stat(pid)
        if stat is not None:
            workers += stat.cpu_s + stat.reaped_children_cpu_s
            if rss is not None and not stat.zombie:
                rss[pid] = stat.rss_bytes
    jm = read_proc_stat(jobmanager)
    cluster = 0.0
    if supervisor is not None:
        for pid in (supervisor, *(c for c in child_pids(supervisor) if c not in (taskmanager, jobmanager))):
            stat = read_proc_stat(pid)
            cluster += stat.cpu_s if stat is not None else 0.0
    own = os.times()
    machine = machine_cpu()
    return CpuSample(
        at=at,
        taskmanager=tm.cpu_s if tm is not None else 0.0,
        workers=workers,
        jobmanager=jm.cpu_s + jm.reaped_children_cpu_s if jm is not None else 0.0,
        supervisor=cluster,
        bench=own.user + own.system,
        machine=machine.busy_s,
        stolen=machine.stolen_s,
    )


SPARE_QUIET_S: Final = 1.0
SPARE_SETTLE_TIMEOUT_S: Final = 60.0


def cpu_settled(
    history: Sequence[tuple[float, float]], quiet_s: float = SPARE_QUIET_S, tolerance_s: float = 0.02
) -> bool:
    """Whether CPU samples ``(monotonic s, cpu s)`` show no more than ``tolerance_s`` of CPU over the
    last ``quiet_s`` (at least that long sampled)."""
    if not history:
        return False
    last_at, last_cpu = history[-1]
    earlier = [cpu for at, cpu in history if last_at - at >= quiet_s]
    return bool(earlier) and last_cpu - earlier[-1] <= tolerance_s


def wait_for_settled_spares(supervisor: int, taskmanager: int, jobmanager: int, spares: int) -> None:
    """Until the supervisor's warm spares (started a few seconds after the cluster) have started and
    finished importing: a spare's start-up is Weir's restart readiness, not the job's work, and
    would otherwise fall into the measured window of a short run."""
    deadline = time.monotonic() + SPARE_SETTLE_TIMEOUT_S
    history: list[tuple[float, float]] = []
    while True:
        others = [c for c in child_pids(supervisor) if c not in (taskmanager, jobmanager)]
        cpu = sum(stat.cpu_s for pid in (supervisor, *others) if (stat := read_proc_stat(pid)) is not None)
        history.append((time.monotonic(), cpu))
        if len(others) >= spares and cpu_settled(history):
            return
        if time.monotonic() > deadline:
            raise BenchError(
                f"the supervisor's {spares} warm spare(s) did not settle within {SPARE_SETTLE_TIMEOUT_S:.0f} s"
            )
        time.sleep(0.2)  # poll interval of a wait with a deadline


def tree_rss(taskmanager: int) -> dict[int, int]:
    """The RSS of the TaskManager and of each of its live workers, by pid."""
    rss: dict[int, int] = {}
    sample_cpu(taskmanager, taskmanager, rss=rss)
    return rss


def worker_ready_seconds(log_file: Path) -> list[float]:
    """From the TaskManager's log: each slot worker's start to its ready, in seconds."""
    started: dict[int, float] = {}
    ready: list[float] = []
    for line in log_file.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        name = event.get("event")
        if name not in ("slot_worker_started", "slot_worker_ready"):
            continue
        stamp = time.mktime(time.strptime(event["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) + float(
            "0." + event["timestamp"][20:26]
        )
        if name == "slot_worker_started":
            started[event["worker"]] = stamp
        elif event["worker"] in started:
            ready.append(stamp - started[event["worker"]])
    return ready


@dataclass(frozen=True)
class Scrape:
    """What one scrape of the TaskManager's /metrics told of the job: the source's records out, and
    each task's busy, idle and backpressured seconds by (operator uid, subtask)."""

    source_records: float
    task_seconds: dict[str, dict[tuple[str, str], float]]


def scrape_url(port: int, *, filtered: bool) -> str:
    """The TaskManager's /metrics, ``filtered`` to what the bench reads (``?name[]=``)."""
    url = f"http://127.0.0.1:{port}/metrics"
    return url + "?" + "&".join(f"name[]={name}" for name in SCRAPED) if filtered else url


def scrape(url: str, job_id: str) -> Scrape | None:
    """The job's figures from the TaskManager's /metrics; None when it did not answer within 5 s."""
    try:
        with urllib.request.urlopen(url, timeout=5.0) as response:
            text = response.read().decode()
    except OSError:
        return None
    return parse_scrape(text, job_id)


def parse_scrape(text: str, job_id: str) -> Scrape:
    kind_of = {family: kind for kind, family in TIME_FAMILIES.items()}
    records = 0.0
    seconds: dict[str, dict[tuple[str, str], float]] = {kind: {} for kind in TIME_FAMILIES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("job_id") != job_id:
                continue
            if sample.name == "weir_records_out_total" and labels.get("operator_uid") == SOURCE_UID:
                records += sample.value
            elif sample.name in kind_of:
                task = (labels.get("operator_uid", ""), labels.get("subtask", ""))
                seconds[kind_of[sample.name]][task] = sample.value
    return Scrape(records, seconds)


def task_time_shares(first: Scrape, last: Scrape, seconds: float) -> dict[str, dict[str, float]]:
    """Per operator uid: the mean over its subtasks of the busy, idle and backpressured seconds per
    second between two scrapes."""
    shares: dict[str, dict[str, float]] = {}
    for kind in TIME_FAMILIES:
        by_uid: dict[str, list[float]] = {}
        for task, value in last.task_seconds[kind].items():
            before = first.task_seconds[kind].get(task, 0.0)
            by_uid.setdefault(task[0], []).append((value - before) / seconds)
        for uid, values in by_uid.items():
            shares.setdefault(uid, {})[kind] = sum(values) / len(values)
    return shares


def interpolate(samples: Sequence[tuple[float, float]], t: float) -> float | None:
    previous: tuple[float, float] | None = None
    for ts, value in samples:
        if ts >= t:
            if previous is None:
                return value
            t0, v0 = previous
            return v0 + (value - v0) * (t - t0) / (ts - t0) if ts > t0 else value
        previous = (ts, value)
    return None


def window_cpu(samples: Sequence[CpuSample], t_low: float, t_high: float) -> dict[str, float] | None:
    """Cores of each part (:meth:`CpuSample.between`) from ``t_low`` to ``t_high``, each figure
    interpolated between the samples around either end; None without samples around both."""
    ends: list[CpuSample] = []
    for t in (t_low, t_high):
        values = [interpolate([(s.at, getattr(s, part)) for s in samples], t) for part in SAMPLED]
        if any(v is None for v in values):
            return None
        ends.append(CpuSample(t, *(float(v) for v in values if v is not None)))
    return ends[0].between(ends[1])


def scrape_at(scrapes: Sequence[tuple[float, Scrape]], t: float, *, after: bool) -> tuple[float, Scrape] | None:
    """The first scrape at or after ``t`` (``after``), or the last one at or before it."""
    if after:
        return next(((at, s) for at, s in scrapes if at >= t), None)
    return next(((at, s) for at, s in reversed(scrapes) if at <= t), None)


@contextlib.contextmanager
def processes_from(tree: Tree) -> Iterator[None]:
    """The cluster started inside runs the code of ``tree`` (its supervisor, and so every process it
    starts, inherits ``PYTHONPATH``)."""
    if tree.path is None:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree.path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def run_once(config: Config, tree: Tree, round_no: int, args: argparse.Namespace, env: Any, index: int) -> Run:
    wait_for_load(args.max_load, args.load_wait)
    load = os.getloadavg()
    cluster_dir = env.run_root / f"cluster-{index}"
    log(f"round {round_no}: {config.name}, {tree.label} (load average {load[0]:.2f})")
    with processes_from(tree):
        start_cluster(
            cluster_dir,
            env.endpoints,
            restart=False,
            timeout_s=120,
            children=children(config, sys.executable, env.endpoints),
        )
    try:
        tm = cluster_pid(cluster_dir, TASKMANAGER)
        jm = cluster_pid(cluster_dir, JOBMANAGER)
        supervisor = int(json.loads((cluster_dir / "state.json").read_text())["supervisor_pid"])
        wait_for_settled_spares(supervisor, tm, jm, len(DEFAULT_SPARES))
        worker_idle = [rss for pid, rss in tree_rss(tm).items() if pid != tm]
        url = scrape_url(env.endpoints.taskmanager_metrics_base_port + 1, filtered=tree.filtered)
        parameters = {"events": str(args.events), "work": str(args.work)}
        with JobManagerClient(env.endpoints.jobmanager_address) as client:
            job_id = client.submit_job(JOB_FILE, parameters, config.parallelism)
            records: list[tuple[float, float]] = []
            scrapes: list[tuple[float, Scrape]] = []
            cpu: list[CpuSample] = []
            peak: dict[int, int] = {}
            running_at: float | None = None
            deadline = time.monotonic() + args.timeout
            for poll in itertools.count():
                now = time.monotonic()
                if now > deadline:
                    raise BenchError(f"{config.name}: job {job_id} not FINISHED within {args.timeout:.0f} s")
                status = None
                if poll % STATUS_EVERY == 0:
                    try:
                        status = client.job_status(job_id)
                    except WeirError:
                        status = None
                if status is not None:
                    if running_at is None and status.tasks and all(t.state == "RUNNING" for t in status.tasks):
                        running_at = now
                    if status.summary.status == "FINISHED":
                        break
                    if status.summary.is_terminal:
                        raise BenchError(f"{config.name}: job {job_id} ended {status.summary.status}: {status.failure}")
                rss: dict[int, int] = {}
                sample = sample_cpu(tm, jm, supervisor, rss)
                cpu.append(sample)
                for pid, value in rss.items():
                    peak[pid] = max(peak.get(pid, 0), value)
                scraped = scrape(url, job_id)
                if scraped is not None:  # a scrape that failed (a loaded machine) is left out, not a zero
                    records.append((sample.at, scraped.source_records))
                    scrapes.append((sample.at, scraped))
                time.sleep(POLL_S)
            finished = time.monotonic()
    finally:
        stop_cluster(cluster_dir)
    progress = Progress(tuple(records))
    rate = progress.sustained_rate(args.events)
    t_low, t_high = progress.time_at(args.events * 0.1), progress.time_at(args.events * 0.9)
    cores = cpu_per_million = workers_per_million = None
    by_process: dict[str, float] | None = None
    task_time: dict[str, dict[str, float]] | None = None
    if t_low is not None and t_high is not None and t_high > t_low:
        by_process = window_cpu(cpu, t_low, t_high)
        if by_process is not None:
            cores = by_process["workers"] + by_process["taskmanager"]
            cpu_per_million = cores * (t_high - t_low) / (args.events * 0.8) * 1e6
            workers_per_million = by_process["workers"] * (t_high - t_low) / (args.events * 0.8) * 1e6
        first, last = scrape_at(scrapes, t_low, after=True), scrape_at(scrapes, t_high, after=False)
        if first is not None and last is not None and last[0] > first[0]:
            task_time = task_time_shares(first[1], last[1], last[0] - first[0])
    ready = worker_ready_seconds(cluster_dir / f"{TASKMANAGER}.log") if config.slot_processes else []
    run = Run(
        config=config.name,
        round=round_no,
        load_average_before=load,
        records_per_s=rate,
        cores=cores,
        cpu_s_per_million=cpu_per_million,
        seconds_running_to_finished=finished - (running_at or finished),
        taskmanager_peak_rss_bytes=peak.get(tm, 0),
        worker_peak_rss_bytes=sorted((v for pid, v in peak.items() if pid != tm), reverse=True),
        worker_idle_rss_bytes=worker_idle,
        worker_ready_s=ready,
        tree=tree.label,
        filtered_scrape=tree.filtered,
        cores_by_process=by_process,
        workers_cpu_s_per_million=workers_per_million,
        task_time=task_time,
    )
    split = ", ".join(f"{part} {value:.2f}" for part, value in (by_process or {}).items())
    log(f"  {rate or 0:,.0f} records/s, {cores or 0:.2f} cores ({split}), {cpu_per_million or 0:.1f} CPU s / M")
    if task_time:
        log(
            "  tasks: "
            + "; ".join(
                f"{uid} " + " ".join(f"{kind} {share:.2f}" for kind, share in kinds.items())
                for uid, kinds in sorted(task_time.items())
            )
        )
    return run


BURN: Final = """
import sys, time
work, seconds = int(sys.argv[1]), float(sys.argv[2])
start, cpu, done = time.monotonic(), time.process_time(), 0
while time.monotonic() - start < seconds:
    x = done
    for _ in range(work):
        x = (x * 31 + 7) % 1_000_003
    done += 1
print(done, time.process_time() - cpu, time.monotonic() - start)
"""
"""The job's map without Weir: ``work`` integer steps per record for ``seconds``; prints the records
done, the CPU and the wall seconds it took."""


@dataclass(frozen=True)
class Burn:
    records: int
    cpu_s: float
    wall_s: float


def burn(processes: int, work: int, seconds: float) -> list[Burn]:
    """``processes`` copies of :data:`BURN` at once."""
    started = [
        subprocess.Popen([sys.executable, "-c", BURN, str(work), str(seconds)], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    done = []
    for process in started:
        out, _ = process.communicate(timeout=seconds + 60)
        records, cpu_s, wall_s = out.split()
        done.append(Burn(int(records), float(cpu_s), float(wall_s)))
    return done


def machine_scaling(work: int, seconds: float) -> dict[str, float]:
    """What the machine gives two processes of the job's map without Weir (the ceiling of the slots'
    ratio): their records per second over one process's alone, and their CPU seconds per record over
    its (how much slower a core is while the other one is busy too)."""
    (one,) = burn(1, work, seconds)
    two = burn(2, work, seconds)
    rate_one = one.records / one.wall_s
    rate_two = sum(b.records / b.wall_s for b in two)
    cpu_one = one.cpu_s / one.records
    cpu_two = sum(b.cpu_s for b in two) / sum(b.records for b in two)
    return {
        "one_records_per_s": rate_one,
        "two_records_per_s": rate_two,
        "ratio": rate_two / rate_one,
        "cpu_per_record_two_vs_one": cpu_two / cpu_one,
    }


def channel_figures(n_records: int, repeats: int) -> dict[str, Any]:
    """Records/s through one channel between two subtasks of one TaskManager, three ways: in memory
    (one process: slot processes off, or one slot worker), over a slot worker's Unix socket (two slot
    workers), over TCP loopback (what a remote TaskManager's producer uses); median of ``repeats``.
    The producer runs in a process of its own (``bench.exchange_bench``'s)."""
    from bench.exchange_bench import local_channel

    figures: dict[str, list[float]] = {"in memory": [], "unix socket": [], "tcp loopback": []}
    for _ in range(repeats):
        figures["in memory"].append(local_channel(n_records).records_per_s)
        figures["unix socket"].append(socket_channel(n_records, unix=True))
        figures["tcp loopback"].append(socket_channel(n_records, unix=False))
    return {name: median(values) for name, values in figures.items()}


def socket_channel(n_records: int, *, unix: bool) -> float:
    """One remote channel into a TaskHost's gate served on a Unix socket or TCP loopback: records/s."""
    import multiprocessing
    import tempfile

    from bench.exchange_bench import CONSUMER_UID, JOB_ID, _channel_producer, _consume, _spawn, _wait_reader_done
    from weir.connectors.object_storage import open_storage
    from weir.core.grpc_security import new_server
    from weir.core.transport_security import TransportSecurity
    from weir.taskmanager.network.gate import InputGate
    from weir.taskmanager.network.writer import RECORDS_PER_BUFFER
    from weir.taskmanager.task_host import TaskHost
    from weir.taskmanager.task_types import TaskAddress
    from weir.wire import taskmanager_pb2_grpc

    class Channels(taskmanager_pb2_grpc.TaskManagerServiceServicer):
        def __init__(self, host: TaskHost) -> None:
            self.host = host

        def OpenChannel(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
            return self.host.channels.open_channel(request_iterator)

    with tempfile.TemporaryDirectory(prefix="weir-slots-") as tmp:
        server = new_server(TransportSecurity(), max_workers=16, thread_name_prefix="bench-grpc")
        if unix:
            address = f"unix:{tmp}/consumer.sock"
            server.add_insecure_port(address)
        else:
            address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        host = TaskHost(
            "bench-consumer",
            address,
            Path(tmp),
            _NoReports(),
            storage=open_storage(f"file://{tmp}/checkpoints"),
            security=TransportSecurity(),
        )
        taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(Channels(host), server)
        server.start()
        gate = InputGate([0])
        consumer = TaskAddress(JOB_ID, CONSUMER_UID, 0, 1)
        host.channels.register(consumer, gate)
        parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
        producer = _spawn(_channel_producer, address, n_records, child_end)
        try:
            received, seconds = _consume(gate, timeout_s=300)
            parent_end.send("end of stream taken")
            _wait_reader_done(f"channel-in-{consumer}-0", timeout_s=10)
            gate.close()
            parent_end.send("credit stream closed")
            producer.join(30)
        finally:
            gate.close()
            if producer.is_alive():
                producer.terminate()
            server.stop(grace=1).wait()
            host.stop()
    if received != n_records:
        raise BenchError(f"the channel delivered {received} of {n_records} records")
    return (received - RECORDS_PER_BUFFER) / seconds


class _NoReports:
    def put(self, report: object) -> None:
        pass


PARTS: Final = ("workers", "taskmanager", "jobmanager", "supervisor", "bench", "other", "machine", "stolen")
"""Where the machine's cores went over a run's window (``CpuSample.between``), in the tables' order."""


def summarize(runs: list[Run], tree: str = THIS_TREE) -> dict[str, Any]:
    """Medians per configuration of the runs of one tree, and the ratios between configurations."""
    by_config: dict[str, dict[str, Any]] = {}
    for config in CONFIGS:
        mine = [r for r in runs if r.config == config.name and r.tree == tree]
        if not mine:
            continue
        by_config[config.name] = {
            "slots": config.slots,
            "parallelism": config.parallelism,
            "slot_processes": config.slot_processes,
            "records_per_s": median([r.records_per_s for r in mine]),
            "cores": median([r.cores for r in mine]),
            "cpu_s_per_million": median([r.cpu_s_per_million for r in mine]),
            "workers_cpu_s_per_million": median([r.workers_cpu_s_per_million for r in mine]),
            "cores_by_process": {
                part: median([r.cores_by_process.get(part) if r.cores_by_process else None for r in mine])
                for part in PARTS
            },
            "task_time": median_task_time([r.task_time for r in mine]),
            "taskmanager_peak_rss_mib": median([r.taskmanager_peak_rss_bytes / 2**20 for r in mine]),
            "worker_peak_rss_mib": median([max(r.worker_peak_rss_bytes, default=0) / 2**20 for r in mine])
            if config.slot_processes
            else None,
            "worker_idle_rss_mib": median([max(r.worker_idle_rss_bytes, default=0) / 2**20 for r in mine])
            if config.slot_processes
            else None,
            "worker_ready_s": median([v for r in mine for v in r.worker_ready_s]) if config.slot_processes else None,
            "runs": len(mine),
        }

    def ratio(two: str, one: str) -> float | None:
        a, b = by_config.get(two, {}).get("records_per_s"), by_config.get(one, {}).get("records_per_s")
        return a / b if a and b else None

    return {
        "configs": by_config,
        "ratios": {
            "slot_processes_2_vs_1": ratio(CONFIGS[1].name, CONFIGS[0].name),
            "one_process_2_vs_1": ratio(CONFIGS[3].name, CONFIGS[2].name),
            "two_slots_slot_processes_vs_one_process": ratio(CONFIGS[1].name, CONFIGS[3].name),
            "one_slot_slot_processes_vs_one_process": ratio(CONFIGS[0].name, CONFIGS[2].name),
        },
    }


def median_task_time(runs: Sequence[dict[str, dict[str, float]] | None]) -> dict[str, dict[str, float | None]]:
    """Per operator uid and kind (busy, idle, backpressured), the median share over the runs."""
    uids = sorted({uid for shares in runs if shares for uid in shares})
    return {
        uid: {kind: median([(shares or {}).get(uid, {}).get(kind) for shares in runs]) for kind in TIME_FAMILIES}
        for uid in uids
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _tree_tables(summary: dict[str, Any]) -> list[str]:
    """The figures of one tree: rate, cores and memory; where the cores went; the tasks' time."""
    lines = [
        "| configuration | records/s | cores used | CPU s / M records | workers' CPU s / M | TM peak RSS MiB "
        "| worker peak RSS MiB | worker idle RSS MiB | worker start s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, c in summary["configs"].items():
        lines.append(
            f"| {name} | {_fmt(c['records_per_s'], ',.0f')} | {_fmt(c['cores'], '.2f')} | "
            f"{_fmt(c['cpu_s_per_million'], '.1f')} | {_fmt(c.get('workers_cpu_s_per_million'), '.1f')} | "
            f"{_fmt(c['taskmanager_peak_rss_mib'], '.0f')} | "
            f"{_fmt(c['worker_peak_rss_mib'], '.0f')} | {_fmt(c['worker_idle_rss_mib'], '.0f')} | "
            f"{_fmt(c['worker_ready_s'], '.2f')} |"
        )
    lines += [
        "",
        "Where the machine's cores went between 10% and 90% of the events (cores; ``cores used`` above is "
        "workers + TaskManager; ``supervisor``: the cluster's supervisor and its warm spare; ``other``: the "
        "shared services, other users; ``machine``: "
        "every core's busy time, ``stolen``: the hypervisor's steal):",
        "",
        "| configuration | " + " | ".join(PARTS) + " |",
        "| --- |" + " ---: |" * len(PARTS),
    ]
    for name, c in summary["configs"].items():
        parts = c.get("cores_by_process") or {}
        lines.append(f"| {name} | " + " | ".join(_fmt(parts.get(p), ".2f") for p in PARTS) + " |")
    lines += [
        "",
        "The tasks' time (mean share per subtask; busy includes waiting for the interpreter lock):",
        "",
        "| configuration | task | busy | idle | backpressured |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, c in summary["configs"].items():
        for uid, kinds in (c.get("task_time") or {}).items():
            lines.append(
                f"| {name} | {uid} | " + " | ".join(_fmt(kinds.get(kind), ".2f") for kind in TIME_FAMILIES) + " |"
            )
    return lines


def render_markdown(document: dict[str, Any]) -> str:
    summary = document["summary"]
    ratios = summary["ratios"]
    baseline = document.get("baseline")
    lines = [
        "# Slots that add up: 1 vs 2 slots on one TaskManager (`make bench-slots`)",
        "",
        f"Measured {document['measured_at']} at commit `{document['git']['commit']}`"
        f"{' (dirty)' if document['git']['dirty'] else ''}, on {document['host']['cpus']} cores "
        f"(Python {document['host']['python']}). Job: `bench/jobs/cpu_per_record.py`, "
        f"{document['events']:,} events, `work={document['work']}`; median of {document['rounds']} rounds, "
        "configurations alternated. The machine is shared with other agents: the load average before "
        "each run is listed below.",
        "",
    ]
    if baseline:
        lines += [f"## This tree (`{document['git']['commit'][:12]}`, /metrics scraped {document['scrape']})", ""]
    lines += _tree_tables(summary)
    target = ratios["slot_processes_2_vs_1"]
    cpus = document["host"]["cpus"]
    loaded = [r for r in document["runs"] if r["load_average_before"][0] > cpus]
    if target is None:
        verdict = "-"
    elif loaded:
        # Other processes held the cores: a slot's own core cannot show, whatever the ratio.
        verdict = (
            f"not meaningful: the 1-min load average was above the {cpus} cores before {len(loaded)} of "
            f"{len(document['runs'])} runs; rerun on a quiet machine"
        )
    else:
        verdict = "met" if target >= TARGET_RATIO else "NOT met"
    lines += [
        "",
        f"- **2 slots vs 1 slot, slot processes: {_fmt(target, '.2f')}x** (target >= {TARGET_RATIO}x: {verdict})",
        f"- 2 slots vs 1 slot, one process (before): {_fmt(ratios['one_process_2_vs_1'], '.2f')}x",
        f"- 2 slots: slot processes vs one process: {_fmt(ratios['two_slots_slot_processes_vs_one_process'], '.2f')}x",
        f"- 1 slot: slot processes vs one process: {_fmt(ratios['one_slot_slot_processes_vs_one_process'], '.2f')}x",
        "",
    ]
    if baseline:
        base = baseline["summary"]
        lines += [
            f"## Baseline: `{baseline['tree']}` at `{(baseline['git'].get('commit') or '?')[:12]}`, same rounds, "
            f"/metrics scraped {baseline.get('scrape', 'full')}",
            "",
            *_tree_tables(base),
            "",
            f"- 2 slots vs 1 slot, slot processes: {_fmt(base['ratios']['slot_processes_2_vs_1'], '.2f')}x "
            f"(this tree: {_fmt(target, '.2f')}x)",
            "",
        ]
    machine = document.get("machine_scaling")
    if machine:
        lines += [
            f"The machine's own ceiling (the job's map without Weir, median of {document['rounds']} rounds): two "
            f"processes at once do **{machine['ratio']:.2f}x** the records per second of one alone "
            f"({machine['one_records_per_s']:,.0f} -> {machine['two_records_per_s']:,.0f}), at "
            f"{machine['cpu_per_record_two_vs_one']:.2f}x the CPU per record.",
            "",
        ]
    channels = document.get("channel_records_per_s")
    if channels:
        lines += [
            "One channel between two subtasks of one TaskManager (records/s, median; a producer process "
            "emitting record by record into a RecordWriter, a consumer taking buffers off the InputGate):",
            "",
            "| in memory (one process) | Unix socket (two slot workers) | TCP loopback (another TaskManager) |",
            "| ---: | ---: | ---: |",
            f"| {_fmt(channels['in memory'], ',.0f')} | {_fmt(channels['unix socket'], ',.0f')} | "
            f"{_fmt(channels['tcp loopback'], ',.0f')} |",
            "",
        ]
    lines += [
        "| round | configuration | tree | load avg (1/5/15 min) | records/s | cores | workers | TM |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in document["runs"]:
        load = "/".join(f"{v:.2f}" for v in run["load_average_before"])
        parts = run.get("cores_by_process") or {}
        lines.append(
            f"| {run['round']} | {run['config']} | {run.get('tree', THIS_TREE)} | {load} | "
            f"{_fmt(run['records_per_s'], ',.0f')} | {_fmt(run['cores'], '.2f')} | "
            f"{_fmt(parts.get('workers'), '.2f')} | {_fmt(parts.get('taskmanager'), '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slots_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--work", type=int, default=300, help="integer steps of the map per record")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--max-load", type=float, default=None, help="wait for a 1-min load average below this")
    parser.add_argument("--load-wait", type=float, default=300.0)
    parser.add_argument(
        "--configs", default="all", help="comma-separated indices of the configurations (0-3), default all"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's logs and state")
    parser.add_argument("--channel-records", type=int, default=500_000, help="0: no channel figures")
    parser.add_argument(
        "--machine-seconds",
        type=float,
        default=3.0,
        help="per round, the job's map without Weir in one and then two processes for this long (0: not)",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="another checkout (with its weir/wire generated) whose cluster runs every configuration too, "
        "in the same rounds: e.g. a worktree of main",
    )
    parser.add_argument(
        "--baseline-scrape",
        choices=("filtered", "full"),
        default="full",
        help="the baseline's /metrics scrapes (default full: main's slot workers answer a filtered one with nothing)",
    )
    parser.add_argument(
        "--scrape",
        choices=("filtered", "full"),
        default="filtered",
        help="this tree's /metrics scrapes: only the series the bench reads (default), or every series",
    )
    parser.add_argument(
        "--results",
        default="slots",
        help="the results files' name: bench/results/NAME.json and NAME.md (default slots)",
    )
    args = parser.parse_args(argv)
    configs = CONFIGS if args.configs == "all" else tuple(CONFIGS[int(i)] for i in args.configs.split(","))
    trees = [Tree(THIS_TREE, filtered=args.scrape == "filtered")]
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "weir" / "taskmanager").exists():
            raise BenchError(f"--baseline-tree {args.baseline_tree}: no weir/taskmanager there")
        trees.append(Tree(BASELINE_TREE, args.baseline_tree.resolve(), filtered=args.baseline_scrape == "filtered"))
    plan = [(config, tree) for config in configs for tree in trees]

    channels: dict[str, Any] | None = None
    if args.channel_records:
        log(f"one channel between two subtasks of a TaskManager, {args.channel_records:,} records, 3 ways")
        channels = channel_figures(args.channel_records, args.rounds)
        log("  " + ", ".join(f"{name} {rate or 0:,.0f} records/s" for name, rate in channels.items()))
    env = prepare_environment(new_run_id(), checkpoints_in_s3=False)
    runs: list[Run] = []
    scaling: list[dict[str, float]] = []
    failed = True
    try:
        index = 0
        for round_no in range(1, args.rounds + 1):
            if args.machine_seconds > 0:
                wait_for_load(args.max_load, args.load_wait)
                scaling.append(machine_scaling(args.work, args.machine_seconds))
                log(
                    f"round {round_no}: the map without Weir, 2 processes vs 1: {scaling[-1]['ratio']:.2f}x records/s, "
                    f"{scaling[-1]['cpu_per_record_two_vs_one']:.2f}x CPU per record"
                )
            order = plan if round_no % 2 == 1 else list(reversed(plan))
            for config, tree in order:
                index += 1
                runs.append(run_once(config, tree, round_no, args, env, index))
        failed = False
    finally:
        remove_run_root(env, keep=failed or args.keep)
    document = {
        "benchmark": "slots",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_commit(),
        "host": host_summary(),
        "events": args.events,
        "work": args.work,
        "rounds": args.rounds,
        "load_average_at_end": os.getloadavg(),
        "scrape": args.scrape,
        "summary": summarize(runs),
        "baseline": {
            "tree": str(args.baseline_tree),
            "scrape": args.baseline_scrape,
            "git": git_commit(args.baseline_tree),
            "summary": summarize(runs, BASELINE_TREE),
        }
        if args.baseline_tree is not None
        else None,
        "channel_records_per_s": channels,
        "machine_scaling": {key: median([m[key] for m in scaling]) for key in scaling[0]} if scaling else None,
        "machine_scaling_rounds": scaling,
        "runs": [asdict(r) for r in runs],
    }
    publish_results(args.results, document, render_markdown)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench-slots: error: {exc}", file=sys.stderr)
        sys.exit(1)
