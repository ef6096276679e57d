"""Recovery under load (issue 16, item 4): SIGKILL of a TaskManager to the first committed output
after the restore, median of several kills, on live input at half the sustained rate.

``make bench-recovery`` (``.venv/bin/python -m bench.recovery_bench [--kills 5] [--rate N] [--quick]``)
starts a private cluster (bench.harness) and runs examples/keyed_aggregation.py (Kafka sink and
PostgreSQL two-phase sink, parallelism 3, a checkpoint every ``--interval``) unbounded, on events
produced live at ``--rate`` events/s by a separate process. The default rate is half of
:data:`SUSTAINED_EPS`, the figure documented in docs/benchmarks.md for this job; pass ``--rate``
for another machine.

Per kill: wait until the job is RUNNING with a completed checkpoint since the previous restore and
committed output arriving, then SIGKILL a TaskManager that hosts tasks (rotating which, by name),
and measure from the kill:

- **RUNNING again**: the job's status RUNNING with a restore later than the kill (polled every 0.1 s);
- **first committed output**: the first record of the Kafka sink topic, read ``read_committed``,
  received after the trigger of the first checkpoint after the restore, at an offset beyond the
  partition's last stable offset when the restore is first seen: new output, committed with that
  checkpoint. Beside it: the first record beyond those offsets at all (``..._any_s``), which also
  counts a transaction of the failed attempt the restored sink commits or produces again while it
  recovers, and (JSON only) the first beyond the last stable offset at the kill, which records a
  surviving sink flushed just after the kill and committed with a checkpoint the dead TaskManager had
  acknowledged also satisfy;
- **first checkpoint after the restore**: its completion (trigger + duration) from ``weir checkpoints``.

The supervisor restarts the killed TaskManager at once (its restart delay is a crash loop's back-off;
the JobManager restarts in its warm spare, ``weir.tools.warm_spare``) and the next kill waits for
all three alive. The job runs ``restart.strategy=fixed-delay``, ``restart.delay=100ms`` (the
default, exponential-delay, backs off 1 s first).

At the end the producer stops, one event per source partition far ahead in event time fires every
window, the job commits them and is cancelled, and ``weir.tools.verify.verify_job`` compares both
sinks with reference mode: exact means no duplicates, mismatches, unexpected results or open
transactions, and missing only the flush events' own windows (never fired).

Results: ``bench/results/recovery.json`` and ``recovery.md``, with the commit and the load average
at the start and end of the run (the machine may be shared); the target (median kill -> first
committed output < 2 s) is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bench import provenance
from bench.harness import (
    REPO_ROOT,
    BenchCluster,
    BenchError,
    ensure_services,
    host_summary,
    log,
    new_run_id,
    prepare_environment,
    private_cluster,
    publish_results,
    remove_checkpoints,
    remove_run_root,
)

KEYED_JOB: Final = REPO_ROOT / "examples" / "keyed_aggregation.py"
# docs/benchmarks.md, `make bench-backpressure`: examples/keyed_aggregation.py -p 3, Kafka sink,
# checkpoint every 1 s, aligned: 49.3k and 47.2k events/s (median 48.25k).
SUSTAINED_EPS: Final = 48_000
TARGET_S: Final = 2.0
JOBMANAGER_TARGET_S: Final = 3.0
SOURCE_PARTITIONS: Final = 6
SINK_PARTITIONS: Final = 3
KEYS: Final = 400
EVENTS_PER_MS: Final = 10  # weir.tools.events: event time advances 1 ms per 10 events
FLUSH_AHEAD_MS: Final = 10_000
TASKMANAGER_NAMES: Final = ("taskmanager-1", "taskmanager-2", "taskmanager-3")
METRICS: Final = (
    "kill_to_running_s",
    "kill_to_first_committed_s",
    "kill_to_first_checkpoint_s",
    "kill_to_first_committed_any_s",
)
METRIC_LABELS: Final = {
    "kill_to_running_s": "kill -> job RUNNING again",
    "kill_to_first_committed_s": "kill -> first committed new output (Kafka, read_committed)",
    "kill_to_first_checkpoint_s": "kill -> first checkpoint completed after the restore",
    "kill_to_first_committed_any_s": "kill -> first committed record of the restored attempt, old output included",
}


# Pure parts (unit-tested) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One committed record of the sink topic as the read_committed consumer received it."""

    partition: int
    offset: int
    received_at: float  # wall clock, time.time()


def first_committed_after(records: Iterable[Seen], end_offsets: Mapping[int, int], after: float) -> float | None:
    """When the first record beyond ``end_offsets`` (per partition: the committed end, the last
    stable offset a read_committed consumer is given as its high watermark) was received no earlier
    than ``after``; None if none was."""
    times = [r.received_at for r in records if r.offset >= end_offsets.get(r.partition, 0) and r.received_at >= after]
    return min(times) if times else None


def summarize(values: Sequence[float | None]) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    if not present:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(present), "median": statistics.median(present), "min": min(present), "max": max(present)}


def next_victim(hosts: Iterable[str], kill_number: int) -> str:
    """The kill_number-th TaskManager in name rotation, or the next one after it that hosts tasks."""
    hosting = set(hosts)
    for step in range(len(TASKMANAGER_NAMES)):
        name = TASKMANAGER_NAMES[(kill_number + step) % len(TASKMANAGER_NAMES)]
        if name in hosting or not hosting:
            return name
    return sorted(hosting)[0]


def exactness(sinks: Sequence[Mapping[str, Any]], flush_windows: int) -> bool:
    """Exact: no duplicates, unexpected, mismatched results or open transactions in any sink, and
    missing only the flush events' windows (the flush events never have a later watermark)."""
    return bool(sinks) and all(
        s["duplicates"] == 0
        and s["unexpected"] == 0
        and s["mismatched"] == 0
        and not s["open_transactions"]
        and s["missing"] == flush_windows
        for s in sinks
    )


PHASES: Final = (
    ("detected", "failure detected (job_status_changed to RESTARTING)"),
    ("scheduled", "last deployment scheduled (job_scheduled)"),
    ("deployed", "last task deployed on its TaskManager (task_deployed)"),
    ("tasks_restored", "last task restored its state (task_restored)"),
    ("sinks_recovered", "last sink recovered (kafka/postgres_sink_recovered)"),
    ("checkpoint_triggered", "first checkpoint after the restore triggered"),
    ("checkpoint_completed", "that checkpoint completed"),
    ("kafka_committed", "first Kafka sink commit (sink_transaction_committed)"),
)


def parse_log_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The structured (JSON) lines of a JobManager or TaskManager log, each with ``at`` (epoch s)."""
    from datetime import datetime

    out = []
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
            entry["at"] = datetime.fromisoformat(entry["timestamp"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        out.append(entry)
    return out


def recovery_phases(entries: Iterable[Mapping[str, Any]], killed_at: float, until: float) -> dict[str, float | None]:
    """Seconds from the kill to each step of the recovery, from the logs' events in [killed_at, until):
    detection, the last (re)scheduling and task restore and sink recovery before the first
    checkpoint after the kill, that checkpoint's trigger and completion, the first Kafka commit after it."""
    window = sorted((e for e in entries if killed_at <= e["at"] < until), key=lambda e: e["at"])

    def first(event: str, after: float = killed_at, **match: Any) -> float | None:
        return next((e["at"] for e in window if e["event"] == event and e["at"] >= after and _matches(e, match)), None)

    def last_before(events: tuple[str, ...], before: float | None) -> float | None:
        times = [e["at"] for e in window if e["event"] in events and (before is None or e["at"] < before)]
        return max(times) if times else None

    # The first checkpoint triggered after the kill that completed (one the failed attempt triggered
    # before the restart never does).
    triggers = {e.get("checkpoint_id"): e["at"] for e in window if e["event"] == "checkpoint_triggered"}
    completed = next(
        (e for e in window if e["event"] == "checkpoint_completed" and e.get("checkpoint_id") in triggers), None
    )
    triggered = None if completed is None else triggers[completed.get("checkpoint_id")]
    at = {
        "detected": min(
            (t for t in (first("job_restarting"), first("job_status_changed", status="RESTARTING")) if t is not None),
            default=None,
        ),
        "scheduled": last_before(("job_scheduled",), triggered),
        "deployed": last_before(("task_deployed",), triggered),
        "tasks_restored": last_before(("task_restored",), triggered),
        "sinks_recovered": last_before(("kafka_sink_recovered", "postgres_sink_recovered"), triggered),
        "checkpoint_triggered": triggered,
        "checkpoint_completed": None if completed is None else completed["at"],
        "kafka_committed": None
        if triggered is None
        else first("sink_transaction_committed", triggered, operator_uid="kafka-sink"),
    }
    return {k: None if v is None else round(v - killed_at, 3) for k, v in at.items()}


def _matches(entry: Mapping[str, Any], match: Mapping[str, Any]) -> bool:
    return all(entry.get(k) == v for k, v in match.items())


def _load(value: Sequence[float] | None) -> str:
    return "-" if not value else " / ".join(f"{v:.2f}" for v in value)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def render_markdown(document: Mapping[str, Any]) -> str:
    stats = document["summary"]
    first = stats["kill_to_first_committed_s"]
    verdict = "not measured" if first["median"] is None else ("met" if document["target_met"] else "**missed**")
    lines = [
        "# Recovery under load (`make bench-recovery`)",
        "",
        provenance.markdown_line(document.get("provenance")),
        "",
        f"Run {document['run_id']} on {document['host']['machine']} ({document['host']['cpus']} CPUs), "
        f"commit {document['commit']}, {document['date']}; load average (1, 5, 15 min) at the start "
        f"{_load(document.get('load_average_at_start'))}, at the end {_load(document.get('load_average_at_end'))}.",
        "",
        f"examples/keyed_aggregation.py -p 3 (Kafka + PostgreSQL two-phase sinks), live input at "
        f"{document['rate_eps']:,} events/s (half of {document['sustained_eps']:,}; produced "
        f"{document.get('produced_eps', 0):,.0f} events/s on average), checkpoint every "
        f"{document['checkpoint_interval']}, restart.strategy=fixed-delay, restart.delay="
        f"{document['restart_delay']}; {len(document['kills'])} SIGKILLs of a TaskManager.",
        "",
        "| metric | median | min | max |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {METRIC_LABELS[m]} | {_fmt(stats[m]['median'])} | {_fmt(stats[m]['min'])} | {_fmt(stats[m]['max'])} |"
            for m in METRICS
        ),
        "",
        f"Target: median kill -> first committed output < {TARGET_S:g} s: {verdict}.",
        "",
        "| kill | TaskManager | RUNNING again | first committed new output | first checkpoint after restore "
        "| first committed, old output included | restarts |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {i} | {k['victim']} | {_fmt(k['kill_to_running_s'])} | {_fmt(k['kill_to_first_committed_s'])} "
            f"| {_fmt(k['kill_to_first_checkpoint_s'])} | {_fmt(k.get('kill_to_first_committed_any_s'))} "
            f"| {k['restarts']} |"
            for i, k in enumerate(document["kills"], 1)
        ),
        "",
    ]
    phases = document.get("phases_summary")
    if phases:
        lines += [
            "Where the time goes (from the JobManager and TaskManager logs; seconds after the kill):",
            "",
            "| step | median | min | max |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| {label} | {_fmt(phases[name]['median'])} | {_fmt(phases[name]['min'])} "
                f"| {_fmt(phases[name]['max'])} |"
                for name, label in PHASES
                if name in phases
            ),
            "",
        ]
    jm = document.get("jobmanager_summary")
    if jm and jm["kill_to_running_s"]["n"]:
        running, serving, after = jm["kill_to_running_s"], jm["kill_to_serving_s"], jm["serving_to_running_s"]
        lines += [
            f"JobManager kills ({running['n']}, SIGKILL; the supervisor starts it again at once, in its warm "
            "spare when one is ready):",
            "",
            "| metric | median | min | max |",
            "| --- | ---: | ---: | ---: |",
            f"| kill -> job RUNNING again, a newer attempt | {_fmt(running['median'])} | {_fmt(running['min'])} "
            f"| {_fmt(running['max'])} |",
            f"| kill -> restarted JobManager serving (`jobmanager_started`) | {_fmt(serving['median'])} "
            f"| {_fmt(serving['min'])} | {_fmt(serving['max'])} |",
            f"| restarted JobManager serving -> job RUNNING again | {_fmt(after['median'])} | {_fmt(after['min'])} "
            f"| {_fmt(after['max'])} |",
            "",
            f"Target: {document['jobmanager_target']}: "
            + ("met" if running["median"] is not None and running["median"] < JOBMANAGER_TARGET_S else "**missed**")
            + ".",
            "",
        ]
    check = document.get("verify")
    if check is not None:
        lines.append(
            f"Output after the run: {'exact' if check['exact'] else '**not exact**'} "
            f"({check['events']:,} events; per sink: "
            + "; ".join(
                f"{s['uid']} {s['found']:,} found, {s['duplicates']} duplicate(s), {s['missing']} missing "
                f"(the {check['flush_windows']} flush windows expected), {s['unexpected']} unexpected, "
                f"{s['mismatched']} mismatched, {len(s['open_transactions'])} open transaction(s)"
                for s in check["sinks"]
            )
            + ")."
        )
        lines.append("")
    return "\n".join(lines)


# The live parts ------------------------------------------------------------------------------------


def _produce(bootstrap: str, topic: str, rate: float, start_ms: int, stop: Any, written: Any, elapsed: Any) -> None:
    """In a child process: weir.tools.events' events (400 keys, 10 per ms of event time) at ``rate``
    events/s, on schedule, until ``stop`` is set; ``written`` and ``elapsed`` answer how many in how
    long. Formatted by hand, without a per-record delivery callback: events.produce_events spends
    enough CPU per event to fall short of the rate on a busy two-core machine."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True, "log_level": 3})
    keys = [f"key-{k:04d}" for k in range(KEYS)]
    encoded = [k.encode() for k in keys]
    started = time.monotonic()
    i = 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while i < due:
            k = i % KEYS
            value = f'{{"id":"e{i}","key":"{keys[k]}","value":{i % 97},"ts":{start_ms + i // EVENTS_PER_MS}}}'
            try:
                producer.produce(topic, value=value.encode(), key=encoded[k])
            except BufferError:
                producer.poll(0.01)
                continue
            i += 1
        producer.poll(0.005)
    elapsed.value = time.monotonic() - started
    if producer.flush(60):
        raise RuntimeError(f"events not delivered to {topic}")
    written.value = i


class CommittedWatcher:
    """A read_committed consumer of the sink topic on a thread, from the start of every partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"recovery-bench-{topic}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
                "log_level": 3,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(SINK_PARTITIONS)])
        self._topic = topic
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="committed-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._consumer.consume(1000, timeout=0.05)
            now = time.time()
            got = [Seen(m.partition(), m.offset(), now) for m in batch if m.error() is None]
            with self._lock:
                self.seen.extend(got)

    def records(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def high_watermarks(self) -> dict[int, int]:
        """Per partition, as this read_committed consumer sees it: the last stable offset (the end of
        the committed records; an open transaction's records lie beyond it)."""
        from confluent_kafka import TopicPartition

        return {
            p: self._consumer.get_watermark_offsets(TopicPartition(self._topic, p), timeout=5, cached=False)[1]
            for p in range(SINK_PARTITIONS)
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


@dataclass(frozen=True)
class Plan:
    kills: int = 5
    rate: int = SUSTAINED_EPS // 2
    interval: str = "1s"
    restart_delay: str = "100ms"
    warmup_s: float = 10.0  # before the first kill
    settle_s: float = 3.0  # committed output received within this long before a kill
    after_restore_s: float = 10.0  # since the previous RUNNING again: the backlog of the outage drained
    recovery_timeout_s: float = 60.0
    jobmanager_kills: int = 3  # after the TaskManager kills


def run(cluster: BenchCluster, run_id: str, plan: Plan) -> dict[str, Any]:
    import psycopg
    from confluent_kafka import Producer

    from weir.connectors import kafka
    from weir.tools.supervisor import kill_process
    from weir.tools.verify import verify_job

    endpoints = cluster.env.endpoints
    unique = run_id.replace("-", "_")
    source, sink, dlq, table = (
        f"rec-{run_id}-events",
        f"rec-{run_id}-results",
        f"rec-{run_id}-dlq",
        f"window_results_rec_{unique}",
    )
    kafka.create_topics(endpoints, {source: SOURCE_PARTITIONS, sink: SINK_PARTITIONS, dlq: 1}, replace=True)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(
            f"CREATE TABLE {table} (key text, window_start bigint, window_end bigint, count bigint, sum bigint, "
            "PRIMARY KEY (key, window_start))"
        )
    params = {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "checkpointing.interval": plan.interval,
        "restart.strategy": "fixed-delay",
        "restart.delay": plan.restart_delay,
    }
    ctx = multiprocessing.get_context("spawn")
    stop, written, elapsed = ctx.Event(), ctx.Value("q", 0), ctx.Value("d", 0.0)
    start_ms = int(time.time()) * 1000
    producer = ctx.Process(
        target=_produce,
        args=(endpoints.kafka_bootstrap, source, plan.rate, start_ms, stop, written, elapsed),
        daemon=True,
    )
    watcher = CommittedWatcher(endpoints.kafka_bootstrap, sink)
    kills: list[dict[str, Any]] = []
    jobmanager_kills: list[dict[str, Any]] = []
    try:
        producer.start()
        log(f"producing {plan.rate:,} events/s into {source}; submitting the keyed aggregation")
        job_id = cluster.submit(KEYED_JOB, params, parallelism=3)
        cluster.wait_job(job_id, lambda s: s.summary.status == "RUNNING", 120, "RUNNING")
        time.sleep(plan.warmup_s)
        last_restore = 0.0
        for n in range(plan.kills):
            kills.append(_one_kill(cluster, watcher, job_id, n, last_restore, plan, kill_process))
            last_restore = kills[-1]["running_at"] or time.time()
        for n in range(plan.jobmanager_kills):
            jobmanager_kills.append(_kill_jobmanager(cluster, job_id, n, last_restore, plan, kill_process))
            last_restore = jobmanager_kills[-1]["running_at"] or time.time()
        stop.set()
        producer.join(30)
        events = int(written.value)
        produced_eps = events / elapsed.value if elapsed.value else 0.0
        flush_ts = start_ms + (events - 1) // EVENTS_PER_MS + FLUSH_AHEAD_MS
        log(
            f"producer stopped after {events:,} events ({produced_eps:,.0f} events/s); "
            f"flushing the windows (event time {flush_ts})"
        )
        flusher = Producer({"bootstrap.servers": endpoints.kafka_bootstrap, "log_level": 3})
        for p in range(SOURCE_PARTITIONS):
            event = {"id": f"flush-{p}", "key": f"flush-{p}", "value": 0, "ts": flush_ts}
            flusher.produce(source, json.dumps(event).encode(), key=event["key"].encode(), partition=p)
        flusher.flush(30)
        verify = _drain_and_verify(cluster, watcher, job_id, params, events, verify_job)
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(10)
        if producer.is_alive():
            producer.kill()
        watcher.close()
    kafka.delete_topics(endpoints, [source, sink, dlq])
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    return {
        "job_id": job_id,
        "produced_eps": produced_eps,
        "kills": kills,
        "jobmanager_kills": jobmanager_kills,
        "verify": verify,
    }


def _one_kill(
    cluster: BenchCluster,
    watcher: CommittedWatcher,
    job_id: str,
    n: int,
    last_restore: float,
    plan: Plan,
    kill_process: Any,
) -> dict[str, Any]:
    if last_restore:
        time.sleep(max(0.0, last_restore + plan.after_restore_s - time.time()))
    cluster.wait_all_taskmanagers(120)
    base = cluster.client.list_checkpoints(job_id)
    baseline = max((c.checkpoint_id for c in base if c.status.value == "COMPLETED"), default=0)
    status = cluster.wait_job(
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and all(t.state is not None and t.state.name == "RUNNING" for t in s.tasks)
            and (s.last_completed_checkpoint or 0) > baseline
        ),
        120,
        "RUNNING with a new completed checkpoint",
    )
    # Output flowing: committed records received in the last seconds.
    deadline = time.monotonic() + 60
    while not any(r.received_at > time.time() - plan.settle_s for r in watcher.records()):
        if time.monotonic() > deadline:
            raise BenchError("no committed output for 60 s before a kill")
        time.sleep(0.1)
    hosts = {t.taskmanager_id for t in status.tasks}
    victim = next_victim(hosts, n)
    killed_at = time.time()
    kill_process(cluster.directory, victim)
    end_offsets = watcher.high_watermarks()
    log(f"kill {n + 1}/{plan.kills}: SIGKILL {victim} (hosts {sorted(hosts)}), last stable offsets {end_offsets}")
    running_at: float | None = None
    restore_at: float | None = None
    restore_seen_at: float | None = None
    restore_offsets: dict[int, int] = {}
    first_committed: float | None = None
    first_late: float | None = None
    first_checkpoint: float | None = None
    first_trigger: float | None = None
    first_any: float | None = None
    deadline = time.monotonic() + plan.recovery_timeout_s
    while time.monotonic() < deadline and (running_at is None or first_committed is None or first_checkpoint is None):
        s = cluster.status(job_id)
        now = time.time()
        if s is not None and s.summary.status in ("FAILED", "CANCELED", "FINISHED"):
            raise BenchError(f"job {job_id} ended {s.summary.status} after the kill: {s.failure}")
        if restore_seen_at is None and s is not None and (s.last_restore_at or 0) > killed_at:
            # The failed attempt's records are all in the log by now (its tasks are cancelled before
            # the restore): what lies beyond, once committed, is the restored attempt's output.
            restore_seen_at, restore_offsets = now, watcher.high_watermarks()
        if (
            running_at is None
            and s is not None
            and (s.last_restore_at or 0) > killed_at
            and s.summary.status == "RUNNING"
            and all(t.state is not None and t.state.name == "RUNNING" for t in s.tasks)
        ):
            running_at, restore_at = now, s.last_restore_at
        records = watcher.records()
        if first_late is None:
            first_late = first_committed_after(records, end_offsets, killed_at)
        if first_any is None and restore_seen_at is not None:
            first_any = first_committed_after(records, restore_offsets, restore_seen_at)
        if first_checkpoint is None and running_at is not None:
            after = sorted(
                (c.trigger_time, c.trigger_time + c.duration_s)
                for c in cluster.client.list_checkpoints(job_id)
                if c.status.value == "COMPLETED" and restore_at is not None and c.trigger_time >= restore_at
            )
            if after:
                first_trigger, first_checkpoint = after[0]
        if first_committed is None and first_trigger is not None:
            # New output: committed with the first checkpoint after the restore (a transaction the
            # restored sink commits or produces again while it recovers is older output).
            first_committed = first_committed_after(records, restore_offsets, first_trigger)
        time.sleep(0.05)
    final = cluster.status(job_id)
    record = {
        "victim": victim,
        "killed_at": killed_at,
        "restore_at": restore_at,
        "running_at": running_at,
        "kill_to_restore_scheduled_s": None if restore_at is None else restore_at - killed_at,
        "kill_to_running_s": None if running_at is None else running_at - killed_at,
        "kill_to_first_committed_s": None if first_committed is None else first_committed - killed_at,
        "kill_to_first_checkpoint_s": None if first_checkpoint is None else first_checkpoint - killed_at,
        "kill_to_first_committed_beyond_kill_offsets_s": None if first_late is None else first_late - killed_at,
        "kill_to_first_committed_any_s": None if first_any is None else first_any - killed_at,
        "kill_to_restore_seen_s": None if restore_seen_at is None else restore_seen_at - killed_at,
        "checkpoint_before_kill": status.last_completed_checkpoint,
        "restarts": (final.summary.restarts if final else 0) - status.summary.restarts,
        "end_offsets_at_kill": end_offsets,
        "end_offsets_at_restore": restore_offsets,
    }
    log(
        f"  RUNNING again after {_fmt(record['kill_to_running_s'])}, first committed output after "
        f"{_fmt(record['kill_to_first_committed_s'])}, "
        f"first checkpoint after {_fmt(record['kill_to_first_checkpoint_s'])}"
    )
    return record


def _kill_jobmanager(
    cluster: BenchCluster, job_id: str, n: int, last_restore: float, plan: Plan, kill_process: Any
) -> dict[str, Any]:
    """SIGKILL the JobManager (the supervisor starts it again at once, in its warm spare) and measure
    from the kill to the job RUNNING again, every task RUNNING, restored after the kill; when the
    restarted JobManager began serving (``jobmanager_started``) comes from its log afterwards
    (``add_jobmanager_phases``)."""
    time.sleep(max(0.0, last_restore + plan.after_restore_s - time.time()))
    cluster.wait_job(job_id, _all_running, 120, "RUNNING before a JobManager kill")
    killed_at = time.time()
    kill_process(cluster.directory, "jobmanager")
    log(f"JobManager kill {n + 1}/{plan.jobmanager_kills}: SIGKILL jobmanager")
    running_at: float | None = None
    deadline = time.monotonic() + plan.recovery_timeout_s
    while running_at is None and time.monotonic() < deadline:
        s = cluster.status(job_id)
        if s is not None and (s.last_restore_at or 0) > killed_at and _all_running(s):
            running_at = time.time()
        time.sleep(0.05)
    record = {
        "killed_at": killed_at,
        "running_at": running_at,
        "kill_to_running_s": None if running_at is None else running_at - killed_at,
    }
    log(f"  RUNNING again after {_fmt(record['kill_to_running_s'])}")
    return record


def _all_running(status: Any) -> bool:
    return bool(
        status.summary.status == "RUNNING"
        and all(t.state is not None and t.state.name == "RUNNING" for t in status.tasks)
    )


def add_jobmanager_phases(kills: list[dict[str, Any]], cluster_dir: Any) -> None:
    """Each JobManager kill's restarted JobManager: when it started serving (``jobmanager_started``)."""
    path = cluster_dir / "jobmanager.log"
    with open(path, errors="replace") as f:
        started = [e["at"] for e in parse_log_lines(f) if e.get("event") == "jobmanager_started"]
    for kill in kills:
        at = next((t for t in started if t > kill["killed_at"]), None)
        kill["kill_to_serving_s"] = None if at is None else at - kill["killed_at"]
        running = kill.get("running_at")
        kill["serving_to_running_s"] = None if at is None or running is None else running - at


def _drain_and_verify(
    cluster: BenchCluster, watcher: CommittedWatcher, job_id: str, params: dict[str, str], events: int, verify_job: Any
) -> dict[str, Any]:
    # Every window fired and committed: the committed output stops growing over two checkpoints.
    previous = -1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        checkpoint = cluster.wait_job(job_id, lambda s: True, 30, "a status").last_completed_checkpoint or 0
        wanted = checkpoint + 2
        cluster.wait_job(job_id, lambda s, w=wanted: (s.last_completed_checkpoint or 0) >= w, 60, "2 checkpoints")
        count = len(watcher.records())
        if count == previous:
            break
        previous = count
    cluster.cancel(job_id)
    log("verifying both sinks against reference mode")
    report = verify_job(KEYED_JOB, params, job_id=job_id, endpoints=cluster.env.endpoints)
    sinks = [
        {
            "uid": s.uid,
            "kind": s.kind,
            "expected": s.expected,
            "found": s.found,
            "duplicates": s.duplicates,
            "missing": s.missing,
            "unexpected": s.unexpected,
            "mismatched": s.mismatched,
            "open_transactions": [str(t) for t in s.open_transactions],
            "samples": s.samples,
        }
        for s in report.sinks
    ]
    flush_windows = SOURCE_PARTITIONS
    return {
        "events": events,
        "flush_windows": flush_windows,
        "exact": exactness(sinks, flush_windows),
        "sinks": sinks,
        "warnings": list(report.warnings),
    }


def add_phases(kills: list[dict[str, Any]], cluster_dir: Any) -> None:
    """Each kill's recovery steps from the cluster's structured logs (kept until the run's directory
    is removed)."""
    entries: list[dict[str, Any]] = []
    for path in sorted(cluster_dir.glob("*.log")):
        with open(path, errors="replace") as f:
            entries += parse_log_lines(f)
    for i, kill in enumerate(kills):
        until = kills[i + 1]["killed_at"] if i + 1 < len(kills) else kill["killed_at"] + 60
        kill["phases"] = recovery_phases(entries, kill["killed_at"], until)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=None, help="SIGKILLs (default 5; --quick: 2)")
    parser.add_argument("--rate", type=int, default=None, help=f"input events/s (default {SUSTAINED_EPS // 2:,})")
    parser.add_argument("--interval", default="1s", help="checkpointing.interval (default 1s)")
    parser.add_argument("--restart-delay", default="100ms", help="restart.delay, fixed-delay (default 100ms)")
    parser.add_argument("--quick", action="store_true", help="2 kills, shorter warm-up")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = parser.parse_args(argv)
    plan = Plan(kills=2, warmup_s=5.0) if args.quick else Plan()
    plan = Plan(
        kills=args.kills or plan.kills,
        rate=args.rate or plan.rate,
        interval=args.interval,
        restart_delay=args.restart_delay,
        warmup_s=plan.warmup_s,
    )
    run_id = new_run_id()
    load_at_start = os.getloadavg()
    block = provenance.collect(REPO_ROOT)
    env = prepare_environment(run_id, checkpoints_in_s3=True)
    ensure_services(env.endpoints, env.services_run_dir)
    ok = False
    try:
        with private_cluster(env) as cluster:
            cluster.wait_all_taskmanagers()
            result = run(cluster, run_id, plan)
        add_phases(result["kills"], cluster.directory)
        add_jobmanager_phases(result["jobmanager_kills"], cluster.directory)
        ok = True
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    finally:
        remove_checkpoints(env)
        remove_run_root(env, keep=args.keep or not ok)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT)
    summary = {m: summarize([k.get(m) for k in result["kills"]]) for m in METRICS}
    phases = {name: summarize([k.get("phases", {}).get(name) for k in result["kills"]]) for name, _ in PHASES}
    median_first = summary["kill_to_first_committed_s"]["median"]
    jobmanager_summary = {
        m: summarize([k.get(m) for k in result["jobmanager_kills"]])
        for m in ("kill_to_running_s", "kill_to_serving_s", "serving_to_running_s")
    }
    document = {
        "run_id": run_id,
        "provenance": provenance.finish(block),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit.stdout.strip(),
        "host": host_summary(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rate_eps": plan.rate,
        "sustained_eps": SUSTAINED_EPS,
        "checkpoint_interval": plan.interval,
        "restart_delay": plan.restart_delay,
        "target": f"median kill -> first committed output < {TARGET_S:g} s",
        "target_met": median_first is not None and median_first < TARGET_S,
        "summary": summary,
        "phases_summary": phases,
        "jobmanager_target": f"median JobManager kill -> RUNNING again < {JOBMANAGER_TARGET_S:g} s",
        "jobmanager_summary": jobmanager_summary,
        **result,
    }
    publish_results("recovery", document, render_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
