"""The file sink operator over a local directory: what readers see through barriers, completions,
aborted checkpoints and crashes (an abandoned instance, a new one restored from the latest
completed checkpoint), compared as multisets of whole records."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import DataStream, Environment, JobDefinitionError, PartFileSink, fixed_bucket
from weir.core.rejections import FAIL
from weir.operators.file_sink import FileSinkEndOfInputError, PartFileLostError, PartFileSinkOperator

HOUR_MS = 3_600_000
START_MS = 1_764_820_800_000  # 2025-12-04T04:00:00Z


def record(i: int) -> dict[str, Any]:
    return {"id": i, "key": f"k{i % 7}", "payload": "x" * (i % 13)}


def timestamp(i: int) -> int:
    return START_MS + i * 60_000  # a minute per record: a new hour bucket every 60 records


def finished_records(tmp_path: Path) -> Counter[str]:
    """Every record of every file a reader sees (hidden in-progress files skipped, as readers do)."""
    seen: Counter[str] = Counter()
    for path in (tmp_path / "out").rglob("*"):
        if not path.is_file() or path.name.startswith("."):
            continue
        if path.suffix == ".parquet":
            rows = pq.read_table(path).to_pylist()
        else:
            rows = [json.loads(line) for line in path.read_text().splitlines()]
        seen.update(json.dumps(row, sort_keys=True) for row in rows)
    return seen


def expected(ids: range | list[int]) -> Counter[str]:
    return Counter(json.dumps(record(i), sort_keys=True) for i in ids)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def start(
    make_context: MakeContext,
    root: Path,
    file_format: str,
    restore: bytes | None = None,
    clock: Clock | None = None,
    attempt: int = 1,
    **options: Any,
) -> PartFileSinkOperator:
    sink = PartFileSink(str(root / "out"), file_format, **options)  # type: ignore[arg-type]
    op = sink._create(FAIL)
    if clock is not None:
        op._clock = clock
    ctx = make_context("files", job_id="job-1")
    ctx.attempt = attempt
    op.setup(ctx, CollectingOutput())
    if restore is not None:
        op.restore_state(restore)
    op.open()
    return op


@pytest.mark.parametrize("file_format", ["parquet", "jsonl"])
def test_readers_see_records_only_once_their_checkpoint_completed(
    make_context: MakeContext, tmp_path: Path, file_format: str
) -> None:
    op = start(make_context, tmp_path, file_format, max_part_bytes=600, row_group_rows=20)
    for i in range(200):
        op.process(record(i), timestamp(i))
    snapshot_1 = op.snapshot_state(1)
    for i in range(200, 260):
        op.process(record(i), timestamp(i))
    assert finished_records(tmp_path) == Counter(), "nothing is visible before a checkpoint completes"
    hidden = [p.name for p in tmp_path.rglob(".part-*.inprogress")]
    assert len(hidden) > 4, "rolled by size and by bucket, each closed file pending"
    op.snapshot_state(2)
    op.notify_checkpoint_aborted(2)
    op.notify_checkpoint_complete(1)
    assert finished_records(tmp_path) == expected(range(200)), "checkpoint 2 was aborted: its files stay hidden"
    state_3 = op.snapshot_state(3)  # nothing new: its state still lists the files closed at barrier 2
    assert json.loads(state_3)["ledger"]["pending"] == [[2, 2]]
    op.notify_checkpoint_complete(3)
    assert finished_records(tmp_path) == expected(range(260))
    assert list(tmp_path.rglob(".part-*")) == []
    buckets = {p.parent.relative_to(tmp_path / "out").as_posix() for p in tmp_path.rglob("part-*")}
    assert buckets == {f"dt=2025-12-04/hour={h:02d}" for h in range(4, 9)}
    assert snapshot_1.startswith(b'{"format":1,')
    op.end_input()
    op.close()


def csv_line(value: Any) -> bytes:
    return f'{value["n"]},"{value["text"]}"'.encode()


def test_a_csv_sink_writes_each_records_line_into_csv_part_files(make_context: MakeContext, tmp_path: Path) -> None:
    op = start(make_context, tmp_path, "csv", serializer=csv_line, bucket_assigner=fixed_bucket("d=1"))
    for i in range(5):
        op.process({"n": i, "text": f"t{i}"}, timestamp(i))
    op.snapshot_state(1)
    assert list(tmp_path.rglob("part-*")) == [], "nothing is visible before its checkpoint completes"
    op.notify_checkpoint_complete(1)
    (part,) = tmp_path.glob("out/d=1/part-*.csv")
    assert part.read_text().splitlines() == [f'{i},"t{i}"' for i in range(5)]
    op.end_input()
    op.close()


def test_a_part_file_rolls_by_time_on_the_processing_time_timer(make_context: MakeContext, tmp_path: Path) -> None:
    clock = Clock()
    op = start(make_context, tmp_path, "jsonl", clock=clock, rollover_interval=1000, bucket_assigner=fixed_bucket(""))
    op.process(record(0), None)
    due = op.next_processing_time()
    assert due == int(clock.now * 1000) + 1000
    op.on_processing_time(due - 1)
    assert op.next_processing_time() == due, "not due yet: still in progress"
    op.on_processing_time(due)
    assert op.next_processing_time() is None, "rolled: no part file in progress"
    op.process(record(1), None)
    op.snapshot_state(1)
    op.notify_checkpoint_complete(1)
    assert len(list(tmp_path.glob("out/part-*.jsonl"))) == 2
    assert finished_records(tmp_path) == expected([0, 1])


def test_a_crash_after_the_checkpoint_completed_but_before_the_rename_is_finished_by_recovery(
    make_context: MakeContext, tmp_path: Path
) -> None:
    op = start(make_context, tmp_path, "parquet")
    for i in range(100):
        op.process(record(i), timestamp(i))
    state = op.snapshot_state(1)
    for i in range(100, 150):
        op.process(record(i), timestamp(i))  # after the barrier: not in checkpoint 1
    # checkpoint 1 completes, the notification never arrives: the process dies (no close)
    restored = start(make_context, tmp_path, "parquet", restore=state)
    assert finished_records(tmp_path) == expected(range(100))
    assert list(tmp_path.rglob(".part-*")) == [], "the files written after checkpoint 1 are gone"
    again = start(make_context, tmp_path, "parquet", restore=state)  # a second recovery changes nothing
    assert finished_records(tmp_path) == expected(range(100))
    restored.close()
    again.close()


def test_a_listed_part_file_deleted_outside_the_job_fails_recovery_in_one_line(
    make_context: MakeContext, tmp_path: Path
) -> None:
    op = start(make_context, tmp_path, "jsonl", bucket_assigner=fixed_bucket("b"))
    op.process(record(1), None)
    state = op.snapshot_state(1)
    for hidden in tmp_path.rglob(".part-*"):
        hidden.unlink()
    with pytest.raises(PartFileLostError, match=r"part file\(s\) \['b/part-files-job%2D1-0-1-0.jsonl'\]"):
        start(make_context, tmp_path, "jsonl", restore=state)


def test_a_cancelled_attempt_still_running_never_touches_the_next_attempts_files(
    make_context: MakeContext, tmp_path: Path
) -> None:
    """A zombie: attempt 1 was cancelled but still runs while attempt 2 restored checkpoint 1 and
    writes the same epoch's part files. Neither its writes nor its close may reach attempt 2's files."""
    options: dict[str, Any] = {"bucket_assigner": fixed_bucket("b")}
    zombie = start(make_context, tmp_path, "jsonl", attempt=1, **options)
    zombie.process(record(0), None)
    state = zombie.snapshot_state(1)
    zombie.process(record(1), None)  # epoch 2, part file 0, in progress
    successor = start(make_context, tmp_path, "jsonl", restore=state, attempt=2, **options)
    successor.process(record(2), None)  # epoch 2, part file 0 again, by attempt 2
    zombie.process(record(3), None)
    zombie.close()  # cancelled at last: abandons its in-progress file
    successor.process(record(4), None)
    successor.snapshot_state(2)
    successor.notify_checkpoint_complete(2)
    assert finished_records(tmp_path) == expected([0, 2, 4])


def test_end_of_input_with_unfinished_files_fails(make_context: MakeContext, tmp_path: Path) -> None:
    op = start(make_context, tmp_path, "jsonl")
    op.process(record(1), timestamp(1))
    with pytest.raises(FileSinkEndOfInputError, match="bug in Weir"):
        op.end_input()


def test_records_that_cannot_be_written_are_rejected_by_on_error(make_context: MakeContext, tmp_path: Path) -> None:
    op = start(make_context, tmp_path, "parquet")
    with pytest.raises(Exception, match="writes dicts"):
        op.process(["not", "a", "dict"], None)
    assert list(tmp_path.rglob("*part-*")) == [], "a rejected record starts no part file"


def test_options_are_checked_where_the_sink_is_defined() -> None:
    with pytest.raises(JobDefinitionError, match="path"):
        PartFileSink("relative/dir")
    with pytest.raises(JobDefinitionError, match="format"):
        PartFileSink("/tmp/x", "orc")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="format='csv' needs a serializer"):
        PartFileSink("/tmp/x", "csv")
    with pytest.raises(JobDefinitionError, match="s3_part_bytes"):
        PartFileSink("s3://b/p", s3_part_bytes=1024)
    with pytest.raises(JobDefinitionError, match="serializer applies to format='jsonl' or 'csv'"):
        PartFileSink("/tmp/x", "parquet", serializer=str.encode)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="rollover_interval"):
        PartFileSink("/tmp/x", rollover_interval=0)


def test_sink_to_files_adds_an_exactly_once_sink() -> None:
    env = Environment("j")
    stream: DataStream = env.from_collection([{"a": 1}], uid="numbers")
    stream.sink_to_files("s3://lake/events", uid="files", format="jsonl", max_part_bytes=1 << 20)
    transformation = env.graph.transformations["files"]
    spec = transformation.sink_spec
    assert spec is not None and spec.transactional and spec.target == "s3://lake/events"
    assert transformation.name == "files:s3://lake/events"
    assert isinstance(transformation.factory(), PartFileSinkOperator)
    with pytest.raises(JobDefinitionError, match="file sink 'bad'"):
        stream.sink_to_files("s3://lake/events", uid="bad", max_part_bytes=0)


@pytest.mark.parametrize("seed", range(8))
def test_random_barriers_completions_aborts_and_crashes_leave_every_record_once(
    make_context: MakeContext, tmp_path: Path, seed: int
) -> None:
    """A source that rewinds to the restored checkpoint's position, as Weir's does; the sink sees
    barriers, completions (some notifications lost), aborted checkpoints and crashes at random. At
    any time readers see only records of completed checkpoints, each once; at the end all of them."""
    rng = random.Random(seed)
    file_format = rng.choice(["parquet", "jsonl"])
    options: dict[str, Any] = {"max_part_bytes": rng.choice([300, 2000, 1 << 20]), "row_group_rows": 5}
    total = 400
    position = 0
    checkpoint = 0
    completed: tuple[bytes, int] | None = None  # the latest completed checkpoint's sink state and position
    taken: dict[int, tuple[bytes, int]] = {}  # undecided checkpoints
    op = start(make_context, tmp_path, file_format, **options)
    while completed is None or completed[1] < total:
        step = rng.random()
        if step < 0.6 and position < total:
            for _ in range(rng.randint(1, 30)):
                if position < total:
                    op.process(record(position), timestamp(position))
                    position += 1
        elif step < 0.75:
            checkpoint += 1
            taken[checkpoint] = (op.snapshot_state(checkpoint), position)
        elif step < 0.85 and taken:
            last = max(taken)  # the newest undecided checkpoint; older undecided ones are subsumed
            decided = taken.pop(last)
            taken.clear()
            if rng.random() < 0.2:
                op.notify_checkpoint_aborted(last)
            else:
                completed = decided
                if rng.random() < 0.7:  # else the notification is lost
                    op.notify_checkpoint_complete(last)
        elif step < 0.9:
            op = start(make_context, tmp_path, file_format, restore=completed[0] if completed else None, **options)
            position = completed[1] if completed else 0
            checkpoint += 1  # a restored job's checkpoint ids go on from the ones taken before
            taken = {}
        seen = finished_records(tmp_path)
        assert all(n == 1 for n in seen.values()), f"a record is visible twice: {seen.most_common(1)}"
        if completed is not None:
            assert +seen <= expected(range(completed[1])), "a record of no completed checkpoint is visible"
        else:
            assert not seen
    # the last completed checkpoint's notification (or the recovery after it) finishes everything
    op = start(make_context, tmp_path, file_format, restore=completed[0], **options)
    assert finished_records(tmp_path) == expected(range(total))
    assert list(tmp_path.rglob(".part-*")) == []
    op.close()
