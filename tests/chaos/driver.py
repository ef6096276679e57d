"""``make chaos``: a long job over sequence-numbered input, a seeded random schedule of faults of Weir's
processes and of Kafka, PostgreSQL and S3, and at the end the invariant, checked from the outside.

    python -m tests.chaos.driver [--events N] [--keys K] [--rate R] [--seed S] [--faults F]
                                 [--kinds all|kill-taskmanager,restart-kafka,...]

1. starts the local cluster (or uses the one up) with the supervisor restarting what gets killed;
2. recreates the input topic, the output topic and table, and produces, per key, ``seq`` 1..N;
3. runs tests/chaos/sequence_job.py bounded at ``--rate`` records/s (so the run lasts events/rate
   seconds) with a fixed-delay restart strategy and no attempt limit;
4. injects the schedule (tests/chaos/schedule.py) while it runs, and measures after each fault the
   time until the job completes a checkpoint again (its recovery);
5. waits for the job to FINISH (a deadline: a job still running then is stuck, and fails the run);
6. checks, reading Kafka (read_committed) and PostgreSQL directly: per key the sequence in each sink
   has no gap and no repeat and every output's ``prev`` is ``seq - 1`` (the keyed state advanced by
   exactly one); ``weir verify`` (``verify_job``) is exact for each sink: the multiset of whole records,
   the commit proofs counting each row once (an upsert cannot hide a repeat), nothing of the job left
   prepared or open.

Printed: the faults by kind, each fault's recovery time, the job's restarts, the records replayed
(read again after restores), the checks as PASS/FAIL. Exit 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import psycopg
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from rich.console import Console

from tests.chaos.faults import FaultError, Injected, Injector, LocalDisks
from tests.chaos.schedule import ALL_KINDS, Fault, FaultKind, make_schedule, parse_kinds
from tests.chaos.semantics import Output, SinkCheck, check_sink
from weir.core.config import Endpoints, run_dir
from weir.core.errors import WeirError
from weir.core.states import JobStatus
from weir.jobmanager.registry import HEARTBEAT_TIMEOUT_S
from weir.scenarios.framework import ReportBuilder, Table, render_text
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.drive import recreate_inputs, s3_endpoints, start_local_cluster
from weir.tools.supervisor import cluster_dir
from weir.tools.verify import verify_job

JOB_FILE: Final = Path(__file__).resolve().parent / "sequence_job.py"
CHECK_UID: Final = "semantics-check"
POSTGRES_SINK_UID: Final = "postgres-sink"
TABLE_DEFINITION: Final = "key text, seq bigint, prev bigint, PRIMARY KEY (key, seq)"
POLL_S: Final = 0.5
RECOVERY_DEADLINE_S: Final = 180.0


@dataclass(frozen=True)
class ChaosConfig:
    events: int = 240_000
    keys: int = 400
    partitions: int = 6
    records_per_second: int = 400  # the whole job's input rate: the run lasts events / rate seconds
    parallelism: int = 3
    seed: int = 1
    faults: int = 10
    kinds: tuple[FaultKind, ...] = ALL_KINDS
    min_gap_s: float = 30.0  # after a fault ended, before the next may begin: time to recover
    checkpoint_interval: str = "2s"
    finish_deadline_s: float = 600.0  # after the last fault: a job not FINISHED by then is stuck
    suffix: str = ""  # topic/table names: chaos-events-SUFFIX ...

    @property
    def run_s(self) -> float:
        return self.events / self.records_per_second

    def names(self) -> dict[str, str]:
        s = self.suffix or uuid.uuid4().hex[:8]
        return {
            "source.topic": f"chaos-events-{s}",
            "sink.topic": f"chaos-output-{s}",
            "source.dlq_topic": f"chaos-dlq-{s}",
            "sink.table": f"chaos_output_{s}",
        }

    def parameters(self, names: dict[str, str]) -> dict[str, str]:
        return {
            **names,
            "source.bounded": "true",
            "source.records_per_second": str(self.records_per_second),
            "checkpointing.interval": self.checkpoint_interval,
            "restart.strategy": "fixed-delay",
            "restart.delay": "1s",
            "restart.max-attempts": "unlimited",
        }


def expected_last_seq(events: int, keys: int) -> dict[str, int]:
    """Per key its last seq: event i (0-based) is key ``k{i % keys}``'s seq ``i // keys + 1``."""
    return {f"k{k}": events // keys + (1 if k < events % keys else 0) for k in range(min(keys, events))}


def produce_input(endpoints: Endpoints, topic: str, events: int, keys: int) -> None:
    """Event i is ``{"key": k{i % keys}, "seq": i // keys + 1, "ts": ...}``, keyed by its key (one key
    lives in one partition, in order); idempotent producer, so a retry never reorders or repeats."""
    producer = Producer(
        {"bootstrap.servers": endpoints.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 20, "log_level": 3}
    )
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    # Event time near now: the Kafka sink stamps its records with it, and the output topic's retention
    # (7 days by default) deletes segments of older timestamps, as it would a real job's.
    base_ts = int(time.time() * 1000) - events
    for i in range(events):
        key = f"k{i % keys}"
        value = json.dumps({"key": key, "seq": i // keys + 1, "ts": base_ts + i}).encode()
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"producing the input: {left} undelivered, errors {errors[:3]}")


def read_kafka_outputs(endpoints: Endpoints, topic: str, timeout_s: float = 120.0) -> list[Output]:
    """Every record of ``topic`` a read_committed consumer sees, to the end offsets."""
    consumer = Consumer(
        {
            "bootstrap.servers": endpoints.kafka_bootstrap,
            "group.id": f"chaos-check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        positions = dict.fromkeys(partitions, 0)
        outputs: list[Output] = []
        deadline = time.monotonic() + timeout_s
        while any(positions[p] < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic}: not at the end offsets {ends} after {timeout_s:.0f}s")
            for msg in consumer.consume(1000, timeout=1.0):
                if msg.error() is not None:
                    continue
                positions[msg.partition()] = msg.offset() + 1
                v = json.loads(msg.value())
                outputs.append(Output(v["key"], v["seq"], v["prev"]))
            for p in partitions:  # a partition whose tail is transaction markers ends below its end offset
                positions[p] = max(positions[p], consumer.position([TopicPartition(topic, p)])[0].offset)
        return outputs
    finally:
        consumer.close()


def read_postgres_outputs(endpoints: Endpoints, table: str) -> list[Output]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT key, seq, prev FROM "{table}"').fetchall()
    return [Output(k, s, p) for k, s, p in rows]


@dataclass
class Monitor:
    """Polls the job in the background: its status, last completed checkpoint and restarts."""

    client: JobManagerClient
    job_id: str
    last: JobDetails | None = None
    checkpoints: list[tuple[float, int]] = field(default_factory=list)  # (time, last completed) on change
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                status = self.client.job_status(self.job_id)
            except WeirError:
                pass  # the JobManager is restarting: poll again
            else:
                self.last = status
                cp = int(status.last_completed_checkpoint or 0)
                if not self.checkpoints or self.checkpoints[-1][1] != cp:
                    self.checkpoints.append((t, cp))
                if status.summary.status.terminal:
                    return
            self._stop.wait(POLL_S)

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> JobStatus | None:
        return self.last.summary.status if self.last is not None else None

    def terminal(self) -> bool:
        status = self.status()
        return status is not None and status.terminal

    def checkpoint_at(self, at: float) -> int:
        """The last completed checkpoint known at time ``at``."""
        known = [cp for t, cp in self.checkpoints if t <= at]
        return known[-1] if known else 0

    def recovered_after(self, injected: Injected) -> float | None:
        """Seconds from the fault's end to the first checkpoint completed after it; None: none yet."""
        before = self.checkpoint_at(injected.ended_at)
        after = [t for t, cp in self.checkpoints if t > injected.ended_at and cp > before]
        return after[0] - injected.ended_at if after else None


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout_s:.0f}s")
        time.sleep(POLL_S)


@dataclass
class ChaosRun:
    config: ChaosConfig
    schedule: tuple[Fault, ...]
    job_id: str = ""
    injected: list[Injected] = field(default_factory=list)
    skipped: list[Fault] = field(default_factory=list)  # the job finished before their time
    report: ReportBuilder = field(default_factory=lambda: ReportBuilder("chaos", OUTCOME))


OUTCOME: Final = (
    "under a seeded random schedule of faults of Weir's processes and of Kafka, PostgreSQL and S3, per key the "
    "sequence in state and in both sinks has no gap and no repeat, weir verify is exact, nothing is left prepared "
    "or open, and the job ends FINISHED, never stuck"
)


def run_chaos(
    endpoints: Endpoints, config: ChaosConfig, console: Console, *, directory: Path, services_run_dir: Path
) -> ChaosRun:
    schedule = make_schedule(
        seed=config.seed,
        count=config.faults,
        kinds=config.kinds,
        run_s=config.run_s,
        min_gap_s=config.min_gap_s,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
    )
    run = ChaosRun(config, schedule)
    report = run.report
    names = config.names()
    recreate_inputs(
        endpoints,
        {names["source.topic"]: config.partitions, names["sink.topic"]: 3, names["source.dlq_topic"]: 1},
        names["sink.table"],
        TABLE_DEFINITION,
    )
    produce_input(endpoints, names["source.topic"], config.events, config.keys)
    report.step(
        f"produced {config.events:,} events over {config.keys} keys (per key seq 1..N) to {names['source.topic']} "
        f"({config.partitions} partitions)"
    )
    console.print(f"schedule (seed {config.seed}):\n  " + "\n  ".join(f.describe() for f in schedule))
    local_disks = LocalDisks(run_dir()) if any(f.kind is FaultKind.FILL_DISK for f in schedule) else None
    if local_disks is not None:
        local_disks.mount()
        report.step(
            f"mounted a {local_disks.size} tmpfs over each TaskManager's local directory under {local_disks.run_dir} "
            "(the fill-disk fault fills one)"
        )
    try:
        _run_schedule(run, endpoints, names, console, Injector(directory, services_run_dir, local_disks))
    finally:
        if local_disks is not None:
            local_disks.unmount()
    return run


def _run_schedule(
    run: ChaosRun, endpoints: Endpoints, names: dict[str, str], console: Console, injector: Injector
) -> None:
    config, schedule, report = run.config, run.schedule, run.report
    parameters = config.parameters(names)
    with JobManagerClient(endpoints.jobmanager_address) as client:
        run.job_id = client.submit_job(JOB_FILE, parameters, config.parallelism)
        report.step(
            f"submitted {JOB_FILE.name} as job {run.job_id} at parallelism {config.parallelism}, bounded, "
            f"{config.records_per_second} records/s (~{config.run_s:.0f}s), a checkpoint every "
            f"{config.checkpoint_interval}, fixed-delay restarts without limit"
        )
        monitor = Monitor(client, run.job_id)
        watcher = threading.Thread(target=monitor.run, name="chaos-monitor", daemon=True)
        watcher.start()
        try:
            wait_until(lambda: monitor.status() == JobStatus.RUNNING, 120, "the job RUNNING")
            started = time.time()
            try:
                for fault in schedule:
                    wait_until(
                        lambda f=fault: time.time() - started >= f.at_s or monitor.terminal(),
                        fault.at_s + 60,
                        f"the time of {fault.describe()}",
                    )
                    if monitor.terminal():
                        run.skipped.append(fault)
                        continue
                    console.print(f"[bold red]fault[/] {fault.describe()}")
                    injected = injector.inject(fault)
                    run.injected.append(injected)
                    console.print(f"  {injected.detail}")
            finally:
                injector.heal()
            deadline_s = config.finish_deadline_s + max(0.0, config.run_s - (time.time() - started))
            try:
                wait_until(
                    monitor.terminal,
                    deadline_s,
                    "the job's end",
                )
            except RuntimeError:
                pass
        finally:
            monitor.stop()
            watcher.join(timeout=10)
        _check(run, monitor, endpoints, names, parameters)


def _check(
    run: ChaosRun, monitor: Monitor, endpoints: Endpoints, names: dict[str, str], parameters: dict[str, str]
) -> None:
    report, config = run.report, run.config
    final = monitor.last
    status = final.summary.status if final is not None else None
    by_kind = Counter(i.fault.kind.value for i in run.injected)
    report.measured("faults injected", ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())) or "none")
    if run.skipped:
        report.measured("faults not injected (the job had finished)", len(run.skipped))
    recoveries = [(i, monitor.recovered_after(i)) for i in run.injected]
    report.table(
        Table(
            "faults and recovery",
            ("fault", "how", "recovered after (s)"),
            tuple(
                (injected.fault.describe(), injected.detail, "never" if seconds is None else f"{seconds:.1f}")
                for injected, seconds in recoveries
            ),
        )
    )
    restarts = final.summary.restarts if final is not None else 0
    report.measured("job restarts", restarts)
    if final is not None:
        # Sources count what they emit, not what they take in; the keyed operator after them takes in
        # every record the sources read, in every attempt: what is above the input was read again.
        checked = [t for t in final.tasks if t.vertex_uid == CHECK_UID]
        processed = sum(t.records_in_all_attempts for t in checked)
        report.measured(
            "records replayed (processed again after restores)",
            f"{processed - config.events:,} ({processed:,} processed over all attempts for {config.events:,} events)",
        )
    report.measured("checkpoints completed", monitor.checkpoints[-1][1] if monitor.checkpoints else 0)
    failure = ""
    if final is not None and final.failure is not None:
        failure = (
            f" (its last failure on the way: {final.failure})" if status == JobStatus.FINISHED else f": {final.failure}"
        )
    report.verify(
        "job-finished", "the job ends FINISHED, never stuck", status == JobStatus.FINISHED, f"status {status}{failure}"
    )
    report.verify(
        "recovered-after-every-fault",
        "the job recovered after every fault (a checkpoint completed after it)",
        all(s is not None for _, s in recoveries) and bool(recoveries),
        f"{sum(s is not None for _, s in recoveries)} of {len(recoveries)} faults",
    )
    expected = expected_last_seq(config.events, config.keys)
    checks: list[SinkCheck] = [
        check_sink("kafka (read_committed)", read_kafka_outputs(endpoints, names["sink.topic"]), expected),
        check_sink("postgres", read_postgres_outputs(endpoints, names["sink.table"]), expected),
    ]
    for c in checks:
        report.verify(
            f"sequences-exact:{c.sink}",
            f"{c.sink}: per key seq 1..N, no gap, no repeat, every prev = seq - 1",
            c.exact,
            c.summary() + ("; e.g. " + "; ".join(c.samples) if c.samples else ""),
        )
    # One helper for every exactness check: both sinks as multisets of whole records against the
    # reference run, each sink's commit proofs counting what it committed (a PostgreSQL row committed
    # twice, hidden by the upsert, shows there), nothing of the job left prepared or open.
    verified = verify_job(JOB_FILE, parameters, job_id=run.job_id, endpoints=endpoints)
    for sink in verified.sinks:
        report.verify(
            f"verify-exact:{sink.uid}",
            f"weir verify: {sink.uid} ({sink.kind}) exact: multiset of whole records, commit proofs, "
            "no transaction left prepared or open",
            sink.ok,
            (", ".join(sink.problems()) or f"{sink.found:,} records, proofs count {sink.proof_records}")
            + (f"; e.g. {next(iter(sink.samples.values()))[0]}" if sink.samples else ""),
        )
    report.verify(
        "verify-read-both-sinks",
        "weir verify read both sinks back",
        {s.kind for s in verified.sinks} == {"kafka", "postgres"},
        ", ".join(f"{s.uid} ({s.kind})" for s in verified.sinks) or "no sink",
    )


def main(argv: Sequence[str] | None = None) -> int:
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.driver", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--rate", type=int, default=defaults.records_per_second, help="the job's records/s")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--faults", type=int, default=defaults.faults)
    parser.add_argument("--kinds", default="all", help="comma-separated: " + ",".join(k.value for k in FaultKind))
    parser.add_argument("--gap", type=float, default=defaults.min_gap_s, help="seconds between faults")
    parser.add_argument(
        "--services-run-dir",
        type=Path,
        default=None,
        help="where deploy/local/infra.sh keeps the services' pid files [default: WEIR_RUN_DIR]",
    )
    args = parser.parse_args(argv)
    try:
        kinds = parse_kinds(args.kinds)
    except ValueError as exc:
        parser.error(str(exc))
    console = Console()
    if FaultKind.FILL_DISK in kinds and (why := LocalDisks.unavailable()) is not None:
        if args.kinds.strip() not in ("", "all"):
            parser.error(f"fill-disk cannot run here: {why}")
        kinds = tuple(k for k in kinds if k is not FaultKind.FILL_DISK)
        console.print(f"[yellow]fill-disk left out: no tmpfs can be mounted here ({why})[/]")
    config = replace(
        defaults,
        events=args.events,
        keys=args.keys,
        records_per_second=args.rate,
        seed=args.seed,
        faults=args.faults,
        kinds=kinds,
        min_gap_s=args.gap,
    )
    endpoints = s3_endpoints()
    services_run_dir = args.services_run_dir or run_dir()
    start_local_cluster(console, endpoints)
    try:
        run = run_chaos(endpoints, config, console, directory=cluster_dir(), services_run_dir=services_run_dir)
    except (WeirError, FaultError, RuntimeError, ValueError) as exc:
        console.print(f"[bold red]chaos: {exc}[/]", soft_wrap=True)
        return 1
    report = run.report.build()
    render_text(console, report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
