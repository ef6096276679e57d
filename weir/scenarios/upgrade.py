"""``weir scenario upgrade``: the seed's savepoint-based version upgrade, end to end, and checked.

The driver (on the local cluster, checkpoints in the S3 bucket):

1. recreates the topics ``upgrade-events`` (6 partitions), ``upgrade-results``, ``upgrade-dlq`` and the
   table ``upgrade_results``, with the columns of both versions (``max`` nullable, version ``v``);
2. produces the events in the background at a steady rate, as live input (values -10..86);
3. runs examples/upgrade_v1.py, unbounded, at parallelism 2, a checkpoint every second, on that live
   input; once it has completed some checkpoints and read part of the input:
   ``weir stop JOB --savepoint-path DIR`` (stop-with-savepoint, through the CLI as a user runs it);
4. once all the input is there, shows ``weir savepoint info`` of the savepoint and runs
   examples/upgrade_v2.py from it at parallelism 3, bounded: it reads to the end of the input and finishes;
5. reads back the savepoint's cut, the input, both sinks and their open or prepared transactions.

The expected outcome. The savepoint holds the cut: each partition's next offset (the Kafka source's
positions) and each window subtask's watermark (the window operator's state) with its key groups.
For each (key, window) of the input, B are its events before the cut (offset below its partition's
position), A those after it that version 2's filter keeps (value >= 0); W is the watermark of the
version-1 window subtask whose key groups hold the key:

- W >= window end - 1: the window fired in version 1, before the savepoint barrier, so its result
  was committed with the savepoint: ``{count: |B|, sum: ΣB, v: 1}`` (no ``max``). Events of A would
  be late for version 2 (each key group restores its old subtask's watermark) and dropped; event
  time does not decrease within a partition, so there are none, and the report counts them.
- otherwise version 2 fires it: a window open at the cut goes on from its migrated accumulator
  (count, sum, None): ``{count: |B| + |A|, sum: ΣB + ΣA, max: null when B is not empty (version 1 kept
  no max), else max(A), v: 2}``; no B and no A: no window.

Each sink must hold exactly these: per window one record (Kafka, read_committed) or row (PostgreSQL),
of the expected version with the expected values (a record more is a duplicate, one less missing, one
the input does not explain unexpected, other values mismatched), and for each key the windows of
version 1 must all come before those of version 2 (interleaved otherwise); no transaction of either
job may stay prepared in PostgreSQL or open on the results topic. A run that does not exercise the
upgrade (no window from one version, none open at the cut, nothing filtered) fails too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from rich.console import Console

from weir.connectors import kafka, postgres
from weir.core.config import Endpoints
from weir.core.windows import window_start
from weir.scenarios.driving import EventProducer, run_weir
from weir.scenarios.framework import (
    EXAMPLES,
    JobSpec,
    Report,
    ReportBuilder,
    Scenario,
    ScenarioError,
    Table,
    clock,
)
from weir.scenarios.keyed_job import (
    KAFKA_SINK_UID,
    POSTGRES_SINK_UID,
    WINDOW_UID,
    Comparison,
    InputRecord,
    KeyedJob,
    SavepointCut,
    WindowKey,
    compare_windows,
    read_input,
    read_savepoint,
)
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.drive import wait_for_job
from weir.tools.events import EventSpec
from weir.tools.verify import OPEN_TRANSACTION_GRACE_S, open_kafka_transactions, sink_transaction

NAME: Final = "upgrade"
V1_FILE: Final = EXAMPLES / "upgrade_v1.py"
V2_FILE: Final = EXAMPLES / "upgrade_v2.py"
COLUMNS: Final = ("key", "window_start", "window_end", "count", "sum", "max", "v")
TABLE_DEFINITION: Final = (
    "key text, window_start bigint, window_end bigint, count bigint, sum bigint, max bigint, "
    "v smallint NOT NULL, PRIMARY KEY (key, window_start)"
)
OUTCOME: Final = (
    "Savepoints with stable operator IDs support controlled upgrades; stable operator IDs and tested state "
    "schema compatibility for upgrades. Operations distinguish checkpoint health, record latency and savepoint "
    "compatibility."
)

Result = dict[str, Any]  # a window's result as a sink holds it


def v2_keeps(value: int) -> bool:
    """examples/upgrade_v2.py's filter, stated again here: the checker is the specification."""
    return value >= 0


@dataclass(frozen=True)
class UpgradeConfig:
    # the keyed job's topics and uids; v1 and v2 are its files here, fixed-delay restarts 1 s apart
    job: KeyedJob = KeyedJob.named("upgrade", file=V1_FILE, restart_delay="1s")
    events: int = 60_000
    keys: int = 200
    events_per_second: int = 2_000  # the producer's pace; event time advances 1 ms per events_per_second/1000
    min_value: int = -10  # values min_value .. min_value + 96: about one in ten is negative
    v1_parallelism: int = 2
    v2_parallelism: int = 3
    checkpoints_before_stop: int = 3
    stop_at_fraction: float = 0.4  # stop v1 once it has read this share of the input
    partitions: int = 6
    savepoint_dir: str = ""  # "": s3://<bucket>/scenario-upgrade/savepoints
    timeout_s: float = 300.0

    def v1(self) -> JobSpec:
        return self.job.with_(file=V1_FILE, bounded=False).spec(self.v1_parallelism)

    def v2(self, savepoint: str | None = None) -> JobSpec:
        return self.job.with_(file=V2_FILE, bounded=True).spec(self.v2_parallelism, from_savepoint=savepoint)

    def event_spec(self) -> EventSpec:
        return EventSpec(
            count=self.events,
            keys=self.keys,
            events_per_ms=max(1, self.events_per_second // 1000),
            min_value=self.min_value,
        )


# The expected outcome (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    results: Mapping[WindowKey, Result]
    events_before: int  # read by version 1
    events_after: int  # read by version 2
    filtered: int  # of those, dropped by version 2's filter
    late: int  # of those, kept but for a window version 1 had fired: dropped as late by version 2
    migrated: int  # windows version 2 fires from an accumulator of version 1 (open at the cut)

    def count(self, version: int) -> int:
        return sum(1 for r in self.results.values() if r["v"] == version)


def expected_results(
    records: Iterable[InputRecord], cut: SavepointCut, window_ms: int, keeps: Callable[[int], bool] = v2_keeps
) -> Expectation:
    """Each window's one result, by the rules in this module's docstring (a malformed record is in
    neither version's windows: both dead-letter it)."""
    before: dict[WindowKey, list[int]] = defaultdict(list)
    after: dict[WindowKey, list[int]] = defaultdict(list)
    n_before = n_after = filtered = 0
    for r in records:
        e = r.event
        if e is None:
            continue
        window = (e.key, window_start(e.ts, 0, window_ms))
        if cut.before(r.partition, r.offset):
            n_before += 1
            before[window].append(e.value)
            continue
        n_after += 1
        if keeps(e.value):
            after[window].append(e.value)
        else:
            filtered += 1
    results: dict[WindowKey, Result] = {}
    late = migrated = 0
    for window in sorted(before.keys() | after.keys()):
        key, start = window
        end = start + window_ms
        b, a = before.get(window, []), after.get(window, [])
        base = {"key": key, "window_start": start, "window_end": end}
        if cut.watermark_of(key) >= end - 1:  # fired in version 1 before the savepoint
            late += len(a)
            if b:
                results[window] = {**base, "count": len(b), "sum": sum(b), "v": 1}
            continue
        migrated += bool(b)
        values = b + a
        results[window] = {**base, "count": len(values), "sum": sum(values), "max": None if b else max(a), "v": 2}
    return Expectation(results, n_before, n_after, filtered, late, migrated)


# What the sinks hold, compared (pure) --------------------------------------------------------------


def result_window(result: Result) -> WindowKey | None:
    if "key" not in result or "window_start" not in result:
        return None
    return (result["key"], result["window_start"])


@dataclass(frozen=True)
class SinkCheck:
    """One sink against the expectation: the windows compared, the versions in order per key, and
    the transactions left open or prepared."""

    sink: str
    comparison: Comparison[Result]
    interleaved: int  # keys with a version-2 window before a version-1 window
    open_transactions: tuple[str, ...] = ()

    @property
    def by_version(self) -> Mapping[Any, int]:
        """Windows found, by the version they say."""
        return Counter(results[0].get("v") for results in self.comparison.by_window.values())


def check_sink(
    sink: str,
    expected: Mapping[WindowKey, Result],
    found: Iterable[Result | None],
    open_transactions: Sequence[str] = (),
) -> SinkCheck:
    """Per window exactly the expected result (``None`` in ``found``: a record that does not parse)."""
    comparison = compare_windows(sink, expected, found, result_window)
    versions: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for (key, start), results in comparison.by_window.items():
        versions[key][results[0].get("v")].append(start)
    interleaved = sum(1 for v in versions.values() if v.get(1) and v.get(2) and max(v[1]) > min(v[2]))
    return SinkCheck(sink, comparison, interleaved, tuple(open_transactions))


def postgres_expectation(expectation: Expectation) -> dict[WindowKey, Result]:
    """A row holds every column: a v1 result's ``max`` is NULL there."""
    return {w: {c: r.get(c) for c in COLUMNS} for w, r in expectation.results.items()}


# The driver ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpgradeRun:
    """What the driver read back after v2 finished."""

    v1_job: str
    v2_job: str
    cut: SavepointCut
    records: tuple[InputRecord, ...]
    kafka: tuple[Result | None, ...]  # the results topic, read_committed
    postgres: tuple[Result, ...]  # the table's rows, by column
    kafka_open: tuple[str, ...]  # open transactions on the results topic
    postgres_prepared: tuple[str, ...]  # prepared transactions of either job's PostgreSQL sink
    steps: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)


def drive(endpoints: Endpoints, config: UpgradeConfig, console: Console) -> UpgradeRun:
    """Inputs, v1 under load, stop with savepoint, v2 from it, everything read back (the cluster is up)."""
    savepoint_dir = config.savepoint_dir or f"s3://{endpoints.s3_bucket}/scenario-upgrade/savepoints"
    job = config.job
    timings: dict[str, float] = {}
    steps: list[str] = []

    def step(text: str) -> None:
        steps.append(text)
        console.print(text, soft_wrap=True, highlight=False, markup=False)

    began = time.monotonic()
    job.recreate(endpoints, config.partitions, table_definition=TABLE_DEFINITION)
    step(f"recreated {job.describe(config.partitions)} ({TABLE_DEFINITION})")
    producer = EventProducer(endpoints, job.source_topic, config.event_spec(), config.events_per_second)
    producer.start()
    step(
        f"producing {config.events:,} events at {config.events_per_second:,}/s in the background "
        f"({config.keys} keys, values {config.min_value}..{config.min_value + 96})"
    )
    try:
        with JobManagerClient(endpoints.jobmanager_address) as client:
            v1, savepoint_path = _run_v1(client, config, producer, savepoint_dir, console, step, timings)
            t = time.monotonic()
            produced = producer.written(config.timeout_s)
            timings["rest of the input"] = time.monotonic() - t
            step(f"input complete: {produced:,} events")
            run_weir(console, ["savepoint", "info", savepoint_path], timeout_s=120.0)
            cut = read_savepoint(savepoint_path, endpoints)
            v2 = _run_v2(client, config, savepoint_path, console, step, timings)
    finally:
        with contextlib.suppress(ScenarioError):  # a failed producer was reported by written()
            producer.stop()
    t = time.monotonic()
    records = tuple(read_input(endpoints, job.source_topic))
    kafka_results, kafka_open = _read_kafka(endpoints, job.sink_topic)
    assert job.table is not None
    postgres_rows, prepared = _read_postgres(endpoints, job.table, (v1, v2))
    step(f"read back the input ({len(records):,} records), both sinks and their open or prepared transactions")
    timings["read back"] = time.monotonic() - t
    timings["total"] = time.monotonic() - began
    return UpgradeRun(v1, v2, cut, records, kafka_results, postgres_rows, kafka_open, prepared, tuple(steps), timings)


def _window_records_in(status: JobDetails) -> int:
    return sum(t.records_in for t in status.tasks if t.vertex_uid == WINDOW_UID)


def _run_v1(
    client: JobManagerClient,
    config: UpgradeConfig,
    producer: EventProducer,
    savepoint_dir: str,
    console: Console,
    step: Callable[[str], None],
    timings: dict[str, float],
) -> tuple[str, str]:
    """Version 1 on the live input until it has checkpointed and read enough; then ``weir stop``."""
    spec = config.v1()
    t = time.monotonic()
    v1 = spec.submit(client)
    step(f"v1 {v1} submitted: {spec.command()}")
    stop_at = int(config.events * config.stop_at_fraction)
    shown = [0.0]

    def progress(status: JobDetails) -> None:
        if time.monotonic() - shown[0] >= 2.0:
            shown[0] = time.monotonic()
            console.print(
                f"  v1 {status.summary.status}: {_window_records_in(status):,} events aggregated of "
                f"{producer.produced:,} produced, last checkpoint {status.last_completed_checkpoint or '-'}"
            )

    status = wait_for_job(
        client,
        v1,
        lambda s: (
            (s.last_completed_checkpoint or 0) >= config.checkpoints_before_stop and _window_records_in(s) >= stop_at
        ),
        config.timeout_s,
        f"checkpoint {config.checkpoints_before_stop} and {stop_at:,} events aggregated",
        on_poll=progress,
    )
    timings["v1 until the stop"] = time.monotonic() - t
    step(
        f"v1: {_window_records_in(status):,} events aggregated, checkpoint {status.last_completed_checkpoint} "
        f"completed, {producer.produced:,} produced so far: `weir stop {v1} --savepoint-path {savepoint_dir}`"
    )
    t = time.monotonic()
    answer = json.loads(
        run_weir(console, ["stop", v1, "--savepoint-path", savepoint_dir, "--json"], timeout_s=config.timeout_s)
    )
    timings["stop with savepoint"] = time.monotonic() - t
    step(f"v1 stopped with savepoint {answer['path']}")
    return v1, str(answer["path"])


def _run_v2(
    client: JobManagerClient,
    config: UpgradeConfig,
    savepoint_path: str,
    console: Console,
    step: Callable[[str], None],
    timings: dict[str, float],
) -> str:
    spec = config.v2(savepoint_path)
    t = time.monotonic()
    v2 = spec.submit(client)
    step(f"v2 {v2} submitted: {spec.command()}")
    status = wait_for_job(client, v2, lambda s: s.summary.status == "FINISHED", config.timeout_s, "FINISHED")
    timings["v2 to its end"] = time.monotonic() - t
    step(
        f"v2 FINISHED: {_window_records_in(status):,} events aggregated (after its filter), "
        f"restarts {status.summary.restarts}, last checkpoint {status.last_completed_checkpoint}"
    )
    return v2


def _json(value: bytes | None) -> Result | None:
    try:
        parsed = json.loads(value or b"")
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _read_kafka(endpoints: Endpoints, topic: str) -> tuple[tuple[Result | None, ...], tuple[str, ...]]:
    partitions = kafka.partition_count(endpoints, topic)
    open_txns = open_kafka_transactions(endpoints, topic, partitions, OPEN_TRANSACTION_GRACE_S)
    found = tuple(_json(value) for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, topic))
    return found, tuple(t.detail for t in open_txns)


def _read_postgres(endpoints: Endpoints, table: str, jobs: Sequence[str]) -> tuple[tuple[Result, ...], tuple[str, ...]]:
    with postgres.connect(endpoints, autocommit=True) as conn:
        rows = postgres.fetch_rows(conn, table, COLUMNS)
        prepared = postgres.prepared_transactions(conn)
    open_txns = tuple(
        f"prepared transaction {gid}"
        for gid, _at, _db in prepared
        if any(sink_transaction(gid, POSTGRES_SINK_UID, job) is not None for job in jobs)
    )
    return tuple(dict(zip(COLUMNS, row, strict=True)) for row in rows), open_txns


# The checks ---------------------------------------------------------------------------------------------


def check(config: UpgradeConfig, run: UpgradeRun) -> Report:
    report = ReportBuilder(NAME, OUTCOME)
    for text in run.steps:
        report.step(text)
    cut = run.cut
    e = expected_results(run.records, cut, config.job.window_ms)
    sinks = {
        KAFKA_SINK_UID: check_sink(f"kafka {config.job.sink_topic}", e.results, run.kafka, run.kafka_open),
        POSTGRES_SINK_UID: check_sink(
            f"postgres {config.job.table}", postgres_expectation(e), run.postgres, run.postgres_prepared
        ),
    }
    last_before: dict[int, int] = {}
    for r in run.records:
        if r.event is not None and cut.before(r.partition, r.offset):
            last_before[r.partition] = max(last_before.get(r.partition, r.event.ts), r.event.ts)
    report.table(
        Table(
            "the cut: source positions",
            ("partition", "next offset (savepoint)", "last event time read by v1"),
            tuple(
                (str(p), str(cut.next_offsets.get(p, 0)), clock(last_before[p]) if p in last_before else "-")
                for p in sorted(set(cut.next_offsets) | set(last_before))
            ),
        )
    )
    report.table(_outcome_table(e, tuple(sinks.values())))
    report.measured(
        "window watermarks at the savepoint",
        ", ".join(f"#{w.subtask} {w.key_groups} {clock(w.watermark)}" for w in cut.window_watermarks)
        + " (v1 fired each window whose last millisecond its subtask's watermark had reached)",
    )
    report.measured(
        f"{WINDOW_UID} accumulators in the savepoint",
        f"{', '.join(cut.window_state_schemas)}; v2 declares version 2 and migrates them "
        "(count, sum) -> (count, sum, max unknown)",
    )
    report.measured(
        "events",
        f"{e.events_before + e.events_after:,}; {e.events_before:,} before the cut (v1), {e.events_after:,} after it "
        f"(v2: {e.filtered:,} dropped by its filter, {e.late:,} late)",
    )
    report.measured("savepoint", cut.path)
    report.measured("jobs", f"v1 {run.v1_job}, v2 {run.v2_job}")
    report.measured("timings", ", ".join(f"{k} {v:.1f}s" for k, v in run.timings.items()))
    for s in sinks.values():
        for line in (*s.comparison.samples, *s.open_transactions):
            report.note(f"{s.sink}: {line}")

    v = report.verify
    for uid, s in sinks.items():
        c = s.comparison
        v(
            f"sink-exact:{uid}",
            f"{s.sink} holds one result per window, from the version expected, with the expected values",
            c.exact,
            f"{c.numbers()}; v1 {s.by_version.get(1, 0):,} = {e.count(1):,}, v2 {s.by_version.get(2, 0):,} = "
            f"{e.count(2):,}",
            **c.figures(),
            v1=s.by_version.get(1, 0),
            v2=s.by_version.get(2, 0),
            expected_v1=e.count(1),
            expected_v2=e.count(2),
        )
        v(
            f"versions-in-order:{uid}",
            f"{s.sink}: per key, every v1 window comes before every v2 window",
            s.interleaved == 0,
            f"{s.interleaved} key(s) with a v2 window before a v1 window",
            interleaved=s.interleaved,
        )
        v(
            f"nothing-open:{uid}",
            f"{s.sink}: no transaction of either job left open or prepared",
            not s.open_transactions,
            f"{len(s.open_transactions)} open or prepared",
            open_transactions=len(s.open_transactions),
        )
    exercised = (
        ("v1-fired-windows", "v1 fired windows before the savepoint (committed with it)", e.count(1), "v1_windows"),
        ("v2-produced-windows", "v2 produced windows", e.count(2), "v2_windows"),
        (
            "windows-migrated",
            "windows open at the cut went on in v2 from v1's migrated accumulators",
            e.migrated,
            "migrated",
        ),
        (
            "v2-read-after-cut",
            "v1 stopped before the end of the input: v2 read the rest",
            e.events_after,
            "events_after",
        ),
        ("v2-filter-dropped", "v2's new filter dropped events", e.filtered, "filtered"),
    )
    for name, statement, n, label in exercised:
        v(name, f"the run exercised the upgrade: {statement}", n > 0, f"{n:,} > 0", **{label: n})
    return report.build()


def _outcome_table(e: Expectation, sinks: Sequence[SinkCheck]) -> Table:
    rows: list[tuple[str, ...]] = [
        ("windows", f"{len(e.results):,}", *(f"{s.comparison.found:,}" for s in sinks)),
        ("  from v1 (fired before the savepoint)", f"{e.count(1):,}", *(f"{s.by_version.get(1, 0):,}" for s in sinks)),
        ("  from v2", f"{e.count(2):,}", *(f"{s.by_version.get(2, 0):,}" for s in sinks)),
        ("    of them open at the cut (migrated)", f"{e.migrated:,}", *("" for _ in sinks)),
    ]
    for label, attr in (
        ("duplicates", "duplicates"),
        ("missing", "missing"),
        ("unexpected", "unexpected"),
        ("mismatched", "mismatched"),
    ):
        rows.append((label, "0", *(f"{getattr(s.comparison, attr):,}" for s in sinks)))
    rows.append(("keys with v2 before v1", "0", *(f"{s.interleaved:,}" for s in sinks)))
    rows.append(("open / prepared transactions", "0", *(f"{len(s.open_transactions):,}" for s in sinks)))
    return Table("outcome: one result per window in each sink", ("", "expected", *(s.sink for s in sinks)), tuple(rows))


# The command ----------------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, defaults: UpgradeConfig) -> None:
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--events-per-second", type=int, default=defaults.events_per_second)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--savepoint-path", default="", help="default s3://<bucket>/scenario-upgrade/savepoints")


def _configure(args: argparse.Namespace, defaults: UpgradeConfig) -> UpgradeConfig:
    return replace(
        defaults,
        events=args.events,
        events_per_second=args.events_per_second,
        keys=args.keys,
        savepoint_dir=args.savepoint_path,
    )


SCENARIO: Final = Scenario(
    name=NAME,
    title="savepoint-based upgrade, v1 -> stop with savepoint -> v2 at another parallelism",
    summary="v1 stopped with a savepoint, v2 (changed aggregate and filter) resumed from it at another parallelism",
    outcome=OUTCOME,
    defaults=UpgradeConfig(),
    arguments=_arguments,
    configure=_configure,
    jobs=lambda config: (config.v1(), config.v2()),
    drive=drive,
    check=check,
)
