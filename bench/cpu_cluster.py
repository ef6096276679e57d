"""CPU per event of the keyed job on a private cluster, per process, in the steady state.

``python -m bench.cpu_cluster [--events N] [--runs N] [--paths record,columnar] [--profile-s S]`` loads the keyed
benchmark's data set (``bench.dataset``, 8 partitions, 1,000 keys) once, starts a private cluster
(``bench.harness.private_cluster``: JobManager + 3 TaskManagers, the configured ports), and runs
``examples/keyed_aggregation.py`` bounded at parallelism 3 with a checkpoint every second and the
Kafka sink only (transactions), alternating the paths, ``--runs`` times each. For each run it reads
every cluster process's CPU time (``/proc/<pid>/stat``: all threads, librdkafka's and gRPC's too)
when the window operator has taken in 10 % and 90 % of the input, and reports CPU µs per event between the two
marks, per process and in total (the same span as ``make bench``'s CPU figure), with the load
average, and its warm-up ratio: CPU per event over 10-50 % of the input / over 50-90 %, at the window
(``make bench`` takes it at the source, which runs ahead of the window by what the channels buffer).
Results: ``bench/results/cpu_cluster.json``.

``--profile-s S`` adds one more run per path, after the measured ones and outside their figures,
that records the TaskManagers with py-spy (``--py-spy``, 50 samples/s, non-blocking) for ``S``
seconds from the window's 10 % mark, and writes beside the results the raw stacks and a summary
(``<output stem>-pyspy-<path>.txt``): the busy samples' share by function, self and inclusive (a
stack whose leaf waits, a condition, a selector, gRPC's completion queue, a sleep, is idle).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from bench import dataset
from bench.cpu_bench import KEYED_JOB, git_commit
from bench.evidence import compare_records
from bench.harness import (
    BenchCluster,
    log,
    prepare_environment,
    private_cluster,
    remove_run_root,
    scrape_counter,
)
from weir.tools.supervisor import TASKMANAGERS

RESULTS: Final = Path(__file__).resolve().parent / "results" / "cpu_cluster.json"
WINDOW_UID: Final = "window-count-sum"
"""The window's vertex: its records in are the events that went through the whole job (the source
runs ahead of it by what the channels buffer, up to ~450k rows on the columnar path)."""
_TICKS: Final = os.sysconf("SC_CLK_TCK")
MARK_POLL_S: Final = 0.5
"""How often the window's progress is read from the TaskManagers' metrics: each scrape renders the
whole exposition (a few ms of the TaskManager's CPU), so reading every 25 ms inflated the figure."""


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (every thread), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: process_cpu_s(pid) for name, pid in pids.items()}


def thread_cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of the cluster's threads by thread name (``comm``: librdkafka's ``rdk:*``, gRPC's,
    RocksDB's; Python's own threads are all ``python``), summed over the processes."""
    out: dict[str, float] = {}
    for pid in pids.values():
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            name = "".join(c for c in name if not c.isdigit()).rstrip(":-_ ") or name
            fields = stat.rpartition(")")[2].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICKS
    return out


IDLE_LEAVES: Final = (
    "wait (threading.py",
    "select (selectors.py",
    "_wait_once (grpc",
    "channel_spin (grpc",
    "sleep",
    "_poll_events",
    "poll (selectors.py",
    "get (queue.py",
    "_run (grpc/_server.py",
)
"""Leaf frames (py-spy's ``function (file:line)``) of a thread that waits: its samples are idle."""


def summarize_pyspy(stacks: Iterable[str], top: int = 40) -> str:
    """py-spy's raw (collapsed) stacks summarized: the busy samples' share per function, self (the
    leaf) and inclusive (anywhere in the stack, once per sample)."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in stacks:
        stack, _space, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f.split(":")[0] for f in stack.split(";")[1:]]  # the first is the thread
        if not frames or any(mark in frames[-1] for mark in IDLE_LEAVES):
            idle += count
            continue
        busy += count
        own[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    lines = [f"busy samples {busy} (idle left out: {idle})", "-- self"]
    lines += [f"{100 * n / busy:5.1f}% {name}" for name, n in own.most_common(top)] if busy else []
    lines.append("-- inclusive")
    lines += [f"{100 * n / busy:5.1f}% {name}" for name, n in anywhere.most_common(top)] if busy else []
    return "\n".join(lines) + "\n"


def window_records_in(cluster: BenchCluster, job_id: str) -> int:
    base = cluster.env.endpoints.taskmanager_metrics_base_port
    return sum(
        int(scrape_counter(f"http://127.0.0.1:{base + n}/metrics", "weir_records_in_total", job_id, WINDOW_UID))
        for n in range(1, TASKMANAGERS + 1)
    )


def start_profiles(pids: dict[str, int], py_spy: str, seconds: float, folder: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy recording each TaskManager for ``seconds`` (raw stacks into ``folder``), started now."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [py_spy, "record", "--nonblocking", "-r", "50", "-f", "raw", "-d", str(int(seconds)), "-p", str(pid)]
            + ["-o", str(folder / f"{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
        if name.startswith("taskmanager")
    ]


def one_run(
    cluster: BenchCluster,
    path: str,
    topics: tuple[str, str],
    events: int,
    tag: str,
    profile: tuple[str, float, Path] | None = None,
) -> dict[str, Any]:
    output = f"{topics[1]}-{tag.replace(' ', '')}-{path}"  # a topic per run: its output is checked alone
    dataset.create_topics(cluster.env.endpoints, {output: dataset.PARTITIONS})
    params = {
        "source.topic": topics[0],
        "source.bounded": "true",
        "source.dlq_topic": f"{topics[0]}-dlq",
        "sink.topic": output,
        "sink.postgres": "false",
        "checkpointing.interval": "1s",
        "columnar": "true" if path == "columnar" else "false",
    }
    job_id = cluster.submit(KEYED_JOB, params, 3)
    cluster.wait_job(job_id, lambda s: bool(s.tasks) and all(t.state == "RUNNING" for t in s.tasks), 120, "RUNNING")
    pids = cluster.process_pids()
    running_cpu, running_at = cpu_of(pids), time.monotonic()
    total = events + dataset.PARTITIONS
    at = (total * 0.1, total * 0.5, total * 0.9)
    marks: list[tuple[int, float, dict[str, float]]] = []
    threads: list[dict[str, float]] = []
    profilers: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + 600
    last = -1
    while len(marks) < len(at):
        consumed = window_records_in(cluster, job_id)
        if consumed == last:  # no progress since the last sample: a job that ended takes its metrics with it
            status = cluster.status(job_id)
            if status is not None and status.summary.status in ("FINISHED", "FAILED", "CANCELED"):
                raise RuntimeError(f"{tag}: the job ended ({status.summary.status}) before both marks; use more events")
        last = consumed
        if consumed >= at[len(marks)]:
            marks.append((consumed, time.monotonic(), cpu_of(pids)))
            threads.append(thread_cpu_of(pids))
            if len(marks) < len(at) and consumed >= at[len(marks)]:
                raise RuntimeError(f"{tag}: two marks passed between two samples; use more events")
            if len(marks) == 1 and profile is not None:
                profilers = start_profiles(pids, profile[0], profile[1], profile[2])
        if time.monotonic() > deadline:
            raise RuntimeError(f"{tag}: the window did not reach 90 % in 600 s")
        time.sleep(MARK_POLL_S)
    cluster.wait_job(job_id, lambda s: s.summary.status == "FINISHED", 600, "FINISHED")
    finished_cpu, finished_at = cpu_of(pids), time.monotonic()
    dataset.wait_output_settled(cluster.env.endpoints, output)
    check = compare_records(
        dataset.expected_results(events), dataset.read_results(cluster.env.endpoints, output), dataset.result_identity
    )
    for profiler in profilers:
        profiler.wait(timeout=120)
    (n0, t0, c0), (nm, _tm, cm), (n1, t1, c1) = marks
    per_process = {name: (c1[name] - c0[name]) / (n1 - n0) * 1e6 for name in pids}
    per_thread = {
        name: round((threads[2][name] - threads[0].get(name, 0.0)) / (n1 - n0) * 1e6, 3) for name in threads[2]
    }
    first_half = sum(cm[k] - c0[k] for k in pids) / (nm - n0)
    second_half = sum(c1[k] - cm[k] for k in pids) / (n1 - nm)
    result = {
        "path": path,
        "job_id": job_id,
        "events_between_marks": n1 - n0,
        "events_per_s": (n1 - n0) / (t1 - t0),
        "us_per_event": sum(per_process.values()),
        "us_per_event_by_process": {k: round(v, 3) for k, v in per_process.items()},
        "us_per_event_by_thread_name": dict(sorted(per_thread.items(), key=lambda kv: -kv[1])),
        "warm_up_ratio": round(first_half / second_half, 3),
        "whole_run_us_per_event": sum(finished_cpu[k] - running_cpu[k] for k in pids) / total * 1e6,
        "whole_run_s": finished_at - running_at,
        "output_ok": check.ok,
        "output_check": check.summary(),
        "load_average": os.getloadavg(),
        "under_load": os.getloadavg()[0] > (os.cpu_count() or 1),  # the 1-minute load above the core count
        "profiled": profile is not None,
    }
    log(
        f"{tag} {path}: {result['us_per_event']:.2f} CPU us/event, {result['events_per_s']:,.0f} events/s, "
        f"warm-up {result['warm_up_ratio']}, by process {result['us_per_event_by_process']}, "
        f"by thread {result['us_per_event_by_thread_name']}, "
        f"whole run {result['whole_run_us_per_event']:.2f} us/event "
        f"in {result['whole_run_s']:.1f} s, output {check.summary()}, load {result['load_average'][0]:.1f}"
    )
    return result


def profiled_run(cluster: BenchCluster, path: str, topics: tuple[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``path`` under py-spy (:func:`start_profiles`), its summary written beside the results."""
    folder = args.output.with_name(f"{args.output.stem}-pyspy-{path}")
    run = one_run(cluster, path, topics, args.events, "profiled", (args.py_spy, args.profile_s, folder))
    stacks = [line for f in sorted(folder.glob("*.txt")) for line in f.read_text().splitlines()]
    header = (
        f"# py-spy record -r 50 --nonblocking -f raw -d {args.profile_s:.0f} of the TaskManagers from the window's "
        f"10 % mark: {path} path, {args.events:,} events, commit {git_commit()}, load {run['load_average'][0]:.1f}, "
        f"{run['us_per_event']:.2f} CPU us/event under py-spy\n"
    )
    summary_file = args.output.with_name(f"{args.output.stem}-pyspy-{path}.txt")
    summary_file.write_text(header + summarize_pyspy(stacks))
    log(f"profile of the {path} path: {summary_file}")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--paths", default="record,columnar")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--profile-s", type=float, default=0.0, help="one more run per path under py-spy (seconds)")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    args = parser.parse_args(argv)
    run_id = f"cpu-{uuid.uuid4().hex[:8]}"
    env = prepare_environment(run_id, checkpoints_in_s3=True)
    topics = (f"{run_id}-in", f"{run_id}-out")
    dataset.create_topics(env.endpoints, {topics[0]: dataset.PARTITIONS, f"{topics[0]}-dlq": 1})
    runs: list[dict[str, Any]] = []
    try:
        log(f"producing {args.events:,} events into {topics[0]}")
        dataset.produce_dataset(env.endpoints, topics[0], args.events)
        with private_cluster(env) as cluster:
            cluster.wait_all_taskmanagers()
            for n in range(args.runs):
                for path in args.paths.split(","):
                    runs.append(one_run(cluster, path, topics, args.events, f"run {n + 1}"))
            for path in args.paths.split(",") if args.profile_s > 0 else ():
                runs.append(profiled_run(cluster, path, topics, args))
    finally:
        dataset.delete_topics_containing(env.endpoints, run_id)
        remove_run_root(env, keep=False)
    measured = [r for r in runs if not r["profiled"]]
    summary = {
        path: {
            "median_us_per_event": statistics.median(r["us_per_event"] for r in measured if r["path"] == path),
            "runs_us_per_event": [round(r["us_per_event"], 2) for r in measured if r["path"] == path],
            "median_events_per_s": statistics.median(r["events_per_s"] for r in measured if r["path"] == path),
            "median_warm_up_ratio": statistics.median(r["warm_up_ratio"] for r in measured if r["path"] == path),
        }
        for path in args.paths.split(",")
    }
    for path, s in summary.items():
        print(
            f"{path:<10} {s['median_us_per_event']:6.2f} CPU us/event (runs {s['runs_us_per_event']}), "
            f"{s['median_events_per_s']:,.0f} events/s, warm-up {s['median_warm_up_ratio']:.2f}"
        )
    document = {"commit": git_commit(), "events": args.events, "runs": runs, "summary": summary}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
