"""``weir test --failures``: a corpus of job bugs, each caught with the operator and the failure point
that expose it, and the same jobs written correctly passing.

Each job reads Kafka source ``events`` (JSON lines from a file), passes through a map ``enrich``
and ends in a Kafka sink; the bug sits in one operator. No service is reached: sources replay the
lines and sinks are captured.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from weir.connectors import kafka, postgres
from weir.core.errors import JobDefinitionError
from weir.tools.cli import app, run_cli
from weir.tools.jobtest import (
    VIRTUAL_EPOCH_MS,
    FailurePoint,
    JobTestError,
    Phase,
    check_job,
    read_jsonl,
    records_of_lines,
    run_once,
)

HEADER = """
import json
import sys
import random
import time
from weir.api import Environment, ProcessWindowFunction, TumblingEventTimeWindows, TumblingProcessingTimeWindows


class Count:
    def create(self):
        return 0

    def add(self, acc, event):
        return acc + 1

    def result(self, key, start, end, acc):
        return {"key": key, "start": start, "count": acc}


def source(env):
    return env.from_kafka("events", uid="events", deserializer=json.loads, timestamp=lambda e: e["ts"])
"""

GLOBAL_COUNTER = """
SEQ = 0

def number(e):
    global SEQ
    SEQ += 1
    return {**e, "seq": SEQ}

def build(env: Environment) -> None:
    source(env).map(number, uid="enrich").sink_to_kafka("out", uid="sink")
"""

KEYED_COUNTER = """
def build(env: Environment) -> None:
    numbered = source(env).map(lambda e: {**e, "seq": 1}, uid="enrich").key_by(lambda e: "all").reduce(
        lambda a, b: {**b, "seq": a["seq"] + 1}, uid="number")
    numbered.sink_to_kafka("out", uid="sink")
"""

CLOSURE_DEDUP = """
def first_seen():
    seen = set()

    def new(e):
        if e["id"] in seen:
            return False
        seen.add(e["id"])
        return True

    return new

def build(env: Environment) -> None:
    source(env).map(lambda e: e, uid="enrich").filter(first_seen(), uid="dedup").sink_to_kafka("out", uid="sink")
"""

KEYED_DEDUP = """
def build(env: Environment) -> None:
    counted = source(env).map(lambda e: {**e, "n": 1}, uid="enrich").key_by(lambda e: e["id"]).reduce(
        lambda a, b: {**b, "n": a["n"] + 1}, uid="dedup")
    counted.filter(lambda e: e["n"] == 1, uid="first").sink_to_kafka("out", uid="sink")
"""

RANDOM_KEY = """
def build(env: Environment) -> None:
    source(env).map(lambda e: e, uid="enrich").key_by(lambda e: random.randrange(4)).window(
        TumblingEventTimeWindows(100)).aggregate(Count(), uid="totals").sink_to_kafka("out", uid="sink")
"""

FIELD_KEY = """
def build(env: Environment) -> None:
    source(env).map(lambda e: e, uid="enrich").key_by(lambda e: e["user"]).window(
        TumblingEventTimeWindows(100)).aggregate(Count(), uid="totals").sink_to_kafka("out", uid="sink")
"""

SIDE_EFFECT_MAP = """
TOTALS = {}

def running_total(e):
    TOTALS[e["user"]] = TOTALS.get(e["user"], 0) + e["amount"]
    return {**e, "total": TOTALS[e["user"]]}

def build(env: Environment) -> None:
    source(env).map(running_total, uid="enrich").sink_to_kafka("out", uid="sink")
"""

KEYED_TOTAL = """
def build(env: Environment) -> None:
    totals = source(env).map(lambda e: {**e, "total": e["amount"]}, uid="enrich").key_by(lambda e: e["user"]).reduce(
        lambda a, b: {**b, "total": a["total"] + b["amount"]}, uid="total")
    totals.sink_to_kafka("out", uid="sink")
"""

WALL_CLOCK_WINDOW = """
class Stamp(ProcessWindowFunction):
    def process(self, key, context, elements, out):
        for result in elements:
            out.collect({**result, "emitted_at": time.time()})

def build(env: Environment) -> None:
    source(env).map(lambda e: e, uid="enrich").key_by(lambda e: e["user"]).window(
        TumblingEventTimeWindows(100)).aggregate(Count(), uid="totals", window_function=Stamp()).sink_to_kafka(
        "out", uid="sink")
"""

WINDOW_END_STAMP = """
class Stamp(ProcessWindowFunction):
    def process(self, key, context, elements, out):
        for result in elements:
            out.collect({**result, "emitted_at": context.window.end})

def build(env: Environment) -> None:
    source(env).map(lambda e: e, uid="enrich").key_by(lambda e: e["user"]).window(
        TumblingEventTimeWindows(100)).aggregate(Count(), uid="totals", window_function=Stamp()).sink_to_kafka(
        "out", uid="sink")
"""

LATE_GLOBAL = """
SEEN = 0

def flag(e):
    global SEEN
    SEEN += 1
    return {**e, "late": SEEN > 180}

def build(env: Environment) -> None:
    source(env).map(flag, uid="enrich").sink_to_kafka("out", uid="sink")
"""

PROCESSING_TIME_WINDOW = """
def build(env: Environment) -> None:
    source(env).map(lambda e: e, uid="enrich").key_by(lambda e: e["user"]).window(
        TumblingProcessingTimeWindows(50)).aggregate(Count(), uid="totals").sink_to_kafka("out", uid="sink")
"""

RECORDS = 200
CHECKPOINT_EVERY = 20


def event_lines(count: int) -> list[bytes]:
    """Events with ids that repeat across checkpoints (for the dedup jobs), five users, in time order."""
    return [
        json.dumps({"id": i % 37, "user": f"u{i % 5}", "amount": i % 11, "ts": 1_000 + 10 * i}).encode()
        for i in range(count)
    ]


@pytest.fixture(autouse=True)
def no_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """``weir test`` never connects anything: every client factory fails the test."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("weir test tried to reach an external service")

    for name in ("producer", "consumer", "admin", "topic_partition_count", "read_committed_records"):
        monkeypatch.setattr(kafka, name, refuse)
    monkeypatch.setattr(postgres, "connect", refuse)


def job(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(HEADER + body)
    return path


def check(tmp_path: Path, body: str) -> Any:
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    return check_job(job(tmp_path, body), inputs, failures=True, checkpoint_every=CHECKPOINT_EVERY)


FIRST_RESTART = FailurePoint(1, Phase.MID_EPOCH)
"""A failure before any checkpoint completed: the job starts over from nothing (a new process)."""
FIRST_RESTORE = FailurePoint(1, Phase.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT)
"""The first failure that restores a checkpoint."""

BUGS = [
    # Globals start over with the job, as output does: only a restore exposes them.
    pytest.param(GLOBAL_COUNTER, "enrich", FIRST_RESTORE, id="module-global-counter"),
    pytest.param(CLOSURE_DEDUP, "dedup", FIRST_RESTORE, id="closure-state"),
    pytest.param(SIDE_EFFECT_MAP, "enrich", FIRST_RESTORE, id="side-effect-in-map"),
    # A global whose effect shows only records after the restore, once the managed state (here the
    # source's offsets alone) is the failure-free run's again: a failure run cut short where its
    # checkpointed state equals the failure-free run's would pass it; run to the end, it fails.
    pytest.param(LATE_GLOBAL, "enrich", FIRST_RESTORE, id="module-global-read-late"),
    # A replay draws other numbers and reads a later clock, even from the start.
    pytest.param(RANDOM_KEY, "totals", FIRST_RESTART, id="random-key"),
    pytest.param(WALL_CLOCK_WINDOW, "totals", FIRST_RESTART, id="wall-clock-window-function"),
]


@pytest.mark.parametrize(("body", "operator", "point"), BUGS)
def test_a_job_bug_is_caught_at_its_operator_and_the_first_failure_that_exposes_it(
    tmp_path: Path, body: str, operator: str, point: FailurePoint
) -> None:
    report = check(tmp_path, body)
    assert not report.ok
    (divergence,) = report.divergences
    assert divergence.operator == operator
    assert divergence.sink == "sink"
    assert divergence.point == point
    text = divergence.describe()
    assert f"operator {operator!r}" in text and point.describe() in text
    assert "outside managed state" in text and "nondeterminism" in text


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(KEYED_COUNTER, id="counter-in-keyed-state"),
        pytest.param(KEYED_DEDUP, id="dedup-in-keyed-state"),
        pytest.param(FIELD_KEY, id="key-from-the-record"),
        pytest.param(KEYED_TOTAL, id="running-total-in-keyed-state"),
        pytest.param(WINDOW_END_STAMP, id="window-function-reads-the-window"),
    ],
)
def test_the_jobs_written_correctly_pass_every_failure_point(tmp_path: Path, body: str) -> None:
    report = check(tmp_path, body)
    assert report.ok, [d.describe() for d in report.divergences]
    checkpoints = RECORDS // CHECKPOINT_EVERY + 1  # and the final one, with no record before it
    assert report.reference.checkpoints == checkpoints
    each = [FailurePoint(k, phase) for k in range(1, checkpoints + 1) for phase in Phase]
    expected = [
        p
        for p in each
        if (p.phase is not Phase.MID_EPOCH or p.checkpoint < checkpoints)
        and (p.phase is not Phase.AFTER_SINK_END_OF_INPUT or p.checkpoint == checkpoints)
    ]
    assert report.failure_points == tuple(expected)
    assert report.runs == 2 + len(report.failure_points)


def test_every_failure_point_is_hit_and_the_committed_output_is_each_record_once(tmp_path: Path) -> None:
    path = job(tmp_path, KEYED_TOTAL)
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    clean = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY)
    assert sorted(v["id"] for v, _ in clean.by_operator["sink"]) == sorted(i % 37 for i in range(RECORDS))
    assert len(clean.visited) == 3 * clean.checkpoints  # the final epoch is empty: no midpoint
    for point in clean.visited:
        run = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, failure=point)
        assert run.failure_hit, point
        assert sorted(map(json.dumps, run.by_operator["sink"])) == sorted(map(json.dumps, clean.by_operator["sink"]))


@pytest.mark.parametrize(
    ("body", "rescale"),
    [
        pytest.param(KEYED_TOTAL, None, id="keyed-state"),
        pytest.param(KEYED_TOTAL, 3, id="keyed-state-rescaled"),
        pytest.param(GLOBAL_COUNTER, None, id="module-global"),
        pytest.param(GLOBAL_COUNTER, 3, id="module-global-rescaled"),
        pytest.param(RANDOM_KEY, None, id="random"),  # rescaled, a random key fails the run from the start
        pytest.param(WALL_CLOCK_WINDOW, None, id="wall-clock"),
        pytest.param(WALL_CLOCK_WINDOW, 3, id="wall-clock-rescaled"),
    ],
)
def test_a_failure_run_resumed_at_its_point_is_the_run_from_the_start(
    tmp_path: Path, body: str, rescale: int | None
) -> None:
    """What ``check_job`` runs per failure point (the failure-free run's state at the point taken
    over, then the recovery) commits exactly what the run from the start with that failure does,
    record for record and in order, and passes the same failure points: also for jobs whose output
    depends on a module global, ``random`` or the (virtual) clock."""
    path = job(tmp_path, body)
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    clean = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, capture=True)
    assert set(clean.resume_points) == set(clean.visited)
    for point in clean.visited:
        whole = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, failure=point, rescale=rescale)
        resumed = run_once(
            path, inputs, checkpoint_every=CHECKPOINT_EVERY, failure=point, rescale=rescale, resume_from=clean
        )
        assert resumed.by_operator == whole.by_operator, point
        assert (resumed.checkpoints, resumed.visited, resumed.failure_hit) == (
            whole.checkpoints,
            whole.visited,
            whole.failure_hit,
        ), point
        assert resumed.rescaled_to == whole.rescaled_to == rescale


def test_processing_time_timers_fire_as_virtual_processing_time_passes(tmp_path: Path) -> None:
    """Record ``i`` arrives at virtual time ``VIRTUAL_EPOCH_MS + i`` (1 ms per record): each 50 ms
    processing-time window holds the 50 records that arrived in it, counted per user, and fires
    once virtual time has passed its last millisecond."""
    path = job(tmp_path, PROCESSING_TIME_WINDOW)
    run = run_once(path, {"events": records_of_lines(event_lines(RECORDS))}, checkpoint_every=CHECKPOINT_EVERY)
    expected: Counter[str] = Counter()
    for i in range(RECORDS):
        start = (VIRTUAL_EPOCH_MS + i) // 50 * 50
        expected[json.dumps({"key": f"u{i % 5}", "start": start}, sort_keys=True)] += 1
    windows = Counter(
        json.dumps({"key": v["key"], "start": v["start"]}, sort_keys=True) for v, _ in run.by_operator["sink"]
    )
    assert windows == Counter(dict.fromkeys(expected, 1))
    counts = Counter(
        json.dumps({"key": v["key"], "start": v["start"], "count": v["count"]}, sort_keys=True)
        for v, _ in run.by_operator["sink"]
    )
    assert counts == Counter(
        json.dumps({**json.loads(window), "count": n}, sort_keys=True) for window, n in expected.items()
    )


@pytest.mark.parametrize("body", [pytest.param(KEYED_TOTAL, id="passes"), pytest.param(GLOBAL_COUNTER, id="diverges")])
def test_check_job_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path, body: str) -> None:
    """``check_job`` raises the collector's youngest threshold and freezes what the failure-free run
    leaves alive for its failure runs; after it, thresholds are back and nothing it froze stays
    frozen, whether the job passed or diverged."""
    import gc

    thresholds = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    check(tmp_path, body)
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == 0


def test_a_resumed_run_needs_its_failure_point(tmp_path: Path) -> None:
    path = job(tmp_path, KEYED_TOTAL)
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    clean = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, capture=True)
    with pytest.raises(JobTestError, match="resume_from takes over the failure-free run at a failure point"):
        run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, resume_from=clean)
    never = FailurePoint(99, Phase.MID_EPOCH)
    with pytest.raises(JobTestError, match="never passed the failure point halfway through the records before"):
        run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, failure=never, resume_from=clean)


def test_a_kafka_source_without_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JobTestError, match="no input for Kafka source 'events': give --source events=FILE.jsonl"):
        run_once(job(tmp_path, FIELD_KEY), {})


def test_read_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(path) == [b'{"a": 1}', b'{"a": 2}']


def test_cli_reports_the_divergence_and_exits_1(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(event_lines(RECORDS)) + b"\n")
    args = ["test", str(job(tmp_path, GLOBAL_COUNTER)), "--source", f"events={source}", "--checkpoint-every", "20"]
    result = CliRunner().invoke(app, [*args, "--failures"])
    assert result.exit_code == 1, result.output
    assert "operator 'enrich'" in result.output
    assert "checkpoint 1" in result.output


def test_cli_writes_each_sink_as_json_lines(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(event_lines(RECORDS)) + b"\n")
    out = tmp_path / "out"
    args = ["test", str(job(tmp_path, KEYED_TOTAL)), "--source", f"events={source}", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--failures", "--checkpoint-every", "20"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "sink.jsonl").read_text().splitlines()]
    assert len(lines) == RECORDS
    finals: dict[str, int] = {}
    for line in lines:
        user = line["value"]["user"]
        finals[user] = max(finals.get(user, 0), line["value"]["total"])
    assert finals == {f"u{u}": sum(i % 11 for i in range(RECORDS) if i % 5 == u) for u in range(5)}


# --rescale N ----------------------------------------------------------------------------------------

PER_SUBTASK_COUNT = """
import pickle
from weir.api.connector import WithoutOnError
from weir.operators.base import StreamOperator


class PerSubtaskCount(StreamOperator):
    '''Counts per user in an attribute, checkpointed as this subtask's operator state, and on a
    restore takes the state of the old subtask with its own index: right at the same parallelism,
    wrong at another (the users now routed to other subtasks lose their counts).'''

    def __init__(self):
        self.counts = {}

    def process(self, value, timestamp):
        self.counts[value["user"]] = self.counts.get(value["user"], 0) + 1
        self.output.emit({**value, "n": self.counts[value["user"]]}, timestamp)

    def snapshot_state(self, checkpoint_id):
        return pickle.dumps(self.counts)

    def restore_state(self, data):
        self.counts = pickle.loads(data)

    def restore_inherited_state(self, states):
        for state in states:
            if state.subtask == self.ctx.subtask:
                self.restore_state(state.data)
WITHOUT_INHERITED

def build(env: Environment) -> None:
    keyed = source(env).map(lambda e: e, uid="enrich").key_by(lambda e: e["user"])
    counted = keyed._add(
        WithoutOnError(PerSubtaskCount), uid="count", name="count", parallelism=None, key_selector=keyed._key
    )
    counted.sink_to_kafka("out", uid="sink")
"""


def rescaled(tmp_path: Path, body: str, parallelism: int = 3) -> Any:
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    path = job(tmp_path, body)
    return check_job(path, inputs, failures=True, checkpoint_every=CHECKPOINT_EVERY, rescale=parallelism)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(KEYED_TOTAL, id="running-total-in-keyed-state"),
        pytest.param(FIELD_KEY, id="keyed-window"),
        pytest.param(KEYED_DEDUP, id="dedup-in-keyed-state"),
    ],
)
def test_a_correct_keyed_job_passes_every_failure_point_restored_at_parallelism_3(tmp_path: Path, body: str) -> None:
    report = rescaled(tmp_path, body)
    assert report.ok, [d.describe() for d in report.divergences]
    assert report.runs == 2 + 2 * len(report.failure_points)  # each point at parallelism 1, then at 3


def test_a_rescaled_restore_runs_three_subtasks_that_share_the_keys_by_key_group(tmp_path: Path) -> None:
    """The restore really runs at parallelism 3, keys routed by key group: after checkpoint 1 is
    restored, the users whose key group subtask 0 owns go on counting from the state it took, the
    others start again at 1 on the subtask that owns theirs."""
    from weir.core.keygroups import key_group_for_key, subtask_for_key_group

    path = job(tmp_path, PER_SUBTASK_COUNT.replace("WITHOUT_INHERITED", ""))
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    run = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, failure=FIRST_RESTORE, rescale=3)
    assert run.failure_hit and run.rescaled_to == 3
    counts: dict[str, list[int]] = {}
    for value, _ in run.by_operator["count"]:
        counts.setdefault(value["user"], []).append(value["n"])
    per_user = CHECKPOINT_EVERY // 5  # each user's records before checkpoint 1
    owner = {f"u{u}": subtask_for_key_group(128, 3, key_group_for_key(f"u{u}", 128)) for u in range(5)}
    assert set(owner.values()) != {0}  # some users are on another subtask
    for user, ns in counts.items():
        restarted = list(range(1, per_user + 1)) + list(range(1, len(ns) - per_user + 1))
        assert ns == (list(range(1, len(ns) + 1)) if owner[user] == 0 else restarted), user


COLUMNAR_WINDOW = """
from weir.api import Count, Sum

def build(env: Environment) -> None:
    events = env.from_kafka(
        "events", uid="events", schema={"id": int, "user": str, "amount": int, "ts": int}, timestamp_field="ts"
    )
    events.key_by("user").window(TumblingEventTimeWindows(100)).aggregate(
        {"count": Count(), "total": Sum("amount")}, uid="totals").sink_to_kafka("out", uid="sink")
"""


def test_a_columnar_job_is_restored_at_parallelism_3_with_its_batches_split_by_key_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columnar operators under ``--rescale``: record batches cross the hash edge split by the key
    group of each row, as the record writer splits them (``split_by_channel``), to the window subtask
    that owns it (each keyed state store refuses a key group it does not own); every failure point
    restored at parallelism 3 commits the failure-free run's windows, record for record."""
    from weir.core.keygroups import key_group_for_key, subtask_for_key_group
    from weir.tools import jobtest

    split = jobtest.split_by_channel
    reached: set[int] = set()

    def recording_split(batch: Any, channels: Any, num_channels: int) -> Any:
        parts = split(batch, channels, num_channels)
        reached.update(channel for channel, _ in parts)
        return parts

    monkeypatch.setattr(jobtest, "split_by_channel", recording_split)
    path = job(tmp_path, COLUMNAR_WINDOW)
    inputs = {"events": records_of_lines(event_lines(RECORDS))}
    clean = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY)
    assert not reached  # at parallelism 1 the edge has one consumer: nothing to split
    restored = run_once(path, inputs, checkpoint_every=CHECKPOINT_EVERY, failure=FIRST_RESTORE, rescale=3)
    assert restored.failure_hit and restored.rescaled_to == 3
    owners = {subtask_for_key_group(128, 3, key_group_for_key(f"u{u}", 128)) for u in range(5)}
    assert reached == owners and len(owners) > 1  # each user's rows to the subtask owning its key group
    windows = Counter(json.dumps(v, sort_keys=True) for v, _ in clean.by_operator["sink"])
    assert windows == Counter(json.dumps(v, sort_keys=True) for v, _ in restored.by_operator["sink"])
    expected: Counter[str] = Counter()
    totals: dict[tuple[str, int], tuple[int, int]] = {}
    for line in event_lines(RECORDS):
        e = json.loads(line)
        start = e["ts"] // 100 * 100
        count, total = totals.get((e["user"], start), (0, 0))
        totals[e["user"], start] = (count + 1, total + e["amount"])
    for (user, start), (count, total) in totals.items():
        expected[
            json.dumps(
                {"user": user, "window_start": start, "window_end": start + 100, "count": count, "total": total},
                sort_keys=True,
            )
        ] += 1
    assert windows == expected
    report = rescaled(tmp_path, COLUMNAR_WINDOW)
    assert report.ok, [d.describe() for d in report.divergences]
    assert report.runs == 2 + 2 * len(report.failure_points)


def test_state_kept_per_subtask_fails_at_another_parallelism_naming_the_operator(tmp_path: Path) -> None:
    body = PER_SUBTASK_COUNT.replace("WITHOUT_INHERITED", "")
    assert rescaled(tmp_path, body, parallelism=1).ok  # right at the same parallelism, whatever fails
    report = rescaled(tmp_path, body)
    (divergence,) = report.divergences
    assert divergence.operator == "count" and divergence.rescaled_to == 3
    assert divergence.point == FIRST_RESTORE
    assert "restored at parallelism 3" in divergence.describe()


def test_state_that_cannot_be_split_is_refused_at_another_parallelism_naming_the_operator(tmp_path: Path) -> None:
    body = PER_SUBTASK_COUNT.replace("WITHOUT_INHERITED", "del PerSubtaskCount.restore_inherited_state")
    with pytest.raises(JobDefinitionError, match="operator 'count' .*cannot be redistributed from parallelism 1 to 3"):
        rescaled(tmp_path, body)


def test_rescale_needs_failures(tmp_path: Path) -> None:
    with pytest.raises(JobTestError, match="--rescale restores after the failures: give it with --failures"):
        check_job(job(tmp_path, KEYED_TOTAL), {"events": records_of_lines(event_lines(10))}, rescale=2)


def test_cli_rescale_reports_the_divergence_at_the_operator(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(event_lines(RECORDS)) + b"\n")
    path = job(tmp_path, PER_SUBTASK_COUNT.replace("WITHOUT_INHERITED", ""))
    args = ["test", str(path), "--source", f"events={source}", "--checkpoint-every", "20", "--failures"]
    assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, [*args, "--rescale", "3"])
    assert result.exit_code == 1, result.output
    assert "operator 'count'" in result.output and "restored at parallelism 3" in result.output


# Jobs of many files (`weir test JOB.py --py-files ...`, as `weir run` ships them) -----------------------

HELPER_COUNTER = """
SEQ = 0


def number(e):
    global SEQ
    SEQ += 1
    return {**e, "seq": SEQ}
"""

HELPER_PURE = """
def number(e):
    return {**e, "seq": e["id"] * 2}
"""

MANY_FILES_JOB = """
from helpers import number


def build(env: Environment) -> None:
    source(env).map(number, uid="enrich").sink_to_kafka("out", uid="sink")
"""


def many_files(tmp_path: Path, helpers: str) -> list[str]:
    """``weir test`` arguments for a job whose map function lives in a module of its own, shipped with
    ``--py-files`` (not on sys.path otherwise)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "helpers.py").write_text(helpers)
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(event_lines(RECORDS)) + b"\n")
    path = job(tmp_path, MANY_FILES_JOB)
    return ["test", str(path), "--py-files", str(src), "--source", f"events={source}", "--checkpoint-every", "20"]


def test_a_helper_module_s_global_is_caught_at_its_operator_and_failure_point(tmp_path: Path) -> None:
    """The job's modules are imported afresh at every failure, as a restarted process would: a counter
    in a helper module restarts after a restore while the sources resume at the checkpoint, so the
    failure runs differ at the map that uses it; both failure-free runs agree (each starts over too),
    so it is not taken for nondeterminism."""
    args = many_files(tmp_path, HELPER_COUNTER)
    assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, [*args, "--failures"])
    assert result.exit_code == 1, result.output
    assert "operator 'enrich'" in result.output
    assert "checkpoint 1 (completed, sinks not yet told)" in result.output
    assert "a second failure-free run" not in result.output


def test_a_job_of_many_files_written_correctly_passes_with_failures_and_rescale(tmp_path: Path) -> None:
    args = many_files(tmp_path, HELPER_PURE)
    result = CliRunner().invoke(app, [*args, "--failures", "--rescale", "2"])
    assert result.exit_code == 0, result.output
    assert f"sink sink: {RECORDS} records committed" in result.output
    assert "every failure run committed what the failure-free run did" in result.output


def test_the_job_s_modules_are_forgotten_between_loads_and_weir_s_are_not(tmp_path: Path) -> None:
    from weir.api.artifacts import build_artifact
    from weir.api.job_code import forget_job_modules, load_job, prepare_artifact

    args = many_files(tmp_path, HELPER_COUNTER)
    artifact = build_artifact(
        job_file=Path(args[1]), py_module=None, py_files=[Path(args[3])], requirements=None, max_bytes=1 << 20
    )
    code = prepare_artifact(artifact.data, cache=tmp_path / "cache")
    load_job(code)
    helpers = sys.modules[f"{code.package}.helpers"]
    helpers.SEQ = 41  # type: ignore[attr-defined]
    load_job(code)
    assert sys.modules[f"{code.package}.helpers"].SEQ == 41  # one process keeps it, as a TaskManager does
    forget_job_modules(code)
    assert not [m for m in sys.modules if m.startswith(code.package + ".")]
    load_job(code)
    assert sys.modules[f"{code.package}.helpers"].SEQ == 0
    assert sys.modules["weir.api"] is not None


def test_a_sql_script_takes_functions_not_py_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "s.sql"
    script.write_text("CREATE TABLE t (a INT) WITH ('connector' = 'datagen');\n")
    assert run_cli(["test", str(script), "--py-files", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "weir: error: --py-files, --py-requirements and --py-module are for a job file: "
        "a SQL script takes --functions FILE.py\n"
    )
