"""A SQL 'filesystem' sink's partition commit ('sink.partition-commit.policy.kind' = 'success-file') in
real jobs on the session cluster:

- a paced job at parallelism 2 writing minute partitions with the partition-time trigger, into a
  folder and into S3 (the S3 server's bucket): while it runs, every partition holding ``_SUCCESS``
  already shows every row of its minute in visible part files (the file appears only after the
  checkpoint that made the partition's last part file visible), some partitions are committed
  before the job ends, and at its end every partition is committed and the rows are exact;
- Nexmark q10 with the suite's own partition commit options, on Weir and on Apache Flink 2.2.1 over
  the same topic: the same rows and the same partitions committed (each one, at the end of the
  bounded input)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.nexmark_bench import (
    file_output,
    file_records,
)
from tests.integration.checkpointing.test_recovery import wait_until
from tests.integration.conftest import WeirCluster, create_topics
from tests.integration.sql.side_by_side import flink_build, load_nexmark_topic, run_on_both_sides
from weir import nexmark as nx
from weir.connectors import kafka
from weir.connectors.files import S3PartFileStore
from weir.core.config import Endpoints
from weir.tools.cli import sql_job_source

pytestmark = pytest.mark.integration

BASE_MS = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC
ROWS = 600
STEP_MS = 800  # 8 minutes of event time
TIMEOUT_S = 600.0


def script(source: str, path: str, records_per_second: int) -> str:
    return f"""
CREATE TABLE src (id BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
  WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
        'scan.bounded.mode' = 'latest-offset', 'scan.records-per-second' = '{records_per_second}');
CREATE TABLE minutes (id BIGINT, ts TIMESTAMP(3), dt STRING, hm STRING) PARTITIONED BY (dt, hm)
  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv',
        'sink.partition-commit.trigger' = 'partition-time', 'sink.partition-commit.delay' = '1 min',
        'sink.partition-commit.policy.kind' = 'success-file',
        'partition.time-extractor.timestamp-pattern' = '$dt $hm:00');
INSERT INTO minutes SELECT id, ts, DATE_FORMAT(ts, 'yyyy-MM-dd'), DATE_FORMAT(ts, 'HH:mm') FROM src;
"""


def partition(ms: int) -> str:
    minute = (ms - BASE_MS) // 60_000
    return f"dt=2024-01-01/hm=00%3A{minute:02d}"


class Listing:
    """The sink's path as a reader sees it: a local folder, or a prefix in the S3 server's bucket."""

    def __init__(self, root: Path | None, store: S3PartFileStore | None) -> None:
        assert (root is None) != (store is None)
        self.root, self.store = root, store

    @property
    def path(self) -> str:
        return f"file://{self.root}" if self.root is not None else self.store_().uri

    def store_(self) -> S3PartFileStore:
        assert self.store is not None
        return self.store

    def keys(self) -> list[str]:
        if self.root is not None:
            return [p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file()]
        return list(self.store_().finished_keys())

    def read(self, key: str) -> bytes:
        if self.root is not None:
            return (self.root / key).read_bytes()
        return self.store_().read(key)

    def visible_ids(self) -> dict[str, Counter[int]]:
        """Each partition's ids in its visible part files (hidden in-progress files, and S3's
        unfinished uploads, are not listed: as readers see them)."""
        out: dict[str, Counter[int]] = defaultdict(Counter)
        for key in self.keys():
            bucket, _, name = key.rpartition("/")
            if name.startswith("part-"):
                out[bucket].update(int(line.split(",")[0]) for line in self.read(key).decode().splitlines())
        return out

    def committed(self) -> set[str]:
        return {key.rpartition("/")[0] for key in self.keys() if key.rpartition("/")[2] == "_SUCCESS"}


@pytest.fixture
def s3_prefix(services: Endpoints) -> Iterator[S3PartFileStore]:
    """A prefix of the test's own in the S3 server's bucket; its objects go afterwards."""
    store = S3PartFileStore(services, services.s3_bucket, f"partition-commit-{uuid.uuid4().hex[:8]}")
    yield store
    keys = list(store.finished_keys())
    for start in range(0, len(keys), 1000):
        store.client.delete_objects(
            Bucket=store.bucket, Delete={"Objects": [{"Key": store.prefix + k} for k in keys[start : start + 1000]]}
        )


@pytest.mark.parametrize(("where", "records_per_second"), [("directory", 20), ("s3", 60)])
def test_a_partition_is_committed_once_every_row_of_it_is_visible(
    weir_cluster: WeirCluster,
    unique: str,
    tmp_path: Path,
    where: str,
    records_per_second: int,
    request: pytest.FixtureRequest,
) -> None:
    endpoints = weir_cluster.endpoints
    source = f"sql-minutes-{unique}"
    create_topics(endpoints, {source: 2})
    producer = kafka.producer(endpoints, enable_idempotence=True)
    expected: dict[str, Counter[int]] = defaultdict(Counter)
    for i in range(ROWS):  # each partition in event-time order
        ts = BASE_MS + i * STEP_MS
        producer.produce(source, json.dumps({"id": i, "ts": ts}).encode(), partition=i % 2)
        expected[partition(ts)][i] += 1
    assert producer.flush(60) == 0
    listing = (
        Listing(tmp_path / "minutes", None)
        if where == "directory"
        else Listing(None, request.getfixturevalue("s3_prefix"))
    )
    job_file = tmp_path / f"minutes_{unique}.py"
    job_file.write_text(sql_job_source(script(source, listing.path, records_per_second)))
    job_id = weir_cluster.submit(str(job_file), {"checkpointing.interval": "500ms"}, parallelism=2)
    committed_while_running: set[str] = set()

    def checked(status: Any) -> bool:
        """Every committed partition shows all its rows; answers whether the job finished."""
        # success files first: a partition committed between the two reads then shows all its rows
        # (read the other way round, a commit right after the part files' scan looks premature)
        done = listing.committed()
        seen = listing.visible_ids()
        for bucket in done:
            assert seen[bucket] == expected[bucket], f"{bucket} has _SUCCESS with rows still to come"
        if not status.summary.is_terminal and seen != expected:
            # rows still to come, so the input has not ended (once every row is visible, the end of
            # input's commit and the job's FINISHED may straddle one poll: seen in a make test run)
            committed_while_running.update(done)
        return bool(status.summary.is_terminal)

    final = wait_until(weir_cluster, job_id, checked, "the job to finish", TIMEOUT_S)
    assert final.summary.status == "FINISHED", final.failure
    assert listing.visible_ids() == expected
    assert listing.committed() == set(expected), "every partition committed at the end of the input"
    assert committed_while_running, "no partition was committed before the end of the input"
    assert committed_while_running < set(expected), "the last minutes are committed by the end of input only"
    assert all(listing.read(f"{b}/_SUCCESS") == b"" for b in expected)
    progress = sorted(k.rpartition("/")[2] for k in listing.keys() if k.startswith(".weir-partition-commit/"))
    assert progress == ["0.json", "1.json"], progress
    if listing.store is not None:
        assert list(listing.store.unfinished()) == [], "no upload left open"


EVENTS = 10_000
CONFIG = nx.NexmarkConfig(events_per_second=100)  # 100 s of event time: minute partitions, some committed early


def test_nexmark_q10_commits_the_partitions_flink_commits(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("q10-vs-flink")
    topic = f"sql-q10-commit-{uuid.uuid4().hex[:8]}"
    load_nexmark_topic(endpoints, topic, 4, EVENTS, CONFIG)
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    run_on_both_sides(
        weir_cluster, build, work, queries=("q10",), topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="q10",
    )  # fmt: skip
    weir_root, flink_root = file_output(f"{weir_out}-q10"), file_output(flink_out)  # one query: its own output
    try:
        rows = Counter(file_records("q10", weir_root))
        assert rows == Counter(file_records("q10", flink_root)), "Weir's rows are not Flink's"
        partitions = {p.parent.relative_to(weir_root).as_posix() for p in weir_root.rglob("part-*")}
        assert len(partitions) >= 2 and sum(rows.values()) > 5_000
        weir_committed, flink_committed = Listing(weir_root, None).committed(), Listing(flink_root, None).committed()
        assert weir_committed == flink_committed == partitions, "the partitions committed differ"
    finally:
        for root in (weir_root, flink_root):
            shutil.rmtree(root, ignore_errors=True)
