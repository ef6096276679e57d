"""Cores that add up: one TaskManager with 1 slot vs 2 slots on a CPU-bound job.

``make bench-slots`` (``.venv/bin/python -m bench.slots_bench [--rounds 3] [--events N] [--work N]``)
runs bench/jobs/cpu_per_record.py (generator -> a map with a fixed amount of Python work per record
-> key_by -> window count+sum -> discard) on a private cluster of a JobManager and ONE TaskManager,
in these configurations:

- ``1 slot, p=1`` and ``2 slots, p=2`` with slot processes (``--slot-processes``, each slot's tasks in
  a worker process of its own): the pair whose ratio is the target (>= 1.7x on 2 cores);
- the same two with ``--no-slot-processes`` (every task in the TaskManager's process), the baseline
  that the setting's default is chosen against.

Each round runs every configuration once, in an order reversed every other round (A B C D, D C B A,
...), so that a drift of the shared machine's load spreads over all of them; the figures are the
medians over ``--rounds``. Per run: records/s at the source between 10% and 90% of the events
(start-up and tail excluded), from the TaskManager's /metrics scraped every 0.25 s; the CPU of the
TaskManager and its workers over that window (/proc, the process tree), as cores used and CPU
seconds per million records; the peak RSS of the TaskManager and of each worker; the workers' start
(from the TaskManager's log: started -> ready). The machine is shared: the load average is recorded
before every run, and ``--max-load`` waits (at most ``--load-wait`` s) for a quieter moment first.

Results: ``bench/results/slots.json`` and ``slots.md``, with the commit. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from bench.harness import (
    JOBS_DIR,
    REPO_ROOT,
    BenchError,
    Progress,
    host_summary,
    log,
    median,
    new_run_id,
    prepare_environment,
    publish_results,
    remove_run_root,
)
from weir.core.errors import WeirError
from weir.tools.client import JobManagerClient
from weir.tools.supervisor import ChildSpec, jobmanager_port, start_cluster, stop_cluster

JOB_FILE: Final = JOBS_DIR / "cpu_per_record.py"
SOURCE_UID: Final = "generator"
TASKMANAGER: Final = "taskmanager-1"
POLL_S: Final = 0.25
TARGET_RATIO: Final = 1.7


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


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)
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


def taskmanager_pid(cluster_dir: Path) -> int:
    state = json.loads((cluster_dir / "state.json").read_text())
    for child in state["children"]:
        if child["name"] == TASKMANAGER and child["pid"]:
            return int(child["pid"])
    raise BenchError(f"no {TASKMANAGER} in {cluster_dir / 'state.json'}")


TICKS: Final = os.sysconf("SC_CLK_TCK")
PAGE: Final = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def tree_cpu_and_rss(root: int) -> tuple[float, dict[int, int]]:
    """CPU seconds of ``root`` and its children (its slot workers; the children it reaped included),
    and each one's RSS by pid, from /proc."""
    cpu = 0.0
    rss: dict[int, int] = {}
    pids = [root]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != root:
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == root:
                pids.append(int(entry.name))
    for pid in pids:
        fields = _stat(pid)
        if fields is None:
            continue
        # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 here); rss (pages) field 24 (21).
        cpu += sum(int(v) for v in fields[11:15]) / TICKS
        rss[pid] = int(fields[21]) * PAGE
    return cpu, rss


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


def source_records(url: str, job_id: str) -> float | None:
    """Records out of the job's source subtasks from the TaskManager's /metrics; None when it did
    not answer within 5 s."""
    try:
        with urllib.request.urlopen(url, timeout=5.0) as response:
            text = response.read().decode()
    except OSError:
        return None
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "weir_records_out_total"
                and labels.get("job_id") == job_id
                and labels.get("operator_uid") == SOURCE_UID
            ):
                total += sample.value
    return total


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


def run_once(config: Config, round_no: int, args: argparse.Namespace, env: Any, index: int) -> Run:
    wait_for_load(args.max_load, args.load_wait)
    load = os.getloadavg()
    cluster_dir = env.run_root / f"cluster-{index}"
    log(f"round {round_no}: {config.name} (load average {load[0]:.2f})")
    start_cluster(
        cluster_dir,
        env.endpoints,
        restart=False,
        timeout_s=120,
        children=children(config, sys.executable, env.endpoints),
    )
    try:
        tm = taskmanager_pid(cluster_dir)
        _, idle = tree_cpu_and_rss(tm)
        worker_idle = [rss for pid, rss in idle.items() if pid != tm]
        url = f"http://127.0.0.1:{env.endpoints.taskmanager_metrics_base_port + 1}/metrics"
        parameters = {"events": str(args.events), "work": str(args.work)}
        with JobManagerClient(env.endpoints.jobmanager_address) as client:
            job_id = client.submit_job(JOB_FILE, parameters, config.parallelism)
            records: list[tuple[float, float]] = []
            cpu: list[tuple[float, float]] = []
            peak: dict[int, int] = {}
            running_at: float | None = None
            deadline = time.monotonic() + args.timeout
            while True:
                now = time.monotonic()
                if now > deadline:
                    raise BenchError(f"{config.name}: job {job_id} not FINISHED within {args.timeout:.0f} s")
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
                total_cpu, rss = tree_cpu_and_rss(tm)
                sampled = time.monotonic()
                cpu.append((sampled, total_cpu))
                for pid, value in rss.items():
                    peak[pid] = max(peak.get(pid, 0), value)
                count = source_records(url, job_id)
                if count is not None:  # a scrape that failed (a loaded machine) is left out, not a zero
                    records.append((sampled, count))
                time.sleep(POLL_S)
            finished = time.monotonic()
    finally:
        stop_cluster(cluster_dir)
    progress = Progress(tuple(records))
    rate = progress.sustained_rate(args.events)
    t_low, t_high = progress.time_at(args.events * 0.1), progress.time_at(args.events * 0.9)
    cores = cpu_per_million = None
    if t_low is not None and t_high is not None and t_high > t_low:
        c_low, c_high = interpolate(cpu, t_low), interpolate(cpu, t_high)
        if c_low is not None and c_high is not None:
            cores = (c_high - c_low) / (t_high - t_low)
            cpu_per_million = (c_high - c_low) / (args.events * 0.8) * 1e6
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
    )
    log(f"  {rate or 0:,.0f} records/s, {cores or 0:.2f} cores, {cpu_per_million or 0:.1f} CPU s per M records")
    return run


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


def summarize(runs: list[Run]) -> dict[str, Any]:
    by_config: dict[str, dict[str, Any]] = {}
    for config in CONFIGS:
        mine = [r for r in runs if r.config == config.name]
        if not mine:
            continue
        by_config[config.name] = {
            "slots": config.slots,
            "parallelism": config.parallelism,
            "slot_processes": config.slot_processes,
            "records_per_s": median([r.records_per_s for r in mine]),
            "cores": median([r.cores for r in mine]),
            "cpu_s_per_million": median([r.cpu_s_per_million for r in mine]),
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


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_markdown(document: dict[str, Any]) -> str:
    summary = document["summary"]
    ratios = summary["ratios"]
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
        "| configuration | records/s | cores used | CPU s / M records | TM peak RSS MiB | worker peak RSS MiB "
        "| worker idle RSS MiB | worker start s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, c in summary["configs"].items():
        lines.append(
            f"| {name} | {_fmt(c['records_per_s'], ',.0f')} | {_fmt(c['cores'], '.2f')} | "
            f"{_fmt(c['cpu_s_per_million'], '.1f')} | {_fmt(c['taskmanager_peak_rss_mib'], '.0f')} | "
            f"{_fmt(c['worker_peak_rss_mib'], '.0f')} | {_fmt(c['worker_idle_rss_mib'], '.0f')} | "
            f"{_fmt(c['worker_ready_s'], '.2f')} |"
        )
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
        "| round | configuration | load avg (1/5/15 min) | records/s | cores |",
        "| ---: | --- | --- | ---: | ---: |",
    ]
    for run in document["runs"]:
        load = "/".join(f"{v:.2f}" for v in run["load_average_before"])
        lines.append(
            f"| {run['round']} | {run['config']} | {load} | {_fmt(run['records_per_s'], ',.0f')} | "
            f"{_fmt(run['cores'], '.2f')} |"
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
    args = parser.parse_args(argv)
    configs = CONFIGS if args.configs == "all" else tuple(CONFIGS[int(i)] for i in args.configs.split(","))

    channels: dict[str, Any] | None = None
    if args.channel_records:
        log(f"one channel between two subtasks of a TaskManager, {args.channel_records:,} records, 3 ways")
        channels = channel_figures(args.channel_records, args.rounds)
        log("  " + ", ".join(f"{name} {rate or 0:,.0f} records/s" for name, rate in channels.items()))
    env = prepare_environment(new_run_id(), checkpoints_in_s3=False)
    runs: list[Run] = []
    failed = True
    try:
        index = 0
        for round_no in range(1, args.rounds + 1):
            order = configs if round_no % 2 == 1 else tuple(reversed(configs))
            for config in order:
                index += 1
                runs.append(run_once(config, round_no, args, env, index))
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
        "summary": summarize(runs),
        "channel_records_per_s": channels,
        "runs": [asdict(r) for r in runs],
    }
    publish_results("slots", document, render_markdown)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench-slots: error: {exc}", file=sys.stderr)
        sys.exit(1)
