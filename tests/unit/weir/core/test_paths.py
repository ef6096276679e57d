"""Object keys of the checkpoint storage: zero padding, parse round trips, listing order."""

from __future__ import annotations

import random

import pytest

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.paths import CheckpointPaths, MetadataKey, SharedSstKey
from weir.jobmanager.checkpointing.coordinator import default_metadata_key
from weir.jobmanager.checkpointing.pending import CheckpointKind

JOB = JobId("job-7")
TM = TaskManagerId("tm-1")


def test_metadata_keys_are_zero_padded_under_the_prefix() -> None:
    paths = CheckpointPaths("weir/cluster-a")
    assert paths.metadata(JOB, CheckpointId(42)) == (
        "weir/cluster-a/job-7/checkpoints/chk-00000000000000000042/_metadata"
    )
    assert paths.metadata(JOB, CheckpointId(42), CheckpointKind.SAVEPOINT) == (
        "weir/cluster-a/job-7/savepoints/sp-00000000000000000042/_metadata"
    )
    assert paths.checkpoint_dir(JOB, CheckpointId(3)) == "weir/cluster-a/job-7/checkpoints/chk-00000000000000000003/"
    assert paths.job_record(JOB) == "weir/cluster-a/job-7/_job"


@pytest.mark.parametrize("prefix", ["", "/", "a/", "/a//b/"])
def test_the_prefix_is_normalized(prefix: str) -> None:
    expected = "".join(f"{p}/" for p in prefix.split("/") if p)
    assert CheckpointPaths(prefix).job_dir(JOB) == f"{expected}job-7/"


@pytest.mark.parametrize("kind", list(CheckpointKind))
def test_without_prefix_the_layout_is_the_coordinators_default(kind: CheckpointKind) -> None:
    key_fn = CheckpointPaths().metadata_key_fn()
    assert key_fn(JOB, CheckpointId(9), kind) == default_metadata_key(JOB, CheckpointId(9), kind)


@pytest.mark.parametrize("kind", list(CheckpointKind))
def test_metadata_keys_parse_back(kind: CheckpointKind) -> None:
    paths = CheckpointPaths("root")
    for checkpoint_id in (0, 1, 42, 2**63 - 1):
        key = paths.metadata_key_fn()(JOB, CheckpointId(checkpoint_id), kind)
        assert paths.parse_metadata_key(key) == MetadataKey(JOB, CheckpointId(checkpoint_id), kind.value)


def test_other_keys_do_not_parse_as_metadata() -> None:
    paths = CheckpointPaths("root")
    other = CheckpointPaths("elsewhere")
    for key in (
        paths.job_record(JOB),
        paths.task_state(JOB, CheckpointId(1), OperatorUid("map"), SubtaskIndex(0)),
        paths.shared_sst(JOB, TM, "db1", CheckpointId(1), "000009.sst"),
        other.metadata(JOB, CheckpointId(1)),
        "root/job-7/checkpoints/chk-42/_metadata",
        paths.metadata(JOB, CheckpointId(1)) + ".tmp",
    ):
        assert paths.parse_metadata_key(key) is None, key


def test_shared_sst_keys_carry_incarnation_and_uploading_checkpoint() -> None:
    paths = CheckpointPaths("root")
    key = paths.shared_sst(JOB, TM, "a1b2", CheckpointId(5), "000123.sst")
    assert key == "root/job-7/shared/tm-1/a1b2/00000000000000000005-000123.sst"
    assert key.startswith(paths.shared_dir(JOB))
    assert paths.parse_shared_sst(key) == SharedSstKey(JOB, TM, "a1b2", CheckpointId(5), "000123.sst")
    assert paths.parse_shared_sst(paths.metadata(JOB, CheckpointId(5))) is None


def test_private_files_of_a_snapshot_live_in_the_checkpoint_folder() -> None:
    paths = CheckpointPaths()
    key = paths.db_file(JOB, CheckpointId(5), TM, "a1b2", 7, "MANIFEST-000005")
    assert key == "job-7/checkpoints/chk-00000000000000000005/db/tm-1/a1b2/000007/MANIFEST-000005"
    savepoint = paths.db_file(JOB, CheckpointId(5), TM, "a1b2", 7, "CURRENT", CheckpointKind.SAVEPOINT)
    assert savepoint.startswith(paths.checkpoint_dir(JOB, CheckpointId(5), CheckpointKind.SAVEPOINT))
    task = paths.task_state(JOB, CheckpointId(5), OperatorUid("window"), SubtaskIndex(3))
    assert task == "job-7/checkpoints/chk-00000000000000000005/tasks/window/00003"


def test_lexicographic_order_of_checkpoint_keys_is_numeric_order() -> None:
    paths = CheckpointPaths("p")
    ids = random.Random(7).sample(range(0, 10**12), 200) + [0, 9, 10, 99, 100, 2**63 - 1]
    keys = [paths.metadata(JOB, CheckpointId(i)) for i in ids]
    parsed = [paths.parse_metadata_key(k) for k in sorted(keys)]
    assert [p.checkpoint_id for p in parsed if p is not None] == sorted(ids)
    shared = sorted(paths.shared_sst(JOB, TM, "db", CheckpointId(i), "000001.sst") for i in ids)
    assert shared == [paths.shared_sst(JOB, TM, "db", CheckpointId(i), "000001.sst") for i in sorted(ids)]


@pytest.mark.parametrize("bad", ["", "a/b", "..", "."])
def test_ids_that_would_break_the_layout_are_rejected(bad: str) -> None:
    paths = CheckpointPaths()
    with pytest.raises(ValueError):
        paths.job_dir(JobId(bad))
    with pytest.raises(ValueError):
        paths.shared_sst(JOB, TaskManagerId(bad), "db", CheckpointId(1), "1.sst")


def test_out_of_range_numbers_are_rejected() -> None:
    paths = CheckpointPaths()
    with pytest.raises(ValueError):
        paths.metadata(JOB, CheckpointId(-1))
    with pytest.raises(ValueError):
        paths.metadata(JOB, CheckpointId(10**20))
    with pytest.raises(ValueError):
        paths.task_state(JOB, CheckpointId(1), OperatorUid("op"), SubtaskIndex(100_000))
    with pytest.raises(ValueError):
        paths.metadata(JOB, CheckpointId(1), "incremental")
