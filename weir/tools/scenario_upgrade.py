"""``make scenario-upgrade``: the seed's savepoint-based version upgrade, end to end, and checked.

1. starts the local cluster (as ``make demo``), checkpoints in the S3 bucket;
2. recreates the topics ``upgrade-events`` (6 partitions), ``upgrade-results``, ``upgrade-dlq`` and the
   table ``upgrade_results``, with the columns of both versions (``max`` nullable, version ``v``);
3. produces the events in the background at a steady rate, as live input (values -10..86);
4. runs examples/upgrade_v1.py, unbounded, at parallelism 2, a checkpoint every second, on that live
   input; once it has completed some checkpoints and read part of the input:
   ``weir stop JOB --savepoint-path DIR`` (stop-with-savepoint);
5. once all the input is there, runs examples/upgrade_v2.py from the savepoint at parallelism 3,
   bounded: it reads to the end of the input and finishes;
6. reads the savepoint (its ``info``, and the cut), reads the input back, computes the result each
   window must have, reads both sinks and compares; exits 1 on any discrepancy.

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
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from weir.connectors import kafka, postgres
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.core.keygroups import KeyGroupRange, key_group_for_key
from weir.core.paths import locate_state
from weir.core.task_state import decode_task_state, read_operator_states
from weir.core.windows import window_start
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.operators.sources import merge_kafka_source_states
from weir.operators.windows import decode_window_state
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.drive import recreate_inputs, s3_endpoints, start_local_cluster, wait_for_job
from weir.tools.events import EventSpec, produce_events
from weir.tools.verify import OPEN_TRANSACTION_GRACE_S, open_kafka_transactions, sink_transaction

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
V1_FILE: Final = EXAMPLES / "upgrade_v1.py"
V2_FILE: Final = EXAMPLES / "upgrade_v2.py"
SOURCE_UID: Final = "events-source"
WINDOW_UID: Final = "window-count-sum"
KAFKA_SINK_UID: Final = "kafka-sink"
POSTGRES_SINK_UID: Final = "postgres-sink"
COLUMNS: Final = ("key", "window_start", "window_end", "count", "sum", "max", "v")
TABLE_DEFINITION: Final = (
    "key text, window_start bigint, window_end bigint, count bigint, sum bigint, max bigint, "
    "v smallint NOT NULL, PRIMARY KEY (key, window_start)"
)

WIDE: Final = 150
WindowKey = tuple[str, int]  # (key, window start)
Result = dict[str, Any]  # a window's result as a sink holds it


def v2_keeps(value: int) -> bool:
    """examples/upgrade_v2.py's filter, stated again here: the checker is the specification."""
    return value >= 0


class ScenarioError(WeirError):
    """The scenario could not be run to its end (a job failed, the stop did not complete, ...)."""


@dataclass(frozen=True)
class ScenarioConfig:
    events: int = 60_000
    keys: int = 200
    events_per_second: int = 2_000  # the producer's pace; event time advances 1 ms per events_per_second/1000
    min_value: int = -10  # values min_value .. min_value + 96: about one in ten is negative
    window_ms: int = 1000
    v1_parallelism: int = 2
    v2_parallelism: int = 3
    checkpoint_interval: str = "1s"
    checkpoints_before_stop: int = 3
    stop_at_fraction: float = 0.4  # stop v1 once it has read this share of the input
    partitions: int = 6
    source_topic: str = "upgrade-events"
    sink_topic: str = "upgrade-results"
    dlq_topic: str = "upgrade-dlq"
    table: str = "upgrade_results"
    savepoint_dir: str = ""  # "": s3://<bucket>/scenario-upgrade/savepoints
    timeout_s: float = 300.0

    def parameters(self, *, bounded: bool) -> dict[str, str]:
        return {
            "source.topic": self.source_topic,
            "sink.topic": self.sink_topic,
            "sink.table": self.table,
            "source.dlq_topic": self.dlq_topic,
            "source.bounded": "true" if bounded else "false",
            "window.size_ms": str(self.window_ms),
            "checkpointing.interval": self.checkpoint_interval,
            "restart.strategy": "fixed-delay",
            "restart.delay": "1s",
        }

    def event_spec(self) -> EventSpec:
        return EventSpec(
            count=self.events,
            keys=self.keys,
            events_per_ms=max(1, self.events_per_second // 1000),
            min_value=self.min_value,
        )


# The savepoint: its info and the cut ---------------------------------------------------------------


@dataclass(frozen=True)
class WindowWatermark:
    """A version-1 window subtask's key groups and the watermark it had reached at the savepoint."""

    subtask: int
    key_groups: KeyGroupRange
    watermark: int


@dataclass(frozen=True)
class SavepointCut:
    """Where version 1 stopped: each partition's next offset, each window subtask's watermark."""

    next_offsets: Mapping[int, int]
    window_watermarks: tuple[WindowWatermark, ...]
    max_parallelism: int = 128
    path: str = ""
    job_id: str = ""
    savepoint_id: int = 0
    window_state_schemas: tuple[str, ...] = ()

    def before(self, partition: int, offset: int) -> bool:
        """Whether version 1 read the record (a partition it never read starts at offset 0)."""
        return offset < self.next_offsets.get(partition, 0)

    def watermark_of(self, key: str) -> int:
        """The watermark of the version-1 window subtask that held ``key``."""
        group = key_group_for_key(key, self.max_parallelism)
        for w in self.window_watermarks:
            if group in w.key_groups:
                return w.watermark
        raise ScenarioError(f"no window subtask of the savepoint holds key group {group} (key {key!r})")


def read_savepoint(path: str, endpoints: Endpoints | None = None) -> SavepointCut:
    """The cut in the savepoint at ``path`` (a folder URI), read from the storage alone, with the
    decoders a restore uses: the metadata, each task-state document, the Kafka source's positions and
    the window operator's watermark (``weir savepoint info`` shows the rest)."""
    location = locate_state(path)
    storage = open_storage(location.root_uri, endpoints)
    checkpoint = decode_metadata(storage.get_bytes(location.metadata_key), location.metadata_key)
    source_states: list[bytes] = []
    watermarks: list[WindowWatermark] = []
    schemas: tuple[str, ...] = ()
    max_parallelism = 128
    for handle in checkpoint.task_states:
        name = f"{handle.task_id.operator_uid}#{handle.task_id.subtask}"
        document = decode_task_state(handle.inline_payload, f"{path} task {name}")
        states = read_operator_states(document.operator_state, storage.get_bytes)
        if SOURCE_UID in states:
            source_states.append(states[SOURCE_UID])
        if WINDOW_UID in states:
            watermark = decode_window_state(states[WINDOW_UID])
            watermarks.append(WindowWatermark(document.subtask, document.key_group_range, watermark))
            max_parallelism = document.layout.max_parallelism
            declared = document.layout.state_schemas.get(WINDOW_UID, ())
            schemas = tuple(f"{s.name} v{s.version} ({s.serializer})" for s in declared) or ("win v1 (pickle)",)
    if not source_states or not watermarks:
        raise ScenarioError(f"savepoint {path} holds no state of {SOURCE_UID!r} or {WINDOW_UID!r}")
    next_offsets, _ends = merge_kafka_source_states(source_states)
    return SavepointCut(
        next_offsets=next_offsets,
        window_watermarks=tuple(sorted(watermarks, key=lambda w: w.subtask)),
        max_parallelism=max_parallelism,
        path=path,
        job_id=checkpoint.job_id,
        savepoint_id=checkpoint.checkpoint_id,
        window_state_schemas=schemas,
    )


# The expected outcome (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """An input record as read back from the topic."""

    partition: int
    offset: int
    key: str
    value: int
    ts: int


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
    events: Iterable[Event], cut: SavepointCut, window_ms: int, keeps: Callable[[int], bool] = v2_keeps
) -> Expectation:
    """Each window's one result, by the rules in this module's docstring."""
    before: dict[WindowKey, list[int]] = defaultdict(list)
    after: dict[WindowKey, list[int]] = defaultdict(list)
    n_before = n_after = filtered = 0
    for e in events:
        window = (e.key, window_start(e.ts, 0, window_ms))
        if cut.before(e.partition, e.offset):
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


@dataclass(frozen=True)
class SinkCheck:
    sink: str
    found: int  # records or rows
    by_version: Mapping[Any, int]  # windows found, by the version they say
    duplicates: int
    missing: int
    unexpected: int
    mismatched: int
    interleaved: int  # keys with a version-2 window before a version-1 window
    open_transactions: tuple[str, ...] = ()
    samples: tuple[str, ...] = ()

    @property
    def windows(self) -> int:
        return sum(self.by_version.values())

    def problems(self) -> list[str]:
        counts = (
            (self.duplicates, "duplicate(s)"),
            (self.missing, "missing"),
            (self.unexpected, "unexpected"),
            (self.mismatched, "mismatched"),
            (self.interleaved, "key(s) with a v2 window before a v1 window"),
            (len(self.open_transactions), "open or prepared transaction(s)"),
        )
        return [f"{n} {label}" for n, label in counts if n]

    @property
    def ok(self) -> bool:
        return not self.problems()


def check_sink(
    sink: str,
    expected: Mapping[WindowKey, Result],
    found: Iterable[Result | None],
    open_transactions: Sequence[str] = (),
    samples: int = 5,
) -> SinkCheck:
    """Per window exactly the expected result (``None`` in ``found``: a record that does not parse)."""
    by_window: dict[WindowKey, list[Result]] = defaultdict(list)
    shown: list[str] = []
    unreadable = 0
    for result in found:
        if result is None or "key" not in result or "window_start" not in result:
            unreadable += 1
            _sample(shown, samples, f"unreadable: {result!r}")
            continue
        by_window[(result["key"], result["window_start"])].append(result)
    duplicates = mismatched = 0
    for window, results in sorted(by_window.items()):
        if len(results) > 1:
            duplicates += len(results) - 1
            _sample(shown, samples, f"duplicate: {window} found {len(results)}x")
        want = expected.get(window)
        if want is not None and any(r != want for r in results):
            mismatched += 1
            _sample(shown, samples, f"mismatched: {window}: expected {want}, found {results}")
    missing = [w for w in expected if w not in by_window]
    unexpected = [w for w in by_window if w not in expected]
    for w in missing:
        _sample(shown, samples, f"missing: {expected[w]}")
    for w in unexpected:
        _sample(shown, samples, f"unexpected: {by_window[w]}")
    versions: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for (key, start), results in by_window.items():
        versions[key][results[0].get("v")].append(start)
    interleaved = sum(1 for v in versions.values() if v.get(1) and v.get(2) and max(v[1]) > min(v[2]))
    return SinkCheck(
        sink=sink,
        found=sum(len(r) for r in by_window.values()) + unreadable,
        by_version=Counter(results[0].get("v") for results in by_window.values()),
        duplicates=duplicates,
        missing=len(missing),
        unexpected=len(unexpected) + unreadable,
        mismatched=mismatched,
        interleaved=interleaved,
        open_transactions=tuple(open_transactions),
        samples=tuple(shown),
    )


def _sample(samples: list[str], limit: int, text: str) -> None:
    if len(samples) < limit:
        samples.append(text if len(text) <= 300 else text[:297] + "...")


# Running it ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpgradeOutcome:
    config: ScenarioConfig
    v1_job: str
    v2_job: str
    cut: SavepointCut
    expectation: Expectation
    sinks: tuple[SinkCheck, ...]
    last_before_cut: Mapping[int, int]  # per partition, the event time of the last event version 1 read
    timings: Mapping[str, float] = field(default_factory=dict)

    def scenario_problems(self) -> list[str]:
        """What would make the run prove nothing about the upgrade."""
        e = self.expectation
        checks = (
            (e.count(1) == 0, "version 1 fired no window before the savepoint"),
            (e.count(2) == 0, "version 2 produced no window"),
            (e.migrated == 0, "no window was open at the cut (nothing was migrated)"),
            (e.events_after == 0, "version 1 read all the input before the savepoint"),
            (e.filtered == 0, "version 2's filter dropped nothing"),
        )
        return [text for failed, text in checks if failed]

    def problems(self) -> list[str]:
        return [f"{s.sink}: {', '.join(s.problems())}" for s in self.sinks if not s.ok] + self.scenario_problems()

    @property
    def ok(self) -> bool:
        return not self.problems()


def run_upgrade_scenario(endpoints: Endpoints, config: ScenarioConfig, console: Console) -> UpgradeOutcome:
    """Everything but starting the cluster: inputs, v1 under load, stop with savepoint, v2 from it, the check."""
    savepoint_dir = config.savepoint_dir or f"s3://{endpoints.s3_bucket}/scenario-upgrade/savepoints"
    timings: dict[str, float] = {}
    began = time.monotonic()
    recreate_inputs(
        endpoints,
        {config.source_topic: config.partitions, config.sink_topic: 3, config.dlq_topic: 1},
        config.table,
        TABLE_DEFINITION,
    )
    console.print(
        f"inputs: topics {config.source_topic} ({config.partitions} partitions), {config.sink_topic}, "
        f"{config.dlq_topic}; table {config.table} ({TABLE_DEFINITION})",
        soft_wrap=True,
    )
    producer = _Producer(endpoints, config)
    producer.start()
    console.print(
        f"producing {config.events:,} events at {config.events_per_second:,}/s in the background "
        f"({config.keys} keys, values {config.min_value}..{config.min_value + 96})"
    )
    try:
        with JobManagerClient(endpoints.jobmanager_address) as client:
            v1, savepoint_path = _run_v1(client, config, producer, savepoint_dir, console, timings)
            t = time.monotonic()
            produced = producer.join(config.timeout_s)
            timings["rest of the input"] = time.monotonic() - t
            console.print(f"input complete: {produced:,} events")
            print_savepoint_info(console, savepoint_path)
            cut = read_savepoint(savepoint_path, endpoints)
            v2 = _run_v2(client, config, savepoint_path, console, timings)
    finally:
        producer.stop()
    t = time.monotonic()
    events = read_input(endpoints, config.source_topic)
    expectation = expected_results(events, cut, config.window_ms)
    sinks = (
        _check_kafka(endpoints, config, expectation),
        _check_postgres(endpoints, config, expectation, (v1, v2)),
    )
    timings["check"] = time.monotonic() - t
    timings["total"] = time.monotonic() - began
    last_before: dict[int, int] = {}
    for e in events:
        if cut.before(e.partition, e.offset):
            last_before[e.partition] = max(last_before.get(e.partition, e.ts), e.ts)
    return UpgradeOutcome(config, v1, v2, cut, expectation, sinks, last_before, timings)


class _Producer:
    """The input, produced in a thread at the configured pace (live input while version 1 runs)."""

    def __init__(self, endpoints: Endpoints, config: ScenarioConfig) -> None:
        self.produced = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._result: int | None = None

        def produce() -> None:
            try:
                self._result = produce_events(
                    endpoints,
                    config.source_topic,
                    config.event_spec(),
                    on_progress=self._advance,
                    records_per_second=config.events_per_second,
                    progress_every=max(1, config.events_per_second // 10),
                    stop=self._stop,
                )
            except BaseException as exc:  # reported by join()
                self._error = exc

        self._thread = threading.Thread(target=produce, name="scenario-producer", daemon=True)

    def _advance(self, n: int) -> None:
        self.produced += n

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(70)

    def join(self, timeout_s: float) -> int:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise ScenarioError(f"the producer did not finish within {timeout_s:.0f}s")
        if self._error is not None:
            raise ScenarioError(f"producing the input failed: {self._error}") from self._error
        assert self._result is not None
        return self._result


def _window_records_in(status: JobDetails) -> int:
    return sum(t.records_in for t in status.tasks if t.vertex_uid == WINDOW_UID)


def _run_v1(
    client: JobManagerClient,
    config: ScenarioConfig,
    producer: _Producer,
    savepoint_dir: str,
    console: Console,
    timings: dict[str, float],
) -> tuple[str, str]:
    """Version 1 on the live input until it has checkpointed and read enough; then ``weir stop``."""
    params = config.parameters(bounded=False)
    t = time.monotonic()
    v1 = client.submit_job(V1_FILE, params, config.v1_parallelism)
    console.print(
        f"v1 [bold]{v1}[/] submitted: {V1_FILE.name} -p {config.v1_parallelism} "
        + " ".join(f"-D {k}={v}" for k, v in params.items()),
        soft_wrap=True,
    )
    stop_at = int(config.events * config.stop_at_fraction)
    shown = [0.0]

    def report(status: JobDetails) -> None:
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
        on_poll=report,
    )
    timings["v1 until the stop"] = time.monotonic() - t
    console.print(
        f"  v1: {_window_records_in(status):,} events aggregated, checkpoint "
        f"{status.last_completed_checkpoint} completed; {producer.produced:,} produced so far"
    )
    t = time.monotonic()
    stop = _weir(console, ["stop", v1, "--savepoint-path", savepoint_dir, "--json"], timeout_s=config.timeout_s)
    answer = json.loads(stop)
    timings["stop with savepoint"] = time.monotonic() - t
    return v1, str(answer["path"])


def _run_v2(
    client: JobManagerClient, config: ScenarioConfig, savepoint_path: str, console: Console, timings: dict[str, float]
) -> str:
    params = config.parameters(bounded=True)
    t = time.monotonic()
    v2 = client.submit_job(V2_FILE, params, config.v2_parallelism, from_checkpoint=savepoint_path)
    console.print(
        f"v2 [bold]{v2}[/] submitted: {V2_FILE.name} --from-savepoint {savepoint_path} -p {config.v2_parallelism} "
        + " ".join(f"-D {k}={v}" for k, v in params.items()),
        soft_wrap=True,
    )
    status = wait_for_job(client, v2, lambda s: s.summary.status == "FINISHED", config.timeout_s, "FINISHED")
    timings["v2 to its end"] = time.monotonic() - t
    console.print(
        f"  v2 [green]FINISHED[/]: {_window_records_in(status):,} events aggregated (after its filter), "
        f"restarts {status.summary.restarts}, last checkpoint {status.last_completed_checkpoint}"
    )
    return v2


def _weir(console: Console, args: Sequence[str], timeout_s: float) -> str:
    """Run ``weir ARGS`` (this Python's CLI) as a user would, show the command and what it printed;
    answer its stdout, ScenarioError when it fails."""
    console.print("$ weir " + " ".join(args), soft_wrap=True, markup=False, highlight=False)
    done = subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, "COLUMNS": str(console.width)},
    )
    for line in (done.stdout + done.stderr).rstrip().splitlines():
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if done.returncode != 0:
        raise ScenarioError(f"weir {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def read_input(endpoints: Endpoints, topic: str) -> list[Event]:
    """Every event of the input topic, with its partition and offset."""
    out: list[Event] = []
    for partition, offset, _key, value, _ts in kafka.read_committed_records(endpoints, topic):
        event = json.loads(value or b"null")
        out.append(Event(partition, offset, event["key"], event["value"], event["ts"]))
    return out


def _check_kafka(endpoints: Endpoints, config: ScenarioConfig, expectation: Expectation) -> SinkCheck:
    topic = config.sink_topic
    partitions = kafka.partition_count(endpoints, topic)
    open_txns = open_kafka_transactions(endpoints, topic, partitions, OPEN_TRANSACTION_GRACE_S)
    found = [_json(value) for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, topic)]
    return check_sink(f"kafka {topic}", expectation.results, found, [t.detail for t in open_txns])


def _json(value: bytes | None) -> Result | None:
    try:
        parsed = json.loads(value or b"")
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _check_postgres(
    endpoints: Endpoints, config: ScenarioConfig, expectation: Expectation, jobs: Sequence[str]
) -> SinkCheck:
    with postgres.connect(endpoints, autocommit=True) as conn:
        rows = postgres.fetch_rows(conn, config.table, COLUMNS)
        prepared = postgres.prepared_transactions(conn)
    open_txns = [
        f"prepared transaction {gid}"
        for gid, _at, _db in prepared
        if any(sink_transaction(gid, POSTGRES_SINK_UID, job) is not None for job in jobs)
    ]
    expected = {w: {c: r.get(c) for c in COLUMNS} for w, r in expectation.results.items()}
    found = [dict(zip(COLUMNS, row, strict=True)) for row in rows]
    return check_sink(f"postgres {config.table}", expected, found, open_txns)


# Printing ----------------------------------------------------------------------------------------------


def _clock(ms: int) -> str:
    if abs(ms) > 10**14:
        return "none yet"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def print_savepoint_info(console: Console, path: str) -> None:
    """``weir savepoint info PATH``: the savepoint as the product shows it, read offline."""
    _weir(console, ["savepoint", "info", path], timeout_s=120.0)


def print_outcome(console: Console, outcome: UpgradeOutcome) -> None:
    e, cut = outcome.expectation, outcome.cut
    console.rule("the cut")
    cut_table = Table("partition", "next offset (savepoint)", "last event time read by v1", title="source positions")
    for p in sorted(set(cut.next_offsets) | set(outcome.last_before_cut)):
        last = outcome.last_before_cut.get(p)
        cut_table.add_row(str(p), str(cut.next_offsets.get(p, 0)), _clock(last) if last is not None else "-")
    console.print(cut_table)
    console.print(
        "window watermarks at the savepoint: "
        + ", ".join(f"#{w.subtask} {w.key_groups} {_clock(w.watermark)}" for w in cut.window_watermarks)
        + " (v1 fired each window whose last millisecond its subtask's watermark had reached)",
        highlight=False,
    )
    console.print(
        f"{WINDOW_UID} accumulators in the savepoint: {', '.join(cut.window_state_schemas)}; "
        "v2 declares version 2 and migrates them (count, sum) -> (count, sum, max unknown)",
        highlight=False,
    )
    console.print(
        f"events: {e.events_before + e.events_after:,}; {e.events_before:,} before the cut (v1), "
        f"{e.events_after:,} after it (v2: {e.filtered:,} dropped by its filter, {e.late:,} late)"
    )
    console.rule("outcome: one result per window in each sink")
    table = Table("", "expected", *(s.sink for s in outcome.sinks))
    table.add_row("windows", f"{len(e.results):,}", *(f"{s.windows:,}" for s in outcome.sinks))
    table.add_row(
        "  from v1 (fired before the savepoint)",
        f"{e.count(1):,}",
        *(f"{s.by_version.get(1, 0):,}" for s in outcome.sinks),
    )
    table.add_row("  from v2", f"{e.count(2):,}", *(f"{s.by_version.get(2, 0):,}" for s in outcome.sinks))
    table.add_row("    of them open at the cut (migrated)", f"{e.migrated:,}", *("" for _ in outcome.sinks))
    for label, attr in (
        ("duplicates", "duplicates"),
        ("missing", "missing"),
        ("unexpected", "unexpected"),
        ("mismatched", "mismatched"),
        ("keys with v2 before v1", "interleaved"),
    ):
        table.add_row(label, "0", *(_count(getattr(s, attr)) for s in outcome.sinks))
    table.add_row("open / prepared transactions", "0", *(_count(len(s.open_transactions)) for s in outcome.sinks))
    console.print(table)
    for s in outcome.sinks:
        for line in (*s.samples, *s.open_transactions):
            console.print(f"  {s.sink}: {line}", soft_wrap=True, markup=False, highlight=False)
    console.print(f"savepoint: {cut.path}", soft_wrap=True, highlight=False)
    console.print(f"jobs: v1 {outcome.v1_job}, v2 {outcome.v2_job}")
    console.print("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in outcome.timings.items()))
    if outcome.ok:
        console.print("[bold green]OK[/]: every window has exactly one result in each sink, from the version expected")
    else:
        for problem in outcome.problems():
            console.print(f"[bold red]FAILED[/]: {problem}", soft_wrap=True)


def _count(n: int) -> str:
    return "0" if n == 0 else f"[bold red]{n:,}[/]"


def main(argv: Sequence[str] | None = None) -> int:
    defaults = ScenarioConfig()
    parser = argparse.ArgumentParser(prog="python -m weir.tools.scenario_upgrade", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--events-per-second", type=int, default=defaults.events_per_second)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--savepoint-path", default="", help="default s3://<bucket>/scenario-upgrade/savepoints")
    args = parser.parse_args(argv)
    config = replace(
        defaults,
        events=args.events,
        events_per_second=args.events_per_second,
        keys=args.keys,
        savepoint_dir=args.savepoint_path,
    )
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, WIDE)  # a log or CI: its tables unwrapped
    endpoints = s3_endpoints()
    console.rule("[bold]Weir scenario: savepoint-based upgrade, v1 -> stop with savepoint -> v2 at another parallelism")
    try:
        start_local_cluster(console, endpoints)
        outcome = run_upgrade_scenario(endpoints, config, console)
    except WeirError as exc:
        console.print(f"[bold red]scenario-upgrade: {exc}[/]", soft_wrap=True)
        return 1
    print_outcome(console, outcome)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
