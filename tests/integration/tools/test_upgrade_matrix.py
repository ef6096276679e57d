"""`weir upgrade check` against real restores (issue 33): a version-1 keyed window aggregation with both
exactly-once sinks (Kafka transactions, PostgreSQL two-phase commit) runs on the session cluster at
parallelism 2 over the first part of its input and is stopped with a savepoint (on S3); the second
part of the input is produced after it. Then, for each version 2 of the matrix, `weir upgrade check`
gives its verdict, and the same version 2 is actually restored from the savepoint with `weir run
--from-savepoint --skip-upgrade-check` (the check bypassed) and runs to the end of the input. The
restore is a success when the job FINISHED and what both sinks committed, version 1's and version 2's
together, is what the reference run commits: the version-1 job run without a savepoint over the
whole input in this process (``weir.tools.jobtest.run_once``), compared as multisets of whole records
(Kafka) and rows (PostgreSQL).

The check must say PASS exactly when the restore is a success: no false PASS, no false FAIL. Each
variant also states the verdict it is built to get, so that a matrix where everything fails, or
everything passes, cannot pass.

One v1 run and savepoint serve every variant (module fixture); each variant writes to topics and a
table of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster, create_topics
from weir.connectors import kafka, postgres
from weir.core.states import JobStatus
from weir.tools.client import JobDetails
from weir.tools.jobtest import records_of_lines, run_once
from weir.tools.verify import open_kafka_transactions

pytestmark = pytest.mark.integration

PARALLELISM = 2
PARTITIONS = 2
KEYS = 16
EVENTS_BEFORE = 500  # read by version 1, before the savepoint: the cut is halfway through a window
EVENTS_AFTER = 460  # produced after the savepoint, read by version 2: the first land in that window
TS_STEP_MS = 25  # 40 events per 1 s window: every window of a key gets a few events
BASE_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW_UID = "window-count-sum"
COLUMNS = ("key", "window_start", "window_end", "count", "sum")
TABLE = "key text, window_start bigint, window_end bigint, count bigint, sum bigint, PRIMARY KEY (key, window_start)"

JOB_TEMPLATE = '''
"""Upgrade matrix job ({name}): events -> key -> 1 s tumbling windows of (count, sum) -> Kafka and PostgreSQL."""
import json

from weir.api import Environment, TumblingEventTimeWindows

COLUMNS = ("key", "window_start", "window_end", "count", "sum")


def parse_event(raw):
    return json.loads(raw)


class Aggregate:
    def create(self):
        return (0, 0)

    def add(self, acc, pair):
        {add}

    def result(self, key, start, end, acc):
        count, total = {unpack}
        return {{"key": key.removeprefix("user:"), "window_start": start, "window_end": end, "count": count,
                "sum": total}}


def migrate(stored_version, acc):
    {migrate}


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "matrix-events"),
        uid="events-source",
        bounded=p.get_bool("source.bounded", False),
        deserializer=parse_event,
        timestamp=lambda e: e["ts"],
        dead_letter_topic=p.get_str("source.dlq_topic", "matrix-dlq"),
    )
    results = (
        events.map(lambda e: (e["key"], e["value"]), uid="key-value", name="project")
        .key_by({key})
        .window(TumblingEventTimeWindows(1000))
        .aggregate(Aggregate(), uid="{window_uid}"{aggregate_args})
    )
    results.sink_to_kafka(p.get_str("sink.topic", "matrix-results"), uid="kafka-sink", key=lambda r: r["key"])
    {postgres_sink}
'''

POSTGRES_SINK = (
    'results.sink_to_postgres(p.get_str("sink.table", "matrix_results"), uid="postgres-sink", columns=COLUMNS, '
    'key_columns=("key", "window_start"))'
)
V1_ADD = "return (acc[0] + 1, acc[1] + pair[1])"


@dataclass(frozen=True)
class Version:
    """One version of the job: what differs from version 1."""

    name: str
    expect_pass: bool  # the verdict this variant is built to get (the restore's outcome decides)
    key: str = "lambda pair: pair[0]"
    window_uid: str = WINDOW_UID
    add: str = V1_ADD
    unpack: str = "acc"
    migrate: str = "return acc"
    aggregate_args: str = ""
    postgres_sink: str = POSTGRES_SINK

    def write(self, folder: Path) -> Path:
        path = folder / f"matrix_{self.name.replace('-', '_')}.py"
        path.write_text(
            JOB_TEMPLATE.format(
                name=self.name,
                key=self.key,
                window_uid=self.window_uid,
                add=self.add,
                unpack=self.unpack,
                migrate=self.migrate,
                aggregate_args=self.aggregate_args,
                postgres_sink=self.postgres_sink,
            )
        )
        return path


V1 = Version("v1", expect_pass=True)
# Version 2's accumulator is (sum, count): the same results, another state layout, version 2.
SWAPPED = {"add": "return (acc[0] + pair[1], acc[1] + 1)", "unpack": "(acc[1], acc[0])"}
MATRIX = (
    Version("unchanged", expect_pass=True),
    Version("renamed-uid", expect_pass=False, window_uid="window-count-sum-v2"),
    # Keys "user:<key>": the results read the same (the prefix is cut off), but the state of the
    # windows open at the savepoint stays under the old keys: those windows fire twice, split.
    Version("changed-key-function", expect_pass=False, key='lambda pair: "user:" + pair[0]'),
    Version("rewritten-key-function", expect_pass=True, key="lambda pair: str(pair[0])"),
    Version(
        "accumulator-with-migrate",
        expect_pass=True,
        migrate="return (acc[1], acc[0])",
        aggregate_args=", state_version=2, migrate=migrate",
        **SWAPPED,
    ),
    Version("accumulator-without-migrate", expect_pass=False, aggregate_args=", state_version=2", **SWAPPED),
    Version(
        "migrate-fails-on-some",
        expect_pass=False,
        migrate=(
            "if acc[1] % 2:\n        raise ValueError(f'cannot migrate an odd sum {acc!r}')\n"
            "    return (acc[1], acc[0])"
        ),
        aggregate_args=", state_version=2, migrate=migrate",
        **SWAPPED,
    ),
    Version("removed-sink", expect_pass=False, postgres_sink="pass"),
)
TWINS = ("twin-a", "twin-b")
"""Two jobs of the unchanged version 2 restored from the savepoint at the same time, each with its
own topic and table."""


def event(n: int) -> bytes:
    key = f"k{n % KEYS:02d}"
    return json.dumps({"id": n, "key": key, "value": (n * 7) % 23 - 5, "ts": BASE_TS + n * TS_STEP_MS}).encode()


def produce(cluster: WeirCluster, topic: str, numbers: range) -> None:
    """Events in event-time order, partition n mod 2: event time never goes back within a partition."""
    producer = kafka.producer(cluster.endpoints, acks="all")
    for n in numbers:
        producer.produce(topic, event(n), partition=n % PARTITIONS)
    assert producer.flush(30) == 0, "the events were not all delivered"


def weir(*args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", *args], capture_output=True, text=True, timeout=timeout_s
    )


def window_records_in(status: JobDetails) -> int:
    return sum(t.records_in_all_attempts for t in status.tasks if t.vertex_uid == WINDOW_UID)


@dataclass(frozen=True)
class Outputs:
    kafka: Counter[str]
    postgres: Counter[tuple[Any, ...]]
    partitions: Counter[int] = field(default_factory=Counter)
    """Records per partition of the Kafka topic (for the failure message)."""


def read_outputs(cluster: WeirCluster, topic: str, table: str) -> Outputs:
    """What the sinks committed. A committed transaction's markers land a moment after the commit
    returns: the topic's last stable offsets are waited for first (a transaction left open fails)."""
    endpoints = cluster.endpoints
    partitions = kafka.partition_count(endpoints, topic)
    still_open = open_kafka_transactions(endpoints, topic, partitions, 30.0)
    assert not still_open, [t.detail for t in still_open]
    found = kafka.read_committed_records(cluster.endpoints, topic)
    # Records deleted before the read would read as missing output: say so instead.
    starts = {p: low for p, (low, _stable, _high) in kafka.partition_offsets(endpoints, topic, partitions).items()}
    assert not any(starts.values()), f"records of {topic} were deleted (log start offsets {starts}): retention?"
    records = Counter(json.dumps(json.loads(value), sort_keys=True) for _p, _o, _k, value, _ts in found)
    with postgres.connect(cluster.endpoints, autocommit=True) as conn:
        rows = Counter(tuple(row) for row in postgres.fetch_rows(conn, table, COLUMNS))
    return Outputs(records, rows, Counter(p for p, *_ in found))


@dataclass(frozen=True)
class Setup:
    prefix: str
    folder: Path
    savepoint: str
    v1_outputs: Outputs
    reference: Outputs

    def parameters(self, sink: str, *, bounded: bool) -> list[str]:
        values = {
            "source.topic": f"{self.prefix}-events",
            "source.dlq_topic": f"{self.prefix}-dlq",
            "source.bounded": "true" if bounded else "false",
            "sink.topic": f"{self.prefix}-{sink}",
            "sink.table": f"{self.prefix.replace('-', '_')}_{sink.replace('-', '_')}",
            "checkpointing.interval": "1s",
            "restart.strategy": "none",
        }
        return [arg for k, v in values.items() for arg in ("-D", f"{k}={v}")]


def reference_outputs(folder: Path) -> Outputs:
    """The version-1 job over the whole input, in this process, without a savepoint or a failure."""
    lines = [event(n) for n in range(EVENTS_BEFORE + EVENTS_AFTER)]
    run = run_once(V1.write(folder), {"events-source": records_of_lines(lines)}, {"source.bounded": "true"})
    records = Counter(json.dumps(v, sort_keys=True) for v, _ts in run.by_operator["kafka-sink"])
    rows = Counter(run.sink_capture("postgres-sink").final_rows().values())
    return Outputs(records, rows)


@pytest.fixture(scope="module")
def setup(weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """Version 1 over the first part of the input, stopped with a savepoint; then the second part."""
    # Version 2's first events land in windows open at the savepoint: their state is what a restore keeps
    # or loses (a cut on a window boundary would leave every open window to fire untouched).
    assert (EVENTS_BEFORE * TS_STEP_MS) % 1000 != 0
    prefix = f"matrix-{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("upgrade-matrix")
    endpoints = weir_cluster.endpoints
    sinks = ["v1", *(v.name for v in MATRIX), *TWINS]
    # Topics that keep their records for ever: the sinks' records carry event timestamps from BASE_TS on.
    create_topics(
        endpoints,
        {f"{prefix}-events": PARTITIONS, f"{prefix}-dlq": 1} | {f"{prefix}-{s}": 2 for s in sinks},
    )
    for s in sinks:
        postgres.replace_table(endpoints, f"{prefix.replace('-', '_')}_{s.replace('-', '_')}", TABLE)
    produce(weir_cluster, f"{prefix}-events", range(EVENTS_BEFORE))
    setup = Setup(prefix, folder, "", Outputs(Counter(), Counter()), reference_outputs(folder))

    v1 = weir(
        "run", str(V1.write(folder)), "-p", str(PARALLELISM), "-d", "--json", *setup.parameters("v1", bounded=False)
    )
    assert v1.returncode == 0, v1.stderr
    v1_job = json.loads(v1.stdout)["job_id"]
    weir_cluster.submitted.append(v1_job)
    client = weir_cluster.client
    polling.until(
        "version 1 to aggregate the first part of the input",
        180,
        lambda: window_records_in(client.job_status(v1_job)) >= EVENTS_BEFORE,
    )
    savepoint_id = client.trigger_savepoint(v1_job, f"s3://{endpoints.s3_bucket}/{prefix}-savepoints", stop=True)
    path = client.wait_for_savepoint(v1_job, savepoint_id, timeout_s=180.0).external_path
    ended = polling.until(
        "version 1 to end", 180, lambda: (s := client.job_status(v1_job)).summary.status.terminal and s
    )
    assert ended.summary.status is JobStatus.FINISHED, ended.failure
    produce(weir_cluster, f"{prefix}-events", range(EVENTS_BEFORE, EVENTS_BEFORE + EVENTS_AFTER))
    v1_outputs = read_outputs(weir_cluster, f"{prefix}-v1", f"{prefix.replace('-', '_')}_v1")
    # The savepoint cut through windows: some fired in version 1, some are left to version 2.
    assert 0 < sum(v1_outputs.kafka.values()) < sum(setup.reference.kafka.values())
    yield Setup(prefix, folder, path, v1_outputs, setup.reference)


@dataclass(frozen=True)
class Restore:
    finished: bool
    matches: bool
    detail: str


def restore(cluster: WeirCluster, setup: Setup, version: Version) -> Restore:
    """Version 2 from the savepoint, the check bypassed, to the end of the input."""
    job = version.write(setup.folder)
    args = ["run", str(job), "-s", setup.savepoint, "--skip-upgrade-check", "-p", str(PARALLELISM), "--json"]
    done = weir(*args, *setup.parameters(version.name, bounded=True))
    if done.returncode != 0:
        return Restore(False, False, f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
    status = json.loads(done.stdout)
    cluster.submitted.append(status["summary"]["job_id"])
    table = f"{setup.prefix.replace('-', '_')}_{version.name.replace('-', '_')}"
    v2 = read_outputs(cluster, f"{setup.prefix}-{version.name}", table)
    kafka_all = setup.v1_outputs.kafka + v2.kafka
    rows_all = setup.v1_outputs.postgres + v2.postgres
    reference = setup.reference
    matches = kafka_all == reference.kafka and rows_all == reference.postgres
    missing = reference.kafka - kafka_all
    detail = (
        f"kafka: {sum((kafka_all - reference.kafka).values())} extra, {sum(missing.values())} missing "
        f"(version 2 wrote {dict(v2.partitions)} records by partition; e.g. missing {next(iter(missing), None)}); "
        f"postgres: {sum((rows_all - reference.postgres).values())} extra, "
        f"{sum((reference.postgres - rows_all).values())} missing; job {status['summary']['job_id']}"
    )
    return Restore(True, matches, detail)


@pytest.mark.parametrize("version", MATRIX, ids=[v.name for v in MATRIX])
def test_the_check_passes_exactly_when_the_restore_keeps_the_output(
    weir_cluster: WeirCluster, setup: Setup, version: Version
) -> None:
    job = version.write(setup.folder)
    # The check only reads the savepoint: it runs beside the restore, whose outcome it is held to.
    check = subprocess.Popen(
        [sys.executable, "-m", "weir.tools.cli", "upgrade", "check", str(job), "--savepoint", setup.savepoint]
        + ["--json", *setup.parameters(version.name, bounded=True)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        outcome = restore(weir_cluster, setup, version)
        out, err = check.communicate(timeout=240)
    finally:
        if check.poll() is None:
            check.kill()
            check.wait(30)
    assert check.returncode in (0, 1), err
    report = json.loads(out)
    success = outcome.finished and outcome.matches
    fatal = [f for f in report["findings"] if f["severity"] == "fatal"]
    assert (report["verdict"] == "PASS") == success, (
        f"{version.name}: check {report['verdict']} {fatal}, restore finished={outcome.finished} "
        f"matches={outcome.matches}: {outcome.detail}"
    )
    assert success == version.expect_pass, f"{version.name}: {outcome.detail}; check {report['verdict']} {fatal}"


def test_the_sink_topics_keep_output_as_old_as_the_inputs_event_times(weir_cluster: WeirCluster, setup: Setup) -> None:
    """The sinks write each record with its event timestamp, from BASE_TS on: a sink topic whose time
    retention is shorter than that age loses its records at the broker's next retention check (every
    5 min by default), which reads as a restore's output missing from Kafka (``create_topics``)."""
    age_ms = int(time.time() * 1000) - BASE_TS
    for sink in ["v1", *(v.name for v in MATRIX)]:
        topic = f"{setup.prefix}-{sink}"
        retention_ms = int(kafka.topic_configs(weir_cluster.endpoints, topic, ["retention.ms"])["retention.ms"])
        assert retention_ms < 0 or retention_ms > age_ms + 3_600_000, (
            f"{topic}: retention.ms={retention_ms}, but its records carry event timestamps {age_ms} ms old"
        )


def test_two_jobs_restored_from_one_savepoint_at_once_both_keep_the_output(
    weir_cluster: WeirCluster, setup: Setup
) -> None:
    """Two jobs started from one savepoint at the same time (with Flink's KafkaSink each needs a
    transactional id prefix of its own, or their producers fence and abort each other): each job's
    Kafka transactional ids, marker topic and PostgreSQL gids carry its own job id, and the
    savepoint's transactions are resolved before either job runs, so both commit all of the rest."""
    job = MATRIX[0].write(setup.folder)
    assert MATRIX[0].name == "unchanged"
    runs = {
        twin: subprocess.Popen(
            [sys.executable, "-m", "weir.tools.cli", "run", str(job), "-s", setup.savepoint, "--skip-upgrade-check"]
            + ["-p", str(PARALLELISM), "--json", *setup.parameters(twin, bounded=True)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for twin in TWINS
    }
    ended = {twin: (run.communicate(timeout=300), run.returncode) for twin, run in runs.items()}
    for twin, ((out, err), code) in ended.items():
        assert code == 0, f"{twin}: exit {code} (not FINISHED): {err.strip()[-600:]}"
        status = json.loads(out)
        weir_cluster.submitted.append(status["summary"]["job_id"])
        v2 = read_outputs(
            weir_cluster, f"{setup.prefix}-{twin}", f"{setup.prefix.replace('-', '_')}_{twin.replace('-', '_')}"
        )
        kafka_all, rows_all = setup.v1_outputs.kafka + v2.kafka, setup.v1_outputs.postgres + v2.postgres
        reference = setup.reference
        assert kafka_all == reference.kafka, (
            f"{twin}: kafka {sum((reference.kafka - kafka_all).values())} missing, "
            f"{sum((kafka_all - reference.kafka).values())} extra (by partition {dict(v2.partitions)})"
        )
        assert rows_all == reference.postgres, (
            f"{twin}: postgres {sum((reference.postgres - rows_all).values())} missing, "
            f"{sum((rows_all - reference.postgres).values())} extra"
        )
