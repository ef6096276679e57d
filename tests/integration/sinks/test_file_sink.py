"""The exactly-once file sink against the real S3 server and a local directory.

The operator driven directly shows the S3 protocol: part files are multipart uploads no listing
shows until their checkpoint completes; a crashed subtask's recovery completes what the restored
checkpoint lists and aborts the rest. A cluster run with a TaskManager killed mid-run shows the
whole job: every event read back from the Parquet files once, as a multiset of whole records, and
nothing but finished part files under the path.
"""

from __future__ import annotations

import io
import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import REPO_ROOT, WeirCluster, create_topics, wait_for_job
from tests.integration.ports import private_ports
from tests.integration.sinks.conftest import operator_context
from tests.unit.conftest import CollectingOutput
from weir.api import PartFileSink, fixed_bucket
from weir.connectors.files import S3PartFileStore
from weir.core.config import Endpoints
from weir.core.rejections import FAIL
from weir.operators.file_sink import PartFileSinkOperator
from weir.operators.part_files import PartFileName, hourly_bucket
from weir.tools.client import JobManagerClient
from weir.tools.events import EventSpec, events, produce_events
from weir.tools.supervisor import kill_process, start_cluster, stop_cluster

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def whole(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


@pytest.fixture
def s3_root(services: Endpoints) -> Iterator[S3PartFileStore]:
    """A prefix of the test's own in the S3 server's bucket; its objects and uploads go afterwards."""
    store = S3PartFileStore(services, services.s3_bucket, f"file-sink-{uuid.uuid4().hex[:8]}")
    yield store
    for unfinished in store.unfinished():
        store.discard(unfinished)
    keys = list(store.finished_keys())
    for start in range(0, len(keys), 1000):
        store.client.delete_objects(
            Bucket=store.bucket, Delete={"Objects": [{"Key": store.prefix + k} for k in keys[start : start + 1000]]}
        )


def s3_sink(store: S3PartFileStore, job_id: str, restore: bytes | None = None, **options: Any) -> PartFileSinkOperator:
    sink = PartFileSink(f"s3://{store.bucket}/{store.prefix}", "jsonl", bucket_assigner=fixed_bucket("b"), **options)
    op = sink._create(FAIL)
    op.setup(operator_context(job_id, "files"), CollectingOutput())
    if restore is not None:
        op.restore_state(restore)
    op.open()
    return op


def read_jsonl(store: S3PartFileStore) -> Counter[str]:
    seen: Counter[str] = Counter()
    for key in store.finished_keys():
        seen.update(whole(json.loads(line)) for line in store.read(key).decode().splitlines())
    return seen


def test_s3_part_files_are_invisible_until_their_checkpoint_completes_and_recovery_resolves_them(
    s3_root: S3PartFileStore,
) -> None:
    job_id = uuid.uuid4().hex[:16]
    big = "x" * 1000
    rows = [{"id": i, "pad": big} for i in range(12_000)]  # ~12 MiB: several parts of 5 MiB
    op = s3_sink(s3_root, job_id, s3_part_bytes=5 * MIB, max_part_bytes=8 * MIB)
    for row in rows[:9000]:
        op.process(row, None)
    assert list(s3_root.finished_keys()) == [], "a part file rolled by size stays invisible until its checkpoint"
    state_1 = op.snapshot_state(1)
    for row in rows[9000:]:
        op.process(row, None)
    state_2 = op.snapshot_state(2)
    uploads = list(s3_root.unfinished())
    assert len(uploads) == 3, f"two part files of epoch 1 (rolled at 8 MiB), one of epoch 2: {uploads}"
    assert list(s3_root.finished_keys()) == []
    pending = json.loads(state_1)["files"][0][1]
    assert [len(f["parts"]) for f in pending] == [2, 1], "parts uploaded as the file grew, the last one at the barrier"

    # Checkpoint 1 completes; the subtask dies before its notification (no close, nothing aborted).
    recovered = s3_sink(s3_root, job_id, restore=state_1)
    assert read_jsonl(s3_root) == Counter(whole(r) for r in rows[:9000])
    assert list(s3_root.unfinished()) == [], "the upload of epoch 2 (its checkpoint did not complete) is aborted"
    assert all(PartFileName.parse(key) is not None for key in s3_root.finished_keys())

    # The same checkpoint restored again (a second failure during recovery): nothing changes.
    again = s3_sink(s3_root, job_id, restore=state_1)
    assert read_jsonl(s3_root) == Counter(whole(r) for r in rows[:9000])
    for row in rows[9000:]:  # the source replays from checkpoint 1
        again.process(row, None)
    again.snapshot_state(2)
    again.notify_checkpoint_complete(2)
    assert read_jsonl(s3_root) == Counter(whole(r) for r in rows)
    assert list(s3_root.unfinished()) == []
    again.end_input()
    for instance in (op, recovered, again):
        instance.close()
    assert state_2 != state_1


# The cluster run --------------------------------------------------------------------------------------


class Listing:
    """What a reader of the sink's path sees: finished files only (by key) and their rows."""

    def __init__(self, where: str, s3_store: S3PartFileStore | None, directory: Path | None) -> None:
        self.where = where
        self._store = s3_store
        self._directory = directory

    def keys(self) -> list[str]:
        if self._store is not None:
            return sorted(self._store.finished_keys())
        assert self._directory is not None
        return sorted(
            p.relative_to(self._directory).as_posix()
            for p in self._directory.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def unfinished(self) -> list[str]:
        if self._store is not None:
            return [u.key for u in self._store.unfinished()]
        assert self._directory is not None
        return [p.name for p in self._directory.rglob(".part-*")]

    def rows(self, key: str) -> list[dict[str, Any]]:
        if self._store is not None:
            data = self._store.read(key)
        else:
            assert self._directory is not None
            data = (self._directory / key).read_bytes()
        return list(pq.read_table(io.BytesIO(data)).to_pylist())

    def records(self) -> Counter[str]:
        return Counter(whole(row) for key in self.keys() for row in self.rows(key))


@pytest.mark.parametrize("where", ["s3", "directory"])
def test_a_taskmanager_killed_mid_run_leaves_every_event_once_in_the_parquet_files(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path, where: str, s3_root: S3PartFileStore
) -> None:
    endpoints = weir_cluster.endpoints
    source = f"file-sink-events-{unique}"
    create_topics(endpoints, {source: 3})
    spec = EventSpec(count=18_000, keys=100)  # 12 s at 1500/s: two checkpoints complete in its first 5
    produce_events(endpoints, source, spec)
    directory = tmp_path / "files"
    path = f"s3://{s3_root.bucket}/{s3_root.prefix}" if where == "s3" else str(directory)
    listing = Listing(where, s3_root if where == "s3" else None, directory if where == "directory" else None)
    params = {
        "source.topic": source,
        "source.bounded": "true",
        "source.records_per_second": "1500",
        "sink.path": path,
        "sink.format": "parquet",
        "sink.max_part_bytes": str(64 * 1024),
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit("tests/integration/sinks/jobs/file_sink.py", params)
    rng = random.Random(unique)
    victim = f"taskmanager-{rng.randint(1, 3)}"
    status = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= 2
            and process_running(weir_cluster, victim)
        ),
        f"two completed checkpoints and {victim} running",
        180,
    )
    before_kill = listing.records()
    assert before_kill, "part files of completed checkpoints are visible while the job runs"
    kill_process(weir_cluster.directory, victim)
    killed_at = status.last_completed_checkpoint or 0
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status in ("RUNNING", "FINISHED")
            and s.last_restore_at is not None
            and (s.last_completed_checkpoint or 0) >= killed_at
        ),
        f"recovery after killing {victim}",
        180,
    )
    during = listing.records()
    assert all(n == 1 for n in during.values()), f"a record visible twice during the run: {during.most_common(1)}"
    wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)

    reference = Counter(whole(event) for event in events(spec))
    assert listing.records() == reference, "the Parquet files hold every event exactly once"
    keys = listing.keys()
    names = [PartFileName.parse(key) for key in keys]
    assert all(n is not None and n.key == key for n, key in zip(names, keys, strict=True)), (
        f"only finished part files under the path: {[k for k, n in zip(keys, names, strict=True) if n is None]}"
    )
    assert listing.unfinished() == [], "no upload or hidden file of an uncompleted checkpoint is left"
    assert len({n.task.subtask for n in names if n is not None}) == 3
    assert {key.rsplit("/", 1)[0] for key in keys} == {hourly_bucket(event["ts"]) for event in events(spec)}, (
        "records bucketed by the hour of their timestamp"
    )


# A crash between a checkpoint's completion and the commit -------------------------------------------


@pytest.fixture
def crash_cluster(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Endpoints, JobManagerClient, Path]]:
    """A private cluster whose processes crash once where a completed checkpoint's notification
    reached the file sink of taskmanager-2, before it finished any part file (its 3rd such visit)."""
    for name, value in {
        **private_ports(services),  # beside the session's cluster
        "WEIR_RUN_DIR": str(tmp_path / "run"),
        "WEIR_CHECKPOINT_DIR": f"s3://{services.s3_bucket}/crash-{uuid.uuid4().hex[:8]}",
        "WEIR_CRASH_POINT": "after_checkpoint_complete_before_commit@taskmanager-2:3",
        "WEIR_CRASH_ONCE_DIR": str(tmp_path / "fired"),
    }.items():
        monkeypatch.setenv(name, value)
    endpoints = Endpoints.from_env()
    directory = tmp_path / "run" / "cluster"
    start_cluster(directory, endpoints, restart=True, restart_delay_s=1.0, timeout_s=90)
    client = JobManagerClient(endpoints.jobmanager_address)
    try:
        yield endpoints, client, directory
    finally:
        client.close()
        stop_cluster(directory)


def test_a_crash_after_the_checkpoint_completed_before_the_commit_is_finished_by_recovery(
    crash_cluster: tuple[Endpoints, JobManagerClient, Path], unique: str, s3_root: S3PartFileStore
) -> None:
    endpoints, client, directory = crash_cluster
    source = f"file-sink-crash-{unique}"
    create_topics(endpoints, {source: 3})
    # 10 s at 1500/s: the crash, at the third checkpoint's completion, comes in its first 4
    spec = EventSpec(count=15_000, keys=100)
    produce_events(endpoints, source, spec)
    params = {
        "source.topic": source,
        "source.bounded": "true",
        "source.records_per_second": "1500",
        "sink.path": f"s3://{s3_root.bucket}/{s3_root.prefix}",
        "sink.format": "parquet",
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = client.submit_job(REPO_ROOT / "tests/integration/sinks/jobs/file_sink.py", params, 3)
    status = wait_for_job(client, job_id, timeout_s=240)
    assert status.summary.status == "FINISHED", status.failure
    assert list((directory.parent.parent / "fired").glob("*")), (
        "the crash point never fired: the test would prove nothing"
    )
    assert status.summary.restarts >= 1
    recovered = [  # the crashed subtask restarts wherever a slot is free
        json.loads(line)
        for log in sorted(directory.glob("taskmanager-*.log"))
        for line in log.read_text().splitlines()
        if '"file_sink_recovered"' in line
    ]
    finished_by_recovery = [a for r in recovered for a in r["actions"] if a.startswith("finish ")]
    assert finished_by_recovery, f"recovery completed the uploads the crash left: {recovered}"

    listing = Listing("s3", s3_root, None)
    assert listing.records() == Counter(whole(event) for event in events(spec))
    assert all(PartFileName.parse(key) is not None for key in listing.keys())
    assert listing.unfinished() == []
