"""The benchmark of the keyed aggregation: Weir against Quix Streams, the raw Python limit, Apache Flink
and the ceiling (a bare consumer reading the input).

``make bench`` (full) and ``make bench-quick`` run ``.venv/bin/python -m bench.run [--quick]``.
docs/benchmarks.md says what each figure means and how it is measured; in short:

1. the data set: N JSON events over 1,000 keys in an 8-partition topic, event time advancing 1 ms per
   event in each partition, produced once per run: every contender reads the same bytes;
2. throughput: each contender at exactly-once reads the topic to its end (bounded), every run in
   a rotated order (two contenders: ABBA), each run behind the load gate (the 1-minute load
   average at most the core count, else the run is marked under load); events/s and CPU seconds
   per million events over the whole run (start-up included: Weir's cluster is started for the
   run, as Flink's JVM is) and between 10 % and 90 % of the input consumed, the S3 server's CPU
   counted to the contender it checkpoints for, peak RSS per process; the committed output is
   compared with the input's window results record for record (counts and sums); each figure is
   the median of the runs with their min and max, and a mismatching run fails the figure;
3. latency: each contender unbounded on a fresh topic fed at half its sustained rate; p50/p99 of
   (visible to a read_committed consumer) - (broker append time of the window's last event);
4. checkpoints of a Weir job holding 1M keys (first, then incremental after 1 % of keys changed);
5. memory of the TaskManagers while a slow sink backpressures the job;
6. recovery: SIGKILL a TaskManager, time until the first output committed after the restore (median
   of one kill per throughput run).

Results: ``bench/results/results.json``, ``results.md`` and ``chart.png``, with the provenance block
(commit, tree state, machine, load, dates: ``bench/provenance.py``). Targets are reported as
pass/miss, never asserted. Topics, tables, consumer groups and checkpoint objects carry the run id
and are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from bench import dataset, provenance, report
from bench.contenders import (
    WORKERS,
    Contender,
    ProcessGroupContender,
    Topics,
    WeirContender,
    WeirRunning,
    ceiling_contender,
    describe,
    flink_available,
    flink_contender,
    flink_s3_problem,
    quix_available,
    quix_contender,
    raw_contender,
    table_results,
)
from bench.evidence import Sample, compare_records, run_order, steady_state
from bench.harness import (
    JOBS_DIR,
    REPO_ROOT,
    RESULTS_DIR,
    BenchCluster,
    BenchEnvironment,
    BenchError,
    ProcessSampler,
    ensure_services,
    load_gate,
    log,
    new_run_id,
    percentile,
    prepare_environment,
    private_cluster,
    remove_checkpoints,
    remove_run_root,
    s3_server_pid,
    scrape_counter,
)
from weir.core.config import Endpoints
from weir.tools.supervisor import kill_process

PHASES: Final = ("throughput", "latency", "checkpoint", "memory", "recovery")
CONTENDER_KEYS: Final = ("weir", "weir-kafka", "weir-columnar", "quix", "raw", "flink", "ceiling")


@dataclass(frozen=True)
class Plan:
    events: int
    runs: int
    latency_s: float  # measured part of a latency run
    latency_warmup_s: float
    state_keys: int
    memory_s: float
    recovery_after_kill_s: float
    timeout_s: float  # per throughput run
    load_wait_s: float  # the load gate's deadline before each throughput run


FULL = Plan(
    events=2_000_000,
    runs=3,
    latency_s=40,
    latency_warmup_s=10,
    state_keys=1_000_000,
    memory_s=60,
    recovery_after_kill_s=30,
    timeout_s=1800,
    load_wait_s=180,
)
QUICK = Plan(
    events=200_000,
    runs=3,
    latency_s=10,
    latency_warmup_s=4,
    state_keys=200_000,
    memory_s=20,
    recovery_after_kill_s=20,
    timeout_s=600,
    load_wait_s=60,
)
DEFAULT_RATE_EPS: Final = 10_000.0  # when a phase needs a contender's rate and throughput was not measured
LATENCY_DRAIN_S: Final = 4.0  # after the producer stops: one checkpoint interval and a commit, with margin
SLOW_SINK_DELAY_MS: Final = 10
S3_SERVER: Final = "s3-server"  # the sampler's name for the S3 server's process


class Runner:
    def __init__(self, plan: Plan, quick: bool, env: BenchEnvironment, contenders: list[Contender]) -> None:
        self.plan = plan
        self.quick = quick
        self._cluster: BenchCluster | None = None
        self.env = env
        self.endpoints = env.endpoints
        self.run_id = env.run_id
        self.contenders = contenders
        self.results: dict[str, Any] = {"throughput": {}, "latency": {}}
        self.input_topic = self.topic("input")
        self.s3_pid = s3_server_pid(env.endpoints, env.services_run_dir)

    @property
    def cluster(self) -> BenchCluster:
        """The cluster of the Weir-only phase running now (checkpoint, memory)."""
        if self._cluster is None:
            raise BenchError("no Weir cluster is up for this phase")
        return self._cluster

    @contextlib.contextmanager
    def phase_cluster(self, name: str) -> Iterator[BenchCluster]:
        """A cluster of its own for a Weir-only phase (contender runs start theirs)."""
        with private_cluster(self.env, f"cluster-{name}") as cluster:
            self._cluster = cluster
            try:
                yield cluster
            finally:
                self._cluster = None

    def topic(self, name: str) -> str:
        return f"bench-{self.run_id}-{name}"

    def weir(self, key: str) -> WeirContender | None:
        found = next((c for c in self.contenders if c.key == key), None)
        return found if isinstance(found, WeirContender) else None

    def median_rate(self, key: str) -> float | None:
        return self.results["throughput"].get(key, {}).get("median_eps")

    def median_rate_any(self, key: str) -> float | None:
        """The median sustained rate of the runs, even of a failed figure: for pacing a later phase."""
        runs = self.results["throughput"].get(key, {}).get("runs", [])
        rates = sorted(r["sustained_eps"] for r in runs if r.get("sustained_eps"))
        return rates[len(rates) // 2] if rates else None

    # The data set ----------------------------------------------------------------------------------------

    def produce_input(self) -> None:
        dataset.create_topics(self.endpoints, {self.input_topic: dataset.PARTITIONS})
        started = time.monotonic()
        written = dataset.produce_dataset(self.endpoints, self.input_topic, self.plan.events)
        log(f"data set: {written:,} records into {self.input_topic} in {time.monotonic() - started:.1f} s")
        self.results["dataset"] = {
            "topic": self.input_topic,
            "events": self.plan.events,
            "sentinels": dataset.PARTITIONS,
            "partitions": dataset.PARTITIONS,
            "keys": dataset.KEYS,
        }

    # Throughput -----------------------------------------------------------------------------------------

    def throughput(self) -> None:
        total = self.plan.events + dataset.PARTITIONS
        expected = dataset.expected_results(self.plan.events)
        for run in range(1, self.plan.runs + 1):
            order = run_order(self.contenders, run - 1)
            log(f"throughput run {run}/{self.plan.runs}, in this order: {', '.join(c.key for c in order)}")
            for position, contender in enumerate(order, start=1):
                tag = f"tp{run}-{contender.key}"
                output = self.topic(f"{tag}-out")
                dataset.create_topics(self.endpoints, {output: dataset.PARTITIONS})
                log(f"throughput run {run}/{self.plan.runs}: {contender.label}")
                gate = load_gate(self.plan.load_wait_s)
                load_before = list(os.getloadavg())
                try:
                    figures = self._throughput_run(contender, Topics(self.input_topic, output), total, tag, expected)
                except BenchError as exc:
                    log(f"  failed: {exc}")
                    figures = {"error": str(exc)}
                figures.update(
                    run=run,
                    position=position,
                    load={**gate.as_dict(), "before": load_before, "after": list(os.getloadavg())},
                )
                entry = self.results["throughput"].setdefault(contender.key, {"runs": []})
                entry["runs"].append(figures)
                if "error" not in figures:
                    steady, steady_cpu = figures["sustained_eps"], figures["sustained_cpu_s_per_million"]
                    log(
                        f"  {'-' if steady is None else f'{steady:,.0f}'} events/s at 10-90 %, wall "
                        f"{figures['wall_s']:.1f} s, {figures['cpu_s_per_million']:.1f} CPU s/M "
                        f"({'-' if steady_cpu is None else f'{steady_cpu:.1f}'} at 10-90 %), output "
                        f"{figures['output']['summary']}"
                    )
        for entry in self.results["throughput"].values():
            report.summarize_throughput(entry)

    def _throughput_run(
        self, contender: Contender, topics: Topics, total: int, tag: str, expected: list[dataset.WindowResult]
    ) -> dict[str, Any]:
        """One run: launch (Weir: its cluster's start), read to the end, CPU sampled every 0.1 s over
        the contender's processes (from their start) and the S3 server (from the launch)."""
        sampler = ProcessSampler()
        if self.s3_pid is not None:
            sampler.add(S3_SERVER, self.s3_pid)
        started = time.monotonic()
        running = contender.start(topics, bounded=True, tag=tag)
        launched_s = time.monotonic() - started
        samples: list[Sample] = [Sample(0.0, 0.0, 0.0)]
        try:
            while True:
                sampler.track(running.pids(), from_birth=True)
                sampler.refresh()
                now = time.monotonic() - started
                samples.append(Sample(now, max(samples[-1].consumed, running.progress()), sampler.total_cpu_s()))
                if running.done():
                    break
                if now > self.plan.timeout_s:
                    raise BenchError(
                        f"{contender.label} did not finish {total:,} events in {self.plan.timeout_s:.0f} s"
                    )
                time.sleep(0.1)
            wall = time.monotonic() - started
            observed = samples[-1].consumed / total  # what the progress counter showed before the end
            sampler.refresh()
            samples.append(Sample(wall, float(total), sampler.total_cpu_s()))  # done: every event consumed
        finally:
            running.stop(sampler)  # a worker group's exact whole-life CPU (wait4) replaces its samples
        if observed < 0.9:
            log(f"  progress seen up to {observed:.0%} only: no steady state (is the progress counter read?)")
        steady = steady_state(samples, total) if observed >= 0.9 else None
        cpu = sampler.total_cpu_s()
        by_process = sampler.cpu_by_name()
        if reads_only(contender):
            output = read_check(running.progress(), total)
        else:
            diff = compare_records(
                expected, dataset.read_results(self.endpoints, topics.output), dataset.result_identity
            )
            output = diff.as_dict()
            if isinstance(contender, WeirContender) and contender.tables:
                table = compare_records(
                    expected, table_results(self.endpoints, contender.tables[-1]), dataset.result_identity
                )
                output = {**output, "ok": output["ok"] and table.ok, "postgres": table.as_dict()}
                if not table.ok:
                    output["summary"] += f"; PostgreSQL table: {table.summary()}"
        figures: dict[str, Any] = {
            "sustained_eps": steady.window.events_per_s if steady else None,
            "sustained_cpu_s_per_million": steady.window.cpu_s_per_million if steady else None,
            "steady_state": steady.as_dict() if steady else None,
            "progress_observed": observed,
            "launch_s": launched_s,
            "wall_s": wall,
            "wall_eps": total / wall,
            "cpu_s": cpu,
            "cpu_s_per_million": cpu / total * 1e6,
            "s3_cpu_s": by_process.get(S3_SERVER),
            "cpu_s_by_process": by_process,
            "peak_rss_bytes": {k: v for k, v in sampler.peak_rss_by_process().items() if k != S3_SERVER},
            "output": output,
            "progress_samples": len(samples),
        }
        if isinstance(running, WeirRunning):
            figures["job_id"] = running.job_id
        return figures

    # Latency --------------------------------------------------------------------------------------------

    def latency(self) -> None:
        for contender in self.contenders:
            if reads_only(contender):
                continue  # no output: no latency
            sustained = self.median_rate_any(contender.key)
            rate = (sustained or DEFAULT_RATE_EPS) / 2
            log(f"latency: {contender.label} at {rate:,.0f} events/s (half of its sustained rate)")
            try:
                self.results["latency"][contender.key] = self._latency_run(contender, rate, sustained is None)
            except BenchError as exc:
                log(f"  failed: {exc}")
                self.results["latency"][contender.key] = {"error": str(exc)}
                continue
            lat = self.results["latency"][contender.key]
            log(f"  p50 {lat['p50_ms'] or 0:,.0f} ms, p99 {lat['p99_ms'] or 0:,.0f} ms over {lat['windows']:,} windows")

    def _latency_run(self, contender: Contender, rate: float, default_rate: bool) -> dict[str, Any]:
        tag = f"lat-{contender.key}"
        topics = Topics(self.topic(f"{tag}-in"), self.topic(f"{tag}-out"))
        dataset.create_topics(
            self.endpoints, {topics.input: dataset.PARTITIONS}, config={"message.timestamp.type": "LogAppendTime"}
        )
        dataset.create_topics(self.endpoints, {topics.output: dataset.PARTITIONS})
        running = contender.start(topics, bounded=False, tag=tag)
        sampler = ProcessSampler()
        try:
            wait_until(running.ready, 120, f"{contender.label} ready (tasks running, partitions assigned)")
            duration = self.plan.latency_warmup_s + self.plan.latency_s
            with watch_output(self.endpoints.kafka_bootstrap, topics.output) as watcher:
                produced = run_producer(self.endpoints.kafka_bootstrap, topics.input, rate, duration)
                time.sleep(LATENCY_DRAIN_S)
                consumed = running.progress()
            seen = watcher.seen
        finally:
            running.stop(sampler)
        appended = produced["appended"]
        first_append = min((a[0][1] for a in appended if a), default=0)
        values = dataset.latencies_ms(appended, seen, first_append + self.plan.latency_warmup_s * 1000)
        return {
            "rate_eps": rate,
            "rate_is_default": default_rate,
            "duration_s": duration,
            "warmup_s": self.plan.latency_warmup_s,
            "produced": produced["events"],
            "achieved_rate_eps": produced["events"] / duration,
            "consumed_by_contender": consumed,
            "output_records": len(seen),
            "windows": len(values),
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "max_ms": max(values) if values else None,
            "producer_errors": produced["errors"],
        }

    # Checkpoints with many keys ---------------------------------------------------------------------------

    def checkpoint(self) -> None:
        with self.phase_cluster("checkpoint"):
            self._checkpoint()

    def _checkpoint(self) -> None:
        keys = self.plan.state_keys
        topic = self.topic("state")
        dataset.create_topics(self.endpoints, {topic: dataset.PARTITIONS})
        produce_keys(self.endpoints, topic, range(keys))
        rate = self.median_rate_any("weir-kafka") or self.median_rate_any("weir") or DEFAULT_RATE_EPS
        interval_s = int(min(300, max(10, math.ceil(2 * keys / rate) + 5)))
        log(f"checkpoint: {keys:,} keys, first checkpoint after {interval_s} s (loading takes ~{keys / rate:.0f} s)")
        job_id = self.cluster.submit(
            JOBS_DIR / "keyed_state.py", {"source.topic": topic, "checkpointing.interval": f"{interval_s}s"}, WORKERS
        )
        try:
            self.results["checkpoint"] = self._checkpoint_run(job_id, topic, keys, interval_s)
        finally:
            self.cluster.cancel(job_id)
        c = self.results["checkpoint"]
        log(
            f"  first {c['first']['duration_s']:.2f} s ({c['first']['size_bytes'] / 1e6:.1f} MB), incremental "
            f"{c['incremental']['duration_s']:.2f} s ({c['incremental']['size_bytes'] / 1e6:.1f} MB)"
        )

    def _checkpoint_run(self, job_id: str, topic: str, keys: int, interval_s: int) -> dict[str, Any]:
        def keyed_records_in() -> float:
            base = self.endpoints.taskmanager_metrics_base_port
            return sum(
                scrape_counter(f"http://127.0.0.1:{base + n}/metrics", "weir_records_in_total", job_id, "count-per-key")
                for n in range(1, 4)
            )

        submitted = time.time()
        loaded_at = wait_until(lambda: keyed_records_in() >= keys, interval_s * 4 + 120, "the keys loaded")
        first = self._wait_checkpoint(job_id, after=0.0, timeout_s=interval_s * 3 + 120)
        changed = max(1, keys // 100)
        produce_keys(self.endpoints, topic, range(0, keys, keys // changed))
        updated_at = wait_until(lambda: keyed_records_in() >= keys + changed, 120, "the updates processed")
        incremental = self._wait_checkpoint(job_id, after=updated_at, timeout_s=interval_s * 3 + 120)
        return {
            "keys": keys,
            "changed_keys": changed,
            "interval_s": interval_s,
            "load_s": loaded_at - submitted,
            "loaded_before_first_trigger": loaded_at <= first["trigger_time"],
            "first": first,
            "incremental": incremental,
            "job_id": job_id,
        }

    def _wait_checkpoint(self, job_id: str, after: float, timeout_s: float) -> dict[str, Any]:
        """The first COMPLETED checkpoint triggered after ``after`` (wall clock), from ``weir checkpoints``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = [
                c
                for c in self.cluster.checkpoints_json(job_id)
                if c["status"] == "COMPLETED" and c["trigger_time"] > after and c["kind"] == "CHECKPOINT"
            ]
            if done:
                c = min(done, key=lambda c: c["checkpoint_id"])
                return {
                    "checkpoint_id": c["checkpoint_id"],
                    "trigger_time": c["trigger_time"],
                    "duration_s": c["duration_s"],
                    "size_bytes": c["size_bytes"],
                    "task_state_bytes": sum(t["state_size_bytes"] for t in c["tasks"]),
                }
            time.sleep(0.5)
        raise BenchError(f"job {job_id}: no checkpoint completed within {timeout_s:.0f} s")

    # Memory under a slow sink ---------------------------------------------------------------------------

    def memory(self) -> None:
        with self.phase_cluster("memory"):
            self._memory()

    def _memory(self) -> None:
        log(f"memory: slow sink ({SLOW_SINK_DELAY_MS} ms per window result) for {self.plan.memory_s:.0f} s")
        sampler = ProcessSampler(interval_s=0.5, keep_series=True)
        sampler.track({k: v for k, v in self.cluster.process_pids().items() if k.startswith("taskmanager")})
        sampler.start()
        job_id = self.cluster.submit(
            JOBS_DIR / "slow_sink.py",
            {
                "source.topic": self.input_topic,
                "sink.delay_ms": str(SLOW_SINK_DELAY_MS),
                "checkpointing.interval": "1s",
            },
            WORKERS,
        )
        try:
            self.cluster.wait_job(
                job_id, lambda s: bool(s.tasks) and all(t.state == "RUNNING" for t in s.tasks), 120, "all tasks RUNNING"
            )
            started = time.monotonic()
            time.sleep(self.plan.memory_s / 2)
            consumed_half = self.cluster.source_records_read(job_id, "events-source")
            time.sleep(self.plan.memory_s / 2)
            consumed_total = self.cluster.source_records_read(job_id, "events-source")
            second_half_s = time.monotonic() - started - self.plan.memory_s / 2
        finally:
            self.cluster.cancel(job_id)
            sampler.stop()
        self.results["memory"] = memory_verdict(
            sampler, consumed_total - consumed_half, second_half_s, consumed_total >= self.plan.events
        )
        self.results["memory"]["duration_s"] = self.plan.memory_s
        m = self.results["memory"]
        log(
            f"  max growth {m['max_growth_bytes'] / 2**20:.1f} MiB, flat: {m['flat']}, "
            f"source {m['source_eps']:,.0f} events/s"
        )

    # Recovery -------------------------------------------------------------------------------------------

    def recovery(self) -> None:
        """SIGKILL a TaskManager under load, once per throughput run (a fresh job each time); the kill
        with the median recovery time is reported, every kill's time beside it."""
        weir = self.weir("weir") or self.weir("weir-kafka")
        if weir is None:
            return
        rate = (self.median_rate_any(weir.key) or DEFAULT_RATE_EPS) / 2
        kills = [self._recovery_kill(weir, rate, n) for n in range(1, self.plan.runs + 1)]
        measured = sorted((k for k in kills if k["recovery_s"] is not None), key=lambda k: k["recovery_s"])
        chosen = measured[(len(measured) - 1) // 2] if measured else kills[-1]
        self.results["recovery"] = {**chosen, "rate_eps": rate, "kills_recovery_s": [k["recovery_s"] for k in kills]}

    def _recovery_kill(self, weir: WeirContender, rate: float, n: int) -> dict[str, Any]:
        topics = Topics(self.topic(f"rec{n}-in"), self.topic(f"rec{n}-out"))
        dataset.create_topics(self.endpoints, {topics.input: dataset.PARTITIONS, topics.output: dataset.PARTITIONS})
        log(f"recovery {n}/{self.plan.runs}: {weir.label} at {rate:,.0f} events/s, SIGKILL of a TaskManager")
        budget = 90 + self.plan.recovery_after_kill_s
        running = weir.start(topics, bounded=False, tag=f"rec{n}")
        try:
            with (
                watch_output(self.endpoints.kafka_bootstrap, topics.output) as watcher,
                background_producer(self.endpoints.kafka_bootstrap, topics.input, rate, budget),
            ):
                rec = self._recovery_run(running)
            seen = watcher.seen
        finally:
            running.stop(ProcessSampler())
        after = [received for _k, _w, received in seen if received / 1000.0 > rec["restore_at"]]
        rec["first_output_after_restore_at"] = min(after) / 1000.0 if after else None
        rec["recovery_s"] = rec["first_output_after_restore_at"] - rec["killed_at"] if after else None
        rec["output_records"] = len(seen)
        log(
            f"  killed {rec['killed']}: restore scheduled after {rec['restore_scheduled_s']:.2f} s, "
            f"first committed output after {rec['recovery_s'] or float('nan'):.2f} s"
        )
        return rec

    def _recovery_run(self, running: WeirRunning) -> dict[str, Any]:
        cluster = running.cluster  # the run's own, started with the job
        status = cluster.wait_job(
            running.job_id, lambda s: (s.last_completed_checkpoint or 0) >= 3, 120, "3 completed checkpoints"
        )
        hosts = sorted({t.taskmanager_id for t in status.tasks if "sink" in t.operator_names})
        victim = "taskmanager-2" if "taskmanager-2" in hosts or not hosts else hosts[0]
        killed_at = time.time()
        kill_process(cluster.directory, victim)
        restored = cluster.wait_job(
            running.job_id,
            lambda s: (s.last_restore_at or 0) > killed_at,
            60,
            "a restore after the SIGKILL",
        )
        restore_at = restored.last_restore_at or killed_at
        checkpoint_at_restore = restored.last_completed_checkpoint or 0
        cluster.wait_job(
            running.job_id,
            lambda s: (s.last_completed_checkpoint or 0) > checkpoint_at_restore,
            self.plan.recovery_after_kill_s + 30,
            "a checkpoint after the restore",
        )
        time.sleep(LATENCY_DRAIN_S)
        cluster.wait_all_taskmanagers()
        final = cluster.wait_job(running.job_id, lambda s: True, 30, "a status")
        return {
            "killed": victim,
            "killed_at": killed_at,
            "restore_at": restore_at,
            "restore_scheduled_s": restore_at - killed_at,
            "restarts_before_kill": status.summary.restarts,
            "restarts_after_kill": final.summary.restarts - status.summary.restarts,
            "last_restore_after_kill_s": (final.last_restore_at or restore_at) - killed_at,
        }


# Helpers of the phases ----------------------------------------------------------------------------------


def reads_only(contender: Contender) -> bool:
    """The ceiling: it reads the input and writes nothing."""
    return isinstance(contender, ProcessGroupContender) and contender.reads_only


def read_check(read: int, expected: int) -> dict[str, Any]:
    """The ceiling's check: every input record read (events and sentinels), none twice (it reads
    only: its count is all there is to check)."""
    ok = read == expected
    return {
        "ok": ok,
        "records_read": read,
        "expected_records": expected,
        "summary": f"{read:,} of {expected:,} records read" + ("" if ok else " (**not all**)"),
    }


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``condition`` until true; answers the wall-clock time it became true."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"waited {timeout_s:.0f} s for {what} in vain")
        time.sleep(0.2)
    return time.time()


def produce_keys(endpoints: Any, topic: str, indexes: range) -> None:
    from weir.connectors import kafka

    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000)
    for n, i in enumerate(indexes):
        key = f"k{i:07d}"
        while True:
            try:
                producer.produce(topic, value=f'{{"key":"{key}"}}'.encode(), key=key.encode(), partition=i % 8)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 20_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise BenchError(f"could not produce the keys into {topic}")


class _Watcher:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, float]] = []


@contextlib.contextmanager
def watch_output(bootstrap: str, topic: str) -> Iterator[_Watcher]:
    """A read_committed consumer of ``topic`` in its own process; ``seen`` is filled on exit."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=dataset.output_watcher, args=(bootstrap, topic, child), daemon=True)
    process.start()
    watcher = _Watcher()
    try:
        yield watcher
    finally:
        parent.send("stop")
        if parent.poll(120):
            watcher.seen = parent.recv()
        process.join(10)
        if process.is_alive():
            process.kill()


def run_producer(bootstrap: str, topic: str, rate: float, duration_s: float) -> dict[str, Any]:
    """Paced production in its own process; answers what :func:`dataset.paced_producer` sends back."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=dataset.paced_producer, args=(bootstrap, topic, rate, duration_s, child), daemon=True)
    process.start()
    if not parent.poll(duration_s + 120):
        process.kill()
        raise BenchError(f"the paced producer into {topic} did not report back")
    result: dict[str, Any] = parent.recv()
    process.join(10)
    return result


@contextlib.contextmanager
def background_producer(bootstrap: str, topic: str, rate: float, duration_s: float) -> Iterator[None]:
    """Paced production for at most ``duration_s``, stopped when the block ends."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=dataset.paced_producer, args=(bootstrap, topic, rate, duration_s, child), daemon=True)
    process.start()
    try:
        yield
    finally:
        process.terminate()
        process.join(10)


def memory_verdict(sampler: ProcessSampler, consumed: int, elapsed_s: float, exhausted: bool) -> dict[str, Any]:
    """Flat: over the run, no TaskManager's RSS grows by more than max(32 MiB, 10 %) from the second
    quarter (warm) to the last quarter (median RSS of each). ``consumed`` events in ``elapsed_s``: the
    source's pace over the second half of the run, once the channels' buffers are full."""
    per_process: dict[str, Any] = {}
    max_growth = 0
    flat = True
    for usage in sampler.usage.values():
        series = [rss for _t, rss in usage.rss_series]
        if len(series) < 8:
            continue
        q = len(series) // 4
        warm = sorted(series[q : 2 * q])[q // 2]
        last = sorted(series[3 * q :])[len(series[3 * q :]) // 2]
        growth = last - warm
        allowed = max(32 * 2**20, int(0.10 * warm))
        per_process[usage.name] = {
            "warm_rss_bytes": warm,
            "last_rss_bytes": last,
            "peak_rss_bytes": usage.peak_rss_bytes,
            "growth_bytes": growth,
            "flat": growth <= allowed,
            "series_mb": [round(rss / 2**20, 1) for rss in series],
        }
        max_growth = max(max_growth, growth)
        flat = flat and growth <= allowed
    return {
        "sink_delay_ms": SLOW_SINK_DELAY_MS,
        "source_events": consumed,
        "source_eps": consumed / elapsed_s if elapsed_s else 0.0,
        "input_exhausted": exhausted,
        "max_growth_bytes": max_growth,
        "flat": flat and bool(per_process),
        "taskmanagers": per_process,
    }


# Main ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200k events, 3 runs, short phases")
    parser.add_argument("--only", default=",".join(PHASES), help=f"phases to run, of {', '.join(PHASES)}")
    parser.add_argument("--contenders", default=",".join(CONTENDER_KEYS), help=f"of {', '.join(CONTENDER_KEYS)}")
    parser.add_argument("--events", type=int, help="override the data set size")
    parser.add_argument("--runs", type=int, help="override the number of throughput runs")
    parser.add_argument("--state-keys", type=int, help="override the keys of the checkpoint phase")
    parser.add_argument(
        "--load-wait",
        type=float,
        help="seconds the load gate waits before each throughput run for the load average to fall to the "
        "core count (default: full 180, quick 60); past it the run is marked under load",
    )
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where results.{json,md} and chart.png go")
    args = parser.parse_args(argv)
    phases = [p for p in args.only.split(",") if p]
    keys = [k for k in args.contenders.split(",") if k]
    for name, chosen, valid in (("phase", phases, PHASES), ("contender", keys, CONTENDER_KEYS)):
        unknown = sorted(set(chosen) - set(valid))
        if unknown:
            parser.error(f"unknown {name} {', '.join(unknown)}: valid are {', '.join(valid)}")
    plan = QUICK if args.quick else FULL
    plan = Plan(
        **{
            **asdict(plan),
            **({"events": args.events} if args.events else {}),
            **({"runs": args.runs} if args.runs else {}),
            **({"state_keys": args.state_keys} if args.state_keys else {}),
            **({"load_wait_s": args.load_wait} if args.load_wait is not None else {}),
        }
    )
    if plan.runs < 3:
        log(f"{plan.runs} run(s): no median of 3, the spread says little (the results say so too)")

    run_id = new_run_id()
    ensure_services(Endpoints.from_env())
    env = prepare_environment(run_id, checkpoints_in_s3=True)
    if "flink" in keys and (problem := flink_s3_problem(env.checkpoint_uri, env.endpoints, os.environ)):
        raise BenchError(problem)
    log(
        f"run {run_id}: {'quick' if args.quick else 'full'}, phases {', '.join(phases)}; "
        f"checkpoints {env.checkpoint_uri}"
    )
    document: dict[str, Any] = {
        "benchmark": "keyed",
        "run_id": run_id,
        "quick": args.quick,
        "provenance": provenance.collect(REPO_ROOT),
        "plan": asdict(plan),
        "phases": phases,
        "contenders": {},
        "unavailable": {},
    }
    for key, available, name in (("quix", quix_available, "Quix Streams"), ("flink", flink_available, "Apache Flink")):
        problem = available() if key in keys else None
        if problem is not None:
            log(f"{name} cannot run here: {problem}")
            document["unavailable"][key] = problem
            keys.remove(key)

    try:
        contenders: list[Contender] = []
        for key in keys:
            if key == "weir":
                contenders.append(WeirContender("weir", "Weir (Kafka + PostgreSQL)", env, with_postgres=True))
            elif key == "weir-kafka":
                contenders.append(WeirContender("weir-kafka", "Weir (Kafka only)", env, with_postgres=False))
            elif key == "weir-columnar":
                contenders.append(
                    WeirContender(
                        "weir-columnar", "Weir columnar (Kafka only)", env, with_postgres=False, columnar=True
                    )
                )
            elif key == "quix":
                contenders.append(quix_contender(env.endpoints, env.run_root, run_id))
            elif key == "raw":
                contenders.append(raw_contender(env.endpoints, env.run_root, run_id))
            elif key == "flink":
                contenders.append(flink_contender(env.endpoints, env.run_root, run_id, env.checkpoint_uri))
            elif key == "ceiling":
                contenders.append(ceiling_contender(env.endpoints, env.run_root, run_id))
        document["contenders"] = {c.key: describe(c) for c in contenders}
        runner = Runner(plan, args.quick, env, contenders)
        document["s3_server_pid_found"] = runner.s3_pid is not None
        try:
            if {"throughput", "memory"} & set(phases):
                runner.produce_input()
            for phase in PHASES:
                if phase in phases:
                    try:
                        getattr(runner, phase)()
                    except BenchError as exc:
                        log(f"{phase} failed: {exc}")
                        runner.results[phase] = {"error": str(exc)}
        finally:
            document.update(runner.results)
            cleanup(runner, contenders)
    finally:
        with contextlib.suppress(Exception):
            remove_checkpoints(env)
        remove_run_root(env, keep=_has_errors(document))
    provenance.finish(document["provenance"])
    report.write(document, args.results)
    log(f"wrote {args.results / 'results.md'}, results.json, chart.png")
    print((args.results / "results.md").read_text())
    return 0


def _has_errors(document: dict[str, Any]) -> bool:
    """Whether any phase or run failed (or the run stopped before its results were in)."""
    if not any(phase in document for phase in document.get("phases", [])):
        return True
    for phase in document.get("phases", []):
        value = document.get(phase) or {}
        if "error" in value:
            return True
        if phase in ("throughput", "latency"):
            for entry in value.values():
                runs = entry.get("runs", [entry]) if isinstance(entry, dict) else []
                if any("error" in r for r in runs):
                    return True
    return False


def cleanup(runner: Runner, contenders: list[Contender]) -> None:
    for c in contenders:
        if isinstance(c, WeirContender):
            with contextlib.suppress(Exception):
                c.cleanup()
    with contextlib.suppress(Exception):
        deleted = dataset.delete_topics_containing(runner.endpoints, runner.run_id)
        log(f"deleted {len(deleted)} topics of run {runner.run_id}")
    with contextlib.suppress(Exception):
        delete_groups(runner.endpoints, runner.run_id)


def delete_groups(endpoints: Any, marker: str) -> None:
    from weir.connectors import kafka

    client = kafka.admin(endpoints)
    listed = client.list_consumer_groups().result(timeout=10)
    groups = [g.group_id for g in listed.valid if marker in g.group_id]
    if groups:
        for future in client.delete_consumer_groups(groups).values():
            with contextlib.suppress(Exception):
                future.result(timeout=10)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)
