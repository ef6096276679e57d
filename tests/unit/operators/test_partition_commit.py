"""Partition commit of the file sink (Flink's ``sink.partition-commit.*``, the ``success-file`` policy):
the pure decision over every subtask's progress, the partition time of a folder, the progress
document, and the sink's subtasks over a local directory: a partition's ``_SUCCESS`` appears only
once every subtask's part files of it up to the checkpoint that closed its last one are visible,
through random barriers, completions in any order across subtasks, aborts and crashes."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import PartFileSink
from weir.core.errors import SerializationError
from weir.core.rejections import FAIL
from weir.core.watermarks import MAX_WATERMARK, MIN_WATERMARK
from weir.operators.file_sink import PartFileSinkOperator
from weir.operators.partition_commit import (
    CommitProgress,
    PartitionCommit,
    PartitionTimeError,
    PartitionTimeExtractor,
    PendingPartition,
    committable,
    partition_values,
)

MINUTE = 60_000
T0 = 1_699_999_980_000  # 2023-11-14 22:13:00 UTC
EXTRACTOR = PartitionTimeExtractor(("dt", "hm"), "$dt $hm:00")
BY_TIME = PartitionCommit("partition-time", MINUTE, EXTRACTOR)
BY_CLOCK = PartitionCommit("process-time", 5_000)


def bucket_of(ms: int) -> str:
    import datetime as dt

    moment = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return f"dt={moment:%Y-%m-%d}/hm={moment:%H}%3A{moment:%M}"


# The partition's time --------------------------------------------------------------------------------------


def test_a_partition_time_is_its_values_by_the_pattern_in_utc() -> None:
    assert partition_values("dt=2023-11-14/hm=22%3A13") == {"dt": "2023-11-14", "hm": "22:13"}
    assert EXTRACTOR.time_ms("dt=2023-11-14/hm=22%3A13") == T0
    assert bucket_of(T0) == "dt=2023-11-14/hm=22%3A13"
    assert PartitionTimeExtractor(("dt",)).time_ms("dt=2023-11-14") == T0 - (22 * 60 + 13) * MINUTE
    assert PartitionTimeExtractor(("day", "h"), "${day} ${h}:00:00").time_ms("day=2023-11-14/h=22") == T0 - 13 * MINUTE


@pytest.mark.parametrize(
    "bucket", ["dt=2023-11-14/hm=later", "dt=__DEFAULT_PARTITION__/hm=22%3A13", "dt=2023-13-40/hm=00%3A00"]
)
def test_a_partition_without_a_time_is_one_line_naming_it(bucket: str) -> None:
    with pytest.raises(PartitionTimeError, match=f"^partition {bucket}: its time") as raised:
        EXTRACTOR.time_ms(bucket)
    assert "\n" not in str(raised.value)


# The decision ----------------------------------------------------------------------------------------------


def progress(subtask: int, checkpoint: int, watermark: int, **partitions: tuple[int, int]) -> CommitProgress:
    pending = {bucket.replace("__", "/").replace("_", "="): PendingPartition(*p) for bucket, p in partitions.items()}
    return CommitProgress("job", subtask, 2, checkpoint, watermark, watermark >= MAX_WATERMARK, pending)


P = "dt=2023-11-14/hm=22%3A13"


def test_nothing_is_committed_before_every_subtask_wrote_its_progress() -> None:
    assert committable(BY_TIME, [progress(0, 5, MAX_WATERMARK, dt_x=(0, 5)), None], 0) == ()
    assert committable(BY_TIME, [], 0) == ()


def test_by_partition_time_the_lowest_watermark_must_pass_the_time_plus_the_delay() -> None:
    a = CommitProgress("job", 0, 2, 5, T0 + 2 * MINUTE, partitions={P: PendingPartition(0, 4)})
    for low, committed in ((T0 + MINUTE, False), (T0 + MINUTE + 1, True)):  # strictly after, as Flink's
        b = CommitProgress("job", 1, 2, 5, low)
        assert committable(BY_TIME, [a, b], 0) == ((P,) if committed else ()), low


def test_a_partition_waits_for_every_subtask_to_finish_the_checkpoint_that_closed_a_file_in_it() -> None:
    high = T0 + 10 * MINUTE
    a = CommitProgress("job", 0, 2, 6, high, partitions={P: PendingPartition(0, 6)})
    b = CommitProgress("job", 1, 2, 5, high)
    assert committable(BY_TIME, [a, b], 0) == ()  # subtask 1 may still be finishing checkpoint 6's files in P
    b6 = CommitProgress("job", 1, 2, 6, high)
    assert committable(BY_TIME, [a, b6], 0) == (P,)


def test_a_subtask_whose_input_ended_early_holds_no_partition_back() -> None:
    done = CommitProgress("job", 0, 2, 4, MAX_WATERMARK, True)  # finished at checkpoint 4: no more files
    a = CommitProgress("job", 1, 2, 9, T0 + 3 * MINUTE, partitions={P: PendingPartition(0, 9)})
    assert committable(BY_TIME, [done, a], 0) == (P,)


def test_by_process_time_the_clock_must_pass_the_first_write_plus_the_delay() -> None:
    a = CommitProgress("job", 0, 2, 3, MIN_WATERMARK, partitions={P: PendingPartition(10_000, 3)})
    b = CommitProgress("job", 1, 2, 3, MIN_WATERMARK, partitions={P: PendingPartition(12_000, 2)})
    assert committable(BY_CLOCK, [a, b], 15_000) == ()
    assert committable(BY_CLOCK, [a, b], 15_001) == (P,)  # the earliest first write counts


def test_at_the_end_of_every_input_every_partition_is_committed() -> None:
    a = CommitProgress(
        "job", 0, 2, 9, MAX_WATERMARK, True, {P: PendingPartition(10**15, 9), "x=1": PendingPartition(0, 2)}
    )
    b = CommitProgress("job", 1, 2, 9, MAX_WATERMARK, True)
    assert committable(BY_CLOCK, [a, b], 0) == (P, "x=1")


def test_the_progress_document_is_versioned_json() -> None:
    doc = CommitProgress("job-1", 1, 3, 7, T0, False, {P: PendingPartition(5, 6)})
    data = doc.to_bytes()
    assert json.loads(data) == {
        "format": 1, "job_id": "job-1", "subtask": 1, "parallelism": 3, "checkpoint": 7, "watermark": T0,
        "ended": False, "partitions": {P: [5, 6]},
    }  # fmt: skip
    assert CommitProgress.from_bytes(data, "doc") == doc
    with pytest.raises(SerializationError, match="doc has format 2; this Weir reads format 1"):
        CommitProgress.from_bytes(data.replace(b'"format":1', b'"format":2'), "doc")
    with pytest.raises(SerializationError, match="doc is not a partition commit progress document"):
        CommitProgress.from_bytes(b'{"format": 1}', "doc")


# The sink's subtasks over a directory ---------------------------------------------------------------------


def csv_line(value: Any) -> bytes:
    return f"{value['id']},{value['ts']}\n".encode()


def folder(value: Any, timestamp: int | None) -> str:
    return bucket_of(value["ts"] - value["ts"] % MINUTE)


def start(
    make_context: MakeContext, root: Path, subtask: int, parallelism: int, policy: PartitionCommit,
    restore: bytes | None = None, attempt: int = 1,
) -> PartFileSinkOperator:  # fmt: skip
    sink = PartFileSink(str(root), "csv", bucket_assigner=folder, serializer=csv_line, partition_commit=policy)
    op = sink._create(FAIL)
    ctx = make_context("files", subtask=subtask, parallelism=parallelism, job_id="job-1")
    ctx.attempt = attempt
    op.setup(ctx, CollectingOutput())
    if restore is not None:
        op.restore_state(restore)
    op.open()
    return op


def visible(root: Path) -> dict[str, Counter[int]]:
    """Each partition's ids in its visible part files."""
    out: dict[str, Counter[int]] = defaultdict(Counter)
    for path in root.rglob("part-*"):
        bucket = path.parent.relative_to(root).as_posix()
        out[bucket].update(int(line.split(",")[0]) for line in path.read_text().splitlines())
    return out


def committed(root: Path) -> set[str]:
    return {p.parent.relative_to(root).as_posix() for p in root.rglob("_SUCCESS")}


@pytest.mark.parametrize("seed", range(12))
def test_a_success_file_appears_only_once_every_subtask_made_its_on_time_files_visible(
    make_context: MakeContext, tmp_path: Path, seed: int
) -> None:
    """Two subtasks get rows in event-time order (a watermark a minute behind), barriers, completions
    delivered in random order per subtask, aborts and crashes (a new instance restored from its
    latest completed checkpoint; the records after it sent again). Whenever a partition holds
    ``_SUCCESS``, its visible rows are every on-time row of it (none of its rows behind the
    watermark is still to come); at the end every partition is committed, each row once."""
    rng = random.Random(seed)
    root = tmp_path / "out"
    rows = [{"id": i, "ts": T0 + i * 7_000 + rng.randrange(3_000)} for i in range(240)]
    expected: dict[str, Counter[int]] = defaultdict(Counter)
    for row in rows:
        expected[folder(row, None)][row["id"]] += 1
    parallelism = 2
    ops = [start(make_context, root, s, parallelism, BY_TIME) for s in range(parallelism)]
    states: list[dict[int, tuple[bytes | None, int]]] = [{} for _ in range(parallelism)]
    position = [0] * parallelism
    mine = [[r for r in rows if r["id"] % parallelism == s] for s in range(parallelism)]
    checkpoint = 0
    completed: list[int] = []  # every subtask snapshotted it and it was not aborted: a restore point
    undelivered: list[list[int]] = [[] for _ in range(parallelism)]

    def check() -> None:
        seen = visible(root)
        for bucket in committed(root):
            assert seen[bucket] == expected[bucket], f"{bucket} committed with rows missing"

    def ended() -> bool:
        return all(position[s] >= len(mine[s]) for s in range(parallelism))

    while not ended():
        for s in range(parallelism):
            for _ in range(rng.randrange(0, 12)):
                if position[s] < len(mine[s]):
                    row = mine[s][position[s]]
                    ops[s].process(row, row["ts"])
                    ops[s].process_watermark(row["ts"] - MINUTE)
                    position[s] += 1
        checkpoint += 1
        for s in range(parallelism):
            states[s][checkpoint] = (ops[s].snapshot_state(checkpoint), position[s])
        if rng.random() < 0.15:
            for s in range(parallelism):
                ops[s].notify_checkpoint_aborted(checkpoint)
        else:
            completed.append(checkpoint)
            for s in range(parallelism):
                undelivered[s].append(checkpoint)
        for s in rng.sample(range(parallelism), parallelism):  # each subtask's notifications in its own time
            if rng.random() < 0.6:
                for c in undelivered[s]:
                    ops[s].notify_checkpoint_complete(c)
                    check()
                undelivered[s] = []
        if rng.random() < 0.1:  # a crash: every subtask restored from the latest completed checkpoint
            done = completed[-1] if completed else 0
            for op in ops:
                op.close()
            ops = []
            for s in range(parallelism):
                state, pos = states[s][done] if done else (None, 0)
                ops.append(start(make_context, root, s, parallelism, BY_TIME, restore=state, attempt=2 + checkpoint))
                position[s] = pos
                undelivered[s] = []
            check()
    for s in range(parallelism):  # the final checkpoint, after every row and the end of input
        ops[s].process_watermark(MAX_WATERMARK)
    checkpoint += 1
    for s in range(parallelism):
        ops[s].snapshot_state(checkpoint)
    for s in rng.sample(range(parallelism), parallelism):
        ops[s].notify_checkpoint_complete(checkpoint)
        check()
    assert visible(root) == expected
    assert committed(root) == set(expected), "every partition committed at the end of input"
    assert len(expected) >= 20


def test_by_process_time_a_partition_is_committed_once_the_delay_passed_after_its_first_write(
    make_context: MakeContext, tmp_path: Path
) -> None:
    root = tmp_path / "out"
    op = start(make_context, root, 0, 1, BY_CLOCK)
    now = [1_000.0]
    op._clock = lambda: now[0]
    op.process({"id": 1, "ts": T0}, T0)
    op.snapshot_state(1)
    op.notify_checkpoint_complete(1)
    assert committed(root) == set()  # written at 1,000 s: committable after 1,005 s
    now[0] = 1_005.5
    op.process({"id": 2, "ts": T0 + MINUTE}, T0 + MINUTE)
    op.snapshot_state(2)
    op.notify_checkpoint_complete(2)
    assert committed(root) == {bucket_of(T0)}
    assert (root / bucket_of(T0) / "_SUCCESS").read_bytes() == b""
    progress_doc = json.loads((root / ".weir-partition-commit" / "files" / "0.json").read_text())
    assert progress_doc["checkpoint"] == 2 and list(progress_doc["partitions"]) == [bucket_of(T0 + MINUTE)]
