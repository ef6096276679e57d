"""Two jobs on one cluster, same operator uids, subtasks side by side on every TaskManager: each job's
checkpoints hold only its own files, its own databases and its own state (issue 13, "Proven by").

Both jobs run ``examples/keyed_aggregation.py`` at parallelism 3 (round-robin slots: every TaskManager
runs one keyed ``window-count-sum`` subtask of each) over their own topic, with keys of their own prefix
and very different state sizes (5,000 keys against 100). What the checkpoint storage holds is read back
the way a recovering JobManager reads it: the listing, each retained checkpoint's ``_metadata``, the
task-state documents in it and the RocksDB files they name, opened as they are (every entry they hold)
and restored into a fresh database. The TaskManagers' local database directories are checked too:
one per keyed subtask of each job, removed when the job is cancelled.
"""

from __future__ import annotations

import json
import pickle
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from tests.integration import polling
from tests.integration.conftest import WeirCluster, create_topics, create_window_table
from weir.connectors import kafka
from weir.connectors.object_storage import CheckpointStorage, ObjectNotFoundError, open_storage
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.config import checkpoint_dir
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.key_samples import KEY_SAMPLE_STATE
from weir.core.keygroups import KeyGroupRange, key_group_for_key, key_group_range_for_subtask
from weir.core.paths import CheckpointPaths
from weir.core.task_state import StoredOperatorState, decode_task_state
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.taskmanager.snapshots import KeyedStateHandle, RocksDBSnapshotter, keyed_state_from_document
from weir.taskmanager.state import RocksDBStateBackend
from weir.tools.client import JobDetails

pytestmark = pytest.mark.integration

JOB_FILE = "examples/keyed_aggregation.py"
PARALLELISM = 3
MAX_PARALLELISM = 128
WINDOW = OperatorUid("window-count-sum")  # the keyed vertex: window + sinks, chained
WINDOW_MS = 1000
EVENTS = 65_000  # 10 events per ms of event time: 6.5 windows, the last one stays open
RECORDS_PER_SECOND = "6000"  # ~11 s of input per job, checkpoints every second meanwhile
PATHS = CheckpointPaths()
DEADLINE_S = 120.0
_BOUNDS = struct.Struct(">qq")  # weir.operators.windows: a window entry's key ends with its bounds


@dataclass(frozen=True)
class Job:
    name: str
    job_id: JobId
    key_prefix: str
    reference: dict[tuple[str, int], tuple[int, int]]  # (key, window start) -> (count, sum)
    last_window: int

    def local_dirs(self, run_dir: Path) -> dict[Path, TaskManagerId]:
        """This job's task-attempt directories on every TaskManager (``jobs/<job>/<vertex>-<subtask>-<attempt>``)."""
        return {
            d: TaskManagerId(tm.name)
            for tm in run_dir.glob("taskmanager-*")
            for d in sorted((tm / "jobs" / self.job_id).glob("*"))
        }


def make_events(prefix: str, keys: int, start_ms: int) -> Iterator[dict[str, Any]]:
    for i in range(EVENTS):
        yield {"id": f"{prefix}{i}", "key": f"{prefix}-{i % keys:05d}", "value": i % 97, "ts": start_ms + i // 10}


def produce(cluster: WeirCluster, topic: str, events: list[dict[str, Any]]) -> None:
    producer = kafka.producer(cluster.endpoints, linger_ms=20, batch_num_messages=10_000, enable_idempotence=True)
    errors: list[str] = []
    for event in events:
        while True:
            try:
                producer.produce(
                    topic,
                    key=event["key"].encode(),
                    value=json.dumps(event).encode(),
                    on_delivery=lambda err, _msg: errors.append(str(err)) if err is not None else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0 and not errors, errors[:3]


def reference(events: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int]]:
    result: dict[tuple[str, int], tuple[int, int]] = {}
    for e in events:
        start = e["ts"] - e["ts"] % WINDOW_MS
        count, total = result.get((e["key"], start), (0, 0))
        result[(e["key"], start)] = (count + 1, total + e["value"])
    return result


def running(cluster: WeirCluster, job: Job) -> JobDetails:
    status = cluster.client.job_status(job.job_id)
    assert status.summary.status == "RUNNING", (job.name, status.summary.status, status.failure)
    assert status.summary.restarts == 0, (job.name, status.failure)  # one attempt: placement is fixed
    return status


def window_records_in(status: JobDetails) -> int:
    return sum(t.records_in for t in status.tasks if t.vertex_uid == WINDOW)


def completed_triggered_between(cluster: WeirCluster, job: Job, after: float, before: float) -> list[CheckpointId]:
    return [
        c.checkpoint_id
        for c in cluster.client.list_checkpoints(job.job_id)
        if c.status == CheckpointStatus.COMPLETED and after < c.trigger_time < before
    ]


def completed_since(
    cluster: WeirCluster, job: Job, since: float, count: int = 1
) -> Callable[[], list[CheckpointId] | None]:
    """A probe for ``polling.poll``: ``count`` completed checkpoints of the job triggered after ``since``."""

    def probe() -> list[CheckpointId] | None:
        found = completed_triggered_between(cluster, job, since, float("inf"))
        return found if len(found) >= count else None

    return probe


def retained_checkpoints(storage: CheckpointStorage, job: Job) -> tuple[dict[str, int], list[CompletedCheckpoint]]:
    """The job folder's listing, and the checkpoints whose metadata is in it and still there after it:
    their objects were all uploaded before the listing (metadata is written last) and none was deleted
    during it (a subsumed checkpoint's metadata is deleted first), so the listing must hold them all."""
    listing = dict(storage.list(PATHS.job_dir(job.job_id)))
    found = []
    for key in sorted(listing):
        parsed = PATHS.parse_metadata_key(key)
        if parsed is None or parsed.kind is not CheckpointKind.CHECKPOINT:
            continue
        try:
            found.append(decode_metadata(storage.get_bytes(key), key))
        except ObjectNotFoundError:
            continue  # subsumed since the listing
    still = {key for key, _ in storage.list(PATHS.checkpoints_dir(job.job_id))}
    return listing, [c for c in found if c.metadata_key in still]


def keyed_handles(
    job: Job,
    other: Job,
    checkpoint: CompletedCheckpoint,
    listing: dict[str, int],
    placement: dict[SubtaskIndex, TaskManagerId],
) -> dict[int, KeyedStateHandle]:
    """Every check on one checkpoint's tasks; the keyed subtasks' RocksDB handles by subtask."""
    own, foreign = PATHS.job_dir(job.job_id), PATHS.job_dir(other.job_id)
    cid = checkpoint.checkpoint_id
    assert checkpoint.job_id == job.job_id
    handles: dict[int, KeyedStateHandle] = {}
    for state in checkpoint.task_states:
        task = state.task_id
        where = f"{job.name} checkpoint {cid} task {task.operator_uid}#{task.subtask}"
        keys = {o.key for o in state.objects}
        assert all(key.startswith(own) and not key.startswith(foreign) for key in keys), (where, keys)
        missing = {o.key: o.size_bytes for o in state.objects if listing.get(o.key) != o.size_bytes}
        assert not missing, (where, "referenced but not listed with that size", missing)

        document = decode_task_state(state.inline_payload, where)
        assert (document.job_id, document.vertex_uid, document.subtask) == (job.job_id, task.operator_uid, task.subtask)
        assert document.checkpoint_id == cid
        operator_object = (
            {document.operator_state.key} if isinstance(document.operator_state, StoredOperatorState) else set()
        )
        if task.operator_uid != WINDOW:
            assert document.keyed_state is None, where  # the source chain has no keyed operator
            assert keys == operator_object, where
            continue
        assert document.keyed_state is not None, where
        handle = keyed_state_from_document(document.keyed_state, where)
        assert keys == {f.key for f in handle.objects} | operator_object, where
        assert handle.taskmanager_id == placement[task.subtask], where
        owned = key_group_range_for_subtask(MAX_PARALLELISM, PARALLELISM, SubtaskIndex(task.subtask))
        # the operator's namespace (keyed state is named by operator uid in the task's own database)
        # and the subtask's key groups
        assert handle.ranges == ((WINDOW, owned),), where
        assert handle.sst_files, where
        for f in handle.sst_files:
            sst = PATHS.parse_shared_sst(f.key)
            assert sst is not None, (where, f.key)
            assert (sst.job_id, sst.taskmanager_id, sst.db_incarnation, sst.file_name) == (
                job.job_id,
                handle.taskmanager_id,
                handle.db_incarnation,
                f.file_name,
            ), (where, f.key)
            # uploaded by this checkpoint, or reused from an earlier one of the same database
            assert (sst.checkpoint_id < cid) if f.reused else (sst.checkpoint_id == cid), (where, f)
        for f in handle.db_files:
            private = PATHS.parse_checkpoint_object(f.key)
            assert private is not None and (private.job_id, private.checkpoint_id) == (job.job_id, cid), where
            expected = f"db/{handle.taskmanager_id}/{handle.db_incarnation}/{handle.snapshot_index:06d}/{f.file_name}"
            assert private.name == expected and not f.reused, (where, f.key)
        handles[task.subtask] = handle
    assert sorted(handles) == list(range(PARALLELISM)), (job.name, cid, sorted(handles))
    # One database per subtask: three incarnations, no SST (by key or by database file) listed twice.
    assert len({h.db_incarnation for h in handles.values()}) == PARALLELISM, (job.name, cid)
    ssts = [f.key for h in handles.values() for f in h.sst_files]
    assert len(ssts) == len(set(ssts)), (job.name, cid, "an SST listed by two subtasks")
    files = [(h.taskmanager_id, h.db_incarnation, f.file_name) for h in handles.values() for f in h.sst_files]
    assert len(files) == len(set(files)), (job.name, cid)
    return handles


def sst_bytes(handles: dict[int, KeyedStateHandle]) -> int:
    return sum(f.size_bytes for h in handles.values() for f in h.sst_files)


def snapshot_entries(storage: CheckpointStorage, handle: KeyedStateHandle, directory: Path) -> dict[bytes, bytes]:
    """Every entry of the RocksDB snapshot ``handle`` names, read from its files as they are in the
    checkpoint storage (not through a restore, which copies only the handle's own namespace and key
    groups: another job's entries in the same files would not show there)."""
    directory.mkdir(parents=True)
    for f in handle.objects:
        storage.get_file(f.key, directory / f.file_name)
    db = Rdict(str(directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        entries = {}
        for key, value in db.items():
            assert isinstance(key, bytes) and isinstance(value, bytes)
            entries[key] = value
        return entries
    finally:
        db.close()


def window_accumulators(job: Job, handle: KeyedStateHandle, entries: dict[bytes, bytes]) -> dict[tuple[str, int], Any]:
    """(key, window start) -> accumulator of the entries, each checked to be this job's window state in
    the handle's key groups."""
    namespace = WINDOW.encode()
    owned = handle.ranges[0][1]
    windows: dict[tuple[str, int], Any] = {}
    for raw_key, raw_value in entries.items():
        uid, _, rest = raw_key.partition(b"\x00")
        assert uid == namespace, (job.name, raw_key)  # another job's (or operator's) state in this database
        key_group = int.from_bytes(rest[:2], "big")
        if rest[2:].startswith(KEY_SAMPLE_STATE.encode() + b"\x00"):
            assert key_group in owned, (job.name, raw_key)  # the records it keyed, sampled (weir.core.key_samples)
            continue
        assert rest[2:].startswith(b"win\x00") and key_group in owned, (job.name, raw_key)
        key, acc = pickle.loads(raw_value)
        start, end = _BOUNDS.unpack(raw_key[-_BOUNDS.size :])
        assert end - start == WINDOW_MS and key_group_for_key(key, MAX_PARALLELISM) == key_group, raw_key
        windows[(key, start)] = acc
    return windows


def restored(storage: CheckpointStorage, handle: KeyedStateHandle, root: Path) -> dict[bytes, bytes]:
    """What a fresh database holds after restoring ``handle`` over every key group (the product path)."""
    backend = RocksDBStateBackend(root / "state.db")
    snapshotter = RocksDBSnapshotter(backend, storage, CheckpointPaths(), TaskManagerId("test-restore"), work_dir=root)
    try:
        uid = handle.ranges[0][0]
        result = snapshotter.restore([handle], [(uid, KeyGroupRange(KeyGroup(0), KeyGroup(MAX_PARALLELISM - 1)))])
        content: dict[bytes, bytes] = {}
        for key, value in backend.db.items():
            assert isinstance(key, bytes) and isinstance(value, bytes)
            content[key] = value
        assert result.adopted == handle and result.copied_entries == 0 and result.handles_used == 1
        return content
    finally:
        snapshotter.close()
        backend.close()


def local_ssts(directory: Path) -> set[tuple[str, int]]:
    return {(p.name, p.stat().st_size) for p in (directory / "state.db").glob("*.sst")}


def test_two_jobs_with_the_same_operator_uids_checkpoint_only_their_own_files_and_state(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    cluster, endpoints = weir_cluster, weir_cluster.endpoints
    storage = open_storage(checkpoint_dir(), endpoints)
    run_dir = cluster.directory.parent  # WEIR_RUN_DIR: the TaskManagers keep their state under it
    start_ms = int(time.time()) * 1000

    # Both jobs need all six slots (two per TaskManager): wait for earlier tests' jobs to release theirs.
    polling.until(
        "6 free slots on 3 TaskManagers",
        DEADLINE_S,
        lambda: (
            len(alive := cluster.client.cluster_status().alive_taskmanagers) == 3
            and sum(tm.slots_free for tm in alive) >= 2 * PARALLELISM
        ),
    )
    inputs = []  # both inputs first, then both jobs at once: they process side by side
    for name, keys in (("a", 5_000), ("b", 100)):
        topic, sink, dlq, table = (f"{kind}-{name}-{unique}" for kind in ("events", "results", "dlq", "table"))
        table = table.replace("-", "_")
        create_topics(endpoints, {topic: PARALLELISM, sink: PARALLELISM, dlq: 1})
        create_window_table(endpoints, table)
        events = list(make_events(f"{name}{unique}", keys, start_ms))
        produce(cluster, topic, events)
        parameters = {
            "source.topic": topic,
            "sink.topic": sink,
            "sink.table": table,
            "source.dlq_topic": dlq,
            "source.records_per_second": RECORDS_PER_SECOND,
            "checkpointing.interval": "1s",
        }
        inputs.append((name, reference(events), parameters))
    jobs: list[Job] = []
    try:
        for name, ref, parameters in inputs:
            job_id = JobId(cluster.submit(JOB_FILE, parameters, PARALLELISM))
            jobs.append(Job(name, job_id, f"{name}{unique}-", ref, max(start for _, start in ref)))
        a, b = jobs
        _run_and_check(cluster, storage, run_dir, a, b, tmp_path)
    finally:
        for job in jobs:
            if not cluster.client.job_status(job.job_id).summary.is_terminal:
                cluster.client.cancel_job(job.job_id)
        for job in jobs:
            assert cluster.wait_for(job.job_id, ("CANCELED",), timeout_s=DEADLINE_S).summary.status == "CANCELED"


def _run_and_check(
    cluster: WeirCluster, storage: CheckpointStorage, run_dir: Path, a: Job, b: Job, tmp_path: Path
) -> None:
    # 1. Both run, side by side: every TaskManager hosts one keyed subtask of each job.
    def all_tasks_running() -> list[JobDetails] | None:
        statuses = [cluster.client.job_status(job.job_id) for job in (a, b)]
        ok = all(s.summary.status == "RUNNING" and all(t.state == "RUNNING" for t in s.tasks) for s in statuses)
        return statuses if ok else None

    statuses = polling.poll("both jobs running with every task deployed", DEADLINE_S, all_tasks_running)
    both_running_at = time.time()
    placement = {
        job.job_id: {t.subtask: t.taskmanager_id for t in status.tasks if t.vertex_uid == WINDOW}
        for job, status in zip((a, b), statuses, strict=True)
    }
    taskmanagers = {f"taskmanager-{i}" for i in range(1, 4)}
    for job in (a, b):
        assert set(placement[job.job_id].values()) == taskmanagers, (job.name, placement[job.job_id])

    # 2. Several checkpoints of each complete while both still process their input.
    done_at: dict[str, float] = {}

    def both_consumed() -> bool | None:
        for job in (a, b):
            if job.name not in done_at and window_records_in(running(cluster, job)) >= EVENTS:
                done_at[job.name] = time.time()
        return True if len(done_at) == 2 else None

    polling.poll("both jobs to process their input", DEADLINE_S, both_consumed)
    first_done = min(done_at.values())
    for job in (a, b):
        assert window_records_in(running(cluster, job)) == EVENTS, job.name
        during = completed_triggered_between(cluster, job, both_running_at, first_done)
        assert len(during) >= 3, (job.name, during, cluster.client.list_checkpoints(job.job_id))

    # 3. Checkpoints taken after the input was processed hold the final state; read them back.
    for job in (a, b):
        polling.poll(
            f"{job.name}: 2 checkpoints triggered after its input was processed",
            DEADLINE_S,
            completed_since(cluster, job, done_at[job.name], count=2),
        )
    own_dirs = {job.name: job.local_dirs(run_dir) for job in (a, b)}
    figures: dict[str, dict[str, int]] = {}
    incarnations: dict[str, set[str]] = {}
    for job, other in ((a, b), (b, a)):
        listing, retained = retained_checkpoints(storage, job)
        assert retained, (job.name, sorted(listing))
        # Everything in the job's folder is the job's: its record, its checkpoints, its shared SSTs.
        for key in listing:
            sst, in_checkpoint = PATHS.parse_shared_sst(key), PATHS.parse_checkpoint_object(key)
            owner = sst.job_id if sst else in_checkpoint.job_id if in_checkpoint else None
            assert owner == job.job_id or key == PATHS.job_record(job.job_id), (job.name, key)
            if sst is not None:
                assert sst.taskmanager_id in set(placement[job.job_id].values()), key
        checkpoints = {c.checkpoint_id: keyed_handles(job, other, c, listing, placement[job.job_id]) for c in retained}
        incarnations[job.name] = {
            PATHS.parse_shared_sst(k).db_incarnation  # type: ignore[union-attr]
            for k in listing
            if PATHS.parse_shared_sst(k) is not None
        }
        assert {h.db_incarnation for hs in checkpoints.values() for h in hs.values()} <= incarnations[job.name]

        latest = max(checkpoints)
        handles = checkpoints[latest]
        assert next(c for c in retained if c.checkpoint_id == latest).trigger_timestamp > done_at[job.name]
        # The state is the job's own: each subtask's snapshot files hold exactly its accumulators, no
        # entry of another job (or namespace), and a restore from its handle gives the same.
        state: dict[tuple[str, int], Any] = {}
        for subtask, handle in handles.items():
            where = tmp_path / f"{job.name}-{latest}-{subtask}"
            entries = snapshot_entries(storage, handle, where / "files")
            windows = window_accumulators(job, handle, entries)
            assert restored(storage, handle, where / "restore") == entries
            assert windows.keys().isdisjoint(state.keys())
            state |= windows
        wrong = {k: v for k, v in state.items() if job.reference.get(k) != v}
        assert not wrong, (job.name, "entries that are not this job's", dict(list(wrong.items())[:5]))
        last = {k: v for k, v in job.reference.items() if k[1] == job.last_window}
        assert last.items() <= state.items(), (job.name, len(last), len(state))
        assert all(k[0].startswith(job.key_prefix) and not k[0].startswith(other.key_prefix) for k in state)

        # The SSTs the newest checkpoint lists are exactly the subtasks' local databases' (idle now).
        def matches_local(
            job: Job = job, other: Job = other
        ) -> tuple[dict[str, int], list[CompletedCheckpoint], dict[int, KeyedStateHandle]] | None:
            listing, retained = retained_checkpoints(storage, job)
            newest = max(retained, key=lambda checkpoint: checkpoint.checkpoint_id)
            handles = keyed_handles(job, other, newest, listing, placement[job.job_id])
            for subtask, handle in handles.items():
                (directory,) = (d for d in own_dirs[job.name] if d.name.startswith(f"{WINDOW}-{subtask}-"))
                if local_ssts(directory) != {(f.file_name, f.size_bytes) for f in handle.sst_files}:
                    return None
            return listing, retained, handles

        listing, retained, settled = polling.poll(
            f"{job.name}: the newest checkpoint's SSTs to be its local databases'", DEADLINE_S, matches_local
        )
        newest = max(retained, key=lambda checkpoint: checkpoint.checkpoint_id)
        figures[job.name] = {
            "objects_in_folder": len(listing),
            "retained_checkpoints": len(retained),
            "objects_per_checkpoint": len(newest.object_keys),
            "sst_files": sum(len(h.sst_files) for h in settled.values()),
            "sst_bytes": sst_bytes(settled),
            "referenced_bytes": newest.total_size_bytes,
            "window_entries": len(state),
        }
    print(f"\njob isolation figures: {figures}")
    assert incarnations["a"].isdisjoint(incarnations["b"])  # no database of one job holds the other's files
    # Job b keeps 100 keys, job a 5,000: b's checkpoint is its own small state, not a's plus b's (a
    # database holding both would make b's SSTs at least as large as a's).
    assert (figures["a"]["window_entries"], figures["b"]["window_entries"]) == (5_000, 100), figures
    assert figures["b"]["sst_bytes"] * 2 < figures["a"]["sst_bytes"], figures

    # 4. Each TaskManager keeps one database directory per keyed subtask of each job, nothing else of it.
    for job in (a, b):
        dirs = own_dirs[job.name]
        expected = {(tm, f"{WINDOW}-{s}-") for s, tm in placement[job.job_id].items()}
        assert {(tm, d.name.rsplit("-", 1)[0] + "-") for d, tm in dirs.items()} == expected, (job.name, dirs)
        assert all((d / "state.db").is_dir() for d in dirs), dirs

    # 5. Cancelling a removes a's directories; b's stay, and b goes on checkpointing its own state.
    cancelled_at = time.time()
    cluster.client.cancel_job(a.job_id)
    assert cluster.wait_for(a.job_id, ("CANCELED",), timeout_s=DEADLINE_S).summary.status == "CANCELED"
    polling.until(
        "a's local RocksDB directories to be removed",
        DEADLINE_S,
        lambda: not any((run_dir / tm / "jobs" / a.job_id).exists() for tm in taskmanagers),
    )
    assert all(d.is_dir() for d in own_dirs["b"]), own_dirs["b"]
    running(cluster, b)
    polling.poll("b: a checkpoint triggered after a's cancel", DEADLINE_S, completed_since(cluster, b, cancelled_at))
    listing, retained = retained_checkpoints(storage, b)
    for checkpoint in retained:
        keyed_handles(b, a, checkpoint, listing, placement[b.job_id])
    assert all(d.is_dir() for d in own_dirs["b"]), own_dirs["b"]

    cluster.client.cancel_job(b.job_id)
    assert cluster.wait_for(b.job_id, ("CANCELED",), timeout_s=DEADLINE_S).summary.status == "CANCELED"
    polling.until(
        "b's local RocksDB directories to be removed",
        DEADLINE_S,
        lambda: not any((run_dir / tm / "jobs" / b.job_id).exists() for tm in taskmanagers),
    )
    left = {job.name: sum(1 for _ in storage.list(PATHS.job_dir(job.job_id))) for job in (a, b)}
    print(f"objects left in checkpoint storage after both cancels: {left}")
