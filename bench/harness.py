"""What the benchmarks share: a private Weir cluster, process sampling, job polling, metric scrapes.

The benchmarks take the ``WEIR_*`` environment as it is. The cluster they start is their own: its
directory (state, logs, pids) lives under ``$WEIR_RUN_DIR/bench-<run id>``, and its ports are the
configured ones, so a benchmark refuses to start where another cluster already listens (set
``WEIR_JOBMANAGER_ADDRESS``, ``WEIR_JOBMANAGER_METRICS_PORT`` and
``WEIR_TASKMANAGER_METRICS_BASE_PORT`` to free ports to run beside it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.evidence import LoadCheck, wait_for_quiet
from weir.core.config import Endpoints, checkpoint_dir, run_dir
from weir.core.errors import ClusterError, WeirError
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.supervisor import TASKMANAGERS, local_status, start_cluster, stop_cluster

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
JOBS_DIR: Final = REPO_ROOT / "bench" / "jobs"
WEIR_CLI: Final = str(Path(sys.executable).with_name("weir"))
PRIVATE_PORTS_HINT: Final = (
    "WEIR_JOBMANAGER_ADDRESS=127.0.0.1:36123 WEIR_JOBMANAGER_METRICS_PORT=39249 "
    "WEIR_JOBMANAGER_REST_PORT=38081 WEIR_TASKMANAGER_METRICS_BASE_PORT=39250"
)
POLL_S: Final = 0.1


class BenchError(Exception):
    """A benchmark cannot go on (setup failed, a contender failed); the message says why."""


def new_run_id() -> str:
    """Sortable and unique: names every topic, table, consumer group and directory of one run."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# The environment -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchEnvironment:
    run_id: str
    run_root: Path  # the private WEIR_RUN_DIR of this run's cluster
    endpoints: Endpoints
    checkpoint_uri: str
    services_run_dir: Path  # the WEIR_RUN_DIR before this run: where the shared services live


def prepare_environment(run_id: str, *, checkpoints_in_s3: bool) -> BenchEnvironment:
    """Point ``WEIR_RUN_DIR`` (inherited by the cluster's processes) at a private directory and, when
    asked and none is configured, checkpoints at a private prefix of the S3 bucket."""
    endpoints = Endpoints.from_env()
    services_run_dir = run_dir()
    root = services_run_dir / f"bench-{run_id}"
    root.mkdir(parents=True, exist_ok=True)
    os.environ["WEIR_RUN_DIR"] = str(root)
    if checkpoints_in_s3 and not os.environ.get("WEIR_CHECKPOINT_DIR"):
        os.environ["WEIR_CHECKPOINT_DIR"] = f"s3://{endpoints.s3_bucket}/bench-{run_id}"
    return BenchEnvironment(
        run_id=run_id,
        run_root=root,
        endpoints=endpoints,
        checkpoint_uri=checkpoint_dir(),
        services_run_dir=services_run_dir,
    )


def services_environment(environ: Mapping[str, str], services_run_dir: Path | None) -> dict[str, str]:
    """The environment ``deploy/local/infra.sh up`` runs in: the shared services' run directory, never
    a run's private one (a service started there would outlive the directory, which the run deletes,
    and keep its port)."""
    env = dict(environ)
    if services_run_dir is not None:
        env["WEIR_RUN_DIR"] = str(services_run_dir)
    return env


def services_down(endpoints: Endpoints) -> list[str]:
    """The services the benchmarks need (Kafka, PostgreSQL, S3) that do not answer now."""
    import psycopg
    from confluent_kafka.admin import AdminClient

    from weir.connectors import s3

    down = []
    try:
        AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap, "log_level": 3}).list_topics(timeout=5)
    except Exception:
        down.append("kafka")
    try:
        psycopg.connect(endpoints.postgres_dsn, connect_timeout=5).close()
    except Exception:
        down.append("postgres")
    try:
        s3.client(endpoints).head_bucket(Bucket=endpoints.s3_bucket)
    except Exception:
        down.append("s3")
    return down


def ensure_services(endpoints: Endpoints, services_run_dir: Path | None = None) -> None:
    """Start (``deploy/local/infra.sh up``) the needed services that do not answer, in
    ``services_run_dir`` (a :class:`BenchEnvironment`'s: the shared one; None: the current
    ``WEIR_RUN_DIR``); leave running ones be (they answer whichever run directory their pid files are in)."""
    down = services_down(endpoints)
    if not down:
        return
    log(f"starting {', '.join(down)} (deploy/local/infra.sh up)")
    started = subprocess.run(
        [str(REPO_ROOT / "deploy" / "local" / "infra.sh"), "up", *down],
        check=False,
        env=services_environment(os.environ, services_run_dir),
    )
    if started.returncode != 0:
        raise BenchError(f"could not start {', '.join(down)}: see the line above")


def remove_checkpoints(env: BenchEnvironment) -> None:
    """Delete the run's checkpoint objects (only a prefix this run named after itself)."""
    if env.run_id not in env.checkpoint_uri:
        return  # configured by the user: not ours to delete
    from weir.connectors.object_storage import open_storage

    storage = open_storage(env.checkpoint_uri, env.endpoints)
    storage.delete(key for key, _size in storage.list(""))


@contextlib.contextmanager
def private_cluster(env: BenchEnvironment, name: str = "cluster", *, quiet: bool = False) -> Iterator[BenchCluster]:
    """A JobManager and three TaskManagers for this run in ``run_root/name``, stopped after (their
    files stay: see :func:`remove_run_root`). A contender's run starts its own (``name`` after the
    run), so that the cluster's start-up is in that run's CPU as a JVM's start-up is in Flink's."""
    cluster = start_private_cluster(env, name, quiet=quiet)
    try:
        yield cluster
    finally:
        cluster.stop()


def start_private_cluster(env: BenchEnvironment, name: str = "cluster", *, quiet: bool = False) -> BenchCluster:
    """Start the cluster of :func:`private_cluster`; the caller stops it (``BenchCluster.stop``)."""
    if _cluster_answers(env.endpoints):
        raise BenchError(
            f"a JobManager already answers at {env.endpoints.jobmanager_address}: the benchmark starts its "
            f"own cluster; stop that one or run on free ports: {PRIVATE_PORTS_HINT} make ..."
        )
    directory = env.run_root / name
    if not quiet:
        log(f"starting a private cluster in {directory} (JobManager {env.endpoints.jobmanager_address})")
    try:
        start_cluster(directory, env.endpoints, timeout_s=120)
    except ClusterError as exc:
        raise BenchError(f"the benchmark cluster did not start: {exc} (free ports: {PRIVATE_PORTS_HINT})") from exc
    return BenchCluster(env, JobManagerClient(env.endpoints.jobmanager_address), directory)


def remove_run_root(env: BenchEnvironment, *, keep: bool) -> None:
    """Delete the run's private directory (TaskManager state, logs), or say where it stays."""
    if keep:
        log(f"logs of the run kept in {env.run_root}")
    else:
        shutil.rmtree(env.run_root, ignore_errors=True)


def _cluster_answers(endpoints: Endpoints) -> bool:
    try:
        with JobManagerClient(endpoints.jobmanager_address, timeout_s=1.5) as client:
            client.cluster_status()
    except WeirError:
        return False
    return True


@dataclass
class BenchCluster:
    env: BenchEnvironment
    client: JobManagerClient
    directory: Path  # the supervisor's directory: state, logs

    def stop(self) -> None:
        self.client.close()
        stop_cluster(self.directory)

    def process_pids(self) -> dict[str, int]:
        """The live JobManager, TaskManager and supervisor processes: name -> pid (each counted once)."""
        status = local_status(self.directory)
        if status is None:
            return {}
        pids = {p.name: p.pid for p in status.processes if p.pid is not None and p.alive}
        if status.supervisor_alive:
            pids["supervisor"] = status.supervisor_pid
        return pids

    def wait_all_taskmanagers(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(WeirError):
                if len(self.client.cluster_status().alive_taskmanagers) >= TASKMANAGERS:
                    return
            time.sleep(POLL_S)
        raise BenchError(f"fewer than {TASKMANAGERS} TaskManagers alive after {timeout_s:.0f} s")

    def submit(self, job_file: Path, parameters: dict[str, str], parallelism: int = 3) -> str:
        return self.client.submit_job(job_file, parameters, parallelism)

    def status(self, job_id: str) -> JobDetails | None:
        """The job's status, None while the JobManager does not answer (e.g. restarting)."""
        try:
            return self.client.job_status(job_id)
        except WeirError:
            return None

    def wait_job(
        self,
        job_id: str,
        done: Callable[[JobDetails], bool],
        timeout_s: float,
        what: str,
        on_poll: Callable[[JobDetails], None] | None = None,
    ) -> JobDetails:
        """Poll until ``done(status)``; a FAILED or CANCELED job (not asked for) is a BenchError."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status(job_id)
            if status is not None:
                if on_poll is not None:
                    on_poll(status)
                if done(status):
                    return status
                if status.summary.status in ("FAILED", "CANCELED"):
                    raise BenchError(f"job {job_id} ended {status.summary.status} waiting for {what}: {status.failure}")
            if time.monotonic() > deadline:
                state = status.summary.status if status is not None else "no answer"
                raise BenchError(f"job {job_id}: no {what} within {timeout_s:.0f} s (last status {state})")
            time.sleep(POLL_S)

    def cancel(self, job_id: str, timeout_s: float = 30.0) -> None:
        with contextlib.suppress(WeirError):
            self.client.cancel_job(job_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status(job_id)
            if status is not None and status.summary.is_terminal:
                return
            time.sleep(POLL_S)
        log(f"job {job_id} not terminal {timeout_s:.0f} s after cancel")

    def checkpoints_json(self, job_id: str) -> list[dict[str, Any]]:
        """``weir checkpoints JOB --json``, as a user reads them."""
        out = subprocess.run(
            [WEIR_CLI, "checkpoints", job_id, "--json"], capture_output=True, text=True, timeout=60, check=False
        )
        if out.returncode != 0:
            raise BenchError(f"weir checkpoints {job_id} --json failed: {out.stderr.strip()}")
        return list(json.loads(out.stdout)["checkpoints"])

    def source_records_out(self, job_id: str, source_uid: str) -> int:
        """Records the job's source subtasks have sent to other tasks, summed over the TaskManagers'
        metrics (updated twice a second, finer than the JobManager's heartbeat-borne counts)."""
        return self._task_counter(job_id, source_uid, "weir_records_out_total")

    def source_records_read(self, job_id: str, source_uid: str) -> int:
        """Records the job's source subtasks have read (``weir_source_records_read_total``), summed
        over the TaskManagers: a job's progress through its input, also when the whole job is chained
        into its source's tasks and sends nothing to another task."""
        return self._task_counter(job_id, source_uid, "weir_source_records_read_total")

    def _task_counter(self, job_id: str, operator_uid: str, metric: str) -> int:
        total = 0
        base = self.env.endpoints.taskmanager_metrics_base_port
        for n in range(1, TASKMANAGERS + 1):
            total += int(scrape_counter(f"http://127.0.0.1:{base + n}/metrics", metric, job_id, operator_uid))
        return total


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape_counter(url: str, metric: str, job: str, operator_uid: str) -> float:
    """Sum of one Prometheus counter's samples labelled with the job (``job_id``, or ``job``) and the
    operator uid; 0 when the endpoint does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    total = 0.0
    prefix = metric + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels_text, _, value = line[len(prefix) :].rpartition("} ")
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("job_id", labels.get("job")) == job and labels.get("operator_uid") == operator_uid:
            total += float(value)
    return total


def s3_server_pid(endpoints: Endpoints, services_run_dir: Path | None = None) -> int | None:
    """The local S3 server's pid: from its pid file (``$WEIR_RUN_DIR/s3/s3.pid`` of the shared
    services), else the process listening on the S3 port; None when it does not run on this machine.
    Its CPU during a contender's run is counted to that contender (checkpoints are written there)."""
    pid_file = (services_run_dir or run_dir()) / "s3" / "s3.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(pid_file.read_text().split()[0])
        if Path(f"/proc/{pid}").exists():
            return pid
    import psutil

    port = endpoints.s3_port
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    return None


def load_gate(deadline_s: float) -> LoadCheck:
    """Before a run: wait (up to ``deadline_s``) for the 1-minute load average to fall to the core
    count (:func:`bench.evidence.wait_for_quiet`); logged when it waited or gave up."""
    cores = os.cpu_count() or 1
    check = wait_for_quiet(cores, deadline_s, load_1m=lambda: os.getloadavg()[0])
    if check.under_load:
        log(f"  load average {check.load_1m:.1f} > {cores} cores after {check.waited_s:.0f} s: run marked under load")
    elif check.waited_s > 0:
        log(f"  waited {check.waited_s:.0f} s for the load average to fall to {check.load_1m:.1f}")
    return check


# Process sampling -----------------------------------------------------------------------------------


@dataclass
class ProcessUsage:
    name: str
    pid: int
    cpu_start_s: float
    cpu_last_s: float
    peak_rss_bytes: int
    rss_series: list[tuple[float, int]] = field(default_factory=list)

    @property
    def cpu_s(self) -> float:
        return self.cpu_last_s - self.cpu_start_s


@dataclass(frozen=True)
class ProcStat:
    """What /proc/<pid>/stat says of a process: CPU seconds (user + system) so far, resident memory,
    its start time (clock ticks after boot: a pid reused by another process has another), whether
    it is a zombie (exited, not yet reaped: its CPU is final), and the CPU seconds of the children
    it reaped."""

    cpu_s: float
    rss_bytes: int
    start_ticks: int
    zombie: bool
    reaped_children_cpu_s: float = 0.0


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")


def parse_proc_stat(text: str) -> ProcStat:
    """Fields of ``/proc/<pid>/stat`` (proc(5)): after the ``(comm)`` come state (3), utime (14),
    stime (15), cutime (16), cstime (17), starttime (22) and rss in pages (24)."""
    fields = text.rpartition(")")[2].split()
    return ProcStat(
        cpu_s=(int(fields[11]) + int(fields[12])) / _CLOCK_TICKS,
        rss_bytes=int(fields[21]) * _PAGE_BYTES,
        start_ticks=int(fields[19]),
        zombie=fields[0] in ("Z", "X"),
        reaped_children_cpu_s=(int(fields[13]) + int(fields[14])) / _CLOCK_TICKS,
    )


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (every thread's ``/proc/<pid>/task/<tid>/children``), without
    reading every process's stat; [] when it is gone."""
    found: list[int] = []
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for thread in threads:
        try:
            found.extend(int(child) for child in (thread / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


@dataclass(frozen=True)
class MachineCpu:
    """CPU seconds of every core since boot (``/proc/stat``'s first line): ``busy`` running anything
    (user, nice, system, irq, softirq; guest time is inside user), ``stolen`` wanting to run while
    the hypervisor ran something else (steal)."""

    busy_s: float
    stolen_s: float


def machine_cpu() -> MachineCpu:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return MachineCpu((user + nice + system + irq + softirq) / _CLOCK_TICKS, steal / _CLOCK_TICKS)


def read_proc_stat(pid: int) -> ProcStat | None:
    """The process's /proc stat, None when it is gone (Linux: the benchmarks run there)."""
    try:
        return parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


class ProcessSampler:
    """Samples CPU time and RSS of named processes (from /proc) every ``interval_s`` on a thread.

    CPU is counted from the first sample of each process (processes already running, like the S3
    server, contribute only what they spend while sampled), or from its start when it is added
    ``from_birth`` (a process the measured run started: its start-up counts); a process that exits
    keeps its last sample, or the exact figures :meth:`final` is given (from ``os.wait4``).
    """

    def __init__(self, interval_s: float = 0.25, keep_series: bool = False) -> None:
        self._interval_s = interval_s
        self._keep_series = keep_series
        self._procs: dict[int, tuple[str, int]] = {}  # pid -> (name, start time in ticks)
        self._from_birth: set[int] = set()
        self.usage: dict[int, ProcessUsage] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-sampler", daemon=True)
        self._started_at = time.monotonic()

    def add(self, name: str, pid: int, *, from_birth: bool = False) -> None:
        """Sample ``pid`` from now on. ``from_birth``: count its CPU since it started (a process the
        measured run started, e.g. a cluster's), not only from this first sample."""
        stat = read_proc_stat(pid)
        if stat is None:
            return
        with self._lock:
            if pid in self.usage or pid in self._procs:
                return  # seen before (and perhaps gone): counted once
            self._procs[pid] = (name, stat.start_ticks)
            if from_birth:
                self._from_birth.add(pid)
        self._sample_one(pid)

    def track(self, pids: dict[str, int], *, from_birth: bool = False) -> None:
        for name, pid in pids.items():
            if pid not in self._procs:
                self.add(name, pid, from_birth=from_birth)

    def start(self) -> ProcessSampler:
        self._started_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        for pid in list(self._procs):
            self._sample_one(pid)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def refresh(self) -> None:
        """Sample every tracked process now (not waiting for the thread's next round)."""
        for pid in list(self._procs):
            self._sample_one(pid)

    def final(self, name: str, pid: int, cpu_s: float, peak_rss_bytes: int) -> None:
        """Exact totals of an exited child (CPU over its life, peak RSS), from its rusage."""
        with self._lock:
            usage = self.usage.get(pid)
            if usage is None:
                usage = self.usage[pid] = ProcessUsage(name, pid, 0.0, 0.0, 0)
            usage.cpu_start_s = 0.0
            usage.cpu_last_s = cpu_s
            usage.peak_rss_bytes = max(usage.peak_rss_bytes, peak_rss_bytes)
            self._procs.pop(pid, None)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for pid in list(self._procs):
                self._sample_one(pid)

    def _sample_one(self, pid: int) -> None:
        with self._lock:
            entry = self._procs.get(pid)
            if entry is None:
                return
            name, start_ticks = entry
            stat = read_proc_stat(pid)
            if stat is None or stat.start_ticks != start_ticks:  # gone, or the pid reused
                self._procs.pop(pid, None)
                return
            usage = self.usage.get(pid)
            if usage is None:
                start = 0.0 if pid in self._from_birth else stat.cpu_s
                usage = self.usage[pid] = ProcessUsage(name, pid, start, stat.cpu_s, stat.rss_bytes)
            usage.cpu_last_s = max(usage.cpu_last_s, stat.cpu_s)
            if stat.zombie:  # exited: its CPU is final, its memory gone
                self._procs.pop(pid, None)
                return
            usage.peak_rss_bytes = max(usage.peak_rss_bytes, stat.rss_bytes)
            if self._keep_series:
                usage.rss_series.append((time.monotonic() - self._started_at, stat.rss_bytes))

    def total_cpu_s(self) -> float:
        with self._lock:
            return sum(u.cpu_s for u in self.usage.values())

    def cpu_by_name(self) -> dict[str, float]:
        """CPU seconds per process name (a restarted process's lives added up)."""
        out: dict[str, float] = {}
        with self._lock:
            for u in self.usage.values():
                out[u.name] = out.get(u.name, 0.0) + u.cpu_s
        return out

    def peak_rss_by_process(self) -> dict[str, int]:
        """Peak RSS per process name (a restarted process keeps the larger of its lives)."""
        out: dict[str, int] = {}
        with self._lock:
            for u in self.usage.values():
                out[u.name] = max(out.get(u.name, 0), u.peak_rss_bytes)
        return out


@dataclass(frozen=True)
class Reaped:
    exit_code: int
    cpu_s: float  # user + system, the whole life of the process
    peak_rss_bytes: int


def reap(proc: subprocess.Popen[Any], timeout_s: float = 0.0) -> Reaped | None:
    """Reap a child with ``os.wait4`` for its exact CPU time and peak RSS; None while it still runs
    after ``timeout_s``. (Never ``proc.poll()`` a child before: that would reap it without rusage.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return Reaped(proc.returncode, rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss * 1024)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


# Small statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def host_summary() -> dict[str, Any]:
    """The machine a result was measured on, as the results' ``host`` field."""
    import platform

    return {"machine": platform.machine(), "cpus": os.cpu_count() or 0, "python": platform.python_version()}


def publish_results(
    name: str,
    document: dict[str, Any],
    render_markdown: Callable[[dict[str, Any]], str],
    directory: Path = RESULTS_DIR,
) -> None:
    """Write ``bench/results/NAME.json`` and ``NAME.md`` (rendered from the document) and print the
    markdown."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    markdown = render_markdown(document)
    (directory / f"{name}.md").write_text(markdown)
    print(markdown)
