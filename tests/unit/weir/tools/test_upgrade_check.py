"""`weir upgrade check JOB_V2.py --savepoint PATH` over a matrix of version-2 jobs against one
version-1 savepoint built in-process, no cluster.

The savepoint is made as ``test_savepoint_inspect`` makes its checkpoint (its ``build_savepoint``
is reused): a Kafka source's state, a real ``WindowAggregateOperator`` writing its "win" state
(``(key, sum)``, recorded as version 1) into a task's own RocksDB, snapshotted into a
``FileCheckpointStorage``, and an exactly-once Kafka sink's ``SinkSnapshot`` chained after it. A
variant adds entries the operator could not have written: a value whose class no longer imports, a
key stored under another key group than it hashes to. Each version-2 job is a real job file, loaded
as ``weir run`` loads it, so its ``migrate`` is the one that would run at restore.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput
from tests.unit.weir.tools.test_savepoint_inspect import (
    CHECKPOINT,
    JOB,
    MARKER_TOPIC,
    SINK,
    SOURCE,
    WINDOW,
    Built,
    Sum,
    _sink_state,
    build_savepoint,
    records,
)
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.ids import OperatorUid, SubtaskIndex, TaskId, TaskManagerId
from weir.core.key_samples import KEY_SAMPLE_STATE, SAMPLES_AT_OPEN, sample_slot
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask, key_to_bytes
from weir.core.paths import CheckpointPaths, external_path
from weir.core.state_layout import key_prefix, window_key
from weir.core.state_schema import StoredSchema
from weir.core.task_state import InlineOperatorState, SubtaskLayout, TaskStateDocument, encode_task_state
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.pending import StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.operators.base import OperatorContext
from weir.operators.sources import encode_kafka_source_state
from weir.operators.windows import WindowAggregateOperator
from weir.taskmanager.snapshots import TaskKeyedState, keyed_state_to_document
from weir.tools.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.upgrade_check import FindingKind, Severity, UpgradeReport, upgrade_check

GONE_MODULE = "weir_job_upgrade_v1_gone"


class _Gone:
    """A class of a module that is gone when the savepoint is read (a v1 job file's class)."""

    def __init__(self, n: int) -> None:
        self.n = n


class MergingSum(Sum):
    def merge(self, a: int, b: int) -> int:
        return a + b


def build_v1_savepoint(root: Path, *, damaged_entries: bool = False, sliding: Any = None, samples: bool = True) -> Path:
    """Version 1's savepoint: a source (2 subtasks), the window and the exactly-once sink chained (2
    subtasks, window state recorded as version 1). ``damaged_entries``: also one "win" value naming
    a class that no longer imports, and one key stored under a key group it does not hash to.
    ``sliding``: the window's aggregate instead (a ``Sum`` or ``MergingSum``) over sliding windows
    of 20 every 10 (the merging one sliced)."""
    storage = FileCheckpointStorage(root / "storage")
    paths = CheckpointPaths()
    handles: list[TaskStateHandle] = []

    def add(vertex: str, s: int, operators: tuple[str, ...], states: dict[str, bytes], keyed: Any = None) -> None:
        kg = key_group_range_for_subtask(128, 2, SubtaskIndex(s))
        handle = keyed.snapshotter.snapshot(JOB, CHECKPOINT, [(OperatorUid(WINDOW), kg)]) if keyed else None
        objects = tuple(StateObject(f.key, f.size_bytes, f.reused) for f in (handle.objects if handle else ()))
        keyed_uids = (WINDOW,) if keyed else ()
        schemas = {WINDOW: (StoredSchema("win", version=1),)} if keyed else {}
        document = TaskStateDocument(
            job_id=JOB,
            vertex_uid=vertex,
            subtask=s,
            attempt=1,
            checkpoint_id=CHECKPOINT,
            layout=SubtaskLayout(2, 128, kg, operators, keyed_uids, schemas),
            operator_state=InlineOperatorState(states),
            keyed_state=keyed_state_to_document(handle) if handle else None,
        )
        task = TaskId(JOB, OperatorUid(vertex), SubtaskIndex(s))
        handles.append(TaskStateHandle(task, objects, inline_payload=encode_task_state(document)))

    for s in range(2):
        add(SOURCE, s, (SOURCE,), {SOURCE: encode_kafka_source_state({s: 10 * s}, None)})
    for s in range(2):
        keyed = TaskKeyedState(root / f"tm-{s}", storage, paths, TaskManagerId(f"taskmanager-{s + 1}"))
        kg = key_group_range_for_subtask(128, 2, SubtaskIndex(s))
        if sliding is None:
            op = WindowAggregateOperator(Sum(), lambda v: v[0], TumblingEventTimeWindows(10), 0)
        else:
            op = WindowAggregateOperator(sliding, lambda v: v[0], SlidingEventTimeWindows(20, 10), 0)
        op.setup(OperatorContext(JOB, "test", WINDOW, s, 2, 128, 1, kg, {}, keyed.backend), CollectingOutput())
        op.open()
        for value, ts in records():
            if key_group_for_key(value[0], 128) in kg:
                op.process(value, ts)
        op.process_watermark(9)
        if damaged_entries and s == 0:
            _add_damaged_entries(op)
        if not samples:
            for group in kg:
                for slot, _ in list(op.store.items(KEY_SAMPLE_STATE, group)):
                    op.store.delete(KEY_SAMPLE_STATE, group, slot)
        window_state = op.snapshot_state(CHECKPOINT)
        assert window_state is not None
        add(WINDOW, s, (WINDOW, SINK), {WINDOW: window_state, SINK: _sink_state(s, 3)}, keyed)
        keyed.discard()
    key = paths.metadata(JOB, CHECKPOINT)
    checkpoint = CompletedCheckpoint(CHECKPOINT, JOB, 1764578000.25, 1764578001.5, tuple(handles), key)
    storage.put_bytes(key, encode_metadata(checkpoint))
    built = Built(storage, key, external_path(storage.uri, key), checkpoint)
    return build_savepoint(built, root / "savepoint")


def _add_damaged_entries(op: WindowAggregateOperator) -> None:
    module = types.ModuleType(GONE_MODULE)
    gone = type("Accumulator", (_Gone,), {"__module__": GONE_MODULE})
    module.Accumulator = gone  # type: ignore[attr-defined]
    sys.modules[GONE_MODULE] = module
    try:
        key = next(k for k in (f"gone-{i}" for i in range(1000)) if key_group_for_key(k, 128) < 64)  # subtask 0's
        state_key = window_key(key_prefix(key_to_bytes(key)), 20, 30)
        op.store.put("win", key_group_for_key(key, 128), state_key, (key, gone(3)))
        op.store.flush()  # pickled now, while its module still imports
    finally:
        del sys.modules[GONE_MODULE]
    # A key of subtask 0 stored one key group off: as a Weir hashing keys otherwise would have stored it.
    key = next(k for k in (f"moved-{i}" for i in range(1000)) if 0 < key_group_for_key(k, 128) < 63)
    wrong = key_group_for_key(key, 128) + 1
    op.store.put("win", wrong, window_key(key_prefix(key_to_bytes(key)), 20, 30), (key, 4))


@pytest.fixture(scope="module")
def savepoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v1_savepoint(tmp_path_factory.mktemp("v1"))


@pytest.fixture(scope="module")
def unsampled_savepoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As an earlier Weir wrote it: no key samples."""
    return build_v1_savepoint(tmp_path_factory.mktemp("v1-unsampled"), samples=False)


@pytest.fixture(scope="module")
def damaged_savepoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v1_savepoint(tmp_path_factory.mktemp("v1-damaged"), damaged_entries=True)


JOB_TEMPLATE = """
from weir.api import DeadLetterOnError, Environment, SlidingEventTimeWindows, TumblingEventTimeWindows


class Sum:
    def create(self):
        return 0

    def add(self, acc, value):
        return acc + value[1]

    def result(self, key, start, end, acc):
        return (key, start, end, acc)
{merge}


def migrate(stored_version, acc):
    {migrate}


def build(env: Environment) -> None:
    env.set_max_parallelism({max_parallelism})
    events = env.from_kafka("events", uid="events-source", deserializer=lambda raw: raw, timestamp=lambda e: 0)
    windows = (
        events.map(lambda e: e, uid="key-value"{map_args})
        .key_by({key})
        .window({assigner})
        .aggregate(Sum(), uid="{window_uid}"{aggregate_args})
    )
    {sink}
"""

KAFKA_SINK = 'windows.sink_to_kafka("out", uid="kafka-sink", serializer=lambda r: repr(r).encode())'


@dataclass(frozen=True)
class V2:
    """One version-2 job of the matrix: what differs from version 1."""

    window_uid: str = WINDOW
    aggregate_args: str = ""
    migrate: str = "return acc"
    max_parallelism: int = 128
    sink: str = KAFKA_SINK
    map_args: str = ""
    key: str = "lambda v: v[0]"
    extra: str = ""
    assigner: str = "TumblingEventTimeWindows(10)"
    merge: bool = False

    def write(self, folder: Path, name: str) -> Path:
        path = folder / f"{name}.py"
        source = JOB_TEMPLATE.format(
            window_uid=self.window_uid,
            aggregate_args=self.aggregate_args,
            migrate=self.migrate,
            max_parallelism=self.max_parallelism,
            sink=self.sink,
            map_args=self.map_args,
            assigner=self.assigner,
            merge="\n    def merge(self, a, b):\n        return a + b\n" if self.merge else "",
            key=self.key,
        )
        path.write_text(source + self.extra)
        return path


Check = Callable[..., UpgradeReport]


@pytest.fixture
def check(tmp_path: Path) -> Check:
    def run(job: V2, path: Path, **options: Any) -> UpgradeReport:
        return upgrade_check(job.write(tmp_path, "job_v2"), str(path), work_dir=tmp_path / "work", **options)

    return run


def kinds(report: UpgradeReport, severity: Severity | None = None) -> set[tuple[FindingKind, str]]:
    return {(f.kind, f.uid) for f in report.findings if severity is None or f.severity is severity}


def fatal(report: UpgradeReport) -> set[tuple[FindingKind, str]]:
    return kinds(report, Severity.FATAL)


# the matrix -----------------------------------------------------------------------------------------


SLIDING = "SlidingEventTimeWindows(20, 10)"


@pytest.fixture(scope="module")
def sliced_savepoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v1_savepoint(tmp_path_factory.mktemp("v1-sliced"), sliding=MergingSum())


@pytest.fixture(scope="module")
def per_window_sliding_savepoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v1_savepoint(tmp_path_factory.mktemp("v1-sliding"), sliding=Sum())


def test_sliced_sliding_windows_pass_unchanged(check: Check, sliced_savepoint: Path) -> None:
    report = check(V2(assigner=SLIDING, merge=True), sliced_savepoint)
    assert report.passed, report.findings
    assert (FindingKind.STATE_SCHEMA, WINDOW) not in kinds(report)


def test_sliced_sliding_windows_fail_where_the_new_job_keeps_one_accumulator_per_window(
    check: Check, sliced_savepoint: Path
) -> None:
    report = check(V2(assigner=SLIDING), sliced_savepoint)  # the aggregate lost its merge
    assert fatal(report) == {(FindingKind.STATE_SCHEMA, WINDOW)}
    (finding,) = [f for f in report.findings if f.kind is FindingKind.STATE_SCHEMA]
    assert "keep slices of 10 ms, the new job's keep one accumulator per window" in finding.reason


def test_per_window_sliding_state_passes_into_sliced_windows_and_says_so(
    check: Check, per_window_sliding_savepoint: Path
) -> None:
    report = check(V2(assigner=SLIDING, merge=True), per_window_sliding_savepoint)
    assert report.passed, report.findings
    assert (FindingKind.STATE_SCHEMA, WINDOW) in kinds(report, Severity.INFO)
    assert check(V2(assigner=SLIDING), per_window_sliding_savepoint).passed


def test_the_same_job_passes_and_every_stored_value_is_read(check: Check, savepoint: Path) -> None:
    report = check(V2(), savepoint)
    assert report.passed and report.verdict == "PASS", report.findings
    assert kinds(report, Severity.INFO) >= {
        (FindingKind.KEPT_UID, SOURCE),
        (FindingKind.KEPT_UID, WINDOW),
        (FindingKind.KEPT_UID, SINK),
    }
    windows = {(key, ts // 10 * 10) for (key, _), ts in records() if ts >= 10}
    assert report.entries_checked == len(windows)


def test_a_renamed_stateful_uid_fails_and_names_the_likely_new_uid(check: Check, savepoint: Path) -> None:
    report = check(V2(window_uid="window-sum"), savepoint)
    assert not report.passed
    assert fatal(report) == {(FindingKind.MISSING_UID, WINDOW), (FindingKind.RENAMED_UID, WINDOW)}
    renamed = next(f for f in report.findings if f.kind is FindingKind.RENAMED_UID)
    assert "renamed to 'window-sum'?" in renamed.reason
    assert (FindingKind.NEW_UID, "window-sum") in kinds(report, Severity.INFO)
    assert report.summary().startswith("FAIL: ") and "missing-uid window-count-sum" in report.summary()


def test_a_removed_stateful_operator_passes_only_when_its_state_may_be_dropped(check: Check, savepoint: Path) -> None:
    job = V2(window_uid="window-sum")
    assert not check(job, savepoint).passed
    allowed = check(job, savepoint, allow_non_restored_state=True)
    assert allowed.passed
    assert (FindingKind.MISSING_UID, WINDOW) in kinds(allowed, Severity.WARNING)


def test_a_new_stateful_operator_passes(check: Check, savepoint: Path) -> None:
    extra = V2(
        sink=KAFKA_SINK + '\n    windows.key_by(lambda r: r[0]).reduce(lambda a, b: a, uid="latest").print(uid="p")'
    )
    report = check(extra, savepoint)
    assert report.passed, report.findings
    assert (FindingKind.NEW_UID, "latest") in kinds(report, Severity.INFO)


def test_an_accumulator_version_change_without_migrate_fails(check: Check, savepoint: Path) -> None:
    report = check(V2(aggregate_args=", state_version=2"), savepoint)
    assert fatal(report) == {(FindingKind.STATE_SCHEMA, WINDOW)}
    assert "holds version 1 (pickle), the job declares version 2 (pickle) and no migration" in report.fatal()[0].reason


def test_an_accumulator_version_change_with_migrate_passes(check: Check, savepoint: Path) -> None:
    report = check(V2(aggregate_args=", state_version=2, migrate=migrate", migrate="return (acc, None)"), savepoint)
    assert report.passed, report.findings


def test_a_migrate_that_raises_on_some_values_fails_naming_the_first(check: Check, savepoint: Path) -> None:
    failing = 'if acc > 20:\n        raise ValueError(f"too large: {acc}")\n    return acc'
    report = check(V2(aggregate_args=", state_version=2, migrate=migrate", migrate=failing), savepoint)
    assert fatal(report) == {(FindingKind.MIGRATION_FAILED, WINDOW)}
    reason = report.fatal()[0].reason
    assert "migrate from version 1 to 2 raised ValueError: too large:" in reason and "state 'win' key" in reason
    assert "fix the migration" in reason


def test_a_removed_exactly_once_sink_fails(check: Check, savepoint: Path) -> None:
    report = check(V2(sink='windows.print(uid="print")'), savepoint)
    assert fatal(report) == {(FindingKind.SINK_REMOVED, SINK)}
    assert check(V2(sink='windows.print(uid="print")'), savepoint, allow_non_restored_state=True).passed


def test_an_exactly_once_sink_made_at_least_once_fails(check: Check, savepoint: Path) -> None:
    sink = 'windows.sink_to_kafka("out", uid="kafka-sink", delivery="at_least_once")'
    report = check(V2(sink=sink), savepoint)
    assert fatal(report) == {(FindingKind.SINK_CHANGED, SINK)}
    assert "a kafka sink with delivery at_least_once in the new job" in report.fatal()[0].reason


def test_a_changed_max_parallelism_fails(check: Check, savepoint: Path) -> None:
    report = check(V2(max_parallelism=256), savepoint)
    assert fatal(report) == {(FindingKind.MAX_PARALLELISM, WINDOW)}
    assert "set the new job's max parallelism to 128" in report.fatal()[0].reason
    assert not any(f.kind is FindingKind.KEY_GROUP_MOVED for f in report.findings)  # not re-hashed: said once


def test_a_class_that_no_longer_imports_and_a_key_in_another_key_group_fail(
    check: Check, damaged_savepoint: Path
) -> None:
    report = check(V2(), damaged_savepoint)
    assert fatal(report) == {(FindingKind.CLASS_NOT_IMPORTABLE, WINDOW), (FindingKind.KEY_GROUP_MOVED, WINDOW)}
    by_kind = {f.kind: f.reason for f in report.findings}
    assert f"No module named '{GONE_MODULE}'" in by_kind[FindingKind.CLASS_NOT_IMPORTABLE]
    assert "'key': 'gone-" in by_kind[FindingKind.CLASS_NOT_IMPORTABLE]
    assert by_kind[FindingKind.KEY_GROUP_MOVED].startswith("1 stored entry would hash to another key group")
    assert "moved-" in by_kind[FindingKind.KEY_GROUP_MOVED]


# the key function (key samples) -----------------------------------------------------------------------


def sampled_slots() -> int:
    """The (key group, slot) pairs the keys of the input fall into."""
    keys = {key for (key, _), _ in records()}
    return len({(key_group_for_key(k, 128), sample_slot(key_to_bytes(k))) for k in keys})


def test_the_samples_are_what_the_operator_keyed(check: Check, savepoint: Path) -> None:
    report = check(V2(), savepoint)
    # Every record came before the first checkpoint: of the first 64 each subtask keyed, one per key
    # group and slot (two keys may share one: the later replaces the earlier).
    assert 0 < report.samples_checked <= 2 * SAMPLES_AT_OPEN
    assert report.samples_checked == sampled_slots()
    assert not {f.kind for f in report.findings} & {
        FindingKind.KEY_FUNCTION_CHANGED,
        FindingKind.KEY_FUNCTION_REWRITTEN,
        FindingKind.KEY_FUNCTION_UNSAMPLED,
    }


def test_a_key_function_that_keys_records_otherwise_fails_naming_record_and_keys(check: Check, savepoint: Path) -> None:
    report = check(V2(key="lambda v: v[0].upper()"), savepoint)
    assert fatal(report) == {(FindingKind.KEY_FUNCTION_CHANGED, WINDOW)}
    reason = report.fatal()[0].reason
    changed = sampled_slots()
    assert reason.startswith(f"the new key function keys {changed} of {changed} sampled records differently, e.g. ")
    key = next(k for k in {k for (k, _), _ in records()} if f"had key {k!r}, the new key function gives" in reason)
    old_group, new_group = key_group_for_key(key, 128), key_group_for_key(key.upper(), 128)
    assert f"record ({key!r}, " in reason
    assert f"gives {key.upper()!r} (key group {old_group} -> {new_group}: another key group)" in reason


def test_a_key_function_that_raises_on_a_sampled_record_fails(check: Check, savepoint: Path) -> None:
    report = check(V2(key="lambda v: v[0] if v[1] < 5 else v['user']"), savepoint)
    assert fatal(report) == {(FindingKind.KEY_FUNCTION_CHANGED, WINDOW)}
    assert "the new one raises TypeError" in report.fatal()[0].reason


def test_a_rewritten_key_function_that_keys_alike_passes_with_a_note(check: Check, savepoint: Path) -> None:
    report = check(V2(key="lambda v: str(v[0])"), savepoint)
    assert report.passed, report.findings
    notes = [f for f in report.findings if f.kind is FindingKind.KEY_FUNCTION_REWRITTEN]
    assert [(n.uid, n.severity) for n in notes] == [(WINDOW, Severity.INFO)]
    assert "records never sampled are not checked" in notes[0].reason


def test_a_savepoint_without_samples_passes_with_a_warning(check: Check, unsampled_savepoint: Path) -> None:
    report = check(V2(key="lambda v: v[0].upper()"), unsampled_savepoint)  # not seen: nothing to run it over
    assert report.passed and report.samples_checked == 0
    assert (FindingKind.KEY_FUNCTION_UNSAMPLED, WINDOW) in kinds(report, Severity.WARNING)


def test_dead_letter_topics_must_exist_when_kafka_is_asked(check: Check, savepoint: Path) -> None:
    job = V2(map_args=', on_error=DeadLetterOnError("v2-dlq")')
    asked: list[str] = []

    def missing(topic: str) -> bool:
        asked.append(topic)
        return False

    report = check(job, savepoint, topic_exists=missing)
    assert asked == ["v2-dlq"] and fatal(report) == {(FindingKind.DEAD_LETTER_TOPIC_MISSING, "key-value")}
    assert check(job, savepoint, topic_exists=lambda topic: True).passed
    offline = check(job, savepoint)
    assert offline.passed and (FindingKind.DEAD_LETTER_UNCHECKED, "key-value") in kinds(offline, Severity.WARNING)


# the command ----------------------------------------------------------------------------------------


def test_the_command_prints_the_verdict_and_exits_0_or_1(
    savepoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = V2().write(tmp_path, "good")
    assert run_cli(["upgrade", "check", str(good), "--savepoint", str(savepoint), "--offline"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"PASS: {good} can restore from {savepoint}")

    bad = V2(aggregate_args=", state_version=2").write(tmp_path, "bad")
    code = run_cli(["upgrade", "check", str(bad), "--savepoint", str(savepoint), "--offline", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_FAILURE and document["verdict"] == "FAIL"
    assert [f["kind"] for f in document["findings"] if f["severity"] == "fatal"] == ["state-schema"]

    assert run_cli(["upgrade", "check", str(tmp_path / "none.py"), "--savepoint", str(savepoint)]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    assert run_cli(["upgrade", "check", str(good), "--savepoint", str(tmp_path / "nowhere")]) == EXIT_USAGE


def test_the_savepoint_holds_what_the_matrix_assumes(savepoint: Path) -> None:
    """The v1 savepoint has a Kafka exactly-once sink (a marker topic) chained after the window."""
    from weir.tools.savepoint_inspect import decode_operator_state, load_savepoint

    sp = load_savepoint(str(savepoint))
    sink_states = [decode_operator_state(t.operator_states[SINK]) for t in sp.tasks if SINK in t.operator_states]
    assert [s["marker_topic"] for s in sink_states] == [MARKER_TOPIC, MARKER_TOPIC]


# weir run --from-savepoint ------------------------------------------------------------------------


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `weir run` submits: the JobManager is never asked (the check runs before any call)."""
    from weir.tools.client import JobManagerClient

    calls: list[dict[str, Any]] = []

    def submit_job(self: JobManagerClient, job_file: Path | None, *args: Any, **kwargs: Any) -> str:
        calls.append({"job_file": job_file, **kwargs})
        return "job-upgraded"

    monkeypatch.setattr(JobManagerClient, "submit_job", submit_job)
    return calls


def test_run_from_a_savepoint_refuses_what_the_check_fails_in_one_line_and_submits_nothing(
    savepoint: Path, tmp_path: Path, submitted: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    renamed = V2(window_uid="window-sum").write(tmp_path, "renamed")
    code = run_cli(["run", str(renamed), "--from-savepoint", str(savepoint), "--detach"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and submitted == []
    assert err.count("\n") == 1 and err.startswith("weir: error: the upgrade check refuses this restore: FAIL: ")
    assert f"missing-uid {WINDOW}:" in err and "(and 1 more)" in err
    assert f"the full report: weir upgrade check {renamed} --savepoint {savepoint}" in err

    assert run_cli(["run", str(renamed), "-s", str(savepoint), "-d"]) == EXIT_USAGE and submitted == []


def test_run_from_a_savepoint_submits_a_compatible_job(
    savepoint: Path, tmp_path: Path, submitted: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    good = V2().write(tmp_path, "good")
    assert run_cli(["run", str(good), "--from-savepoint", str(savepoint), "--detach"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == "job-upgraded"
    assert [(c["job_file"], c["from_checkpoint"], c["allow_non_restored_state"]) for c in submitted] == [
        (good, str(savepoint), False)
    ]


def test_run_passes_allow_non_restored_state_to_the_check_and_can_skip_it(
    savepoint: Path, tmp_path: Path, submitted: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    renamed = V2(window_uid="window-sum").write(tmp_path, "renamed")
    assert run_cli(["run", str(renamed), "-s", str(savepoint), "-n", "-d"]) == EXIT_OK
    assert [c["allow_non_restored_state"] for c in submitted] == [True]
    warned = capsys.readouterr().err.splitlines()  # what -n drops, said before it is submitted
    assert all(line.startswith("weir: warning: upgrade check: ") for line in warned)
    assert any(line.startswith(f"weir: warning: upgrade check: missing-uid {WINDOW}: ") for line in warned)

    bad = V2(aggregate_args=", state_version=2").write(tmp_path, "bad")
    assert run_cli(["run", str(bad), "-s", str(savepoint), "-d"]) == EXIT_USAGE
    assert "state-schema" in capsys.readouterr().err and len(submitted) == 1
    assert run_cli(["run", str(bad), "-s", str(savepoint), "-d", "--skip-upgrade-check"]) == EXIT_OK
    assert [c["job_file"] for c in submitted] == [renamed, bad]


def test_run_refuses_a_path_with_no_savepoint_before_submitting(
    tmp_path: Path, submitted: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    good = V2().write(tmp_path, "good")
    assert run_cli(["run", str(good), "-s", str(tmp_path / "nowhere"), "-d"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("weir: error: ") and submitted == []


# the worked example of docs/operations.md -----------------------------------------------------------


def test_the_worked_example_in_the_docs_prints_what_the_docs_show(
    savepoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    submitted: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The page's commands, run over the matrix's savepoint copied to ``sp-1`` (a savepoint is
    self-contained) and its job without a migration as ``job_v2.py``, print the page's blocks."""
    import shlex
    import shutil

    from tests.unit.docs.blocks import REPO_ROOT, blocks

    page = blocks(REPO_ROOT / "docs" / "operations.md")
    example = "weir upgrade check job_v2.py --savepoint sp-1 --offline"
    at = next(i for i, b in enumerate(page) if b.text.strip() == example)
    command, report = page[at], page[at + 1]
    refusal = next(b for b in page[at:] if b.language == "text" and b.text.startswith("weir: error: the upgrade check"))
    shutil.copytree(savepoint, tmp_path / "sp-1")
    V2(aggregate_args=", state_version=2").write(tmp_path, "job_v2")
    monkeypatch.chdir(tmp_path)

    assert run_cli(shlex.split(command.text)[1:]) == EXIT_FAILURE
    assert capsys.readouterr().out == report.text
    assert run_cli(["run", "job_v2.py", "--from-savepoint", "sp-1"]) == EXIT_USAGE and submitted == []
    assert capsys.readouterr().err == refusal.text

    V2(aggregate_args=", state_version=2, migrate=migrate", migrate="return acc").write(tmp_path, "job_v2")
    assert run_cli(shlex.split(command.text)[1:]) == EXIT_OK
    assert capsys.readouterr().out.startswith("PASS: job_v2.py can restore from sp-1\n")

    key_example = "weir upgrade check job_v3.py --savepoint sp-1 --offline"
    at = next(i for i, b in enumerate(page) if b.text.strip() == key_example)
    V2(key="lambda v: v[0].upper()").write(tmp_path, "job_v3")
    assert run_cli(shlex.split(page[at].text)[1:]) == EXIT_FAILURE
    assert capsys.readouterr().out == page[at + 1].text
    V2(key="lambda v: str(v[0])").write(tmp_path, "job_v3")
    assert run_cli(shlex.split(page[at].text)[1:]) == EXIT_OK
    assert "info key-function-rewritten window-count-sum" in capsys.readouterr().out
