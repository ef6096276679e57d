"""`weir savepoint info` and `weir savepoint dump` over a genuine checkpoint in a local storage.

The checkpoint is built by the real code, no cluster: a Kafka source's state
(``encode_kafka_source_state``), a real ``WindowAggregateOperator`` writing its "win" state through
the ``KeyedStateBackend`` into a task's own RocksDB, snapshotted by ``TaskKeyedState``'s snapshotter
into a ``FileCheckpointStorage`` (shared SSTs, private db files), a transactional sink's
``SinkSnapshot`` (one subtask's large enough to be stored as an object), task-state documents and
``_metadata`` encoded as the TaskManager and the JobManager encode them. A savepoint-style copy (every
key relative to its folder) proves a relocated savepoint still reads. Every entry is decoded through
``weir.core.state_layout``: a kind of state added there alone is read too.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle
import shutil
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.errors import ServiceUnavailableError
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId, TaskManagerId
from weir.core.key_samples import KEY_SAMPLE_STATE, SAMPLES_AT_OPEN
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask, key_to_bytes
from weir.core.paths import CheckpointPaths, external_path
from weir.core.state_layout import STATE_KINDS, KeyedEntry, PrefixedKey, StateKind, key_prefix
from weir.core.task_state import (
    INLINE_STATE_LIMIT_BYTES,
    InlineOperatorState,
    OperatorStateHandle,
    StoredOperatorState,
    SubtaskLayout,
    TaskStateDocument,
    decode_task_state,
    encode_task_state,
    pack_operator_states,
)
from weir.core.windows import TumblingEventTimeWindows
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.pending import StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.operators.base import OperatorContext
from weir.operators.sources import encode_kafka_source_state
from weir.operators.transactional_sinks import SinkSnapshot
from weir.operators.twophase import LedgerSnapshot, PendingTransaction, TransactionId
from weir.operators.windows import WindowAggregateOperator, pending_window_state
from weir.taskmanager.snapshots import TaskKeyedState, keyed_state_from_document, keyed_state_to_document
from weir.tools.cli import EXIT_FAILURE, EXIT_NO_CLUSTER, EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.savepoint_inspect import decode_operator_state, entry_to_json

JOB = JobId("job-a")
CHECKPOINT = CheckpointId(7)
SOURCE, WINDOW, SINK, DEDUPE = "events-source", "window-count-sum", "kafka-sink", "dedupe"
KEYS = "alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy".split()  # both halves
WATERMARK = 9  # fires (and drops) the windows [0, 10); [10, 20) and [20, 30) stay in the state
NEXT_OFFSETS = [{0: 120, 2: 98}, {1: 77, 3: 0}]
END_OFFSETS = [{0: 200, 2: 200}, {1: 200, 3: 200}]
MARKER_TOPIC = "weir-sink-commits.kafka-sink.job-a.0123456789"
SEQUENCES = "dedupe.sequences"
"""A state of a kind the layout does not know (yet): the key prefix, then a 4-byte sequence number."""


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: tuple[str, int]) -> int:
        return acc + value[1]

    def result(self, key: str, start: int, end: int, acc: int) -> tuple[str, int, int, int]:
        return key, start, end, acc


def records() -> list[tuple[tuple[str, int], int]]:
    return [((key, ts % 5 + 1), ts) for ts in range(30) for key in KEYS]


def expected_windows() -> dict[tuple[int, str, int, int], list[Any]]:
    """(key group, key, start, end) -> the "win" value (key, sum), as JSON reads it."""
    sums: dict[tuple[str, int], int] = defaultdict(int)
    for (key, n), ts in records():
        if ts >= 10:
            sums[(key, ts // 10 * 10)] += n
    return {(key_group_for_key(k, 128), k, s, s + 10): [k, total] for (k, s), total in sums.items()}


@dataclass(frozen=True)
class Built:
    storage: FileCheckpointStorage
    metadata_key: str
    path: str  # the external path `weir checkpoints` shows
    checkpoint: CompletedCheckpoint


def _sink_state(subtask: int, records_in_epoch: int) -> bytes:
    task = TaskId(JOB, OperatorUid(SINK), SubtaskIndex(subtask))
    ledger = LedgerSnapshot(
        task, CHECKPOINT, (PendingTransaction(CHECKPOINT, TransactionId.for_task(task, CheckpointId(6))),)
    )
    rows = [(b"k%d" % i, b"v" * 40, i) for i in range(records_in_epoch)]
    return SinkSnapshot(ledger, {CheckpointId(6): rows}, 12, MARKER_TOPIC, subtask).to_bytes()


def build_checkpoint(root: Path) -> Built:
    storage = FileCheckpointStorage(root / "storage")
    paths = CheckpointPaths()
    handles: list[TaskStateHandle] = []

    def add_task(
        vertex: str,
        subtask: int,
        parallelism: int,
        operators: tuple[str, ...],
        states: dict[str, bytes],
        keyed: TaskKeyedState | None = None,
        keyed_uids: tuple[str, ...] = (),
    ) -> None:
        kg = key_group_range_for_subtask(128, parallelism, SubtaskIndex(subtask))
        keyed_handle = None
        if keyed is not None:
            keyed_handle = keyed.snapshotter.snapshot(JOB, CHECKPOINT, [(OperatorUid(u), kg) for u in keyed_uids])
        objects = [StateObject(f.key, f.size_bytes, f.reused) for f in (keyed_handle.objects if keyed_handle else ())]
        operator_state: OperatorStateHandle
        if sum(len(b) for b in states.values()) < INLINE_STATE_LIMIT_BYTES:
            operator_state = InlineOperatorState(states)
        else:
            key = paths.task_state(JOB, CHECKPOINT, OperatorUid(vertex), SubtaskIndex(subtask))
            operator_state, blob = pack_operator_states(states, key)
            storage.put_bytes(key, blob)
            objects.append(StateObject(key, len(blob)))
        document = TaskStateDocument(
            job_id=JOB,
            vertex_uid=vertex,
            subtask=subtask,
            attempt=subtask + 1,
            checkpoint_id=CHECKPOINT,
            layout=SubtaskLayout(parallelism, 128, kg, operators, keyed_uids),
            operator_state=operator_state,
            keyed_state=keyed_state_to_document(keyed_handle) if keyed_handle is not None else None,
        )
        handles.append(
            TaskStateHandle(
                TaskId(JOB, OperatorUid(vertex), SubtaskIndex(subtask)),
                tuple(objects),
                inline_payload=encode_task_state(document),
            )
        )

    for s in range(2):
        add_task(SOURCE, s, 2, (SOURCE,), {SOURCE: encode_kafka_source_state(NEXT_OFFSETS[s], END_OFFSETS[s])})
    for s in range(2):
        keyed = TaskKeyedState(root / f"tm-{s}", storage, paths, TaskManagerId(f"taskmanager-{s + 1}"))
        kg = key_group_range_for_subtask(128, 2, SubtaskIndex(s))
        op = WindowAggregateOperator(Sum(), lambda v: v[0], TumblingEventTimeWindows(10), 0)
        context = OperatorContext(JOB, "test", WINDOW, s, 2, 128, 1, kg, {}, keyed.backend)
        op.setup(context, CollectingOutput())
        op.open()
        for value, ts in records():
            if key_group_for_key(value[0], 128) in kg:
                op.process(value, ts)
        op.process_watermark(WATERMARK)
        window_state = op.snapshot_state(CHECKPOINT)
        assert window_state is not None
        states = {WINDOW: window_state, SINK: _sink_state(s, 3 if s == 0 else 600)}
        add_task(WINDOW, s, 2, (WINDOW, SINK), states, keyed, (WINDOW,))
        keyed.discard()

    keyed = TaskKeyedState(root / "tm-dedupe", storage, paths, TaskManagerId("taskmanager-3"))
    store = keyed.backend.keyed_store(DEDUPE)
    for k in range(1, 6):
        store.put("seen", key_group_for_key(k, 128), key_to_bytes(k), {k, -k})
        store.put("last", key_group_for_key(("a", k), 128), key_to_bytes(("a", k)), {"n": k})
        store.put(SEQUENCES, key_group_for_key(k, 128), key_prefix(key_to_bytes(k)) + (k * 10).to_bytes(4, "big"), k)
    store.flush()
    add_task(DEDUPE, 0, 1, (DEDUPE, "print"), {}, keyed, (DEDUPE,))
    keyed.discard()

    key = paths.metadata(JOB, CHECKPOINT)
    checkpoint = CompletedCheckpoint(CHECKPOINT, JOB, 1764578000.25, 1764578001.5, tuple(handles), key)
    storage.put_bytes(key, encode_metadata(checkpoint))
    return Built(storage, key, external_path(storage.uri, key), checkpoint)


def build_savepoint(built: Built, folder: Path) -> Path:
    """The checkpoint as a self-contained savepoint folder: each object copied to the savepoint layout
    and every key in the metadata and task-state documents rewritten relative to the folder."""
    target = FileCheckpointStorage(folder)
    renamed: dict[str, str] = {}

    def copy(key: str, new_key: str) -> str:
        target.put_bytes(new_key, built.storage.get_bytes(key))
        renamed[key] = new_key
        return new_key

    tasks = []
    for handle in built.checkpoint.task_states:
        document = decode_task_state(handle.inline_payload, "test")
        keyed = document.keyed_state
        if keyed is not None:
            h = keyed_state_from_document(keyed, "test")
            base = f"db/{h.taskmanager_id}/{h.db_incarnation}/{h.snapshot_index:06d}"

            def moved(files: Any, base: str = base) -> Any:
                return tuple(dataclasses.replace(f, key=copy(f.key, f"{base}/{f.file_name}")) for f in files)

            keyed = keyed_state_to_document(
                dataclasses.replace(h, sst_files=moved(h.sst_files), db_files=moved(h.db_files))
            )
        operator_state = document.operator_state
        if isinstance(operator_state, StoredOperatorState):
            new_key = copy(operator_state.key, f"tasks/{document.vertex_uid}/{document.subtask:05d}")
            operator_state = dataclasses.replace(operator_state, key=new_key)
        document = dataclasses.replace(document, operator_state=operator_state, keyed_state=keyed)
        objects = tuple(dataclasses.replace(o, key=renamed[o.key], reused=False) for o in handle.objects)
        tasks.append(dataclasses.replace(handle, objects=objects, inline_payload=encode_task_state(document)))
    savepoint = dataclasses.replace(
        built.checkpoint, task_states=tuple(tasks), metadata_key="_metadata", kind=CheckpointKind.SAVEPOINT
    )
    target.put_bytes("_metadata", encode_metadata(savepoint))
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_checkpoint(tmp_path_factory.mktemp("checkpoint"))


@pytest.fixture
def damaged(tmp_path: Path) -> Built:
    """A checkpoint of its own, for a test to damage."""
    return build_checkpoint(tmp_path)


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines()]


Weir = Callable[..., Result]


@pytest.fixture
def weir(capsys: pytest.CaptureFixture[str]) -> Weir:
    def invoke(*args: str) -> Result:
        capsys.readouterr()  # not what a fixture printed while building the checkpoint
        code = run_cli(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


def assert_error(result: Result, exit_code: int, *fragments: str) -> None:
    assert result.exit_code == exit_code, result
    assert result.stderr.startswith("weir: error: ") and result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def ranges(key_groups: set[int]) -> list[list[int]]:
    """Consecutive key groups as [first, last] ranges."""
    out: list[list[int]] = []
    for kg in sorted(key_groups):
        if out and out[-1][1] == kg - 1:
            out[-1][1] = kg
        else:
            out.append([kg, kg])
    return out


# info ---------------------------------------------------------------------------------------------


def test_info_prints_the_checkpoint_its_subtasks_and_each_operators_state(weir: Weir, built: Built) -> None:
    result = weir("savepoint", "info", built.path)
    assert result.exit_code == EXIT_OK and result.stderr == ""
    out = result.stdout
    assert "checkpoint 7 of job job-a (metadata format 2, task-state format 2)" in out
    assert "keys relative to the storage root" in out
    assert "5 subtasks" in out
    assert "kafka source: next offsets 0 -> 120, 2 -> 98; end offsets 0 -> 200, 2 -> 200" in out
    assert "kafka source: next offsets 1 -> 77, 3 -> 0; end offsets 1 -> 200, 3 -> 200" in out
    assert f"window: watermark {WATERMARK}" in out
    assert "transactional sink: ledger at checkpoint 7, 1 pending [weir:job-a:kafka-sink:0:" in out
    assert "epochs 6: 3 records" in out and "epochs 6: 600 records" in out
    assert f"markers in {MARKER_TOPIC} partition 1 from offset 12" in out
    assert "keyed state in key groups [0..63]" in out and "keyed state in key groups [64..127]" in out
    assert "(keyed state names, entry counts and key groups present: --keyed)" in out
    assert "print\n    #0: no state" in out
    assert "warning" not in out


def test_info_as_json(weir: Weir, built: Built) -> None:
    result = weir("savepoint", "info", built.path, "--json")
    assert result.exit_code == EXIT_OK
    info = json.loads(result.stdout)
    assert (info["job_id"], info["checkpoint_id"], info["kind"]) == ("job-a", 7, "checkpoint")
    assert info["formats"] == {"metadata": 2, "task_state": 2}
    assert info["storage_root"] == built.storage.uri and info["metadata_key"] == built.metadata_key
    assert (info["trigger_timestamp"], info["completion_timestamp"]) == (1764578000.25, 1764578001.5)
    assert info["total_size_bytes"] == built.checkpoint.total_size_bytes > 0
    assert info["missing_objects"] == [] and info["warnings"] == [] and not info["keyed_state_scanned"]
    subtasks = {(s["vertex_uid"], s["subtask"]): s for s in info["subtasks"]}
    window1 = subtasks[(WINDOW, 1)]
    assert window1["attempt"] == 2 and window1["key_group_range"] == [64, 127]
    assert (window1["parallelism"], window1["max_parallelism"]) == (2, 128)
    assert window1["operator_state"]["stored"] == "object"  # the 600-record epoch is above the inline limit
    assert subtasks[(WINDOW, 0)]["operator_state"]["stored"] == "inline"
    assert window1["keyed_state"]["ranges"] == [[WINDOW, 64, 127]] and window1["keyed_state"]["sst_files"] >= 1
    operators = {o["uid"]: o for o in info["operators"]}
    assert list(operators) == [SOURCE, WINDOW, SINK, DEDUPE, "print"]
    source = [s["operator_state"] for s in operators[SOURCE]["subtasks"]]
    assert [s["kind"] for s in source] == ["kafka-source", "kafka-source"]
    assert source[0]["next_offsets"] == {"0": 120, "2": 98} and source[1]["end_offsets"] == {"1": 200, "3": 200}
    window = operators[WINDOW]
    assert window["keyed"] and [s["operator_state"]["watermark"] for s in window["subtasks"]] == [WATERMARK] * 2
    keyed = window["subtasks"][0]["keyed_state"]
    assert keyed["ranges"] == [[0, 63]] and keyed["states"] is None and keyed["files"] > 0
    sink = operators[SINK]["subtasks"][1]["operator_state"]
    assert sink["kind"] == "transactional-sink" and sink["ledger_checkpoint_id"] == 7
    assert sink["pending_transactions"] == [
        {
            "transaction": TransactionId(JOB, OperatorUid(SINK), SubtaskIndex(1), CheckpointId(6)).gid,
            "epoch": 6,
            "pre_committed_at": 7,
        }
    ]
    assert sink["epochs"] == [{"checkpoint_id": 6, "records": 600}]
    assert operators["print"]["subtasks"] == [
        {"vertex_uid": DEDUPE, "subtask": 0, "operator_state": None, "keyed_state": None}
    ]


def test_info_keyed_counts_each_states_entries_and_key_groups(weir: Weir, built: Built) -> None:
    result = weir("savepoint", "info", built.path, "--keyed", "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    operators = {o["uid"]: o for o in json.loads(result.stdout)["operators"]}
    expected = expected_windows()
    for sub in operators[WINDOW]["subtasks"]:
        kg = key_group_range_for_subtask(128, 2, SubtaskIndex(sub["subtask"]))
        mine = [k for k in expected if k[0] in kg]
        assert len(mine) >= 10
        states = sub["keyed_state"]["states"]
        assert set(states) == {"win", KEY_SAMPLE_STATE}  # and the key samples (weir.core.key_samples)
        assert states["win"] == {"entries": len(mine), "key_groups": ranges({k[0] for k in mine})}
        assert 0 < states[KEY_SAMPLE_STATE]["entries"] <= SAMPLES_AT_OPEN
    dedupe = operators[DEDUPE]["subtasks"][0]["keyed_state"]["states"]
    assert set(dedupe) == {"seen", "last", SEQUENCES}
    assert dedupe["seen"]["entries"] == dedupe["last"]["entries"] == dedupe[SEQUENCES]["entries"] == 5

    text = weir("savepoint", "info", built.path, "--keyed").stdout
    assert "seen: 5 entries in key groups" in text and "win: " in text and "--keyed)" not in text


# dump ---------------------------------------------------------------------------------------------


def test_dump_round_trips_the_window_state_of_every_subtask(weir: Weir, built: Built) -> None:
    result = weir("savepoint", "dump", built.path, "--uid", WINDOW, "--state", "win")
    assert result.exit_code == EXIT_OK and result.stderr == ""
    lines = result.lines()
    found = {}
    for line in lines:
        assert line["state"] == "win" and set(line) == {"subtask", "key_group", "state", "key", "key_hex", "value"}
        key = line["key"]
        found[(line["key_group"], key["key"], *key["window"])] = line["value"]
        kg = key_group_range_for_subtask(128, 2, SubtaskIndex(line["subtask"]))
        assert line["key_group"] in kg
    assert found == expected_windows()
    first = lines[0]
    raw = key_to_bytes(first["key"]["key"])
    assert bytes.fromhex(first["key_hex"])[: 4 + len(raw)] == len(raw).to_bytes(4, "big") + raw


def test_dump_filters_by_state_name_and_prints_other_values_by_repr(weir: Weir, built: Built) -> None:
    lines = weir("savepoint", "dump", built.path, "--uid", DEDUPE, "--state", "seen").lines()
    assert sorted((line["key"], line["value_repr"]) for line in lines) == [(k, repr({k, -k})) for k in range(1, 6)]
    assert all("value" not in line for line in lines)
    last = weir("savepoint", "dump", built.path, "--uid", DEDUPE, "--state", "last").lines()
    assert sorted((tuple(line["key"]), line["value"]["n"]) for line in last) == [(("a", k), k) for k in range(1, 6)]


def test_dump_leaves_the_key_samples_out_unless_asked_for_by_name(weir: Weir, built: Built) -> None:
    everything = weir("savepoint", "dump", built.path, "--uid", WINDOW).lines()
    assert everything and {line["state"] for line in everything} == {"win"}
    first = weir("savepoint", "dump", built.path, "--uid", WINDOW, "--limit", "5").lines()
    assert first == everything[:5]  # the limit counts the operator's own entries
    samples = weir("savepoint", "dump", built.path, "--uid", WINDOW, "--state", KEY_SAMPLE_STATE).lines()
    assert samples and {line["state"] for line in samples} == {KEY_SAMPLE_STATE}


def test_dump_stops_at_the_limit(weir: Weir, built: Built) -> None:
    assert len(weir("savepoint", "dump", built.path, "--uid", WINDOW, "--limit", "3").lines()) == 3
    assert weir("savepoint", "dump", built.path, "--uid", WINDOW, "--limit", "0").stdout == ""


def test_dump_of_an_operator_with_operator_state_only_prints_it_per_subtask(weir: Weir, built: Built) -> None:
    lines = weir("savepoint", "dump", built.path, "--uid", SOURCE).lines()
    assert [(line["subtask"], line["operator_state"]["next_offsets"]) for line in lines] == [
        (0, {"0": 120, "2": 98}),
        (1, {"1": 77, "3": 0}),
    ]
    sink = weir("savepoint", "dump", built.path, "--uid", SINK).lines()
    assert [line["operator_state"]["epochs"][0]["records"] for line in sink] == [3, 600]


def test_unknown_uid_and_state_are_user_errors(weir: Weir, built: Built) -> None:
    assert_error(
        weir("savepoint", "dump", built.path, "--uid", "nope"),
        EXIT_USAGE,
        "checkpoint 7 of job job-a",
        "has no operator 'nope'; its operators: events-source, window-count-sum, kafka-sink, dedupe, print",
    )
    assert_error(
        weir("savepoint", "dump", built.path, "--uid", WINDOW, "--state", "nope"),
        EXIT_USAGE,
        "operator 'window-count-sum' has no keyed state 'nope'; its states: weir.key-samples, win",
    )
    assert_error(
        weir("savepoint", "dump", built.path, "--uid", "print"), EXIT_USAGE, "has neither keyed nor operator state"
    )


def test_a_state_kind_added_to_the_layout_alone_is_read_by_the_inspector(
    weir: Weir, built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inspector restates no layout: a new kind of state, with its own key layout, is one entry
    of ``state_layout.STATE_KINDS``, and ``dump`` reads it without a change of its own."""
    guessed = weir("savepoint", "dump", built.path, "--uid", DEDUPE, "--state", SEQUENCES).lines()
    assert sorted((line["key"]["key"], line["key"]["user_key"]["hex"]) for line in guessed) == [
        (k, (k * 10).to_bytes(4, "big").hex()) for k in range(1, 6)
    ]
    sequence = PrefixedKey("sequence", 4, lambda rest: int.from_bytes(rest, "big"))
    monkeypatch.setitem(STATE_KINDS, SEQUENCES, StateKind(SEQUENCES, sequence, "the record"))
    lines = weir("savepoint", "dump", built.path, "--uid", DEDUPE, "--state", SEQUENCES).lines()
    assert {line["value"]: line["key"] for line in lines} == {k: {"key": k, "sequence": k * 10} for k in range(1, 6)}


# errors -------------------------------------------------------------------------------------------


def test_a_missing_path_or_a_folder_without_metadata_is_a_user_error(weir: Weir, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert_error(weir("savepoint", "info", str(missing)), EXIT_USAGE, f"savepoint {missing}: no such folder")
    (tmp_path / "empty").mkdir()
    assert_error(
        weir("savepoint", "dump", str(tmp_path / "empty"), "--uid", "x"),
        EXIT_USAGE,
        "no _metadata under file://",
        "not a checkpoint or savepoint folder",
    )


def test_info_reports_the_metadata_format_it_read_and_whether_the_checkpoint_was_full(
    weir: Weir, damaged: Built
) -> None:
    """The format of the object read, not the one this Weir writes: a format-1 metadata (before
    ``leader_term``) is reported as format 1; a full checkpoint (``weir checkpoint --full``) says so."""
    path = damaged.storage.root / damaged.metadata_key
    older = json.loads(path.read_bytes())
    older["format"] = 1
    del older["leader_term"], older["full"]
    path.write_bytes(json.dumps(older).encode())
    out = weir("savepoint", "info", damaged.path)
    assert out.exit_code == EXIT_OK
    assert "checkpoint 7 of job job-a (metadata format 1, task-state format 2)" in out.stdout
    as_json = json.loads(weir("savepoint", "info", damaged.path, "--json").stdout)
    assert (as_json["formats"], as_json["full"]) == ({"metadata": 1, "task_state": 2}, False)
    path.write_bytes(encode_metadata(dataclasses.replace(damaged.checkpoint, full=True)))
    out = weir("savepoint", "info", damaged.path)
    assert out.exit_code == EXIT_OK
    assert "checkpoint (full) 7 of job job-a (metadata format 2, task-state format 2)" in out.stdout
    as_json = json.loads(weir("savepoint", "info", damaged.path, "--json").stdout)
    assert (as_json["formats"], as_json["full"]) == ({"metadata": 2, "task_state": 2}, True)


def test_a_truncated_metadata_is_a_clear_error(weir: Weir, damaged: Built) -> None:
    path = damaged.storage.root / damaged.metadata_key
    path.write_bytes(path.read_bytes()[:100])
    assert_error(
        weir("savepoint", "info", damaged.path),
        EXIT_FAILURE,
        f"savepoint {damaged.path}: checkpoint metadata {damaged.metadata_key} is not a JSON document",
    )


def test_a_bad_task_state_document_is_a_clear_error(weir: Weir, damaged: Built) -> None:
    path = damaged.storage.root / damaged.metadata_key
    document = json.loads(path.read_bytes())
    document["tasks"][2]["state_handle"] = base64.b64encode(b'{"format": 2, "task": {}}').decode()
    path.write_text(json.dumps(document))
    assert_error(
        weir("savepoint", "info", damaged.path),
        EXIT_FAILURE,
        f"checkpoint 7 of job job-a ({damaged.path}): task window-count-sum#0: task state document is malformed",
    )


def test_a_missing_sst_is_reported_by_info_and_fails_a_read(weir: Weir, damaged: Built) -> None:
    task = decode_task_state(damaged.checkpoint.task_states[3].inline_payload, "test")  # window-count-sum#1
    assert task.keyed_state is not None
    sst = keyed_state_from_document(task.keyed_state, "test").sst_files[0]
    (damaged.storage.root / sst.key).unlink()

    info = weir("savepoint", "info", damaged.path, "--json")
    assert info.exit_code == EXIT_OK and json.loads(info.stdout)["missing_objects"] == [sst.key]
    assert (
        f"warning: 1 object(s) the metadata references are missing, e.g. {sst.key}"
        in weir("savepoint", "info", damaged.path).stdout
    )
    for args in (("info", "--keyed"), ("dump", "--uid", WINDOW)):
        result = weir("savepoint", args[0], damaged.path, *args[1:])
        assert_error(
            result,
            EXIT_FAILURE,
            "task window-count-sum#1: keyed state file",
            f"checkpoint object {damaged.storage.uri}/{sst.key} does not exist",
        )


def test_a_truncated_sst_fails_a_read(weir: Weir, damaged: Built) -> None:
    task = decode_task_state(damaged.checkpoint.task_states[2].inline_payload, "test")
    assert task.keyed_state is not None
    sst = keyed_state_from_document(task.keyed_state, "test").sst_files[0]
    (damaged.storage.root / sst.key).write_bytes(b"short")
    assert_error(
        weir("savepoint", "dump", damaged.path, "--uid", WINDOW),
        EXIT_FAILURE,
        f"task window-count-sum#0: keyed state file {sst.key} is 5 bytes, its handle says {sst.size_bytes}",
    )


def test_a_storage_that_does_not_answer_is_exit_3(weir: Weir, built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: FileCheckpointStorage, key: str) -> bytes:
        raise ServiceUnavailableError(f"get of checkpoint object {self.uri}/{key} failed: timed out")

    monkeypatch.setattr(FileCheckpointStorage, "get_bytes", fail)
    assert_error(weir("savepoint", "info", built.path), EXIT_NO_CLUSTER, "failed: timed out")


# a savepoint: keys relative to its folder ---------------------------------------------------------


def test_a_relocated_savepoint_reads_from_its_folder_alone(weir: Weir, built: Built, tmp_path: Path) -> None:
    folder = build_savepoint(built, tmp_path / "made" / "sp-1")
    moved = tmp_path / "elsewhere" / "copied"
    shutil.copytree(folder, moved)
    shutil.rmtree(folder)

    info = json.loads(weir("savepoint", "info", f"{moved.as_uri()}/_metadata", "--json").stdout)
    assert info["kind"] == "savepoint" and info["keys_relative_to"] == "folder"
    assert info["storage_root"] == moved.as_uri() and info["metadata_key"] == "_metadata"
    assert info["missing_objects"] == [] and info["warnings"] == []
    keys = [
        o["key"] for s in info["subtasks"] if s["operator_state"]["stored"] == "object" for o in [s["operator_state"]]
    ]
    assert keys == ["tasks/window-count-sum/00001"]

    text = weir("savepoint", "info", str(moved)).stdout
    assert "savepoint 7 of job job-a" in text and "keys relative to the folder" in text
    lines = weir("savepoint", "dump", str(moved), "--uid", WINDOW, "--state", "win").lines()
    assert {
        (ln["key_group"], ln["key"]["key"], *ln["key"]["window"]): ln["value"] for ln in lines
    } == expected_windows()
    sink = weir("savepoint", "dump", str(moved), "--uid", SINK).lines()
    assert [line["operator_state"]["epochs"][0]["records"] for line in sink] == [3, 600]


def test_a_relative_directory_path_is_read_from_the_working_directory(
    weir: Weir, built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_savepoint(built, tmp_path / "sp")
    monkeypatch.chdir(tmp_path)
    assert json.loads(weir("savepoint", "info", "sp", "--json").stdout)["checkpoint_id"] == 7


# the command group -------------------------------------------------------------------------------


def test_the_savepoint_group_routes_a_job_id_to_trigger(
    weir: Weir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens there: reaching the trigger means asking the JobManager (exit 3, no cluster).
    monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", "127.0.0.1:9")
    for args in (
        ("savepoint", "some-job-id"),
        ("savepoint", "some-job-id", "--path", "s3://bucket/sp"),
        ("savepoint", "--path", "s3://bucket/sp", "some-job-id"),
        ("savepoint", "trigger", "some-job-id"),
    ):
        assert_error(weir(*args), EXIT_NO_CLUSTER, "no JobManager at 127.0.0.1:9")
    assert_error(weir("savepoint", "info", str(tmp_path / "x")), EXIT_USAGE, "no such folder")
    assert weir("savepoint", "trigger").exit_code == EXIT_USAGE  # JOB_ID is required


# decoding -----------------------------------------------------------------------------------------


def test_a_dump_line_reads_each_entry_through_the_layout() -> None:
    """Entries as the operators write them (tests/unit/operators/test_state_bytes.py pins their
    bytes) as dump lines: the key read by its state's kind, the exact key bytes, the value unpickled."""
    alice = key_prefix(key_to_bytes("alice"))
    window_key = alice + (10).to_bytes(8, "big") + (20).to_bytes(8, "big")
    k = key_prefix(key_to_bytes("k"))
    timer_key = k + (1000).to_bytes(8, "big")
    cases = [
        (
            KeyedEntry(KeyGroup(71), "win", window_key, pickle.dumps(("alice", 7), 5)),
            {"key": "alice", "window": [10, 20]},
        ),
        (KeyedEntry(KeyGroup(93), "timers.event_time", timer_key, pickle.dumps(("k",), 5)), {"key": "k", "time": 1000}),
        (KeyedEntry(KeyGroup(93), "seen", k + key_to_bytes(12), pickle.dumps(12, 5)), {"key": "k", "user_key": 12}),
        (KeyedEntry(KeyGroup(102), "reduce", key_to_bytes(5), pickle.dumps(5, 5)), 5),
    ]
    for entry, key in cases:
        value = pickle.loads(entry.value)
        line = entry_to_json(entry)
        assert line == {
            "key_group": entry.key_group,
            "state": entry.state,
            "key": key,
            "key_hex": entry.key.hex(),
            "value": value,
        }


def test_operator_states_are_decoded_by_the_first_decoder_that_reads_them() -> None:
    assert decode_operator_state(json.dumps({"format": 1, "next_k": 40}).encode()) == {
        "kind": "generator-source",
        "next_k": 40,
        "size_bytes": 27,
    }
    assert decode_operator_state(json.dumps({"format": 1, "watermark": 5}).encode())["kind"] == "window"
    pending = pending_window_state(5, 2, b"<an Arrow IPC stream>")  # a columnar window's, with pending windows
    assert decode_operator_state(pending) == {
        "kind": "window",
        "watermark": 5,
        "pending_windows": 2,
        "size_bytes": len(pending),
    }
    assert decode_operator_state(b"\x80\x05junk") == {"kind": "opaque", "size_bytes": 6}
    assert decode_operator_state(json.dumps({"format": 9}).encode()) == {"kind": "opaque", "size_bytes": 13}


def test_dispose_deletes_every_file_of_a_savepoint_metadata_first(weir: Weir, built: Built, tmp_path: Path) -> None:
    """`weir savepoint --dispose PATH` (Flink's `flink savepoint -d`): the folder's files are gone; the
    other forms of the command are the same."""
    for form in (("--dispose",), ("-d",), ("dispose",)):
        folder = build_savepoint(built, tmp_path / "made" / f"sp-{form[0]}")
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        assert len(files) > 3
        result = weir("savepoint", *form, str(folder))
        assert result.exit_code == EXIT_OK, result.stderr
        assert result.stdout.strip() == f"disposed savepoint 7 of job job-a: {len(files)} files, {folder}"
        assert not any(p.is_file() for p in folder.rglob("*")), "every file of the savepoint is deleted"


def test_dispose_refuses_a_path_that_is_not_a_savepoint(weir: Weir, built: Built, tmp_path: Path) -> None:
    metadata = built.storage.root / built.metadata_key
    before = sorted(p for p in built.storage.root.rglob("*") if p.is_file())
    assert_error(
        weir("savepoint", "--dispose", built.path),
        EXIT_USAGE,
        f"{built.path} is checkpoint 7 of job job-a, not a savepoint: only a savepoint is disposed",
    )
    assert sorted(p for p in built.storage.root.rglob("*") if p.is_file()) == before and metadata.is_file()
    (tmp_path / "empty").mkdir()
    assert_error(weir("savepoint", "--dispose", str(tmp_path / "empty")), EXIT_USAGE, "no _metadata under")
    assert_error(weir("savepoint", "--dispose"), EXIT_USAGE, "Missing argument 'PATH'")
